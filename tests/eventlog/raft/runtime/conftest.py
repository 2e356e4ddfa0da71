"""Fixtures of the real-process runtime tests: a seed and a cluster factory that always cleans up."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.eventlog.raft.runtime.cluster import Cluster

SEED_ENV = "EPOCHLOG_RUNTIME_SEED"


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The test's seed (printed; replay with EPOCHLOG_RUNTIME_SEED=<seed>)."""
    env = os.environ.get(SEED_ENV)
    value = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"{request.node.name}: seed={value} (replay with {SEED_ENV}={value}; real time makes a replay "
          f"likely, not certain, to hit the same interleaving)")
    return value


@pytest.fixture
def cluster_factory(tmp_path: Path, seed: int) -> Iterator[Callable[..., Cluster]]:
    """`make(**kwargs)` builds a Cluster under the test's tmp dir; every one is closed in teardown
    (its processes killed by pid, its proxies stopped), whatever the test did."""
    made: list[Cluster] = []

    def make(**kwargs: object) -> Cluster:
        root = tmp_path / f"cluster-{len(made)}"
        cluster = Cluster(root, seed=seed + len(made), **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        print(f"cluster dir {cluster.root}")
        return cluster

    yield make
    for cluster in made:
        cluster.close()
