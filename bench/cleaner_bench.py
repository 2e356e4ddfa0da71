"""Benchmark of key compaction (compaction/cleaner.py): cleaning speed, memory, append latency, disk.

    python -m bench.cleaner_bench [--records N] [--keys 1000,1000000] [--seconds S] [--steady-records M]
                                  [--dir DIR] [--out FILE] [--no-results]

Records come in batches of 10 (a leader coalesces proposals), each record a key
`kv/app/<16 hex digits>` (a multiplicative hash of a key number drawn uniformly from the key space)
and a 100-byte random value, appended with `Log.append` to a log of 16 MiB segments in a scratch
directory under DIR (default bench/out/, git-ignored), removed afterwards.

1. speed and memory   per key count (--keys): append N records, then one forced pass `clean_log`
                      below the active segment, its work in a worker process (the default): MB/s of
                      log read (the bytes of the segments rewritten, over the pass, worker start-up
                      included), records/s, bytes before/after, offset-map keys, and the worker's
                      anonymous memory (RssAnon) once its offset map is built.
2. append latency     a thread appends 1-record batches at a fixed rate (open loop: each append has
                      a due time; its latency is completion minus due time, so waiting for the
                      interpreter lock counts) for S seconds without cleaning, then S seconds while a
                      `LogCleaner` cleans a large log: pass in a worker process (unthrottled, and at
                      8 MiB/s), and pass in the cleaner thread (`worker_process = false`).
3. steady state       M overwrites of 1,000 keys in chunks; after each chunk a pass below the active
                      segment; the log's bytes on disk after each pass (flat when cleaning keeps up).

The machine is shared: the load average is recorded with every phase.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench.results as bench_results
from bench.log_bench import fmt_us, pct
from compaction.cleaner import LogCleaner, clean_log
from compaction.config import CleanerConfig
from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.records import encode_batch

MIB = 1 << 20
SEGMENT_BYTES = 16 * MIB
VALUE_BYTES = 100
BATCH_RECORDS = 10
HASH = 0x9E3779B97F4A7C15


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def key_of(n: int) -> bytes:
    return b"kv/app/%016x" % ((n * HASH) & (2**64 - 1))


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def fill(lg: Log, records: int, keys: int, seed: int, ts: int = 1_700_000_000_000) -> None:
    rng = random.Random(seed)
    value = rng.randbytes(VALUE_BYTES)
    for i in range(0, records, BATCH_RECORDS):
        entries = [(key_of(rng.randrange(keys)), value) for _ in range(min(BATCH_RECORDS, records - i))]
        lg.append(encode_batch(entries, timestamp_ms=ts + i), epoch=1)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.iterdir() if p.is_file())


# --- 1. speed and memory (in a fresh process per key count) ---------------------------------------

def run_speed(scratch: Path, records: int, keys: int) -> dict[str, Any]:
    directory = scratch / f"speed-{keys}"
    config = LogConfig(segment_bytes=SEGMENT_BYTES, flush_policy="interval", preallocate_next_segment=False)
    with Log.open(directory, config) as lg:
        fill(lg, records, keys, seed=keys)
        lg.flush()
        result = clean_log(lg, lg.segment_bases()[-1], CleanerConfig(), force=True)
    shutil.rmtree(directory, ignore_errors=True)
    return {"keys": keys, "records": records, "seconds": result.seconds, "bytes_before": result.bytes_before,
            "bytes_after": result.bytes_after, "records_read": result.records_read,
            "records_kept": result.records_kept, "map_keys": result.offset_map_keys,
            "segments": result.segments_before, "rss_anon_kib": result.pass_rss_anon_kib, "load": load_average()}


# --- 2. append latency while cleaning -------------------------------------------------------------

def paced_appends(lg: Log, rate: float, seconds: float, stop: threading.Event | None = None) -> list[int]:
    """Open-loop 1-record appends at `rate`/s for `seconds`: latencies (ns) from each due time."""
    interval = 1.0 / rate
    value = b"v" * VALUE_BYTES
    out: list[int] = []
    start = time.perf_counter()
    n = 0
    while True:
        due = start + n * interval
        now = time.perf_counter()
        if due - start >= seconds or (stop is not None and stop.is_set()):
            return out
        if due > now:
            time.sleep(due - now)
        lg.append(encode_batch([(key_of(n % 1000), value)], timestamp_ms=1_700_000_000_000 + n), epoch=1)
        out.append(int((time.perf_counter() - due) * 1e9))
        n += 1


def run_latency(scratch: Path, records: int, seconds: float, rate: float, repeats: int) -> list[dict[str, Any]]:
    """Each case `repeats` times, the cases interleaved (the machine's load drifts); per case the
    median over the repeats of each percentile."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeats):
        for row in _latency_round(scratch, records, seconds, rate):
            runs.setdefault(row["case"], []).append(row)
    out = []
    for case, rows in runs.items():
        merged = dict(rows[0])
        for key in ("p50_us", "p99_us", "p999_us", "max_us"):
            values = sorted(r[key] for r in rows)
            merged[key] = values[len(values) // 2]
            merged[key + "_all"] = values
        merged["appends"] = sum(r["appends"] for r in rows)
        merged["load"] = ", ".join(r["load"].split(" / ")[0] for r in rows)
        out.append(merged)
    return out


def _latency_round(scratch: Path, records: int, seconds: float, rate: float) -> list[dict[str, Any]]:
    rows = []
    cases: list[tuple[str, CleanerConfig | None]] = [
        ("no cleaning", None),
        ("worker process, unthrottled", CleanerConfig()),
        ("worker process, 8 MiB/s", CleanerConfig(max_io_bytes_per_second=8 * MIB)),
        ("cleaner thread, unthrottled", CleanerConfig(worker_process=False)),
    ]
    for label, cleaner_config in cases:
        directory = scratch / "latency"
        shutil.rmtree(directory, ignore_errors=True)
        config = LogConfig(segment_bytes=SEGMENT_BYTES, flush_policy="group")
        with Log.open(directory, config) as lg:
            fill(lg, records, 1000, seed=1)
            lg.flush()
            horizon = lg.segment_bases()[-1]
            cleaner = None
            if cleaner_config is not None:
                cleaner = LogCleaner(cleaner_config)
                future = cleaner.submit(lg, horizon, force=True)
                time.sleep(0.5 if cleaner_config.worker_process else 0.05)   # the worker starts
            try:
                samples = sorted(paced_appends(lg, rate, seconds))
                cleaned = None
                if cleaner is not None:
                    running = not future.done()
                    cleaned = future.result() if not running else None
            finally:
                if cleaner is not None:
                    cleaner.close()
        row = {"case": label, "appends": len(samples), "p50_us": pct(samples, 0.5), "p99_us": pct(samples, 0.99),
               "p999_us": pct(samples, 0.999), "max_us": samples[-1] / 1e3 if samples else float("nan"),
               "load": load_average()}
        if cleaner_config is not None:
            row["pass_done_within_window"] = cleaned is not None
            if cleaned is not None:
                row["pass_seconds"] = cleaned.seconds
                row["pass_mb"] = cleaned.bytes_before / 1e6
        log(f"  {label}: {row}")
        rows.append(row)
        shutil.rmtree(directory, ignore_errors=True)
    return rows


# --- 3. steady state --------------------------------------------------------------------------------

def run_steady(scratch: Path, records: int, chunks: int) -> list[dict[str, Any]]:
    directory = scratch / "steady"
    config = LogConfig(segment_bytes=4 * MIB, flush_policy="interval", preallocate_next_segment=False)
    rows = []
    with Log.open(directory, config) as lg:
        per = records // chunks
        for c in range(chunks):
            fill(lg, per, 1000, seed=c, ts=1_700_000_000_000 + c * per)
            lg.flush()
            result = clean_log(lg, lg.segment_bases()[-1], CleanerConfig())
            rows.append({"written": (c + 1) * per, "segments": len(lg.segment_bases()),
                         "disk_bytes": dir_bytes(directory), "pass_seconds": result.seconds,
                         "skipped": bool(result.skipped)})
            log(f"  steady {rows[-1]}")
    shutil.rmtree(directory, ignore_errors=True)
    return rows


# --- report -----------------------------------------------------------------------------------------

def report(speed: list[dict[str, Any]], latency: list[dict[str, Any]], steady: list[dict[str, Any]],
           args: argparse.Namespace, load_before: str) -> str:
    lines = [f"Log: batches of {BATCH_RECORDS} records, key `kv/app/<16 hex>` + {VALUE_BYTES}-byte value, "
             f"{SEGMENT_BYTES // MIB} MiB segments. MB/s = 10^6 bytes of the "
             f"segments a pass rewrote, over the pass. Load average before the run: {load_before}.", "",
             "### 1. Speed and memory (one forced pass below the active segment, in a worker process)",
             "",
             "| key space | records | segments | log MB read | MB/s | records/s | kept | offset-map keys | "
             "worker RssAnon (map built) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in speed:
        lines.append(f"| {r['keys']:,} | {r['records']:,} | {r['segments']} | {r['bytes_before'] / 1e6:.1f} | "
                     f"{r['bytes_before'] / 1e6 / r['seconds']:.1f} | {r['records_read'] / r['seconds']:,.0f} | "
                     f"{r['records_kept']:,} | {r['map_keys']:,} | {r['rss_anon_kib'] / 1024:.0f} MiB | "
                     f"{r['load']} |")
    lines += ["", f"### 2. Append latency while cleaning ({args.rate:.0f} appends/s of 1 record, open loop, "
              f"{args.seconds:.0f} s per case, {args.repeats} interleaved repeats: median of each percentile, "
              f"all p99s in brackets; the cleaner cleans a {args.latency_records:,}-record log of 1,000 keys)", "",
              "| case | appends | p50 | p99 | p99.9 | max | pass | 1-min load per repeat |",
              "|---|---|---|---|---|---|---|---|"]
    for r in latency:
        done = ("-" if "pass_done_within_window" not in r else
                (f"{r['pass_mb']:.0f} MB in {r['pass_seconds']:.1f} s" if r["pass_done_within_window"]
                 else "still running at the end"))
        p99s = ", ".join(fmt_us(v) for v in r["p99_us_all"])
        lines.append(f"| {r['case']} | {r['appends']:,} | {fmt_us(r['p50_us'])} | {fmt_us(r['p99_us'])} ({p99s}) | "
                     f"{fmt_us(r['p999_us'])} | {fmt_us(r['max_us'])} | {done} | {r['load']} |")
    lines += ["", f"### 3. Steady state: {args.steady_records:,} overwrites of 1,000 keys, 4 MiB segments, "
              f"a pass (dirty ratio 0.5) after every {args.steady_records // args.chunks:,}", "",
              "| written | segments | log on disk | pass |", "|---|---|---|---|"]
    for r in steady:
        done = "skipped (dirty ratio)" if r["skipped"] else f"{r['pass_seconds']:.2f} s"
        lines.append(f"| {r['written']:,} | {r['segments']} | {r['disk_bytes'] / 1e6:.1f} MB | {done} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", default="1000,1000000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--latency-records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady-records", type=int, default=3_000_000)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=Path(__file__).with_name("out"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="cleaner-", dir=args.dir))
    load_before = load_average()
    try:
        speed = []
        for keys in (int(k) for k in args.keys.split(",")):
            log(f"speed and memory: {args.records:,} records of {keys:,} keys ...")
            speed.append(run_speed(scratch, args.records, keys))
            log(f"  {speed[-1]}")
        log("append latency ...")
        latency = run_latency(scratch, args.latency_records, args.seconds, args.rate, args.repeats)
        log("steady state ...")
        steady = run_steady(scratch, args.steady_records, args.chunks)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    body = report(speed, latency, steady, args, load_before)
    print(body)
    if args.out is not None:
        args.out.write_text(body)
    elif not args.no_results:
        bench_results.write_section("cleaner", body, "python -m bench.cleaner_bench " + " ".join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
