"""The server's name in the gRPC face's certificate, as a stock client checks it (issue 21): real grpcio
servers and channels over real TLS on 127.0.0.1, the node's own server credentials (face_tls.grpc_credentials)
and certificates of a real cluster CA.

A member certificate names node <id> by the DNS name `node-<id>` (and the URI the SDK checks). A gRPC
client that is told which node it dials (`grpc.ssl_target_name_override = "node-<id>"`) reaches that
node only: another member's certificate (a wrong name), a client certificate of the same CA (even one
named like the node), a certificate of another CA, or no name to check against (the address is not in
the certificate) are refused at the handshake."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from epochlog.certs import ClusterCA, IssuedFiles
from epochlog.face_tls import ClientTlsConfig, grpc_credentials, server_context
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from tests.support.ports import free_ports


class _Status(pb_grpc.EpochlogServicer):
    def Status(self, request: Any, context: Any) -> Any:   # noqa: N802 - the service's method name
        return pb.StatusResponse()


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> dict[str, IssuedFiles]:
    root = tmp_path_factory.mktemp("grpc-names")
    ca = ClusterCA.create(root / "ca", "names")
    return {"node-1": ca.issue_member(1, root / "node-1" / "tls"),
            "node-2": ca.issue_member(2, root / "node-2" / "tls"),
            "client named node-1": ca.issue_client("node-1", root / "client"),
            "node-1 of another CA": ClusterCA.create(root / "other-ca", "names").issue_member(1, root / "other")}


def _credentials(files: IssuedFiles) -> Any:
    """A member's: the node's own gRPC server credentials. Anything else: served as an impostor would."""
    if files.cert.name == "node.crt":
        config = ClientTlsConfig(enabled=True, cert_file=str(files.cert), key_file=str(files.key),
                                 ca_file=str(files.ca))
        try:
            return grpc_credentials(config, files.cert.parent)
        except Exception:   # noqa: BLE001 - a node refuses another CA's files at start: serve them anyway
            pass
    return grpc.ssl_server_credentials([(files.key.read_bytes(), files.cert.read_bytes())])


@pytest.fixture(scope="module")
def servers(issued: dict[str, IssuedFiles]) -> Iterator[dict[str, str]]:
    running, addresses = [], {}
    for label, files in issued.items():
        server = grpc.server(futures.ThreadPoolExecutor(2))
        pb_grpc.add_EpochlogServicer_to_server(_Status(), server)
        address = f"127.0.0.1:{free_ports(1)[0]}"
        server.add_secure_port(address, _credentials(files))
        server.start()
        running.append(server)
        addresses[label] = address
    yield addresses
    for server in running:
        server.stop(0)


def _status(address: str, ca: Path, name: str | None) -> str:
    options = [] if name is None else [("grpc.ssl_target_name_override", name)]
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes()), options=options) as channel:
        try:
            pb_grpc.EpochlogStub(channel).Status(pb.StatusRequest(), timeout=5)
            return "ok"
        except grpc.RpcError as exc:
            return exc.code().name


@pytest.mark.parametrize("serving, name, outcome", [
    ("node-1", "node-1", "ok"),
    ("node-2", "node-1", "UNAVAILABLE"),                # another member's certificate: a wrong name
    ("node-1", None, "UNAVAILABLE"),                    # the address 127.0.0.1 is not a name it holds
    ("client named node-1", "node-1", "UNAVAILABLE"),   # a client certificate of the same CA
    ("node-1 of another CA", "node-1", "UNAVAILABLE"),
])
def test_a_grpc_client_reaches_only_the_node_it_names(issued: dict[str, IssuedFiles], servers: dict[str, str],
                                                      serving: str, name: str | None, outcome: str) -> None:
    assert _status(servers[serving], issued["node-1"].ca, name) == outcome


def test_the_name_is_in_the_subject_alternative_name_not_only_the_common_name(
        issued: dict[str, IssuedFiles]) -> None:
    """A client that checks a host name against the SAN only, never the common name (RFC 6125; Go's
    crypto/tls; Python's ssl with hostname_checks_common_name off): a member certificate passes it for
    node-<id> and no other name."""
    files = issued["node-1"]
    context = server_context(ClientTlsConfig(enabled=True, cert_file=str(files.cert), key_file=str(files.key),
                                             ca_file=str(files.ca)), files.cert.parent)
    assert context is not None
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = ssl.create_default_context(cafile=str(files.ca))
        client.hostname_checks_common_name = False
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with client.wrap_socket(raw, server_hostname="node-1") as tls:
                assert tls.version() is not None
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with pytest.raises(ssl.SSLCertVerificationError, match="node-2"):
                client.wrap_socket(raw, server_hostname="node-2")
    finally:
        thread.join(timeout=5)
        listener.close()
