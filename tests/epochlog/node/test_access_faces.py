"""Every call of every client face, each made by one principal its rule allows and one it refuses (issue 21),
on one real node with [clients.tls] and [clients.access] enforce = true: native calls through the SDK's
connection, gRPC methods through a real TLS channel, the Kafka API keys through kafka-python over SASL_SSL
and raw frames over TLS.

The allowed call must work (or fail for a reason that is not access, named in its row); the refused one
must get the face's own denial: native `permission_denied`, gRPC PERMISSION_DENIED, Kafka
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED by the resource
refused, counted under its operation (and, before SASL, the connection closed before any answer). The rows run in their order on one node (LeaseKeepAlive after LeaseGrant,
MemberRemove after MemberAdd)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import TopicAuthorizationFailedError
from kafka.protocol.consumer.group import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
                                           LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
                                           OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
                                           SyncGroupRequest, SyncGroupResponse)
from kafka.protocol.consumer.offsets import (ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest,
                                             OffsetForLeaderEpochResponse)
from kafka.protocol.data_container import DataContainer
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from epochlog.api import messages as p
from epochlog.client import AsyncClient, Client
from epochlog.client.errors import ClientError, PermissionDeniedError
from epochlog.client.tls import ClientTls
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from epochlog.kafka import hosted
from epochlog.kafka.groups import GROUP_APIS
from epochlog.kafka.handler import SUPPORTED
from eventlog import kafka_codes as kc
from statemachines import credentials as cr
from statemachines import events as ev
from tests.epochlog.kafka.raw import RawKafka
from tests.support.nodes import NodeCluster
from tests.support.secured import secured_cluster
from tests.support.wait import wait_until

NAME = "node-test"
TOKENS = {who: f"eltok_{who}-secret" for who in ("admin", "app", "audit", "b2", "nobody", "gone", "revoked")}
PASSWORDS = {"admin": "admin-pw", "app": "app-pw", "audit": "audit-pw", "nobody": "nobody-pw", "b2": "b2-pw",
             "gone": "gone-pw", "revoked": "revoked-pw"}
EXPIRED_TOKEN = "eltok_old-expired"   # user "old", an admin whose only token expired
APP_TOPIC = "app-orders"   # a hosted Kafka topic app writes and reads
GRANTS = [("app", "writer", "kv:app/"), ("app", "writer", "topic:app-*"), ("app", "reader", "group:app-*"),
          ("audit", "auditor", ""), ("b2", "broker", "c/broker-a/b2"), ("old", "admin", ""),
          # users whose credentials lapse (the `lapsed` fixture): removed, and with their only grant revoked
          ("gone", "writer", "kv:lapsed/"), ("revoked", "writer", "kv:lapsed/")]
CALL_S = 10.0


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    with secured_cluster(tmp_path_factory.mktemp("access-faces"), NAME, size=1, seed=21, grpc=True,
                         kafka=True) as cluster:
        with Client(cluster.endpoints) as c:
            for who in sorted({*TOKENS, *PASSWORDS}):
                scram = tuple(cr.scram_credential(m, PASSWORDS[who], os.urandom(32)) for m in sorted(cr.MECHANISMS)) \
                    if who in PASSWORDS else ()
                tokens = (cr.BearerToken(sha256=cr.token_digest(TOKENS[who])),) if who in TOKENS else ()
                c.command(ev.UserAdded(name=who, scram=scram, tokens=tokens))
            c.command(ev.UserAdded(name="old", tokens=(cr.BearerToken(sha256=cr.token_digest(EXPIRED_TOKEN),
                                                                      expires_ms=int(time.time() * 1000) - 1000),)))
            for who, role, resource in GRANTS:
                c.command(ev.AclGranted(principal=who, role=role, resource=resource))
            c.put("other/x", b"theirs")
            c.command(hosted.declaration(APP_TOPIC, 1))
        yield cluster


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
# Node 9's peer address: nothing listens there, and no harness draws it (a port drawn at import could be
# drawn again by the cluster started later, and a member add naming a member's own address is refused).
PEER_9 = "127.0.0.1:1"

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
    "ReadLog": Row(lambda: p.ReadLog("kv", 0, max_bytes=1), "audit", "app"),
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


async def _native(cluster: NodeCluster, who: str, call: p.Call, *, token: str | None = None) -> p.Result:
    """`call` made by `who`'s credentials, or with bearer `token` when given ("" : no credential)."""
    tls, token = _native_tls(cluster, who) if token is None else (ClientTls(_ca(cluster)), token)
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
GRPC_PEER_9 = "127.0.0.1:2"   # as PEER_9
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
    "ReadLog": (lambda s, m: s.ReadLog(pb.ReadLogRequest(group="kv", from_offset=0, max_bytes=1), metadata=m,
                                       timeout=CALL_S), "audit", "app", ""),
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


def _grpc(cluster: NodeCluster, who: str, call: Callable[[pb_grpc.EpochlogStub, list[tuple[str, str]]], Any], *,
          token: str | None = None) -> Any:
    """`call` made with `who`'s token, or with `token` when given ("": no credential)."""
    token = TOKENS[who] if token is None else token
    ca = (cluster.root / "ca" / "ca.crt").read_bytes()
    with grpc.secure_channel(cluster.nodes[1].grpc_address, grpc.ssl_channel_credentials(ca),
                             options=[("grpc.ssl_target_name_override", "node-1")]) as channel:
        return call(pb_grpc.EpochlogStub(channel), [("authorization", f"Bearer {token}")] if token else [])


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


def _sasl(cluster: NodeCluster, user: str, password: str | None = None) -> dict[str, Any]:
    return {"bootstrap_servers": cluster.bootstrap, "security_protocol": "SASL_SSL", "ssl_cafile": _ca(cluster),
            "ssl_check_hostname": False, "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user] if password is None else password,
            "request_timeout_ms": int(CALL_S * 1000)}


def _put(name: str) -> bytes:
    return ev.encode_event(ev.KvPut(name=name, value=b"k"))


def _produce(cluster: NodeCluster, who: str, name: str, password: str | None = None) -> Any:
    producer = KafkaProducer(acks="all", retries=0, max_block_ms=int(CALL_S * 1000), **_sasl(cluster, who, password))
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
    _create_topic(faces, "app", "app-created")                   # Create on a topic app writes
    with pytest.raises(TopicAuthorizationFailedError):
        _create_topic(faces, "app", "faces-app")                 # outside topic:app-*
    with Client(faces.endpoints) as admin:
        assert admin.get("app/kafka-nobody") is None
        assert admin.get_entity("config/kafka-topic/faces-admin") is not None
        created = admin.get_entity("config/kafka-topic/app-created")
        assert created is not None and _actor(admin, "metadata", created.version) == "app"
        assert admin.get_entity("config/kafka-topic/faces-app") is None


def _actor(c: Client, group: str, offset: int) -> str:
    (event,) = c.read_events(group, offset, max_events=1).events
    decoded = ev.decode_event(event.value)
    return decoded.ops[0].actor if isinstance(decoded, ev.Txn) else decoded.actor


def test_a_kafka_consumer_group_and_an_idempotent_producer_work_with_their_grants(faces: NodeCluster) -> None:
    """A writer of topic:app-* with reader group:app-*: an idempotent producer (InitProducerId) and a
    consumer group (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, OffsetCommit, OffsetFetch) work, and
    its commit is signed with its name."""
    producer = KafkaProducer(acks="all", enable_idempotence=True, max_block_ms=int(CALL_S * 1000),
                             **_sasl(faces, "app"))
    try:
        sent = producer.send(APP_TOPIC, key=b"k", value=b"v-group").get(timeout=CALL_S)
    finally:
        producer.close(timeout=CALL_S)
    consumer = KafkaConsumer(APP_TOPIC, group_id="app-faces", auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=int(CALL_S * 1000), **_sasl(faces, "app"))
    try:
        seen = False
        for _ in range(40):   # bounded: the group forms and the record arrives within 40 polls of 0.5 s
            records = [r for batch in consumer.poll(timeout_ms=500).values() for r in batch]
            if any(r.offset == sent.offset and r.value == b"v-group" for r in records):
                seen = True
                break
        assert seen, "the group's consumer did not get the record"
        consumer.commit()
        assert consumer.committed(TopicPartition(APP_TOPIC, 0)) == sent.offset + 1
    finally:
        consumer.close()
    with Client(faces.endpoints) as admin:
        committed = admin.get_entity(f"offset/app-faces/{APP_TOPIC}/0")
        assert committed is not None and _actor(admin, "offsets", committed.version) == "app"
        stored = admin.get(hosted.wrap(APP_TOPIC, 0, b"k", b"v-group").name)   # the record, as kv stores it
        assert stored is not None and _actor(admin, "kv", stored.version) == "app"


# --- Kafka: each API beyond Produce, Fetch and CreateTopics, against its resource --------------------------

CG = "app-cg"   # a consumer group app may be a member of (reader group:app-*)


@dataclass(frozen=True)
class KafkaRow:
    """One Kafka request, made raw over SASL_SSL (PLAIN) by `allowed`, whose answer holds only NONE codes,
    and by `denied`, whose answer holds `refusal` and whose denial is counted under `op`. `request` builds
    it from what earlier rows learnt (`learnt`: the member id and generation of the group's member)."""

    request: Callable[[dict[str, Any]], Any]
    response: type
    version: int
    op: str
    allowed: str
    denied: str
    refusal: int
    learn: Callable[[Any, dict[str, Any]], None] = lambda response, learnt: None


def _metadata(topic: str) -> Any:
    return MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)


def _list_offsets(topic: str) -> Any:
    return ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
        name=topic, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, timestamp=-1)])])


def _join(learnt: dict[str, Any]) -> Any:
    return JoinGroupRequest(group_id=CG, session_timeout_ms=60_000, rebalance_timeout_ms=60_000, member_id="",
                            protocol_type="consumer", protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                                name="range", metadata=b"")])


def _joined(response: Any, learnt: dict[str, Any]) -> None:
    learnt.update(member=response.member_id, generation=response.generation_id)


def _commit(topic: str) -> Callable[[dict[str, Any]], Any]:
    return lambda learnt: OffsetCommitRequest(
        group_id=CG, generation_id_or_member_epoch=learnt["generation"], member_id=learnt["member"],
        topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=5, committed_metadata="")])])


def _offset_fetch(topic: str) -> Callable[[dict[str, Any]], Any]:
    return lambda learnt: OffsetFetchRequest(group_id=CG, topics=[OffsetFetchRequest.OffsetFetchRequestTopic(
        name=topic, partition_indexes=[0])])


def _fetched(response: Any, learnt: dict[str, Any]) -> None:
    (topic,) = response.topics
    assert topic.partitions[0].committed_offset == 5, response   # the allowed commit landed


TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED = (kc.TOPIC_AUTHORIZATION_FAILED, kc.GROUP_AUTHORIZATION_FAILED,
                                              kc.CLUSTER_AUTHORIZATION_FAILED)

KAFKA: dict[str, KafkaRow] = {
    # A topic is seen by who may read or write it (Kafka's Describe): the hosted topic by its writer, a
    # group's whole log by an auditor; anyone else gets TOPIC_AUTHORIZATION_FAILED for it.
    "Metadata": KafkaRow(lambda _: _metadata(APP_TOPIC), MetadataResponse, 8, "metadata", "app", "b2", TOPIC_DENIED),
    "Metadata-log": KafkaRow(lambda _: _metadata("__metadata"), MetadataResponse, 8, "metadata", "audit", "app",
                             TOPIC_DENIED),
    "ListOffsets": KafkaRow(lambda _: _list_offsets(APP_TOPIC), ListOffsetsResponse, 5, "list_offsets", "app", "b2",
                            TOPIC_DENIED),
    "ListOffsets-log": KafkaRow(lambda _: _list_offsets("__kv"), ListOffsetsResponse, 5, "list_offsets", "audit",
                                "app", TOPIC_DENIED),
    "OffsetForLeaderEpoch": KafkaRow(
        lambda _: OffsetForLeaderEpochRequest(replica_id=-1, topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
            topic="__kv", partitions=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                partition=0, leader_epoch=1)])]),
        OffsetForLeaderEpochResponse, 3, "offset_for_leader_epoch", "audit", "app", TOPIC_DENIED),
    # A producer id: Kafka's IdempotentWrite on the cluster, which any write grant implies.
    "InitProducerId": KafkaRow(lambda _: InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000),
                               InitProducerIdResponse, 1, "init_producer_id", "app", "audit", CLUSTER_DENIED),
    # The consumer group: found and its offsets fetched by whoever may read it (an auditor too), joined
    # and committed to by a reader or writer of the group only.
    "FindCoordinator": KafkaRow(lambda _: FindCoordinatorRequest(key=CG, key_type=0), FindCoordinatorResponse, 2,
                                "find_coordinator", "app", "b2", GROUP_DENIED),
    "JoinGroup": KafkaRow(_join, JoinGroupResponse, 2, "join_group", "app", "audit", GROUP_DENIED, _joined),
    "SyncGroup": KafkaRow(lambda learnt: SyncGroupRequest(
        group_id=CG, generation_id=learnt["generation"], member_id=learnt["member"],
        assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=learnt["member"], assignment=b"")]),
        SyncGroupResponse, 2, "sync_group", "app", "audit", GROUP_DENIED),
    "Heartbeat": KafkaRow(lambda learnt: HeartbeatRequest(group_id=CG, generation_id=learnt["generation"],
                                                          member_id=learnt["member"]),
                          HeartbeatResponse, 2, "heartbeat", "app", "b2", GROUP_DENIED),
    "OffsetCommit": KafkaRow(_commit(APP_TOPIC), OffsetCommitResponse, 5, "offset_commit", "app", "audit",
                             GROUP_DENIED),
    "OffsetCommit-topic": KafkaRow(_commit("__kv"), OffsetCommitResponse, 5, "offset_commit", "admin", "app",
                                   TOPIC_DENIED),   # app is the group's member, but may not read __kv
    "OffsetFetch": KafkaRow(_offset_fetch(APP_TOPIC), OffsetFetchResponse, 5, "offset_fetch", "app", "b2",
                            GROUP_DENIED, _fetched),
    "OffsetFetch-topic": KafkaRow(_offset_fetch("__kv"), OffsetFetchResponse, 5, "offset_fetch", "audit", "app",
                                  TOPIC_DENIED),
    "LeaveGroup": KafkaRow(lambda learnt: LeaveGroupRequest(group_id=CG, member_id=learnt["member"]),
                           LeaveGroupResponse, 2, "leave_group", "app", "audit", GROUP_DENIED),
}
KAFKA_BY_CLIENTS = {0: "Produce", 1: "Fetch", 19: "CreateTopics"}   # with real clients, above


def test_the_kafka_table_covers_every_served_api() -> None:
    keys = {row.request({"member": "", "generation": 0}).API_KEY for row in KAFKA.values()}
    assert keys | set(KAFKA_BY_CLIENTS) | OPEN_KAFKA_APIS == set(SUPPORTED) | set(GROUP_APIS)


def _codes(response: Any) -> list[int]:
    """Every error code an answer holds, at any depth."""
    codes, stack = [], [response]
    while stack:
        item = stack.pop()
        for name in item.fields:
            value = getattr(item, name, None)
            if name == "error_code":
                codes.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, DataContainer))
            elif isinstance(value, DataContainer):
                stack.append(value)
    return codes


def _raw_kafka(cluster: NodeCluster, who: str, row: KafkaRow, learnt: dict[str, Any]) -> Any:
    context = ssl.create_default_context(cafile=_ca(cluster))
    context.check_hostname = False
    with RawKafka(cluster.bootstrap[0], timeout=CALL_S, tls=context) as conn:
        assert conn.sasl_plain(who, PASSWORDS[who]) == (0, None)
        return conn.call(row.request(learnt), row.response, row.version)


def _denials(cluster: NodeCluster, who: str, op: str) -> float:
    return sum(v for (name, labels), v in cluster.wait_metrics(1).items()
               if name == "epochlog_access_denied_total" and dict(labels).get("principal") == who
               and dict(labels).get("op") == op)


def test_each_kafka_api_is_allowed_and_refused_by_its_resource(faces: NodeCluster) -> None:
    """In the table's order (the member joins before it syncs...): each row refused to its `denied`
    principal first, then made by its `allowed` one, which still works."""
    learnt: dict[str, Any] = {}
    for name, row in KAFKA.items():
        before = _denials(faces, row.denied, row.op)
        refused = _raw_kafka(faces, row.denied, row, learnt)
        assert row.refusal in _codes(refused), f"{name} by {row.denied}: {refused}"
        assert _denials(faces, row.denied, row.op) == before + 1, f"{name}: the denial was not counted"
        answer = _raw_kafka(faces, row.allowed, row, learnt)
        assert set(_codes(answer)) <= {kc.NONE}, f"{name} by {row.allowed}: {answer}"
        row.learn(answer, learnt)


def test_metadata_of_every_topic_lists_only_what_the_caller_may_see(faces: NodeCluster) -> None:
    def listed(who: str) -> set[str]:
        row = KafkaRow(lambda _: MetadataRequest(topics=None, allow_auto_topic_creation=False), MetadataResponse, 8,
                       "metadata", who, who, 0)
        answer = _raw_kafka(faces, who, row, {})
        assert set(_codes(answer)) <= {kc.NONE}, answer
        return {t.name for t in answer.topics}

    every = listed("audit")
    assert {"__metadata", "__kv", "__offsets", APP_TOPIC} <= every
    app = listed("app")
    assert APP_TOPIC in app and "__kv" in app and "__metadata" not in app   # it writes __kv's events
    assert listed("nobody") == set()


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


# --- Credentials: none, wrong, expired, revoked, and another broker's, on every face -----------------------

@dataclass(frozen=True)
class Credential:
    """What a client shows: a bearer token (native, gRPC, admin endpoint) and SASL/PLAIN user and password
    (Kafka; None: no SASL); `refused`: the native/gRPC code every call gets with it."""

    token: str
    sasl: tuple[str, str] | None
    refused: str
    kafka: bool = True        # False: the credential has no Kafka form (SASL users have passwords, not tokens)


BAD_CREDENTIALS: dict[str, Credential] = {
    "none": Credential("", None, "unauthenticated"),
    "wrong": Credential("eltok_wrong", ("app", "not-app-pw"), "unauthenticated"),
    "expired": Credential(EXPIRED_TOKEN, None, "unauthenticated", kafka=False),
    "removed": Credential(TOKENS["gone"], ("gone", PASSWORDS["gone"]), "unauthenticated"),   # UserRemoved
    "revoked": Credential(TOKENS["revoked"], ("revoked", PASSWORDS["revoked"]), "permission_denied"),  # AclRevoked
}


def _native_outcome(cluster: NodeCluster, call: p.Call, token: str) -> str:
    try:
        asyncio.run(_native(cluster, "", call, token=token))
        return "ok"
    except ClientError as exc:
        return exc.code


def _sasl_ok(cluster: NodeCluster, user: str, password: str) -> bool:
    context = ssl.create_default_context(cafile=_ca(cluster))
    context.check_hostname = False
    with RawKafka(cluster.bootstrap[0], timeout=CALL_S, tls=context) as conn:
        return conn.sasl_plain(user, password)[0] == kc.NONE


@pytest.fixture(scope="module")
def live_kafka(faces: NodeCluster) -> Iterator[dict[str, RawKafka]]:
    """Kafka connections of `gone` and `revoked`, authenticated (SASL/PLAIN) and seeing `__kv` while their
    credentials are good, kept open across `lapsed`."""
    context = ssl.create_default_context(cafile=_ca(faces))
    context.check_hostname = False
    connections = {}
    try:
        for who in ("gone", "revoked"):
            conn = connections[who] = RawKafka(faces.bootstrap[0], timeout=CALL_S, tls=context)
            assert conn.sasl_plain(who, PASSWORDS[who]) == (0, None)
            assert set(_codes(conn.call(_metadata("__kv"), MetadataResponse, 8))) == {kc.NONE}
        yield connections
    finally:
        for conn in connections.values():
            conn.close()


@pytest.fixture(scope="module")
def lapsed(faces: NodeCluster, live_kafka: dict[str, RawKafka]) -> NodeCluster:
    """`gone` and `revoked` shown to work on every face first, then `gone` removed and `revoked`'s only
    grant revoked; the fixture returns once the native face refuses them."""
    for who in ("gone", "revoked"):
        assert _native_outcome(faces, p.Write([ev.KvPut(name=f"lapsed/{who}", value=b"1")]), TOKENS[who]) == "ok"
        _grpc(faces, who, GRPC["Status"][0])
        assert _admin_status(faces, TOKENS[who]) == 403           # valid, without the role
        assert _sasl_ok(faces, who, PASSWORDS[who])
    with Client(faces.endpoints) as admin:
        admin.command(ev.UserRemoved(name="gone"))
        admin.command(ev.AclRevoked(principal="revoked", role="writer", resource="kv:lapsed/"))
    for who, credential in (("gone", BAD_CREDENTIALS["removed"]), ("revoked", BAD_CREDENTIALS["revoked"])):
        wait_until(lambda: _native_outcome(faces, p.Ping(), credential.token) == credential.refused, timeout=CALL_S,
                   what=f"{who}'s credential refused")
    return faces


@pytest.mark.parametrize("credential", list(BAD_CREDENTIALS))
def test_native_serves_no_call_to_a_bad_credential(lapsed: NodeCluster, credential: str) -> None:
    bad = BAD_CREDENTIALS[credential]
    outcomes = {name: _native_outcome(lapsed, row.call(), bad.token) for name, row in NATIVE.items()}
    assert {o for o in outcomes.values()} == {bad.refused}, outcomes


@pytest.mark.parametrize("credential", list(BAD_CREDENTIALS))
def test_grpc_serves_no_method_to_a_bad_credential(lapsed: NodeCluster, credential: str) -> None:
    bad = BAD_CREDENTIALS[credential]
    outcomes = {}
    for name, (call, *_) in GRPC.items():
        try:
            _grpc(lapsed, "", call, token=bad.token)
            outcomes[name] = "ok"
        except grpc.RpcError as exc:
            outcomes[name] = exc.code().name.lower()
        except SessionError as exc:
            outcomes[name] = exc.error.code
    assert set(outcomes.values()) == {bad.refused}, outcomes


def _admin_status(cluster: NodeCluster, token: str) -> int:
    request = urllib.request.Request(cluster.admin_url(1, "/metrics"),
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=CALL_S, context=ClientTls(_ca(cluster)).context()) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("credential", list(BAD_CREDENTIALS))
def test_the_admin_endpoint_serves_no_metrics_to_a_bad_credential(lapsed: NodeCluster, credential: str) -> None:
    bad = BAD_CREDENTIALS[credential]
    assert _admin_status(lapsed, bad.token) == (403 if bad.refused == "permission_denied" else 401)


GROUP_OPS = {"find_coordinator", "join_group", "sync_group", "heartbeat", "leave_group", "offset_commit",
             "offset_fetch"}


@pytest.mark.parametrize("credential", [name for name, c in BAD_CREDENTIALS.items() if c.kafka])
def test_kafka_serves_no_api_to_a_bad_credential(lapsed: NodeCluster, credential: str) -> None:
    """No SASL, a wrong password or a removed user: SaslAuthenticate fails and every other API key closes
    the connection unanswered. A user without grants: every API answers with its resource's refusal.
    (No expired row: SASL users have passwords; tokens and their expiry are not a Kafka credential.)"""
    bad = BAD_CREDENTIALS[credential]
    context = ssl.create_default_context(cafile=_ca(lapsed))
    context.check_hostname = False
    served = set(SUPPORTED) | set(GROUP_APIS)
    if bad.refused == "unauthenticated":
        for api_key in sorted(served - OPEN_KAFKA_APIS):
            low = {**SUPPORTED, **GROUP_APIS}[api_key][0]
            with RawKafka(lapsed.bootstrap[0], timeout=CALL_S, tls=context) as conn:
                if bad.sasl is not None:
                    assert conn.sasl_plain(*bad.sasl)[0] == kc.SASL_AUTHENTICATION_FAILED
                conn.send_bytes(_request(api_key, low, 7))
                assert conn.closed_by_peer(CALL_S), f"API key {api_key} answered with credential {credential}"
        return
    assert bad.sasl is not None
    learnt = {"member": "m", "generation": 1}
    for name, row in KAFKA.items():
        with RawKafka(lapsed.bootstrap[0], timeout=CALL_S, tls=context) as conn:
            assert conn.sasl_plain(*bad.sasl) == (0, None)
            answer = conn.call(row.request(learnt), row.response, row.version)
        expected = GROUP_DENIED if row.op in GROUP_OPS else row.refusal
        assert expected in _codes(answer), f"{name} by {credential}: {answer}"
    user, password = bad.sasl
    with pytest.raises(TopicAuthorizationFailedError):
        _produce(lapsed, user, "lapsed/kafka", password=password)
    with Client(lapsed.endpoints) as admin:
        assert admin.get("lapsed/kafka") is None


def test_a_kafka_connection_authenticated_before_the_change_is_refused_after_it(
        lapsed: NodeCluster, live_kafka: dict[str, RawKafka]) -> None:
    """SASL authenticates a connection once: a removed user's connection is closed at its next request,
    a revoked grant refused on the connection that held it."""
    gone = live_kafka["gone"]
    gone.send(_metadata("__kv"), 8)
    assert gone.closed_by_peer(CALL_S), "a removed user's Kafka connection was served"
    answer = live_kafka["revoked"].call(_metadata("__kv"), MetadataResponse, 8)
    assert TOPIC_DENIED in _codes(answer), answer


B1 = p.BrokerIdentity("c", "broker-a", "b1", "127.0.0.1:10911", "inc-evil")
B1_CALLS: dict[str, p.Call] = {
    "BrokerRegister": p.BrokerRegister([B1]),                                     # the hijack
    "BrokerHeartbeats": p.BrokerHeartbeats([p.Heartbeat("c", "broker-a", "b1", 1, 0)]),
    "SyncStateSetReport": p.SyncStateSetReport("c", "broker-a", "b1", 1, 1, 1, []),
    "BrokerShutdown": p.BrokerShutdown("c", "broker-a", "b1", 1),
    "Write-BrokerRegistered": p.Write([ev.BrokerRegistered(cluster="c", group="broker-a", name="b1",
                                                            address="6.6.6.6:10911", incarnation="evil",
                                                            broker_id=0, broker_epoch=9)]),
    "Write-SyncStateSetChanged": p.Write([ev.SyncStateSetChanged(cluster="c", group="broker-a", sync_state_set=(2,),
                                                                  master_epoch=1, sync_state_set_epoch=9)]),
}


def test_a_broker_acts_as_itself_only(faces: NodeCluster) -> None:
    """b2's valid credentials on b1's registration, heartbeats, SyncStateSet and shutdown, on every face
    that carries them: all refused; b2's own heartbeat still works."""
    outcomes = {name: _native_outcome(faces, call, TOKENS["b2"]) for name, call in B1_CALLS.items()}
    assert set(outcomes.values()) == {"permission_denied"}, outcomes
    forged = ev.BrokerFenced(cluster="c", group="broker-a", name="b1", broker_epoch=1)
    with pytest.raises(grpc.RpcError) as refused:
        _grpc(faces, "b2", lambda s, m: s.Command(pb.CommandRequest(event_msgpack=ev.encode_event(forged)),
                                                  metadata=m, timeout=CALL_S))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    producer = KafkaProducer(acks="all", retries=0, max_block_ms=int(CALL_S * 1000), **_sasl(faces, "b2"))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("__metadata", value=ev.encode_event(forged)).get(timeout=CALL_S)
    finally:
        producer.close(timeout=CALL_S)
    assert _admin_status(faces, TOKENS["b2"]) == 403
    with Client(faces.endpoints) as admin:
        assert admin.get_entity("broker/c/broker-a/b1") is None
    assert _native_outcome(faces, p.BrokerHeartbeats([p.Heartbeat("c", "broker-a", "b2", 1, 0)]),
                           TOKENS["b2"]) in ("ok", "fenced")   # its own: past authorization, the controller judges
