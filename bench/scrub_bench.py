"""What finding corruption costs: the scrub's effect on put latency, and the CRC check of every read.

1. Put latency with the scrub off and at a rate (issue 18: at its default rate the scrub costs at most
   5 % of p99 put latency). Per round and rate, a FRESH cluster (`--nodes`, default 3) (tests/support/nodes.py, 4 MiB
   segments, the cleaner off so sealed segments stay) is preloaded with `--preload-mib` of kv puts in
   batches (sealed segments for the scrub to read: a pass over them takes preload / rate seconds, then
   the scrub pauses 1 s), then `--puts` single puts are timed from `--concurrency` SDK callers. The
   rates alternate within each round (off, default, ...) and the table gives, per rate, the median
   over rounds of each percentile, all the rounds' p99s, and the bytes the scrubs of the nodes
   actually checked per second during the measurement (epochlog_scrub_bytes_total).
2. The scrub thread next to an event loop in one process (`run_loop_probe`): how late a request-like
   callback starts, every millisecond, with the scrub off and on, and the scrub thread's CPU.
3. The read path's checks, in process: `Log.read` of a 64 MiB log in 1 MiB chunks (what Fetch,
   read_events, watch and replication do) with every batch checked (CRC, layout, offset, epoch), and
   with the check replaced by a header read (what reads did before), for 200-byte, 1 KiB and 16 KiB
   batches.

    .venv/bin/python -m bench.scrub_bench                      # 5 rounds, off vs the default rate
    .venv/bin/python -m bench.scrub_bench --rounds 1 --puts 3000 --preload-mib 8 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results import write_section
from epochlog.client import AsyncClient
from eventlog.config import LogConfig
from statemachines import events as ev
from tests.support.nodes import NodeCluster

DEFAULT_RATE = LogConfig().scrub_bytes_per_second


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _scrubbed(cluster: NodeCluster) -> float:
    return sum(cluster.metrics(n).get(("epochlog_scrub_bytes_total", ()), 0.0) for n in cluster.nodes)





async def _load(endpoints: list[str], args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncClient(endpoints, timeout=30.0)
    value = b"v" * args.value_bytes
    try:
        per_call = 200
        calls = max(1, args.preload_mib * (1 << 20) // ((args.value_bytes + 60) * per_call))
        for c in range(calls):
            await client.commands([ev.KvPut(name=f"pre/{c:05d}/{j:03d}", value=value) for j in range(per_call)])
        lat: list[float] = []
        next_i = 0

        async def worker() -> None:
            nonlocal next_i
            while next_i < args.puts:
                i = next_i
                next_i += 1
                t0 = time.perf_counter()
                await client.put(f"lat/{i % 5000:05d}", value)
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(min(args.concurrency, 4))))   # warm up
        lat.clear()
        next_i = 0
        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.monotonic() - started
    finally:
        await client.close()
    lat.sort()

    def q(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * (len(lat) - 1) + 0.5))] * 1000, 3)

    return {"puts": len(lat), "puts_per_s": round(len(lat) / wall), "wall_s": round(wall, 2),
            "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": round(lat[-1] * 1000, 3)}


def run_phase(rate: int, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"scrub-bench-{rate}-", dir=args.scratch) as tmp:
        cluster = NodeCluster(Path(tmp), size=args.nodes, seed=round_no,
                              log={"segment_bytes": 4 << 20, "scrub_bytes_per_second": rate},
                              compaction={"cleaner": {"enabled": False}})
        try:
            load_before = os.getloadavg()
            cluster.start()
            cluster.leader("kv")
            scrubbed0, t0 = _scrubbed(cluster), time.monotonic()
            result = asyncio.run(_load(cluster.endpoints, args))
            # the scrub's bytes over preload and measurement together (it starts with the nodes)
            result["scrub_mib_per_s"] = round((_scrubbed(cluster) - scrubbed0) / (time.monotonic() - t0) / 2**20, 2)
            result["rate"] = rate
            result["load_before"] = [round(x, 2) for x in load_before]
            codes = cluster.stop_all()
            assert set(codes.values()) == {0}, codes
            return result
        finally:
            cluster.close()


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    rates = [0, *args.rates]
    out: dict[str, Any] = {"rounds": []}
    for r in range(args.rounds):
        for rate in (rates if r % 2 == 0 else rates[::-1]):   # the order alternates: drift cancels out
            log(f"round {r + 1}/{args.rounds}: scrub {rate / 2**20:g} MiB/s")
            result = run_phase(rate, args, r)
            log(f"  {json.dumps(result)}")
            out["rounds"].append(result)
    return out


def run_reads(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Log.read over a 64 MiB log: checked as now, and with the check replaced by a header read."""
    from eventlog.log import Log
    from eventlog.records import encode_batch, read_header
    from eventlog.segment import Segment

    rows = []
    for batch_bytes in (200, 1024, 16384):
        with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
            config = LogConfig(segment_bytes=64 << 20, flush_policy="interval")
            with Log.open(Path(tmp) / "log", config) as lg:
                batch = encode_batch([(b"k", b"v" * max(1, batch_bytes - 80))], timestamp_ms=1)
                total = 0
                while total < (60 << 20):
                    lg.append(batch, epoch=1)
                    total += len(batch)
                lg.flush()

                def read_all() -> float:
                    started = time.perf_counter()
                    offset = lg.start_offset
                    while offset < lg.end_offset:
                        offset = lg.read(offset, 1 << 20).next_offset
                    return time.perf_counter() - started

                checked = min(read_all() for _ in range(3))
                original = Segment.check_at

                def header_only(self: Segment, view: memoryview, pos: int, expected: int) -> Any:
                    return read_header(view, pos)

                Segment.check_at = header_only   # type: ignore[method-assign]
                try:
                    unchecked = min(read_all() for _ in range(3))
                finally:
                    Segment.check_at = original   # type: ignore[method-assign]
                mib = total / 2**20
                rows.append({"batch_bytes": len(batch), "mib": round(mib, 1),
                             "checked_mib_per_s": round(mib / checked), "unchecked_mib_per_s": round(mib / unchecked),
                             "cost_us_per_mib": round((checked - unchecked) / mib * 1e6, 1)})
                log(f"reads: {rows[-1]}")
    return rows


def run_loop_probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The scrub thread next to an event loop, in one process (as in a node): the loop runs a request-like
    callback (about 0.2 ms of Python) every millisecond; measured: how late callbacks start and how long
    they take, with the scrub off and at `--probe-rate`, over a log of 48 MiB in big batches (200 puts:
    as the latency phases preload) or in 300-byte batches (the most per-batch work per byte)."""
    from eventlog.log import Log
    from eventlog.records import encode_batch
    from eventlog.scrub import Scrubber

    rows = []
    for records in (200, 1):
        with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
            with Log.open(Path(tmp) / "log", LogConfig(segment_bytes=4 << 20, flush_policy="interval")) as lg:
                batch = encode_batch([(b"kv/pre/%06d" % i, b"v" * 200) for i in range(records)], timestamp_ms=1)
                total = 0
                while total < (48 << 20):
                    lg.append(batch, epoch=1)
                    total += len(batch)
                lg.flush()
                for repeat in range(args.probe_repeats):
                    for on in ((False, True) if repeat % 2 == 0 else (True, False)):
                        scrubber = Scrubber(lambda lg=lg: {"kv": lg}, args.probe_rate) if on else None
                        if scrubber is not None:
                            scrubber.start()
                        late, took = asyncio.run(_probe(args.probe_seconds))
                        cpu = 0.0
                        if scrubber is not None:
                            scrubber.close()
                            cpu = scrubber.stats.cpu_seconds / args.probe_seconds
                        rows.append({"batch_bytes": len(batch), "scrub": on, "late_p99_ms": late[0], "late_max_ms": late[1],
                                     "took_p99_ms": took[0], "scrub_cpu_pct": round(100 * cpu, 2)})
                        log(f"probe: {rows[-1]}")
    return rows


async def _probe(seconds: float) -> tuple[tuple[float, float], tuple[float, float]]:
    loop = asyncio.get_running_loop()
    late: list[float] = []
    took: list[float] = []
    done = loop.create_future()
    end = loop.time() + seconds

    def tick(due: float) -> None:
        started = loop.time()
        late.append(started - due)
        x = 0
        for i in range(3000):   # about 0.2 ms of Python
            x += i * i
        took.append(loop.time() - started)
        if started < end:
            loop.call_at(due + 0.001, tick, due + 0.001)
        elif not done.done():
            done.set_result(None)

    loop.call_soon(tick, loop.time())
    await done
    late.sort()
    took.sort()

    def q(values: list[float]) -> tuple[float, float]:
        return round(values[int(0.99 * (len(values) - 1))] * 1000, 3), round(values[-1] * 1000, 3)
    return q(late), q(took)


def render(lat: dict[str, Any], reads: list[dict[str, Any]], args: argparse.Namespace,
           probe: list[dict[str, Any]] | None = None) -> str:
    by_rate: dict[int, list[dict[str, Any]]] = {}
    for r in lat["rounds"]:
        by_rate.setdefault(r["rate"], []).append(r)
    lines = [f"{args.nodes} `epochlog serve` node(s) on loopback per phase (fresh cluster, 4 MiB segments, cleaner off), "
             f"preloaded with {args.preload_mib} MiB of kv puts in batches of 200, then {args.puts:,} single puts of "
             f"{args.value_bytes} bytes from {args.concurrency} SDK callers; {args.rounds} rounds, the rates "
             f"taking turns within each (the order reversed every other round). Medians over rounds; `scrub MiB/s` is what the nodes' scrubs checked "
             f"per second, all nodes together, from start to the end of the measurement (a pass over the sealed segments, then 1 s of "
             f"pause). Load average (1 min) before each phase is in the JSON lines.", "",
             f"| scrub rate | puts/s | p50 ms | p99 ms | p99.9 ms | max ms | all p99s | scrub MiB/s ({args.nodes} nodes) |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    med: dict[int, float] = {}
    for rate, rows in by_rate.items():
        def m(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return round(statistics.median(r[key] for r in rows), 3)
        med[rate] = m("p99_ms")
        name = "off" if rate == 0 else f"{rate / 2**20:g} MiB/s" + (" (default)" if rate == DEFAULT_RATE else "")
        lines.append(f"| {name} | {m('puts_per_s'):,.0f} | {m('p50_ms')} | {m('p99_ms')} | {m('p999_ms')} | "
                     f"{m('max_ms')} | {', '.join(str(r['p99_ms']) for r in rows)} | {m('scrub_mib_per_s')} |")
    if 0 in med and DEFAULT_RATE in med:
        ratio = med[DEFAULT_RATE] / med[0]
        lines += ["", "| target | measured | met? |", "|---|---|---|",
                  f"| p99 put latency with the scrub at its default rate <= 1.05 x off | {ratio:.3f} x "
                  f"({med[DEFAULT_RATE]} ms vs {med[0]} ms) | {'met' if ratio <= 1.05 else 'NOT met'} |"]
    lines += ["", "Read path: `Log.read` of a log in 1 MiB chunks, in process, best of 3 (each batch checked: CRC32C, "
              "layout, offset, epoch; or only its header read, as before).", "",
              "| batch bytes | log MiB | checked MiB/s | header only MiB/s | check cost us/MiB |",
              "|---:|---:|---:|---:|---:|"]
    for r in reads:
        lines.append(f"| {r['batch_bytes']} | {r['mib']} | {r['checked_mib_per_s']} | {r['unchecked_mib_per_s']} | "
                     f"{r['cost_us_per_mib']} |")
    if probe:
        lines += ["", f"The scrub thread next to an event loop in one process, at {args.probe_rate / 2**20:g} MiB/s over a "
                  f"48 MiB log "
                  f"(`run_loop_probe`): a callback of ~0.2 ms every ms for {args.probe_seconds:g} s, "
                  f"{args.probe_repeats} repeats per case alternating off/on; medians of the repeats.", "",
                  "| batch bytes | scrub | callback start late p99 ms | late max ms | callback took p99 ms | scrub CPU % of a core |",
                  "|---:|---|---:|---:|---:|---:|"]
        for size in sorted({r["batch_bytes"] for r in probe}, reverse=True):
            for on in (False, True):
                rows = [r for r in probe if r["batch_bytes"] == size and r["scrub"] is on]
                def m(key: str, rows: list[dict[str, Any]] = rows) -> float:
                    return round(statistics.median(r[key] for r in rows), 3)
                lines.append(f"| {size} | {'on' if on else 'off'} | {m('late_p99_ms')} | {m('late_max_ms')} | "
                             f"{m('took_p99_ms')} | {m('scrub_cpu_pct')} |")
    lines += ["", "Rounds (JSON lines):", "", "```", *(json.dumps(r) for r in lat["rounds"]), "```"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--probe-seconds", type=float, default=5.0)
    ap.add_argument("--probe-repeats", type=int, default=4)
    ap.add_argument("--probe-rate", type=int, default=DEFAULT_RATE, help="the probe's scrub rate (bytes/s)")
    ap.add_argument("--rates", type=int, nargs="*", default=[DEFAULT_RATE], help="scrub rates (bytes/s) besides off")
    ap.add_argument("--preload-mib", type=int, default=48)
    ap.add_argument("--puts", type=int, default=15000)
    ap.add_argument("--concurrency", "-c", type=int, default=16)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--scratch", default=None, help="directory for the clusters' data (default: the system's temp)")
    ap.add_argument("--no-write", action="store_true", help="print, do not update bench/RESULTS.md")
    args = ap.parse_args()
    reads = run_reads(args)
    probe = run_loop_probe(args)
    lat = run_latency(args) if args.rounds else {"rounds": []}
    body = render(lat, reads, args, probe)
    print(body)
    if not args.no_write:
        write_section("scrub", body)


if __name__ == "__main__":
    main()
