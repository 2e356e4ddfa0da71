"""Fixtures of the end-to-end tests of the node, its faces, the SDK and the CLI: a seed, a factory of
clusters, and one shared started cluster."""

from __future__ import annotations

from tests.support.fixtures import node_cluster_factory, seed, shared_cluster  # noqa: F401 - fixtures
