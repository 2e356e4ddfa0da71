"""The Kafka face with [clients.access] enforce = true: SASL_SSL with SCRAM-SHA-256/512 and PLAIN, real
kafka-python and aiokafka clients against a real node over real TLS on 127.0.0.1 (issue 21).

A writer produces events of its kv prefix to `__kv` and they are signed with its name; a record outside
its prefix, a whole log it may not read, `__metadata` (read-only to Kafka clients, admin included), a
wrong password and a plaintext client are refused with Kafka's own errors."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAuthorizationFailedError
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

from epochlog.client import Client
from statemachines import credentials as cr
from statemachines import events as ev
from tests.epochlog.kafka.raw import RawKafka
from tests.support.nodes import NodeCluster
from tests.support.secured import secured_cluster

NAME = "node-test"
PASSWORDS = {"alice": "alice-pw", "carol": "carol-pw", "admin": "admin-pw"}


@pytest.fixture(scope="module")
def kafka_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    with secured_cluster(tmp_path_factory.mktemp("kafka-sasl"), NAME, clients=("mallory",), size=1, seed=13,
                         kafka=True) as cluster:
        with Client(cluster.endpoints) as c:
            for name, password in PASSWORDS.items():
                scram = tuple(cr.scram_credential(m, password, os.urandom(32)) for m in sorted(cr.MECHANISMS))
                c.command(ev.UserAdded(name=name, scram=scram))
            c.command(ev.AclGranted(principal="alice", role="writer", resource="kv:app/"))
            c.command(ev.AclGranted(principal="carol", role="auditor"))
        yield cluster


def _sasl(cluster: NodeCluster, user: str, mechanism: str = "SCRAM-SHA-512", password: str | None = None) -> dict:
    return {"bootstrap_servers": cluster.bootstrap, "security_protocol": "SASL_SSL",
            "ssl_cafile": str(cluster.root / "ca" / "ca.crt"), "ssl_check_hostname": False,
            "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user] if password is None else password}


def _put(name: str, value: bytes, actor: str = "") -> bytes:
    return ev.encode_event(ev.KvPut(name=name, value=value, actor=actor))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_kafka_python_produces_over_sasl_ssl_and_the_records_are_signed(kafka_secured: NodeCluster,
                                                                         mechanism: str) -> None:
    producer = KafkaProducer(acks="all", **_sasl(kafka_secured, "alice", mechanism))
    try:
        key = f"app/kp-{mechanism}"
        sent = producer.send("__kv", value=_put(key, b"1", actor="admin")).get(timeout=20)   # claims admin
    finally:
        producer.close()
    with Client(kafka_secured.endpoints) as admin:
        assert admin.get(key).value == b"1"
        events = admin.read_events("kv", sent.offset, max_events=1)
        assert ev.decode_event(events.events[0].value).actor == "alice"


def test_a_record_outside_the_prefix_and_metadata_are_refused(kafka_secured: NodeCluster) -> None:
    producer = KafkaProducer(acks="all", retries=0, **_sasl(kafka_secured, "alice"))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("__kv", value=_put("other/kp", b"no")).get(timeout=20)
    finally:
        producer.close()
    # __metadata is read-only to Kafka clients, the admin's too (a TopicCreated over Kafka).
    producer = KafkaProducer(acks="all", retries=0, **_sasl(kafka_secured, "admin"))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("__metadata", value=ev.encode_event(ev.TopicCreated(name="evil"))).get(timeout=20)
    finally:
        producer.close()
    with Client(kafka_secured.endpoints) as admin:
        assert admin.get("other/kp") is None and admin.get_entity("topic/evil") is None


def test_a_wrong_password_and_plaintext_are_refused(kafka_secured: NodeCluster) -> None:
    # api_version given: kafka-python would otherwise probe versions until its 30 s bootstrap timeout
    # on a connection the server refuses; the producer is closed at once (nothing was sent).
    for name, options in (("app/x", _sasl(kafka_secured, "alice", password="wrong")),
                          ("app/plain", {"bootstrap_servers": kafka_secured.bootstrap})):
        with pytest.raises(KafkaError):
            producer = KafkaProducer(**options, api_version=(2, 5), request_timeout_ms=3000, max_block_ms=3000)
            try:
                producer.send("__kv", value=_put(name, b"1")).get(timeout=10)
            finally:
                producer.close(timeout=0)
    with Client(kafka_secured.endpoints) as admin:
        assert admin.get("app/x") is None and admin.get("app/plain") is None


def test_aiokafka_reads_a_whole_log_as_auditor_and_a_writer_may_not(kafka_secured: NodeCluster) -> None:
    async def main() -> None:
        context = create_ssl_context(cafile=str(kafka_secured.root / "ca" / "ca.crt"))
        context.check_hostname = False

        def options(user: str) -> dict:
            return {"bootstrap_servers": kafka_secured.bootstrap, "security_protocol": "SASL_SSL",
                    "ssl_context": context, "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": user,
                    "sasl_plain_password": PASSWORDS[user]}

        producer = AIOKafkaProducer(acks="all", **options("alice"))
        await producer.start()
        try:
            sent = await producer.send_and_wait("__kv", _put("app/aio", b"2"))
        finally:
            await producer.stop()
        auditor = AIOKafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **options("carol"))
        await auditor.start()
        try:
            auditor.assign([TopicPartition("__kv", 0)])
            auditor.seek(TopicPartition("__kv", 0), sent.offset)
            record = await asyncio.wait_for(auditor.getone(), 20)
            assert ev.decode_event(record.value).actor == "alice"
        finally:
            await auditor.stop()

    asyncio.run(main())
    consumer = KafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=5000,
                             **_sasl(kafka_secured, "alice"))
    try:
        consumer.assign([TopicPartition("__kv", 0)])
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.poll(timeout_ms=5000)
            consumer.poll(timeout_ms=5000)
    finally:
        consumer.close()


def test_a_client_certificate_authenticates_an_ssl_connection(kafka_secured: NodeCluster) -> None:
    """The SSL listener's other door: a client certificate of the cluster CA is the principal, no SASL."""
    def topics(who: str) -> set[str]:
        d = kafka_secured.root / who
        consumer = KafkaConsumer(bootstrap_servers=kafka_secured.bootstrap, security_protocol="SSL",
                                 ssl_cafile=str(kafka_secured.root / "ca" / "ca.crt"), ssl_check_hostname=False,
                                 ssl_certfile=str(d / f"{who}.crt"), ssl_keyfile=str(d / f"{who}.key"))
        try:
            return set(consumer.topics())
        finally:
            consumer.close()

    assert {"__metadata", "__kv"} <= topics("admin")   # the super user, by its certificate
    assert topics("mallory") == set()                  # a certificate without grants sees no topic


def test_a_topic_created_through_a_follower_is_signed_by_the_caller(tmp_path_factory: pytest.TempPathFactory) -> None:
    """CreateTopics on a node that does not lead the metadata group is written through the leader by that
    node (its member certificate): the declaration keeps the caller's name, not the forwarding node's."""
    with secured_cluster(tmp_path_factory.mktemp("kafka-forward"), NAME, size=3, seed=17, kafka=True) as cluster:
        with Client(cluster.endpoints) as admin:
            scram = tuple(cr.scram_credential(m, "dana-pw", os.urandom(32)) for m in sorted(cr.MECHANISMS))
            admin.command(ev.UserAdded(name="dana", scram=scram))
            admin.command(ev.AclGranted(principal="dana", role="writer", resource="topic:dana-*"))
        leader = cluster.leader("metadata")
        follower = next(i for i in cluster.nodes if i != leader)
        context = ssl.create_default_context(cafile=str(cluster.root / "ca" / "ca.crt"))
        context.check_hostname = False
        with RawKafka(cluster.nodes[follower].kafka_address, timeout=20, tls=context) as conn:
            assert conn.sasl_plain("dana", "dana-pw") == (0, None)
            answer = conn.call(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
                name="dana-orders", num_partitions=1, replication_factor=1, assignments=[], configs=[])],
                timeout_ms=10_000, validate_only=False), CreateTopicsResponse, 3)
        assert [t.error_code for t in answer.topics] == [0], answer
        with Client(cluster.endpoints) as admin:
            declared = admin.get_entity("config/kafka-topic/dana-orders")
            assert declared is not None
            (event,) = admin.read_events("metadata", declared.version, max_events=1).events
            assert ev.decode_event(event.value).ops[0].actor == "dana"
