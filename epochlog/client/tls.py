"""The SDK's side of the client faces' TLS (epochlog/face_tls.py is the server's).

The server presents its member certificate, which names a node of the cluster (a URI
`epochlog://<cluster>/node/<id>`), not a host: the SDK verifies the chain against the cluster CA and
then that the certificate names a node, instead of checking a host name. A client certificate of the
same CA (`epochlog certs client`) is the connection's principal. Environment: EPOCHLOG_TLS_CA,
EPOCHLOG_TLS_CERT, EPOCHLOG_TLS_KEY; a bearer token: EPOCHLOG_TOKEN.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any

from epochlog.client.errors import AuthenticationError, InvalidArgumentError

CA_ENV, CERT_ENV, KEY_ENV = "EPOCHLOG_TLS_CA", "EPOCHLOG_TLS_CERT", "EPOCHLOG_TLS_KEY"
TOKEN_ENV = "EPOCHLOG_TOKEN"
NODE_URI = "epochlog://"


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def from_env(cls) -> ClientTls | None:
        ca = os.environ.get(CA_ENV)
        if not ca:
            return None
        return cls(ca, os.environ.get(CERT_ENV) or None, os.environ.get(KEY_ENV) or None)

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False          # members are named by node id: see check_server
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cafile=self.ca_file)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise InvalidArgumentError(f"TLS files ({self.ca_file}, {self.cert_file}): {exc}") from None
        return context


def check_server(address: str, peercert: dict[str, Any] | None) -> None:
    """AuthenticationError unless the verified server certificate names a node (not a client of the same CA)."""
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith(NODE_URI) and "/node/" in value:
            return
    raise AuthenticationError(f"{address}: its certificate names no node of the cluster")
