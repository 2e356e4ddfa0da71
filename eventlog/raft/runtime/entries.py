"""Raft entries as record batches: how the consensus log is stored in the segmented log.

- A NORMAL entry's data is an encoded RecordBatch of `count` records (the leader runtime encodes
  the proposals it coalesced); storing it only stamps baseOffset = entry index and
  partitionLeaderEpoch = entry term.
- NOOP and CONF_CHANGE entries, which the core creates itself, become Kafka control batches of one
  record keyed `__raft/noop` or `__raft/conf` (value: the encoded ConfChange). Their timestamp is
  -1 (Kafka's "no timestamp"), so the bytes are a pure function of the entry and every replica
  writes byte-identical segments.
"""

from __future__ import annotations

import struct

from eventlog.errors import InvalidBatchError
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import Record as LogRecord
from eventlog.records import RecordBatch, check_batch, encode_records, stamp

NOOP_KEY = b"__raft/noop"
CONF_KEY = b"__raft/conf"
_KIND_BY_KEY = {NOOP_KEY: EntryKind.NOOP, CONF_KEY: EntryKind.CONF_CHANGE}
_KEY_BY_KIND = {EntryKind.NOOP: NOOP_KEY, EntryKind.CONF_CHANGE: CONF_KEY}
NO_TIMESTAMP = -1


def entry_to_batch(entry: Entry) -> bytes:
    """The exact bytes stored for `entry`. A NORMAL entry's data itself when it is already stamped with
    the entry's index and term: a follower's entries, which the leader sends as it stored them (no copy)."""
    if entry.kind is EntryKind.NORMAL:
        data = entry.data
        base_offset, epoch, last_offset_delta = _STAMPED.unpack_from(data)
        if last_offset_delta + 1 != entry.count:
            raise InvalidBatchError(f"entry {entry.index} covers {entry.count} indexes but its batch holds "
                                    f"{last_offset_delta + 1}")
        if base_offset == entry.index and epoch == entry.term and type(data) is bytes:
            return data
        stamped = bytearray(data)
        stamp(stamped, entry.index, entry.term)
        return bytes(stamped)
    record = LogRecord(entry.index, NO_TIMESTAMP, _KEY_BY_KIND[entry.kind], entry.data)
    return encode_records([record], leader_epoch=entry.term, control=True)


_STAMPED = struct.Struct(">q4xi7xi")
"""baseOffset, partitionLeaderEpoch and lastOffsetDelta of a batch header (eventlog.records.HEADER)."""


def stored_bytes_at_most(entries: tuple[Entry, ...] | list[Entry]) -> int:
    """An upper bound of the bytes `entries` take in the log (what `entry_to_batch` makes of them)."""
    return sum(len(e.data) if e.kind is EntryKind.NORMAL else len(e.data) + _CONTROL_BATCH_BYTES for e in entries)


_CONTROL_BATCH_BYTES = 128   # a control batch's header (61 bytes) and its one record's framing and key


def check_entry(entry: Entry, max_batch_bytes: int) -> str | None:
    """Why a peer's `entry` cannot be stored as it is (None: it can). A NORMAL entry's data must be
    one valid record batch (CRC included) of `count` records, not a control batch, within the log's
    batch limit: what `entry_to_batch` and `Log.append_replica` require, checked before the Raft core
    takes the entry (eventlog/raft/peer_check.py) so a bad one is dropped, not fatal. NOOP and
    configuration entries become batches made here from their fields (the core checks those)."""
    if entry.kind is not EntryKind.NORMAL:
        return None
    data = entry.data
    header = check_batch(data, 0, len(data))
    if isinstance(header, str):
        return f"not a record batch: {header}"
    if header.size != len(data):
        return f"{len(data) - header.size} bytes follow its record batch"
    if header.is_control:
        return "a control batch in a normal entry"
    if header.last_offset_delta + 1 != entry.count:
        return f"it covers {entry.count} indexes but its batch holds {header.last_offset_delta + 1}"
    if header.size > max_batch_bytes:
        return f"its batch of {header.size} bytes exceeds the limit of {max_batch_bytes}"
    return None


def batch_to_entry(batch: RecordBatch) -> Entry:
    """The entry a stored batch holds."""
    h = batch.header
    count = h.last_offset_delta + 1
    if not h.is_control:
        return Entry(index=h.base_offset, term=h.leader_epoch, count=count, data=bytes(batch.raw))
    record = next(iter(batch.records()))
    kind = _KIND_BY_KEY.get(record.key or b"")
    if kind is None:
        raise InvalidBatchError(f"control batch at {h.base_offset} has unknown key {record.key!r}")
    return Entry(index=h.base_offset, term=h.leader_epoch, count=count, kind=kind, data=record.value or b"")
