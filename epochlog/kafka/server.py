"""The Kafka face's TCP server: frames in, `KafkaHandler` calls, response buffers out.

Like a Kafka broker, a connection's requests are handled one at a time, in order (a broker mutes
the channel while a request is in flight), so responses leave in request order. A response is
written with `writelines` (one writev under uvloop) of its header and the segment views that Fetch
returns. Frames above `MAX_REQUEST_BYTES`, unparsable requests and unsupported APIs or versions
close the connection, as a broker does; ApiVersions of a newer version is answered (error 35).

Limits (`[kafka]`, epochlog/kafka/config.py; docs/kafka.md "Limits"), so that no client holds the
node's memory or connections for long. A Kafka connection cannot be told why it is closed (the
protocol has no such frame), so each close is logged instead (at a bounded rate):

- Memory: the bytes of requests received and not yet answered (frames being received, frames
  waiting behind the one being handled, and that one), summed over every connection, stay within
  `partial_frames_bytes`: a connection whose bytes would take the sum past it is closed. A
  connection stops reading once `MAX_QUEUED_REQUESTS` requests wait (back pressure).
- Time: a frame must be complete within `frame_timeout_ms` of its first byte (time spent with
  reading paused by the server does not count), else the connection is closed.
- Connections: past `max_connections` a new connection is closed at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from typing import Any

from epochlog.access_control import AccessControl, Caller
from epochlog.face_tls import ClientTlsConfig, certificate_node, certificate_principal, server_context
from epochlog.kafka.sasl import SESSION, KafkaSession
from epochlog.kafka.config import MAX_REQUEST_BYTES, KafkaServiceConfig
from epochlog.kafka.groups import GroupCoordinator
from epochlog.kafka.errors import UnsupportedRequestError
from epochlog.kafka.handler import Broker, KafkaHandler
from epochlog.kafka.wire import FrameTooLarge, RequestFrames
from epochlog.listener import Listener
from epochlog.logs import Throttled

logger = logging.getLogger(__name__)

MAX_QUEUED_REQUESTS = 64            # per connection: reading pauses beyond this (back pressure)


class KafkaService:
    """Serves the Kafka protocol for `node` on one address. Use on the node's loop."""

    def __init__(self, node: Any, brokers: dict[int, Broker], config: KafkaServiceConfig | None = None,
                 access: AccessControl | None = None, tls: ClientTlsConfig | None = None) -> None:
        self.node = node
        self.config = config or KafkaServiceConfig()
        self.tls = tls      # [clients.tls]: the listener is SSL (SASL_SSL with SASL) when it is enabled
        self.handler = KafkaHandler(node, brokers, node.node_id, access)
        self.groups = GroupCoordinator(self.handler, self.config)
        self.listener: Listener[KafkaConnection] = Listener("kafka", self.config.frame_timeout_ms)
        self.connections = self.listener.connections
        self.held_bytes = 0          # sum of every connection's `held`
        self.limit_closes = 0        # connections closed for a limit (memory, frame timeout, connections)
        self.refusals = Throttled(logger)

    async def start(self, host: str, port: int) -> None:
        context = None if self.tls is None else server_context(self.tls, self.node.data_dir)
        await self.listener.start(lambda: KafkaConnection(self), host, port, context)
        self.groups.start()

    @property
    def port(self) -> int:
        return self.listener.port

    async def close(self) -> None:
        await self.listener.close()
        await self.groups.close()
        await self.handler.close()


class KafkaConnection(asyncio.Protocol):
    def __init__(self, service: KafkaService) -> None:
        self.service = service
        self.handler = service.handler
        self.transport: asyncio.Transport | None = None
        self.frames = RequestFrames(MAX_REQUEST_BYTES)
        self.queue: deque[memoryview] = deque()
        self.held = 0                 # bytes of this connection counted in service.held_bytes
        self.waiting_since: float | None = None   # a frame is due since then (None: none, or reading paused)
        self.wake = asyncio.Event()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.reading_paused = False
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        service = self.service
        if len(service.connections) >= service.config.max_connections:
            service.limit_closes += 1
            service.refusals.warning("refusing a Kafka connection from %s: %d are open (max_connections)",
                                     transport.get_extra_info("peername"), len(service.connections))
            transport.abort()
            return
        service.connections.add(self)
        # The connection's authentication state lives in its serving task's context (epochlog/kafka/sasl.py).
        peercert = transport.get_extra_info("peercert")
        caller = Caller(certificate=certificate_principal(peercert),
                        node=certificate_node(peercert, service.node.cluster))
        session = KafkaSession(caller, authenticated=caller.certificate is not None or caller.node is not None)
        context = contextvars.copy_context()
        context.run(SESSION.set, session)
        self.task = asyncio.get_running_loop().create_task(self._serve(), context=context)

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)
        if self.task is not None:
            self.task.cancel()
        self._release()
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self._count(len(data)):    # every byte received is held until its request is answered
            return
        try:
            frames = self.frames.feed(data)
        except FrameTooLarge as exc:
            self._close(str(exc))
            return
        if frames:
            self.queue.extend(frames)
            self.wake.set()
        if len(self.queue) >= MAX_QUEUED_REQUESTS and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        self._frame_due(complete=bool(frames))

    def _count(self, grown: int) -> bool:
        """Count `grown` more bytes held against the node's budget; False when that would pass it (the
        connection is then closed)."""
        service = self.service
        budget = service.config.partial_frames_bytes
        if service.held_bytes + grown > budget:
            self.close_for_limit(f"the node's memory for Kafka requests (partial_frames_bytes = {budget}) is in use: "
                                 f"{service.held_bytes} bytes held over {len(service.connections)} connections; this "
                                 f"one holds {self.held} and needs {grown} more")
            return False
        service.held_bytes += grown
        self.held += grown
        return True

    def _uncount(self, size: int) -> None:
        size = min(size, self.held)
        self.held -= size
        self.service.held_bytes -= size

    def _release(self) -> None:
        """Give back everything this connection holds (it is closing)."""
        self._uncount(self.held)
        self.frames.clear()
        self.queue.clear()
        self.waiting_since = None

    def _frame_due(self, complete: bool) -> None:
        """Since when the frame being received is due (the sweeper closes it past frame_timeout_ms)."""
        if not self.frames.pending_bytes or self.reading_paused:
            self.waiting_since = None
        elif complete or self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def overdue(self) -> str:
        return f"a request frame ({self.frames.pending_bytes} bytes so far)"

    def close_for_limit(self, reason: str) -> None:
        self.service.limit_closes += 1
        self.service.refusals.warning("closing Kafka connection %s: %s", self._peer(), reason)
        self._release()
        if self.transport is not None:
            self.transport.close()

    def _close(self, reason: str) -> None:
        logger.warning("closing Kafka connection %s: %s", self._peer(), reason)
        self._release()
        if self.transport is not None:
            self.transport.close()

    def _peer(self) -> str:
        peer = None if self.transport is None else self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

    async def _serve(self) -> None:
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                while self.queue:
                    frame = self.queue.popleft()
                    if self.reading_paused and len(self.queue) < MAX_QUEUED_REQUESTS // 2:
                        assert self.transport is not None
                        self.reading_paused = False
                        self.transport.resume_reading()
                        self._frame_due(complete=True)
                    try:
                        response = await self.handler.handle(frame)
                    except UnsupportedRequestError as exc:
                        self._close(str(exc))
                        return
                    except Exception:  # noqa: BLE001 - a bug must not take the node down
                        logger.exception("Kafka request failed")
                        self._close("internal error")
                        return
                    finally:
                        self._uncount(len(frame) + 4)   # answered (or failed): its memory is free
                    if response is None:
                        continue
                    if self.transport is None or self.transport.is_closing():
                        return
                    self.transport.writelines(response)
                    if not self.can_write.is_set():
                        await self.can_write.wait()
        except asyncio.CancelledError:
            pass


def brokers_of(configs: Any, member: Any) -> dict[int, Broker]:
    """The Kafka brokers Metadata lists: every configured member with a `kafka_address` (and this
    node's own entry when it is not a configured member)."""
    from eventlog.raft.runtime.config import parse_address

    members = {m.id: m for m in configs.cluster.members}
    members.setdefault(member.id, member)
    brokers = {}
    for m in members.values():
        if m.kafka_address:
            host, port = parse_address(m.kafka_address, f"cluster.members[{m.id}].kafka_address")
            brokers[m.id] = Broker(m.id, host, port)
    return brokers
