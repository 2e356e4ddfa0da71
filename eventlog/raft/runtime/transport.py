"""Peer transport: one TCP connection per pair of nodes, carrying the messages of every group.

Wire format: frames of a 4-byte big-endian length followed by a msgpack payload (msgspec):

- `Hello(cluster, node)`: the first frame in each direction; a connection from an unknown node or
  another cluster is closed.
- `Batch(msgs=[(group, message), ...])`: every message queued for that peer during one turn of the
  event loop goes out in one frame (`send` only queues; the flush is scheduled once per turn).

The node with the lower id dials, the other accepts, so a pair shares exactly one connection; the
dialer reconnects with exponential backoff. A message for a peer that is not connected is dropped:
Raft retransmits what matters (appends, heartbeats, votes).

Peers change at runtime (`add_peer`, `remove_peer`: membership changes). A connection is accepted
from any node of the cluster except a removed one, since a node added at runtime may know a peer
before that peer learns its address. For the same reason a node added at runtime (`dial_lower_ms`
set) also dials a lower-id peer it has had no connection to for that long: the lower node may not
know its address yet. The lower id's connection is the canonical one: it replaces any other, and a
second connection from the higher id is closed when one already exists. (Nodes of the configured
member list never dial lower ids, so the proxies of tests/runtime see every connection.)

Runs on one asyncio loop; `send` and `close` must be called from it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import defaultdict
from collections.abc import Callable

import msgspec

from eventlog.raft.types import Message

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 256 << 20


class Hello(msgspec.Struct, tag="hello"):
    cluster: str
    node: int


class Batch(msgspec.Struct, tag="batch"):
    msgs: list[tuple[str, Message]]


Frame = Hello | Batch
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)

Deliver = Callable[[int, str, Message], None]


def encode_frame(frame: Frame) -> bytes:
    payload = _encoder.encode(frame)
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into frames (sans-IO: feed bytes, get decoded frames)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        buf = self._buf
        while len(buf) - self._pos >= 4:
            (n,) = _LENGTH.unpack_from(buf, self._pos)
            if n > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
            end = self._pos + 4 + n
            if len(buf) < end:
                break
            frames.append(_decoder.decode(memoryview(buf)[self._pos + 4:end]))
            self._pos = end
        if self._pos and self._pos * 2 >= len(buf):
            del buf[: self._pos]
            self._pos = 0
        return frames


class _Connection(asyncio.Protocol):
    def __init__(self, owner: PeerTransport, dialed_peer: int | None) -> None:
        self.owner = owner
        self.peer = dialed_peer            # known up front when we dialed
        self.dialed = dialed_peer is not None
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader()
        self.closed: asyncio.Future[None] = owner.loop.create_future()
        self.ready = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(encode_frame(Hello(self.owner.cluster, self.owner.node_id)))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except (ValueError, msgspec.DecodeError) as exc:
            logger.warning("node %s: bad frame from peer %s: %s", self.owner.node_id, self.peer, exc)
            self.abort()
            return
        for frame in frames:
            if isinstance(frame, Batch):
                if not self.ready:
                    self.abort()
                    return
                assert self.peer is not None
                for group, msg in frame.msgs:
                    self.owner.deliver(self.peer, group, msg)
            elif not self.ready:
                self._handshake(frame)

    def _handshake(self, hello: Hello) -> None:
        owner = self.owner
        if hello.cluster != owner.cluster or hello.node == owner.node_id or hello.node in owner.removed or (
                self.peer is not None and hello.node != self.peer):
            logger.warning("node %s: refusing connection from node %s of cluster %r", owner.node_id,
                           hello.node, hello.cluster)
            self.abort()
            return
        self.peer = hello.node
        self.ready = True
        owner._attach(self)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._detach(self)
        if not self.closed.done():
            self.closed.set_result(None)


class PeerTransport:
    """Connections to every peer of one node, shared by all of its Raft groups."""

    def __init__(self, node_id: int, cluster: str, peers: dict[int, tuple[str, int]], listen: tuple[str, int],
                 deliver: Deliver, *, backoff_ms: tuple[int, int] = (50, 2000), dial_lower_ms: int = 0) -> None:
        self.node_id = node_id
        self.cluster = cluster
        self.peers = {p: a for p, a in peers.items() if p != node_id}
        self.removed: set[int] = set()   # refused until added again
        self.listen = listen
        self.deliver = deliver
        self.loop = asyncio.get_running_loop()
        self._backoff = backoff_ms
        self._dial_lower = dial_lower_ms / 1000   # 0: never dial a lower id (see the module docstring)
        self._conns: dict[int, _Connection] = {}
        self._last_connected: dict[int, float] = {}   # peer -> when a connection to it was last up
        self._queues: dict[int, list[tuple[str, Message]]] = defaultdict(list)
        self._flush_scheduled = False
        self._server: asyncio.base_events.Server | None = None
        self._dialers: dict[int, asyncio.Task[None]] = {}
        self._started = False
        self._closing = False
        self.dropped = 0  # messages dropped for want of a connection

    async def start(self) -> None:
        host, port = self.listen
        self._server = await self.loop.create_server(lambda: _Connection(self, None), host, port,
                                                     reuse_address=True)
        self._started = True
        for peer in sorted(self.peers):
            self._start_dialer(peer)

    def add_peer(self, peer: int, address: tuple[str, int]) -> None:
        """Know (or re-address) `peer`: dial it when this node is the one that dials."""
        if peer == self.node_id:
            return
        self.removed.discard(peer)
        if self.peers.get(peer) == address:
            return
        self.peers[peer] = address
        task = self._dialers.pop(peer, None)
        if task is not None:
            task.cancel()   # it dials the old address
        self._start_dialer(peer)

    def remove_peer(self, peer: int) -> None:
        """Forget `peer` (removed from the cluster): stop dialing it, close its connection, refuse it."""
        if peer == self.node_id:
            return
        self.removed.add(peer)
        self.peers.pop(peer, None)
        task = self._dialers.pop(peer, None)
        if task is not None:
            task.cancel()
        conn = self._conns.get(peer)
        if conn is not None:
            conn.abort()

    def _start_dialer(self, peer: int) -> None:
        if not self._started or self._closing or peer in self._dialers:
            return
        if self.node_id < peer or self._dial_lower:
            self._dialers[peer] = self.loop.create_task(self._dial(peer), name=f"dial-{peer}")

    def connected(self, peer: int) -> bool:
        return peer in self._conns

    def send(self, peer: int, group: str, msg: Message) -> None:
        """Queue `msg` for `peer`; everything queued in this loop turn goes out as one frame."""
        self._queues[peer].append((group, msg))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        queues, self._queues = self._queues, defaultdict(list)
        for peer, msgs in queues.items():
            conn = self._conns.get(peer)
            if conn is None:
                self.dropped += len(msgs)
                continue
            conn.write(encode_frame(Batch(msgs)))

    async def _dial(self, peer: int) -> None:
        host, port = self.peers[peer]
        canonical = self.node_id < peer
        delay = self._backoff[0] / 1000
        self._last_connected.setdefault(peer, self.loop.time())
        while not self._closing:
            if not canonical:
                # Only when the lower node has not connected for a while (it may not know us).
                idle = self.loop.time() - self._last_connected.get(peer, 0.0)
                if peer in self._conns or idle < self._dial_lower:
                    await asyncio.sleep(max(0.05, self._dial_lower - idle))
                    continue
            try:
                _, conn = await self.loop.create_connection(lambda: _Connection(self, peer), host, port)
            except OSError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1] / 1000)
                if not canonical:
                    self._last_connected[peer] = self.loop.time()   # knock again after dial_lower_ms
                continue
            await conn.closed
            if not self._closing:
                await asyncio.sleep(self._backoff[0] / 1000)
            delay = self._backoff[0] / 1000

    def _attach(self, conn: _Connection) -> None:
        assert conn.peer is not None
        old = self._conns.get(conn.peer)
        if old is not None and old is not conn:
            dialed_by_lower = (self.node_id < conn.peer) == conn.dialed
            if not dialed_by_lower:
                conn.abort()   # keep the connection we have; the lower id's replaces any other
                return
            old.abort()
        self._conns[conn.peer] = conn
        self._last_connected[conn.peer] = self.loop.time()

    def _detach(self, conn: _Connection) -> None:
        if conn.peer is not None and self._conns.get(conn.peer) is conn:
            del self._conns[conn.peer]
            self._last_connected[conn.peer] = self.loop.time()

    async def close(self) -> None:
        self._closing = True
        for task in self._dialers.values():
            task.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
        for task in self._dialers.values():
            try:
                await task
            except asyncio.CancelledError:
                pass
