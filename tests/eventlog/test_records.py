"""Tests of the RecordBatch v2 codec (`eventlog.records`) against kafka-python 3.x as the oracle.

Theory of the tests:

* Both directions of Kafka compatibility. Every batch we encode (`encode_batch`,
  `encode_records`, stamped or not) is read by kafka-python's `MemoryRecords` /
  `DefaultRecordBatch` with a valid CRC and the same offsets, timestamps, keys, values, headers,
  producer fields and leader epoch; every batch kafka-python's `DefaultRecordBatchBuilder`
  builds, plain or gzip, reads back the same through `RecordBatch.parse(...).records()`. Where
  the inputs coincide (base offset 0, epoch 0) our bytes equal the builder's bytes exactly.
* Round trips: varints over the whole int64 range, and encode -> parse -> the same records.
* Damage: any change of at most four consecutive bytes inside the CRC range is caught (CRC32C
  detects every burst of up to 32 bits, so these tests cannot pass by luck); truncation at every
  length, a wrong magic and every wrong batch length give `InvalidBatchError` (and a reason string
  from `check_batch`), never another exception type. Damage that keeps the CRC valid (the CRC is
  recomputed after the change) is checked against kafka-python: both decoders must either reject
  the batch or agree on its records.

Offsets in kafka-python's builder are offset deltas (the builder always writes base offset 0 and
leader epoch 0); the tests stamp real values in with `stamp`, which is what the log does.
"""

from __future__ import annotations

import gzip
import itertools
import random
import struct
import tracemalloc
import zlib
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import encode_varint as kafka_encode_varint
from kafka.record.util import size_of_varint as kafka_size_of_varint

from eventlog.errors import BatchTooLargeError, InvalidBatchError, UnsupportedCompressionError
from eventlog.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_NAMES,
    CRC_OFFSET,
    EPOCH_OFFSET,
    HEADER,
    HEADER_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Record,
    RecordBatch,
    batch_size_at,
    check_batch,
    crc32c,
    decode_records,
    decode_varint,
    encode_batch,
    encode_records,
    encode_varint,
    gunzip,
    iter_batches,
    read_header,
    record_rows,
    records_payload,
    stamp,
)
from tests.eventlog import strategies as s
from tests.support.seeds import soak

# Large values make single examples slow-ish (tens of kB through two codecs); the counts below
# keep the whole file near 25 s of the suite while every test still sees a score or more of distinct
# batches (hypothesis draws new ones each run). EPOCHLOG_SOAK=<k> runs k times as many
# (tests/support/seeds.py): the counts before the suite's time bound were those of EPOCHLOG_SOAK=2.
FEW = settings(max_examples=soak(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=soak(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(max_examples=soak(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])

GZIP = 1
RecordTuple = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


# --- helpers -------------------------------------------------------------------------------------

def ours(data: bytes | bytearray, *, verify_crc: bool = True) -> list[RecordTuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in RecordBatch.parse(data, verify_crc=verify_crc).records()]


def as_tuples(records: Sequence[Record]) -> list[RecordTuple]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]


def kafka_read(data: bytes | bytearray) -> list[tuple[DefaultRecordBatch, list[RecordTuple]]]:
    """Every batch in `data` as kafka-python reads it, asserting its CRC and framing."""
    out = []
    records = MemoryRecords(bytes(data))
    consumed = 0
    while records.has_next():
        batch = records.next_batch()
        assert isinstance(batch, DefaultRecordBatch)
        assert batch.validate_crc(), "kafka-python rejects the CRC"
        consumed += batch.size_in_bytes
        out.append((batch, [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]))
    assert consumed == len(data), "kafka-python did not consume every byte"
    return out


def kafka_read_one(data: bytes | bytearray) -> tuple[DefaultRecordBatch, list[RecordTuple]]:
    (only,) = kafka_read(data)
    return only


def kafka_build(records: Sequence[Record], *, compression: int = 0,
                producer: s.Producer = s.Producer()) -> bytearray:
    """kafka-python's builder; `records[i].offset` is written as the offset delta."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=producer.transactional,
        producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
        base_sequence=producer.base_sequence, batch_size=2**31 - 1)
    for r in records:
        meta = builder.append(r.offset, timestamp=r.timestamp, key=r.key, value=r.value,
                              headers=list(r.headers))
        assert meta is not None
    return builder.build()


def assert_same_header(ours_h: BatchHeader, theirs: DefaultRecordBatch) -> None:
    assert (ours_h.base_offset, ours_h.leader_epoch, ours_h.magic, ours_h.crc, ours_h.attributes,
            ours_h.last_offset_delta, ours_h.base_timestamp, ours_h.max_timestamp, ours_h.producer_id,
            ours_h.producer_epoch, ours_h.base_sequence, ours_h.records_count) == (
        theirs.base_offset, theirs.leader_epoch, theirs.magic, theirs.crc, theirs.attributes,
        theirs.last_offset_delta, theirs.first_timestamp, theirs.max_timestamp, theirs.producer_id,
        theirs.producer_epoch, theirs.base_sequence, theirs.records_count)
    assert ours_h.size == theirs.size_in_bytes
    assert ours_h.last_offset == theirs.last_offset
    assert ours_h.next_offset == theirs.next_offset
    assert ours_h.compression == theirs.compression_type
    assert ours_h.is_transactional == theirs.is_transactional
    assert ours_h.is_control == theirs.is_control_batch


def recrc(buf: bytearray) -> None:
    """Recompute the CRC in place, so that only the checks after the CRC can catch a change."""
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c(bytes(buf[ATTRIBUTES_OFFSET:])))


def reframe(buf: bytearray) -> None:
    """Fix batchLength and the CRC after bytes were inserted or removed."""
    struct.pack_into(">i", buf, LENGTH_OFFSET, len(buf) - LOG_OVERHEAD)
    recrc(buf)


def decode_or_reject(data: bytes | bytearray, *, verify_crc: bool = True) -> list[RecordTuple] | None:
    """Our records, or None when the codec rejects the batch with InvalidBatchError (and only that)."""
    try:
        return ours(data, verify_crc=verify_crc)
    except InvalidBatchError:
        return None


def drain(data: bytes | bytearray, *, verify_crc: bool) -> list[RecordBatch]:
    """All of iter_batches, bounded: every batch is at least a header long, so more means a loop."""
    limit = len(data) // HEADER_SIZE + 1
    out = list(itertools.islice(iter_batches(data, verify_crc=verify_crc), limit + 1))
    assert len(out) <= limit, "iter_batches does not advance"
    return out


def _compressible(records: list[Record]) -> list[Record]:
    """Append a record gzip shrinks a lot, so kafka-python's builder really compresses."""
    last = records[-1]
    return [*records, Record(last.offset + 1, last.timestamp, None, b"\x00" * 2048)]


# --- varints -------------------------------------------------------------------------------------

@MANY
@given(n=st.integers(*s.INT64), before=st.binary(max_size=4), after=st.binary(max_size=4))
def test_varint_round_trips_over_the_int64_range_and_matches_kafka(n: int, before: bytes,
                                                                   after: bytes) -> None:
    encoded = encode_varint(n)
    theirs = bytearray()
    kafka_encode_varint(n, theirs.append)
    assert encoded == bytes(theirs)
    assert len(encoded) == kafka_size_of_varint(n) <= 10
    buf = before + encoded + after
    assert decode_varint(buf, len(before)) == (n, len(before) + len(encoded))
    assert decode_varint(memoryview(buf), len(before)) == (n, len(before) + len(encoded))


@pytest.mark.parametrize(("n", "encoded"), [
    (0, "00"), (-1, "01"), (1, "02"), (63, "7e"), (-64, "7f"), (64, "8001"), (-65, "8101"),
    (8191, "fe7f"), (8192, "808001"), (16383, "feff01"), (16384, "808002"),
    (2**20 - 1, "feff7f"), (2**20, "80808001"),
    (2**63 - 1, "feffffffffffffffff01"), (-(2**63), "ffffffffffffffffff01"),
])
def test_varint_known_encodings(n: int, encoded: str) -> None:
    assert encode_varint(n).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded), 0) == (n, len(encoded) // 2)


@SOME
@given(n=st.integers(*s.INT64).filter(lambda n: not -64 <= n < 64))
def test_truncated_varint_is_invalid_batch(n: int) -> None:
    encoded = encode_varint(n)
    for cut in range(len(encoded)):
        with pytest.raises(InvalidBatchError):
            decode_varint(encoded[:cut], 0)


def test_every_cached_varint_is_the_zigzag_encoding_of_its_value() -> None:
    # The cache is built from the encodings' shape (eventlog/records.py), not by encoding each value.
    from eventlog.records import _SMALL_LIMIT, _encode_zigzag

    assert [encode_varint(n) for n in range(-1, _SMALL_LIMIT)] == [_encode_zigzag(n) for n in range(-1, _SMALL_LIMIT)]
    assert [decode_varint(encode_varint(n), 0)[0] for n in range(-1, _SMALL_LIMIT)] == list(range(-1, _SMALL_LIMIT))


def test_crc32c_is_the_packages_castagnoli_checksum_loaded_without_its_init() -> None:
    # records loads the C function alone (its package's __init__ costs every process ~35 ms); the
    # package, imported afterwards, reuses that module.
    import crc32c as package

    data = bytes(range(256)) * 9
    assert crc32c(b"123456789") == 0xE3069283   # the CRC-32C check value
    assert crc32c(data) == package.crc32c(data) and crc32c(data[100:], crc32c(data[:100])) == package.crc32c(data)


def test_records_load_neither_the_crc32c_package_nor_importlib_metadata() -> None:
    import subprocess
    import sys

    code = "import sys, eventlog.records; print(sorted({'crc32c', 'importlib.metadata'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_varint_longer_than_ten_bytes_is_invalid_batch() -> None:
    with pytest.raises(InvalidBatchError, match="longer than 10 bytes"):
        decode_varint(b"\xff" * 10 + b"\x01", 0)


# --- our batches, read by kafka-python -----------------------------------------------------------

@FEW
@given(entries=s.entry_lists, ts=s.timestamps, base_offset=s.base_offsets, epoch=s.leader_epochs,
       producer=s.producers)
def test_encode_batch_is_read_by_kafka(entries: list[tuple[bytes | None, bytes | None]], ts: int,
                                       base_offset: int, epoch: int, producer: s.Producer) -> None:
    data = encode_batch(entries, timestamp_ms=ts, base_offset=base_offset, leader_epoch=epoch,
                        **producer.kwargs())
    batch, records = kafka_read_one(data)
    assert records == [(base_offset + i, ts, k, v, ()) for i, (k, v) in enumerate(entries)]
    assert (batch.base_offset, batch.leader_epoch, batch.first_timestamp, batch.max_timestamp) == (
        base_offset, epoch, ts, ts)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.is_transactional) == (
        producer.producer_id, producer.producer_epoch, producer.base_sequence, producer.transactional)
    assert (batch.records_count, batch.last_offset_delta) == (len(entries), len(entries) - 1)
    assert not batch.is_control_batch and batch.compression_type == 0
    assert_same_header(RecordBatch.parse(data).header, batch)


@FEW
@given(records=s.record_lists(), epoch=s.leader_epochs, producer=s.producers,
       below_first=st.one_of(st.none(), st.integers(0, 2**20)))
def test_encode_records_is_read_by_kafka(records: list[Record], epoch: int, producer: s.Producer,
                                         below_first: int | None) -> None:
    first = records[0].offset
    base = None if below_first is None else max(0, first - below_first)
    data = encode_records(records, base_offset=base, leader_epoch=epoch, **producer.kwargs())
    batch, theirs = kafka_read_one(data)
    assert theirs == as_tuples(records)
    assert batch.base_offset == (first if base is None else base)
    assert batch.last_offset == records[-1].offset
    assert batch.first_timestamp == records[0].timestamp
    assert batch.max_timestamp == max(r.timestamp for r in records)
    assert batch.leader_epoch == epoch
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.is_transactional) == (
        producer.producer_id, producer.producer_epoch, producer.base_sequence, producer.transactional)
    assert_same_header(RecordBatch.parse(data).header, batch)


@FEW
@given(records=s.record_lists(max_size=6), producer=s.producers, new_base=s.base_offsets,
       new_epoch=s.leader_epochs)
def test_stamped_batch_is_read_by_kafka(records: list[Record], producer: s.Producer, new_base: int,
                                        new_epoch: int) -> None:
    data = encode_records(records, **producer.kwargs())
    stamped = bytearray(data)
    stamp(stamped, new_base, new_epoch)
    # Only the two fields outside the CRC change: length, magic, CRC and body are untouched.
    assert stamped[LENGTH_OFFSET:EPOCH_OFFSET] == data[LENGTH_OFFSET:EPOCH_OFFSET]
    assert stamped[MAGIC_OFFSET:] == data[MAGIC_OFFSET:]
    assert struct.unpack_from(">qii", stamped) == (new_base, len(data) - LOG_OVERHEAD, new_epoch)
    batch, theirs = kafka_read_one(stamped)
    shift = new_base - records[0].offset
    assert theirs == [(o + shift, t, k, v, h) for o, t, k, v, h in as_tuples(records)]
    assert (batch.base_offset, batch.leader_epoch) == (new_base, new_epoch)
    assert_same_header(RecordBatch.parse(stamped).header, batch)


@SOME
@given(kind=st.sampled_from([0, 1]), version=st.integers(0, 3), ts=s.timestamps,
       producer_id=st.integers(0, 2**40))
def test_control_batch_is_read_by_kafka_as_control_record(kind: int, version: int, ts: int,
                                                          producer_id: int) -> None:
    marker = Record(7, ts, struct.pack(">hh", version, kind), b"\x00\x00\x00\x00\x00\x00")
    data = encode_records([marker], producer_id=producer_id, producer_epoch=0, base_sequence=-1,
                          transactional=True, control=True)
    records = MemoryRecords(data)
    batch = records.next_batch()
    assert batch.validate_crc() and batch.is_control_batch and batch.is_transactional
    (record,) = list(batch)
    assert (record.offset, record.timestamp, record.version, record.type, record.commit) == (
        7, ts, version, kind, kind == 1)
    assert RecordBatch.parse(data).header.is_control


def test_offset_deltas_beyond_the_varint_cache_are_read_by_kafka() -> None:
    # 20 000 records: offset deltas and record counts cross 8192 (3-byte varint) and 16384
    # (the end of records._SMALL), which hypothesis-sized batches never reach.
    entries = [(None if i % 5 == 0 else i.to_bytes(3, "big"), b"v" * (i % 7)) for i in range(20_000)]
    data = encode_batch(entries, timestamp_ms=1_700_000_000_000, base_offset=10**12)
    batch, records = kafka_read_one(data)
    assert records == [(10**12 + i, 1_700_000_000_000, k, v, ()) for i, (k, v) in enumerate(entries)]
    assert batch.last_offset_delta == 19_999
    assert ours(data) == records
    kafka_bytes = kafka_build([Record(i, 1_700_000_000_000, k, v) for i, (k, v) in enumerate(entries)])
    stamp(kafka_bytes, 10**12, 0)
    assert data == bytes(kafka_bytes)


def test_megabyte_value_with_four_byte_length_varint_is_read_by_kafka() -> None:
    value = bytes(range(256)) * 4097  # 1 048 832 bytes: its zigzag length needs 4 varint bytes
    headers = (("big", value[:70_000]), ("null", None))
    records = [Record(0, -5, b"k", value, headers), Record(1, -(2**40), None, b"", ())]
    data = encode_records(records)
    _, theirs = kafka_read_one(data)
    assert theirs == as_tuples(records)
    assert data == bytes(kafka_build(records))


# --- kafka-python's batches, read by us ----------------------------------------------------------

@FEW
@given(records=s.kafka_record_lists, compression=st.sampled_from([0, GZIP]),
       producer=s.producers, base=s.base_offsets, epoch=s.leader_epochs)
def test_kafka_built_batches_are_read_identically(records: list[Record], compression: int,
                                                  producer: s.Producer, base: int, epoch: int) -> None:
    if compression == GZIP:
        records = _compressible(records)
    data = kafka_build(records, compression=compression, producer=producer)
    stamp(data, base, epoch)
    batch = RecordBatch.parse(data)
    assert batch.header.compression == compression  # the builder really compressed
    kafka_batch, theirs = kafka_read_one(data)
    assert ours(data) == theirs == [(base + o, t, k, v, h) for o, t, k, v, h in as_tuples(records)]
    assert_same_header(batch.header, kafka_batch)
    assert bytes(batch.raw) == bytes(data)


@FEW
@given(lists=st.lists(s.record_lists(max_size=4, first_offsets=st.just(0)), min_size=1, max_size=5),
       kinds=st.lists(st.sampled_from(["ours", "kafka", "kafka-gzip"]), min_size=5, max_size=5),
       start=st.integers(0, 2**40))
def test_concatenated_batches_iterate_like_memory_records(lists: list[list[Record]], kinds: list[str],
                                                          start: int) -> None:
    chunks = []
    next_offset = start
    for records, kind in zip(lists, kinds):
        if kind == "ours":
            chunk = bytearray(encode_records(records))
        else:
            chunk = kafka_build(_compressible(records) if kind == "kafka-gzip" else records,
                                compression=GZIP if kind == "kafka-gzip" else 0)
        stamp(chunk, next_offset, len(chunks))
        next_offset = read_header(chunk).next_offset
        chunks.append(bytes(chunk))
    data = b"".join(chunks)
    theirs = kafka_read(data)
    for verify_crc in (True, False):
        batches = list(iter_batches(data, verify_crc=verify_crc))
        assert [bytes(b.raw) for b in batches] == chunks
        assert [list(b) for b in batches] == [
            [Record(o, t, k, v, h) for o, t, k, v, h in recs] for _, recs in theirs]
    pos = 0
    for chunk, (kafka_batch, _) in zip(chunks, theirs):
        assert batch_size_at(data, pos) == (kafka_batch.base_offset, len(chunk))
        header = check_batch(data, pos, len(data))
        assert isinstance(header, BatchHeader)
        assert_same_header(header, kafka_batch)
        pos += len(chunk)


# --- byte identity with kafka-python's builder ---------------------------------------------------

@FEW
@given(records=s.kafka_record_lists, producer=s.producers)
def test_encode_records_is_byte_identical_to_kafka_builder(records: list[Record],
                                                           producer: s.Producer) -> None:
    assert encode_records(records, base_offset=0, **producer.kwargs()) == bytes(
        kafka_build(records, producer=producer))


@FEW
@given(entries=s.entry_lists, ts=s.timestamps, producer=s.producers)
def test_encode_batch_is_byte_identical_to_kafka_builder(entries: list[tuple[bytes | None, bytes | None]],
                                                         ts: int, producer: s.Producer) -> None:
    ours_bytes = encode_batch(entries, timestamp_ms=ts, **producer.kwargs())
    kafka_bytes = kafka_build([Record(i, ts, k, v) for i, (k, v) in enumerate(entries)], producer=producer)
    assert ours_bytes == bytes(kafka_bytes)
    # The same entries through the general encoder give the same bytes too.
    assert ours_bytes == encode_records([Record(i, ts, k, v) for i, (k, v) in enumerate(entries)],
                                        **producer.kwargs())


@SOME
@given(records=s.small_record_lists, producer=s.producers, base=s.base_offsets, epoch=s.leader_epochs)
def test_stamp_equals_encoding_at_that_offset_and_epoch(records: list[Record], producer: s.Producer,
                                                        base: int, epoch: int) -> None:
    stamped = bytearray(encode_records(records, **producer.kwargs()))
    stamp(stamped, base, epoch)
    shift = base - records[0].offset
    moved = [Record(r.offset + shift, r.timestamp, r.key, r.value, r.headers) for r in records]
    assert bytes(stamped) == encode_records(moved, leader_epoch=epoch, **producer.kwargs())


# --- round trips ---------------------------------------------------------------------------------

@FEW
@given(records=s.record_lists(), epoch=s.leader_epochs, producer=s.producers)
def test_encode_records_round_trips(records: list[Record], epoch: int, producer: s.Producer) -> None:
    data = encode_records(records, leader_epoch=epoch, **producer.kwargs())
    batch = RecordBatch.parse(data)
    assert list(batch.records()) == records
    assert list(batch) == records  # __iter__ decodes afresh
    h = batch.header
    assert (h.base_offset, h.last_offset, h.next_offset, h.records_count, h.leader_epoch) == (
        records[0].offset, records[-1].offset, records[-1].offset + 1, len(records), epoch)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional) == (
        producer.producer_id, producer.producer_epoch, producer.base_sequence, producer.transactional)
    assert h.size == len(data) and bytes(batch.raw) == data
    assert check_batch(data, 0, len(data)) == h


@FEW
@given(entries=s.entry_lists, ts=s.timestamps, base=s.base_offsets)
def test_encode_batch_round_trips(entries: list[tuple[bytes | None, bytes | None]], ts: int,
                                  base: int) -> None:
    data = encode_batch(entries, timestamp_ms=ts, base_offset=base)
    assert list(RecordBatch.parse(data).records()) == [
        Record(base + i, ts, k, v) for i, (k, v) in enumerate(entries)]


@SOME
@given(records=s.small_record_lists, before=st.binary(max_size=80), after=st.binary(max_size=80))
def test_check_batch_finds_a_batch_inside_a_larger_buffer(records: list[Record], before: bytes,
                                                          after: bytes) -> None:
    data = encode_records(records)
    buf = before + data + after
    header = check_batch(buf, len(before), len(buf))
    assert header == read_header(data) == read_header(buf, len(before))
    # The limit is respected even though the bytes after it are there.
    assert isinstance(check_batch(buf, len(before), len(before) + len(data) - 1), str)
    assert ours(memoryview(buf)[len(before):]) == as_tuples(records)


# --- encoder input errors ------------------------------------------------------------------------

def test_encoders_reject_empty_batches() -> None:
    with pytest.raises(InvalidBatchError):
        encode_batch([], timestamp_ms=0)
    with pytest.raises(InvalidBatchError):
        encode_records([])


@SOME
@given(records=s.small_record_lists, data=st.data())
def test_encode_records_rejects_offsets_that_do_not_increase(records: list[Record],
                                                             data: st.DataObject) -> None:
    assume(len(records) >= 2)
    i = data.draw(st.integers(1, len(records) - 1))
    back = data.draw(st.integers(0, 5))
    bad = records[:i] + [Record(records[i - 1].offset - back, 0, None, None)] + records[i + 1:]
    with pytest.raises(InvalidBatchError, match="must increase"):
        encode_records(bad)
    with pytest.raises(InvalidBatchError, match="must increase"):
        encode_records(records, base_offset=records[0].offset + 1 + back)


# --- damage --------------------------------------------------------------------------------------

@MANY
@given(records=s.small_record_lists, data=st.data())
def test_any_burst_of_up_to_four_bytes_inside_the_crc_range_is_rejected(records: list[Record],
                                                                         data: st.DataObject) -> None:
    good = encode_records(records)
    pos = data.draw(st.integers(ATTRIBUTES_OFFSET, len(good) - 1), label="pos")
    mask = data.draw(st.binary(min_size=1, max_size=4).filter(lambda m: m[0] != 0), label="mask")
    bad = bytearray(good)
    for i, m in enumerate(mask[: len(bad) - pos]):
        bad[pos + i] ^= m
    reason = check_batch(bad, 0, len(bad))
    assert isinstance(reason, str)
    assert "CRC mismatch" in reason or "cannot have last offset delta" in reason
    with pytest.raises(InvalidBatchError):
        RecordBatch.parse(bad)
    # In a stream, the good batch before it is still read, then the damage is reported.
    stream = iter_batches(good + bad)
    assert list(next(stream)) == records
    with pytest.raises(InvalidBatchError):
        next(stream)
    # Without the CRC the damage may go unnoticed, but decoding still fails only as InvalidBatchError.
    decode_or_reject(bad, verify_crc=False)


@SOME
@given(records=s.small_record_lists, crc=st.integers(0, 2**32 - 1))
def test_a_wrong_stored_crc_is_rejected(records: list[Record], crc: int) -> None:
    bad = bytearray(encode_records(records))
    assume(crc != read_header(bad).crc)
    struct.pack_into(">I", bad, CRC_OFFSET, crc)
    reason = check_batch(bad, 0, len(bad))
    assert isinstance(reason, str) and reason.startswith("CRC mismatch")
    # Skipping the check is what verify_crc=False is for.
    assert ours(bad, verify_crc=False) == as_tuples(records)


@SOME
@given(records=s.small_record_lists)
def test_truncation_at_every_length_is_rejected(records: list[Record]) -> None:
    good = encode_records(records)
    for n in range(len(good)):
        cut = good[:n]
        assert isinstance(check_batch(good, 0, n), str)
        assert isinstance(check_batch(cut, 0, n), str)
        for verify_crc in (True, False):
            with pytest.raises(InvalidBatchError):
                RecordBatch.parse(cut, verify_crc=verify_crc)
            # A torn tail after a whole batch: the whole one is yielded, the tail is an error.
            stream = iter_batches(good + cut, verify_crc=verify_crc)
            assert list(next(stream)) == records
            if n:
                with pytest.raises(InvalidBatchError):
                    next(stream)
            else:
                assert next(stream, None) is None


@SOME
@given(records=s.small_record_lists)
def test_cutting_records_under_a_consistent_header_is_rejected(records: list[Record]) -> None:
    # The length and CRC are fixed up after each cut, so only the record decoder can notice.
    good = encode_records(records)
    for n in range(HEADER_SIZE, len(good)):
        cut = bytearray(good[:n])
        reframe(cut)
        assert isinstance(check_batch(cut, 0, n), BatchHeader)
        with pytest.raises(InvalidBatchError):
            ours(cut)
        with pytest.raises(CorruptRecordError):
            kafka_read_one(cut)


@SOME
@given(records=s.small_record_lists, magic=st.integers(-128, 127).filter(lambda m: m != 2))
def test_wrong_magic_is_rejected(records: list[Record], magic: int) -> None:
    bad = bytearray(encode_records(records))
    struct.pack_into(">b", bad, MAGIC_OFFSET, magic)  # outside the CRC: only the magic check sees it
    reason = check_batch(bad, 0, len(bad))
    assert isinstance(reason, str) and reason.startswith(f"magic {magic}")
    for verify_crc in (True, False):
        with pytest.raises(InvalidBatchError, match="magic"):
            RecordBatch.parse(bad, verify_crc=verify_crc)


@MANY
@given(records=s.small_record_lists, trailing=st.binary(max_size=64),
       length=st.one_of(st.integers(*s.INT32), st.integers(-2, MIN_BATCH_LENGTH + 300)))
def test_every_wrong_batch_length_is_rejected(records: list[Record], trailing: bytes, length: int) -> None:
    good = encode_records(records)
    true_length = len(good) - LOG_OVERHEAD
    assume(length != true_length)
    bad = bytearray(good + trailing)
    struct.pack_into(">i", bad, LENGTH_OFFSET, length)
    reason = check_batch(bad, 0, len(bad))
    assert isinstance(reason, str)
    if length < MIN_BATCH_LENGTH:
        assert "below the minimum" in reason
    elif length + LOG_OVERHEAD > len(bad):
        assert "past the end" in reason
    else:
        assert reason.startswith("CRC mismatch")  # the CRC now covers different bytes
    with pytest.raises(InvalidBatchError):
        RecordBatch.parse(bad)
    # Without the CRC, a length that cannot frame a batch is still an error; one that frames the
    # wrong bytes fails in the record decoder. Either way iter_batches must not loop.
    if not MIN_BATCH_LENGTH <= length <= len(bad) - LOG_OVERHEAD:
        with pytest.raises(InvalidBatchError):
            RecordBatch.parse(bad, verify_crc=False)
    else:
        # Too short cuts the last record, too long leaves trailing bytes over: never accepted.
        assert decode_or_reject(bad, verify_crc=False) is None
    try:
        drain(bad, verify_crc=False)
    except InvalidBatchError:
        pass


def test_non_advancing_length_does_not_hang_iter_batches_without_crc() -> None:
    # Regression: batchLength -12 gave a batch of size 0 and iter_batches(verify_crc=False)
    # yielded it forever.
    bad = bytearray(encode_batch([(None, b"x")], timestamp_ms=1))
    struct.pack_into(">i", bad, LENGTH_OFFSET, -LOG_OVERHEAD)
    with pytest.raises(InvalidBatchError, match="batch length -12"):
        drain(bad, verify_crc=False)


@SOME
@given(records=s.small_record_lists,
       field=st.sampled_from([(">i", 23), (">i", 57)]), value=st.integers(*s.INT32))
def test_inconsistent_count_or_offset_delta_is_rejected(records: list[Record], field: tuple[str, int],
                                                        value: int) -> None:
    # lastOffsetDelta (byte 23) and recordsCount (byte 57), CRC recomputed.
    fmt, at = field
    good = encode_records(records)
    assume(value != struct.unpack_from(fmt, good, at)[0])
    bad = bytearray(good)
    struct.pack_into(fmt, bad, at, value)
    recrc(bad)
    h = read_header(bad)
    checked = check_batch(bad, 0, len(bad))
    if h.records_count < 0 or h.last_offset_delta < 0 or (
            h.records_count > 0 and h.last_offset_delta < h.records_count - 1):
        assert isinstance(checked, str) and "cannot have last offset delta" in checked
        with pytest.raises(InvalidBatchError):
            RecordBatch.parse(bad)
    elif at == 57:
        # A count that disagrees with the records present: too many run off the end, too few
        # leave bytes over. kafka-python rejects it as well.
        assert checked == h
        with pytest.raises(InvalidBatchError):
            ours(bad)
        with pytest.raises(CorruptRecordError):
            kafka_read_one(bad)
    else:
        # Any other lastOffsetDelta consistent with the count moves the batch's last offset (a
        # larger one is how gaps at the end look after compaction). Like Kafka's readers, the
        # decoder does not cross-check it against the records' own offset deltas.
        assert checked == h and h.last_offset == records[0].offset + value
        assert ours(bad) == as_tuples(records)


# Seven-bit batches: every varint is one byte and every header key is ASCII, so the two known,
# deliberate differences from kafka-python cannot arise (it reads the record attributes as a
# varint where Kafka's Java client reads an int8, and it rejects non-UTF-8 header keys where Java
# substitutes U+FFFD). On such bytes the two decoders must agree on everything.
_ascii = st.binary(max_size=8).map(lambda b: bytes(c & 0x7F for c in b))
_seven_bit_records = st.lists(
    st.tuples(st.integers(-20, 20), st.one_of(st.none(), _ascii), st.one_of(st.none(), _ascii),
              st.lists(st.tuples(st.text("abcxyz", max_size=4), st.one_of(st.none(), _ascii)), max_size=2)),
    min_size=1, max_size=6,
).map(lambda rows: [Record(2 * i, 1_000 + dt, k, v, tuple(h)) for i, (dt, k, v, h) in enumerate(rows)])
_edits = st.lists(
    st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, 10**6), st.integers(0, 0x7F)),
    min_size=1, max_size=3,
)


@settings(MANY, max_examples=soak(500))
@given(records=_seven_bit_records, edits=_edits)
# Regression: a header count of -1 (the single byte 0x01) was read as "no headers".
@example(records=[Record(0, 1000, None, None, ())], edits=[("set", 6, 0x01)])
def test_damage_under_a_valid_crc_is_judged_like_kafka(records: list[Record],
                                                       edits: list[tuple[str, int, int]]) -> None:
    good = encode_records(records)
    assert max(good[HEADER_SIZE:]) < 0x80
    bad = bytearray(good)
    for op, where, byte in edits:
        span = len(bad) - HEADER_SIZE
        if op == "insert":
            bad.insert(HEADER_SIZE + where % (span + 1), byte)
        elif span:
            if op == "set":
                bad[HEADER_SIZE + where % span] = byte
            else:
                del bad[HEADER_SIZE + where % span]
    reframe(bad)
    assume(bad != good)
    mine = decode_or_reject(bad)
    try:
        _, theirs = kafka_read_one(bad)
    except CorruptRecordError:
        theirs = None
    assert mine == theirs


@pytest.mark.parametrize("codec", [2, 3, 4, 5, 6, 7])
def test_unsupported_codecs_raise_unsupported_compression(codec: int) -> None:
    for source in (encode_records([Record(3, 5, b"k", b"v", (("h", None),))]),
                   bytes(kafka_build(_compressible([Record(0, 5, b"k", b"v")]), compression=GZIP))):
        bad = bytearray(source)
        attributes = struct.unpack_from(">h", bad, ATTRIBUTES_OFFSET)[0]
        struct.pack_into(">h", bad, ATTRIBUTES_OFFSET, (attributes & ~0x07) | codec)
        recrc(bad)
        # The header is fine (codecs are not the framing's business); decoding the records is not.
        header = check_batch(bad, 0, len(bad))
        assert isinstance(header, BatchHeader) and header.compression == codec
        for verify_crc in (True, False):
            batch = RecordBatch.parse(bad, verify_crc=verify_crc)
            with pytest.raises(UnsupportedCompressionError, match=str(COMPRESSION_NAMES.get(codec, codec))):
                batch.records()
    # Callers that catch InvalidBatchError catch this too.
    assert issubclass(UnsupportedCompressionError, InvalidBatchError)


def test_gzip_payload_with_an_invalid_deflate_block_is_invalid_batch() -> None:
    # Regression: zlib.error (not an OSError) escaped from records() for a corrupt deflate stream.
    bad = kafka_build(_compressible([Record(0, 5, b"k", b"v")]), compression=GZIP)
    deflate = HEADER_SIZE + 10  # a gzip member without optional fields: the stream starts at 10
    assert bad[HEADER_SIZE:HEADER_SIZE + 4] == b"\x1f\x8b\x08\x00"
    bad[deflate] |= 0x06  # BTYPE = 11, reserved
    recrc(bad)
    with pytest.raises(InvalidBatchError, match="gzip"):
        ours(bad)


@SOME
@given(records=s.small_kafka_record_lists, data=st.data())
def test_damaged_gzip_payload_gives_the_records_or_invalid_batch(records: list[Record],
                                                                 data: st.DataObject) -> None:
    records = _compressible(records)
    good = kafka_build(records, compression=GZIP)
    pos = data.draw(st.integers(HEADER_SIZE, len(good) - 1), label="pos")
    mask = data.draw(st.binary(min_size=1, max_size=4).filter(lambda m: m[0] != 0), label="mask")
    bad = bytearray(good)
    for i, m in enumerate(mask[: len(bad) - pos]):
        bad[pos + i] ^= m
    recrc(bad)
    # gzip's own CRC32 and length trailer catch what deflate does not; bytes gzip ignores (the
    # mtime, extra flags and OS fields) leave the records intact.
    result = decode_or_reject(bad)
    assert result is None or result == as_tuples(records)


def test_log_append_time_batches_give_every_record_the_batch_max_timestamp():
    from eventlog.records import TIMESTAMP_TYPE_MASK, crc32c

    raw = bytearray(encode_records([Record(0, 100, b"a", b"1"), Record(1, 250, b"b", b"2")]))
    raw[22] |= TIMESTAMP_TYPE_MASK  # low byte of the attributes (inside the CRC: recompute it)
    raw[17:21] = crc32c(bytes(raw[21:])).to_bytes(4, "big")
    batch = RecordBatch.parse(bytes(raw))
    assert [r.timestamp for r in batch.records()] == [250, 250]
    kafka_batch = MemoryRecords(bytes(raw)).next_batch()
    assert [r.timestamp for r in kafka_batch] == [250, 250]


def test_out_of_range_fields_raise_invalid_batch_error():
    with pytest.raises(InvalidBatchError, match="out of range"):
        encode_batch([(b"k", b"v")], timestamp_ms=0, producer_epoch=2**15)
    with pytest.raises(InvalidBatchError, match="out of range"):
        encode_records([Record(0, 0, b"k", b"v"), Record(2**31 + 5, 0, b"k", b"v")])


# --- bounded decompression (issue 18: a 200 KiB gzip batch inflated to 200 MiB before it was refused) --

def _gzip_outcome(decompress: object, data: bytes) -> bytes | str:
    try:
        return decompress(data)   # type: ignore[operator, no-any-return]
    except (OSError, EOFError, zlib.error, InvalidBatchError):
        return "refused"


@SOME
@given(members=st.lists(st.binary(max_size=3000), min_size=1, max_size=4), padding=st.integers(0, 8),
       cut=st.integers(0, 40), flip=st.integers(0, 255), data=st.data())
def test_gunzip_gives_what_gzip_decompress_gives(members: list[bytes], padding: int, cut: int, flip: int,
                                                data: st.DataObject) -> None:
    parts = [gzip.compress(m, mtime=0) + bytes(padding) for m in members]
    whole = b"".join(parts)
    flag_bytes = {sum(len(p) for p in parts[:i]) + 3 for i in range(len(parts))}   # each member's FLG byte
    damaged = bytearray(whole[:len(whole) - cut])
    reserved_flags = False
    if damaged and flip:
        pos = data.draw(st.integers(0, len(damaged) - 1), label="pos")
        damaged[pos] ^= flip
        reserved_flags = pos in flag_bytes and damaged[pos] & 0xE0 != 0
    for sample in (whole, bytes(damaged)):
        expected = _gzip_outcome(gzip.decompress, sample)
        if sample is not whole and reserved_flags:
            expected = "refused"   # RFC 1952: reserved FLG bits must be zero; zlib refuses, gzip ignores them
        assert _gzip_outcome(gunzip, sample) == expected
        if expected != "refused":
            assert gunzip(sample, len(expected)) == expected                  # exactly at the bound
            if expected:
                with pytest.raises(BatchTooLargeError):
                    gunzip(sample, len(expected) - 1)


def test_a_gzip_bomb_is_refused_having_inflated_no_more_than_the_bound() -> None:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(deflate.compress(bytes(1 << 20)) for _ in range(200)) + deflate.flush()   # 200 MiB of zeros
    assert len(bomb) < 300 << 10
    limit = 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(BatchTooLargeError, match="inflate to more than 1048576 bytes"):
            gunzip(bomb, limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * limit + 2 * len(bomb), f"{peak} bytes allocated to refuse it"

    # Through a batch: records(max_bytes) refuses it the same way, records() without a bound does not.
    batch = bytearray(HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD + len(bomb), 0, 2, 0, GZIP, 0, 0, 0, -1, -1, -1, 1))
    batch += bomb
    recrc(batch)
    parsed = RecordBatch.parse(bytes(batch))
    with pytest.raises(BatchTooLargeError):
        parsed.records(max_bytes=limit)
    small = kafka_build(_compressible([Record(0, 5, b"k", b"v" * 100)]), compression=GZIP)
    inflated = len(gzip.decompress(bytes(small[HEADER_SIZE:])))
    assert ours(small) == [(r.offset, r.timestamp, r.key, r.value, r.headers)
                           for r in RecordBatch.parse(small).records(max_bytes=inflated)]
    with pytest.raises(BatchTooLargeError):
        RecordBatch.parse(small).records(max_bytes=inflated - 1)


def _random_records(rng: random.Random) -> list[Record]:
    """Records of every shape a batch can hold: null, short and long keys and values (one- to
    three-byte lengths), offset and timestamp deltas past one byte, headers now and then."""
    records = []
    offset = rng.randint(0, 1 << 40)
    ts = rng.randint(0, 1 << 41)
    for _ in range(rng.randint(1, 60)):
        offset += rng.choice((1, 1, 1, 2, 70, 9_000))
        key = rng.choice((None, b"", b"kv/a", b"k" * 63, b"k" * 64, b"k" * 200))
        value = rng.choice((None, b"", b"v" * 40, b"v" * 63, b"v" * 64, b"v" * 300, b"v" * 8_191, b"v" * 8_192))
        headers = rng.choice(((),) * 8 + ((("h", b"x"),), (("h", None), ("", b""))))
        records.append(Record(offset, ts + rng.choice((0, 0, 1, 63, 64, 100_000)), key, value, headers))
    return records


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_record_rows_reads_every_batch_as_decode_records_does(seed: int) -> None:
    """`record_rows` (the applier's one-pass parse) gives what `decode_records` gives, or raises its
    InvalidBatchError with the same message: on random batches of every record shape, whole and with a
    byte changed, bytes cut or added, or a record count that does not hold."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    fast = slow_only = refused = 0
    for _ in range(600):
        if rng.random() < 0.5:
            entries = [(rng.choice((b"kv/a", b"k" * 40, None)), rng.choice((b"v" * 200, b"", None))) for _ in range(rng.randint(1, 80))]
            raw = bytearray(encode_batch(entries, timestamp_ms=rng.randint(0, 1 << 41)))
        else:
            raw = bytearray(encode_records(_random_records(rng)))
        damage = rng.choice(("none", "none", "byte", "cut", "grow", "count"))
        if damage == "byte":
            raw[rng.randrange(HEADER_SIZE, len(raw))] = rng.randrange(256)
        elif damage == "cut":
            del raw[rng.randrange(HEADER_SIZE, len(raw)):]
        elif damage == "grow":
            raw += bytes(rng.randrange(256) for _ in range(rng.randint(1, 5)))
        elif damage == "count":
            struct.pack_into(">i", raw, HEADER_SIZE - 4, max(0, read_header(raw).records_count + rng.choice((-1, 1))))
        header = read_header(raw)._replace(batch_length=len(raw) - LOG_OVERHEAD)
        payload = records_payload(header, raw)
        try:
            want: object = [(o, k, v) for o, _, k, v, _ in
                            decode_records(header, payload, lambda *fields: fields)]   # type: ignore[misc]
        except InvalidBatchError as exc:
            want = ("InvalidBatchError", str(exc))
        try:
            got: object = record_rows(header, payload)
        except InvalidBatchError as exc:
            got = ("InvalidBatchError", str(exc))
        assert got == want, (damage, bytes(raw).hex())
        refused += isinstance(want, tuple)
        fast += damage == "none"
        slow_only += damage != "none" and not isinstance(want, tuple)
    print(f"{fast} whole batches, {refused} refused, {slow_only} damaged ones that still parse")
    assert refused > 100 and slow_only > 20


def test_record_rows_varint_tables_hold_each_varints_value() -> None:
    """`record_rows` reads one- and two-byte varints from tables: each entry is what `decode_varint` reads
    of those bytes, and a byte with the continuation bit has no one-byte value."""
    from eventlog.records import _ZIGZAG_1, _ZIGZAG_2

    for b in range(256):
        assert _ZIGZAG_1[b] == (None if b >= 0x80 else decode_varint(bytes((b,)), 0)[0])
    for b in range(0x80, 0x100):
        for c in range(0x80):
            assert _ZIGZAG_2[b & 0x7F | c << 7] == decode_varint(bytes((b, c)), 0)[0]
