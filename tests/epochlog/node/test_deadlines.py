"""Deadlines on the native protocol: a request's timeout_ms is honoured by the node.

One in-process node (RunningNode, as `epochlog serve` runs it) on free 127.0.0.1 ports; the client
is a raw Connection so the request's own timeout is what the server sees.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from eventlog.raft.runtime.config import NodeConfigs, load_node_configs
from epochlog.api import messages as p
from epochlog.client.connection import Connection
from epochlog.client.errors import ClientError, DeadlineExceededError
from epochlog.serve import RunningNode
from tests.support.nodes import NodeCluster
from tests.support.wait import eventually


def _config(root: Path) -> tuple[NodeConfigs, Path]:
    """One member's config and data directory (a NodeCluster's, never started as a process)."""
    cluster = NodeCluster(root, size=1, name="deadlines", tick_interval_ms=20)
    cluster.provision_tls(1)
    return load_node_configs(cluster.config_path), cluster.nodes[1].data_dir


def test_a_read_waiting_past_its_deadline_answers_deadline_exceeded(tmp_path: Path) -> None:
    async def main() -> None:
        configs, data_dir = _config(tmp_path)
        running = await RunningNode.start(configs, 1, data_dir)
        conn = Connection(running.addresses["client"])
        try:
            await conn.connect(5)

            async def serves_linearizable_reads() -> bool:
                try:
                    await conn.call(p.Get("kv/x", "linearizable"), 2)
                except ClientError:
                    return False
                return True
            await eventually(serves_linearizable_reads, 10, "the single node to lead its groups")
            # A local read waiting for an offset that will never be applied: the server must give
            # up at the request's deadline (0.3 s), not at its 10 s default.
            sent = conn.send(p.Get("kv/x", "local", min_offset=10**9), 0.3)
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError) as answered:
                await conn.wait(sent, 5)
            elapsed = time.monotonic() - started
            assert answered.value.retriable
            assert 0.25 <= elapsed < 2.0, elapsed
            # The connection and the node still serve.
            with pytest.raises(DeadlineExceededError):
                await conn.call(p.Get("kv/x", "local", min_offset=10**9), 0.2)
            got = await conn.call(p.Get("kv/x", "linearizable"), 2)
            assert isinstance(got, p.Got) and got.item is None
        finally:
            await conn.close()
            await running.stop()

    asyncio.run(main())
