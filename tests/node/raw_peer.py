"""A raw peer connection for tests: someone who speaks the peer protocol to a node's peer port.

What QA did to the nodes (issue 18): connect to a peer port, answer the node's hello with the
cluster name and any node id, then send batches of hand-built Raft messages. Framing and message
types are the transport's own (eventlog/raft/runtime/transport.py): a 4-byte length, then a msgpack
`Hello` or `Batch` of (group, message). The node answers a peer it accepted on that connection, so
`received()` shows what it sent to the id this connection claimed.

This is a plain TCP connection: once peers use mutual TLS, a node refuses it at the handshake
(`accepted()` says whether the node took the hello). Blocking, with a timeout on every read.
"""

from __future__ import annotations

import socket
import time

import msgspec

from eventlog.raft.runtime.transport import Batch, FrameReader, Hello, encode_frame
from eventlog.raft.types import Message


class RawPeer:
    def __init__(self, address: str, cluster: str, node_id: int, timeout: float = 5.0,
                 first: tuple[str, list[Message]] | None = None) -> None:
        """Connect and say hello as `node_id`; `first`: a batch (group, messages) sent in the same
        write as the hello (it reaches the node before it can act on the hello)."""
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(timeout)
        self.reader = FrameReader()
        self.frames: list[Hello | Batch] = []
        self.closed_by_node = False
        data = encode_frame(Hello(cluster, node_id))
        if first is not None:
            data += encode_frame(Batch([(first[0], m) for m in first[1]]))
        self.sock.sendall(data)

    def send(self, group: str, *msgs: Message) -> None:
        """One frame of messages for `group` (as a member's transport batches them)."""
        self.sock.sendall(encode_frame(Batch([(group, m) for m in msgs])))

    def _pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.closed_by_node:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                return
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed_by_node = True
                return
            try:
                self.frames += self.reader.feed(data)
            except (ValueError, msgspec.DecodeError):
                self.closed_by_node = True

    def accepted(self, timeout: float = 5.0) -> bool:
        """Whether the node sent its hello and kept the connection open for a moment."""
        deadline = time.monotonic() + timeout
        while not self.closed_by_node and not any(isinstance(f, Hello) for f in self.frames) \
                and time.monotonic() < deadline:
            self._pump(0.1)
        self._pump(0.3)
        return not self.closed_by_node and any(isinstance(f, Hello) for f in self.frames)

    def received(self, seconds: float = 0.5) -> list[tuple[str, Message]]:
        """Every (group, message) the node sent on this connection so far (waits `seconds` more)."""
        self._pump(seconds)
        return [gm for f in self.frames if isinstance(f, Batch) for gm in f.msgs]

    def close(self) -> None:
        self.sock.close()
