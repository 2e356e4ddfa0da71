"""Deadlines on the native protocol: a request's timeout_ms is honoured by the node.

One in-process node (RunningNode, as `epochlog serve` runs it) on free 127.0.0.1 ports; the client
is a raw Connection so the request's own timeout is what the server sees.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from eventlog.raft.runtime.config import load_node_configs
from epochlog import protocol as p
from epochlog.client.connection import Connection
from epochlog.client.errors import ClientError, DeadlineExceededError
from epochlog.serve import RunningNode
from tests.support.ports import free_ports
from tests.support.tls import provision


def _config(root: Path) -> Path:
    peer, client = free_ports(2, random.Random())
    path = root / "one.toml"
    path.write_text(f'[cluster]\nname = "deadlines"\ngroups = ["metadata", "offsets", "kv"]\ntick_interval_ms = 20\n'
                    f'[[cluster.members]]\nid = 1\npeer_address = "127.0.0.1:{peer}"\n'
                    f'client_address = "127.0.0.1:{client}"\n[log]\nsegment_bytes = 1048576\n')
    provision(root / "ca", "deadlines", {1: root / "n1"})
    return path


def test_a_read_waiting_past_its_deadline_answers_deadline_exceeded(tmp_path: Path) -> None:
    async def main() -> None:
        configs = load_node_configs(_config(tmp_path))
        running = await RunningNode.start(configs, 1, tmp_path / "n1")
        conn = Connection(running.addresses["client"])
        try:
            await conn.connect(5)
            deadline = time.monotonic() + 10
            while True:   # until the single node leads its groups
                try:
                    await conn.call(p.Get("kv/x", "linearizable"), 2)
                    break
                except ClientError:
                    assert time.monotonic() < deadline, "no leader"
                    await asyncio.sleep(0.05)
            # A local read waiting for an offset that will never be applied: the server must give
            # up at the request's deadline (0.3 s), not at its 10 s default.
            rid, reply = conn._send(p.Get("kv/x", "local", min_offset=10**9), 0.3)
            started = time.monotonic()
            answer = await asyncio.wait_for(reply, 5)
            elapsed = time.monotonic() - started
            assert answer.error is not None and answer.error.code == "deadline_exceeded", answer
            assert answer.error.retriable
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
