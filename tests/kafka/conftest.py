"""Fixtures of the Kafka face tests: a seed and started clusters of real `epochlog serve` processes
with a `kafka_address` each (killed by pid in teardown)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kafka.cluster import KafkaCluster
from tests.epochlog.node.conftest import _seed, seed  # noqa: F401 - the seed fixture, printed per test


@pytest.fixture
def kafka_cluster_factory(tmp_path: Path, seed: int) -> Iterator[Callable[..., KafkaCluster]]:  # noqa: F811
    made: list[KafkaCluster] = []

    def make(**kwargs: object) -> KafkaCluster:
        cluster = KafkaCluster(tmp_path / f"cluster-{len(made)}", seed=seed + len(made), **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
        print(cluster.describe())


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """One started 3-node cluster shared by a module's tests that kill no node."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka"), seed=_seed(request.module.__name__))
    try:
        cluster.start()
        for group in cluster.groups:
            cluster.leader(group)
        yield cluster
    finally:
        try:
            cluster.stop_all()
        finally:
            cluster.close()
            print(cluster.describe())
