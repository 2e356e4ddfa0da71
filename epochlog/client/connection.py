"""One long-lived connection to one node, with pipelining and frame coalescing.

Every call made while the previous frame is being written joins the next frame: calls are queued
and the queue is flushed once per turn of the event loop, so 100 concurrent calls cost one frame and
one write, not 100. Replies are matched to calls by request id.

Replies are decoded and handed over in the transport's `data_received` (an asyncio.Protocol, no
reader task), straight to the waiting call's own future: a reply wakes its caller in the next turn
of the loop, not three turns later (reader task, then a done-callback, then the caller). What a
call is answered with is kept on its `Sent`, not in the future it waits on, so a wait that times
out or is cancelled loses nothing: the call may be waited for again.

Liveness: while requests are pending, a watchdog timer checks that the node keeps talking. After
`Timing.ping_after_s` without a byte from the node it sends a `ping`; after `ping_timeout_s` more
without one, the connection is declared dead and its pending calls fail with `NoAnswerError`
(epochlog/client/retry.py). An idle connection, or one whose replies keep arriving, sends no ping;
the timer is one `call_later` per interval per busy connection. Open watches alone do not count as
pending (a quiet watch is normal).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from dataclasses import dataclass
from typing import Any

from epochlog.api import messages as p
from epochlog.api.frames import (MAX_FRAME_BYTES, FrameDecoder, FrameError, ServerFrame, encode_frame,
                                 encode_frames)
from epochlog.client.errors import ClientError, InvalidArgumentError, NoAnswerError, UnavailableError, from_wire
from epochlog.client.retry import Timing
from epochlog.client.tls import check_server
from eventlog.errors import ProtocolError, from_code

GRACE_S = 0.25   # how much longer than the node's deadline a call waits for its answer


@dataclass(slots=True)
class Sent:
    """A request queued on a connection (see `Connection.send`): its id, then what it was answered
    with: the node's reply, or the connection's failure. `waiter` is the future of the call waiting
    for it now, if any (woken by the answer or by the wait's timer; see `Connection.wait`)."""

    id: int
    reply: p.Reply | None = None
    error: ClientError | None = None
    waiter: asyncio.Future[None] | None = None

    @property
    def settled(self) -> bool:
        return self.reply is not None or self.error is not None

    def settle(self, reply: p.Reply | None, error: ClientError | None = None) -> None:
        self.reply, self.error = reply, error
        _wake(self.waiter)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


READ_BUFFER_BYTES = 64 << 10
"""Each connection's receive buffer: the transport reads into it (`_Link.get_buffer`)."""


class _Link(asyncio.BufferedProtocol):
    """The transport's side of a `Connection`: bytes in, frames out to it (on the loop's read turn).

    A buffered protocol: the transport reads into one buffer of the connection's own. As a plain
    protocol, asyncio's default loop allocated 256 KiB for every read (an mmap, an mremap and a munmap
    per reply; bench/RESULTS.md issue-20-sdk-reads)."""

    def __init__(self, conn: Connection, decoder: FrameDecoder, hello: asyncio.Future[list[Any]]) -> None:
        self.conn = conn
        self.decoder = decoder
        self.hello: asyncio.Future[list[Any]] | None = hello   # the frames up to and with the hello
        self._received = memoryview(bytearray(READ_BUFFER_BYTES))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._received

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._received[:nbytes])   # the decoder copies what it keeps

    def data_received(self, data: bytes | memoryview) -> None:
        conn = self.conn
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            self._lost(UnavailableError(f"connection to {conn.address} (node {conn.node_id}) closed: {exc}"))
            return
        hello = self.hello
        if hello is not None:
            if frames:
                self.hello = None
                if not hello.done():
                    hello.set_result(frames)
            return
        conn._heard = conn._loop_time()
        for frame in frames:
            conn._dispatch(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(UnavailableError(f"connection to {self.conn.address} (node {self.conn.node_id}) closed"))

    def _lost(self, error: ClientError) -> None:
        hello = self.hello
        if hello is not None:
            self.hello = None
            if not hello.done():
                hello.set_exception(ConnectionError("closed during hello"))
                hello.exception()   # retrieved: `connect` raises it if it still waits
        self.conn._fail_all(error)


class Connection:
    """A connection to `address` ("host:port"); use on one asyncio loop."""

    def __init__(self, address: str, *, client_name: str = "epochlog-python", tls: ssl.SSLContext | None = None,
                 token: str = "") -> None:
        self.address = address
        self.client_name = client_name
        self.tls = tls              # epochlog/client/tls.py
        self.token = token          # a bearer token, sent in the hello
        self.node_id = 0
        self.cluster = ""
        self.timing = Timing.from_hello(0)      # the node's, once its hello arrived
        self.pings_sent = 0
        self._transport: asyncio.Transport | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, Sent] = {}
        self._streams: dict[int, asyncio.Queue[p.Reply]] = {}
        self._queue: list[p.Request] = []
        self._flush_scheduled = False
        self._closed_error: ClientError | None = None
        self._loop_time = time.monotonic        # the loop's clock (set by `connect`)
        self._heard = 0.0                       # loop time of the last bytes from the node (or of becoming busy)
        self._ping_sent: float | None = None    # loop time of the ping not yet followed by any bytes
        self._watchdog: asyncio.TimerHandle | None = None
        self._status: asyncio.Task[p.Result] | None = None   # the latest status request (shared, see `status`)
        self._status_asked = 0.0

    @property
    def open(self) -> bool:
        return self._transport is not None and self._closed_error is None

    async def connect(self, timeout: float) -> None:
        """Open the connection and exchange hellos, within `timeout` for both (a stopped node accepts
        TCP connections in its kernel but never says hello)."""
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        self._loop_time = loop.time
        hello_frames: asyncio.Future[list[Any]] = loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                self._transport, _ = await loop.create_connection(
                    lambda: _Link(self, FrameDecoder(ServerFrame), hello_frames), host, int(port), ssl=self.tls,
                    server_hostname=host if self.tls is not None else None)
                if self.tls is not None:
                    check_server(self.address, self._transport.get_extra_info("peercert"))
                self._transport.write(encode_frame(p.ClientHello(p.PROTOCOL_VERSION, self.client_name, self.token)))
                frames = await hello_frames
        except TimeoutError:
            self._abort()
            raise UnavailableError(f"cannot connect to {self.address}: no hello within {timeout:.2f} s") from None
        except ClientError:
            self._abort()
            raise
        except (OSError, ValueError) as exc:
            self._abort()
            raise UnavailableError(f"cannot connect to {self.address}: {exc}") from None
        hello = frames[0]
        if isinstance(hello, p.Replies) and hello.replies and hello.replies[0].error is not None:
            error = hello.replies[0].error   # refused before the hello: a limit of the node (connection_limit)
            self._abort()
            raise from_code(error.code, f"{self.address} refused the connection: {error.message}",
                            retriable=error.retriable)
        if not isinstance(hello, p.ServerHello) or hello.error:
            self._abort()
            raise ProtocolError(f"{self.address} refused the connection: {getattr(hello, 'error', hello)}")
        self.node_id, self.cluster = hello.node, hello.cluster
        self.timing = Timing.from_hello(hello.election_timeout_ms)
        self._closed_error = None
        for frame in frames[1:]:
            self._dispatch(frame)

    async def call(self, call: p.Call, timeout: float) -> p.Result:
        """Send one request; its result, or raise the error it was answered with.

        The node is told the deadline and answers `deadline_exceeded` when it passes; this side
        waits a little longer (network grace) so that precise answer, not a bare timeout, arrives.
        """
        sent = self.send(call, timeout)
        try:
            return await self.wait(sent, timeout + GRACE_S)
        finally:
            self.forget(sent)

    async def status(self, timeout: float, max_age_s: float) -> p.StatusInfo:
        """The node's status (from its memory); callers less than `max_age_s` apart share one request, so
        many calls asking whether their node still leads cost one question."""
        loop = asyncio.get_running_loop()
        asked = self._status
        if asked is None or (asked.done() and loop.time() - self._status_asked >= max_age_s):
            self._status_asked = loop.time()
            asked = self._status = loop.create_task(self.call(p.Status(), timeout))
            asked.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved, whoever waits
        try:
            result = await asyncio.wait_for(asyncio.shield(asked), timeout + GRACE_S)
        except TimeoutError:
            raise NoAnswerError(f"{self.address} (node {self.node_id}) did not answer a status request within "
                                f"{timeout:.3f} s (no answer)") from None
        assert isinstance(result, p.StatusInfo)
        return result

    def send(self, call: p.Call, timeout: float) -> Sent:
        """Queue one request, telling the node `timeout` as its deadline; `wait` for its answer, then
        `forget` it. Raises at once, nothing sent, when the connection is closed."""
        self._check()
        sent = Sent(next(self._ids))
        loop = asyncio.get_running_loop()
        if self._watchdog is None:   # busy from now on: silence counts from here
            self._heard = loop.time()
            self._watchdog = loop.call_later(self.timing.ping_after_s, self._check_alive)
        self._pending[sent.id] = sent
        self._enqueue(p.Request(sent.id, call, max(1, int(timeout * 1000))))
        return sent

    async def wait(self, sent: Sent, timeout: float) -> p.Result:
        """The result of `sent`, or raise the error it was answered with (or the connection's, when it
        closed); NoAnswerError when nothing came within `timeout`: the request stays pending, so it may
        be waited for again (a cancelled wait too: the answer is kept on `sent`, not in the future
        waited on)."""
        if not sent.settled:
            loop = asyncio.get_running_loop()
            waiter = sent.waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                sent.waiter = None
            if not sent.settled:
                raise NoAnswerError(f"{self.address} (node {self.node_id}) did not answer within {timeout:.3f} s "
                                    f"(no answer)")
        if sent.error is not None:
            raise sent.error
        reply = sent.reply
        assert reply is not None
        if reply.error is not None:
            raise from_wire(reply.error)
        assert reply.result is not None
        return reply.result

    def forget(self, sent: Sent) -> None:
        """Stop waiting for `sent` (answered or abandoned): a late reply is dropped."""
        self._pending.pop(sent.id, None)

    def open_stream(self, call: p.Call) -> tuple[int, asyncio.Queue[p.Reply]]:
        """Send a request whose replies keep coming (watch): a queue receives every reply for it."""
        self._check()
        rid = next(self._ids)
        queue: asyncio.Queue[p.Reply] = asyncio.Queue()
        self._streams[rid] = queue
        self._enqueue(p.Request(rid, call))
        return rid, queue

    def close_stream(self, rid: int) -> None:
        self._streams.pop(rid, None)

    def send_oneway(self, call: p.Call) -> None:
        """Send a request and ignore its reply (acks, cancels)."""
        if self.open:
            self._enqueue(p.Request(next(self._ids), call))

    def _check_alive(self) -> None:
        """The watchdog (runs only while requests are pending): ping a silent node, and declare the
        connection dead when the ping is not followed by any bytes in time."""
        self._watchdog = None
        if not self._pending or self._closed_error is not None:
            self._ping_sent = None
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        timing = self.timing
        if self._ping_sent is not None and self._heard < self._ping_sent:
            left = self._ping_sent + timing.ping_timeout_s - now
            if left <= 0:
                self._fail_all(NoAnswerError(
                    f"{self.address} (node {self.node_id}) sent nothing for {now - self._heard:.2f} s and did not "
                    f"answer a ping within {timing.ping_timeout_s:.2f} s (no answer): connection closed"))
                return
            self._watchdog = loop.call_later(left, self._check_alive)
            return
        self._ping_sent = None
        silent = now - self._heard
        if silent >= timing.ping_after_s:
            self._ping_sent = now
            self.pings_sent += 1
            self._enqueue(p.Request(next(self._ids), p.Ping()))   # its reply is any bytes: nothing waits for it
            self._watchdog = loop.call_later(timing.ping_timeout_s, self._check_alive)
        else:
            self._watchdog = loop.call_later(timing.ping_after_s - silent, self._check_alive)

    def _check(self) -> None:
        if self._closed_error is not None:
            raise self._closed_error
        if self._transport is None:
            raise UnavailableError(f"not connected to {self.address}")

    def _enqueue(self, request: p.Request) -> None:
        self._queue.append(request)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if not self._queue or transport is None:
            return
        requests, self._queue = self._queue, []
        for frame in encode_frames(requests, p.Requests, oversize=self._too_large):
            transport.write(frame)

    def _too_large(self, request: p.Request, size: int) -> list[p.Request]:
        """A request that fits in no frame is not sent: its caller gets invalid_argument."""
        error = p.WireError(InvalidArgumentError.code, f"the request of {size} bytes exceeds the frame limit of "
                            f"{MAX_FRAME_BYTES} bytes: split it")
        sent = self._pending.pop(request.id, None)
        if sent is not None:
            sent.settle(p.Reply(request.id, error=error))
        stream = self._streams.pop(request.id, None)
        if stream is not None:
            stream.put_nowait(p.Reply(request.id, error=error))
        return []

    def _dispatch(self, frame: Any) -> None:
        """Hand a frame's replies to their calls (from `_Link.data_received`)."""
        if not isinstance(frame, p.Replies):
            return
        for reply in frame.replies:
            stream = self._streams.get(reply.id)
            if stream is not None:
                stream.put_nowait(reply)
                continue
            sent = self._pending.pop(reply.id, None)
            if sent is not None:
                sent.settle(reply)

    def _fail_all(self, error: ClientError) -> None:
        """Fail everything pending with `error` and close; the first reason stays the connection's."""
        if self._closed_error is None:
            self._closed_error = error
        else:
            error = self._closed_error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, {}
        for sent in pending.values():
            sent.settle(None, error)
        for rid, queue in self._streams.items():
            queue.put_nowait(p.Reply(rid, error=p.WireError(error.code, str(error), True)))   # resumed elsewhere
        self._streams.clear()
        self._abort()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._transport = None

    async def close(self) -> None:
        self._fail_all(UnavailableError(f"connection to {self.address} closed by the client"))
