"""Helpers of the `epochlog up` and config tests: cluster configs on free ports, and the pids `up` recorded.

Ports follow the scheme `epochlog up --nodes` extends (port = base + node id, one base per kind of
address), drawn at random below the kernel's ephemeral range and bind-checked. Node processes are
only ever signalled by the pids `up` recorded in `<data-dir>/up.json`, and only when /proc says they
are still `epochlog serve` processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from epochlog.up import is_node_process, to_toml
from tests.support.ports import is_free, port_range

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("peer_address", "client_address", "admin_address")


def scheme_bases(nodes: int, rng: random.Random) -> dict[str, int]:
    """One base per kind of address such that base + 1 .. base + nodes are all free (and distinct)."""
    bases: dict[str, int] = {}
    taken: set[int] = set()
    lo, hi = port_range()
    for kind in KINDS:
        for _ in range(500):
            base = rng.randrange(lo, hi - nodes - 1)   # base + 1 .. base + nodes stay in this process's range
            ports = set(range(base + 1, base + nodes + 1))
            if not ports & taken and all(is_free(p) for p in ports):
                bases[kind] = base
                taken |= ports
                break
        else:
            raise RuntimeError(f"no free ports for {kind}")
    return bases


def cluster_document(nodes: int, rng: random.Random, *, name: str = "test", room: int = 0) -> dict[str, Any]:
    """A small cluster config: 3 groups, 1 MiB segments (no GBs of preallocation), small caches; secured
    as configs/local-3.toml is (TLS and enforcement by default, `admin` the super user whose certificate
    `up` makes). `room`: the port scheme leaves free, distinct ports for that many nodes (when a test
    has `up` extend the scheme past `nodes`)."""
    bases = scheme_bases(max(nodes, room), rng)
    members = [{"id": i, **{k: f"127.0.0.1:{bases[k] + i}" for k in KINDS}} for i in range(1, nodes + 1)]
    return {
        "cluster": {"name": name, "groups": ["metadata", "offsets", "kv"], "tick_interval_ms": 50,
                    "members": members},
        "log": {"segment_bytes": 1 << 20},
        "views": {"block_cache_bytes": 8 << 20, "write_buffer_bytes": 4 << 20},
        "clients": {"access": {"super_users": ["admin"]}},
    }


def write_config(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(to_toml(document))
    return path


def epochlog_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "epochlog", *args]


def run_epochlog(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(epochlog_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def recorded_nodes(data_dir: Path) -> dict[int, dict[str, Any]]:
    """What `up` recorded about each node (pid, running, exit_code, ...); {} before it wrote anything."""
    try:
        record = json.loads((data_dir / "up.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {int(k): v for k, v in record["nodes"].items()}


def live_node_pids(data_dir: Path) -> list[int]:
    return [n["pid"] for n in recorded_nodes(data_dir).values() if n.get("pid") and is_node_process(n["pid"])]


def kill_leftovers(data_dir: Path) -> list[int]:
    """SIGKILL every node `up` recorded that still runs (test teardown); the pids killed."""
    pids = live_node_pids(data_dir)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
