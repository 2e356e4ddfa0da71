"""Benchmark of key compaction (compaction/cleaner.py): cleaning speed, memory, append latency, disk.

    python -m bench.cleaner_bench [--records N] [--keys 1000,1000000] [--seconds S] [--steady-records M]
                                  [--dir DIR] [--out FILE] [--no-results]

Records come in batches of 10 (a leader coalesces proposals), each record a key
`kv/app/<16 hex digits>` (a multiplicative hash of a key number drawn uniformly from the key space)
and a 100-byte random value, appended with `Log.append` to a log of 16 MiB segments in a scratch
directory under DIR (default bench/out/, git-ignored), removed afterwards.

1. speed and memory   one FRESH subprocess per key count (--keys): append N records, then one forced
                      pass `clean_log` below the active segment: MB/s of log read (the bytes of the
                      segments rewritten, over the pass), records/s, bytes before/after, offset-map
                      keys, and memory: VmRSS before the pass, and the peak VmHWM after it.
2. append latency     a thread appends 1-record batches at a fixed rate (open loop: each append has
                      a due time; its latency is completion minus due time, so waiting for the
                      interpreter lock counts) for S seconds without cleaning, then S seconds while a
                      `LogCleaner` thread cleans a large log, unthrottled and throttled.
3. steady state       M overwrites of 1,000 keys in chunks; after each chunk a pass below the active
                      segment; the log's bytes on disk after each pass (flat when cleaning keeps up).

The machine is shared: the load average is recorded with every phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
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


def memory_kib() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def fill(lg: Log, records: int, keys: int, seed: int, ts: int = 1_700_000_000_000) -> None:
    rng = random.Random(seed)
    value = rng.randbytes(VALUE_BYTES)
    for i in range(0, records, BATCH_RECORDS):
        entries = [(key_of(rng.randrange(keys)), value) for _ in range(min(BATCH_RECORDS, records - i))]
        lg.append(encode_batch(entries, timestamp_ms=ts + i), epoch=1)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.iterdir() if p.is_file())


# --- 1. speed and memory (in a fresh process per key count) ---------------------------------------

def speed_child(directory: Path, records: int, keys: int) -> dict[str, Any]:
    config = LogConfig(segment_bytes=SEGMENT_BYTES, flush_policy="interval", preallocate_next_segment=False)
    with Log.open(directory, config) as lg:
        started = time.perf_counter()
        fill(lg, records, keys, seed=keys)
        fill_s = time.perf_counter() - started
        lg.flush()
        before = memory_kib()
        horizon = lg.segment_bases()[-1]
        result = clean_log(lg, horizon, CleanerConfig(), force=True)
        after = memory_kib()
    return {"keys": keys, "records": records, "fill_s": fill_s, "seconds": result.seconds,
            "bytes_before": result.bytes_before, "bytes_after": result.bytes_after,
            "records_read": result.records_read, "records_kept": result.records_kept,
            "map_keys": result.offset_map_keys, "segments": result.segments_before,
            "rss_before_kib": before["VmRSS"], "rss_after_kib": after["VmRSS"], "hwm_kib": after["VmHWM"],
            "load": load_average()}


def run_speed(scratch: Path, records: int, keys: int) -> dict[str, Any]:
    directory = scratch / f"speed-{keys}"
    proc = subprocess.run([sys.executable, "-m", "bench.cleaner_bench", "--child-speed", str(directory),
                           str(records), str(keys)], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[1])
    shutil.rmtree(directory, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"speed child failed: {proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


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


def run_latency(scratch: Path, records: int, seconds: float, rate: float) -> list[dict[str, Any]]:
    rows = []
    for label, throttle in (("no cleaning", None), ("cleaning, unthrottled", 0), ("cleaning, 32 MiB/s", 32 * MIB),
                            ("cleaning, 8 MiB/s", 8 * MIB)):
        directory = scratch / "latency"
        shutil.rmtree(directory, ignore_errors=True)
        config = LogConfig(segment_bytes=SEGMENT_BYTES, flush_policy="group")
        with Log.open(directory, config) as lg:
            fill(lg, records, 1000, seed=1)
            lg.flush()
            horizon = lg.segment_bases()[-1]
            cleaner = None
            if throttle is not None:
                cleaner = LogCleaner(CleanerConfig(max_io_bytes_per_second=throttle))
                future = cleaner.submit(lg, horizon, force=True)
                time.sleep(0.05)
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
        if throttle is not None:
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
             "### 1. Speed and memory (one fresh process per key space; one forced pass below the active segment)",
             "",
             "| key space | records | segments | log MB read | MB/s | records/s | kept | offset-map keys | "
             "RSS before pass | peak RSS | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in speed:
        lines.append(f"| {r['keys']:,} | {r['records']:,} | {r['segments']} | {r['bytes_before'] / 1e6:.1f} | "
                     f"{r['bytes_before'] / 1e6 / r['seconds']:.1f} | {r['records_read'] / r['seconds']:,.0f} | "
                     f"{r['records_kept']:,} | {r['map_keys']:,} | {r['rss_before_kib'] / 1024:.0f} MiB | "
                     f"{r['hwm_kib'] / 1024:.0f} MiB | {r['load']} |")
    lines += ["", f"### 2. Append latency while cleaning ({args.rate:.0f} appends/s of 1 record, open loop, "
              f"{args.seconds:.0f} s per case; the cleaner cleans a {args.latency_records:,}-record log "
              f"of 1,000 keys)", "",
              "| case | appends | p50 | p99 | p99.9 | max | pass | load avg |", "|---|---|---|---|---|---|---|---|"]
    for r in latency:
        done = ("-" if "pass_done_within_window" not in r else
                (f"{r['pass_mb']:.0f} MB in {r['pass_seconds']:.1f} s" if r["pass_done_within_window"]
                 else "still running at the end"))
        lines.append(f"| {r['case']} | {r['appends']:,} | {fmt_us(r['p50_us'])} | {fmt_us(r['p99_us'])} | "
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
    if argv and argv[0] == "--child-speed":
        print(json.dumps(speed_child(Path(argv[1]), int(argv[2]), int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", default="1000,1000000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--latency-records", type=int, default=1_000_000)
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
        latency = run_latency(scratch, args.latency_records, args.seconds, args.rate)
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
