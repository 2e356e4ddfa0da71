"""Two builds of Epochlog side by side, interleaved: server CPU per event and ops/s, same run.

On a shared, loaded machine the spread between runs is larger than most differences a change makes,
so this runs bench/vs_etcd's Epochlog side (a FRESH 3-node cluster per run, bench/node_load.py over
the SDK) for each case `--rounds` times, alternating which build goes first each round, and reports
the median of each build and their ratio. Server CPU per event (user + system CPU of the three node
processes from /proc, divided by the events written) is less sensitive to other load than wall time:
compare builds by it. Every figure comes with the load average it was measured at.

    .venv/bin/python -m bench.build_ab --base-rev main --rounds 3          # main against this checkout
    .venv/bin/python -m bench.build_ab --base /tmp/base --only txn-b100-c16 --scale 0.3 --rounds 2

`--base-rev`/`--head-rev` take a git revision (exported with `git archive` into a temp dir);
`--base`/`--head` a source tree. Each build runs from its own directory (`python -m epochlog serve`
with that directory first on the path), with this checkout's interpreter and installed dependencies.
Writes the section `--section` (default `build-ab`) of bench/RESULTS.md unless --no-write.
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
from bench.vs_etcd import CASES, log, run_epochlog

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ("put-c1", "put-c16", "txn-b100-c16")



def export_rev(rev: str, into: Path) -> Path:
    """The source tree of git revision `rev` of this repository, written under `into`."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def add_build_args(ap: argparse.ArgumentParser) -> None:
    """The two builds a comparison runs: a source tree or a git revision each."""
    ap.add_argument("--base", type=Path, help="source tree of the build to compare with")
    ap.add_argument("--base-rev", help="git revision of the build to compare with (instead of --base)")
    ap.add_argument("--head", type=Path, default=ROOT, help="source tree of the other build (default: this one)")
    ap.add_argument("--head-rev", help="git revision of the other build (instead of --head)")


def builds_of(ap: argparse.ArgumentParser, args: argparse.Namespace, scratch: Path) -> dict[str, Path]:
    """{"base": tree, "head": tree} from `add_build_args`' arguments, revisions exported under `scratch`."""
    if (args.base is None) == (args.base_rev is None):
        ap.error("give one of --base and --base-rev")
    base = export_rev(args.base_rev, scratch / "base-tree") if args.base_rev else args.base
    head = export_rev(args.head_rev, scratch / "head-tree") if args.head_rev else args.head
    return {"base": base.resolve(), "head": head.resolve()}


def events(run: dict[str, object]) -> float:
    return float(run.get("batch", 1) or 1)  # type: ignore[arg-type]


def per_event(run: dict[str, object]) -> float:
    """Server CPU (us, three nodes) per event written."""
    return float(run["server_cpu_us_per_rpc"]) / events(run)  # type: ignore[arg-type]


def busiest_per_event(run: dict[str, object]) -> float:
    """CPU (us) per event of the node that spent the most (usually the kv leader)."""
    cpu: dict[str, float] = run["server_cpu_s"]  # type: ignore[assignment]
    return 1e6 * max(cpu.values()) / float(run["requests_ok"]) / events(run)  # type: ignore[arg-type]


def changes(runs: list[dict[str, object]]) -> str:
    """Leadership changes summed over runs and groups (bench/vs_etcd.leader_changes; '?' if not reported)."""
    counts = [x.get("leader_changes") for x in runs]
    if any(not isinstance(c, dict) for c in counts):
        return "?"
    return str(sum(sum(c.values()) for c in counts))  # type: ignore[union-attr]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_args(ap)
    ap.add_argument("--only", default=",".join(DEFAULT_CASES), help="comma-separated vs_etcd case labels")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.5, help="multiplies vs_etcd's request count per case")
    ap.add_argument("--section", default="build-ab", help="the bench/RESULTS.md section written")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    labels = [s for s in args.only.split(",") if s]
    cases = {c[0]: c for c in CASES}
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    loads: dict[tuple[str, str], list[float]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="build-ab-"))
    try:
        builds = builds_of(ap, args, scratch)
        names = {"base": args.base_rev or str(builds["base"]), "head": args.head_rev or str(builds["head"])}
        for r in range(args.rounds):
            for label in labels:
                n = max(200, int(cases[label][3] * args.scale))
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for build in order:
                    load = float(Path("/proc/loadavg").read_text().split()[0])
                    out = run_epochlog(cases[label], n, scratch / f"{build}-{r}", tree=builds[build])
                    out["loadavg_1m_before"] = load
                    results.setdefault((label, build), []).append(out)
                    loads.setdefault((label, build), []).append(load)
                    log(f"round {r + 1} {label} {build}: {out['ops_per_s']} ops/s, {per_event(out):.1f} us server "
                        f"CPU per event (busiest node {busiest_per_event(out):.1f}), load {load}, errors "
                        f"{out['errors']}, leader changes {out.get('leader_changes', '?')}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = ["| case | base ops/s | head ops/s | ratio | base server CPU us/event | head server CPU us/event | "
             "CPU ratio | CPU ratio per round (median) | busiest node us/event (base / head) | leader changes, all runs (base / head) | "
             "load avg 1 min (base / head runs) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for label in labels:
        b, h = results[(label, "base")], results[(label, "head")]
        b_ops = statistics.median(float(x["ops_per_s"]) for x in b)  # type: ignore[arg-type]
        h_ops = statistics.median(float(x["ops_per_s"]) for x in h)  # type: ignore[arg-type]
        b_cpu = statistics.median(per_event(x) for x in b)
        h_cpu = statistics.median(per_event(x) for x in h)
        b_top = statistics.median(busiest_per_event(x) for x in b)
        h_top = statistics.median(busiest_per_event(x) for x in h)
        paired = sorted(per_event(y) / per_event(x) for x, y in zip(b, h))   # same round: same load, roughly
        load = " / ".join(", ".join(f"{v:.1f}" for v in loads[(label, k)]) for k in ("base", "head"))
        rounds = f"{', '.join(f'{v:.2f}' for v in paired)} ({statistics.median(paired):.2f}x)"
        lines.append(f"| {label} | {b_ops:,.0f} | {h_ops:,.0f} | {h_ops / b_ops:.2f}x | {b_cpu:,.1f} | {h_cpu:,.1f} | "
                     f"{h_cpu / b_cpu:.2f}x | {rounds} | {b_top:,.1f} / {h_top:,.1f} | {changes(b)} / {changes(h)} | "
                     f"{load} |")
    body = "\n".join(lines) + (
        f"\n\nbase: {names['base']}, head: {names['head']}. Medians of {args.rounds} rounds, builds interleaved "
        f"(order alternating per round), a fresh 3-node cluster per run, requests scaled by {args.scale} of "
        f"bench/vs_etcd's. Ratio > 1: head faster; CPU ratio < 1: head spends less server CPU per event (per round: head / base of the same round, "
        f"sorted; less exposed to the load drifting between rounds).\n\n"
        f"Runs (JSON lines):\n\n```\n"
        + "\n".join(json.dumps({"build": b, **x}) for (_, b), xs in sorted(results.items()) for x in xs) + "\n```")
    print(body.split("\n\nRuns")[0])
    if not args.no_write:
        write_section(args.section, body, command="python -m bench.build_ab " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
