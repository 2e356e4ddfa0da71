"""The native server's limits on partly received frames, against a real `epochlog serve` process.

Issue 11: 32 connections each holding 15 MiB of an unfinished frame took a node from 0.5 to 1 GB,
and they could stay forever. Now the bytes held for unfinished frames, summed over every
connection, stay within `[clients] partial_frames_bytes` (a connection that would go past it is
closed with `connection_limit`), and a frame (or the hello) that does not arrive in full within
`frame_timeout_ms` closes its connection. The memory itself is measured by bench/frame_memory.py
(bench/RESULTS.md), not here.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import msgspec

from epochlog import protocol as p
from epochlog.client import Client
from tests.node.cluster import NodeCluster
from tests.node.raw import RawConnection

BUDGET = p.MAX_FRAME_BYTES + 4          # the smallest budget allowed: one frame of the maximum size
TIMEOUT_MS = 2_000
CHUNK = 6 << 20


def _partial(address: str, sent: int, declared: int = 15 << 20) -> RawConnection:
    """A greeted connection that sent `sent` bytes of a frame of `declared` bytes."""
    conn = RawConnection(address, timeout=10)
    conn.hello()
    conn.send_bytes(struct.pack(">I", declared) + b"\x00" * sent)
    return conn


def _limit_reply(conn: RawConnection) -> str:
    """The message of the connection_limit reply (id 0) the server sent before closing."""
    frame = conn.frame()
    assert frame is not None, "closed without a reply"
    (reply,) = frame["replies"]
    assert reply[0] == 0 and reply[2][0] == "connection_limit" and reply[2][2] is True, reply
    assert conn.closed(), "the connection stays open"
    return str(reply[2][1])


def test_partial_frames_stay_within_the_node_budget_and_stalled_frames_are_closed(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=1, clients={"partial_frames_bytes": BUDGET, "frame_timeout_ms": TIMEOUT_MS})
    cluster.start()
    address = cluster.endpoint(1)
    with Client([address], timeout=15) as client:
        client.put("limits/before", b"1")

    started = time.monotonic()
    first, second = _partial(address, CHUNK), _partial(address, CHUNK)
    third = _partial(address, CHUNK)                      # 18 MiB held in all: past the budget
    message = _limit_reply(third)
    assert "partial_frames_bytes" in message and str(BUDGET) in message
    # Small frames complete at once and hold nothing: other clients are served meanwhile.
    with Client([address], timeout=15) as client:
        assert client.put("limits/during", b"2").ok
    silent = RawConnection(address, timeout=10)           # connects and never says hello

    # Stalled: the frames never complete, the hello never comes; each closes after frame_timeout_ms.
    for conn in (first, second):
        assert "did not arrive in full within frame_timeout_ms" in _limit_reply(conn)
    assert "its hello did not arrive" in _limit_reply(silent)
    assert time.monotonic() - started < TIMEOUT_MS / 1000 + 5

    # The budget was given back: a frame as large as the limit allows goes through, in pieces.
    big = msgspec.msgpack.encode({"type": "requests", "requests": [[1, {"type": "status"}, 5000]],
                                  "padding": b"\x00" * (p.MAX_FRAME_BYTES - 200)})
    conn = RawConnection(address, timeout=20)
    conn.hello()
    data = struct.pack(">I", len(big)) + big
    for i in range(0, len(data), 1 << 20):
        conn.send_bytes(data[i:i + (1 << 20)])
    frame = conn.frame()
    assert frame is not None and frame["replies"][0][0] == 1 and frame["replies"][0][1]["type"] == "status_info"
    conn.close()
    assert cluster.nodes[1].running
    assert "closing client connection" in cluster.nodes[1].stderr()   # the reason is logged
