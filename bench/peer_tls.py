"""What peer TLS costs: put throughput at 16 clients with the members on mutual TLS and in plaintext.

Runs bench/vs_etcd.py's Epochlog side (a FRESH 3-node `epochlog serve` cluster per run on 127.0.0.1,
loaded by bench/node_load.py through the SDK: single puts of ~145 bytes, 16 concurrent callers),
alternating the two modes in ABBA order for `--rounds` rounds so drift of the shared machine's load
hits both alike; reports every run, the median per mode and the cost (1 - TLS / plaintext). The
issue's target: at most 10 %.

    .venv/bin/python -m bench.peer_tls                  # 3 rounds (12 runs, ~3 minutes)
    .venv/bin/python -m bench.peer_tls --rounds 1 --n 5000 --no-write   # a smoke run

The load average before each run is recorded: the machine is shared, compare within one run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.results import write_section
from bench.vs_etcd import CASES, log, run_epochlog

CASE = next(c for c in CASES if c[0] == "put-c16")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (each runs both modes twice)")
    ap.add_argument("--n", type=int, default=CASE[3], help="puts per run")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="peer-tls-"))
    runs: list[tuple[str, str, dict[str, object]]] = []   # (mode, load before, result)
    try:
        for r in range(args.rounds):
            for mode in ("tls", "plain", "plain", "tls"):
                load = loadavg()
                try:
                    result = run_epochlog(CASE, args.n, scratch / f"r{r}-{len(runs)}", peer_tls=mode == "tls")
                except RuntimeError as exc:   # reported, then the run is taken again (the machine is shared)
                    log(f"round {r + 1} {mode}: the run failed, retrying it: {exc}")
                    result = run_epochlog(CASE, args.n, scratch / f"r{r}-{len(runs)}-again", peer_tls=mode == "tls")
                log(f"round {r + 1} {mode}: {result['ops_per_s']} ops/s, p50 "
                    f"{result['latency_ms']['p50']} ms, errors {result['errors']}, load before {load}")  # type: ignore[index]
                runs.append((mode, load, result))
                time.sleep(2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {mode: statistics.median(float(res["ops_per_s"]) for m, _, res in runs if m == mode)  # type: ignore[arg-type]
           for mode in ("tls", "plain")}
    cost = 1 - med["tls"] / med["plain"]
    cpu = {mode: statistics.median(float(res["server_cpu_us_per_rpc"] or 0) for m, _, res in runs if m == mode)  # type: ignore[arg-type]
           for mode in ("tls", "plain")}
    lines = ["| run | peer TLS | ops/s | p50 / p99 ms | server CPU us per put | load before |",
             "|---:|---|---:|---:|---:|---|"]
    for i, (mode, load, res) in enumerate(runs, 1):
        lat = res["latency_ms"]
        assert isinstance(lat, dict)
        lines.append(f"| {i} | {'on' if mode == 'tls' else 'off'} | {float(res['ops_per_s']):,.0f} | "  # type: ignore[arg-type]
                     f"{lat.get('p50')} / {lat.get('p99')} | {res.get('server_cpu_us_per_rpc')} | {load} |")
    summary = (f"Median put-c16 throughput: {med['tls']:,.0f} ops/s with peer TLS, {med['plain']:,.0f} without: "
               f"peer TLS costs {100 * cost:.1f} % (target: at most 10 %). Median server CPU per put (three "
               f"nodes): {cpu['tls']:.0f} us with TLS, {cpu['plain']:.0f} us without. {args.rounds} ABBA rounds of "
               f"{args.n} puts on fresh 3-node clusters; load average after: {loadavg()}.")
    body = "\n".join(lines) + "\n\n" + summary
    print(body)
    if not args.no_write:
        write_section("peer-tls", body, command=f"python -m bench.peer_tls --rounds {args.rounds} --n {args.n}")


if __name__ == "__main__":
    main()
