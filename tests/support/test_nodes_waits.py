"""NodeCluster's waits for a node's answer: a node that misses one status call's deadline (paused here, as a
loaded machine or a long catch-up can hold it) is asked again until it answers, and one that never answers
fails the wait with its stderr tail."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.support.nodes import NodeCluster

pytestmark = pytest.mark.timeout(90)

G = "kv"


def test_a_node_that_misses_one_deadline_is_asked_again(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=1)
    cluster.start()
    cluster.wait_leader(G)
    cluster.pause(1)
    try:
        assert cluster.group_status(1, G) is None, "a stopped process answered its status"
        assert cluster.metrics(1) == {}, "a stopped process answered /metrics"
        threading.Timer(1.0, cluster.resume, (1,)).start()   # each call above waited out its 2 s deadline
        state = cluster.wait_group_status(1, G)
        assert state.group == G and state.role == "leader", state
        assert cluster.wait_metrics(1), "no /metrics after the resume"
    finally:
        cluster.resume(1)


def test_a_node_that_never_answers_fails_the_wait_with_its_stderr(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=1)
    cluster.start()
    cluster.wait_leader(G)
    cluster.pause(1)
    try:
        with pytest.raises(AssertionError, match=r"node 1 to answer with its status of kv(.|\n)*its stderr ends"):
            cluster.wait_group_status(1, G, timeout=1.0)
        with pytest.raises(AssertionError, match=r"node 1 to answer with its /metrics(.|\n)*its stderr ends"):
            cluster.wait_metrics(1, timeout=1.0)
    finally:
        cluster.resume(1)
