"""Peer transport: one connection per pair of nodes, carrying the messages of every group.

Wire format: frames of a 4-byte big-endian length followed by a msgpack payload (msgspec), inside
TLS (see below) unless `[cluster.tls] insecure`:

- `Hello(cluster, node, read_index, features)`: the first frame in each direction. `read_index` says the
  sender takes a follower's ReadIndex (eventlog/raft/types.py): a node of an older version does not (its
  hello lacks the field), and would close a connection carrying one (a message it cannot decode is
  `bad_frame`), so during a rolling upgrade a follower asks only a leader that said so (`reads_index`).
  `features` (name -> the newest level the sender supports, as Kafka's ApiVersions lists supported
  features) is opaque here: the node's owner reads it (`peer_features`; e.g. the views format level a
  group's leader may raise to, statemachines/views_format.py). An older node's hello has none, and an
  older node ignores the field.
- `Batch(msgs=[(group, message), ...])`: every message queued for that peer during one turn of the
  event loop (`send` only queues; the flush is scheduled once per turn), or up to a `flush` the Ready
  loop asks for where latency matters more (a leader's appends, a follower's acknowledgements), in
  frames of at most FRAME_SPLIT_BYTES (a single message larger than that goes alone: `largest_frame_bytes`).

Who the peer is (docs/security.md; eventlog.raft.runtime.tls). With TLS, the default, every
connection is mutual TLS 1.3 verified against the cluster CA, and the peer is the node its
certificate names: a certificate of another cluster, of a client, or (when dialing) of another node
than the one dialed is refused, and so is a hello that claims another node id than the certificate.
`deliver` gets the certificate's node id. Without TLS (`insecure`) the hello's claim is believed.
Either way a hello naming another cluster, this node, or a removed node is refused.

Limits of the peer port (`PeerLimitsConfig`; each closes the offending connection, counts it in
`closes.counts[reason]` and logs a WARNING, at most one per reason every LOG_INTERVAL_S with the number
not logged since):

- `unauthenticated_connections`: accepted connections that have not completed their TLS handshake
  and hello; one more is closed as soon as it is accepted (reason `unauthenticated_connections`);
- `hello_timeout_ms`: the TLS handshake and the hello must be done this long after the accept (or
  the dial) (`hello_timeout`); a failed handshake is `tls_handshake`;
- before its hello a connection may send a frame of HELLO_MAX_BYTES at most; after it MAX_FRAME_BYTES;
  a bigger length, or a payload that does not decode, is `bad_frame`; a refused identity `identity`;
- `frame_timeout_ms`: a frame must be complete this long after its first byte (`frame_timeout`);
- `partial_frames_bytes`: the bytes of frames not yet complete, summed over every connection; a
  connection that would take the sum past it is closed (`partial_frames`) and its bytes freed.

Connections are accepted by this module (`sock_accept`, then `connect_accepted_socket` with the TLS
context) rather than by `create_server`, so a connection counts, and can be refused, from its accept
on, before and during its handshake; the same code runs on asyncio's loop and on uvloop.

The node with the lower id dials, the other accepts, so a pair shares exactly one connection; the
dialer reconnects with exponential backoff. A message for a peer that is not connected is dropped:
Raft retransmits what matters (appends, heartbeats, votes).

Peers change at runtime (`add_peer`, `remove_peer`: membership changes). A connection is accepted
from any node of the cluster except a removed one, since a node added at runtime may know a peer
before that peer learns its address. For the same reason a node added at runtime (`dial_lower_ms`
set) also dials a lower-id peer it has had no connection to for that long: the lower node may not
know its address yet. The lower id's connection is the canonical one: it replaces any other, and a
second connection from the higher id is closed when one already exists. (Nodes of the configured
member list never dial lower ids, so the proxies of tests/support/proxy.py see every connection.)

Runs on one asyncio loop; `send` and `close` must be called from it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgspec

from eventlog.cancellation import cancel_and_wait
from eventlog.config import LogConfig
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.config import PeerLimitsConfig
from eventlog.raft.runtime.tls import Identity, PeerTls, peer_identity
from eventlog.raft.types import Message

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 256 << 20      # any frame, once the hello is done
HELLO_MAX_BYTES = 4096           # a frame before the hello (a hello is a cluster name and a node id)
FRAME_SPLIT_BYTES = 4 << 20      # a flush cuts its batch into frames of about this size
LOG_INTERVAL_S = 10.0            # at most one WARNING per reason for closing a connection this often
READ_BUFFER_BYTES = 64 << 10     # each connection's receive buffer (see _Connection)


class Hello(msgspec.Struct, tag="hello"):
    cluster: str
    node: int
    read_index: bool = False   # takes ReadIndex messages (absent from an older node's hello)
    features: dict[str, int] = {}   # feature -> the newest level the sender supports (absent: none)


class Batch(msgspec.Struct, tag="batch"):
    msgs: list[tuple[str, Message]]


Frame = Hello | Batch
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)

Deliver = Callable[[int, str, Message], None]


def encode_frame(frame: Frame) -> bytearray:
    """The frame's length and payload, encoded in place after a 4-byte gap for the length: no second copy
    of the payload to prepend it (an Append's frame holds every entry's bytes; a copy of a frame of a few
    hundred KiB into fresh memory costs its page faults, ~0.4 ms for 450 KiB on the bench machine)."""
    buf = bytearray(4)
    _encoder.encode_into(frame, buf, 4)
    _LENGTH.pack_into(buf, 0, len(buf) - 4)
    return buf


def encode_batches(msgs: list[tuple[str, Message]], split_bytes: int = FRAME_SPLIT_BYTES) -> list[bytearray]:
    """`msgs` as Batch frames of at most `split_bytes` each, in order (a message bigger than that alone)."""
    frame = encode_frame(Batch(msgs))
    if len(frame) <= split_bytes or len(msgs) == 1:
        return [frame]
    half = len(msgs) // 2
    return encode_batches(msgs[:half], split_bytes) + encode_batches(msgs[half:], split_bytes)


def largest_frame_bytes(raft: RaftConfig, log: LogConfig) -> int:
    """The largest frame a member sends with these settings: a flush is cut at FRAME_SPLIT_BYTES, but one
    message goes whole: an append (max_append_bytes of entries, or one entry of up to a log batch) or a
    snapshot chunk; plus msgpack's framing of the entries (an entry's flow-control size already counts 32
    bytes of it) and the message's own fields."""
    message = max(raft.max_append_bytes, log.batch_limit_bytes + 32, raft.snapshot_chunk_bytes)
    return max(FRAME_SPLIT_BYTES, message + message // 8 + (64 << 10))


class FrameReader:
    """Splits a byte stream into frames (sans-IO: `feed` bytes, then take frames with `next_frame`).

    `max_frame_bytes` may change between frames (the transport raises it once the hello is done).
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes received of frames not yet taken (the next frame's, complete or not)."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | memoryview) -> None:
        self._buf += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes come; ValueError or msgspec.DecodeError
        for a frame too long or one that does not decode."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos >= 4:
            (n,) = _LENGTH.unpack_from(buf, pos)
            if n > self.max_frame_bytes:
                raise ValueError(f"a frame of {n} bytes exceeds the limit of {self.max_frame_bytes}")
            end = pos + 4 + n
            if len(buf) >= end:
                frame = _decoder.decode(memoryview(buf)[pos + 4:end])
                self._pos = end
                return frame
        if pos:   # keep only the incomplete frame (at most one copy of it: pos is 0 afterwards)
            del buf[:pos]
            self._pos = 0
        return None

    def frames(self, data: bytes) -> list[Frame]:
        """Feed `data` and take every frame it completes (tests and tools)."""
        self.feed(data)
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out


class ConnectionCloses:
    """Counts the peer connections closed for a limit or an identity problem, by reason, and logs them:
    the first of each reason at once, then at most one every LOG_INTERVAL_S (saying how many were not
    logged), so a flood of bad connections cannot flood the log."""

    def __init__(self, node_id: int, clock: Callable[[], float]) -> None:
        self.node_id = node_id
        self.counts: dict[str, int] = defaultdict(int)
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = defaultdict(int)

    def record(self, reason: str, what: str) -> None:
        self.counts[reason] += 1
        now = self._clock()
        last = self._logged_at.get(reason)
        if last is not None and now - last < LOG_INTERVAL_S:
            self._unlogged[reason] += 1
            return
        self._logged_at[reason] = now
        skipped = self._unlogged.pop(reason, 0)
        more = f" ({skipped} more closed for {reason} since the last such line)" if skipped else ""
        logger.warning("node %s: closing peer connection (%s): %s%s", self.node_id, reason, what, more)


class _Connection(asyncio.BufferedProtocol):
    """One peer connection. A BufferedProtocol: the TLS layer (asyncio's and uvloop's) decrypts straight
    into `get_buffer`'s fixed buffer, where a plain Protocol costs a 256 KiB allocation and an
    SSLWantReadError per read; the bytes are then fed to the FrameReader."""

    def __init__(self, owner: PeerTransport, dialed_peer: int | None, address: Any = None) -> None:
        self.owner = owner
        self.peer = dialed_peer            # known up front when we dialed; else from the hello
        self.dialed = dialed_peer is not None
        self.address = address             # the remote (host, port) when accepted
        self.since = owner.loop.time()     # the TLS handshake and the hello are due hello_timeout after this
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(HELLO_MAX_BYTES)
        self.closed: asyncio.Future[None] = owner.loop.create_future()
        self.ready = False                 # the hello was accepted
        self.peer_reads_index = False      # its hello said it takes ReadIndex messages
        self.peer_features: dict[str, int] = {}   # its hello's features
        self.certified: int | None = None  # the node id of the peer's certificate (TLS)
        self.counted = 0                   # this connection's part of owner.partial_bytes
        self.frame_since: float | None = None   # when the incomplete frame's first byte came (after the hello)
        self.holds_slot = False            # counted in owner.unauthenticated
        self._received = memoryview(bytearray(READ_BUFFER_BYTES))

    def describe(self) -> str:
        who = f"node {self.peer}" if self.peer is not None else "an unidentified peer"
        if self.address is None and self.transport is not None:
            self.address = self.transport.get_extra_info("peername")
        where = f"{self.address[0]}:{self.address[1]}" if isinstance(self.address, tuple) else "?"
        return f"{'to' if self.dialed else 'from'} {who} ({where})"

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        owner = self.owner
        owner._live.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        if owner.tls is not None:
            problem = self._check_certificate(peer_identity(transport.get_extra_info("peercert")))
            if problem:
                self.refuse("identity", problem)
                return
        transport.write(encode_frame(Hello(owner.cluster, owner.node_id, read_index=True, features=owner.features)))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._received

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._received[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        reader = self.reader
        reader.feed(data)
        completed = False
        while True:
            try:
                frame = reader.next_frame()
            except (ValueError, msgspec.DecodeError) as exc:
                self.refuse("bad_frame", str(exc))
                return
            if frame is None:
                break
            completed = True
            if isinstance(frame, Batch):
                if not self.ready:
                    self.refuse("bad_frame", "a batch before the hello")
                    return
                peer, deliver = self.peer, self.owner.deliver
                assert peer is not None
                for group, msg in frame.msgs:
                    deliver(peer, group, msg)
            elif self.ready:
                self.refuse("bad_frame", "a second hello")
                return
            elif not self._hello(frame):
                return
            if transport.is_closing():   # closed by what was delivered (a peer removed)
                return
        if self._within_budget():
            self._frame_due(completed)

    def connection_lost(self, exc: Exception | None) -> None:
        owner = self.owner
        owner._live.discard(self)
        self._release_partial()
        self.release_slot()
        owner._detach(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # --- identity -----------------------------------------------------------------------------

    def _check_certificate(self, who: Identity | str) -> str:
        """Why the peer's certificate is refused ("" when it names a member of this cluster, the one
        dialed when we dialed)."""
        if isinstance(who, str):
            return who
        if who.cluster != self.owner.cluster:
            return f"its certificate is of cluster {who.cluster!r} ({who.uri})"
        node = who.node_id
        if node is None:
            return f"its certificate names a {who.kind}, not a member ({who.uri})"
        if self.dialed and node != self.peer:
            return f"dialed node {self.peer}, its certificate names node {node}"
        self.certified = node
        return ""

    def _hello(self, hello: Hello) -> bool:
        owner = self.owner
        claimed = hello.node
        if hello.cluster != owner.cluster:
            problem = f"its hello names cluster {hello.cluster!r}"
        elif self.certified is not None and claimed != self.certified:
            problem = f"its hello claims node {claimed}, its certificate names node {self.certified}"
        elif claimed < 1 or claimed == owner.node_id:
            problem = f"its hello claims node id {claimed}"
        elif claimed in owner.removed:
            problem = f"node {claimed} was removed from the cluster"
        elif self.dialed and claimed != self.peer:
            problem = f"dialed node {self.peer}, its hello claims node {claimed}"
        else:
            problem = ""
        if problem:
            self.refuse("identity", problem)
            return False
        self.peer = claimed
        self.peer_reads_index = hello.read_index
        self.peer_features = hello.features
        self.ready = True
        self.release_slot()
        self.reader.max_frame_bytes = MAX_FRAME_BYTES
        owner._attach(self)
        return True

    # --- limits -------------------------------------------------------------------------------

    def _within_budget(self) -> bool:
        """Count the bytes held for the incomplete frame against the node's budget; False when the
        connection was closed for needing more than the budget leaves."""
        owner = self.owner
        pending = self.reader.pending_bytes
        grown = pending - self.counted
        if grown > 0 and owner.partial_bytes + grown > owner.limits.partial_frames_bytes:
            self.refuse("partial_frames", f"partial_frames_bytes = {owner.limits.partial_frames_bytes} would be "
                        f"exceeded: {owner.partial_bytes} bytes held over all peer connections, this one needs "
                        f"{pending}")
            return False
        owner.partial_bytes += grown
        self.counted = pending
        return True

    def _frame_due(self, completed: bool) -> None:
        """When the frame being received started (the sweeper closes it past frame_timeout_ms). Before
        the hello the hello timeout applies instead."""
        if not self.ready:
            return
        if self.reader.pending_bytes == 0:
            self.frame_since = None
        elif completed or self.frame_since is None:
            self.frame_since = self.owner.loop.time()

    def _release_partial(self) -> None:
        """Give back this connection's part of the budget, and the memory behind it."""
        self.owner.partial_bytes -= self.counted
        self.counted = 0
        self.frame_since = None
        if self.reader.pending_bytes:
            self.reader = FrameReader(self.reader.max_frame_bytes)

    def release_slot(self) -> None:
        if self.holds_slot:
            self.holds_slot = False
            self.owner.unauthenticated -= 1

    def refuse(self, reason: str, problem: str) -> None:
        """Close the connection for `reason` (counted and logged at a bounded rate)."""
        self.owner.closes.record(reason, f"{self.describe()}: {problem}")
        self._release_partial()
        self.abort()

    def write(self, data: bytes | bytearray) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class PeerTransport:
    """Connections to every peer of one node, shared by all of its Raft groups.

    `tls`: the contexts of eventlog.raft.runtime.tls, or None for plaintext peers (`insecure`).
    """

    def __init__(self, node_id: int, cluster: str, peers: dict[int, tuple[str, int]], listen: tuple[str, int],
                 deliver: Deliver, *, tls: PeerTls | None, limits: PeerLimitsConfig | None = None,
                 backoff_ms: tuple[int, int] = (50, 2000), dial_lower_ms: int = 0,
                 features: dict[str, int] | None = None) -> None:
        self.node_id = node_id
        self.features = dict(features or {})   # what this node's hello advertises
        self.cluster = cluster
        self.peers = {p: a for p, a in peers.items() if p != node_id}
        self.removed: set[int] = set()   # refused until added again
        self.listen = listen
        self.deliver = deliver
        self.tls = tls
        self.limits = limits or PeerLimitsConfig()
        self.loop = asyncio.get_running_loop()
        self.closes = ConnectionCloses(node_id, self.loop.time)
        self.partial_bytes = 0    # sum of every connection's counted partial frame
        self.unauthenticated = 0  # accepted connections not past their hello (handshakes included)
        self._hello_s = self.limits.hello_timeout_ms / 1000
        self._backoff = backoff_ms
        self._dial_lower = dial_lower_ms / 1000   # 0: never dial a lower id (see the module docstring)
        self._conns: dict[int, _Connection] = {}
        self._live: set[_Connection] = set()      # every connection made (TLS done) and not lost
        self._last_connected: dict[int, float] = {}   # peer -> when a connection to it was last up
        self._queues: dict[int, list[tuple[str, Message]]] = defaultdict(list)
        self._flush_scheduled = False
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()   # accept loops, handshakes, the sweeper
        self._dialers: dict[int, asyncio.Task[None]] = {}
        self._started = False
        self._closing = False
        self.dropped = 0  # messages dropped for want of a connection

    @property
    def port(self) -> int:
        """The port listened on (the configured one, or the one the kernel chose for port 0)."""
        return int(self._listeners[0].getsockname()[1])

    async def start(self) -> None:
        host, port = self.listen
        infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self._listeners.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(128)
                sock.setblocking(False)
        except OSError:
            self._close_listeners()
            raise
        self._started = True
        for sock in self._listeners:
            self._spawn(self._accept(sock), "peer-accept")
        self._spawn(self._sweep(), "peer-limits")
        for peer in sorted(self.peers):
            self._start_dialer(peer)

    def _spawn(self, coro: Any, name: str) -> None:
        task = self.loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, address = await self.loop.sock_accept(listener)
            except OSError as exc:   # out of file descriptors, a connection reset while queued...
                self.closes.record("accept_failed", f"accept failed: {exc}")
                await asyncio.sleep(0.1)
                continue
            limit = self.limits.unauthenticated_connections
            if self.unauthenticated >= limit:
                self.closes.record("unauthenticated_connections",
                                   f"from {address}: {self.unauthenticated} connections are not authenticated "
                                   f"yet (unauthenticated_connections = {limit})")
                sock.close()
                continue
            self.unauthenticated += 1
            conn = _Connection(self, None, address)
            conn.holds_slot = True
            self._spawn(self._handshake(conn, sock), "peer-handshake")

    async def _handshake(self, conn: _Connection, sock: socket.socket) -> None:
        """Make `sock` a connection: TLS first (within the hello timeout), then the protocol's hello."""
        try:
            if self.tls is None:
                await self.loop.connect_accepted_socket(lambda: conn, sock)
            else:
                await self.loop.connect_accepted_socket(lambda: conn, sock, ssl=self.tls.server,
                                                        ssl_handshake_timeout=self._hello_s)
        except OSError as exc:   # ssl.SSLError, a handshake timeout, a reset
            conn.release_slot()
            late = self.loop.time() - conn.since >= self._hello_s
            self.closes.record("hello_timeout" if late else "tls_handshake",
                               f"{conn.describe()}: TLS handshake failed: {exc or type(exc).__name__}")
        except asyncio.CancelledError:
            conn.release_slot()
            raise

    async def _sweep(self) -> None:
        """Close connections past their hello or frame timeout: a pass every quarter of the shorter."""
        hello_s = self._hello_s
        frame_s = self.limits.frame_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, hello_s / 4, frame_s / 4))
            now = self.loop.time()
            for conn in list(self._live):
                if not conn.ready:
                    if now - conn.since > hello_s:
                        conn.refuse("hello_timeout", f"no hello within hello_timeout_ms "
                                                     f"({self.limits.hello_timeout_ms} ms)")
                elif conn.frame_since is not None and now - conn.frame_since > frame_s:
                    conn.refuse("frame_timeout", f"a frame ({conn.reader.pending_bytes} bytes so far) did not "
                                                 f"arrive in full within frame_timeout_ms "
                                                 f"({self.limits.frame_timeout_ms} ms)")

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

    def reads_index(self, peer: int) -> bool:
        """Whether a ReadIndex may be sent to `peer`: its hello said it takes one, or it is not connected
        (the message would be dropped: the read waits for its deadline, as for any lost message)."""
        conn = self._conns.get(peer)
        return conn is None or conn.peer_reads_index

    def peer_features(self, peer: int) -> dict[str, int] | None:
        """The features `peer`'s hello advertised on its current connection ({}: none, an older version),
        or None when it is not connected (not known now)."""
        conn = self._conns.get(peer)
        return None if conn is None else conn.peer_features

    def send(self, peer: int, group: str, msg: Message) -> None:
        """Queue `msg` for `peer`; everything queued in this loop turn goes out in one flush."""
        self._queues[peer].append((group, msg))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write what is queued now rather than at the end of the turn: for messages whose latency
        matters more than sharing a write (a leader's appends before it writes its own log, a
        follower's acknowledgements). The flush already scheduled writes whatever is queued after this."""
        if self._queues:
            self._write_queued()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_queued()

    def _write_queued(self) -> None:
        queues, self._queues = self._queues, defaultdict(list)
        for peer, msgs in queues.items():
            conn = self._conns.get(peer)
            if conn is None:
                self.dropped += len(msgs)
                continue
            for frame in encode_batches(msgs):
                conn.write(frame)

    async def _dial(self, peer: int) -> None:
        host, port = self.peers[peer]
        canonical = self.node_id < peer
        delay = self._backoff[0] / 1000
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl": self.tls.client, "server_hostname": "", "ssl_handshake_timeout": self._hello_s}
        self._last_connected.setdefault(peer, self.loop.time())
        while not self._closing:
            if not canonical:
                # Only when the lower node has not connected for a while (it may not know us).
                idle = self.loop.time() - self._last_connected.get(peer, 0.0)
                if peer in self._conns or idle < self._dial_lower:
                    await asyncio.sleep(max(0.05, self._dial_lower - idle))
                    continue
            try:
                _, conn = await self.loop.create_connection(lambda: _Connection(self, peer), host, port, **tls)
            except OSError as exc:
                if isinstance(exc, ssl.SSLError):
                    self.closes.record("tls_handshake", f"to node {peer} ({host}:{port}): TLS handshake failed: "
                                                        f"{exc}")
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

    def _close_listeners(self) -> None:
        for sock in self._listeners:
            sock.close()
        self._listeners.clear()

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._dialers.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        for conn in list(self._live):
            conn.abort()
        await cancel_and_wait(tasks)
        self._close_listeners()
