"""Random keyed logs for the cleaner tests, and the model a cleaned log must match.

`write_random(log, rng, batches)` appends batches of keyed records: a small key space (so keys are
overwritten often), some keys longer than 16 bytes (the offset map hashes those), null keys
(never compacted), null values (tombstones), Raft-style control batches, gzip batches built by
kafka-python, and leader epochs that grow now and then. It returns what it wrote, record by record.

The model (`expected`): after a pass that mapped the log up to offset M, the records below M are,
per key, only its latest record below M (plus every null-key record); everything at or above M is
as written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kafka.record.default_records import DefaultRecordBatchBuilder

from eventlog.log import Log
from eventlog.records import Record, encode_batch, encode_records

GZIP = 1


@dataclass(frozen=True, slots=True)
class Written:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    epoch: int
    control: bool = False


def _key(rng: random.Random, key_space: int) -> bytes | None:
    roll = rng.random()
    if roll < 0.04:
        return None
    n = rng.randrange(key_space)
    if roll < 0.2:
        return f"long-key-beyond-sixteen-bytes/{n}".encode()
    return f"k/{n}".encode()


def _value(rng: random.Random, i: int) -> bytes | None:
    if rng.random() < 0.12:
        return None
    return f"v{i}:".encode() + rng.randbytes(rng.randrange(0, 40))


def gzip_batch(entries: list[tuple[bytes | None, bytes | None]], timestamp_ms: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=GZIP, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=2**31 - 1)
    for delta, (key, value) in enumerate(entries):
        assert builder.append(delta, timestamp=timestamp_ms, key=key, value=value, headers=[]) is not None
    return bytes(builder.build())


def write_random(log: Log, rng: random.Random, batches: int, *, key_space: int = 30, start_ts: int = 1_000_000,
                 epoch: int | None = None, ts_step: int = 10) -> list[Written]:
    out: list[Written] = []
    epoch = epoch if epoch is not None else max(1, log.latest_epoch or 1)
    ts = start_ts
    for i in range(batches):
        if rng.random() < 0.03:
            epoch += 1
        ts += rng.randrange(0, ts_step + 1)
        kind = rng.random()
        if kind < 0.03:
            data = encode_records([Record(0, -1, b"__raft/noop", b"")], control=True)
            info = log.append(data, epoch=epoch)
            out.append(Written(info.base_offset, b"__raft/noop", b"", -1, epoch, control=True))
            continue
        entries = [(_key(rng, key_space), _value(rng, i)) for _ in range(rng.randrange(1, 6))]
        data = gzip_batch(entries, ts) if kind < 0.08 else encode_batch(entries, timestamp_ms=ts)
        info = log.append(data, epoch=epoch)
        out += [Written(info.base_offset + j, k, v, ts, epoch) for j, (k, v) in enumerate(entries)]
    return out


def expected(written: list[Written], mapped_end: int) -> list[Written]:
    """The model: below `mapped_end` each key's latest record only (null keys all kept)."""
    latest: dict[bytes, int] = {}
    for w in written:
        if w.offset < mapped_end and w.key is not None:
            latest[w.key] = w.offset
    return [w for w in written if w.offset >= mapped_end or w.key is None or latest[w.key] == w.offset]


def records(log: Log, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in log.batches(start) for r in b.records()
            if start is None or r.offset >= start]


def triples(written: list[Written]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(w.offset, w.key, w.value) for w in written]
