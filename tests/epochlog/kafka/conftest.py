"""Fixtures of the Kafka face tests: clusters of real `epochlog serve` processes with a `kafka_address`
each (killed by pid in teardown); the seed and node_cluster_factory come from tests/epochlog/conftest.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import NodeCluster


@pytest.fixture
def kafka_cluster_factory(node_cluster_factory: Callable[..., NodeCluster]) -> Callable[..., NodeCluster]:
    """`make(**kwargs)`: a NodeCluster whose members also serve the Kafka protocol (not started)."""
    return lambda **kwargs: node_cluster_factory(kafka=True, **kwargs)


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    """One started 3-node cluster with Kafka addresses, shared by a module's tests that kill no node."""
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("kafka"), kafka=True)
