"""The applier reads an uncompressed batch's records straight from the entry (statemachines/apply.py
`_records`): it must give what parsing it as a `RecordBatch` gives (`_parsed_records`), header, rows and
halts alike, on good batches and on every kind of damaged framing the parse checks."""

from __future__ import annotations

import os
import random

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import HEADER_SIZE, MAGIC_OFFSET, encode_batch, stamp
from statemachines.apply import _CannotApply, _parsed_records, _records


def _entry(data: bytes, index: int = 7, count: int = 1) -> Entry:
    return Entry(index, 1, count, EntryKind.NORMAL, data)


def _answer(entry: Entry, skipped: frozenset[int]) -> object:
    try:
        return _records(entry, skipped)
    except _CannotApply as stop:
        return stop.halt


def _parsed(entry: Entry, skipped: frozenset[int]) -> object:
    try:
        return _parsed_records(entry, skipped)
    except _CannotApply as stop:
        return stop.halt


def _batch(records: list[tuple[bytes | None, bytes | None]]) -> bytes:
    data = bytearray(encode_batch(records, timestamp_ms=1_700_000_000_000))
    stamp(data, 7, 1)
    return bytes(data)


def test_records_read_from_the_entry_are_the_parsed_batch_s_on_good_and_damaged_batches() -> None:
    seed = int(os.environ.get("ENTRY_RECORDS_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (replay: ENTRY_RECORDS_SEED={seed})")
    rng = random.Random(seed)
    good = [
        _batch([(b"kv/a", b"1")]),
        _batch([(b"kv/a", b"1"), (None, b"2"), (b"kv/" + b"k" * 100, None), (b"x", b"v" * 300)]),
        _batch([(b"kv/a", b"1")]) + b"trailing bytes past the batch",
    ]
    cases: list[bytes] = list(good)
    for data in good:
        cases.append(data[:HEADER_SIZE - 1])                                   # no whole header
        cases.append(data[:-5])                                                # batch length past the data
        cases.append(data[:MAGIC_OFFSET] + b"\x01" + data[MAGIC_OFFSET + 1:])    # another magic
        for codec in (1, 2, 3, 4):                                             # compressed (not really: gzip fails)
            cases.append(data[:22] + bytes([data[22] | codec]) + data[23:])
        cases.append(data[:8] + (3).to_bytes(4, "big") + data[12:])            # batch length below the minimum
        for _ in range(30):                                                    # a damaged record part
            at = rng.randrange(HEADER_SIZE, len(data))
            cases.append(data[:at] + bytes([rng.randrange(256)]) + data[at + 1:])
    for i, data in enumerate(cases):
        for skipped in (frozenset(), frozenset({7})):
            for view in (data, memoryview(data)):
                entry = _entry(view)   # type: ignore[arg-type]
                assert _answer(entry, skipped) == _parsed(entry, skipped), (seed, i, skipped)
    assert all(type(_answer(_entry(d), frozenset())) is tuple for d in good)
