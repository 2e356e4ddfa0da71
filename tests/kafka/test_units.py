"""The Kafka face's pure parts, without processes: the zero-copy Fetch encoding (decoded by
kafka-python's own classes), the producer sequence table (fed a real log), the hosted-topic record
wrapping and the batches served for it (parsed by kafka-python's record reader), the group
protocol choice."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.record.memory_records import MemoryRecords

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from epochlog.kafka import errors as ke
from epochlog.kafka import hosted
from epochlog.kafka.errors import KafkaError, kafka_code
from epochlog.kafka.groups import Group, Member, _select_protocol
from epochlog.kafka.producers import ProducerStateTable
from epochlog.kafka.wire import FetchPartitionOut, encode_fetch_response
from eventlog.config import LogConfig
from eventlog.errors import InvalidBatchError
from eventlog.log import Log
from eventlog.raft.errors import NotLeaderError
from eventlog.records import (
    Record,
    RecordBatch,
    encode_batch,
    encode_records,
    iter_batches,
    read_header,
    retain_records,
)
from statemachines import events as ev


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


def _producer_batch(pid: int, epoch: int, seq: int, n: int, key: bytes = b"kv/x") -> bytes:
    return encode_batch([(key, b"v")] * n, timestamp_ms=1, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_the_producer_table_dedupes_refuses_gaps_and_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "log", LogConfig(segment_bytes=1 << 20, flush_policy="interval"))
    try:
        table = ProducerStateTable()
        table.sync(log, term=1)
        assert table.check(7, 0, 0, 3) is None                         # unknown producer: append
        log.append(_producer_batch(7, 0, 0, 3), epoch=1)
        log.append(encode_batch([(b"kv/y", b"v")], timestamp_ms=1), epoch=1)   # not a producer's batch
        log.append(_producer_batch(7, 0, 3, 2), epoch=1)
        table.sync(log, term=1)
        retry = table.check(7, 0, 0, 3)
        assert retry is not None and (retry.first_offset, retry.last_offset) == (0, 2)
        assert table.check(7, 0, 3, 2) is not None and table.check(7, 0, 3, 2).first_offset == 4
        assert table.check(7, 0, 5, 1) is None                         # the next one
        with pytest.raises(KafkaError) as gap:
            table.check(7, 0, 9, 1)
        assert gap.value.kafka_code == ke.OUT_OF_ORDER_SEQUENCE_NUMBER
        with pytest.raises(KafkaError) as zombie:
            table.check(7, 0, 1, 1)                                     # inside a stored batch
        assert zombie.value.kafka_code == ke.OUT_OF_ORDER_SEQUENCE_NUMBER
        log.append(_producer_batch(7, 1, 0, 1), epoch=1)               # a bumped epoch starts at 0
        fresh = ProducerStateTable()
        fresh.sync(log, term=2)                                        # a new leader reads it all
        assert fresh.check(7, 1, 1, 1) is None
        with pytest.raises(KafkaError) as fenced:
            fresh.check(7, 0, 5, 1)
        assert fenced.value.kafka_code == ke.INVALID_PRODUCER_EPOCH
        # Sequences are per partition: a hosted partition's batches do not move the topic's.
        log.append(_producer_batch(7, 1, 0, 4, key=b"kv/kafka/t/0/kAA"), epoch=1)
        fresh.sync(log, term=2)
        assert fresh.check(7, 1, 4, 1, "t/0") is None and fresh.check(7, 1, 1, 1) is None
    finally:
        log.close()


def test_the_producer_table_rebuilds_from_past_the_key_compacted_range(tmp_path: Path) -> None:
    """Key compaction may drop a producer's newest batch whole (or some of its records) and keep an
    older one: a new leader reads producer state only from where the log is as written, so the
    producer is unknown (its next batch accepted) instead of seeing a gap."""
    config = LogConfig(segment_bytes=4096, flush_policy="interval", preallocate_next_segment=False)
    log = Log.open(tmp_path / "log", config)
    try:
        log.append(_producer_batch(7, 0, 0, 2, key=b"kv/a"), epoch=1)          # seq 0-1: kept (a is never rewritten)
        log.append(_producer_batch(7, 0, 2, 3, key=b"kv/b"), epoch=1)          # seq 2-4: b is rewritten below
        for i in range(60):
            log.append(encode_batch([(b"kv/b", b"x" * 100)], timestamp_ms=1), epoch=1)
        clean_log(log, log.segment_bases()[-1], CleanerConfig(worker_process=False))
        assert log.clean_end_offset > 5 and [b.header.base_sequence for b in log.batches()
                                             if b.header.producer_id == 7] == [0]
        fresh = ProducerStateTable()
        fresh.sync(log, term=2)
        assert fresh.check(7, 0, 5, 1) is None          # the producer's next batch: no gap from the older one
        log.append(_producer_batch(7, 0, 5, 1), epoch=1)
        fresh.sync(log, term=2)
        with pytest.raises(KafkaError) as gap:
            fresh.check(7, 0, 9, 1)                     # known again from its batch above the range
        assert gap.value.kafka_code == ke.OUT_OF_ORDER_SEQUENCE_NUMBER
    finally:
        log.close()


def test_a_batch_that_lost_records_keeps_its_last_sequence(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "log", LogConfig(segment_bytes=1 << 20, flush_policy="interval"))
    try:
        raw = bytearray(encode_batch([(b"kv/a", b"1"), (b"kv/b", b"2"), (b"kv/c", b"3")], timestamp_ms=1,
                                     producer_id=7, producer_epoch=0, base_sequence=10))
        header = read_header(raw)
        kept = list(RecordBatch.parse(raw).records())[:1]        # what compaction leaves of it
        log.append(retain_records(header, kept), epoch=1)
        table = ProducerStateTable()
        table.sync(log, term=1)
        assert table.check(7, 0, 13, 1) is None                   # 10..12 were the batch: 13 follows
    finally:
        log.close()


@pytest.mark.parametrize("key", [None, b"", b"k", bytes(range(256)), "ключ".encode()])
def test_hosted_records_wrap_as_valid_kv_events_and_unwrap(key: bytes | None) -> None:
    for value in (b"v", b"", None):
        event = hosted.wrap("orders", 3, key, value)
        entity, encoded = ev.event_record(event)                       # validates
        assert entity.startswith(hosted.entity_prefix("orders", 3))
        assert hosted.partition_key_of(entity) == "orders/3"
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
