"""Audit queries over the events table, in Spark SQL, at any table version.

The table is read as of a Delta version (`spark.table.resolve`: latest, `--table-version V` or
`--table-as-of TIME`; delta-rs lists that version's files, Spark reads them as Parquet with the
partition column from the directory names): a temp view `events`.

**Effects.** An event changes one entity (its record key), except a `Txn`, whose operations each
change their own entity (exploded from the payload, in order: `op` 1, 2...). Only events that
changed the views count for the state: `applied` = false marks a rejected command (failed
compare-and-set, stale epoch...) or a retry of an applied request; `applied` null (an offline export
without views) is taken as applied.

**State at a point** (`state`): per entity key, the last effect at or before the point (an offset of
one group, or a time across groups); the entity is absent if that effect deletes it (KvDeleted,
TopicDeleted, BrokerUnregistered, SessionClosed, LeaseRevoked/Expired, ConfigChanged with no
value), or if its last put attached it to a lease that ended after the put and at or before the
point. A kv entry's value comes from the event; any other entity is shown by the event that last
changed it (its payload). The last effect is found with a grouped max over (offset, op) (partial
aggregation, no sort of the whole history); the key prefix is applied in the scan of the table.
(Measured: a two-step variant, a max over narrow columns then a join fetching the winners'
payloads, was no faster here: the second scan cost what the payload copies saved.) For kv keys this is what the cluster answers to
`get --as-of N` (tests/spark/test_export_audit.py checks it against a live cluster).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spark.errors import AuditError
from spark.pruning import FileStats
from spark.table import SPARK_DDL, Snapshot
from statemachines.events import ENTITY_KINDS

DELETES = ("KvDeleted", "TopicDeleted", "BrokerUnregistered", "SessionClosed", "LeaseRevoked", "LeaseExpired")
LEASE_ENDS = ("LeaseRevoked", "LeaseExpired")


@dataclass(frozen=True, slots=True)
class Point:
    """A point in the history: offset `offset` of group `group`, or the time `time` (all groups)."""

    group: str | None = None
    offset: int | None = None
    time: datetime | None = None

    def __post_init__(self) -> None:
        if (self.offset is None) == (self.time is None):
            raise AuditError("a point is an offset (with its group) or a time, not both or neither")
        if self.offset is not None and (not self.group or self.offset < 0):
            raise AuditError("an offset point needs a group and an offset >= 0")

    def describe(self) -> str:
        return (f"offset {self.offset} of group {self.group}" if self.offset is not None
                else f"{self.time.isoformat() if self.time else ''}")


def check_key(key: str) -> str:
    """An entity key such as kv/app/x or topic/orders; AuditError otherwise."""
    kind, sep, rest = key.partition("/")
    if not sep or not rest or kind not in ENTITY_KINDS:
        raise AuditError(f"malformed key {key!r}: an entity key is <kind>/<name> with kind one of "
                         f"{', '.join(ENTITY_KINDS)} (a kv key is kv/<name>, e.g. kv/app/x)")
    return key


def check_prefix(prefix: str) -> str:
    kind = prefix.split("/", 1)[0]
    if kind and kind not in ENTITY_KINDS and not any(k.startswith(prefix) for k in ENTITY_KINDS):
        raise AuditError(f"prefix {prefix!r} matches no entity key (keys start with "
                         f"{', '.join(k + '/' for k in ENTITY_KINDS)})")
    return prefix


class Audit:
    """Queries over one snapshot of the table (`spark.table.resolve`).

    Each question reads only the files whose statistics may hold what it needs (spark.pruning;
    `prune=False` reads every file), and `state` at an offset starts from the nearest state checkpoint
    (spark.checkpoints; `use_checkpoints=False` replays from the start). Neither changes an answer.
    `files_read` is how many files the last question read, of `len(snapshot.files)`."""

    def __init__(self, spark: Any, snapshot: Snapshot, *, prune: bool = True, use_checkpoints: bool = True) -> None:
        self.spark = spark
        self.snapshot = snapshot
        self.prune = prune
        self.use_checkpoints = use_checkpoints
        self.files_read = 0
        self.checkpoint_used: int | None = None   # the offset of the checkpoint the last state started from
        self._views: dict[tuple[str, ...], str] = {}
        self._checkpoints: dict[str, dict[int, list[str]]] | None = None
        self.view = self._view(list(snapshot.stats), all_files=True)

    def _view(self, stats: list[FileStats], *, all_files: bool = False) -> str:
        files = [f.uri for f in stats] if stats or not all_files else list(self.snapshot.files)
        if not all_files:
            self.files_read = len(files)
        key = tuple(files)
        if key not in self._views:
            name = f"events_v{self.snapshot.version}_{len(self._views)}"
            table_frame(self.spark, self.snapshot, files).createOrReplaceTempView(name)
            self._views[key] = name
        return self._views[key]

    def _select(self, keep: Callable[[FileStats], bool]) -> str:
        """A view of the files `keep` says may matter (every file without pruning or statistics)."""
        stats = list(self.snapshot.stats)
        if not stats:
            self.files_read = len(self.snapshot.files)
            return self.view
        return self._view([f for f in stats if not self.prune or keep(f)])

    def _sql(self, text: str, view: str | None = None, **args: Any) -> list[Any]:
        return list(self._frame(text, view, **args).collect())

    def _frame(self, text: str, view: str | None = None, **args: Any) -> Any:
        return self.spark.sql(text.replace("{events}", view or self.view), args=args)

    # --- the queries ----------------------------------------------------------------------------

    def state(self, point: Point, prefix: str = "") -> list[dict[str, Any]]:
        """The entities as they were at `point` (see the module docstring), in key order."""
        rows = self.state_frame(point, prefix).collect()
        return sorted((_state_row(r) for r in rows), key=lambda row: row["key"])   # small: sorted here

    def state_frame(self, point: Point, prefix: str = "") -> Any:
        """The state at `point` as a DataFrame (key, group, offset, op, event_type, body, actor, timestamp)."""
        where, args = _point_filter(point)
        since = self._checkpoint(point)
        self.checkpoint_used = since
        lo = -1 if since is None else since
        if point.offset is not None:
            assert point.group is not None
            group, until = point.group, point.offset

            def in_point(f: FileStats) -> bool:
                return f.may_hold_offsets(group, lo + 1, until)
        else:
            assert point.time is not None
            when = point.time

            def in_point(f: FileStats) -> bool:
                return f.may_hold_time_until(when)

        view = self._select(lambda f: in_point(f) and (f.may_hold_prefix(prefix) or f.may_hold_type("Txn", *LEASE_ENDS)))
        if since is not None:
            where += " AND `offset` > :since"
            args["since"] = since
        effects = _EFFECTS_SQL.replace("{where}", where).replace("{keyfilter}", "startswith(key, :prefix)")
        if since is not None:
            effects += _CHECKPOINT_EFFECTS_SQL.replace("{state}", self._state_view(point, since))
        text = _STATE_SQL.replace("{where}", where).replace("{effects}", effects)
        return self._frame(text, view, prefix=prefix, **args)

    def _checkpoint(self, point: Point) -> int | None:
        if not self.use_checkpoints or point.offset is None or self.snapshot.location is None:
            return None
        from spark.checkpoints import checkpoints, nearest

        if self._checkpoints is None:
            self._checkpoints = checkpoints(self.snapshot.location)
        assert point.group is not None
        mark = (self.snapshot.watermarks or {}).get(point.group, -1)
        return nearest(self._checkpoints, point.group, point.offset, mark)

    def _state_view(self, point: Point, offset: int) -> str:
        from spark.checkpoints import STATE_DDL

        assert self._checkpoints is not None and point.group is not None
        files = self._checkpoints[point.group][offset]
        name = f"state_{point.group}_{offset}".replace("-", "_")
        loc = self.snapshot.location
        assert loc is not None
        if loc.is_local:
            df = self.spark.read.schema(STATE_DDL).parquet(*files)
        else:
            from spark.datasource import FILES_NAME

            prefix = loc.uri.rstrip("/") + "/"
            df = (self.spark.read.format(FILES_NAME).options(**loc.to_spark_options()).option("schema", "state")
                  .option("files", json.dumps([f[len(prefix):] for f in files])).load())
        df.createOrReplaceTempView(name)
        return name

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every event that touched `key` (rejected ones too, `applied` false), oldest first."""
        check_key(key)
        view = self._select(lambda f: f.may_hold_key(key) or f.may_hold_type("Txn"))
        effects = _EFFECTS_SQL.replace("{where}", "TRUE").replace("{keyfilter}", "key = :key")
        rows = self._sql(_HISTORY_SQL.replace("{effects}", effects), view, key=key)
        return [_event_row(r) for r in rows]

    def diff(self, start: Point, end: Point, prefix: str = "") -> list[dict[str, Any]]:
        """Entities added, removed or changed between two points, in key order."""
        return diff_rows(self.state(start, prefix), self.state(end, prefix))

    def actions(self, actor: str, *, since: datetime | None = None, until: datetime | None = None,
                limit: int = 1000) -> list[dict[str, Any]]:
        """What principal `actor` did (every event it wrote, rejected ones too), oldest first."""
        conditions = ["actor = :actor"]
        args: dict[str, Any] = {"actor": actor, "limit": limit}
        if since is not None:
            conditions.append("`timestamp` >= :since")
            args["since"] = since
        if until is not None:
            conditions.append("`timestamp` <= :until")
            args["until"] = until
        rows = self._sql(f"SELECT `group`, `offset`, 0 AS op, key AS ekey, event_type AS etype, payload AS body, actor, "
                         f"request_id, applied, `timestamp` FROM {{events}} WHERE {' AND '.join(conditions)} "
                         f"ORDER BY `timestamp`, `group`, `offset` LIMIT :limit", **args)
        return [_event_row(r) for r in rows]


def diff_rows(before_rows: list[dict[str, Any]], after_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The diff of two states (rows of `state`): entities added, removed or changed, in key order (the
    same for every engine that answers `state`: spark.audit_local too)."""
    before = {r["key"]: r for r in before_rows}
    after = {r["key"]: r for r in after_rows}
    out = []
    for key in sorted(before.keys() | after.keys()):
        b, a = before.get(key), after.get(key)
        if b is not None and a is not None and b["offset"] == a["offset"] and b["group"] == a["group"]:
            continue
        change = "added" if b is None else "removed" if a is None else "changed"
        out.append({"key": key, "change": change,
                    "before_offset": None if b is None else b["offset"],
                    "after_offset": None if a is None else a["offset"],
                    "before": None if b is None else _shown(b), "after": None if a is None else _shown(a),
                    "after_event": None if a is None else a["event_type"],
                    "actor": None if a is None else a["actor"]})
    return out


def table_frame(spark: Any, snapshot: Snapshot, files: list[str]) -> Any:
    """A DataFrame of the events in `files` (URIs of the snapshot's files): Spark's Parquet reader for
    a local table, the `epochlog_files` data source (pyarrow's filesystems) for object storage."""
    if not files:
        return spark.createDataFrame([], SPARK_DDL)
    loc = snapshot.location
    if loc is None or loc.is_local:
        return spark.read.schema(SPARK_DDL).option("basePath", snapshot.root).parquet(*files)
    from spark.datasource import FILES_NAME

    prefix = loc.uri.rstrip("/") + "/"
    relative = [f.removeprefix(prefix) for f in files]
    return (spark.read.format(FILES_NAME).options(**loc.to_spark_options())
            .option("files", json.dumps(relative)).load())


def _point_filter(point: Point) -> tuple[str, dict[str, Any]]:
    if point.offset is not None:
        return "`group` = :grp AND `offset` <= :point_offset", {"grp": point.group, "point_offset": point.offset}
    return "`timestamp` <= :point_time", {"point_time": point.time}


_KEY_OF_OP = """CASE get_json_object(o.col, '$.type')
      WHEN 'KvPut' THEN concat('kv/', get_json_object(o.col, '$.name'))
      WHEN 'KvDeleted' THEN concat('kv/', get_json_object(o.col, '$.name'))
      WHEN 'OffsetCommitted' THEN concat('offset/', get_json_object(o.col, '$.consumer_group'), '/',
                                         get_json_object(o.col, '$.topic'), '/', get_json_object(o.col, '$.queue_id'))
      WHEN 'ConfigChanged' THEN concat('config/', get_json_object(o.col, '$.scope'), '/', get_json_object(o.col, '$.name'))
      ELSE concat('topic/', get_json_object(o.col, '$.name')) END"""

_EFFECTS_SQL = f"""
  SELECT `group`, `offset`, 0 AS op, key AS ekey, event_type AS etype, payload AS body, actor, request_id,
         applied, `timestamp`
  FROM {{events}} WHERE event_type <> 'Txn' AND {{where}} AND {{keyfilter}}
  UNION ALL
  SELECT `group`, `offset`, o.pos + 1 AS op, {_KEY_OF_OP} AS ekey, get_json_object(o.col, '$.type') AS etype,
         o.col AS body, actor, request_id, applied, `timestamp`
  FROM {{events}} LATERAL VIEW posexplode(from_json(get_json_object(payload, '$.ops'), 'array<string>')) o AS pos, col
  WHERE event_type = 'Txn' AND {{where}}
"""

_CHECKPOINT_EFFECTS_SQL = """
  UNION ALL
  SELECT `group`, `offset`, op, key AS ekey, event_type AS etype, body, actor, '' AS request_id, TRUE AS applied,
         `timestamp`
  FROM {state} WHERE startswith(key, :prefix)
"""

_DELETES = ", ".join(f"'{t}'" for t in DELETES)
_LEASE_ENDS = ", ".join(f"'{t}'" for t in LEASE_ENDS)

_STATE_SQL = f"""
WITH effects AS ({{effects}}),
latest AS (
  SELECT ekey, max(named_struct('offset', `offset`, 'op', op, 'group', `group`, 'etype', etype, 'body', body,
                                'actor', actor, 'ts', `timestamp`)) AS e
  FROM effects
  WHERE (applied IS NULL OR applied) AND startswith(ekey, :prefix)
  GROUP BY ekey),
lease_ends AS (
  SELECT CAST(get_json_object(payload, '$.lease_id') AS BIGINT) AS lease_id, max(`offset`) AS end_offset
  FROM {{events}}
  WHERE event_type IN ({_LEASE_ENDS}) AND (applied IS NULL OR applied) AND {{where}}
  GROUP BY 1)
SELECT l.ekey AS key, l.e.group AS `group`, l.e.offset AS `offset`, l.e.op AS op, l.e.etype AS event_type,
       l.e.body AS body, l.e.actor AS actor, l.e.ts AS `timestamp`
FROM latest l
LEFT JOIN lease_ends x
  ON x.lease_id = CAST(get_json_object(l.e.body, '$.lease') AS BIGINT) AND x.end_offset > l.e.offset
WHERE l.e.etype NOT IN ({_DELETES})
  AND NOT (l.e.etype = 'ConfigChanged' AND get_json_object(l.e.body, '$.value') IS NULL)
  AND x.lease_id IS NULL
"""

_HISTORY_SQL = """
SELECT * FROM ({effects}) WHERE ekey = :key ORDER BY `group`, `offset`, op
"""


def _ts(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return str(value)


def value_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A kv event's value as text when printable UTF-8, else base64 (like the client commands)."""
    raw = body.get("value")
    if raw is None:
        return {"value": None, "encoding": None}
    data = base64.b64decode(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\t\r\n" for c in text):
        return {"value": text, "encoding": "utf-8"}
    return {"value": raw, "encoding": "base64"}


def _state_row(r: Any) -> dict[str, Any]:
    body = json.loads(r["body"])
    row: dict[str, Any] = {"key": r["key"], "group": r["group"], "offset": int(r["offset"]),
                           "event_type": r["event_type"], "actor": r["actor"], "timestamp": _ts(r["timestamp"])}
    if r["key"].startswith("kv/"):
        row.update(value_fields(body))
        row["lease"] = int(body.get("lease") or 0)
    else:
        row.update({"value": None, "encoding": None})
    row["event"] = body
    return row


def _event_row(r: Any) -> dict[str, Any]:
    body = json.loads(r["body"])
    row: dict[str, Any] = {"group": r["group"], "offset": int(r["offset"]), "op": int(r["op"]),
                           "timestamp": _ts(r["timestamp"]), "event_type": r["etype"], "key": r["ekey"],
                           "actor": r["actor"], "request_id": r["request_id"], "applied": r["applied"]}
    if r["ekey"].startswith("kv/") and r["etype"] == "KvPut":
        row.update(value_fields(body))
    else:
        row.update({"value": None, "encoding": None})
    row["event"] = body
    return row


def _shown(row: dict[str, Any]) -> str:
    if row.get("value") is not None:
        return str(row["value"]) if row.get("encoding") == "utf-8" else f"base64:{row['value']}"
    return json.dumps(row["event"], sort_keys=True)
