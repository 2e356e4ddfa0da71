"""The Kafka face's TCP server: frames in, `KafkaHandler` calls, response buffers out.

Like a Kafka broker, a connection's requests are handled one at a time, in order (a broker mutes
the channel while a request is in flight), so responses leave in request order. A response is
written with `writelines` (one writev under uvloop) of its header and the segment views that Fetch
returns. Frames above `MAX_REQUEST_BYTES`, unparsable requests and unsupported APIs or versions
close the connection, as a broker does; ApiVersions of a newer version is answered (error 35).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from typing import Any

from epochlog.kafka.groups import GroupCoordinator
from epochlog.kafka.errors import UnsupportedRequest
from epochlog.kafka.handler import Broker, KafkaHandler

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 100 << 20       # Kafka's socket.request.max.bytes default
MAX_QUEUED_REQUESTS = 64            # per connection: reading pauses beyond this (back pressure)


class KafkaService:
    """Serves the Kafka protocol for `node` on one address."""

    def __init__(self, node: Any, brokers: dict[int, Broker]) -> None:
        self.node = node
        self.handler = KafkaHandler(node, brokers, node.node_id)
        self.groups = GroupCoordinator(self.handler)
        self._server: asyncio.Server | None = None
        self.connections: set[KafkaConnection] = set()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: KafkaConnection(self), host, port, reuse_address=True)
        self.groups.start()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn.abort()
            await self._server.wait_closed()
        await self.groups.close()
        await self.handler.close()


class KafkaConnection(asyncio.Protocol):
    def __init__(self, service: KafkaService) -> None:
        self.service = service
        self.handler = service.handler
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.queue: deque[memoryview] = deque()
        self.wake = asyncio.Event()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.reading_paused = False
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.service.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)
        if self.task is not None:
            self.task.cancel()
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        buf = self.buffer
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = struct.unpack_from(">i", buf, pos)
            if size < 0 or size > MAX_REQUEST_BYTES:
                self._close(f"a request frame of {size} bytes exceeds {MAX_REQUEST_BYTES}")
                return
            if len(buf) - pos - 4 < size:
                break
            self.queue.append(memoryview(bytes(buf[pos + 4:pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        if self.queue:
            self.wake.set()
        if len(self.queue) >= MAX_QUEUED_REQUESTS and self.transport is not None and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True

    def _close(self, reason: str) -> None:
        logger.warning("closing Kafka connection: %s", reason)
        if self.transport is not None:
            self.transport.close()
        self.queue.clear()

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
                    try:
                        response = await self.handler.handle(frame)
                    except UnsupportedRequest as exc:
                        self._close(str(exc))
                        return
                    except Exception:  # noqa: BLE001 - a bug must not take the node down
                        logger.exception("Kafka request failed")
                        self._close("internal error")
                        return
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
