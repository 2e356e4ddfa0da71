"""Benchmark of the Delta export and the audit (spark/): Spark vs a plain pyarrow + delta-rs writer.

    python -m bench.export_bench [--events 1000000,10000000] [--master local[2]] [--dir DIR]
                                 [--keys K] [--no-results]

For each size N (default 1M and 10M):

1. generate   N kv events (puts of 64-byte values over K keys, 5% deletes, actor and request id)
              written straight into a segmented log with eventlog.log.Log (spark.synthetic): the
              layout of a stopped node's group directory, read by `epochlog export --offline`.
              No cluster is involved: the figures are the export's, not the cluster's.
2. spark      `export_once` (what `epochlog export --offline` runs) into a fresh table, on a
              warm SparkSession (started and warmed on a small export first; its start-up time is
              reported separately): plan, Spark reads the ranges (250k offsets each) and writes
              Parquet on the executors, one Delta commit.
3. plain      the same rows without Spark: the same reader, `to_batch` and `DayFiles` and the same
              one-commit `commit_run`, in this process (1 core), and in 2 processes (a
              ProcessPoolExecutor over the ranges, then one commit): the ratio Spark / plain says
              what Spark costs or gains here.
4. audit      `Audit.state` at an offset in the middle of the log, for a 1% key prefix and for
              every key (rows collected in the driver), and `Audit.history` of one key: the first
              (cold) query and the median of 3 warm ones, on the Spark table of step 2.

The machine is shared (2 cores): the run waits (bounded) for other processes to go quiet first and
reports their load. Results: stdout and the `export` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench.results as bench_results
from bench.log_bench import wait_quiet

RANGE_OFFSETS = 250_000


def log(msg: str) -> None:
    print(msg, flush=True)


def generate(directory: Path, events: int, keys: int) -> tuple[float, int]:
    from spark.synthetic import write_group

    shutil.rmtree(directory, ignore_errors=True)
    started = time.perf_counter()
    write_group(directory, "kv", events, batch_records=1000, keys=keys, seed=1)
    seconds = time.perf_counter() - started
    return seconds, _log_bytes(directory / "groups" / "kv" / "log")


def _log_bytes(log_dir: Path) -> int:
    """Bytes of batches in the log (the active segment is preallocated: count up to its data's end)."""
    import mmap

    from eventlog.scan import data_extent

    files = sorted(log_dir.glob("*.log"))
    total = sum(f.stat().st_size for f in files[:-1])
    if files:
        with open(files[-1], "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            total += data_extent(mm, len(mm))
    return total


def spark_export(spark: Any, source: Any, table: Path) -> tuple[float, int, int]:
    from spark.export import export_once

    shutil.rmtree(table, ignore_errors=True)
    started = time.perf_counter()
    result = export_once(spark, table, source, range_offsets=RANGE_OFFSETS)
    return time.perf_counter() - started, result.rows, len(result.plan.ranges())


def _write_range(args: tuple[str, str, int, int]) -> list[Any]:
    """One range, plain: read, rows, Parquet files (in a worker process or in this one)."""
    from spark.commit import DayFiles
    from spark.records import to_batch
    from spark.sources import OfflineGroup, OfflineSource

    group_dir, root, lo, hi = args
    source = OfflineSource((OfflineGroup("kv", group_dir),))
    out = DayFiles(root)
    for chunk in source.read("kv", lo, hi):
        out.write(to_batch("kv", chunk))
    return out.close()


def plain_export(source: Any, table: Path, processes: int) -> tuple[float, int]:
    from spark.commit import commit_run
    from spark.plan import ExportPlan
    from spark.table import exported_through, open_or_create

    shutil.rmtree(table, ignore_errors=True)
    started = time.perf_counter()
    dt = open_or_create(table)
    plan = ExportPlan.make(exported_through(dt, ["kv"]), source.bounds(), range_offsets=RANGE_OFFSETS)
    jobs = [(source.group("kv").directory, str(table), r.lo, r.hi) for r in plan.ranges()]
    if processes == 1:
        files = [f for job in jobs for f in _write_range(job)]
    else:
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            files = [f for part in pool.map(_write_range, jobs) for f in part]
    commit_run(table, files, plan)
    return time.perf_counter() - started, sum(f.rows for f in files)


def timed(fn: Any, repeat: int = 3) -> tuple[float, float, Any]:
    """(first call seconds, median of `repeat` more, last result)."""
    t = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        runs.append(time.perf_counter() - t)
    return first, statistics.median(runs), result


def audit(spark: Any, table: Path, last_offset: int, keys: int) -> dict[str, Any]:
    from spark.audit import Audit, Point
    from spark.table import resolve

    a = Audit(spark, resolve(table))
    mid = Point(group="kv", offset=last_offset // 2)
    prefix = "kv/k/" + "0" * (8 - len(str(max(1, keys // 100) - 1)))   # about 1% of the keys
    out: dict[str, Any] = {}
    out["prefix_first"], out["prefix_median"], rows = timed(lambda: a.state(mid, prefix))
    out["prefix_rows"] = len(rows)
    out["all_first"], out["all_median"], rows = timed(lambda: a.state(mid, "kv/"), repeat=1)
    out["all_rows"] = len(rows)
    out["history_first"], out["history_median"], rows = timed(lambda: a.history("kv/k/00000001"))
    out["history_rows"] = len(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default="1000000,10000000", help="Sizes, comma-separated.")
    parser.add_argument("--keys", type=int, default=100_000, help="Distinct kv keys.")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, default=Path("bench/out/export"))
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.events.split(",") if s.strip()]
    base = args.dir.resolve()
    base.mkdir(parents=True, exist_ok=True)
    other = wait_quiet(60, log)
    log(f"other processes used {other:.2f} cores at the start")

    from spark.session import get_session
    from spark.sources import OfflineSource
    from spark.synthetic import write_group

    t = time.perf_counter()
    spark = get_session(args.master, "epochlog-export-bench")
    session_s = time.perf_counter() - t
    warm = base / "warm"
    shutil.rmtree(warm, ignore_errors=True)
    write_group(warm, "kv", 20_000, keys=1000)
    t = time.perf_counter()
    spark_export(spark, OfflineSource.discover(warm), base / "warm-table")
    cold_s = time.perf_counter() - t
    log(f"SparkSession {session_s:.1f} s; first (cold) export of 20k events {cold_s:.1f} s")

    rows: list[dict[str, Any]] = []
    for n in sizes:
        data = base / f"data-{n}"
        gen_s, size = generate(data, n, args.keys)
        log(f"{n:,} events: generated in {gen_s:.1f} s ({size / 2**20:.0f} MiB of segments)")
        source = OfflineSource.discover(data)
        last = source.bounds()["kv"][1]
        table = base / f"table-{n}"
        s_s, s_rows, ranges = spark_export(spark, source, table)
        assert s_rows == n, (s_rows, n)
        log(f"  spark ({args.master}): {s_s:.1f} s, {n / s_s:,.0f} events/s ({ranges} ranges)")
        p1_s, p1_rows = plain_export(source, base / f"plain1-{n}", 1)
        assert p1_rows == n
        log(f"  plain, 1 process: {p1_s:.1f} s, {n / p1_s:,.0f} events/s")
        p2_s, p2_rows = plain_export(source, base / f"plain2-{n}", 2)
        assert p2_rows == n
        log(f"  plain, 2 processes: {p2_s:.1f} s, {n / p2_s:,.0f} events/s")
        shutil.rmtree(base / f"plain1-{n}", ignore_errors=True)
        shutil.rmtree(base / f"plain2-{n}", ignore_errors=True)
        q = audit(spark, table, last, args.keys)
        log(f"  audit state (1% prefix, {q['prefix_rows']} rows): first {q['prefix_first']:.2f} s, "
            f"median {q['prefix_median']:.2f} s; all keys ({q['all_rows']} rows): first {q['all_first']:.2f} s, "
            f"then {q['all_median']:.2f} s; history of a key ({q['history_rows']} rows): {q['history_median']:.2f} s")
        table_mib = sum(f.stat().st_size for f in table.rglob("*.parquet")) / 2**20
        rows.append({"n": n, "gen": gen_s, "mib": size / 2**20, "spark": s_s, "plain1": p1_s, "plain2": p2_s,
                     "table_mib": table_mib, **q})
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(table, ignore_errors=True)
    spark.stop()
    shutil.rmtree(base, ignore_errors=True)

    md = [f"Offline export (`epochlog export --offline`, the same code as the cluster path after the "
          f"reader) of N kv events ({args.keys:,} keys, 64-byte values) generated into segment files; "
          f"Spark `{args.master}` on a warm session (start-up {session_s:.1f} s, first export of 20k "
          f"events {cold_s:.1f} s cold); one Delta commit per run; ranges of {RANGE_OFFSETS:,} offsets. "
          f"Other processes used {other:.2f} cores at the start.", "",
          "| events | segments | spark | plain, 1 process | plain, 2 processes | spark / plain 1 | spark / plain 2 "
          "| table |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["n"]
        md.append(f"| {n:,} | {r['mib']:.0f} MiB | {n / r['spark']:,.0f}/s ({r['spark']:.1f} s) | "
                  f"{n / r['plain1']:,.0f}/s ({r['plain1']:.1f} s) | {n / r['plain2']:,.0f}/s ({r['plain2']:.1f} s) | "
                  f"{r['plain1'] / r['spark']:.2f} | {r['plain2'] / r['spark']:.2f} | {r['table_mib']:.0f} MiB |")
    md += ["", "Audit on the Spark table (`Audit.state` at the middle offset; rows are collected and "
           "converted in the driver), first query / median of the next:", "",
           "| events | state, 1% prefix | state, every key | history of one key |", "|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['n']:,} | {r['prefix_first']:.2f} s / {r['prefix_median']:.2f} s ({r['prefix_rows']} rows) | "
                  f"{r['all_first']:.2f} s / {r['all_median']:.2f} s ({r['all_rows']:,} rows) | "
                  f"{r['history_first']:.2f} s / {r['history_median']:.2f} s ({r['history_rows']} rows) |")
    body = "\n".join(md)
    print(body)
    if not args.no_results:
        bench_results.write_section("export", body,
                                    command="python -m bench.export_bench " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
