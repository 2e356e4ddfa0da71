"""How long a process of Epochlog takes to start: a CLI call (wall and CPU, median of N) and a node
(`epochlog serve`, one member, plaintext peers) from its start to its READY line.

The suite starts well over a thousand of these processes, so their start-up is most of its idle time
besides the waits it asserts on. Prints one table; `-X importtime` says where a slow one goes.

    python -m bench.startup [--calls 10] [--nodes 5]
    python -m bench.startup --base-rev main --rounds 5     # node starts and their phases, two builds

With `--base-rev` (or `--base DIR`) it measures node starts only, for this build and the other in turns:
member 1 of a 3-member cluster with mutual peer TLS (the suite's harness default), started on a fresh data
directory and again on the data it left (a restart), from spawning `python -m epochlog serve` to its
READY line, and the same restart phase by phase (bench/startup_phases.py). Medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.build_ab import export_rev
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


def serve_start(build: Path, config: Path, data_dir: Path) -> tuple[float, float]:
    """(wall, CPU seconds) of member 1 of `config` run from source tree `build`, spawn to READY; then stopped."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "epochlog", "serve", "--config", str(config), "--node-id", "1",
                             "--data-dir", str(data_dir)], cwd=build, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        wall = time.monotonic() - start
        cpu = process_cpu(proc.pid)
        assert line.startswith("READY") and cpu is not None, f"no READY from {build}: {line!r}"
        return wall, cpu
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def start_phases(build: Path, config: Path, data_dir: Path) -> dict[str, list[float]]:
    """bench/startup_phases.py (this tree's) run against build `build`: {phase: [CPU, wall]}."""
    probe = Path(__file__).with_name("startup_phases.py")
    code = f"import runpy; runpy.run_path({str(probe)!r}, run_name='__main__')"
    env = {**os.environ, "EPOCHLOG_SPAWNED_AT": repr(time.time())}
    out = subprocess.run([sys.executable, "-c", code, str(config), "1", str(data_dir)], cwd=build, env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    phases: dict[str, list[float]] = json.loads(out.stdout.strip().splitlines()[-1])
    return phases


PACKAGES = ("epochlog", "eventlog", "statemachines", "compaction", "controller")
PHASES = ("interpreter", "imports", "config and loop", "peer TLS", "views stores (RocksDB)", "rest of the node start",
          "stop")


def compare_builds(builds: dict[str, Path], rounds: int, scratch: Path) -> None:
    """Node starts (fresh and restart) and a restart's phases of each build, in turns; medians."""
    got: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for name in builds}
    for build in builds.values():   # both read their bytecode cache, as the suite's nodes do (tests/conftest.py)
        subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=build, check=True,
                       stdout=subprocess.DEVNULL)
    for r in range(rounds):
        for name, build in (builds.items() if r % 2 == 0 else reversed(builds.items())):
            cluster = NodeCluster(scratch / f"{name}-{r}", size=3)
            cluster.provision_tls(1)
            config = cluster.root / "cluster.toml"
            config.write_text(cluster.config_text())
            data_dir = cluster.nodes[1].data_dir
            runs = got[name]
            runs.setdefault("serve: first start to READY", []).append(serve_start(build, config, data_dir))
            runs.setdefault("serve: restart to READY", []).append(serve_start(build, config, data_dir))
            for phase, (cpu, wall) in start_phases(build, config, data_dir).items():
                runs.setdefault(f"restart phase: {phase}", []).append((wall, cpu))
    names = list(builds)
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {rounds} rounds (wall / CPU s)")
    print(f"{'':<44}" + "".join(f"{n:>22}" for n in names))
    rows = ["serve: first start to READY", "serve: restart to READY", *(f"restart phase: {p}" for p in PHASES)]
    for row in rows:
        cells = []
        for n in names:
            values = got[n].get(row, [])
            cells.append(f"{statistics.median(v[0] for v in values):.3f} / {statistics.median(v[1] for v in values):.3f}"
                         if values else "-")
        print(f"{row:<44}" + "".join(f"{c:>22}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--base", type=Path, help="source tree of another build: compare node starts")
    parser.add_argument("--base-rev", help="git revision of another build (instead of --base)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.base or args.base_rev:
        with tempfile.TemporaryDirectory() as tmp:
            base = args.base or export_rev(args.base_rev, Path(tmp) / "base")
            compare_builds({f"base {args.base_rev or args.base}": base, "this tree": ROOT}, args.rounds,
                           Path(tmp) / "runs")
        return
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
