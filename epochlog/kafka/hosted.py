"""Topics created through the Kafka face (CreateTopics): hosted in the `kv` Raft group as kv entries.

A hosted topic (a Faust app's changelog and leader topics, or any topic a Kafka client creates) is
declared by a `ConfigChanged(scope="kafka-topic", name=<topic>, value={"partitions": n})` event in
the metadata group; every node reads the declarations from its metadata views. Its partitions live
in the `kv` group's log, so a partition's leader and leader epoch are the kv group's:

- Produce wraps each record as a typed event, validated like any write: a record with key K and
  value V in partition P of topic T is `KvPut(name="kafka/T/P/k<base64url K>", value=V)` (`n` for
  a null key), a null value (a tombstone) is `KvDeleted` of that name. The kv views hold each key's
  latest value: the compacted topic, readable with `epochlog get kafka/T/P/...`.
- Fetch reads the kv log below the commit offset and re-encodes the records of the partition as
  Kafka batches with their own (kv log) offsets; batches span the source offsets they cover, so
  offsets of a hosted partition are sparse (as in a compacted Kafka topic) and a consumer's
  position moves past the kv group's other entries. This is a copy, not the zero-copy path of the
  `__<group>` topics.

Offsets, timestamps, epochs and the high watermark of a hosted partition are those of the kv log.
Pure functions and a registry over the views; call from the node's loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from eventlog.records import HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC, Record, crc32c, encode_records
from statemachines import events as ev
from statemachines.producers import HOSTED_NAME_PREFIX, partition_of
from statemachines.query import MAX_LIMIT, Query
from statemachines.state import ConfigState

HOST_GROUP: Final = "kv"
TOPIC_SCOPE: Final = "kafka-topic"
NAME_PREFIX: Final = HOSTED_NAME_PREFIX
MAX_PARTITIONS: Final = 256
TOPIC_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")   # Kafka's characters, ConfigChanged's rules

_LAST_OFFSET_DELTA = struct.Struct(">i")
_CRC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class HostedTopic:
    name: str
    partitions: int


def declaration(topic: str, partitions: int) -> ev.ConfigChanged:
    return ev.ConfigChanged(scope=TOPIC_SCOPE, name=topic, value=json.dumps({"partitions": partitions}),
                            actor="kafka")


def hosted_topics(metadata_views: Any) -> dict[str, HostedTopic]:
    """Every declared topic, from the metadata group's views (this node's applied state)."""
    query = Query(metadata_views.store)
    found: dict[str, HostedTopic] = {}
    after = None
    while True:
        page = query.list(f"config/{TOPIC_SCOPE}/", limit=MAX_LIMIT, after=after)
        for item in page.items:
            state = item.state
            if isinstance(state, ConfigState):
                try:
                    partitions = int(json.loads(state.value)["partitions"])
                except (ValueError, KeyError, TypeError):
                    continue
                found[state.name] = HostedTopic(state.name, partitions)
        if not page.next:
            return found
        after = page.next


def entity_prefix(topic: str, partition: int) -> bytes:
    """The record-key prefix of a hosted partition's records in the kv log."""
    return f"kv/{NAME_PREFIX}{topic}/{partition}/".encode()


def wrap(topic: str, partition: int, key: bytes | None, value: bytes | None) -> ev.Event:
    """The typed event that stores one Kafka record of a hosted partition."""
    name = f"{NAME_PREFIX}{topic}/{partition}/" + ("n" if key is None else
                                                   "k" + base64.urlsafe_b64encode(key).decode().rstrip("="))
    if value is None:
        return ev.KvDeleted(name=name, actor="kafka")
    return ev.KvPut(name=name, value=value, actor="kafka")


def unwrap(prefix: bytes, key: bytes | None, value: bytes | None) -> tuple[bytes | None, bytes | None] | None:
    """(Kafka key, Kafka value) of a stored record of the partition with `prefix`, None if it is not one."""
    if key is None or not key.startswith(prefix) or value is None:
        return None
    tail = key[len(prefix):]
    try:
        event = ev.decode_event(value)
        kafka_key = None if tail == b"n" else base64.urlsafe_b64decode(tail[1:] + b"=" * (-(len(tail) - 1) % 4))
    except (ev.EventError, ev.SchemaVersionError, binascii.Error, ValueError):
        return None
    if tail[:1] not in (b"n", b"k"):
        return None
    if isinstance(event, ev.KvPut):
        return kafka_key, event.value
    if isinstance(event, ev.KvDeleted):
        return kafka_key, None
    return None


def span_batch(records: list[Record], base_offset: int, last_offset: int, leader_epoch: int) -> bytes:
    """A v2 batch covering offsets [base_offset, last_offset] holding `records` (maybe none): what a
    compacted Kafka log serves, so consumers move past the offsets it does not hold."""
    if records:
        batch = bytearray(encode_records(records, base_offset=base_offset, leader_epoch=leader_epoch))
    else:
        batch = bytearray(HEADER.pack(base_offset, HEADER_SIZE - LOG_OVERHEAD, leader_epoch, MAGIC, 0, 0, 0, -1, -1,
                                      -1, -1, -1, 0))
    _LAST_OFFSET_DELTA.pack_into(batch, 23, last_offset - base_offset)
    _CRC.pack_into(batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def filter_batches(batches: Iterable[Any], prefix: bytes, from_offset: int, until: int | None = None,
                   epoch: int = 0) -> list[bytes]:
    """Kafka batches of the partition with `prefix` re-encoded from kv log batches: one per run of
    consecutive batches of the same leader epoch, covering offsets [from_offset, until) at most.

    With `until` (the partition's high watermark) the batches always reach `until - 1` when
    `from_offset` is below it, even where the kv log holds nothing of the partition up to there: a
    kv batch that runs past the watermark (another record after the partition's last one), or a
    range key compaction emptied (the partition's last record was a tombstone or a no-op it
    dropped). Without that a reader positioned below the watermark would get nothing, forever
    (`epoch` is then the empty span's leader epoch)."""
    out: list[bytes] = []
    run: list[Record] = []
    run_start = run_end = run_epoch = None
    covered = from_offset            # the first offset no batch of `out` covers

    def flush() -> None:
        nonlocal run, run_start, covered
        if run_start is not None and run_end is not None and run_end >= run_start:
            out.append(span_batch(run, run_start, run_end, run_epoch))   # type: ignore[arg-type]
            covered = run_end + 1
        run, run_start = [], None

    for batch in batches:
        h = batch.header
        if until is not None and h.base_offset >= until:
            break
        if run_epoch is not None and h.leader_epoch != run_epoch:
            flush()
        if run_start is None:
            run_start = max(h.base_offset, from_offset)
        run_epoch = h.leader_epoch
        run_end = h.base_offset + h.last_offset_delta
        if until is not None:
            run_end = min(run_end, until - 1)
        if h.is_control:
            continue
        for record in batch.records():
            if record.offset < from_offset or (until is not None and record.offset >= until):
                continue
            found = unwrap(prefix, record.key, record.value)
            if found is not None:
                run.append(Record(record.offset, record.timestamp, found[0], found[1]))
    flush()
    if until is not None and covered < until:
        out.append(span_batch([], covered, until - 1, run_epoch if run_epoch is not None else epoch))
    return out


class HostedIndex:
    """The last offset of each hosted partition in the kv group's committed log, read incrementally.

    A hosted partition's high watermark is its last record's offset + 1 (the log start when it holds
    none), not the kv group's: a consumer that reads "up to the high watermark" (Faust's table
    recovery) must find a record of its partition just below it. Call from the node's loop.
    """

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.scanned_to = -1

    def sync(self, log: Any, high_watermark: int) -> None:
        if self.scanned_to < log.start_offset or self.scanned_to > log.end_offset:
            self.last.clear()
            self.scanned_to = log.start_offset
        prefix = b"kv/" + NAME_PREFIX.encode()
        while self.scanned_to < high_watermark:
            chunk = log.read(self.scanned_to, 4 << 20, max_offset=high_watermark)
            if chunk.next_offset <= self.scanned_to:
                break
            for batch in chunk.batches():
                if batch.header.is_control:
                    continue
                for record in batch.records():
                    if record.key is not None and record.key.startswith(prefix):
                        self.last[partition_of(record.key)] = record.offset
            self.scanned_to = chunk.next_offset

    def high_watermark(self, partition_key: str, log_start: int) -> int:
        last = self.last.get(partition_key)
        return log_start if last is None or last < log_start else last + 1
