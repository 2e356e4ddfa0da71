"""Authentication and authorization enforced on the native and gRPC faces (issue 21), on a real node
with [clients.tls] and [clients.access] enforce = true: real TLS on 127.0.0.1, the SDK and a real gRPC
channel, users and grants written as events by the bootstrap admin (a super user by its certificate).

Each attack of the issue is refused whoever sends it (admin included for the controller's decisions),
each allowed call works, and a grant or a user removed takes effect at the next call."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from epochlog.client import Client
from epochlog.client.errors import AuthenticationError, PermissionDeniedError
from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, ClientTls
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from statemachines import credentials as cr
from statemachines import events as ev
from tests.support.nodes import ROOT, NodeCluster
from tests.support.secured import secured_cluster
from tests.support.wait import wait_until

NAME = "node-test"
ALICE_TOKEN = "eltok_alice-secret"
OLD_TOKEN = "eltok_expired"
CAROL_TOKEN = "eltok_carol-auditor"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    with secured_cluster(tmp_path_factory.mktemp("access-cluster"), NAME, clients=("mallory",), size=1, seed=11,
                         grpc=True) as cluster:
        with Client(cluster.endpoints) as c:
            now_ms = int(time.time() * 1000)
            c.command(ev.UserAdded(name="alice", tokens=(cr.BearerToken(sha256=cr.token_digest(ALICE_TOKEN)),)))
            c.command(ev.UserAdded(name="old", tokens=(cr.BearerToken(sha256=cr.token_digest(OLD_TOKEN),
                                                                      expires_ms=now_ms - 1000),)))
            c.command(ev.AclGranted(principal="alice", role="writer", resource="kv:app/"))
            c.command(ev.AclGranted(principal="old", role="admin"))
            c.command(ev.UserAdded(name="carol", tokens=(cr.BearerToken(sha256=cr.token_digest(CAROL_TOKEN)),)))
            c.command(ev.AclGranted(principal="carol", role="auditor"))
            c.put("other/x", b"theirs")
        yield cluster


def _tls(cluster: NodeCluster, who: str | None = None) -> ClientTls:
    ca = str(cluster.root / "ca" / "ca.crt")
    if who is None:
        return ClientTls(ca)
    return ClientTls(ca, str(cluster.root / who / f"{who}.crt"), str(cluster.root / who / f"{who}.key"))


def _client(cluster: NodeCluster, *, who: str | None = None, token: str = "") -> Client:
    return Client(cluster.endpoints, timeout=5.0, tls=_tls(cluster, who), token=token)


def _actor(c: Client, written: object) -> str:
    events = c.read_events(written.group, written.offset, max_events=1)   # type: ignore[attr-defined]
    return ev.decode_event(events.events[0].value).actor


def test_without_credentials_or_with_wrong_ones_nothing_is_served(secured: NodeCluster) -> None:
    for token in ("", "eltok_wrong", OLD_TOKEN):   # none, unknown, expired
        with _client(secured, token=token) as c:
            with pytest.raises(AuthenticationError):
                c.get("app/x")
            with pytest.raises(AuthenticationError):
                c.put("app/x", b"no")
    with _client(secured, who="admin") as c:
        assert c.get("app/x") is None   # nothing of a refused write was appended


def test_a_writer_writes_its_prefix_only_and_signs_with_its_own_name(secured: NodeCluster) -> None:
    with _client(secured, token=ALICE_TOKEN) as alice:
        written = alice.put("app/x", b"1")
        assert alice.get("app/x").value == b"1"
        claimed = alice.command(ev.KvPut(name="app/y", value=b"2", actor="admin"))   # claims another actor
        with pytest.raises(PermissionDeniedError, match="alice may not write kv/other/x"):
            alice.delete("other/x")                                  # another application's key
        with pytest.raises(PermissionDeniedError):
            alice.put("other/y", b"no")
        with pytest.raises(PermissionDeniedError):
            alice.member_remove(1)                                   # membership: admin only
        with pytest.raises(PermissionDeniedError):
            alice.transfer_leader("metadata")
        with pytest.raises(PermissionDeniedError):
            alice.read_events("metadata", 0)                         # whole logs: admin or auditor
    with _client(secured, who="admin") as admin:
        assert admin.get("other/x").value == b"theirs" and admin.get("other/y") is None
        assert _actor(admin, written) == "alice" and _actor(admin, claimed) == "alice"


CONTROLLER_ONLY = [
    ev.BrokerRegistered(cluster="c", group="broker-a", name="b1", address="6.6.6.6:10911", incarnation="evil",
                        broker_id=0, broker_epoch=99),                                   # the broker hijack
    ev.BrokerFenced(cluster="c", group="broker-a", name="b2", broker_epoch=1),           # fencing another broker
    ev.MasterElected(cluster="c", group="broker-a", master=-1, master_epoch=9),          # clearing a master
    ev.MemberAdded(node_id=9, peer_address="6.6.6.6:1", client_address="6.6.6.6:2"),    # a node's own record
]


@pytest.mark.parametrize("event", CONTROLLER_ONLY, ids=lambda e: type(e).__name__)
def test_controller_decisions_are_refused_to_every_client_admin_included(secured: NodeCluster,
                                                                         event: ev.Event) -> None:
    for who, token in (("admin", ""), (None, ALICE_TOKEN)):
        with _client(secured, who=who, token=token) as c:
            with pytest.raises(PermissionDeniedError):
                c.command(event)
    with _client(secured, who="admin") as admin:
        assert admin.get_entity(event.key()) is None


def test_a_certificate_without_grants_may_do_nothing(secured: NodeCluster) -> None:
    with _client(secured, who="mallory") as c:
        with pytest.raises(PermissionDeniedError, match="no role is granted"):
            c.get("app/x")
        with pytest.raises(PermissionDeniedError):
            c.status()


def test_a_revoked_grant_and_a_removed_user_stop_working_at_the_next_call(secured: NodeCluster) -> None:
    with _client(secured, who="admin") as admin:
        admin.command(ev.UserAdded(name="bob", tokens=(cr.BearerToken(sha256=cr.token_digest("eltok_bob")),)))
        admin.command(ev.AclGranted(principal="bob", role="writer", resource="kv:bob/"))
        with _client(secured, token="eltok_bob") as bob:
            wait_until(lambda: _put(bob) == "ok", timeout=10, what="bob's grant applied")
            admin.command(ev.AclRevoked(principal="bob", role="writer", resource="kv:bob/"))
            wait_until(lambda: _put(bob) == "permission_denied", timeout=10, what="bob's revoked grant refused")
            admin.command(ev.AclGranted(principal="bob", role="writer", resource="kv:bob/"))
            wait_until(lambda: _put(bob) == "ok", timeout=10, what="bob's grant back")
            admin.command(ev.UserRemoved(name="bob"))
            wait_until(lambda: _put(bob) == "unauthenticated", timeout=10, what="bob's token refused")


def _put(c: Client) -> str:
    """What a put of bob's key gets: ok or the refusal's code."""
    try:
        c.put("bob/1", b"x")
        return "ok"
    except (PermissionDeniedError, AuthenticationError) as exc:
        return exc.code


# --- gRPC -------------------------------------------------------------------------------------------

def _channel(cluster: NodeCluster, token: str) -> tuple[grpc.Channel, list[tuple[str, str]]]:
    ca = (cluster.root / "ca" / "ca.crt").read_bytes()
    channel = grpc.secure_channel(cluster.nodes[1].grpc_address, grpc.ssl_channel_credentials(ca),
                                  options=[("grpc.ssl_target_name_override", "node-1")])
    return channel, ([("authorization", f"Bearer {token}")] if token else [])


def test_grpc_takes_a_bearer_token_over_tls_and_refuses_as_the_native_face(secured: NodeCluster) -> None:
    channel, alice = _channel(secured, ALICE_TOKEN)
    with channel:
        stub = pb_grpc.EpochlogStub(channel)
        written = stub.Put(pb.PutRequest(name="app/g", value=b"1", actor="admin"), metadata=alice, timeout=5)
        assert stub.Get(pb.GetRequest(key="app/g"), metadata=alice, timeout=5).HasField("item")
        for call, code in (
                (lambda: stub.Get(pb.GetRequest(key="app/g"), timeout=5), grpc.StatusCode.UNAUTHENTICATED),
                (lambda: stub.Get(pb.GetRequest(key="app/g"), metadata=[("authorization", "Bearer nope")],
                                  timeout=5), grpc.StatusCode.UNAUTHENTICATED),
                (lambda: stub.Delete(pb.DeleteRequest(name="other/x"), metadata=alice, timeout=5),
                 grpc.StatusCode.PERMISSION_DENIED),
                (lambda: stub.MemberRemove(pb.MemberRemoveRequest(node_id=1), metadata=alice, timeout=5),
                 grpc.StatusCode.PERMISSION_DENIED),
                (lambda: stub.Batch(pb.BatchRequest(ops=[pb.BatchOp(put=pb.PutRequest(name="app/b", value=b"1")),
                                                         pb.BatchOp(put=pb.PutRequest(name="other/b", value=b"1"))]),
                                    metadata=alice, timeout=5), grpc.StatusCode.PERMISSION_DENIED),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == code, refused.value
    with _client(secured, who="admin") as admin:
        assert admin.get("other/x").value == b"theirs" and admin.get("app/b") is None   # the batch: all or nothing
        events = admin.read_events(written.group, written.offset, max_events=1)
        assert ev.decode_event(events.events[0].value).actor == "alice"


def test_plaintext_grpc_is_refused(secured: NodeCluster) -> None:
    with grpc.insecure_channel(secured.nodes[1].grpc_address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.EpochlogStub(channel).Status(pb.StatusRequest(), timeout=3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_denials_are_counted_by_principal_operation_and_resource(secured: NodeCluster) -> None:
    with _client(secured, token=ALICE_TOKEN) as alice:
        with pytest.raises(PermissionDeniedError):
            alice.put("other/z", b"no")
    with _client(secured) as anonymous:
        with pytest.raises(AuthenticationError):
            anonymous.get("app/x")
    samples = secured.wait_metrics(1)
    denied = {dict(labels)["principal"]: value for (name, labels), value in samples.items()
              if name == "epochlog_access_denied_total"}
    assert denied.get("alice", 0) >= 1 and denied.get("anonymous", 0) >= 1, denied


def _admin_get(cluster: NodeCluster, path: str, *, who: str | None = None, token: str = "") -> tuple[int, bytes]:
    request = urllib.request.Request(cluster.admin_url(1, path),
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=_tls(cluster, who).context()) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_admin_endpoint_is_tls_and_metrics_need_admin_or_auditor(secured: NodeCluster) -> None:
    assert secured.admin_url(1, "/metrics").startswith("https://")
    host, port = secured.nodes[1].admin_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as plain:   # plaintext HTTP: no answer in HTTP
        plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            reply = plain.recv(65536)
        except ConnectionResetError:
            reply = b""
        assert not reply.startswith(b"HTTP/") and b"epochlog_" not in reply, reply[:200]
    assert _admin_get(secured, "/metrics")[0] == 401                                    # no credential
    assert _admin_get(secured, "/metrics", token="eltok_wrong")[0] == 401              # an unknown token
    assert _admin_get(secured, "/metrics", token=OLD_TOKEN)[0] == 401                  # an expired one
    assert _admin_get(secured, "/metrics", who="mallory")[0] == 403                     # no role
    assert _admin_get(secured, "/metrics", token=ALICE_TOKEN)[0] == 403                # a writer
    for credentials in ({"who": "admin"}, {"token": CAROL_TOKEN}):                      # admin, auditor
        status, body = _admin_get(secured, "/metrics", **credentials)
        assert status == 200 and b"epochlog_access_denied_total" in body, (credentials, status)
    # Health probes stay open (over TLS): a kubelet or load balancer probes without credentials.
    assert _admin_get(secured, "/healthz") == (200, b"ok\n")
    assert _admin_get(secured, "/readyz")[0] == 200


def _cli(cluster: NodeCluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`epochlog ARGS --endpoints ... --json` as a real process whose environment holds no credential but `env`."""
    clean = {k: v for k, v in os.environ.items() if k not in (CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV)}
    return subprocess.run([sys.executable, "-m", "epochlog", *args, "--endpoints", ",".join(cluster.endpoints),
                           "--json", "--timeout", "3"], capture_output=True, text=True, cwd=ROOT,
                          env={**clean, **env}, timeout=60)


def test_the_cli_takes_tls_and_token_options_with_the_sdk_variables_meaning(secured: NodeCluster) -> None:
    ca = str(secured.root / "ca" / "ca.crt")
    admin = [f"--{kind}={secured.root / 'admin' / f'admin.{ext}'}" for kind, ext in (("cert", "crt"), ("key", "key"))]
    plaintext = _cli(secured, "get", "app/cli")
    assert plaintext.returncode == 3, plaintext
    anonymous = _cli(secured, "get", "app/cli", "--tls-ca", ca)
    assert anonymous.returncode == 3 and "no credential" in anonymous.stderr, anonymous
    put = _cli(secured, "put", "app/cli", "by-alice", "--tls-ca", ca, "--token", ALICE_TOKEN)
    assert put.returncode == 0, put
    denied = _cli(secured, "put", "other/cli", "no", "--tls-ca", ca, "--token", ALICE_TOKEN)
    assert denied.returncode == 3 and "alice may not write kv/other/cli" in denied.stderr, denied
    # the variables mean the same; an option wins over its variable
    by_env = _cli(secured, "get", "app/cli", **{CA_ENV: ca, TOKEN_ENV: ALICE_TOKEN})
    assert by_env.returncode == 0 and json.loads(by_env.stdout)["value"] == "by-alice", by_env
    option_wins = _cli(secured, "get", "app/cli", "--token", ALICE_TOKEN, **{CA_ENV: ca, TOKEN_ENV: "eltok_wrong"})
    assert option_wins.returncode == 0, option_wins
    as_admin = _cli(secured, "get", "other/x", "--tls-ca", ca, *admin)   # a client certificate: the admin
    assert as_admin.returncode == 0 and json.loads(as_admin.stdout)["value"] == "theirs", as_admin
    half = _cli(secured, "get", "app/cli", "--tls-ca", ca, admin[0])
    assert half.returncode == 64 and "--cert and --key together" in half.stderr, half
    with _client(secured, who="admin") as c:
        assert c.get("other/cli") is None
        written = c.read_events("kv", json.loads(put.stdout)["offset"], max_events=1)
        assert ev.decode_event(written.events[0].value).actor == "alice"
