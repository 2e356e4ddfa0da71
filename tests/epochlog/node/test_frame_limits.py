"""The native server's limits on partly received frames, connections and requests in flight,
against a real `epochlog serve` process.

Issue 11: 32 connections each holding 15 MiB of an unfinished frame took a node from 0.5 to 1 GB,
and they could stay forever. Now the bytes held for unfinished frames, summed over every
connection, stay within `[clients] partial_frames_bytes` (a connection that would go past it is
closed with `connection_limit`), and a frame (or the hello) that does not arrive in full within
`frame_timeout_ms` closes its connection. The memory itself is measured by bench/frame_memory.py
(bench/RESULTS.md), not here.

Issue 18: idle connections were not capped, and one frame of 100,000 requests ran at once. Now past
`max_connections` a connection gets `connection_limit` and is closed, and a connection runs at most
`max_in_flight_requests` requests at once, the rest of its frame waiting its turn (the loop and the
heartbeats under such a frame: tests/epochlog/node/test_loop_bounds.py). A write of 100,000 events took
0.5 s of the loop to be refused (too large for a batch); it is now refused as soon as its events
pass the batch limit.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable

import msgspec
import pytest

from epochlog.api.frames import MAX_FRAME_BYTES
from epochlog.client import Client, ClientError
from epochlog.client.connection import Connection
from tests.support.nodes import NodeCluster
from tests.epochlog.node.raw import RawConnection

BUDGET = MAX_FRAME_BYTES + 4          # the smallest budget allowed: one frame of the maximum size
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
    # Past the budget after ~4 of its 12 MiB: the rest, sent on after the node closed it, is read and dropped
    # (a reset would lose the reply, and fail this send).
    third = _partial(address, 12 << 20)
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
                                  "padding": b"\x00" * (MAX_FRAME_BYTES - 200)})
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


def test_connections_past_the_cap_are_refused_and_a_frame_runs_a_bounded_number_of_requests_at_once(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cap, in_flight, deadline_ms = 3, 4, 1_000
    cluster = node_cluster_factory(size=1, clients={"max_connections": cap, "max_in_flight_requests": in_flight})
    cluster.start()
    address = cluster.endpoint(1)
    open_ = [RawConnection(address, timeout=10) for _ in range(cap)]
    for conn in open_:
        conn.hello()
    extra = RawConnection(address, timeout=10)
    extra.send({"type": "client_hello", "version": 1, "client": "one-too-many"})
    message = _limit_reply(extra)
    assert "max_connections = 3" in message

    async def sdk_connect() -> None:
        await Connection(address).connect(5.0)
    with pytest.raises(ClientError) as refused:      # the SDK says why, and that another try may do
        asyncio.run(sdk_connect())
    assert refused.value.code == "connection_limit" and refused.value.retriable
    assert "max_connections" in str(refused.value)

    # Ten reads that can only time out (an offset the group will not reach), then a ping: at most
    # `in_flight` run at once, so they time out in waves of 4, 4 and 2, and the ping, behind them in
    # the frame, starts with the last wave.
    conn = open_[0]
    get = {"type": "get", "key": "kv/limits/x", "consistency": "local", "min_offset": 10**12}
    sent = time.monotonic()
    conn.send({"type": "requests", "requests": [[i, get, deadline_ms] for i in range(1, 11)]
               + [[99, {"type": "ping"}, 5_000]]})
    at: dict[int, float] = {}
    while len(at) < 11:
        frame = conn.frame()
        assert frame is not None, f"closed with {sorted(at)} answered"
        for reply in frame["replies"]:
            at[reply[0]] = time.monotonic() - sent
            if reply[0] != 99:
                assert reply[2][0] == "deadline_exceeded", reply
    waves = sorted(v for k, v in at.items() if k != 99)
    # The node's loop (uvloop) keeps time in whole milliseconds and its timers can fire up to a millisecond
    # before the delay has passed (libuv/libuv#4773, MagicStack/uvloop#755): once per wave, by this clock.
    second, slack = deadline_ms / 1000, 0.005
    assert all(t >= second - slack for t in waves[:4]), waves
    assert all(t >= 2 * (second - slack) for t in waves[4:8]), waves
    assert all(t >= 3 * (second - slack) for t in waves[8:]), waves
    assert at[99] >= 2 * (second - slack), f"the ping ran before the requests ahead of it started: {at}"

    # A write of 100,000 events is refused once its events pass the batch limit: the node checks
    # about what fits in a batch, not all of them.
    events = [{"type": "KvPut", "name": f"limits/{i}", "value": b"x"} for i in range(100_000)]
    reply = conn.call(7, {"type": "write", "events": events}, timeout_ms=60_000)
    assert reply[2][0] == "batch_too_large", reply[2]
    checked = int(reply[2][1].split("from event ")[1].split()[0])
    assert checked < 20_000, reply[2][1]
    for c in open_:
        c.close()
