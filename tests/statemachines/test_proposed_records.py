"""The leader's own batches: its applier takes an entry's records from what it proposed (`Applier.proposed`)
instead of parsing the batch again, only when the entry's bytes are the ones it built.

What is applied is what the log holds: the hand-off stands in for parsing only because parsing a batch
`encode_batch` made gives back exactly the records it was given (checked here on random batches); an
entry at that index whose bytes differ (another leader's, or read back different) is parsed, so the
views hold the log's records, not the proposal's. Real RocksDB views; entries stamped as the log stores them.
"""

from __future__ import annotations

import random
from typing import Any

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import RecordBatch, decode_records, encode_batch, records_payload, stamp
from statemachines import apply
from statemachines import events as ev
from statemachines.query import Query

Records = list[tuple[bytes | None, bytes | None]]


def _bytes(rng: random.Random) -> bytes | None:
    n = rng.choice([None, 0, 1, 5, 63, 64, 127, 128, 300, 8191, 8192, 20000])
    return None if n is None else rng.randbytes(n)


def _stored(index: int, term: int, data: bytes) -> Entry:
    """The entry as the leader's log holds it: base offset and term stamped into the batch."""
    stored = bytearray(data)
    stamp(stored, index, term)
    count = RecordBatch.parse(data, verify_crc=True).header.records_count
    return Entry(index, term, count, EntryKind.NORMAL, bytes(stored))


def test_parsing_a_batch_gives_back_exactly_the_records_encoded() -> None:
    """What makes the hand-off exact: decode_records(encode_batch(records)) == records, offset by offset
    (None and empty keys and values, one- and two-byte varints, record counts past 63 and 8191 deltas)."""
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    for _ in range(60):
        records: Records = [(_bytes(rng), _bytes(rng)) for _ in range(rng.choice([1, 2, 63, 64, 65, 200]))]
        index = rng.randrange(1 << 40)
        entry = _stored(index, rng.randrange(1, 1 << 31), encode_batch(records, timestamp_ms=rng.randrange(1 << 41)))
        batch = RecordBatch.parse(entry.data, verify_crc=True)
        parsed = list(decode_records(batch.header, records_payload(batch.header, batch.raw),
                                     lambda o, t, k, v, h: (o, k, v, h)))
        assert parsed == [(index + i, k, v, ()) for i, (k, v) in enumerate(records)], f"seed={seed}"


def _writes(n: int, tag: bytes) -> Records:
    return [ev.event_record(ev.KvPut(name=f"p/{i % 5}", value=tag + bytes([i]) * 40, actor="t",
                                     request_id=f"{tag.decode()}-{i}")) for i in range(n)]


def test_proposed_entries_apply_exactly_as_parsed_ones(views_dir: Any) -> None:
    handing, parsing = views_dir("handing"), views_dir("parsing")
    index = 0
    for size in (1, 7, 30, 3):
        records = _writes(size, b"w%d" % index)
        data = encode_batch(records, timestamp_ms=1_700_000_000_000 + index)
        handing.proposed(index, data, records)
        entry = _stored(index, 2, data)
        assert handing.apply([entry]) == parsing.apply([entry])
        index += size
    assert handing.applier.records_handed == index   # every record came from the hand-off
    assert parsing.applier.records_handed == 0
    assert handing.digest == parsing.digest and handing.applied_index == parsing.applied_index == index - 1
    assert not handing.applier._proposed and handing.applier._proposed_bytes == 0


def test_an_entry_whose_bytes_differ_from_the_proposal_is_parsed(views_dir: Any) -> None:
    """The leader proposed one batch at index 0, but the entry applied there holds another (another
    leader's entry took the index; or the bytes changed): the views hold what the entry holds."""
    sm, parsing = views_dir("differ"), views_dir("parsing")
    mine = [ev.event_record(ev.KvPut(name="x", value=b"proposed!!"))]   # as long as the other: only the bytes differ
    theirs = [ev.event_record(ev.KvPut(name="x", value=b"in-the-log"))]
    sm.proposed(0, encode_batch(mine, timestamp_ms=1), mine)
    entry = _stored(0, 3, encode_batch(theirs, timestamp_ms=1))
    assert sm.apply([entry]) == parsing.apply([entry])
    got = Query(sm.store).get("kv/x")
    assert got is not None and got.state.value == b"in-the-log"
    assert sm.applier.records_handed == 0 and sm.applier.records_parsed_instead == 1
    assert sm.digest == parsing.digest


def test_one_byte_changed_anywhere_the_stamp_does_not_write_is_parsed(views_dir: Any) -> None:
    """Every byte but the stamped base offset (0:8) and term (12:16) takes part in the comparison: a
    batch that differs in one of them (CRC ignored on apply, as for any stored entry) is not handed."""
    records = _writes(3, b"b")
    data = encode_batch(records, timestamp_ms=5)
    rng = random.Random(7)
    for pos in [8, 11, 16, 20, 40, *rng.sample(range(61, len(data)), 6)]:
        sm = views_dir(f"byte-{pos}")
        sm.proposed(0, data, records)
        changed = bytearray(data)
        changed[pos] ^= 0x01
        applier = sm.applier
        assert applier._proposed_records(_stored_unchecked(0, 2, bytes(changed), len(records))) is None, pos
        assert applier.records_parsed_instead == 1 and applier.records_handed == 0


def _stored_unchecked(index: int, term: int, data: bytes, count: int) -> Entry:
    stored = bytearray(data)
    stamp(stored, index, term)
    return Entry(index, term, count, EntryKind.NORMAL, bytes(stored))


def test_what_was_proposed_below_an_applied_index_is_forgotten_and_the_memo_is_bounded(views_dir: Any,
                                                                                       monkeypatch: Any) -> None:
    sm = views_dir("bounded")
    for i in range(5):
        records = _writes(1, b"f%d" % i)
        sm.proposed(i, encode_batch(records, timestamp_ms=1), records)
    entry = _stored(3, 2, sm.applier._proposed[3][0])
    assert sm.applier._proposed_records(entry) is not None
    assert list(sm.applier._proposed) == [4]   # 0-2 replaced or never applied here, 3 taken
    monkeypatch.setattr(apply, "PROPOSED_BYTES", 1000)
    for i in range(10, 40):
        records = _writes(1, b"g%d" % i)
        sm.proposed(i, encode_batch(records, timestamp_ms=1), records)
    assert sm.applier._proposed_bytes <= 1000 + 200
    held = list(sm.applier._proposed)
    assert sm.applier._proposed_bytes == sum(len(sm.applier._proposed[i][0]) for i in held)


def test_records_that_are_not_bytes_are_not_held(views_dir: Any) -> None:
    """Parsing makes `bytes` (or None); a proposal of another buffer type is parsed when applied."""
    sm = views_dir("types")
    key, value = ev.event_record(ev.KvPut(name="t", value=b"v"))
    records: Any = [(key, bytearray(value))]
    sm.proposed(0, encode_batch(records, timestamp_ms=1), records)
    assert not sm.applier._proposed
