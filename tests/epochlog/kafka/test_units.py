"""The Kafka face's pure parts, without processes: the zero-copy Fetch encoding (decoded by
kafka-python's own classes), the producers' sequence checks (a real log and real views), the hosted-topic record
wrapping and the batches served for it (parsed by kafka-python's record reader), the group
protocol choice, the request framing (any cut of the stream) and the topic count read from a
Metadata request's bytes (against kafka-python's encoding of every version)."""

from __future__ import annotations

import mmap
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.record.memory_records import MemoryRecords

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from epochlog.kafka import errors as ke
from epochlog.kafka import hosted
from epochlog.kafka.errors import KafkaError, kafka_code
from epochlog.kafka.groups import Group, Member, _select_protocol
from epochlog.kafka import producers
from epochlog.kafka.wire import (
    LARGE_FRAME_BYTES,
    FetchPartitionOut,
    FrameTooLarge,
    RequestFrames,
    encode_fetch_response,
    metadata_topic_count,
)
from eventlog.config import LogConfig
from eventlog.errors import InvalidBatchError
from eventlog.log import Log
from eventlog.raft.errors import NotLeaderError
from eventlog.records import (
    Record,
    encode_batch,
    encode_records,
    iter_batches,
)
from eventlog.raft.runtime.entries import batch_to_entry
from statemachines import events as ev
from statemachines import producers as sp
from statemachines.store import encode_offset
from statemachines.views import ViewsStateMachine


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_responses_decode_with_kafka_pythons_classes(version: int) -> None:
    batch = encode_batch([(b"k", b"v")] * 3, timestamp_ms=1000, base_offset=10, leader_epoch=4)
    split = memoryview(batch)
    out = encode_fetch_response(version, [
        ("__kv", [FetchPartitionOut(0, 0, 13, 2, [split[:40], split[40:]]), FetchPartitionOut(1, 6)]),
        ("__metadata", [FetchPartitionOut(0, 1, 7, 3)])])
    decoded = FetchResponse.decode(b"".join(bytes(b) for b in out), version=version)
    kv, meta = decoded.responses
    assert (kv.topic, meta.topic) == ("__kv", "__metadata")
    assert bytes(kv.partitions[0].records) == batch and kv.partitions[0].high_watermark == 13
    assert kv.partitions[1].error_code == 6 and not kv.partitions[1].records
    assert meta.partitions[0].error_code == 1
    if version >= 5:
        assert kv.partitions[0].log_start_offset == 2


def test_fetch_records_are_views_not_copies() -> None:
    segment = bytearray(encode_batch([(b"k", b"v")], timestamp_ms=1))
    view = memoryview(segment)
    out = encode_fetch_response(12, [("t", [FetchPartitionOut(0, records=[view])])])
    assert any(b is view for b in out)


def _producer_batch(pid: int, epoch: int, seq: int, n: int, key: bytes = b"kv/x", at: int = 1) -> bytes:
    records = [(key, ev.encode_event(ev.KvPut(name=key.decode()[3:], value=b"v%d" % (seq + i)))) for i in range(n)]
    return encode_batch(records, timestamp_ms=at, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


class _Leader:
    """A group's log and views as a leader holds them: batches appended, some applied (`apply_to`)."""

    def __init__(self, root: Path) -> None:
        self.log = Log.open(root / "log", LogConfig(segment_bytes=4096, flush_policy="interval",
                                                    preallocate_next_segment=False))
        self.views = ViewsStateMachine(root / "views-group")

    def append(self, data: bytes) -> int:
        return self.log.append(data, epoch=1)

    def apply_to(self, offset: int) -> dict[int, Any]:
        entries = [batch_to_entry(b) for b in self.log.batches(self.views.applied_index + 1)
                   if b.header.base_offset <= offset]
        return dict(self.views.apply(entries))

    def check(self, pid: int, epoch: int, seq: int, n: int, partition: str = "") -> Any:
        return producers.check(self.views.store, self.log, self.views.applied_index, pid, epoch, seq, n, partition)

    def close(self) -> None:
        self.views.close()
        self.log.close()


def _refused(leader: _Leader, code: int, *args: Any) -> None:
    with pytest.raises(KafkaError) as refused:
        leader.check(*args)
    assert refused.value.kafka_code == code, refused.value


def test_the_leader_judges_a_batch_from_the_views_and_the_unapplied_tail(tmp_path: Path) -> None:
    leader = _Leader(tmp_path)
    try:
        assert leader.check(7, 0, 0, 3) is None                               # unknown producer, first batch
        _refused(leader, ke.UNKNOWN_PRODUCER_ID, 7, 0, 5, 1)                  # unknown, not from 0: refused
        leader.append(_producer_batch(7, 0, 0, 3))                            # offsets 0-2
        leader.append(encode_batch([(b"kv/y", ev.encode_event(ev.KvPut(name="y", value=b"v")))], timestamp_ms=1))
        leader.apply_to(3)                                                    # in the views now
        leader.append(_producer_batch(7, 0, 3, 2))                            # offsets 4-5: not applied yet
        retry = leader.check(7, 0, 0, 3)
        assert retry is not None and (retry.first_offset, retry.last_offset) == (0, 2)
        tail = leader.check(7, 0, 3, 2)
        assert tail is not None and (tail.first_offset, tail.last_offset) == (4, 5)
        assert leader.check(7, 0, 5, 1) is None                               # the next one
        _refused(leader, ke.OUT_OF_ORDER_SEQUENCE_NUMBER, 7, 0, 9, 1)         # a gap
        _refused(leader, ke.OUT_OF_ORDER_SEQUENCE_NUMBER, 7, 0, 1, 1)         # inside a stored batch
        leader.append(_producer_batch(7, 1, 0, 1))                            # a bumped epoch starts at 0
        leader.apply_to(10)
        assert leader.check(7, 1, 1, 1) is None
        _refused(leader, ke.INVALID_PRODUCER_EPOCH, 7, 0, 5, 1)
        # Sequences are per partition: a hosted partition's batches do not move the topic's.
        leader.append(_producer_batch(7, 1, 0, 4, key=b"kv/kafka/t/0/kAA"))
        assert leader.check(7, 1, 4, 1, "t/0") is None and leader.check(7, 1, 1, 1) is None
    finally:
        leader.close()


def test_a_batch_in_the_log_twice_is_applied_once_and_compaction_forgets_nothing(tmp_path: Path) -> None:
    """The applier judges every producer batch on the same rules: a second copy (a retry a new leader
    appended before it applied the first) changes nothing and answers with the first offsets. The state
    lives in the views, so a log cleaned of the producer's batches still knows them (the retry after a
    failover over a key-compacted log used to be appended again)."""
    leader = _Leader(tmp_path)
    try:
        leader.append(_producer_batch(7, 0, 0, 2, key=b"kv/a"))               # 0-1
        leader.append(_producer_batch(7, 0, 0, 2, key=b"kv/a"))               # 2-3: the same batch again
        for i in range(60):
            leader.append(encode_batch([(b"kv/a", ev.encode_event(ev.KvPut(name="a", value=b"x" * 100)))],
                                       timestamp_ms=1))
        outcomes = leader.apply_to(leader.log.end_offset)
        assert outcomes[2].duplicate and outcomes[2].offset == 0 and outcomes[3].offset == 1
        assert leader.views.store.get("noops", encode_offset(2)) is not None
        clean_log(leader.log, leader.log.segment_bases()[-1], CleanerConfig(worker_process=False), force=True,
                  drop_offsets=[2, 3])
        assert not [b for b in leader.log.batches() if b.header.producer_id == 7], "the cleaner dropped them"
        retry = leader.check(7, 0, 0, 2)
        assert retry is not None and retry.first_offset == 0
        _refused(leader, ke.OUT_OF_ORDER_SEQUENCE_NUMBER, 7, 0, 5, 1)
    finally:
        leader.close()


def test_producer_state_expires_by_committed_time_then_only_a_new_start_is_accepted(tmp_path: Path) -> None:
    leader = _Leader(tmp_path)
    try:
        t0 = 1_700_000_000_000
        leader.append(_producer_batch(7, 0, 0, 2, at=t0))
        leader.append(encode_batch([(b"kv/y", ev.encode_event(ev.KvPut(name="y", value=b"v")))],
                                   timestamp_ms=t0 + sp.PRODUCER_EXPIRY_MS + 1))
        leader.apply_to(leader.log.end_offset)
        assert sp.load(leader.views.store, "", 7) is None
        _refused(leader, ke.UNKNOWN_PRODUCER_ID, 7, 0, 0 + 2, 1)
        assert leader.check(7, 0, 0, 1) is None
    finally:
        leader.close()


@pytest.mark.parametrize("key", [None, b"", b"k", bytes(range(256)), "ключ".encode()])
def test_hosted_records_wrap_as_valid_kv_events_and_unwrap(key: bytes | None) -> None:
    for value in (b"v", b"", None):
        event = hosted.wrap("orders", 3, key, value)
        entity, encoded = ev.event_record(event)                       # validates
        assert entity.startswith(hosted.entity_prefix("orders", 3))
        assert sp.partition_of(entity) == "orders/3"
        assert hosted.unwrap(hosted.entity_prefix("orders", 3), entity, encoded) == (key, value)
        assert hosted.unwrap(hosted.entity_prefix("orders", 4), entity, encoded) is None


def test_hosted_partitions_are_served_as_batches_kafka_python_reads(tmp_path: Path) -> None:
    """Records of one partition among the kv group's other entries: the batches span the source
    offsets (so consumers move past the others) and hold exactly the partition's records."""
    rng = random.Random(5)
    source = []
    offset = 0
    expected = []
    for epoch in (1, 1, 2, 2, 3):
        records = []
        for _ in range(rng.randrange(1, 6)):
            if rng.random() < 0.5:
                key = f"k{rng.randrange(99)}".encode()
                value = None if rng.random() < 0.2 else f"v{offset}".encode()
                entity, encoded = ev.event_record(hosted.wrap("t", 0, key, value))
                expected.append((offset, key, value))
            else:
                entity, encoded = ev.event_record(ev.KvPut(name=f"other/{offset}", value=b"x"))
            records.append(Record(offset, 1000 + offset, entity, encoded))
            offset += 1
        source.append(encode_records(records, leader_epoch=epoch))
    data = b"".join(source)
    served = hosted.filter_batches(iter_batches(data), hosted.entity_prefix("t", 0), 0)
    parsed = MemoryRecords(b"".join(served))
    got = []
    last = -1
    epochs = []
    while (batch := parsed.next_batch()) is not None:
        assert batch.validate_crc()
        epochs.append(batch.leader_epoch)
        got += [(r.offset, r.key, r.value) for r in batch]
        last = batch.base_offset + batch.last_offset_delta
    assert got == expected
    assert last == offset - 1 and epochs == [1, 2, 3]                  # spans every source offset, by epoch


def test_hosted_batches_reach_the_partitions_high_watermark() -> None:
    """A kv batch that runs past the partition's watermark (a record of another key after its last one)
    is served up to the watermark only; a range with nothing of the partition left (key compaction
    dropped its last record) is one empty span: a reader's position always reaches the watermark."""
    prefix = hosted.entity_prefix("t", 0)
    mine = ev.event_record(hosted.wrap("t", 0, b"k", b"v"))
    other = ev.event_record(ev.KvPut(name="other", value=b"x"))
    batch = encode_records([Record(10, 1, *mine), Record(11, 1, *other), Record(12, 1, *mine)], base_offset=10,
                           leader_epoch=3)

    def parse(served: list[bytes]) -> list[tuple[int, int, list[int]]]:
        records = MemoryRecords(b"".join(served))
        out = []
        while (b := records.next_batch()) is not None:
            assert b.validate_crc()
            out.append((b.base_offset, b.base_offset + b.last_offset_delta, [r.offset for r in b]))
        return out

    assert parse(hosted.filter_batches(iter_batches(batch), prefix, 10, until=11)) == [(10, 10, [10])]
    assert parse(hosted.filter_batches(iter_batches(batch), prefix, 10, until=13)) == [(10, 12, [10, 12])]
    later = encode_records([Record(20, 1, *other)], base_offset=20, leader_epoch=3)
    assert parse(hosted.filter_batches(iter_batches(later), prefix, 14, until=17, epoch=3)) == [(14, 16, [])]
    assert parse(hosted.filter_batches(iter_batches(b""), prefix, 14, until=17, epoch=3)) == [(14, 16, [])]
    assert hosted.filter_batches(iter_batches(later), prefix, 17, until=17) == []


def test_errors_map_through_one_table() -> None:
    assert kafka_code(NotLeaderError(1, 2, 3)) == ke.NOT_LEADER_OR_FOLLOWER
    assert kafka_code(InvalidBatchError("crc")) == ke.CORRUPT_MESSAGE
    assert kafka_code(ev.EventError("bad")) == ke.INVALID_RECORD
    assert kafka_code(TimeoutError()) == ke.REQUEST_TIMED_OUT
    assert kafka_code(RuntimeError("bug")) == ke.UNKNOWN_SERVER_ERROR


def test_the_group_protocol_is_the_one_most_members_prefer_among_those_all_support() -> None:
    group = Group("g")
    for i, prefs in enumerate([["range", "roundrobin"], ["roundrobin", "range"], ["roundrobin", "sticky"]]):
        group.members[f"m{i}"] = Member(f"m{i}", None, "c", 1000, 1000, "consumer",
                                        [(name, b"") for name in prefs], 0.0)
    assert _select_protocol(group) == "roundrobin"


def test_request_frames_are_cut_from_any_cut_of_the_stream() -> None:
    seed = random.SystemRandom().getrandbits(32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    for _ in range(100):
        bodies = [rng.randbytes(rng.choice([0, 1, 17, 5000, LARGE_FRAME_BYTES + 1, 3 * LARGE_FRAME_BYTES]))
                  for _ in range(rng.randint(1, 5))]
        stream = b"".join(struct.pack(">i", len(b)) + b for b in bodies)
        frames = RequestFrames(100 << 20)
        got: list[bytes] = []
        pos = 0
        while pos < len(stream):
            n = rng.choice([1, 3, 4, 5, 999, 1 << 16, 1 << 20, 4 << 20])
            got += [bytes(f) for f in frames.feed(stream[pos:pos + n])]
            pos += n
            assert frames.pending_bytes <= max(len(b) + 4 for b in bodies)
        assert got == bodies
        assert frames.pending_bytes == 0


def test_a_large_frame_is_a_view_of_its_own_mapping_filled_as_it_arrives() -> None:
    size = 3 * LARGE_FRAME_BYTES
    frames = RequestFrames(100 << 20)
    assert frames.feed(struct.pack(">i", size) + b"a" * 10) == []
    assert frames.pending_bytes == 10                       # what arrived, not what is declared
    assert frames.feed(b"b" * (size - 11)) == []
    frame, after = frames.feed(b"c" + struct.pack(">i", 2) + b"xy")
    assert len(frame) == size and bytes(frame[:10]) == b"a" * 10 and bytes(frame[-1:]) == b"c"
    assert isinstance(frame.obj, mmap.mmap) and bytes(after) == b"xy"
    assert frames.pending_bytes == 0


@pytest.mark.parametrize("size", [-1, (100 << 20) + 1])
def test_a_frame_above_the_limit_is_refused_at_its_size(size: int) -> None:
    with pytest.raises(FrameTooLarge):
        RequestFrames(100 << 20).feed(struct.pack(">i", size))


@pytest.mark.parametrize("version", range(0, 14))
def test_the_topics_of_a_metadata_request_are_counted_from_its_bytes(version: int) -> None:
    for topics in (None, [], ["a"], [f"topic-{i}" for i in range(1500)]):
        if topics is None and version == 0:
            continue                                        # v0 has no null list (empty means all)
        request = MetadataRequest(topics=None if topics is None else [
            MetadataRequest.MetadataRequestTopic(name=t) for t in topics], allow_auto_topic_creation=False)
        request.API_VERSION = version
        for client_id in (None, "", "a-client"):
            request.with_header(correlation_id=7, client_id=client_id)
            frame = memoryview(bytes(request.encode(header=True)))
            assert metadata_topic_count(frame, version) == (-1 if topics is None else len(topics))
    with pytest.raises((ValueError, struct.error)):
        metadata_topic_count(memoryview(b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00"), 12)
