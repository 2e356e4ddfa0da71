"""A blocking Kafka protocol client for tests: kafka-python's protocol classes over a plain socket (or
TLS, then SASL/PLAIN), so a test controls every field (sequences, CRCs, versions, acks) that the real
clients choose."""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)


class RawKafka:
    def __init__(self, address: str, timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = sock if tls is None else tls.wrap_socket(sock)
        self.correlation_id = 0

    def sasl_plain(self, user: str, password: str) -> tuple[int, str | None]:
        """SaslHandshake v1 (PLAIN), then one SaslAuthenticate: its (error code, error message)."""
        handshake = self.call(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1)
        assert handshake.error_code == 0, handshake
        answer = self.call(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()),
                           SaslAuthenticateResponse, 1)
        return answer.error_code, answer.error_message

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: Any, version: int) -> int:
        self.correlation_id += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.correlation_id, client_id="raw-test")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        return self.correlation_id

    def send_bytes(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def receive(self, response_class: Any, version: int, correlation_id: int | None = None) -> Any:
        (size,) = struct.unpack(">i", self._read(4))
        data = self._read(size)
        (cid,) = struct.unpack_from(">i", data)
        if correlation_id is not None:
            assert cid == correlation_id, (cid, correlation_id)
        flexible = response_class.flexible_version_q(version) and response_class.API_KEY != 18
        body = data[5:] if flexible else data[4:]
        return response_class.decode(body, version=version)

    def call(self, request: Any, response_class: Any, version: int) -> Any:
        return self.receive(response_class, version, self.send(request, version))

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection within `timeout` (reads EOF)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            out += chunk
        return bytes(out)
