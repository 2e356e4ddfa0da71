"""The native client service: the protocol of epochlog.api over asyncio TCP.

One `ClientConnection` per client connection. Requests of a frame are started at once (pipelining);
replies are queued and written once per turn of the event loop, so the replies that completed
together share one frame and one write; when the last request running on the connection completes,
its reply (with what is queued) is written at once, since nothing else could join the frame. When
the socket's send buffer fills, the connection stops reading requests until it drains (backpressure
instead of unbounded queues).

Hostile or broken input (docs/protocol.md §1, §11):

- a request that does not decode (a wrong type, a value out of range, an unknown call or event
  type) is answered on its own with `invalid_argument`; a frame that yields no request id to
  answer gets one `bad_frame` reply (id 0) with the reason, which is also logged, and the
  connection closes. No decoding error (RecursionError included) escapes the connection handler.
- Memory: the bytes of frames not yet complete, summed over every connection, stay within
  `[clients] partial_frames_bytes`; a connection whose bytes would take the sum past it is closed
  with `connection_limit` (retriable: connect again). Time: a frame (the hello included) must be
  complete within `frame_timeout_ms` of its first byte (of the connection, for the hello), else the
  connection is closed the same way. So stalled or trickling connections neither hold memory nor
  stay forever. Past `max_connections`, a new connection gets the same reply and is closed.
- Work: the loop that runs the requests also sends every Raft group's heartbeats, so no frame may
  hold it for long. A connection runs at most `max_in_flight_requests` requests at once (watches
  apart) and starts at most `REQUESTS_PER_TURN` of them per turn of the loop; the rest of a frame
  waits in the connection's backlog, and the connection reads nothing more until the backlog is
  empty (back pressure, as when its replies cannot be written).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from eventlog.configuration import doc
from eventlog.errors import (BadFrameError, ConfigError, ConnectionLimitError, EpochlogError, InvalidArgumentError,
                             WatchCancelledError)
from epochlog.api import messages as p
from epochlog.api.frames import (MAX_FRAME_BYTES, BadRequest, ClientFrame, FrameDecoder, FrameError, encode_frame,
                                 encode_frames, salvage_requests)
from epochlog.calls import CallRunner, Cancellable, Done, FaceRules, Failed, wire_error
from epochlog.access_control import AccessConfig, AccessControl, AccessMetrics, Caller
from epochlog.face_tls import (ClientTlsConfig, certificate_node, certificate_principal, internal_client_tls,
                               server_context)
from epochlog.listener import Listener
from epochlog.metrics import Metrics
from epochlog.logs import Throttled
from epochlog.node import DEFAULT_TIMEOUT_S, Node

logger = logging.getLogger(__name__)

MAX_TIMEOUT_S = p.MAX_TIMEOUT_MS / 1000
REQUESTS_PER_TURN = 128     # requests a connection starts in one turn of the loop (then it lets others run)
REFUSED_LINGER_S = 1.0      # a refused connection is cut this long after its reply if the client keeps it


@dataclass(frozen=True, slots=True)
class ClientServiceConfig:
    """Limits of the native client service (`[clients]` in the node's TOML file)."""

    partial_frames_bytes: int = field(default=64 << 20, metadata=doc(
        "Memory for frames being received, summed over every client connection of the node: a connection "
        "whose partly received frame would take the sum past it is closed (connection_limit, retriable). At "
        "least one frame of the maximum size (16 MiB).", min=MAX_FRAME_BYTES + 4))
    frame_timeout_ms: int = field(default=30_000, metadata=doc(
        "A frame must be received in full within this many ms of its first byte, and the hello within this "
        "many ms of the connection; else the connection is closed (connection_limit).", min=100,
        max=3_600_000))
    max_connections: int = field(default=4096, metadata=doc(
        "Client connections the node keeps open at once; one more gets a connection_limit reply and is "
        "closed.", min=1))
    max_in_flight_requests: int = field(default=256, metadata=doc(
        "Requests of one connection running at once (watches apart); the next ones wait, and the "
        "connection reads no more until they started.", min=1, max=1_000_000))
    tls: ClientTlsConfig = field(default_factory=ClientTlsConfig, metadata=doc(
        "TLS of every client face ([clients.tls], epochlog/face_tls.py)."))
    access: AccessConfig = field(default_factory=AccessConfig, metadata=doc(
        "Authentication and authorization on every client face ([clients.access], epochlog/access_control.py)."))

    def __post_init__(self) -> None:
        # The one place the secure default is decided: enforcement follows the faces' TLS unless the
        # config says otherwise, so a config that says nothing gets both, and `[clients.tls] enabled =
        # false` alone is a plaintext, unauthenticated cluster (enforcing needs TLS: access_control).
        if self.access.enforce is None:
            object.__setattr__(self, "access", replace(self.access, enforce=self.tls.enabled))


class ClientService:
    """Listens for clients on one address and serves them from `node`. Use on the node's loop."""

    def __init__(self, node: Node, metrics: Metrics | None = None, config: ClientServiceConfig | None = None,
                 access: AccessControl | None = None) -> None:
        self.node = node
        self.metrics = metrics
        self.config = config or ClientServiceConfig()
        if access is None:
            access = access_control(node, self.config, metrics)
        self.access = access                      # shared with the node's other faces (epochlog/serve.py)
        if self.config.tls.enabled:               # the node's own clients of the others present its certificate
            node.internal_tls = internal_client_tls(self.config.tls, node.data_dir)
        self.listener: Listener[ClientConnection] = Listener("client", self.config.frame_timeout_ms)
        self.connections = self.listener.connections
        self.runner = CallRunner(FaceRules(), metrics, access)   # the call path every face shares (epochlog/calls.py)
        self.partial_bytes = 0                    # sum of every connection's `decoder.pending_bytes`
        self.limit_closes = 0                     # connections closed for a limit (budget, frame timeout, count)
        self.refusals = Throttled(logger)         # connections refused past max_connections: logged rarely
        # Told to every client in its hello: the SDK sizes its per-attempt timeouts and pings from it.
        configs = node.configs
        self.election_timeout_ms = configs.raft.election_timeout_ticks * configs.cluster.tick_interval_ms

    async def start(self, host: str, port: int) -> None:
        tls = server_context(self.config.tls, self.node.data_dir)
        await self.listener.start(lambda: ClientConnection(self), host, port, tls)

    @property
    def port(self) -> int:
        return self.listener.port

    async def close(self) -> None:
        await self.listener.close()


def access_control(node: Node, config: ClientServiceConfig, metrics: Metrics | None) -> AccessControl:
    """The node's access state for every face, from `[clients.access]`; enforcing needs TLS on the faces
    (the nodes' own calls authenticate by their member certificates)."""
    if config.access.enforce and not config.tls.enabled:
        raise ConfigError("clients.access.enforce", True, "needs [clients.tls] enabled = true (the nodes "
                                                          "authenticate each other's calls by their member certificates)")
    if config.access.enforce and not config.access.super_users:
        # A config from before the secure default, likely: nothing but earlier ACL events allows a call.
        logger.warning("client calls are authenticated and authorized ([clients.access] enforce, the default "
                       "with [clients.tls]) and [clients.access] super_users is empty: only principals granted "
                       "by ACL events may do anything; name the first admin there (docs/security.md)")
    return AccessControl(config.access, lambda: node.views.get("metadata"),
                         None if metrics is None else AccessMetrics(metrics.registry))


class ClientConnection(asyncio.Protocol):
    def __init__(self, service: ClientService) -> None:
        self.service = service
        self.node = service.node
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(ClientFrame, salvage=salvage_requests)
        self.counted = 0                      # this connection's part of service.partial_bytes
        self.waiting_since: float | None = time.monotonic()   # a frame (or the hello) is due since then
        self.greeted = False
        self.refused = False                  # answered with a limit, its stream ended: nothing more is served
        self.pending: list[p.Reply] = []
        self.flush_scheduled = False
        self.calls: dict[int, Cancellable] = {}    # requests started and not answered: their tasks, or writes
        self.backlog: deque[p.Request] = deque()   # requests received, not started yet (in order)
        self.in_flight = 0                    # requests started and not answered (watches apart)
        self.reading_paused = False
        self.pump_scheduled = False
        self.watch_ids: set[int] = set()      # request ids of watches not yet ended (started or not)
        self.watches: dict[int, _WatchState] = {}
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.certificate_principal: str | None = None   # named by a verified client certificate (TLS)
        self.certificate_node: int | None = None        # another node of the cluster, by its member certificate
        self.token = ""                                  # the hello's bearer token
        self.caller = Caller()                           # who the connection says it is (epochlog/calls.py)

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio subclasses
        peercert = transport.get_extra_info("peercert")
        self.certificate_principal = certificate_principal(peercert)
        self.certificate_node = certificate_node(peercert, self.node.cluster)
        self.caller = Caller(certificate=self.certificate_principal, node=self.certificate_node)
        service = self.service
        if len(service.connections) >= service.config.max_connections:
            self._refuse(f"the node has {len(service.connections)} client connections open "
                         f"(max_connections = {service.config.max_connections})")
            return
        service.connections.add(self)

    def _refuse(self, message: str) -> None:
        """Past max_connections: one connection_limit reply, then the end of the stream (`_end_with`)."""
        assert self.transport is not None
        self.service.limit_closes += 1
        self.service.refusals.warning("refusing client connection %s: %s", self._peer(), message)
        self._end_with(ConnectionLimitError(message))

    def _end_with(self, error: EpochlogError) -> None:
        """One reply (id 0) with `error`, then the end of the stream. What the client sends meanwhile is
        read and dropped, so that the close does not reset the connection before the client read the
        reply (a client still sending when a close left its bytes unread got a reset, and lost the
        reply); the connection is cut REFUSED_LINGER_S later if the client keeps it."""
        transport = self.transport
        assert transport is not None
        self.refused = True
        self.waiting_since = None
        self.backlog.clear()
        transport.write(encode_frame(p.Replies([p.Reply(0, error=wire_error(error))])))
        if transport.can_write_eof():
            transport.write_eof()
            if self.reading_paused:
                self.reading_paused = False
                transport.resume_reading()
            self.loop.call_later(REFUSED_LINGER_S, transport.abort)
        else:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)
        self._release_partial()
        self.backlog.clear()
        for call in self.calls.values():
            call.cancel()
        self.calls.clear()
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self.can_write.set()
        self._update_reading()

    def _update_reading(self) -> None:
        """Read while replies can be written and no request waits in the backlog. A frame is not
        overdue for the time the node did not read it."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.refused:
            return
        paused = not self.can_write.is_set() or bool(self.backlog)
        if paused != self.reading_paused:
            self.reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()
            if self.greeted:
                self.waiting_since = None if paused or not self.decoder.pending_bytes else time.monotonic()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing() or self.refused:
            return
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            self._fail(str(exc))
            return
        except Exception as exc:   # never leave a connection without its reason (a bug if it happens)
            logger.exception("client frame could not be handled")
            self._fail(f"the frame could not be handled: {type(exc).__name__}: {exc}")
            return
        if not self._within_budget():
            return
        for frame in frames:
            if isinstance(frame, p.ClientHello):
                self._hello(frame)
            elif not self.greeted:
                self._fail("the first frame must be a client hello")
                return
            elif isinstance(frame, BadRequest):
                self.reply_error(frame.id, InvalidArgumentError(frame.problem))
            else:
                self.backlog.extend(frame.requests)
        self._frame_due(bool(frames))
        if self.backlog:
            self._pump()

    def _pump(self) -> None:
        """Start requests from the backlog: at most REQUESTS_PER_TURN now, and while fewer than
        max_in_flight_requests run; then again next turn, or once a request completes."""
        self.pump_scheduled = False
        if self.transport is None or self.transport.is_closing() or self.refused:
            self.backlog.clear()
            return
        cap = self.service.config.max_in_flight_requests
        started = 0
        while self.backlog and started < REQUESTS_PER_TURN and self.in_flight < cap:
            self._start(self.backlog.popleft())
            started += 1
        if self.backlog and self.in_flight < cap:
            self._schedule_pump()      # the slice is done: other work of the loop runs first
        self._update_reading()

    def _schedule_pump(self) -> None:
        if not self.pump_scheduled:
            self.pump_scheduled = True
            self.loop.call_soon(self._pump)

    def _within_budget(self) -> bool:
        """Count the bytes held for incomplete frames against the node's budget; False when the connection
        was closed for needing more than the budget leaves."""
        pending = self.decoder.pending_bytes
        service = self.service
        grown = pending - self.counted
        if grown > 0 and service.partial_bytes + grown > service.config.partial_frames_bytes:
            self.close_for_limit(f"the node's memory for partly received frames (partial_frames_bytes = "
                                 f"{service.config.partial_frames_bytes}) is in use: {service.partial_bytes} bytes "
                                 f"held over {len(service.connections)} connections; this one needs {pending}")
            return False
        service.partial_bytes += grown
        self.counted = pending
        return True

    def _frame_due(self, completed: bool) -> None:
        """When the frame being received started (the sweeper closes it past frame_timeout_ms). Before
        the hello: since the connection was made."""
        if not self.greeted:
            return
        if self.decoder.pending_bytes == 0:
            self.waiting_since = None
        elif completed or self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def _release_partial(self) -> None:
        """Give back this connection's part of the budget, and the memory behind it."""
        self.service.partial_bytes -= self.counted
        self.counted = 0
        self.waiting_since = None
        if self.decoder.pending_bytes:
            self.decoder = FrameDecoder(ClientFrame, salvage=salvage_requests)

    def overdue(self) -> str:
        return "its hello" if not self.greeted else f"a frame ({self.decoder.pending_bytes} bytes so far)"

    def close_for_limit(self, message: str) -> None:
        """Close the connection for breaking a limit: one `connection_limit` reply (id 0), then the end
        of the stream (`_end_with`)."""
        self.service.limit_closes += 1
        logger.warning("closing client connection %s: %s", self._peer(), message)
        self._release_partial()
        if self.transport is not None and not self.transport.is_closing() and not self.refused:
            self._end_with(ConnectionLimitError(message))

    def _peer(self) -> str:
        if self.transport is None:
            return "?"
        peer = self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- requests -----------------------------------------------------------------------------

    def _hello(self, hello: p.ClientHello) -> None:
        assert self.transport is not None
        if hello.version != p.PROTOCOL_VERSION:
            error = f"protocol version {hello.version} is not supported (this node speaks {p.PROTOCOL_VERSION})"
            self.transport.write(encode_frame(p.ServerHello(p.PROTOCOL_VERSION, self.node.cluster,
                                                              self.node.node_id, error)))
            self.transport.close()
            return
        self.greeted = True
        self.token = hello.token
        self.caller = Caller(certificate=self.certificate_principal, node=self.certificate_node, token=hello.token)
        self.transport.write(encode_frame(p.ServerHello(p.PROTOCOL_VERSION, self.node.cluster, self.node.node_id,
                                                          election_timeout_ms=self.service.election_timeout_ms)))

    def _fail(self, message: str) -> None:
        logger.warning("closing client connection %s: %s", self._peer(), message)
        self._release_partial()
        if self.transport is not None and not self.transport.is_closing():
            error = wire_error(BadFrameError(message))
            self.transport.write(encode_frame(p.Replies([p.Reply(0, error=error)])))
            self.transport.close()

    def _start(self, request: p.Request) -> None:
        call = request.call
        handler = _SYNC.get(type(call))
        if handler is not None:
            self._answer(request.id, self.service.runner.now(_op(call), call, functools.partial(handler, self, call),
                                                             self.caller))
            return
        timeout = DEFAULT_TIMEOUT_S if request.timeout_ms == 0 else min(request.timeout_ms / 1000, MAX_TIMEOUT_S)
        if isinstance(call, p.Write):
            # No task: the write is told in the turn that applies it and answered from there (a task
            # start and a loop turn less on every write's path: issue-20-told-writes in bench/RESULTS.md).
            self.in_flight += 1
            rid = request.id
            write = call   # its events are read once authorized (authorize stamps the actor into them)
            running = self.service.runner.start(
                _op(call), call, lambda tell: self.node.start_write(write.events, tell), timeout, self.caller,
                functools.partial(self._written, rid))
            if running is not None:   # else answered already (refused, invalid)
                self.calls[rid] = running
            return
        # The coroutine is made when the task first runs: a task cancelled before that (a watch
        # cancelled in its own frame, a connection lost) leaves no coroutine never awaited.
        if isinstance(call, p.Watch):
            self.watch_ids.add(request.id)
            work = functools.partial(_watch, self, request.id, call)
        else:
            work = functools.partial(_ASYNC[type(call)], self, call)
            self.in_flight += 1
        task = self.loop.create_task(self._run(request.id, call, work, timeout))
        self.calls[request.id] = task

    async def _run(self, rid: int, call: p.Call, work: Callable[[], Coroutine[Any, Any, Any]],
                   timeout: float) -> None:
        watch = isinstance(call, p.Watch)
        try:
            # A watch lives until cancelled or failed and replies by itself; its lifetime is not a latency.
            outcome = await self.service.runner.run(_op(call), call, work, None if watch else timeout,
                                                    self.caller, observe=not watch)
            if not watch or isinstance(outcome, Failed):
                self._answer(rid, outcome)
        finally:
            self.calls.pop(rid, None)
            self.watch_ids.discard(rid)
            if not watch:
                self._ended()

    def _written(self, rid: int, outcome: Done[list[p.WriteResult]] | Failed) -> None:
        """A write's outcome (`CallRunner.start`), told in the turn that applied it, or by its deadline."""
        self.calls.pop(rid, None)
        if isinstance(outcome, Done):
            outcome = Done(p.Written(outcome.result))
        self._answer(rid, outcome)
        self._ended()

    def _ended(self) -> None:
        """A request (not a watch) was answered: start the next, or write the replies."""
        self.in_flight -= 1
        if self.backlog:
            self._schedule_pump()
        elif self.in_flight == 0 and self.pending:
            # No other request of this connection can join the frame: write it in this turn,
            # not the next (one loop turn less on a single client's path).
            self._flush()

    # --- replies ------------------------------------------------------------------------------

    def reply(self, rid: int, result: p.Result) -> None:
        self._queue(p.Reply(rid, result=result))

    def reply_error(self, rid: int, exc: BaseException) -> None:
        """An error outside a call (a request that did not decode): counted under no op."""
        self._answer(rid, Failed(self.service.runner.error("", exc)))

    def _answer(self, rid: int, outcome: Done[Any] | Failed) -> None:
        if isinstance(outcome, Done):
            self._queue(p.Reply(rid, result=outcome.result))
            return
        error = outcome.error
        leader = self.node.client_addresses.get(error.leader_hint, "") if error.leader_hint else ""
        self._queue(p.Reply(rid, error=wire_error(error, leader)))

    def _queue(self, reply: p.Reply) -> None:
        self.pending.append(reply)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if not self.pending or self.transport is None or self.transport.is_closing() or self.refused:
            self.pending.clear()
            return
        replies, self.pending = self.pending, []
        for frame in encode_frames(_merge_watch_events(replies), p.Replies, oversize=_oversize_reply):
            self.transport.write(frame)


def _op(call: p.Call) -> str:
    """The call's wire tag (`write`, `get`, ...): the `op` label of the RPC metrics."""
    return str(type(call).__struct_config__.tag)


def _oversize_reply(reply: p.Reply, size: int) -> list[p.Reply]:
    """A reply too large for one frame: a watch's merged events go out in several replies; anything
    else is answered with an error (the request asked for too much at once)."""
    result = reply.result
    if isinstance(result, p.WatchEvents) and len(result.events) > 1:
        half = len(result.events) // 2
        return [p.Reply(reply.id, p.WatchEvents(result.watch_id, result.events[:half])),
                p.Reply(reply.id, p.WatchEvents(result.watch_id, result.events[half:]))]
    message = (f"the reply of {size} bytes exceeds the frame limit of {MAX_FRAME_BYTES} bytes: "
               f"ask for less at once (limit, max_bytes, fewer keys)")
    return [p.Reply(reply.id, error=wire_error(InvalidArgumentError(message)))]


def _merge_watch_events(replies: list[p.Reply]) -> list[p.Reply]:
    """One WatchEvents reply per watch per frame, events in order, at the first one's place."""
    merged: list[p.Reply] = []
    first: dict[int, p.WatchEvents] = {}
    for reply in replies:
        result = reply.result
        if isinstance(result, p.WatchEvents):
            head = first.get(result.watch_id)
            if head is not None:
                head.events.extend(result.events)
                continue
            first[result.watch_id] = result
        merged.append(reply)
    return merged


# --- handlers -----------------------------------------------------------------------------------

class _WatchState:
    def __init__(self, window: int) -> None:
        self.window = window
        self.unacked = 0
        self.acked = asyncio.Event()


async def _get(c: ClientConnection, call: p.Get) -> p.Result:
    return await c.node.get(call)


async def _gets(c: ClientConnection, call: p.Gets) -> p.Result:
    return await c.node.get_many(call)


async def _list(c: ClientConnection, call: p.List) -> p.Result:
    return await c.node.list(call)


async def _history(c: ClientConnection, call: p.History) -> p.Result:
    return await c.node.history(call)


async def _lease_grant(c: ClientConnection, call: p.LeaseGrant) -> p.Result:
    return await c.node.lease_grant(call)


async def _watch(c: ClientConnection, rid: int, call: p.Watch) -> None:
    """Started, then the events (at most `window` unacknowledged); an error reply ends it."""
    if not 1 <= call.window <= 1_000_000:
        raise InvalidArgumentError("window must be between 1 and 1000000")
    group, start, records = await c.node.watch(call)
    state = _WatchState(call.window)
    c.watches[rid] = state
    c.reply(rid, p.WatchStarted(rid, group, start))
    try:
        async for record in records:
            c.reply(rid, p.WatchEvents(rid, [record]))   # merged per watch when the frame is written
            state.unacked += 1
            while state.unacked >= state.window or not c.can_write.is_set():
                state.acked.clear()
                waits = [asyncio.ensure_future(state.acked.wait()), asyncio.ensure_future(c.can_write.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                if c.transport is None or c.transport.is_closing():
                    return
    finally:
        c.watches.pop(rid, None)


def _watch_ack(c: ClientConnection, call: p.WatchAck) -> p.Result:
    state = c.watches.get(call.watch_id)
    if state is not None:
        state.unacked = max(0, state.unacked - call.events)
        state.acked.set()
    return p.Done()


def _cancel_watch(c: ClientConnection, call: p.CancelWatch) -> p.Result:
    if call.watch_id not in c.watch_ids:
        return p.Done()      # ended already (or not a watch): nothing to cancel
    c.watch_ids.discard(call.watch_id)
    task = c.calls.pop(call.watch_id, None)
    if task is not None:     # also before the watch started: its task may not have run yet
        task.cancel()
        cancelled = WatchCancelledError("the watch was cancelled by the client")
        c._queue(p.Reply(call.watch_id, error=wire_error(cancelled)))
    return p.Done()


_SYNC: dict[type, Callable[[ClientConnection, Any], p.Result]] = {
    p.LeaseKeepAlive: lambda c, call: c.node.lease_keepalive(call),
    p.Status: lambda c, call: c.node.status(),
    p.Ping: lambda c, call: p.Done(),                                      # liveness: answered from the loop
    p.TransferLeader: lambda c, call: c.node.transfer_leader(call),
    p.Snapshot: lambda c, call: c.node.snapshot(call),
    p.CompactionStatus: lambda c, call: c.node.compaction_status(),
    p.MemberList: lambda c, call: c.node.member_list(),
    p.BrokerHeartbeats: lambda c, call: c.node.broker_heartbeats(call),   # from memory: no log write
    p.WatchAck: _watch_ack,
    p.CancelWatch: _cancel_watch,
}
_ASYNC: dict[type, Callable[[ClientConnection, Any], Coroutine[Any, Any, Any]]] = {
    p.Get: _get, p.Gets: _gets, p.List: _list, p.History: _history,
    p.LeaseGrant: _lease_grant,
    p.ReadEvents: lambda c, call: c.node.read_events(call),
    p.ReadLog: lambda c, call: c.node.read_log(call),
    p.MemberAdd: lambda c, call: c.node.member_add(call),
    p.MemberPromote: lambda c, call: c.node.member_promote(call),
    p.MemberRemove: lambda c, call: c.node.member_remove(call),
    p.BrokerRegister: lambda c, call: c.node.broker_register(call),
    p.SyncStateSetReport: lambda c, call: c.node.sync_state_set_report(call),
    p.BrokerShutdown: lambda c, call: c.node.broker_shutdown(call),
    p.RouteQuery: lambda c, call: c.node.route(call),
    p.BrokerList: lambda c, call: c.node.brokers(call),
    p.GroupSkip: lambda c, call: c.node.group_skip(call),
}
