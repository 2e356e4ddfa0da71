"""Committed records -> Arrow rows of the `events` table (pure: no IO, no Spark).

A record is what a source read for one offset (control batches are never passed on). Its value is
decoded with `statemachines.events.decode_event`; the payload column is the event as JSON (bytes
in base64, msgspec's JSON encoding). A value that does not decode is still a committed record that
every replica rejected alike: it becomes a row of type `_malformed` (payload: the error and the
raw value in base64), never a reason to stop. An event of a NEWER schema version than this code
knows stops the export instead (SchemaVersionError): upgrade the exporter rather than misread it.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.offline import CommittedRecord
from spark.table import FILE_SCHEMA, PARTITION_COLUMN, ROW_SCHEMA
from statemachines import events as ev

MALFORMED = "_malformed"


SourceRecord = CommittedRecord
"""What both sources yield for one offset: the offline reader's record (eventlog/offline.py), which
ClusterSource builds from the SDK's `EventRecord` (the same fields: the node serves them online)."""


_json = msgspec.json.Encoder()


def to_batch(group: str, records: Sequence[SourceRecord]) -> pa.RecordBatch:
    """The table rows (ROW_SCHEMA, date included) of `records`, all of group `group`."""
    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ROW_SCHEMA)
    offsets, keys, values, stamps, terms, applied = zip(*records)
    try:
        events: list[ev.Event | None] = [_decode(v) for v in values]      # the fast path: every value decodes
        types = [e.__struct_config__.tag for e in events]  # type: ignore[union-attr]
        actors = [e.actor for e in events]  # type: ignore[union-attr]
        rids = [e.request_id for e in events]  # type: ignore[union-attr]
        versions = [e.v for e in events]  # type: ignore[union-attr]
        payloads = [_encode(e).decode() for e in events]  # type: ignore[arg-type]
    except ev.SchemaVersionError:
        raise
    except ev.EventError:
        events, types, actors, rids, versions, payloads = _one_by_one(values)
    typed = [_typed(e) for e in events]
    t_value, t_lease, t_expected, t_broker, t_epoch = zip(*typed)
    ts = pa.array(stamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
    columns = [
        pa.array(offsets, pa.int64()),
        pa.array([group] * n, pa.string()),
        pa.array(terms, pa.int64()),
        ts,
        pa.array(types, pa.string()),
        pa.array(keys, pa.string()),
        pa.array(actors, pa.string()),
        pa.array(rids, pa.string()),
        pa.array(versions, pa.int32()),
        pa.array(payloads, pa.string()),
        pa.array(applied, pa.bool_()),
        pa.array(t_value, pa.binary()),
        pa.array(t_lease, pa.int64()),
        pa.array(t_expected, pa.int64()),
        pa.array(t_broker, pa.string()),
        pa.array(t_epoch, pa.int64()),
        day_of(ts),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ROW_SCHEMA)


def _decode(value: bytes | memoryview | None) -> ev.Event:
    return ev.decode_event(value or b"")


def _encode(event: ev.Event) -> bytes:
    return _json.encode(event)


_NONE = (None, None, None, None, None)


def _typed(event: ev.Event | None) -> tuple[bytes | None, int | None, int | None, str | None, int | None]:
    """(value, lease, expected_version, broker_name, epoch) of an event: the typed columns."""
    if event is None:
        return _NONE
    if isinstance(event, ev.KvPut):
        return event.value, event.lease or None, event.expected_version, None, None
    if isinstance(event, ev.KvDeleted | ev.TopicUpdated | ev.TopicDeleted):
        return None, None, event.expected_version, None, None
    if isinstance(event, ev.LeaseGranted | ev.LeaseRevoked | ev.LeaseExpired):
        return None, event.lease_id, None, None, None
    if isinstance(event, ev.SessionOpened):
        return None, event.lease or None, None, None, None
    if isinstance(event, ev.ConfigChanged):
        return None if event.value is None else event.value.encode(), None, None, None, None
    broker_epoch = getattr(event, "broker_epoch", None)
    if broker_epoch is not None:
        return None, None, None, getattr(event, "name", None), broker_epoch
    master_epoch = getattr(event, "master_epoch", None)
    if master_epoch is not None:
        return None, None, None, None, master_epoch
    return _NONE


def _one_by_one(values: Sequence[bytes | memoryview | None]) -> tuple[list[ev.Event | None], list[str], list[str],
                                                                     list[str], list[int], list[str]]:
    """The event columns when some value does not decode: those become `_malformed` rows."""
    events: list[ev.Event | None] = []
    types, actors, rids, versions, payloads = [], [], [], [], []
    for value in values:
        try:
            event = _decode(value)
        except ev.SchemaVersionError:
            raise
        except ev.EventError as exc:
            events.append(None)
            types.append(MALFORMED)
            actors.append("")
            rids.append("")
            versions.append(0)
            raw = base64.b64encode(bytes(value or b"")).decode()
            payloads.append(_json.encode({"error": str(exc), "value": raw}).decode())
        else:
            events.append(event)
            types.append(event.__struct_config__.tag)  # type: ignore[arg-type]
            actors.append(event.actor)
            rids.append(event.request_id)
            versions.append(event.v)
            payloads.append(_encode(event).decode())
    return events, types, actors, rids, versions, payloads


def day_of(timestamps: pa.Array) -> pa.Array:
    """The partition value of each timestamp: its UTC day, YYYY-MM-DD."""
    return timestamps.cast(pa.date32()).cast(pa.string())


def split_by_day(batch: pa.RecordBatch) -> dict[str, pa.RecordBatch]:
    """`batch` (table columns) as FILE_SCHEMA-named batches keyed by partition value."""
    days = batch.column(PARTITION_COLUMN)
    data = batch.select(FILE_SCHEMA.names)
    unique = pc.unique(days).to_pylist()
    if len(unique) == 1:
        return {unique[0]: data}
    return {day: data.filter(pc.equal(days, day)) for day in unique}
