"""A raw peer connection for tests: someone who speaks the peer protocol to a node's peer port.

What QA did to the nodes (issue 18): connect to a peer port, answer the node's hello with the
cluster name and any node id, then send batches of hand-built Raft messages. Framing and message
types are the transport's own (eventlog/raft/runtime/transport.py): a 4-byte length, then a msgpack
`Hello` or `Batch` of (group, message). The node answers a peer it accepted on that connection, so
`received()` shows what it sent to the id this connection claimed.

Plain TCP, or TLS with a client context (`tls`: once peers use mutual TLS, a certificate the node
accepts, e.g. one the cluster's CA issued to a node that is not a member). `accepted()` says whether
the node took the hello. Blocking, with a timeout on every read.
"""

from __future__ import annotations

import socket
import ssl
import time

import msgspec

from eventlog.raft.runtime.transport import Batch, Hello, encode_frame
from eventlog.raft.types import Message

_FRAME = msgspec.msgpack.Decoder(Hello | Batch)


class RawPeer:
    def __init__(self, address: str, cluster: str, node_id: int, timeout: float = 5.0,
                 first: tuple[str, list[Message]] | None = None, tls: ssl.SSLContext | None = None) -> None:
        """Connect and say hello as `node_id`; `first`: a batch (group, messages) sent in the same
        write as the hello (it reaches the node before it can act on the hello)."""
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = tls.wrap_socket(sock) if tls is not None else sock
        self.sock.settimeout(timeout)
        self._buf = b""
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
            except (ConnectionError, ssl.SSLError, OSError):
                data = b""
            if not data:
                self.closed_by_node = True
                return
            self._buf += data
            while len(self._buf) >= 4 and len(self._buf) >= 4 + int.from_bytes(self._buf[:4], "big"):
                end = 4 + int.from_bytes(self._buf[:4], "big")
                try:
                    self.frames.append(_FRAME.decode(self._buf[4:end]))
                except msgspec.DecodeError:
                    self.closed_by_node = True
                self._buf = self._buf[end:]

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

    def close(self, linger: float = 0.3) -> None:
        """Close once the node had `linger` seconds to read what was sent: closing with unread data
        (e.g. TLS session tickets) resets the connection, and a reset may beat the node's read."""
        self._pump(linger)
        self.sock.close()
