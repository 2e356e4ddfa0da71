"""The Kafka face's limits (docs/kafka.md, "Limits"), against one real `epochlog serve` process.

Each limit is met from both sides: what is within it is served, one more is refused the way the docs
say (a Kafka error code, or a closed connection where Kafka has no code for it). The same requests
at the scale found from outside (200,000 topics, a 200 MiB gzip bomb, 5,000 JoinGroups, 3 x 90 MiB
partial frames) are in tests/epochlog/node/test_loop_bounds.py, with the loop and memory measured.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
)
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from eventlog.records import encode_batch
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.epochlog.kafka.raw import RawKafka
from tests.support.wait import wait_until

MAX_GROUPS = 3
MAX_MEMBERS = 2
MAX_CONNECTIONS = 12
FRAME_TIMEOUT_MS = 1_000
GROUP_MAX_SIZE_REACHED = 81
MEMBER_ID_REQUIRED = 79
MESSAGE_TOO_LARGE = 10


@pytest.fixture
def node(kafka_cluster_factory: Callable[..., NodeCluster]) -> NodeCluster:
    cluster = kafka_cluster_factory(size=1, log={"max_batch_bytes": 64 << 10}, kafka_config={
        "max_groups": MAX_GROUPS, "max_group_members": MAX_MEMBERS, "max_connections": MAX_CONNECTIONS,
        "frame_timeout_ms": FRAME_TIMEOUT_MS})
    cluster.start()
    for group in cluster.groups:
        cluster.leader(group)
    return cluster


def _join(raw: RawKafka, group: str, member_id: str = "", version: int = 5, session_ms: int = 60_000) -> Any:
    return raw.call(JoinGroupRequest(group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=60_000,
                                     member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                     protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")]),
                    JoinGroupResponse, version)


def _leave(raw: RawKafka, group: str, member_id: str) -> int:
    return int(raw.call(LeaveGroupRequest(group_id=group, member_id=member_id), LeaveGroupResponse, 1).error_code)


def test_groups_and_members_past_their_caps_are_refused_and_idle_groups_make_room(node: NodeCluster) -> None:
    with RawKafka(node.bootstrap[0]) as raw:
        def joined(group: str) -> str:
            """The member id a new member of `group` gets; a group left empty leaves memory once its
            empty state is stored, so a join right after its LeaveGroup may be refused: it is tried again."""
            answers: list[Any] = []
            wait_until(lambda: answers.append(_join(raw, group, version=3)) or answers[-1].error_code == 0, 10,
                       f"a member of {group} to join (last answer: {answers[-1] if answers else None})", interval=0.2)
            return str(answers[-1].member_id)

        # Groups left empty leave memory when room is needed: no cap on how many groups a coordinator
        # serves over time.
        for i in range(2 * MAX_GROUPS):
            group = f"passing-{i}"
            assert _leave(raw, group, joined(group)) == 0

        # Groups with members stay; one more is refused.
        held = [(f"held-{i}", joined(f"held-{i}")) for i in range(MAX_GROUPS)]

        def refused_a_new_group() -> bool:   # the last passing group's state may still be being stored
            return _join(raw, "one-more", version=3).error_code == GROUP_MAX_SIZE_REACHED
        wait_until(refused_a_new_group, 10, "a group past max_groups to be refused", interval=0.2)
        assert _join(raw, "held-0", held[0][1], version=3).error_code == 0      # a member of a held group rejoins
        group, member = held.pop()
        assert _leave(raw, group, member) == 0
        wait_until(lambda: _join(raw, "one-more", version=3).error_code == 0, 10, "room after a group emptied",
                   interval=0.2)

        # Members: joined plus handed out (MEMBER_ID_REQUIRED) count; a handed-out id lapses after
        # the session timeout it was asked with.
        first = _join(raw, "held-0", session_ms=1_000)
        assert first.error_code == MEMBER_ID_REQUIRED                             # held-0 has 1 member + this one
        assert _join(raw, "held-0", session_ms=1_000).error_code == GROUP_MAX_SIZE_REACHED
        wait_until(lambda: _join(raw, "held-0", session_ms=1_000).error_code == MEMBER_ID_REQUIRED, 10,
                   "a handed-out member id to lapse", interval=0.2)


def _fetch(partitions: int) -> FetchRequest:
    return FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic="__kv", partitions=[
                            FetchRequest.FetchTopic.FetchPartition(partition=i, current_leader_epoch=-1, fetch_offset=0,
                                                                   last_fetched_epoch=-1, log_start_offset=-1,
                                                                   partition_max_bytes=1 << 10)
                            for i in range(partitions)])], forgotten_topics_data=[], rack_id="")


def _metadata(topics: int) -> MetadataRequest:
    return MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=f"t{i}") for i in range(topics)],
                           allow_auto_topic_creation=False)


def test_a_request_with_more_than_1000_entries_closes_the_connection(node: NodeCluster) -> None:
    """Entries of every array count: a Fetch of 999 partitions of one topic holds 1,000."""
    with RawKafka(node.bootstrap[0]) as raw:
        fetched = raw.call(_fetch(999), FetchResponse, 12)
        assert len(fetched.responses[0].partitions) == 999
        meta = raw.call(_metadata(1000), MetadataResponse, 12)
        assert len(meta.topics) == 1000 and {t.error_code for t in meta.topics} == {3}   # UNKNOWN_TOPIC
    for request in (_fetch(1000), _metadata(1001)):
        with RawKafka(node.bootstrap[0]) as raw:
            raw.send(request, 12)
            assert raw.closed_by_peer(), f"{type(request).__name__} with 1001 entries was served"


def test_a_batch_above_the_batch_limit_is_message_too_large(node: NodeCluster) -> None:
    def produce(raw: RawKafka, records: bytes) -> int:
        return int(raw.call(ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
            ProduceRequest.TopicProduceData(name="__kv", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])]),
            ProduceResponse, 7).responses[0].partition_responses[0].error_code)

    def puts(n: int, size: int) -> list[tuple[bytes | None, bytes | None]]:
        return [ev.event_record(ev.KvPut(name=f"limits/{i}", value=b"v" * size)) for i in range(n)]

    def gzipped(records: list[tuple[bytes | None, bytes | None]]) -> bytes:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=1, is_transactional=False, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=2**31 - 1)
        for i, (key, value) in enumerate(records):
            builder.append(i, timestamp=0, key=key, value=value, headers=[])
        return bytes(builder.build())

    with RawKafka(node.bootstrap[0]) as raw:
        assert produce(raw, encode_batch(puts(2, 100), timestamp_ms=0)) == 0
        assert produce(raw, gzipped(puts(2, 100))) == 0
        assert produce(raw, encode_batch(puts(80, 1000), timestamp_ms=0)) == MESSAGE_TOO_LARGE   # 80 KB > 64 KiB
        # Compressed under the limit, inflating past it: refused too (and it inflates no further).
        small_but_large = gzipped(puts(80, 1000))
        assert len(small_but_large) < 16 << 10
        assert produce(raw, small_but_large) == MESSAGE_TOO_LARGE


def test_connections_past_the_cap_and_stalled_frames_are_closed(node: NodeCluster) -> None:
    host, port = node.bootstrap[0].rsplit(":", 1)
    kept = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            extra.settimeout(5)
            try:
                assert extra.recv(1) == b"", "a connection past max_connections stays open"
            except ConnectionResetError:
                pass
        # A frame that stops half way is closed after frame_timeout_ms; the others stay open.
        stalled = kept[0]
        stalled.sendall(struct.pack(">i", 1000) + b"\x00" * 10)
        stalled.settimeout(FRAME_TIMEOUT_MS / 1000 + 5)
        started = time.monotonic()
        try:
            assert stalled.recv(1) == b""
        except ConnectionResetError:
            pass
        assert time.monotonic() - started < FRAME_TIMEOUT_MS / 1000 + 3
        for conn in kept[1:]:
            conn.close()
        kept.clear()

        def served() -> bool:                         # room again, once the node saw them closed
            try:
                with RawKafka(node.bootstrap[0]) as raw:
                    return len(raw.call(_metadata(1), MetadataResponse, 12).topics) == 1
            except (ConnectionError, OSError):
                return False
        wait_until(served, 10, "a connection served after the others closed", interval=0.2)
    finally:
        for conn in kept:
            conn.close()


def test_a_fetch_of_hosted_partitions_re_encodes_a_bounded_part_of_the_kv_log(node: NodeCluster) -> None:
    """Hosted partitions are re-encoded from the kv log on the loop: whatever a Fetch asks (64 MiB a
    partition here), it gets what about 1 MiB of the kv log holds, and fetching on reaches the end.
    Every record arrives: a read cut short (by that bound, or at the end of a segment: 1 MiB here)
    used to be answered with an empty batch spanning the rest up to the watermark, so a consumer
    skipped what it had not been sent (17 of 48 records after 20 fetches)."""
    records, value = 48, b"v" * 60_000          # one batch each (the test's batch limit is 64 KiB): 2.9 MB
    with RawKafka(node.bootstrap[0]) as raw:
        created = raw.call(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name="hosted", num_partitions=2, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=5000, validate_only=False), CreateTopicsResponse, 3).topics[0]
        assert created.error_code == 0, created
        for i in range(records):
            builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                                producer_epoch=-1, base_sequence=-1, batch_size=2**31 - 1)
            builder.append(0, timestamp=0, key=f"k{i}".encode(), value=value, headers=[])
            produced = raw.call(ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                ProduceRequest.TopicProduceData(name="hosted", partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=i % 2, records=bytes(builder.build()))])]),
                ProduceResponse, 7).responses[0].partition_responses[0]
            assert produced.error_code == 0, produced

        def fetch(offsets: list[int]) -> list[Any]:
            return raw.call(FetchRequest(
                replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=256 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[FetchRequest.FetchTopic(topic="hosted", partitions=[
                    FetchRequest.FetchTopic.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=o,
                                                           last_fetched_epoch=-1, log_start_offset=-1,
                                                           partition_max_bytes=64 << 20)
                    for p, o in enumerate(offsets)])], forgotten_topics_data=[], rack_id=""),
                FetchResponse, 12).responses[0].partitions

        offsets, got, rounds = [0, 0], 0, 0
        while got < records:
            rounds += 1
            assert rounds <= 20, f"{got} of {records} records after 20 fetches"
            parts = fetch(offsets)
            size = sum(len(p.records or b"") for p in parts)
            assert size < (1 << 20) + 2 * 70_000, f"{size} bytes in one Fetch"
            for p in parts:
                for batch in _batches(p.records or b""):
                    got += sum(1 for r in batch if r.value == value)
                    offsets[p.partition_index] = max(offsets[p.partition_index], batch.next_offset)
        assert got == records and rounds >= 3, (got, rounds)   # 2.9 MB took several fetches


def _batches(data: bytes) -> list[Any]:
    records = MemoryRecords(data)
    out = []
    while (batch := records.next_batch()) is not None:
        out.append(batch)
    return out
