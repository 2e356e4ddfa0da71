"""Fixtures of the Raft runtime's real-process tests: a printed seed and a factory of NodeClusters
(`epochlog serve` processes) that always cleans up."""

from __future__ import annotations

from tests.support.fixtures import node_cluster_factory, seed  # noqa: F401 - fixtures of this folder
