"""`Connection`'s waits: a reply is kept on its `Sent`, not in the future a caller waits on.

Against a scripted node on a real 127.0.0.1 socket (it says hello, then answers a request only when
the test lets it): a wait that times out (NoAnswerError) or is cancelled leaves the request pending,
and a later wait gets the reply that came meanwhile or afterwards; the connection's failure reaches
a waiting call and one that waits afterwards; a reply to an abandoned (`forget`) request is dropped;
replies larger than the connection's read buffer, and many in one read, reach their calls on both loops;
requests made in one turn go out together, in one write, once the loop runs. No timing is asserted: the
waits that time out are given no reply at all, and nothing can be written while the test blocks the loop.
"""

from __future__ import annotations

import asyncio
import queue
import random
import socket
import threading
from typing import Any

import pytest
import uvloop

from epochlog.api import messages as p
from epochlog.api.frames import ClientFrame, FrameDecoder, encode_frame, encode_frames
from epochlog.client.connection import READ_BUFFER_BYTES, Connection
from epochlog.client.errors import NoAnswerError, UnavailableError


class ScriptedNode(asyncio.Protocol):
    """Says hello; keeps every request it reads until `answer` is called for its id."""

    def __init__(self, requests: asyncio.Queue[p.Request]) -> None:
        self.requests = requests
        self.decoder = FrameDecoder(ClientFrame)
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            if isinstance(frame, p.ClientHello):
                self.transport.write(encode_frame(p.ServerHello(p.PROTOCOL_VERSION, "test", 7,
                                                                election_timeout_ms=1000)))
            else:
                for request in frame.requests:
                    self.requests.put_nowait(request)

    def answer(self, rid: int, result: p.Result) -> None:
        for frame in encode_frames([p.Reply(rid, result=result)], p.Replies):
            self.transport.write(frame)


async def _connected() -> tuple[Connection, ScriptedNode, asyncio.Queue[p.Request], asyncio.Server]:
    requests: asyncio.Queue[p.Request] = asyncio.Queue()
    nodes: list[ScriptedNode] = []

    def made() -> ScriptedNode:
        nodes.append(ScriptedNode(requests))
        return nodes[-1]

    server = await asyncio.get_running_loop().create_server(made, "127.0.0.1", 0)   # the kernel's free port
    port = server.sockets[0].getsockname()[1]
    conn = Connection(f"127.0.0.1:{port}")
    await conn.connect(5)
    assert conn.node_id == 7 and conn.open
    return conn, nodes[0], requests, server


async def _reply_to(node: ScriptedNode, requests: asyncio.Queue[p.Request], result: p.Result) -> int:
    """Answer the next request the node reads; its id."""
    request = await asyncio.wait_for(requests.get(), 5)
    node.answer(request.id, result)
    return request.id


def test_a_wait_that_times_out_or_is_cancelled_leaves_the_request_to_a_later_wait() -> None:
    async def main() -> None:
        conn, node, requests, server = await _connected()
        try:
            sent = conn.send(p.Get("kv/x", "local"), 5)
            request = await asyncio.wait_for(requests.get(), 5)
            assert request.id == sent.id
            with pytest.raises(NoAnswerError):
                await conn.wait(sent, 0.01)                # nothing was answered: no answer
            waiting = asyncio.ensure_future(conn.wait(sent, 5))
            await asyncio.sleep(0)
            waiting.cancel()                               # a caller that gave up on this wait
            with pytest.raises(asyncio.CancelledError):
                await waiting
            node.answer(sent.id, p.Got(None, 41))          # the reply comes while nobody waits
            assert await conn.wait(sent, 5) == p.Got(None, 41)
            assert await conn.wait(sent, 0) == p.Got(None, 41)   # kept: asked again, answered again
            conn.forget(sent)

            # A reply that arrives while a wait runs wakes it.
            second = conn.send(p.Get("kv/y", "local"), 5)
            waiting = asyncio.ensure_future(conn.wait(second, 5))
            assert await _reply_to(node, requests, p.Got(None, 42)) == second.id
            assert await waiting == p.Got(None, 42)
            conn.forget(second)

            # An abandoned request's late reply is dropped; the connection serves on.
            third = conn.send(p.Get("kv/z", "local"), 5)
            conn.forget(third)
            assert await _reply_to(node, requests, p.Got(None, 43)) == third.id
            calling = asyncio.ensure_future(conn.call(p.Get("kv/z", "local"), 5))
            await _reply_to(node, requests, p.Got(None, 44))
            assert await calling == p.Got(None, 44)
            assert conn.open
        finally:
            await conn.close()
            server.close()

    asyncio.run(main())


def test_the_connection_failing_reaches_a_waiting_call_and_a_later_wait() -> None:
    async def main() -> None:
        conn, node, requests, server = await _connected()
        try:
            waited = conn.send(p.Get("kv/x", "local"), 5)
            unwaited = conn.send(p.Get("kv/y", "local"), 5)
            waiting = asyncio.ensure_future(conn.wait(waited, 5))
            await asyncio.wait_for(requests.get(), 5)
            node.transport.close()                         # the node goes away with both pending
            with pytest.raises(UnavailableError):
                await waiting
            with pytest.raises(UnavailableError):
                await conn.wait(unwaited, 5)
            assert not conn.open
            with pytest.raises(UnavailableError):
                conn.send(p.Get("kv/z", "local"), 5)       # nothing sent on a closed connection
        finally:
            await conn.close()
            server.close()

    asyncio.run(main())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_replies_larger_than_the_read_buffer_and_many_in_one_read_reach_their_calls(loop_kind: str) -> None:
    """The connection reads into one buffer of its own (READ_BUFFER_BYTES): a reply several times that size
    arrives in many reads, and several replies written at once arrive in one; every call gets its own reply,
    byte for byte, on the default loop and on uvloop (the node's and the CLI's)."""
    rng = random.Random(READ_BUFFER_BYTES)

    async def main() -> None:
        conn, node, requests, server = await _connected()
        try:
            for size in (READ_BUFFER_BYTES - 100, 3 * READ_BUFFER_BYTES + 7, 1 << 20):
                state = rng.randbytes(size)
                calling = asyncio.ensure_future(conn.call(p.Get("kv/big", "local"), 5))
                await _reply_to(node, requests, p.Got(p.Item("kv/big", state, size), size))
                got = await calling
                assert isinstance(got, p.Got) and got.item is not None and got.item.state == state

            sent = [conn.send(p.Get(f"kv/{i}", "local"), 5) for i in range(50)]
            ids = [(await asyncio.wait_for(requests.get(), 5)).id for _ in sent]
            node.transport.write(b"".join(frame for i, rid in enumerate(ids)
                                          for frame in encode_frames([p.Reply(rid, result=p.Got(None, i))], p.Replies)))
            for i, s in enumerate(sent):
                assert await conn.wait(s, 5) == p.Got(None, ids.index(s.id)), i
            assert conn.open
        finally:
            await conn.close()
            server.close()

    if loop_kind == "uvloop":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())


class ThreadNode:
    """A node on a plain socket served by a thread: says hello, then hands every chunk it reads to `chunks`,
    so the test can see what the client wrote while the client's loop is not running."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))   # the kernel's free port
        self.port = self.listener.getsockname()[1]
        self.chunks: queue.Queue[bytes] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener, self.listener.accept()[0] as sock:
            decoder = FrameDecoder(ClientFrame)
            hello = False
            while not hello:
                data = sock.recv(65536)
                if not data:
                    return
                hello = any(isinstance(frame, p.ClientHello) for frame in decoder.feed(data))
            sock.sendall(encode_frame(p.ServerHello(p.PROTOCOL_VERSION, "test", 7, election_timeout_ms=1000)))
            while data := sock.recv(65536):
                self.chunks.put(data)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_requests_made_in_one_turn_share_one_write_once_the_loop_runs(loop_kind: str) -> None:
    """The requests a turn makes are queued and written together by the loop's next turn, in one frame, even
    the first one made with nothing in flight: written at once by `send`, it reached the node alone, which
    took it in an entry of its own, and the rest of the turn's requests in another (bench/RESULTS.md
    issue-20-sdk-send: put-c16 +19-22 % latency, +27-40 % server CPU). The thread node reads what was
    written while this test blocks the loop: nothing, until the loop has run."""

    async def main() -> None:
        node = ThreadNode()
        conn = Connection(f"127.0.0.1:{node.port}")
        await conn.connect(5)
        decoder = FrameDecoder(ClientFrame)
        try:
            sent = [conn.send(p.Get(f"kv/{i}", "local"), 5) for i in range(3)]
            with pytest.raises(queue.Empty):
                node.chunks.get(timeout=0.2)   # the loop is blocked here: nothing may have been written yet
            await asyncio.sleep(0)             # the turn's flush
            frames: list[Any] = []
            while sum(len(f.requests) for f in frames) < len(sent):
                frames += decoder.feed(node.chunks.get(timeout=5))
            assert [[r.id for r in f.requests] for f in frames] == [[s.id for s in sent]]
        finally:
            await conn.close()

    if loop_kind == "uvloop":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())
