"""TLS of the native client face (epochlog/face_tls.py, epochlog/client/tls.py), real TLS over real
sockets on 127.0.0.1: a node with [clients.tls] on serves the SDK over TLS verified against the cluster
CA, refuses plaintext and a client that trusts another CA, and reads a client certificate's name."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from epochlog.certs import ClusterCA
from epochlog.client import Client, ClientError
from epochlog.client.tls import CA_ENV, ClientTls
from epochlog.face_tls import ClientTlsConfig, certificate_principal, server_context
from tests.support.nodes import NodeCluster


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> NodeCluster:
    root = tmp_path_factory.mktemp("tls-cluster")
    cluster = NodeCluster(root, size=1, seed=7, clients={"tls": {"enabled": True}, "access": {"enforce": False}})
    mp = pytest.MonkeyPatch()
    mp.setenv(CA_ENV, str(root / "ca" / "ca.crt"))   # the harness's own SDK clients speak TLS too
    try:
        cluster.start()
        for group in cluster.groups:
            cluster.leader(group)
        yield cluster
    finally:
        mp.undo()
        cluster.close()
        print(cluster.describe())


def test_the_sdk_speaks_tls_verified_against_the_cluster_ca(tls_cluster: NodeCluster) -> None:
    ca = str(tls_cluster.root / "ca" / "ca.crt")
    with Client(tls_cluster.endpoints, tls=ClientTls(ca)) as c:
        written = c.put("tls/a", b"1")
        assert c.get("tls/a").value == b"1" and written.offset >= 0


def test_plaintext_and_another_ca_are_refused(tls_cluster: NodeCluster, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CA_ENV, raising=False)
    with Client(tls_cluster.endpoints, timeout=2.0) as c:
        with pytest.raises(ClientError):
            c.get("tls/a")
    other = ClusterCA.create(tmp_path / "other-ca", "node-test")   # same cluster name, another key
    # The call retries until its deadline and raises the last failure seen: 5 s lets at least one handshake
    # fail verification on a loaded machine (with 2 s the call could end before any did).
    with Client(tls_cluster.endpoints, timeout=5.0, tls=ClientTls(str(tmp_path / "other-ca" / "ca.crt"))) as c:
        with pytest.raises(ClientError, match="certificate verify failed"):
            c.get("tls/a")
    assert other.cluster == "node-test"


def test_a_client_certificate_of_another_ca_is_refused_at_the_handshake(tls_cluster: NodeCluster,
                                                                        tmp_path: Path) -> None:
    other = ClusterCA.create(tmp_path / "other-ca", "node-test")
    files = other.issue_client("mallory", tmp_path / "mallory")
    ca = str(tls_cluster.root / "ca" / "ca.crt")
    with Client(tls_cluster.endpoints, timeout=2.0, tls=ClientTls(ca, str(files.cert), str(files.key))) as c:
        with pytest.raises(ClientError):
            c.get("tls/a")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> dict | None:
    """A real TLS handshake over a loopback TCP connection; the server side's view of the client cert."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, object] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with server.wrap_socket(conn, server_side=True) as tls:
            seen["cert"] = tls.getpeercert()
            tls.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with socket.create_connection(listener.getsockname()) as raw, client.wrap_socket(raw) as tls:
        tls.sendall(b"x")
        thread.join(10)
    listener.close()
    return seen.get("cert")  # type: ignore[return-value]


def test_the_principal_of_a_client_certificate(tmp_path: Path) -> None:
    ca = ClusterCA.create(tmp_path / "ca", "prod")
    ca.issue_member(1, tmp_path / "node-1" / "tls")
    alice = ca.issue_client("alice", tmp_path / "clients")
    server = server_context(ClientTlsConfig(enabled=True), tmp_path / "node-1")
    assert server is not None
    with_cert = ClientTls(str(tmp_path / "ca" / "ca.crt"), str(alice.cert), str(alice.key)).context()
    assert certificate_principal(_handshake(server, with_cert)) == "alice"
    without = ClientTls(str(tmp_path / "ca" / "ca.crt")).context()
    assert certificate_principal(_handshake(server, without)) is None
    # a member certificate names no client principal
    member = ClientTls(str(tmp_path / "ca" / "ca.crt"), str(tmp_path / "node-1" / "tls" / "node.crt"),
                       str(tmp_path / "node-1" / "tls" / "node.key")).context()
    assert certificate_principal(_handshake(server, member)) is None
    assert server_context(ClientTlsConfig(enabled=False), tmp_path) is None
