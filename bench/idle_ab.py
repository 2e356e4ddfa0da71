"""What an idle cluster costs, two builds side by side: CPU and context switches per node and second.

An idle cluster is not free (heartbeats of every group and their answers, ticks, timers), and on a
shared machine that cost is a part of every per-put CPU figure measured at a low rate
(bench/paired_ab.py counts the three nodes' whole CPU). Both builds' 3-node clusters (as bench/vs_etcd
makes them, leaders balanced) run at the same time, nobody writes, and the nodes' user + system CPU and
context switches (every thread, from /proc) are read over `--windows` windows of `--seconds`, the
builds measured over the same windows, so both see the same load. Reported per build: CPU ms per node
and second (median over windows of the nodes' mean, and the range), voluntary and involuntary context
switches per node and second.

    .venv/bin/python -m bench.idle_ab --base-rev main --head . --windows 6 --seconds 10
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.build_ab import add_build_args, builds_of
from bench.node_load import cpu_of
from bench.paired_ab import Cluster, start
from bench.vs_etcd import log


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every live thread of `pid` so far."""
    vol = invol = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol += int(line.split()[1])
    return vol, invol


def sample(cluster: Cluster) -> tuple[float, int, int]:
    """The cluster's CPU seconds and context switches so far, summed over its nodes."""
    cpu = sum(cpu_of(cluster.pids).values())
    vol = invol = 0
    for pid in cluster.pids:
        v, i = switches(pid)
        vol, invol = vol + v, invol + i
    return cpu, vol, invol


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_args(ap)
    ap.add_argument("--windows", type=int, default=6, help="measurement windows")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of a window")
    ap.add_argument("--settle", type=float, default=10.0, help="idle seconds after start before measuring")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="idle-ab-"))
    clusters: dict[str, Cluster] = {}
    try:
        trees = builds_of(ap, args, scratch)
        for name, tree in trees.items():
            clusters[name] = start(tree, scratch / name)
        time.sleep(args.settle)
        load0 = float(Path("/proc/loadavg").read_text().split()[0])
        per: dict[str, list[tuple[float, float, float]]] = {n: [] for n in clusters}
        for _ in range(args.windows):
            before = {n: sample(c) for n, c in clusters.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)
            dt = time.monotonic() - t0
            for n, c in clusters.items():
                after = sample(c)
                nodes = len(c.pids) * dt
                per[n].append(((after[0] - before[n][0]) / nodes * 1000, (after[1] - before[n][1]) / nodes,
                               (after[2] - before[n][2]) / nodes))
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print("| build | CPU ms/s per node, median (min-max) | voluntary switches/s per node | involuntary /s | "
          "load avg 1 min (start, end) |")
    print("|---|---:|---:|---:|---|")
    for n, rows in per.items():
        cpu = [r[0] for r in rows]
        print(f"| {n} | {statistics.median(cpu):.1f} ({min(cpu):.1f}-{max(cpu):.1f}) | "
              f"{statistics.median(r[1] for r in rows):.0f} | {statistics.median(r[2] for r in rows):.0f} | "
              f"{load0:.1f}, {load1:.1f} |")
    log(f"{args.windows} windows of {args.seconds:.0f} s, base {args.base_rev or trees['base']}, "
        f"head {args.head_rev or trees['head']}")


if __name__ == "__main__":
    main()
