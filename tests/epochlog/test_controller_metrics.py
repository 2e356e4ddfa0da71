"""The controller on /metrics: which node runs it, its brokers by state and its counters, read from a real
3-node cluster after brokers registered and heartbeated through the controller's client."""

from __future__ import annotations

import asyncio
import time
import uuid

from epochlog.api import messages as p
from epochlog.client import AsyncClient
from epochlog.client.broker import DEFAULT_CLUSTER, ControllerClient
from statemachines.brokers import new_incarnation
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until


def test_the_active_controller_shows_its_brokers_and_counters(shared_cluster: NodeCluster) -> None:
    group = f"mg-{uuid.uuid4().hex[:6]}"

    async def register() -> None:
        async with AsyncClient(shared_cluster.endpoints) as client:
            registered = await ControllerClient(client).register([
                p.BrokerIdentity(DEFAULT_CLUSTER, group, name, f"10.0.0.{i}:10911", new_incarnation(time.time_ns()))
                for i, name in enumerate(("m-0", "m-1"), 1)])
            assert all(r.code == "" for r in registered.results), registered
    asyncio.run(register())

    def scraped() -> tuple[int, dict] | None:   # type: ignore[type-arg]
        for node in shared_cluster.nodes:
            m = shared_cluster.wait_metrics(node)
            if m.get(("epochlog_controller_active", ())) == 1 and m.get(
                    ("epochlog_controller_brokers", (("state", "active"),)), 0) >= 2:
                return node, m
        return None
    node, m = wait_until(scraped, 30, "the active controller to show the registered brokers")
    assert node == shared_cluster.leader("metadata")
    assert m[("epochlog_controller_brokers", (("state", "fenced"),))] == 0
    groups = sum(m.get(("epochlog_controller_broker_groups", (("master", x),)), 0) for x in ("yes", "no"))
    assert groups >= 1
    assert m[("epochlog_controller_activations_total", ())] >= 1
    for other in set(shared_cluster.nodes) - {node}:
        assert shared_cluster.wait_metrics(other).get(("epochlog_controller_active", ())) == 0
