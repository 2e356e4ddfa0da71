"""Fixtures of the real-process tests: a printed seed, a factory of NodeClusters and one shared started
cluster per module. A conftest imports the ones its folder uses (`from tests.support.fixtures import ...`).

Every cluster is closed in teardown (its processes killed by pid) and described (the stderr tails show
up in the report of a failed test), whatever the test did.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.nodes import NodeCluster

SEED_ENV = "EPOCHLOG_NODE_SEED"


def seed_for(name: str) -> int:
    """A seed for `name` (printed): EPOCHLOG_NODE_SEED when set, else a fresh one."""
    env = os.environ.get(SEED_ENV)
    value = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"{name}: seed={value} (replay with {SEED_ENV}={value}; real time makes a replay likely, not "
          f"certain, to hit the same interleaving)")
    return value


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The test's seed (printed): election timeouts of its nodes and its workload's choices."""
    return seed_for(request.node.name)


@pytest.fixture
def node_cluster_factory(tmp_path: Path, seed: int) -> Iterator[Callable[..., NodeCluster]]:
    """`make(**kwargs)` builds a NodeCluster (not started) under the test's tmp dir; on teardown every
    one is killed and described."""
    made: list[NodeCluster] = []

    def make(**kwargs: object) -> NodeCluster:
        cluster = NodeCluster(tmp_path / f"cluster-{len(made)}", seed=seed + len(made), **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
        print(cluster.describe())


def shared_cluster_of(request: pytest.FixtureRequest, root: Path, **kwargs: object) -> Iterator[NodeCluster]:
    """A started cluster for the tests of one module, with a leader in every group; stopped with
    SIGTERM (exit codes printed) and closed after them. Tests sharing it use keys of their own."""
    cluster = NodeCluster(root, seed=seed_for(request.module.__name__), **kwargs)  # type: ignore[arg-type]
    try:
        cluster.start()
        for group in cluster.groups:
            cluster.leader(group)
        yield cluster
    finally:
        try:
            print(f"exit codes after SIGTERM: {cluster.stop_all()}")
        finally:
            cluster.close()
            print(cluster.describe())


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    """One started 3-node cluster for the tests of a module that do not kill nodes."""
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("cluster"))
