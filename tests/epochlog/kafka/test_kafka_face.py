"""The Kafka face against a real 3-node cluster of `epochlog serve` processes, with real kafka-python
clients (and a raw protocol client where a test must control the bytes): tailing a group's log,
producing typed events (idempotent, acks=all), validation and error codes, and consumer groups.

The cluster is shared by the module (no test kills a node; tests/epochlog/kafka/test_failover.py does).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
import uuid
from typing import Any

import msgspec
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from epochlog.client import Client
from eventlog.records import encode_batch
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.epochlog.kafka.raw import RawKafka

KV = TopicPartition("__kv", 0)


def _put(name: str, value: bytes = b"v") -> bytes:
    return ev.encode_event(ev.KvPut(name=name, value=value))


def _produce(records: bytes, *, topic: str = "__kv", acks: int = -1) -> ProduceRequest:
    return ProduceRequest(transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])


def _partition_result(response: Any) -> Any:
    return response.responses[0].partition_responses[0]


def _kafka_of(cluster: NodeCluster, node_id: int) -> str:
    return cluster.nodes[node_id].kafka_address


def _consume_all(consumer: KafkaConsumer, until: int, timeout: float = 20.0) -> list[Any]:
    """Poll until a record at offset >= until - 1 arrived (or fail after `timeout`)."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while not out or out[-1].offset < until - 1:
        assert time.monotonic() < deadline, f"consumed {len(out)} records, last {out[-1].offset if out else None}"
        for records in consumer.poll(timeout_ms=500).values():
            out.extend(records)
    return out


def test_a_consumer_tails_a_groups_log_with_assign_and_seek(kafka_cluster: NodeCluster) -> None:
    """Records are the group's log as written through the SDK: same offsets, keys and events;
    end offset = commit + 1; control batches (Raft's own entries) never reach the consumer."""
    tag = uuid.uuid4().hex[:8]
    with Client(kafka_cluster.endpoints) as client:
        written = [client.put(f"tail-{tag}/{i}", f"value-{i}".encode()) for i in range(30)]
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([KV])
        consumer.seek(KV, written[10].offset)
        records = _consume_all(consumer, written[-1].offset + 1)
        ours = [r for r in records if r.key.startswith(f"kv/tail-{tag}/".encode())]
        assert [r.offset for r in ours] == [w.offset for w in written[10:]]
        for r in ours:
            event = ev.decode_event(r.value)
            assert isinstance(event, ev.KvPut) and r.key == event.key().encode()
            assert event.value == f"value-{event.name.rsplit('/', 1)[1]}".encode()
        assert records[0].offset == written[10].offset          # nothing below the seek
        assert all(r.leader_epoch >= 1 for r in records)
        end = consumer.end_offsets([KV])[KV]
        leader = kafka_cluster.leader("kv")
        assert end == kafka_cluster.group_status(leader, "kv").commit_offset + 1
        assert consumer.beginning_offsets([KV])[KV] == 0
        found = consumer.offsets_for_times({KV: records[0].timestamp})[KV]
        assert found is not None and found.offset <= written[10].offset
    finally:
        consumer.close()


def test_an_idempotent_producer_appends_typed_events_at_the_offsets_it_is_told(kafka_cluster: NodeCluster) -> None:
    """kafka-python's default producer (idempotent, acks=all): each acknowledged offset is where a
    consumer and the SDK find that very event, once."""
    tag = uuid.uuid4().hex[:8]
    count = 3000
    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send("__kv", value=_put(f"prod-{tag}/{i:05d}", str(i).encode())) for i in range(count)]
        producer.flush(30)
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(5)
    assert len(set(offsets)) == count
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([KV])
        consumer.seek(KV, min(offsets))
        by_offset = {r.offset: r for r in _consume_all(consumer, max(offsets) + 1)}
    finally:
        consumer.close()
    for i, offset in enumerate(offsets):
        event = ev.decode_event(by_offset[offset].value)
        assert isinstance(event, ev.KvPut) and event.name == f"prod-{tag}/{i:05d}"
    ours = [r for r in by_offset.values() if r.key.startswith(f"kv/prod-{tag}/".encode())]
    assert len(ours) == count                                  # no duplicate
    with Client(kafka_cluster.endpoints) as client:
        assert client.get(f"prod-{tag}/{count - 1:05d}").value == str(count - 1).encode()   # applied to the views


def test_a_batch_with_one_invalid_record_is_refused_whole(kafka_cluster: NodeCluster) -> None:
    tag = uuid.uuid4().hex[:8]
    leader = kafka_cluster.leader("kv")
    with RawKafka(_kafka_of(kafka_cluster, leader)) as raw:
        def produce(batch: bytes, topic: str = "__kv") -> Any:
            return _partition_result(raw.call(_produce(batch, topic=topic), ProduceResponse, 9))

        good = (b"kv/" + f"bad-{tag}/0".encode(), _put(f"bad-{tag}/0"))
        for records, code in [
            ([good, (None, b"not an event")], 87),                                     # INVALID_RECORD
            ([good, (None, ev.encode_event(ev.KvPut(name="", value=b"x")))], 87),      # fails validation
            ([good, (b"kv/other", _put(f"bad-{tag}/1"))], 87),                         # key is not the entity key
            ([(None, ev.encode_event(ev.TopicCreated(name=f"t{tag}")))], 87),          # a metadata event in __kv
            ([(None, ev.encode_event(ev.MemberAdded(node_id=9, peer_address="h:1")))], 87),
            ([good, (None, msgspec.msgpack.encode(                                      # a newer schema (issue 11)
                {"type": "KvPut", "v": ev.KvPut.VERSION + 1, "name": f"bad-{tag}/1", "value": b"x"}))], 87),
            ([good, (None, b"\x84" + msgspec.msgpack.encode(                            # an unknown field
                {"type": "KvPut", "name": f"bad-{tag}/1", "value": b"x"})[1:]                # nested too deeply
                + b"\xa2zz" + b"\x91" * 100_000 + b"\xc0")], 87),
        ]:
            result = produce(encode_batch(records, timestamp_ms=int(time.time() * 1000)))
            assert result.error_code == code, (records, result)
            assert result.error_message
        corrupt = bytearray(encode_batch([good], timestamp_ms=1))
        corrupt[-1] ^= 0xFF
        assert produce(bytes(corrupt)).error_code == 2                                  # CORRUPT_MESSAGE
        two = encode_batch([good], timestamp_ms=1) + encode_batch([good], timestamp_ms=1)
        assert produce(two).error_code == 87                                            # one batch per request
        assert produce(encode_batch([good], timestamp_ms=1), topic="nope").error_code == 3
        ok = produce(encode_batch([good], timestamp_ms=1))
        assert ok.error_code == 0 and ok.base_offset > 0
    with Client(kafka_cluster.endpoints) as client:
        history = client.history(f"bad-{tag}/0")
        assert [row.offset for row in history] == [ok.base_offset]                     # only the good one
        assert client.get(f"bad-{tag}/1") is None


def test_a_retried_batch_is_answered_with_its_first_offset_and_a_gap_is_refused(kafka_cluster: NodeCluster) -> None:
    """Sequence dedupe by (producer id, epoch, sequence), with the ids InitProducerId hands out."""
    tag = uuid.uuid4().hex[:8]
    leader = kafka_cluster.leader("kv")
    pid = 10_000_000 + int(tag, 16) % 1_000_000
    with RawKafka(_kafka_of(kafka_cluster, leader)) as raw:
        def batch(seq: int, n: int) -> bytes:
            return encode_batch([(None, _put(f"dedupe-{tag}/{seq + i}")) for i in range(n)], timestamp_ms=1,
                                producer_id=pid, producer_epoch=0, base_sequence=seq)
        first = _partition_result(raw.call(_produce(batch(0, 3)), ProduceResponse, 9))
        again = _partition_result(raw.call(_produce(batch(0, 3)), ProduceResponse, 9))
        assert first.error_code == 0 and again.error_code == 0 and again.base_offset == first.base_offset
        gap = _partition_result(raw.call(_produce(batch(5, 1)), ProduceResponse, 9))
        assert gap.error_code == 45                                                     # OUT_OF_ORDER_SEQUENCE_NUMBER
        nxt = _partition_result(raw.call(_produce(batch(3, 2)), ProduceResponse, 9))
        assert nxt.error_code == 0 and nxt.base_offset >= first.base_offset + 3
        stale = encode_batch([(None, _put(f"dedupe-{tag}/x"))], timestamp_ms=1, producer_id=pid, producer_epoch=0,
                             base_sequence=1)
        assert _partition_result(raw.call(_produce(stale), ProduceResponse, 9)).error_code == 45
    with Client(kafka_cluster.endpoints) as client:
        assert len(client.history(f"dedupe-{tag}/0")) == 1


def test_followers_refuse_produce_and_metadata_names_the_raft_leader(kafka_cluster: NodeCluster) -> None:
    leader = kafka_cluster.leader("kv")
    follower = next(i for i in kafka_cluster.running() if i != leader)
    with RawKafka(_kafka_of(kafka_cluster, follower)) as raw:
        result = _partition_result(raw.call(_produce(encode_batch([(None, _put("f/x"))], timestamp_ms=1)),
                                            ProduceResponse, 9))
        assert result.error_code == 6                                                   # NOT_LEADER_OR_FOLLOWER
        for version in (0, 1, 4, 9, 12, 13):
            meta = raw.call(MetadataRequest(topics=None if version else [], allow_auto_topic_creation=False),
                            MetadataResponse, version)
            topics = {t.name: t for t in meta.topics}
            assert {"__metadata", "__offsets", "__kv"} <= set(topics)
            kv = topics["__kv"].partitions[0]
            assert kv.leader_id == leader and sorted(kv.replica_nodes) == [1, 2, 3]
            if version >= 7:
                status = kafka_cluster.group_status(leader, "kv")
                assert kv.leader_epoch == status.term
            assert {b.node_id: f"{b.host}:{b.port}" for b in meta.brokers} == {
                i: n.kafka_address for i, n in kafka_cluster.nodes.items()}
        missing = raw.call(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="nope")],
                                           allow_auto_topic_creation=True), MetadataResponse, 9)
        assert missing.topics[0].error_code == 3
        epochs = raw.call(OffsetForLeaderEpochRequest(replica_id=-1, topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic="__kv", partitions=[
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                    partition=0, current_leader_epoch=-1, leader_epoch=1)])]), OffsetForLeaderEpochResponse, 4)
        assert epochs.topics[0].partitions[0].error_code == 6


def test_api_versions_and_bad_requests(kafka_cluster: NodeCluster) -> None:
    address = kafka_cluster.bootstrap[0]
    with RawKafka(address) as raw:
        versions = raw.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"),
                            ApiVersionsResponse, 3)
        table = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert table[0] == (3, 9) and table[1] == (4, 12) and table[3] == (0, 13) and table[18] == (0, 4)
        assert table[11] == (0, 7) and table[8] == (2, 8) and table[9] == (1, 8)
        # A newer ApiVersions than served: error 35 and the supported list, in v0 (KIP-511).
        raw.send_bytes(b"\x00\x00\x00\x0c" + b"\x00\x12\x00\x63" + b"\x00\x00\x00\x07" + b"\x00\x00" + b"\x00\x00")
        old = raw.receive(ApiVersionsResponse, 0, 7)
        assert old.error_code == 35 and {k.api_key for k in old.api_keys} == set(table)
        # acks=0: no response, and the next request's response follows in order.
        raw.send(_produce(encode_batch([(None, _put("acks0/x"))], timestamp_ms=1), acks=0), 9)
        after = raw.call(ApiVersionsRequest(), ApiVersionsResponse, 0)
        assert after.error_code == 0
    with RawKafka(address) as raw:   # an API this node does not serve: closed, as a broker does
        raw.send_bytes(b"\x00\x00\x00\x0a" + b"\x00\x2d\x00\x00" + b"\x00\x00\x00\x01" + b"\xff\xff")
        assert raw.closed_by_peer()
    with RawKafka(address) as raw:   # an oversize frame
        raw.send_bytes(b"\x7f\x00\x00\x00" + b"\x00" * 64)
        assert raw.closed_by_peer()
    with RawKafka(address) as raw:   # a truncated body
        raw.send_bytes(b"\x00\x00\x00\x0c" + b"\x00\x03\x00\x09" + b"\x00\x00\x00\x01" + b"\x00\x00" + b"\x05\x05")
        assert raw.closed_by_peer()
    with RawKafka(address) as raw:   # and the node still serves
        assert raw.call(ApiVersionsRequest(), ApiVersionsResponse, 0).error_code == 0


def test_a_consumer_group_rebalances_commits_and_resumes(kafka_cluster: NodeCluster) -> None:
    """Two subscribed consumers split two topics (round robin); when one leaves, the other takes
    both; committed offsets survive and a new member resumes from them."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = dict(bootstrap_servers=kafka_cluster.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    partition_assignment_strategy=[RoundRobinPartitionAssignor],
                                    session_timeout_ms=6000, heartbeat_interval_ms=300)
    topics = ("__kv", "__metadata")
    a = KafkaConsumer(*topics, **settings)
    b = KafkaConsumer(*topics, **settings)
    try:
        def assigned() -> tuple[set[str], set[str]]:
            # Long polls: see tests/epochlog/kafka/test_failover.py (a kafka-python race with short ones).
            a.poll(timeout_ms=1000)
            b.poll(timeout_ms=1000)
            return {tp.topic for tp in a.assignment()}, {tp.topic for tp in b.assignment()}

        deadline = time.monotonic() + 30
        while True:
            got = assigned()
            if len(got[0]) == 1 and len(got[1]) == 1 and got[0] | got[1] == set(topics):
                break
            assert time.monotonic() < deadline, f"no split assignment: {got}"
        ends = a.end_offsets(list(a.assignment()))
        a.commit({tp: _offset_and_metadata(end) for tp, end in ends.items()})
        b.close()
        deadline = time.monotonic() + 30
        while {tp.topic for tp in a.assignment()} != set(topics):
            a.poll(timeout_ms=1000)
            assert time.monotonic() < deadline, f"the remaining member did not take over: {a.assignment()}"
        (owned_by_a, committed), = ends.items()
        assert a.committed(owned_by_a) == committed
    finally:
        a.close()
    c = KafkaConsumer(*topics, **settings)
    try:
        deadline = time.monotonic() + 30
        while owned_by_a not in c.assignment():
            c.poll(timeout_ms=1000)
            assert time.monotonic() < deadline
        assert c.committed(owned_by_a) == committed
        assert c.position(owned_by_a) >= committed          # resumed there, not from the beginning
    finally:
        c.close()


def _offset_and_metadata(offset: int) -> Any:
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(offset, "", -1)


def test_a_silent_member_expires_and_the_group_rebalances(kafka_cluster: NodeCluster) -> None:
    """A member that stops heartbeating is dropped after its session timeout (raw protocol, so the
    test decides when heartbeats stop)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    with RawKafka(kafka_cluster.bootstrap[0]) as raw:
        found = raw.call(FindCoordinatorRequest(key=group, key_type=0), FindCoordinatorResponse, 3)
        assert found.error_code == 0 and found.node_id == kafka_cluster.leader("offsets")
    with RawKafka(f"{found.host}:{found.port}") as raw:
        def join(member_id: str) -> Any:
            return raw.call(JoinGroupRequest(group_id=group, session_timeout_ms=1500, rebalance_timeout_ms=3000,
                                             member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                             protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                                                 name="range", metadata=b"m")]), JoinGroupResponse, 5)
        required = join("")
        assert required.error_code == 79 and required.member_id                         # MEMBER_ID_REQUIRED
        joined = join(required.member_id)
        assert joined.error_code == 0 and joined.leader == required.member_id
        assert [m.member_id for m in joined.members] == [required.member_id]
        synced = raw.call(SyncGroupRequest(group_id=group, generation_id=joined.generation_id,
                                           member_id=required.member_id, group_instance_id=None,
                                           assignments=[SyncGroupRequest.SyncGroupRequestAssignment(
                                               member_id=required.member_id, assignment=b"mine")]),
                          SyncGroupResponse, 3)
        assert synced.error_code == 0 and synced.assignment == b"mine"

        def heartbeat(generation: int) -> int:
            return raw.call(HeartbeatRequest(group_id=group, generation_id=generation, member_id=required.member_id,
                                             group_instance_id=None), HeartbeatResponse, 3).error_code

        assert heartbeat(joined.generation_id) == 0
        assert heartbeat(joined.generation_id + 7) == 22                                # ILLEGAL_GENERATION
        time.sleep(2.5)                                                                 # > session timeout
        assert heartbeat(joined.generation_id) == 25                                    # UNKNOWN_MEMBER_ID
    with RawKafka(kafka_cluster.bootstrap[0]) as raw:
        other = raw.call(FindCoordinatorRequest(key=group, key_type=0), FindCoordinatorResponse, 3)
        not_coordinator = next(n.kafka_address for i, n in kafka_cluster.nodes.items() if i != other.node_id)
    with RawKafka(not_coordinator) as raw:
        code = raw.call(HeartbeatRequest(group_id=group, generation_id=1, member_id="x", group_instance_id=None),
                        HeartbeatResponse, 3).error_code
        assert code == 16                                                               # NOT_COORDINATOR


@pytest.mark.parametrize("api", ["aiokafka"])
def test_aiokafka_producer_and_group_consumer(kafka_cluster: NodeCluster, api: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    tag = uuid.uuid4().hex[:8]
    group = f"aio-{tag}"

    async def main() -> tuple[list[int], list[Any]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            sent = [await producer.send_and_wait("__kv", _put(f"aio-{tag}/{i}")) for i in range(50)]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("__kv", bootstrap_servers=kafka_cluster.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            got: list[Any] = []
            last = sent[-1].offset
            async with asyncio.timeout(30):
                while not got or got[-1].offset < last:
                    batch = await consumer.getmany(timeout_ms=500)
                    for records in batch.values():
                        got.extend(records)
            await consumer.commit()
            assert await consumer.committed(KV) == got[-1].offset + 1
        finally:
            await consumer.stop()
        return [s.offset for s in sent], got

    offsets, records = asyncio.run(main())
    mine = {r.offset: r for r in records if r.key.startswith(f"kv/aio-{tag}/".encode())}
    assert sorted(mine) == offsets
    assert [ev.decode_event(mine[o].value).name for o in offsets] == [f"aio-{tag}/{i}" for i in range(50)]


def test_fetch_long_polls_until_a_commit_and_acks_1_answers_from_the_leaders_log(kafka_cluster: NodeCluster) -> None:
    import threading

    from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

    leader = kafka_cluster.leader("kv")
    tag = uuid.uuid4().hex[:8]

    def fetch(raw: RawKafka, offset: int, max_wait_ms: int) -> Any:
        return raw.call(FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                                     isolation_level=0, session_id=0, session_epoch=-1, topics=[
                                         FetchRequest.FetchTopic(topic="__kv", partitions=[
                                             FetchRequest.FetchTopic.FetchPartition(
                                                 partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                                 last_fetched_epoch=-1, log_start_offset=-1,
                                                 partition_max_bytes=1 << 20)])],
                                     forgotten_topics_data=[], rack_id=""), FetchResponse, 12).responses[0].partitions[0]

    with RawKafka(_kafka_of(kafka_cluster, leader)) as raw:
        hw = fetch(raw, 0, 0).high_watermark
        started = time.monotonic()
        idle = fetch(raw, hw, 700)                                   # nothing arrives: waits max_wait_ms
        assert 0.6 <= time.monotonic() - started < 5 and not idle.records
        written: list[int] = []

        def write_soon() -> None:
            time.sleep(0.5)
            with Client(kafka_cluster.endpoints, sessions=False) as client:   # one record: no session opened
                written.append(client.put(f"poll-{tag}/x", b"1").offset)

        writer = threading.Thread(target=write_soon)
        writer.start()
        started = time.monotonic()
        woken = fetch(raw, hw, 10_000)                               # answered when the write commits
        elapsed = time.monotonic() - started
        writer.join()
        assert elapsed < 8, elapsed
        assert woken.records and woken.high_watermark > written[0]
        one = _partition_result(raw.call(_produce(encode_batch([(None, _put(f"poll-{tag}/acks1"))], timestamp_ms=1),
                                                  acks=1), ProduceResponse, 9))
        assert one.error_code == 0 and one.base_offset > written[0]
    with Client(kafka_cluster.endpoints) as client:
        # acks=1 answers at the leader's append, before the commit: read once the record is applied.
        history = client.history(f"poll-{tag}/acks1", min_offset=one.base_offset)
        assert [row.offset for row in history] == [one.base_offset]


def test_created_topics_carry_any_records_and_consumer_groups(kafka_cluster: NodeCluster) -> None:
    """CreateTopics (sent to a follower of the metadata group: forwarded), duplicates and bad names
    refused; keyed records and tombstones read back per partition; the kv views hold the latest."""
    from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

    topic = f"orders-{uuid.uuid4().hex[:8]}"
    follower = next(i for i in kafka_cluster.running() if i != kafka_cluster.leader("metadata"))

    def create(raw: RawKafka, name: str, partitions: int = 3) -> Any:
        return raw.call(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=3, assignments=[], configs=[])],
            timeout_ms=5000, validate_only=False), CreateTopicsResponse, 3).topics[0]

    with RawKafka(_kafka_of(kafka_cluster, follower)) as raw:
        assert create(raw, topic).error_code == 0
        assert create(raw, topic).error_code == 36                                      # TOPIC_ALREADY_EXISTS
        assert create(raw, "__kv-x").error_code == 17                                   # reserved prefix
        assert create(raw, "bad name").error_code == 17
        assert create(raw, f"{topic}-0p", 0).error_code == 37                           # INVALID_PARTITIONS
        meta = raw.call(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                        allow_auto_topic_creation=False), MetadataResponse, 9)
        assert [p.partition_index for p in meta.topics[0].partitions] == [0, 1, 2]
    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all")
    try:
        sent = [producer.send(topic, key=f"k{i % 4}".encode(), value=f"v{i}".encode(), partition=i % 3)
                for i in range(60)]
        sent.append(producer.send(topic, key=b"k0", value=None, partition=0))          # a tombstone
        producer.flush(30)
        acked = [(f.get(10).partition, f.get(10).offset) for f in sent]
    finally:
        producer.close(5)
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_cluster.bootstrap, group_id=f"g-{topic}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        got: dict[tuple[int, int], Any] = {}
        deadline = time.monotonic() + 30
        while len(got) < len(acked):
            assert time.monotonic() < deadline, len(got)
            for records in consumer.poll(timeout_ms=1000).values():
                got.update({(r.partition, r.offset): r for r in records})
        assert sorted(got) == sorted(acked)
        for i, (partition, offset) in enumerate(acked[:60]):
            assert (got[(partition, offset)].key, got[(partition, offset)].value) == (f"k{i % 4}".encode(),
                                                                                      f"v{i}".encode())
        assert got[acked[-1]].value is None
        consumer.commit()
        tps = [TopicPartition(topic, i) for i in range(3)]
        ends = consumer.end_offsets(tps)
        assert {tp: consumer.committed(tp) for tp in tps} == {tp: ends[tp] for tp in tps}
        assert ends[tps[0]] == acked[-1][1] + 1                   # a hosted partition's own high watermark
    finally:
        consumer.close()
    with Client(kafka_cluster.endpoints) as client:
        assert client.get(f"kafka/{topic}/1/kazE").value == b"v49"                      # base64url("k1"), last one
        assert client.get(f"kafka/{topic}/0/kazA") is None                               # tombstoned


def test_metrics_count_what_the_face_produced_fetched_and_refused(kafka_cluster: NodeCluster) -> None:
    """/metrics of the kv leader counts the records and bytes kafka-python produced and fetched through
    it, and a follower counts the produce it refused (NOT_LEADER) by API and error name."""
    leader = kafka_cluster.leader("kv")
    follower = next(i for i in kafka_cluster.running() if i != leader)

    def counter(node: int, name: str, labels: tuple[tuple[str, str], ...]) -> float:
        return kafka_cluster.wait_metrics(node).get((f"epochlog_kafka_{name}_total", labels), 0.0)

    topic = (("topic", "__kv"),)
    before = {name: counter(leader, name, topic) for name in ("produced_records", "produced_bytes",
                                                               "fetched_records", "fetched_bytes")}
    refused = (("api", "Produce"), ("error", "NOT_LEADER_FOR_PARTITION"))
    refused_before = counter(follower, "errors", refused)
    tag = uuid.uuid4().hex[:8]
    count = 200
    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send("__kv", value=_put(f"metrics-{tag}/{i}")) for i in range(count)]
        producer.flush(30)
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(5)
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([KV])
        consumer.seek(KV, min(offsets))
        fetched = _consume_all(consumer, max(offsets) + 1)
    finally:
        consumer.close()
    with RawKafka(_kafka_of(kafka_cluster, follower)) as raw:
        result = _partition_result(raw.call(_produce(encode_batch([(None, _put("f/x"))], timestamp_ms=1)),
                                            ProduceResponse, 9))
        assert result.error_code == 6
    after = {name: counter(leader, name, topic) for name in before}
    # Only this test writes through the face now; records of other writers may be fetched with ours.
    assert after["produced_records"] - before["produced_records"] == count, (before, after)
    assert after["produced_bytes"] - before["produced_bytes"] > count * len(_put(f"metrics-{tag}/0"))
    assert after["fetched_records"] - before["fetched_records"] >= len(fetched) >= count, (before, after)
    assert after["fetched_bytes"] > before["fetched_bytes"]
    assert counter(follower, "errors", refused) == refused_before + 1
    assert counter(leader, "requests", (("api", "Produce"),)) >= 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) is not installed")
def test_promtool_finds_nothing_wrong_with_the_metrics(kafka_cluster: NodeCluster) -> None:
    """Every family of a Kafka-serving node, by Prometheus's own linter (names, units, help texts)."""
    leader = kafka_cluster.leader("kv")
    with urllib.request.urlopen(f"http://{kafka_cluster.nodes[leader].admin_address}/metrics", timeout=10) as r:
        text = r.read()
    assert b"epochlog_kafka_requests_total" in text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
