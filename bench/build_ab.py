"""Two builds of Epochlog side by side, interleaved: server CPU per event and ops/s, same run.

On a shared, loaded machine the spread between runs is larger than most differences a change makes,
so this runs bench/vs_etcd's Epochlog side (a FRESH 3-node cluster per run, bench/node_load.py over
the SDK) for each case `--rounds` times, alternating which build goes first each round, and reports
the median of each build and their ratio. Server CPU per event (the sum over the three nodes, divided
by the events written) is less sensitive to other load than wall time: compare builds by it.

    git archive main | tar -x -C /tmp/base        # any source tree of the other build
    .venv/bin/python -m bench.build_ab --base /tmp/base --rounds 3
    .venv/bin/python -m bench.build_ab --base /tmp/base --only txn-b100-c16 --scale 0.3 --rounds 2

Each build runs from its own directory (`python -m epochlog serve` with that directory first on the
path), with this checkout's interpreter and installed dependencies. Writes the `build-ab` section
of bench/RESULTS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.results import write_section
from bench.vs_etcd import CASES, log

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ("put-c1", "put-c16", "txn-b100-c16")

_ONE_RUN = """
import json, sys
from pathlib import Path
from bench.vs_etcd import CASES, run_epochlog
label, n, scratch = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
case = next(c for c in CASES if c[0] == label)
print(json.dumps(run_epochlog(case, n, scratch)))
"""


def run_build(tree: Path, label: str, n: int, scratch: Path) -> dict[str, object]:
    """One fresh-cluster run of case `label` with the build in `tree`."""
    out = subprocess.run([sys.executable, "-c", _ONE_RUN, label, str(n), str(scratch)], cwd=tree,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"run of {label} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def per_event(run: dict[str, object]) -> float:
    """Server CPU (us, three nodes) per event written."""
    return float(run["server_cpu_us_per_rpc"]) / float(run.get("batch", 1) or 1)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="source tree of the build to compare with")
    ap.add_argument("--head", type=Path, default=ROOT, help="source tree of the other build (default: this one)")
    ap.add_argument("--only", default=",".join(DEFAULT_CASES), help="comma-separated vs_etcd case labels")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.5, help="multiplies vs_etcd's request count per case")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    labels = [s for s in args.only.split(",") if s]
    cases = {c[0]: c for c in CASES}
    builds = {"base": args.base.resolve(), "head": args.head.resolve()}
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    loads: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix="build-ab-"))
    try:
        for r in range(args.rounds):
            for label in labels:
                n = max(200, int(cases[label][3] * args.scale))
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for build in order:
                    loads.append(Path("/proc/loadavg").read_text().split()[0])
                    out = run_build(builds[build], label, n, scratch / f"{build}-{label}-{r}")
                    results.setdefault((label, build), []).append(out)
                    log(f"round {r + 1} {label} {build}: {out['ops_per_s']} ops/s, {per_event(out):.1f} us server "
                        f"CPU per event, errors {out['errors']}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = ["| case | base ops/s | head ops/s | ratio | base server CPU us/event | head server CPU us/event | "
             "CPU ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label in labels:
        b, h = results[(label, "base")], results[(label, "head")]
        b_ops = statistics.median(float(x["ops_per_s"]) for x in b)  # type: ignore[arg-type]
        h_ops = statistics.median(float(x["ops_per_s"]) for x in h)  # type: ignore[arg-type]
        b_cpu = statistics.median(per_event(x) for x in b)
        h_cpu = statistics.median(per_event(x) for x in h)
        lines.append(f"| {label} | {b_ops:,.0f} | {h_ops:,.0f} | {h_ops / b_ops:.2f}x | {b_cpu:,.1f} | {h_cpu:,.1f} | "
                     f"{h_cpu / b_cpu:.2f}x |")
    body = "\n".join(lines) + (
        f"\n\nbase: {builds['base']}, head: {builds['head']}. Medians of {args.rounds} rounds, builds interleaved "
        f"(order alternating per round), a fresh 3-node cluster per run, requests scaled by {args.scale} of "
        f"bench/vs_etcd's. Ratio > 1: head faster; CPU ratio < 1: head spends less server CPU per event. Load "
        f"average (1 min) before each run: {', '.join(loads)}.\n\nRuns (JSON lines):\n\n```\n"
        + "\n".join(json.dumps({"build": b, **x}) for (_, b), xs in sorted(results.items()) for x in xs) + "\n```")
    print(body.split("\n\nRuns")[0])
    if not args.no_write:
        write_section("build-ab", body)


if __name__ == "__main__":
    main()
