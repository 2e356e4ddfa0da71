"""Every call of every client face, each made by one principal its rule allows and one it refuses (issue 21),
on one real node with [clients.tls] and [clients.access] enforce = true: native calls through the SDK's
connection, gRPC methods through a real TLS channel, the Kafka API keys through kafka-python over SASL_SSL
and raw frames over TLS.

The allowed call must work (or fail for a reason that is not access, named in its row); the refused one
must get the face's own denial: native `permission_denied`, gRPC PERMISSION_DENIED, Kafka
TOPIC_AUTHORIZATION_FAILED (or, for the APIs that only need an authenticated connection, the connection
closed before any answer). The rows run in their order on one node (LeaseKeepAlive after LeaseGrant,
MemberRemove after MemberAdd)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import TopicAuthorizationFailedError

from epochlog.api import messages as p
from epochlog.certs import ClusterCA
from epochlog.client import AsyncClient, Client
from epochlog.client.errors import ClientError, PermissionDeniedError
from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, ClientTls
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from statemachines import credentials as cr
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.support.ports import free_ports

NAME = "node-test"
TOKENS = {who: f"eltok_{who}-secret" for who in ("admin", "app", "audit", "b2", "nobody")}
PASSWORDS = {"admin": "admin-pw", "app": "app-pw", "audit": "audit-pw", "nobody": "nobody-pw"}
GRANTS = [("app", "writer", "kv:app/"), ("audit", "auditor", ""), ("b2", "broker", "c/broker-a/b2")]
CALL_S = 10.0


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    root = tmp_path_factory.mktemp("access-faces")
    ca = ClusterCA.create(root / "ca", NAME)
    admin = ca.issue_client("admin", root / "admin")
    cluster = NodeCluster(root, size=1, seed=21, name=NAME, grpc=True, kafka=True,
                          clients={"tls": {"enabled": True},
                                   "access": {"enforce": True, "super_users": ["admin"]}})
    mp = pytest.MonkeyPatch()
    for key, value in ((CA_ENV, admin.ca), (CERT_ENV, admin.cert), (KEY_ENV, admin.key)):
        mp.setenv(key, str(value))
    mp.delenv(TOKEN_ENV, raising=False)
    try:
        cluster.start()
        for group in cluster.groups:
            cluster.leader(group)
        with Client(cluster.endpoints) as c:
            for who in sorted({*TOKENS, *PASSWORDS}):
                scram = tuple(cr.scram_credential(m, PASSWORDS[who], os.urandom(32)) for m in sorted(cr.MECHANISMS)) \
                    if who in PASSWORDS else ()
                tokens = (cr.BearerToken(sha256=cr.token_digest(TOKENS[who])),) if who in TOKENS else ()
                c.command(ev.UserAdded(name=who, scram=scram, tokens=tokens))
            for who, role, resource in GRANTS:
                c.command(ev.AclGranted(principal=who, role=role, resource=resource))
            c.put("other/x", b"theirs")
        yield cluster
    finally:
        mp.undo()
        cluster.close()
        print(cluster.describe())


def _ca(cluster: NodeCluster) -> str:
    return str(cluster.root / "ca" / "ca.crt")


def _native_tls(cluster: NodeCluster, who: str) -> tuple[ClientTls, str]:
    """The SDK's credentials of `who`: the admin by its certificate, the others by their tokens."""
    if who == "admin":
        d = cluster.root / "admin"
        return ClientTls(_ca(cluster), str(d / "admin.crt"), str(d / "admin.key")), ""
    return ClientTls(_ca(cluster)), TOKENS[who]


# --- native and gRPC: the calls of epochlog/api/messages.py -------------------------------------------

@dataclass(frozen=True)
class Row:
    call: Callable[[], p.Call]
    allowed: str
    denied: str
    fails_with: str = ""     # the allowed call's error when it cannot work here for a reason not of access


B2 = p.BrokerIdentity("c", "broker-a", "b2", "127.0.0.1:10911", "inc-1")
LEASE = 0x5EED
PEER_9 = f"127.0.0.1:{free_ports(1)[0]}"

NATIVE: dict[str, Row] = {
    "Write": Row(lambda: p.Write([ev.KvPut(name="app/w", value=b"1")]), "app", "nobody"),
    "Write-other-prefix": Row(lambda: p.Write([ev.KvPut(name="other/w", value=b"1")]), "admin", "app"),
    "Get": Row(lambda: p.Get("kv/app/w"), "app", "nobody"),
    "Gets": Row(lambda: p.Gets([p.Get("kv/app/w"), p.Get("kv/other/x")]), "audit", "app"),
    "List": Row(lambda: p.List(prefix="kv/app/"), "app", "nobody"),
    "History": Row(lambda: p.History("kv/other/x"), "audit", "app"),
    "LeaseGrant": Row(lambda: p.LeaseGrant(60_000, lease_id=LEASE), "app", "audit"),
    "LeaseKeepAlive": Row(lambda: p.LeaseKeepAlive(LEASE), "app", "audit"),
    "Watch": Row(lambda: p.Watch(prefix="kv/app/"), "app", "nobody"),
    "WatchAck": Row(lambda: p.WatchAck(999, 1), "app", "nobody"),
    "CancelWatch": Row(lambda: p.CancelWatch(999), "app", "nobody"),
    "ReadEvents": Row(lambda: p.ReadEvents("kv", 0, max_events=1), "audit", "app"),
    "Status": Row(lambda: p.Status(), "b2", "nobody"),
    "Ping": Row(lambda: p.Ping(), "app", "nobody"),
    "MemberList": Row(lambda: p.MemberList(), "audit", "nobody"),
    "RouteQuery": Row(lambda: p.RouteQuery("orders"), "app", "nobody", "not_found"),   # no such topic
    "BrokerList": Row(lambda: p.BrokerList(), "audit", "nobody"),
    "CompactionStatus": Row(lambda: p.CompactionStatus(), "audit", "app"),
    "Snapshot": Row(lambda: p.Snapshot("kv"), "admin", "audit"),
    "TransferLeader": Row(lambda: p.TransferLeader("kv", 1), "admin", "app"),
    "GroupSkip": Row(lambda: p.GroupSkip("kv", 1), "admin", "audit", "invalid_argument"),   # not halted
    "MemberAdd": Row(lambda: p.MemberAdd(9, PEER_9, auto_promote=False), "admin", "app"),
    "MemberPromote": Row(lambda: p.MemberPromote(1), "admin", "app"),
    "MemberRemove": Row(lambda: p.MemberRemove(9), "admin", "audit"),
    "BrokerRegister": Row(lambda: p.BrokerRegister([B2]), "b2", "app"),
    "BrokerHeartbeats": Row(lambda: p.BrokerHeartbeats([p.Heartbeat("c", "broker-a", "b2", 1, 0)]), "b2", "app"),
    "SyncStateSetReport": Row(lambda: p.SyncStateSetReport("c", "broker-a", "b2", 1, 1, 1, []), "b2", "audit",
                              "fenced"),   # the controller judges the epoch, after authorization
    "BrokerShutdown": Row(lambda: p.BrokerShutdown("c", "broker-a", "b2", 1), "b2", "app", "fenced"),
}


def test_the_table_covers_every_call() -> None:
    assert {type(row.call()) for row in NATIVE.values()} == set(p.Call.__args__)  # type: ignore[attr-defined]


async def _native(cluster: NodeCluster, who: str, call: p.Call) -> p.Result:
    tls, token = _native_tls(cluster, who)
    async with AsyncClient(cluster.endpoints, timeout=CALL_S, tls=tls, token=token, sessions=False) as client:
        return await client._call_on(cluster.endpoints[0], call)


@pytest.mark.parametrize("name", list(NATIVE))
def test_each_native_call_is_allowed_and_refused_by_its_rule(faces: NodeCluster, name: str) -> None:
    row = NATIVE[name]
    try:
        asyncio.run(_native(faces, row.allowed, row.call()))
        outcome = ""
    except ClientError as exc:
        outcome = exc.code
    assert outcome == row.fails_with, f"{name} by {row.allowed}: {outcome or 'ok'}"
    with pytest.raises(PermissionDeniedError):
        asyncio.run(_native(faces, row.denied, row.call()))


# --- gRPC: every method of the service ------------------------------------------------------------------

GRPC_LEASE = 0x6EED
GRPC_PEER_9 = f"127.0.0.1:{free_ports(1)[0]}"
PUT_APP = pb.PutRequest(name="app/g", value=b"1")


def _first(stream: Any) -> Any:
    """The first message of a server stream (then the stream is cancelled)."""
    try:
        return next(iter(stream))
    finally:
        stream.cancel()


def _session(stub: pb_grpc.EpochlogStub, metadata: list[tuple[str, str]], call: pb.SessionCall) -> Any:
    """One call over a Session stream: its reply; an error in the reply is raised as the unary face would."""
    (reply,) = _first(stub.Session(iter([pb.SessionRequest(calls=[call])]), metadata=metadata,
                                   timeout=CALL_S)).replies
    if reply.HasField("error"):
        raise SessionError(reply.error)
    return reply


class SessionError(Exception):
    def __init__(self, error: Any) -> None:
        super().__init__(error.message)
        self.error = error


GRPC: dict[str, tuple[Callable[[pb_grpc.EpochlogStub, list[tuple[str, str]]], Any], str, str, str]] = {
    # method: (the call, allowed, denied, the allowed call's non-access error or "")
    "Put": (lambda s, m: s.Put(PUT_APP, metadata=m, timeout=CALL_S), "app", "audit", ""),
    "Get": (lambda s, m: s.Get(pb.GetRequest(key="other/x"), metadata=m, timeout=CALL_S), "audit", "app", ""),
    "Delete": (lambda s, m: s.Delete(pb.DeleteRequest(name="app/g"), metadata=m, timeout=CALL_S),
               "app", "audit", ""),   # after Put
    "List": (lambda s, m: s.List(pb.ListRequest(prefix="app/"), metadata=m, timeout=CALL_S), "app", "nobody", ""),
    "History": (lambda s, m: s.History(pb.HistoryRequest(key="app/g"), metadata=m, timeout=CALL_S),
                "app", "nobody", ""),
    "Txn": (lambda s, m: s.Txn(pb.TxnRequest(conditions=[pb.Condition(key="other/none", version=0)],
                                             ops=[pb.TxnOp(put=PUT_APP)]), metadata=m, timeout=CALL_S),
            "admin", "app", ""),   # the condition reads another prefix
    "Command": (lambda s, m: s.Command(pb.CommandRequest(topic_created=pb.TopicCreated(name="g-orders")),
                                       metadata=m, timeout=CALL_S), "admin", "app", ""),
    "Batch": (lambda s, m: s.Batch(pb.BatchRequest(ops=[pb.BatchOp(put=PUT_APP)]), metadata=m, timeout=CALL_S),
              "app", "b2", ""),
    "LeaseGrant": (lambda s, m: s.LeaseGrant(pb.LeaseGrantRequest(ttl_ms=60_000, lease_id=GRPC_LEASE),
                                             metadata=m, timeout=CALL_S), "app", "audit", ""),
    "LeaseKeepAlive": (lambda s, m: s.LeaseKeepAlive(pb.LeaseKeepAliveRequest(lease_id=GRPC_LEASE), metadata=m,
                                                     timeout=CALL_S), "app", "audit", ""),
    "LeaseRevoke": (lambda s, m: s.LeaseRevoke(pb.LeaseRevokeRequest(lease_id=GRPC_LEASE), metadata=m,
                                               timeout=CALL_S), "app", "nobody", ""),
    "Watch": (lambda s, m: _first(s.Watch(pb.WatchRequest(prefix="app/"), metadata=m, timeout=CALL_S)),
              "app", "nobody", ""),
    "ReadEvents": (lambda s, m: s.ReadEvents(pb.ReadEventsRequest(group="kv", from_offset=0, max_events=1),
                                             metadata=m, timeout=CALL_S), "audit", "app", ""),
    "Status": (lambda s, m: s.Status(pb.StatusRequest(), metadata=m, timeout=CALL_S), "app", "nobody", ""),
    "CompactionStatus": (lambda s, m: s.CompactionStatus(pb.CompactionStatusRequest(), metadata=m, timeout=CALL_S),
                         "audit", "app", ""),
    "Snapshot": (lambda s, m: s.Snapshot(pb.SnapshotRequest(group="kv"), metadata=m, timeout=CALL_S),
                 "admin", "audit", ""),
    "TransferLeader": (lambda s, m: s.TransferLeader(pb.TransferLeaderRequest(group="kv", to=1), metadata=m,
                                                     timeout=CALL_S), "admin", "app", ""),
    "MemberList": (lambda s, m: s.MemberList(pb.MemberListRequest(), metadata=m, timeout=CALL_S),
                   "audit", "nobody", ""),
    "MemberAdd": (lambda s, m: s.MemberAdd(pb.MemberAddRequest(node_id=9, peer_address=GRPC_PEER_9,
                                                               manual_promote=True), metadata=m, timeout=CALL_S),
                  "admin", "app", ""),
    "MemberPromote": (lambda s, m: s.MemberPromote(pb.MemberPromoteRequest(node_id=1), metadata=m, timeout=CALL_S),
                      "admin", "app", ""),
    "MemberRemove": (lambda s, m: s.MemberRemove(pb.MemberRemoveRequest(node_id=9), metadata=m, timeout=CALL_S),
                     "admin", "audit", ""),
    "Session": (lambda s, m: _session(s, m, pb.SessionCall(id=1, put=PUT_APP)), "app", "nobody", ""),
}


def test_the_grpc_table_covers_every_method() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Epochlog"].methods}
    assert set(GRPC) == methods


def _grpc(cluster: NodeCluster, who: str, call: Callable[[pb_grpc.EpochlogStub, list[tuple[str, str]]], Any]) -> Any:
    ca = (cluster.root / "ca" / "ca.crt").read_bytes()
    with grpc.secure_channel(cluster.nodes[1].grpc_address, grpc.ssl_channel_credentials(ca),
                             options=[("grpc.ssl_target_name_override", "node-1")]) as channel:
        return call(pb_grpc.EpochlogStub(channel), [("authorization", f"Bearer {TOKENS[who]}")])


@pytest.mark.parametrize("name", list(GRPC))
def test_each_grpc_method_is_allowed_and_refused_by_its_rule(faces: NodeCluster, name: str) -> None:
    call, allowed, denied, fails_with = GRPC[name]
    try:
        _grpc(faces, allowed, call)
        outcome = ""
    except grpc.RpcError as exc:
        outcome = exc.code().name
    except SessionError as exc:
        outcome = exc.error.code
    assert outcome == fails_with, f"{name} by {allowed}: {outcome or 'ok'}"
    with pytest.raises((grpc.RpcError, SessionError)) as refused:
        _grpc(faces, denied, call)
    if isinstance(refused.value, SessionError):
        assert refused.value.error.code == "permission_denied" and refused.value.error.status == 7, refused.value
    else:
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value


# --- Kafka: every API key --------------------------------------------------------------------------------

OPEN_KAFKA_APIS = {17, 18, 36}   # SaslHandshake, ApiVersions, SaslAuthenticate: before authenticating


def _sasl(cluster: NodeCluster, user: str) -> dict[str, Any]:
    return {"bootstrap_servers": cluster.bootstrap, "security_protocol": "SASL_SSL", "ssl_cafile": _ca(cluster),
            "ssl_check_hostname": False, "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user], "request_timeout_ms": int(CALL_S * 1000)}


def _put(name: str) -> bytes:
    return ev.encode_event(ev.KvPut(name=name, value=b"k"))


def _produce(cluster: NodeCluster, who: str, name: str) -> Any:
    producer = KafkaProducer(acks="all", retries=0, max_block_ms=int(CALL_S * 1000), **_sasl(cluster, who))
    try:
        return producer.send("__kv", value=_put(name)).get(timeout=CALL_S)
    finally:
        producer.close(timeout=CALL_S)


def _fetch(cluster: NodeCluster, who: str, offset: int) -> list[Any]:
    consumer = KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=int(CALL_S * 1000), **_sasl(cluster, who))
    try:
        consumer.assign([TopicPartition("__kv", 0)])
        consumer.seek(TopicPartition("__kv", 0), offset)
        polled: list[Any] = []
        for _ in range(20):   # bounded: a record or an error within 20 polls of 0.5 s
            polled = [r for records in consumer.poll(timeout_ms=500).values() for r in records]
            if polled:
                return polled
        return polled
    finally:
        consumer.close()


def _create_topic(cluster: NodeCluster, who: str, name: str) -> None:
    admin = KafkaAdminClient(**_sasl(cluster, who))
    try:
        admin.create_topics({name: {"num_partitions": 1}})
    finally:
        admin.close()


def test_kafka_produce_fetch_and_create_topics_are_allowed_and_refused_by_the_rule(faces: NodeCluster) -> None:
    sent = _produce(faces, "app", "app/kafka")                   # a writer, in its prefix
    with pytest.raises(TopicAuthorizationFailedError):
        _produce(faces, "nobody", "app/kafka-nobody")            # no grant
    polled = _fetch(faces, "audit", sent.offset)                 # an auditor reads a whole log
    assert polled and ev.decode_event(polled[0].value).name == "app/kafka", polled
    with pytest.raises(TopicAuthorizationFailedError):
        _fetch(faces, "app", sent.offset)                        # a writer may not
    _create_topic(faces, "admin", "faces-admin")                 # a declaration in the metadata group
    with pytest.raises(TopicAuthorizationFailedError):
        _create_topic(faces, "app", "faces-app")
    with Client(faces.endpoints) as admin:
        assert admin.get("app/kafka-nobody") is None
        assert admin.get_entity("config/kafka-topic/faces-admin") is not None
        assert admin.get_entity("config/kafka-topic/faces-app") is None


def test_a_kafka_consumer_group_and_an_idempotent_producer_work_when_authenticated(faces: NodeCluster) -> None:
    """The APIs that need an authenticated connection only (Metadata, ListOffsets, InitProducerId, the
    consumer group APIs): used by an authenticated client, they work."""
    producer = KafkaProducer(acks="all", enable_idempotence=True, max_block_ms=int(CALL_S * 1000),
                             **_sasl(faces, "app"))
    try:
        sent = producer.send("__kv", value=_put("app/group")).get(timeout=CALL_S)
    finally:
        producer.close(timeout=CALL_S)
    consumer = KafkaConsumer("__kv", group_id="faces", auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=int(CALL_S * 1000), **_sasl(faces, "audit"))
    try:
        seen = False
        for _ in range(40):   # bounded: the group forms and the record arrives within 40 polls of 0.5 s
            records = [r for batch in consumer.poll(timeout_ms=500).values() for r in batch]
            if any(r.offset == sent.offset for r in records):
                seen = True
                break
        assert seen, "the group's consumer did not get the record"
        consumer.commit()
        assert consumer.committed(TopicPartition("__kv", 0)) is not None
    finally:
        consumer.close()


def _tls_socket(cluster: NodeCluster) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=_ca(cluster))
    context.check_hostname = False
    host, port = cluster.bootstrap[0].rsplit(":", 1)
    return context.wrap_socket(socket.create_connection((host, int(port)), timeout=CALL_S))


def _request(api_key: int, version: int, correlation: int, body: bytes = b"") -> bytes:
    frame = struct.pack(">hhih", api_key, version, correlation, -1) + body
    return struct.pack(">i", len(frame)) + frame


def _read_frame(sock: ssl.SSLSocket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    return data[4:]


def test_every_kafka_api_but_sasl_is_refused_before_authentication(faces: NodeCluster) -> None:
    """A TLS connection that did not authenticate gets ApiVersions (the list of served keys) and then, for
    any other key, no answer: the connection is closed."""
    with _tls_socket(faces) as sock:
        sock.sendall(_request(18, 0, 1))
        reply = _read_frame(sock)
    correlation, error, count = struct.unpack_from(">ihi", reply)
    assert (correlation, error) == (1, 0)
    served = {struct.unpack_from(">hhh", reply, 10 + 6 * i)[0]: struct.unpack_from(">hhh", reply, 10 + 6 * i)[1:]
              for i in range(count)}
    assert {0, 1, 2, 3, 19, 22}.issubset(served), served
    for api_key, (low, _high) in sorted(served.items()):
        if api_key in OPEN_KAFKA_APIS:
            continue
        with _tls_socket(faces) as sock:
            sock.sendall(_request(api_key, low, 2))
            try:
                answer = _read_frame(sock)
            except ConnectionResetError:
                answer = b""
        assert answer == b"", f"API key {api_key} answered an unauthenticated connection"
