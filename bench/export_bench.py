"""Benchmark of the Delta export and the audit (spark/): a live 3-node cluster, local and S3 tables.

    python -m bench.export_bench [--live 1000000,10000000] [--audit 10000000] [--master local[2]]
                                 [--keys K] [--dir DIR] [--no-results]

1. live      for each N of --live: a real 3-node cluster (`epochlog serve` processes on 127.0.0.1,
             tests.support.nodes), loaded with N kv puts (64-byte values over K keys) through the SDK
             in 1,000-event commands from 4 threads; then `export_once` (what `epochlog export`
             runs: ranges spread over the three members, read through the SDK's read_log) into a
             fresh local table and into a fresh table on an S3-compatible server on 127.0.0.1 (moto's
             server mode, tests/spark/s3_server.py), each on a warm SparkSession. Reported: events/s,
             and the nodes' CPU seconds; before the exports, what serving every event to one reader
             costs a follower through read_events and through read_log (`serving_cost`).
2. audit     N events generated offline into segment files (tests/spark/synthetic.py) and exported; then
             `history KEY` and `state --offset M --prefix P` (1% of the keys) at the table as
             exported, after `table optimize` clusters it by key, and after state checkpoints
             (every N/4 offsets): seconds (first and median of the next 3, warm session) and the
             files each question read.

The machine is shared (2 cores): the run reports the load of other processes at the start.
Results: stdout and the `export` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import bench.results as bench_results
from bench.log_bench import machine_busy_seconds, wait_quiet

RANGE_OFFSETS = 250_000
BATCH = 1000
WRITERS = 4


def log(msg: str) -> None:
    print(msg, flush=True)


def load(endpoints: list[str], events: int, keys: int) -> float:
    """Write `events` kv puts through the SDK; seconds taken."""
    from epochlog.client import Client
    from statemachines import events as ev
    from statemachines.request_ids import uuid7

    pad = b"x" * 56
    per = -(-events // WRITERS)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        from epochlog.client import ClientError

        try:
            with Client(endpoints, timeout=30, name=f"bench-{w}") as client:
                done = 0
                while done < per and w * per + done < events:
                    n = min(BATCH, per - done, events - w * per - done)
                    base = w * per + done
                    batch = [ev.KvPut(name=f"k/{(base + i) * 7919 % keys:08d}", value=b"%08d" % (base + i) + pad,
                                      request_id=uuid7()) for i in range(n)]
                    for attempt in range(10):
                        try:
                            client.commands(batch)
                            break
                        except ClientError as exc:
                            # A leader change on the loaded machine: the same request ids again (the
                            # node answers a retry of a committed request without applying it twice,
                            # but the retry is a record too: the export counts rows, not N).
                            if not getattr(exc, "retriable", False) or attempt == 9:
                                raise
                            time.sleep(0.5)
                    done += n
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def process_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes `pids` used so far (/proc/<pid>/stat)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every process below it (the nodes, moto, the Spark
    driver's JVM and its Python workers): the export's own cost, whatever other processes on the shared
    machine use. Each process counts its own time and that of its children it reaped (a live child
    counts for itself), so nothing is counted twice."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue   # exited meanwhile
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / tick   # utime stime cutime cstime
    me = os.getpid()

    def below_me(pid: int) -> bool:
        while pid > 1 and pid != me:
            pid = parent.get(pid, 0)
        return pid == me
    return sum(seconds for pid, seconds in cpu.items() if below_me(pid))


def serving_cost(cluster: Any) -> dict[str, tuple[float, float]]:
    """What serving the export's reads costs a follower: every committed kv record read from one follower
    in this process (no Spark) through `read_events` (records decoded and re-encoded by the node, 5,000
    a call, as the export read before read_log) and through `read_log` (batches as stored, decoded here
    as the export's executors decode them). Per call: (events/s, the node's CPU seconds per 1M events)."""
    from epochlog.client import Client
    from eventlog.offline import decode_batches

    leader = cluster.leader("kv")
    follower = next(i for i in sorted(cluster.nodes) if i != leader)
    endpoint, pid = cluster.endpoint(follower), cluster.nodes[follower].pid
    out = {}
    with Client([endpoint], timeout=30, sessions=False) as client:
        end = client.read_events("kv", 1 << 62, max_events=1, endpoint=endpoint).commit_offset + 1
        cluster.wait_applied(follower, "kv", end - 1, timeout=120)

        def by_events() -> int:
            offset, rows = 0, 0
            while offset < end:
                got = client.read_events("kv", offset, max_events=5000, max_bytes=4 << 20, endpoint=endpoint)
                rows += len(got.events)
                offset = got.next_offset
            return rows

        def by_batches() -> int:
            offset, rows = 0, 0
            while offset < end:
                got = client.read_log("kv", offset, max_bytes=4 << 20, endpoint=endpoint)
                rows += len(decode_batches(got.data, offset, end, applied=frozenset(got.noops))[0])
                offset = got.next_offset
            return rows

        for name, read in (("read_events", by_events), ("read_log", by_batches)):
            wait_quiet(10, log)
            cpu, t = process_cpu_seconds([pid]), time.perf_counter()
            rows = read()
            seconds, cpu = time.perf_counter() - t, process_cpu_seconds([pid]) - cpu
            out[name] = (rows / seconds, cpu / rows * 1e6)
            log(f"  {name} from follower {follower}: {rows:,} events in {seconds:.1f} s ({rows / seconds:,.0f}/s), "
                f"the node used {cpu:.1f} CPU s ({cpu / rows * 1e6:.2f} s per 1M events)")
    return out


def live(spark: Any, base: Path, n: int, keys: int, s3: Any) -> dict[str, Any]:
    from spark.export import export_once
    from spark.sources import ClusterSource, OfflineSource
    from spark.storage import TableLocation
    from tests.support.nodes import NodeCluster

    # Election timeouts of 2-4 s (40 ticks of 50 ms): on this shared, loaded machine the default 0.5-1 s
    # elects new leaders during the load for no other reason than scheduling delays.
    # Retention above N and kv truncated rather than key-compacted: the export is the table's first, and a
    # deployment's first export registers its watermark only after it (kv is key-compacted by default).
    cluster = NodeCluster(base / f"cluster-{n}", size=3, seed=n, log={"segment_bytes": 64 << 20},
                          raft={"election_timeout_ticks": 40},
                          compaction={"retain_offsets": 2 * n, "compact_groups": ["metadata"]})
    try:
        cluster.start()
        cluster.leader("kv")
        load_s = load(cluster.endpoints, n, keys)
        log(f"{n:,} events: loaded into the cluster in {load_s:.1f} s ({n / load_s:,.0f}/s)")
        source = ClusterSource(tuple(cluster.endpoints), 30.0, ("kv",))
        out: dict[str, Any] = {"n": n, "load": load_s, "serving": serving_cost(cluster)}
        # The same events from node 1's segment files (the offline reader, no serving node) into a local
        # table: what the live export costs beyond decoding and writing.
        offline = OfflineSource.discover(cluster.nodes[1].data_dir, ("kv",))
        for name, loc, src in (("local", TableLocation.parse(base / f"live-{n}"), source),
                               ("s3", TableLocation.parse(f"s3://bench/live-{n}", environ=s3.env), source),
                               ("offline", TableLocation.parse(base / f"offline-{n}"), offline)):
            other = wait_quiet(30, log)
            pids = [node.pid for node in cluster.nodes.values() if node.pid is not None]
            nodes_cpu, busy, tree, t = process_cpu_seconds(pids), machine_busy_seconds(), tree_cpu_seconds(), \
                time.perf_counter()
            result = export_once(spark, loc, src, range_offsets=RANGE_OFFSETS)
            seconds = time.perf_counter() - t
            nodes_cpu, busy = process_cpu_seconds(pids) - nodes_cpu, machine_busy_seconds() - busy
            out[f"{name}_cpu"] = tree_cpu_seconds() - tree
            assert result.rows >= n, (result.rows, n)
            out[name], out[f"{name}_other"], out["rows"] = seconds, other, result.rows
            out[f"{name}_nodes_cpu"], out[f"{name}_busy"] = nodes_cpu, busy / seconds
            log(f"  export to {name}: {result.rows:,} rows in {seconds:.1f} s, {result.rows / seconds:,.0f} events/s "
                f"({len(result.plan.ranges())} ranges over 3 members; other processes {other:.2f} cores before it; "
                f"the machine busy {busy / seconds:.2f} cores during it; the nodes used {nodes_cpu:.1f} CPU s, "
                f"the export's processes {out[f'{name}_cpu']:.1f})")
        shutil.rmtree(base / f"live-{n}", ignore_errors=True)
        shutil.rmtree(base / f"offline-{n}", ignore_errors=True)
        return out
    finally:
        cluster.close()
        shutil.rmtree(base / f"cluster-{n}", ignore_errors=True)


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


def questions(spark: Any, table: Path, point: int, keys: int) -> dict[str, Any]:
    from spark.audit import Audit, Point
    from spark.table import resolve

    a = Audit(spark, resolve(table))
    prefix = "kv/k/" + "0" * (8 - len(str(max(1, keys // 100) - 1)))   # about 1% of the keys
    out: dict[str, Any] = {"files": len(a.snapshot.files)}
    out["h_first"], out["h_median"], rows = timed(lambda: a.history("kv/k/00000001"))
    out["h_rows"], out["h_files"] = len(rows), a.files_read
    out["s_first"], out["s_median"], rows = timed(lambda: a.state(Point(group="kv", offset=point), prefix))
    out["s_rows"], out["s_files"], out["s_checkpoint"] = len(rows), a.files_read, a.checkpoint_used
    return out


def audit(spark: Any, base: Path, n: int, keys: int) -> dict[str, Any]:
    from spark.checkpoints import make_checkpoints
    from spark.export import export_once
    from spark.maintenance import optimize_table
    from spark.sources import OfflineSource
    from spark.storage import TableLocation
    from tests.spark.synthetic import write_group

    data, table = base / f"data-{n}", base / f"audit-{n}"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)
    write_group(data, "kv", n, batch_records=1000, keys=keys, seed=1)
    source = OfflineSource.discover(data)
    export_once(spark, table, source, range_offsets=RANGE_OFFSETS)
    point = int(source.bounds()["kv"][1] * 0.95)
    out: dict[str, Any] = {"n": n}
    out["as_exported"] = questions(spark, table, point, keys)
    log(f"  audit as exported: {out['as_exported']}")
    t = time.perf_counter()
    optimize_table(table, cluster=True)
    out["cluster_s"] = time.perf_counter() - t
    out["clustered"] = questions(spark, table, point, keys)
    log(f"  clustered in {out['cluster_s']:.1f} s: {out['clustered']}")
    t = time.perf_counter()
    made = make_checkpoints(spark, TableLocation.parse(table), max(1, n // 4))
    out["checkpoint_s"], out["checkpoints"] = time.perf_counter() - t, len(made)
    out["checkpointed"] = questions(spark, table, point, keys)
    log(f"  {len(made)} checkpoints in {out['checkpoint_s']:.1f} s: {out['checkpointed']}")
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", default="1000000,10000000", help="Live-cluster export sizes, comma-separated.")
    parser.add_argument("--audit", default="10000000", help="Audit table sizes, comma-separated.")
    parser.add_argument("--keys", type=int, default=100_000, help="Distinct kv keys.")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, default=Path("bench/out/export"))
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    live_sizes = [int(s) for s in args.live.split(",") if s.strip()]
    audit_sizes = [int(s) for s in args.audit.split(",") if s.strip()]
    base = args.dir.resolve()
    base.mkdir(parents=True, exist_ok=True)
    load_avg = os.getloadavg()
    other = wait_quiet(60, log)
    log(f"load average {load_avg[0]:.1f}/{load_avg[1]:.1f}/{load_avg[2]:.1f}; other processes used {other:.2f} "
        f"cores at the start")

    from spark.session import get_session
    from tests.spark.s3_server import S3Server

    t = time.perf_counter()
    spark = get_session(args.master, "epochlog-export-bench")
    session_s = time.perf_counter() - t
    s3 = S3Server().start()
    s3.create_bucket("bench")
    from spark.export import export_once
    from spark.sources import OfflineSource
    from tests.spark.synthetic import write_group

    warm = base / "warm"
    write_group(warm, "kv", 20_000, keys=1000)
    t = time.perf_counter()
    export_once(spark, base / "warm-table", OfflineSource.discover(warm))
    log(f"SparkSession {session_s:.1f} s; first (cold) export of 20k events {time.perf_counter() - t:.1f} s")
    lives, audits = [], []
    try:
        for n in live_sizes:
            lives.append(live(spark, base, n, args.keys, s3))
        for n in audit_sizes:
            log(f"audit at {n:,} events")
            audits.append(audit(spark, base, n, args.keys))
    finally:
        s3.stop()
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)

    md = [(f"Live export: a 3-node cluster on 127.0.0.1 (`epochlog serve` processes) loaded with N kv puts (64-byte "
          f"values, {args.keys:,} keys) through the SDK, then `export_once` (what `epochlog export` runs) on a warm "
          f"Spark `{args.master}` session (start-up {session_s:.1f} s), ranges of {RANGE_OFFSETS:,} offsets spread "
          f"over the three members, one Delta commit; to a local directory, and to moto's S3 server on 127.0.0.1. "
          f"Load average at the start {load_avg[0]:.1f}/{load_avg[1]:.1f}/{load_avg[2]:.1f}."), "",
          "| events | load through the SDK | export to a local table | export to S3 (moto) | offline (node 1's files) "
          "to a local table |", "|---|---|---|---|---|"]
    for r in lives:
        n = r["n"]
        rows = r["rows"]
        md.append(f"| {n:,} ({rows:,} rows) | {n / r['load']:,.0f}/s ({r['load']:.0f} s) | "
                  + " | ".join(f"{rows / r[k]:,.0f}/s ({r[k]:.1f} s; other {r[f'{k}_other']:.2f} cores before, machine "
                               f"{r[f'{k}_busy']:.2f} busy; CPU s: export {r[f'{k}_cpu']:.1f}, nodes "
                               f"{r[f'{k}_nodes_cpu']:.1f})" for k in ("local", "s3", "offline"))
                  + " |")
    md += ["", ("Serving cost: every committed event read from one follower by one reader in the benchmark's "
                "process (no Spark), through `read_events` (the node decodes and re-encodes each record) and through "
                "`read_log` (whole batches as stored; the reader checks and decodes them): events/s and the node's "
                "CPU seconds per 1M events."), "", "| events | read_events | read_log |", "|---|---|---|"]
    for r in lives:
        md.append(f"| {r['n']:,} | " + " | ".join(f"{r['serving'][k][0]:,.0f}/s, node {r['serving'][k][1]:.2f} CPU s/1M"
                                                  for k in ("read_events", "read_log")) + " |")
    md += ["", ("Audit on a table of N offline-generated events (one day partition), warm session: seconds of the "
                "first question / median of the next 3, and files read of the table's files. `state` is at 95 % of "
                "the log with a 1 % key prefix."), "",
           "| events | layout | history KEY | state --offset --prefix |", "|---|---|---|---|"]
    for r in audits:
        for name, label in (("as_exported", "as exported"), ("clustered", f"clustered by key ({r['cluster_s']:.0f} s)"),
                            ("checkpointed", f"+ {r['checkpoints']} state checkpoints ({r['checkpoint_s']:.0f} s)")):
            q = r[name]
            md.append(f"| {r['n']:,} | {label} | {q['h_first']:.2f} / {q['h_median']:.2f} s, {q['h_files']}/{q['files']} "
                      f"files ({q['h_rows']} rows) | {q['s_first']:.2f} / {q['s_median']:.2f} s, {q['s_files']}/"
                      f"{q['files']} files ({q['s_rows']} rows; checkpoint {q['s_checkpoint']}) |")
    body = "\n".join(md)
    print(body)
    if not args.no_results:
        bench_results.write_section("export", body,
                                    command="python -m bench.export_bench " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
