"""A client certificate as the credential (issue 21): with `[clients.tls] require_client_cert`, the
principal of a native or gRPC call is the subject of the certificate the handshake verified, and a native
write sent to a follower is applied under that name after the follower forwarded it.

Real `epochlog serve` processes (3 members, gRPC on), real TLS on 127.0.0.1, certificates of a real
cluster CA: `alice` holds `writer kv:app/`, `mallory` holds no grant, and neither has a token."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from epochlog.client import Client
from epochlog.client.errors import ClientError, PermissionDeniedError
from epochlog.client.tls import ClientTls
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.support.secured import secured_cluster
from tests.support.wait import wait_until

NAME = "certs-test"
CALL_S = 10.0


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    with secured_cluster(tmp_path_factory.mktemp("client-certs"), NAME, clients=("alice", "mallory"),
                         require_client_cert=True, size=3, seed=23, grpc=True) as cluster:
        with Client(cluster.endpoints) as admin:   # the harness: the admin by its certificate
            admin.command(ev.AclGranted(principal="alice", role="writer", resource="kv:app/"))
            admin.put("other/x", b"theirs")
        yield cluster


def _tls(cluster: NodeCluster, who: str | None) -> ClientTls:
    ca = str(cluster.root / "ca" / "ca.crt")
    if who is None:
        return ClientTls(ca)
    return ClientTls(ca, str(cluster.root / who / f"{who}.crt"), str(cluster.root / who / f"{who}.key"))


def _actor(cluster: NodeCluster, group: str, offset: int) -> str:
    with Client(cluster.endpoints) as admin:
        return ev.decode_event(admin.read_events(group, offset, max_events=1).events[0].value).actor


def test_the_native_principal_is_the_certificate_on_every_member(certified: NodeCluster) -> None:
    leader = certified.leader("kv")
    for node_id in certified.nodes:   # the leader, and followers that forward the write to it
        with Client([certified.endpoint(node_id)], timeout=CALL_S, tls=_tls(certified, "alice")) as alice:
            written = alice.put(f"app/n{node_id}", b"1")
            assert _actor(certified, written.group, written.offset) == "alice", (node_id, leader)
            with pytest.raises(PermissionDeniedError, match="alice may not write kv/other/x"):
                alice.put("other/x", b"mine")
    with Client(certified.endpoints, timeout=CALL_S, tls=_tls(certified, "mallory")) as mallory:
        with pytest.raises(PermissionDeniedError):
            mallory.get("app/n1")
    with Client(certified.endpoints) as admin:
        assert admin.get("other/x").value == b"theirs"


def test_without_a_client_certificate_nothing_is_served(certified: NodeCluster) -> None:
    with Client(certified.endpoints, timeout=3.0, tls=_tls(certified, None)) as anonymous:
        with pytest.raises(ClientError):
            anonymous.put("app/anonymous", b"no")
    with Client(certified.endpoints) as admin:
        assert admin.get("app/anonymous") is None


def _grpc_put(cluster: NodeCluster, who: str | None, name: str) -> str:
    """Put `app/<name>` through the kv leader's gRPC face with `who`'s certificate: "OK" or the status.
    gRPC does not forward a write (a follower names the leader), so a leader that changed meanwhile (an
    election on a loaded machine) is asked again."""
    root = cluster.root
    ca = (root / "ca" / "ca.crt").read_bytes()
    credentials = grpc.ssl_channel_credentials(ca) if who is None else grpc.ssl_channel_credentials(
        ca, private_key=(root / who / f"{who}.key").read_bytes(),
        certificate_chain=(root / who / f"{who}.crt").read_bytes())

    def put() -> str | None:
        leader = cluster.leader("kv")
        with grpc.secure_channel(cluster.nodes[leader].grpc_address, credentials,
                                 options=[("grpc.ssl_target_name_override", f"node-{leader}")]) as channel:
            try:
                pb_grpc.EpochlogStub(channel).Put(pb.PutRequest(name=f"app/{name}", value=b"1"), timeout=CALL_S)
                return "OK"
            except grpc.RpcError as exc:
                return None if "is not the leader" in (exc.details() or "") else exc.code().name

    return wait_until(put, 60.0, f"a gRPC put of app/{name} answered by the kv leader")


def test_the_grpc_principal_is_the_certificate(certified: NodeCluster) -> None:
    assert _grpc_put(certified, "alice", "g") == "OK"
    assert _grpc_put(certified, "mallory", "m") == "PERMISSION_DENIED"
    assert _grpc_put(certified, None, "none") == "UNAVAILABLE"   # refused at the handshake
    with Client(certified.endpoints) as admin:
        written = admin.get("app/g")
        assert written is not None and admin.get("app/m") is None and admin.get("app/none") is None
    assert _actor(certified, "kv", written.version) == "alice"
