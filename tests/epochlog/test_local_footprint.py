"""A local cluster fits a laptop: configs/local-3.toml as `epochlog up` runs it (its [log] and [views]
sections as shipped, only the addresses moved to free ports) takes well under 200 MB of disk idle,
while configs/production.example.toml keeps production-sized segments."""

from __future__ import annotations

import random
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.epochlog.local_cluster import (ROOT, KINDS, kill_leftovers, run_epochlog, scheme_bases,
                                          write_config)

LAPTOP_BYTES = 200 << 20


def disk_bytes(root: Path) -> int:
    """Bytes the files below `root` occupy on disk (allocated blocks: preallocated segments count)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    assert not kill_leftovers(path), "node processes outlived `epochlog up`"


def test_an_idle_local_3_cluster_takes_under_200_mb(tmp_path: Path, data_dir: Path) -> None:
    document = tomllib.loads((ROOT / "configs" / "local-3.toml").read_text())
    members = document["cluster"]["members"]
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    bases = scheme_bases(len(members), random.Random(seed))
    for m in members:
        m.update({k: f"127.0.0.1:{bases[k] + m['id']}" for k in KINDS})
        m.pop("kafka_address", None)   # ports of its own; the Kafka face keeps nothing on disk
    config = write_config(tmp_path / "local-3.toml", document)
    done = run_epochlog("up", "--config", str(config), "--data-dir", str(data_dir), "--seconds", "5", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    used = disk_bytes(data_dir)
    print(f"an idle 3-node cluster of configs/local-3.toml: {used / 2**20:.1f} MiB on disk")
    assert used < LAPTOP_BYTES, f"{used / 2**20:.1f} MiB"
    production = tomllib.loads((ROOT / "configs" / "production.example.toml").read_text())
    assert production["log"]["segment_bytes"] >= 64 << 20 > document["log"]["segment_bytes"]
