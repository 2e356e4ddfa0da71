"""Fixtures of the end-to-end node tests: a seed, a factory of clusters, and one shared started cluster.

Every cluster is closed in teardown (its processes killed by pid), whatever the test did.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.nodes import NodeCluster

SEED_ENV = "EPOCHLOG_NODE_SEED"


def _seed(name: str) -> int:
    env = os.environ.get(SEED_ENV)
    value = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"{name}: seed={value} (replay with {SEED_ENV}={value}; real time makes a replay likely, not "
          f"certain, to hit the same interleaving)")
    return value


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The test's seed (printed): election timeouts of its nodes and its workload's choices."""
    return _seed(request.node.name)


@pytest.fixture
def node_cluster_factory(tmp_path: Path, seed: int) -> Iterator[Callable[..., NodeCluster]]:
    """`make(**kwargs)` builds a NodeCluster (not started) under the test's tmp dir; on teardown every
    one is killed and described (stderr tails show up in the report of a failed test)."""
    made: list[NodeCluster] = []

    def make(**kwargs: object) -> NodeCluster:
        cluster = NodeCluster(tmp_path / f"cluster-{len(made)}", seed=seed + len(made), **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
        print(cluster.describe())


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    """One started 3-node cluster for the tests of a module that do not kill nodes (tests must not
    assume an empty cluster: they use keys of their own)."""
    cluster = NodeCluster(tmp_path_factory.mktemp("cluster"), seed=_seed(request.module.__name__))
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            print(f"exit codes after SIGTERM: {cluster.stop_all()}")
        finally:
            cluster.close()
            print(cluster.describe())
