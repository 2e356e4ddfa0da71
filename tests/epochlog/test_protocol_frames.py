"""Frames of the client protocol: the sans-IO decoder and encoder, the server's reply merging, and
what a real node does with hellos, bad frames, oversized messages and early cancels over a socket.

The socket tests speak the protocol with a few lines of asyncio streams and `FrameDecoder`, not
with the SDK, so they check the wire behaviour docs/protocol.md promises.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from epochlog.api import messages as p
from epochlog.api.frames import (MAX_FRAME_BYTES, BadRequest, ClientFrame, FrameDecoder, FrameError, ServerFrame,
                                 encode_frame, encode_frames, problem, salvage_requests)
from epochlog.client import AsyncClient
from epochlog.client.errors import ClientError
from epochlog.errors import InvalidArgumentError
from epochlog.serve import RunningNode
from epochlog.server import _merge_watch_events, _oversize_reply
from statemachines import events as ev
from tests.epochlog.test_admin import admin_cluster, in_process

# --- FrameDecoder ------------------------------------------------------------------------------------

def _client_stream() -> tuple[bytes, list[Any]]:
    frames: list[Any] = [
        p.ClientHello(1, "test"),
        p.Requests([p.Request(1, p.Status())]),
        p.Requests([p.Request(2, p.Write([ev.KvPut(name="a/b", value=bytes(range(256)), request_id="r1")]), 500),
                    p.Request(3, p.Get("kv/a/b", "local", 7), 0)]),
        p.Requests([p.Request(4, p.Watch("kv/", window=3))]),
        p.Requests([p.Request(5, p.CancelWatch(4))]),
    ]
    return b"".join(encode_frame(f) for f in frames), frames


def test_decoder_splits_frames_at_every_byte_boundary() -> None:
    stream, expected = _client_stream()
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder(ClientFrame)
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert got == expected, f"split at byte {cut}"
    decoder = FrameDecoder(ClientFrame)
    got = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert got == expected
    assert decoder.feed(b"") == []


def test_decoder_refuses_an_oversized_length_before_its_payload() -> None:
    decoder = FrameDecoder(ClientFrame)
    with pytest.raises(FrameError, match="exceeds the limit"):
        decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1))
    at_limit = FrameDecoder(ClientFrame)
    assert at_limit.feed(struct.pack(">I", MAX_FRAME_BYTES) + b"\x80" * 100) == []   # waits for the rest
    small = FrameDecoder(ClientFrame, max_frame_bytes=16)
    frame = encode_frame(p.ClientHello(1, "a name longer than sixteen bytes"))
    with pytest.raises(FrameError):
        small.feed(frame[:4])


@pytest.mark.parametrize("payload", [
    b"\xc1",                                                    # never valid msgpack
    b"\x82\xa4type",                                            # truncated map
    encode_frame(p.ClientHello(1))[4:] + b"\x00",             # trailing bytes
    encode_frame(p.ServerHello(1, "c", 1))[4:],               # a server frame to the server
    b"\x81\xa4type\xa4nope",                                    # unknown tag
    b"\x82\xa4type\xacclient_hello\xa7version\xa11",            # version as str
    b"\x82\xa4type\xa8requests\xa8requests\x91\x92\x01\x81\xa4type\xa4nope",   # unknown call
    bytes(random.Random(7).randbytes(64)),                      # noise
], ids=["c1", "truncated", "trailing", "server-frame", "unknown-tag", "wrong-type", "unknown-call", "noise"])
def test_decoder_refuses_garbage(payload: bytes) -> None:
    decoder = FrameDecoder(ClientFrame)
    with pytest.raises(FrameError):
        decoder.feed(struct.pack(">I", len(payload)) + payload)


def test_decoder_accepts_missing_defaults_unknown_keys_and_extra_elements() -> None:
    import msgspec

    raw = {"requests": [[9, {"zz": 1, "type": "get", "key": "kv/x"}], [10, {"type": "status"}, 0, "future"]],
           "type": "requests", "future": True}
    payload = msgspec.msgpack.encode(raw)
    (frame,) = FrameDecoder(ClientFrame).feed(struct.pack(">I", len(payload)) + payload)
    assert frame == p.Requests([p.Request(9, p.Get("kv/x")), p.Request(10, p.Status())])


def _framed(raw: Any) -> bytes:
    import msgspec

    payload = raw if isinstance(raw, bytes) else msgspec.msgpack.encode(raw)
    return struct.pack(">I", len(payload)) + payload


def test_a_request_that_does_not_decode_is_answered_alone_naming_field_range_and_value() -> None:
    """Issue 11: ranges are part of the types; one bad request does not take its frame down."""
    decoder = FrameDecoder(ClientFrame, salvage=salvage_requests)
    frames = decoder.feed(_framed({"type": "requests", "requests": [
        [1, {"type": "get", "key": "kv/a", "as_of": -5}, 0],
        [2, {"type": "status"}, -3],
        [3, {"type": "list", "prefix": "kv/", "limit": -1}, 0],
        [4, {"type": "status"}, 0],
        [5, {"type": "write", "events": [{"type": "QuotaChanged", "name": "x"}]}, 0],
        [6, {"type": "history", "key": "kv/a", "after_offset": 2**63 - 1}, 0],
        [7, {"type": "nope"}, 0],
        [8, {"type": "watch_ack", "watch_id": 1, "events": -2}, 0],
        [9, {"type": "read_events", "group": "kv", "from_offset": -1}, 0],
        [10, {"type": "write", "events": []}, 0],
    ]}))
    assert frames[0] == p.Requests([p.Request(4, p.Status())])
    problems = {f.id: f.problem for f in frames[1:]}
    assert problems == {
        1: "get.as_of: expected `int` >= 0, got -5",
        2: "timeout_ms: expected `int` >= 0, got -3",
        3: "list.limit: expected `int` >= 1, got -1",
        5: "write.events[0].type: unknown type 'QuotaChanged'",
        6: f"history.after_offset: expected `int` <= {2**63 - 2}, got {2**63 - 1}",
        7: "call.type: unknown type 'nope'",
        8: "watch_ack.events: expected `int` >= 0, got -2",
        9: "read_events.from_offset: expected `int` >= 0, got -1",
        10: "write.events: expected `array` of length >= 1",
    }
    assert problem(p.Get("kv/a", as_of=-5)) == "get.as_of: expected `int` >= 0, got -5"
    assert problem(p.List(prefix="kv/", limit=20_000)) == "list.limit: expected `int` <= 10000, got 20000"
    assert problem(p.Get("kv/a", min_offset=-1)) is None


@pytest.mark.parametrize(("payload", "message"), [
    (b"\x83\xa4type\xacclient_hello\xa7version\x01\xa1x" + b"\x91" * 200_000 + b"\x00", "nested too deeply"),
    (b"\x91" * 200_000 + b"\x00", "malformed frame"),
    (b"\x82\xa4type\xa8requests\xa8requests\x91\x93\x01" + b"\x91" * 200_000 + b"\x00\x00",
     "malformed frame"),
    (b"\x82\xa4type\xa8requests\xa8requests\x91\x93\xa1x\x81\xa4type\xa6status\x00", "without a readable id"),
    (b"\x82\xa4type\xa8re\xffuests\xa8requests\x90", "not UTF-8"),
], ids=["deep-unknown-key", "deep-frame", "deep-request", "no-id", "not-utf8"])
def test_a_frame_with_no_answerable_request_is_a_frame_error_never_another_exception(payload: bytes,
                                                                                    message: str) -> None:
    decoder = FrameDecoder(ClientFrame, salvage=salvage_requests)
    with pytest.raises(FrameError, match=message):
        decoder.feed(_framed(payload))


def test_a_request_whose_strings_are_not_utf8_is_answered_with_its_id() -> None:
    import msgspec

    good = msgspec.msgpack.encode({"type": "requests", "requests": [[7, {"type": "get", "key": "kv/aa"}, 0]]})
    bad = good.replace(b"kv/aa", b"kv/\xff\xfe")
    (frame,) = FrameDecoder(ClientFrame, salvage=salvage_requests).feed(_framed(bad))
    assert frame == BadRequest(7, frame.problem) and "not UTF-8" in frame.problem


def test_pending_bytes_count_the_frame_being_received_and_are_given_back() -> None:
    decoder = FrameDecoder(ClientFrame)
    frame = encode_frame(p.Requests([p.Request(1, p.Write([ev.KvPut(name="a", value=b"x" * 300_000)]))]))
    assert decoder.feed(frame[:200_000]) == [] and decoder.pending_bytes == 200_000
    assert len(decoder.feed(frame[200_000:] + frame[:10])) == 1 and decoder.pending_bytes == 10


# --- encode_frames -----------------------------------------------------------------------------------

def test_encode_frames_splits_within_the_limit_and_keeps_order() -> None:
    requests = [p.Request(i, p.Get(f"kv/{'x' * (i * 7 % 300)}")) for i in range(1, 200)]
    (whole,) = encode_frames(requests, p.Requests)
    limit = len(whole) // 5
    frames = encode_frames(requests, p.Requests, max_frame_bytes=limit)
    assert len(frames) >= 5
    assert all(len(f) - 4 <= limit for f in frames)
    decoder = FrameDecoder(ClientFrame)
    decoded = [r for frame in decoder.feed(b"".join(frames)) for r in frame.requests]
    assert decoded == requests


def test_encode_frames_hands_an_item_too_large_alone_to_oversize() -> None:
    big = p.Request(2, p.Write([ev.KvPut(name="big", value=b"v" * 5000)]))
    small = [p.Request(1, p.Status()), p.Request(3, p.Status())]
    with pytest.raises(FrameError):
        encode_frames([small[0], big, small[1]], p.Requests, max_frame_bytes=1000)
    seen: list[tuple[int, int]] = []

    def oversize(item: p.Request, size: int) -> list[p.Request]:
        seen.append((item.id, size))
        return []

    frames = encode_frames([small[0], big, small[1]], p.Requests, oversize=oversize, max_frame_bytes=1000)
    decoded = [r for f in FrameDecoder(ClientFrame).feed(b"".join(frames)) for r in f.requests]
    assert decoded == small and seen[0][0] == 2 and seen[0][1] > 5000


# --- reply merging (server) --------------------------------------------------------------------------

def _rec(offset: int) -> p.EventRecord:
    return p.EventRecord(offset, f"kv/k{offset}", None, 1000 + offset)


def _events(watch: int, *offsets: int) -> p.Reply:
    return p.Reply(watch, p.WatchEvents(watch, [_rec(o) for o in offsets]))


def test_merge_watch_events_one_reply_per_watch_at_the_first_place() -> None:
    done = p.Reply(3, p.Done())
    started = p.Reply(9, p.WatchStarted(9, "kv", 5))
    end = p.Reply(7, error=p.WireError("cancelled", "x"))
    replies = [started, _events(7, 1), done, _events(9, 5), _events(7, 2), _events(7, 4), _events(9, 6), end]
    merged = _merge_watch_events(replies)
    assert [(r.id, type(r.result).__name__ if r.result else r.error.code) for r in merged] == [  # type: ignore[union-attr]
        (9, "WatchStarted"), (7, "WatchEvents"), (3, "Done"), (9, "WatchEvents"), (7, "cancelled")]
    assert [e.offset for e in merged[1].result.events] == [1, 2, 4]  # type: ignore[union-attr]
    assert [e.offset for e in merged[3].result.events] == [5, 6]  # type: ignore[union-attr]


@pytest.mark.parametrize("replies", [
    [],
    [p.Reply(1, p.Done())],
    [p.Reply(1, p.Done()), p.Reply(2, error=p.WireError("not_leader", "m", True, 2, "h:1"))],
    [_events(4, 1)],
    [_events(4, 1), _events(5, 1), p.Reply(6, p.Done())],
], ids=["empty", "one", "no-watch", "single-event-reply", "distinct-watches"])
def test_merge_watch_events_leaves_unmergeable_replies_alone(replies: list[p.Reply]) -> None:
    expected = [p.Reply(r.id, r.result, r.error) for r in replies]
    assert _merge_watch_events(replies) == expected


def test_oversize_reply_splits_watch_events_and_refuses_the_rest() -> None:
    parts = _oversize_reply(_events(7, 1, 2, 3, 4, 5), 1 << 25)
    assert [[e.offset for e in r.result.events] for r in parts] == [[1, 2], [3, 4, 5]]  # type: ignore[union-attr]
    (refused,) = _oversize_reply(p.Reply(8, p.Events([], 0, 0, 0)), 1 << 25)
    assert refused.id == 8 and refused.error is not None and refused.error.code == "invalid_argument"


# --- a real node over a socket -----------------------------------------------------------------------

class RawConnection:
    """The protocol by hand: asyncio streams and FrameDecoder."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(ServerFrame)
        self.frames: list[Any] = []

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        host, _, port = address.rpartition(":")
        return cls(*await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5))

    def send(self, *frames: Any) -> None:
        self.writer.write(b"".join(encode_frame(f) for f in frames))

    async def frame(self, timeout: float = 5.0) -> Any:
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            if not data:
                raise ConnectionError("closed")
            self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    async def replies(self, n: int) -> list[p.Reply]:
        out: list[p.Reply] = []
        while len(out) < n:
            out += (await self.frame()).replies
        return out

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    def close(self) -> None:
        self.writer.close()


async def _one_node(tmp_path: Path) -> RunningNode:
    """A one-member cluster's node in this process (its seed printed, to replay a failure)."""
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed={seed}")
    configs, data_dirs = in_process(admin_cluster(tmp_path, 1, seed))
    return await RunningNode.start(configs, 1, data_dirs[1], seed=seed)


def test_a_node_on_the_wire(tmp_path: Path) -> None:
    async def main() -> None:
        running = await _one_node(tmp_path)
        address = running.addresses["client"]
        try:
            # Version refused: a server hello with the reason, then the connection closes.
            c = await RawConnection.open(address)
            c.send(p.ClientHello(2, "future"))
            hello = await c.frame()
            assert isinstance(hello, p.ServerHello) and hello.version == 1 and "version 2" in hello.error
            assert await c.closed()

            # A request before the hello, then garbage after one: bad_frame with id 0, closed.
            c = await RawConnection.open(address)
            c.send(p.Requests([p.Request(1, p.Status())]))
            (reply,) = (await c.frame()).replies
            assert reply.id == 0 and reply.error is not None and reply.error.code == "bad_frame"
            assert await c.closed()
            c = await RawConnection.open(address)
            c.send(p.ClientHello(1))
            assert (await c.frame()).cluster == "admin-test"
            c.writer.write(struct.pack(">I", MAX_FRAME_BYTES + 1))
            (reply,) = (await c.frame()).replies
            assert reply.error is not None and reply.error.code == "bad_frame" and "exceeds" in reply.error.message
            assert await c.closed()

            # Issue 11: a frame nested too deeply gets its bad_frame reply before the close (it used to
            # get nothing: the RecursionError escaped the connection handler).
            c = await RawConnection.open(address)
            c.send(p.ClientHello(1))
            assert isinstance(await c.frame(), p.ServerHello)
            deep = b"\x83\xa4type\xacclient_hello\xa7version\x01\xa1x" + b"\x91" * 200_000 + b"\x00"
            c.writer.write(struct.pack(">I", len(deep)) + deep)
            (reply,) = (await c.frame()).replies
            assert reply.id == 0 and reply.error is not None and reply.error.code == "bad_frame"
            assert "nested too deeply" in reply.error.message
            assert await c.closed()
            # A request out of range is answered alone; the connection and its other requests go on.
            c = await RawConnection.open(address)
            c.send(p.ClientHello(1))
            assert isinstance(await c.frame(), p.ServerHello)
            bad = _framed({"type": "requests", "requests": [[1, {"type": "get", "key": "kv/a", "as_of": -5}, 0],
                                                            [2, {"type": "status"}, -1], [3, {"type": "status"}, 0]]})
            c.writer.write(bad)
            by_id = {r.id: r for r in await c.replies(3)}
            assert by_id[1].error is not None and by_id[1].error.code == "invalid_argument"
            assert by_id[1].error.message == "get.as_of: expected `int` >= 0, got -5"
            assert by_id[2].error is not None and "timeout_ms: expected `int` >= 0, got -1" in by_id[2].error.message
            assert isinstance(by_id[3].result, p.StatusInfo)
            c.send(p.Requests([p.Request(4, p.Status())]))
            assert isinstance((await c.replies(1))[0].result, p.StatusInfo)
            c.close()

            # A watch cancelled in the very frame that starts it still ends with `cancelled`.
            async with AsyncClient([address], timeout=10) as client:
                await client.put("w/a", b"1")    # waits for the kv leader
            c = await RawConnection.open(address)
            c.send(p.ClientHello(1), p.Requests([p.Request(1, p.Watch("kv/w/", from_offset=0)),
                                                 p.Request(2, p.CancelWatch(1))]))
            assert isinstance(await c.frame(), p.ServerHello)
            replies = await c.replies(2)
            by_id = {r.id: r for r in replies}
            assert isinstance(by_id[2].result, p.Done)
            assert by_id[1].error is not None and by_id[1].error.code == "cancelled", replies
            c.send(p.Requests([p.Request(3, p.CancelWatch(1)), p.Request(4, p.Watch("kv/w/", window=0))]))
            replies = await c.replies(2)
            by_id = {r.id: r for r in replies}
            assert isinstance(by_id[3].result, p.Done)          # already ended: nothing to cancel
            assert by_id[4].error is not None and by_id[4].error.code == "invalid_argument"
            c.close()

            async with AsyncClient([address], timeout=20) as client:
                # More than a frame of concurrent writes on one connection: split into several frames.
                value = b"v" * 950_000
                results = await asyncio.gather(*(client.put(f"big/{i}", value) for i in range(18)))
                assert len({r.offset for r in results}) == 18
                # A write too large for one batch is refused; the group keeps serving.
                with pytest.raises(ClientError) as error:
                    await client.commands([ev.KvPut(name=f"huge/{i}", value=value) for i in range(2)])
                assert error.value.code == "batch_too_large"
                # A request too large for any frame is refused by the client before it is sent.
                with pytest.raises(ClientError) as error:
                    await client.commands([ev.KvPut(name=f"giant/{i}", value=value) for i in range(18)])
                assert error.value.code == "invalid_argument" and "frame limit" in str(error.value)
                assert (await client.put("after/ok", b"1")).ok
            assert running.node.failure() is None
        finally:
            await running.stop()

    asyncio.run(main())


def test_writes_answered_at_once_or_dropped_with_their_connection_leave_nothing_running(tmp_path: Path) -> None:
    """A write runs without a task (`CallRunner.start`): one refused before it is proposed is answered at
    once and is not kept as running; one whose connection goes before its commit is dropped (no reply,
    nothing left), and the node serves on."""
    async def main() -> None:
        running = await _one_node(tmp_path)
        address = running.addresses["client"]
        try:
            async with AsyncClient([address], timeout=10) as client:
                await client.put("warm/up", b"1")    # waits for the kv leader
            with pytest.raises(InvalidArgumentError):   # every face's write refuses an empty one
                await running.node.write([])
            with pytest.raises(InvalidArgumentError):
                running.node.start_write([], lambda outcome: None)
            c = await RawConnection.open(address)
            c.send(p.ClientHello(1))
            assert isinstance(await c.frame(), p.ServerHello)
            c.send(p.Requests([p.Request(1, p.Write([ev.KvPut(name="a/1", value=b"1", request_id="not-time-ordered")])),
                               p.Request(2, p.Write([ev.HistoryPruned(floor=5)])),
                               p.Request(3, p.Write([ev.KvPut(name="a/2", value=b"2")]))]))
            by_id = {r.id: r for r in await c.replies(3)}
            assert by_id[1].error is not None and by_id[1].error.code == "invalid_argument", by_id[1]
            assert by_id[2].error is not None and by_id[2].error.code == "invalid_argument", by_id[2]
            assert isinstance(by_id[3].result, p.Written) and by_id[3].result.results[0].ok
            mine = c.writer.get_extra_info("sockname")
            (conn,) = [k for k in running.clients.connections
                       if k.transport is not None and k.transport.get_extra_info("peername") == mine]
            assert conn.calls == {} and conn.in_flight == 0
            c.send(p.Requests([p.Request(4, p.Write([ev.KvPut(name="a/3", value=b"3")]))]))
            c.writer.transport.abort()   # gone before the write commits (or just after)
            async with AsyncClient([address], timeout=10) as client:
                assert (await client.put("a/4", b"4")).ok
                for _ in range(500):   # until the aborted connection's loss reaches the node
                    if conn not in running.clients.connections:
                        break
                    await asyncio.sleep(0.01)
                assert conn not in running.clients.connections and conn.calls == {}
            assert running.node.failure() is None
        finally:
            await running.stop()

    asyncio.run(main())
