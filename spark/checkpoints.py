"""State checkpoints: the state of every key of a group at an offset, kept in a side Delta table, so that
`audit state --offset N` replays only the events after the nearest checkpoint at or below N.

The side table lives at `<table>/_epochlog/state` (a directory starting with `_`: Delta readers of
the events table, and its vacuum, do not look there) and is a Delta table itself, readable by any
Delta reader. One row per entity present at the checkpoint:

    checkpoint_group   string     the group whose offset the checkpoint is at
    checkpoint_offset  int64      the offset: the state after every event of the group at or below it
    key                string     the entity key
    group, offset, op  ...        the effect that last changed it (op: 0, or the position in a Txn)
    event_type, body, actor, timestamp   that effect, as the audit's state query returns it

Why a checkpoint gives the same answers as a full replay (spark.audit `state` at offset N >= C): an
entity's last effect at N is its last effect in (C, N] if it has one, else its last effect at C; an
entity absent at C (deleted, or its lease ended after its last put) stays absent unless an effect in
(C, N] changes it; a present one becomes absent at N only through a delete in (C, N] or a lease end in
(C, N] after its last put (lease ends at or before C were already applied). So the state at N is the
state query over the checkpoint's rows plus the events in (C, N], with lease ends from (C, N] only.

A checkpoint is valid for every table version whose watermark of its group is at or above C: the
events at or below a watermark never change (the table is append-only; optimize rewrites files,
never rows). Checkpoints are made by `epochlog table checkpoint --every N` (run it periodically, e.g.
after exports), each from the previous one.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark.storage import TableLocation

STATE_DIR = "_epochlog/state"

STATE_SCHEMA = pa.schema([
    pa.field("checkpoint_group", pa.string(), nullable=False),
    pa.field("checkpoint_offset", pa.int64(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("group", pa.string(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("op", pa.int32(), nullable=False),
    pa.field("event_type", pa.string(), nullable=True),
    pa.field("body", pa.string(), nullable=True),
    pa.field("actor", pa.string(), nullable=True),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=True),
])

STATE_DDL = ("`checkpoint_group` STRING, `checkpoint_offset` BIGINT, `key` STRING, `group` STRING, `offset` BIGINT, "
             "`op` INT, `event_type` STRING, `body` STRING, `actor` STRING, `timestamp` TIMESTAMP")


def state_location(table: TableLocation) -> TableLocation:
    return table.child(STATE_DIR)


def checkpoints(table: TableLocation) -> dict[str, dict[int, list[str]]]:
    """group -> checkpoint offset -> URIs of its files (nothing when the side table does not exist)."""
    from deltalake import DeltaTable

    loc = state_location(table)
    if not DeltaTable.is_deltatable(loc.uri, storage_options=loc.delta_options()):
        return {}
    dt = DeltaTable(loc.uri, storage_options=loc.delta_options())
    actions = dt.get_add_actions(flatten=True)
    actions = actions if isinstance(actions, pa.Table) else pa.table(actions)
    out: dict[str, dict[int, list[str]]] = {}
    for row in actions.to_pylist():
        group, offset = row.get("min.checkpoint_group"), row.get("min.checkpoint_offset")
        assert group == row.get("max.checkpoint_group") and offset == row.get("max.checkpoint_offset"), \
            f"a state file holds several checkpoints: {row['path']}"
        from urllib.parse import unquote

        out.setdefault(group, {}).setdefault(int(offset), []).append(loc.file_uri(unquote(row["path"])))
    return out


def nearest(found: dict[str, dict[int, list[str]]], group: str, offset: int, watermark: int) -> int | None:
    """The highest checkpoint of `group` at or below both `offset` and the table version's watermark."""
    usable = [c for c in found.get(group, {}) if c <= offset and c <= watermark]
    return max(usable) if usable else None


def write_checkpoint(table: TableLocation, rows: pa.Table, group: str, offset: int) -> None:
    """Append one checkpoint (the state rows of `group` at `offset`) to the side table in one commit."""
    from deltalake import CommitProperties, write_deltalake

    n = rows.num_rows
    data = pa.table({"checkpoint_group": pa.array([group] * n, pa.string()),
                     "checkpoint_offset": pa.array([offset] * n, pa.int64()),
                     **{name: rows.column(name).cast(STATE_SCHEMA.field(name).type) for name in STATE_SCHEMA.names[2:]}},
                    schema=STATE_SCHEMA)
    loc = state_location(table)
    write_deltalake(loc.uri, data, mode="append", storage_options=loc.delta_options(),
                    commit_properties=CommitProperties(custom_metadata={"epochlog.checkpoint": f"{group}@{offset}"}))


def plan_checkpoints(found: dict[str, dict[int, list[str]]], watermarks: dict[str, int], every: int) -> list[
        tuple[str, int]]:
    """(group, offset) of the checkpoints to make: every multiple of `every` at or below each group's
    watermark that has none yet, in offset order (each is made from the one before)."""
    if every < 1:
        raise ValueError("every must be positive")
    todo = []
    for group, mark in sorted(watermarks.items()):
        have = found.get(group, {})
        todo += [(group, c) for c in range(every, mark + 1, every) if c not in have]
    return todo


def make_checkpoints(spark: Any, table: TableLocation, every: int) -> list[tuple[str, int, int]]:
    """Make the missing checkpoints (plan_checkpoints) of the latest table version; (group, offset,
    rows) of each one made."""
    from spark.audit import Audit, Point
    from spark.table import resolve

    snapshot = resolve(table)
    made = []
    for group, offset in plan_checkpoints(checkpoints(table), snapshot.watermarks or {}, every):
        audit = Audit(spark, snapshot)   # sees the checkpoints made so far: each builds on the last
        rows = audit.state_frame(Point(group=group, offset=offset)).toArrow()
        write_checkpoint(table, rows, group, offset)
        made.append((group, offset, rows.num_rows))
    return made
