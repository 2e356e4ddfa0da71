"""How long a process of Epochlog takes to start: a CLI call (wall and CPU, median of N) and a node
(`epochlog serve`, one member, plaintext peers) from its start to its READY line.

The suite starts well over a thousand of these processes, so their start-up is most of its idle time
besides the waits it asserts on. Prints one table; `-X importtime` says where a slow one goes.

    python -m bench.startup [--calls 10] [--nodes 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.proc_cpu import process_cpu
from tests.support.nodes import NodeCluster

ROOT = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_call(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit code) of one `python -m epochlog ARGS`."""
    cpu, start = _children_cpu(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "epochlog", *args], cwd=ROOT, capture_output=True, check=False)
    return time.monotonic() - start, _children_cpu() - cpu, done.returncode


def node_start(root: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the node) from spawning a one-member node to its READY line."""
    cluster = NodeCluster(root, size=1, insecure=True)
    try:
        start = time.monotonic()
        cluster.start()
        wall = time.monotonic() - start
        proc = cluster.nodes[1].proc
        assert proc is not None
        cpu = process_cpu(proc.pid)
        assert cpu is not None, "the node exited at start"
        return wall, cpu
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.calls} calls, {args.nodes} node starts")
    print(f"{'process':<28} {'wall s':>7} {'cpu s':>6} {'exit':>4}")
    with tempfile.TemporaryDirectory(dir=ROOT / "data" if (ROOT / "data").is_dir() else None) as tmp:
        cluster = NodeCluster(Path(tmp) / "served", size=1, insecure=True)
        try:
            cluster.start()
            endpoints = ["--endpoints", cluster.nodes[1].client_address]
            for name, argv in (("epochlog --help", ["--help"]), ("epochlog put k v", ["put", "k", "v", *endpoints]),
                               ("epochlog get k", ["get", "k", *endpoints]), ("epochlog status", ["status", *endpoints])):
                runs = [cli_call(argv) for _ in range(args.calls)]
                print(f"{name:<28} {statistics.median(r[0] for r in runs):>7.3f} "
                      f"{statistics.median(r[1] for r in runs):>6.3f} {runs[0][2]:>4}")
        finally:
            cluster.close()
        starts = [node_start(Path(tmp) / f"n{i}") for i in range(args.nodes)]
    print(f"{'epochlog serve to READY':<28} {statistics.median(s[0] for s in starts):>7.3f} "
          f"{statistics.median(s[1] for s in starts):>6.3f}")


if __name__ == "__main__":
    main()
