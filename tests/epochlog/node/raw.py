"""A raw native-protocol connection for tests: frames of any msgpack (or any bytes), not the SDK's.

What QA did to the nodes: hand-built frames over a plain socket. Blocking, with a timeout on every
read; `frame()` returns the decoded msgpack of the next frame as plain Python values (no protocol
types), or None when the server closed the connection.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.error
import urllib.request
from typing import Any

import msgspec


def frame_bytes(payload: Any) -> bytes:
    data = msgspec.msgpack.encode(payload)
    return struct.pack(">I", len(data)) + data


class RawConnection:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(timeout)
        self._buf = b""

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, payload: Any) -> None:
        self.send_bytes(frame_bytes(payload))

    def hello(self) -> dict[str, Any]:
        self.send({"type": "client_hello", "version": 1, "client": "raw-test"})
        reply = self.frame()
        assert isinstance(reply, dict) and reply.get("type") == "server_hello" and not reply["error"], reply
        return reply

    def _read(self, n: int) -> bytes | None:
        while len(self._buf) < n:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def frame(self) -> Any:
        head = self._read(4)
        if head is None:
            return None
        (n,) = struct.unpack(">I", head)
        body = self._read(n)
        return None if body is None else msgspec.msgpack.decode(body)

    def replies(self, ids: set[int], timeout: float = 10.0) -> dict[int, list[Any]]:
        """Replies ([id, result, error]) until every id in `ids` has one; by id."""
        got: dict[int, list[Any]] = {}
        deadline = time.monotonic() + timeout
        while not ids <= set(got):
            assert time.monotonic() < deadline, f"no reply for {ids - set(got)}"
            f = self.frame()
            assert f is not None, f"connection closed before replies for {ids - set(got)}"
            assert f.get("type") == "replies", f
            for reply in f["replies"]:
                got[reply[0]] = reply
        return got

    def call(self, rid: int, call: dict[str, Any], timeout_ms: int = 10_000) -> list[Any]:
        self.send({"type": "requests", "requests": [[rid, call, timeout_ms]]})
        return self.replies({rid}, timeout_ms / 1000 + 5)[rid]

    def closed(self, timeout: float = 5.0) -> bool:
        """Whether the server closes the connection within `timeout` (what it sent before is dropped)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def http_get(address: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of GET http://address/path (the admin endpoint)."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
