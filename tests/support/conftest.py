"""Fixtures of the harness's own real-process tests: a printed seed and a factory of NodeClusters."""

from __future__ import annotations

from tests.support.fixtures import node_cluster_factory, seed  # noqa: F401 - fixtures of this folder
