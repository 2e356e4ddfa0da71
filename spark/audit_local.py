"""Audit answers without Spark: the questions of spark.audit, read with pyarrow in this process.

A Spark session takes tens of seconds to start (minutes on a loaded machine) before it reads a
table of a hundred rows; most tables an operator asks about are small. This engine answers the
same questions (`state`, `history`, `diff`, `actions`) with the same rows from the same table
version: it reads the snapshot's Parquet files (pruned by the same file statistics), filters by the
point in Arrow, and replays the effects in Python, by the rules of the module docstring of
spark.audit (Txn operations exploded in order, only applied effects count for the state, the last
effect per key wins by (offset, op, group), deletes and ended leases remove an entity). It always
replays from the table's start (no state checkpoints): the cost grows with the rows read, which is
why `epochlog audit` asks Spark beyond `LOCAL_MAX_ROWS` (spark/cli.py). tests/spark/test_audit_local.py
compares every answer with the Spark engine's on the same tables.

Not thread-safe; one object per question or per command.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from spark.audit import DELETES, LEASE_ENDS, Point, _event_row, _state_row, check_key, diff_rows
from spark.pruning import FileStats
from spark.table import Snapshot

LOCAL_MAX_ROWS = 2_000_000
"""Tables of up to this many rows are answered in-process by default (a state question over 2 M rows
replays in about half a minute here; Spark's start-up alone costs that)."""

COLUMNS = ["group", "offset", "timestamp", "event_type", "key", "actor", "request_id", "payload", "applied"]


def table_rows(snapshot: Snapshot) -> int | None:
    """Rows of the snapshot from its file statistics (None when a file has none)."""
    if not snapshot.files:
        return 0
    if len(snapshot.stats) != len(snapshot.files) or any(f.rows is None for f in snapshot.stats):
        return None
    return sum(f.rows or 0 for f in snapshot.stats)


def fits_local(snapshot: Snapshot, max_rows: int = LOCAL_MAX_ROWS) -> bool:
    rows = table_rows(snapshot)
    return rows is not None and rows <= max_rows


def _key_of_op(op: dict[str, Any]) -> str | None:
    """The entity key a Txn operation changes (spark.audit's _KEY_OF_OP); None where a field is missing."""
    kind = op.get("type")
    try:
        if kind in ("KvPut", "KvDeleted"):
            parts = ["kv", op["name"]]
        elif kind == "OffsetCommitted":
            parts = ["offset", op["consumer_group"], op["topic"], op["queue_id"]]
        elif kind == "ConfigChanged":
            parts = ["config", op["scope"], op["name"]]
        else:
            parts = ["topic", op["name"]]
    except KeyError:
        return None
    if any(p is None for p in parts):
        return None
    return "/".join(_json_text(p) for p in parts)


def _json_text(value: Any) -> str:
    """A JSON value as Spark's get_json_object renders it (strings bare, the rest as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


class LocalAudit:
    """The questions of spark.audit.Audit over one snapshot, answered with pyarrow (see the module
    docstring). `files_read`: how many files the last question read, of `len(snapshot.files)`."""

    def __init__(self, snapshot: Snapshot, *, prune: bool = True) -> None:
        self.snapshot = snapshot
        self.prune = prune
        self.files_read = 0

    # --- reading --------------------------------------------------------------------------------

    def _rows(self, keep: Callable[[FileStats], bool], where: pads.Expression | None) -> list[dict[str, Any]]:
        """The rows of the files `keep` may need (all without statistics or pruning) matching `where`."""
        stats = list(self.snapshot.stats)
        if stats and self.prune:
            files = [f.uri for f in stats if keep(f)]
        else:
            files = list(self.snapshot.files)
        self.files_read = len(files)
        if not files:
            return []
        loc = self.snapshot.location
        if loc is None:
            import pyarrow.fs as pafs

            fs: Any = pafs.LocalFileSystem()
            paths = files
        else:
            fs, _ = loc.filesystem()
            paths = [loc.path(loc.relative(f)) for f in files]
        dataset = pads.dataset(paths, format="parquet", filesystem=fs)
        table: pa.Table = dataset.to_table(columns=COLUMNS, filter=where)
        return table.to_pylist()

    @staticmethod
    def _point_filter(point: Point) -> pads.Expression:
        if point.offset is not None:
            return (pc.field("group") == point.group) & (pc.field("offset") <= point.offset)
        assert point.time is not None
        return pc.field("timestamp") <= pa.scalar(point.time, pa.timestamp("us", tz="UTC"))

    @staticmethod
    def _effects(rows: list[dict[str, Any]], key_ok: Callable[[str], bool]) -> Iterator[dict[str, Any]]:
        """Each row's effects: itself (if its key passes `key_ok`), or a Txn's operations, in order."""
        for r in rows:
            base = {"group": r["group"], "offset": r["offset"], "actor": r["actor"], "request_id": r["request_id"],
                    "applied": r["applied"], "timestamp": r["timestamp"]}
            if r["event_type"] != "Txn":
                if key_ok(r["key"]):
                    yield {**base, "op": 0, "ekey": r["key"], "etype": r["event_type"], "body": r["payload"]}
                continue
            ops = json.loads(r["payload"]).get("ops") or []
            for i, op in enumerate(ops):
                op = op if isinstance(op, dict) else json.loads(op)
                yield {**base, "op": i + 1, "ekey": _key_of_op(op), "etype": op.get("type"), "body": json.dumps(op)}

    # --- the questions --------------------------------------------------------------------------

    def state(self, point: Point, prefix: str = "") -> list[dict[str, Any]]:
        """The entities as they were at `point`, in key order (spark.audit.Audit.state)."""
        if point.offset is not None:
            assert point.group is not None
            group, until = point.group, point.offset

            def in_point(f: FileStats) -> bool:
                return f.may_hold_offsets(group, 0, until)
        else:
            assert point.time is not None
            when = point.time

            def in_point(f: FileStats) -> bool:
                return f.may_hold_time_until(when)
        where = self._point_filter(point)
        if prefix:
            where = where & (pc.starts_with(pc.field("key"), prefix)
                             | pc.field("event_type").isin(["Txn", *LEASE_ENDS]))
        rows = self._rows(lambda f: in_point(f) and (f.may_hold_prefix(prefix) or f.may_hold_type("Txn", *LEASE_ENDS)),
                          where)
        latest: dict[str, tuple[tuple[int, int, str], dict[str, Any]]] = {}
        for e in self._effects(rows, lambda key: key.startswith(prefix)):
            if e["applied"] is False or e["ekey"] is None or not e["ekey"].startswith(prefix):
                continue
            rank = (e["offset"], e["op"], e["group"])
            held = latest.get(e["ekey"])
            if held is None or rank > held[0]:
                latest[e["ekey"]] = (rank, e)
        lease_ends: dict[int, int] = {}
        for r in rows:
            if r["event_type"] in LEASE_ENDS and r["applied"] is not False:
                lease = json.loads(r["payload"]).get("lease_id")
                if lease is not None:
                    lease_ends[int(lease)] = max(lease_ends.get(int(lease), -1), r["offset"])
        out = []
        for key, (_, e) in latest.items():
            body = json.loads(e["body"])
            if e["etype"] in DELETES or (e["etype"] == "ConfigChanged" and body.get("value") is None):
                continue
            lease = body.get("lease")
            if isinstance(lease, int) and lease_ends.get(lease, -1) > e["offset"]:
                continue
            out.append(_state_row({"key": key, "group": e["group"], "offset": e["offset"], "event_type": e["etype"],
                                   "body": e["body"], "actor": e["actor"], "timestamp": e["timestamp"]}))
        return sorted(out, key=lambda row: row["key"])

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every event that touched `key` (rejected ones too, `applied` false), oldest first."""
        check_key(key)
        rows = self._rows(lambda f: f.may_hold_key(key) or f.may_hold_type("Txn"),
                          (pc.field("key") == key) | (pc.field("event_type") == "Txn"))
        effects = [e for e in self._effects(rows, lambda k: k == key) if e["ekey"] == key]
        effects.sort(key=lambda e: (e["group"], e["offset"], e["op"]))
        return [_event_row(e) for e in effects]

    def diff(self, start: Point, end: Point, prefix: str = "") -> list[dict[str, Any]]:
        """Entities added, removed or changed between two points, in key order."""
        return diff_rows(self.state(start, prefix), self.state(end, prefix))

    def actions(self, actor: str, *, since: datetime | None = None, until: datetime | None = None,
                limit: int = 1000) -> list[dict[str, Any]]:
        """What principal `actor` did (every event it wrote, rejected ones too), oldest first."""
        where = pc.field("actor") == actor
        if since is not None:
            where = where & (pc.field("timestamp") >= pa.scalar(since, pa.timestamp("us", tz="UTC")))
        if until is not None:
            where = where & (pc.field("timestamp") <= pa.scalar(until, pa.timestamp("us", tz="UTC")))
        rows = self._rows(lambda f: True, where)
        rows.sort(key=lambda r: (r["timestamp"], r["group"], r["offset"]))
        return [_event_row({**r, "op": 0, "ekey": r["key"], "etype": r["event_type"], "body": r["payload"]})
                for r in rows[:limit]]
