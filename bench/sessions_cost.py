"""What client sessions cost: the same build, writes with and without sessions, interleaved.

Client sessions (statemachines/sessions.py) make every write exactly once; without them a write
carries a UUIDv7 request id, remembered for an hour (statemachines/request_ids.py). Both keep one
outcome row per in-flight write; a session also updates its own row. This runs bench/vs_etcd's
Epochlog side (a FRESH 3-node cluster per run, bench/node_load.py through the SDK) for put at 1, 16
and 64 clients, `--rounds` times, alternating the order of the two modes each round, and reports
the median ops/s and server CPU per put of each mode and their ratio.

    .venv/bin/python -m bench.sessions_cost                 # 3 rounds (~6 minutes)
    .venv/bin/python -m bench.sessions_cost --rounds 1 --scale 0.2   # a smoke run

Compare with `bench.vs_etcd` on an idle machine for absolute figures: on a shared one the spread
between runs is larger than the difference measured here, which is why the modes are interleaved and
the server CPU per put (less sensitive to other load than wall time) is reported beside ops/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.results import write_section
from bench.vs_etcd import CASES, log, run_epochlog

LABELS = ("put-c1", "put-c16", "put-c64")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.5, help="multiplies vs_etcd's request count per case")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    cases = [c for c in CASES if c[0] in LABELS]
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    loads = []
    scratch = Path(tempfile.mkdtemp(prefix="sessions-cost-"))
    try:
        for r in range(args.rounds):
            for case in cases:
                label, workload, conc, n, etcd_args, our_args = case
                modes = [("sessions", []), ("request ids", ["--no-sessions"])]
                for mode, extra in modes if r % 2 == 0 else reversed(modes):
                    loads.append(Path("/proc/loadavg").read_text().split()[0])
                    out = run_epochlog((f"{label}-{len(loads)}", workload, conc, n, etcd_args, our_args + extra),
                                       max(200, int(n * args.scale)), scratch)
                    results.setdefault((label, mode), []).append(out)
                    log(f"round {r + 1} {label} {mode}: {out['ops_per_s']} ops/s, "
                        f"server {out['server_cpu_us_per_rpc']} us/put, errors {out['errors']}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = ["| case | sessions ops/s | request ids ops/s | ratio | sessions server CPU us/put | "
             "request ids server CPU us/put | CPU ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label in LABELS:
        s, q = results[(label, "sessions")], results[(label, "request ids")]
        s_ops = statistics.median(float(x["ops_per_s"]) for x in s)             # type: ignore[arg-type]
        q_ops = statistics.median(float(x["ops_per_s"]) for x in q)             # type: ignore[arg-type]
        s_cpu = statistics.median(float(x["server_cpu_us_per_rpc"]) for x in s)  # type: ignore[arg-type]
        q_cpu = statistics.median(float(x["server_cpu_us_per_rpc"]) for x in q)  # type: ignore[arg-type]
        lines.append(f"| {label} | {s_ops:,.0f} | {q_ops:,.0f} | {s_ops / q_ops:.2f}x | {s_cpu:,.0f} | "
                     f"{q_cpu:,.0f} | {s_cpu / q_cpu:.2f}x |")
    body = "\n".join(lines) + (
        f"\n\nMedians of {args.rounds} rounds, modes interleaved (order alternating per round), a fresh 3-node "
        f"cluster per run, requests scaled by {args.scale} of bench/vs_etcd's. Ratio > 1: sessions faster; CPU "
        f"ratio > 1: sessions cost more server CPU per put. Load average (1 min) before each run: "
        f"{', '.join(loads)}.\n\nRuns (JSON lines):\n\n```\n"
        + "\n".join(json.dumps({"mode": m, **x}) for (_, m), xs in sorted(results.items()) for x in xs) + "\n```")
    print(body.split("\n\nRuns")[0])
    if not args.no_write:
        write_section("sessions-cost", body)


if __name__ == "__main__":
    main()
