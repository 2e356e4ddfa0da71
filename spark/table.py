"""The Delta table `events` (through delta-rs): schema, creation, app transactions, versions, files.

One row per committed event of every group:

    offset          int64      the event's offset in its group's log (unique per group)
    group           string     the Raft group (metadata, offsets, kv...)
    term            int64      the Raft term that wrote it (the batch's partitionLeaderEpoch)
    timestamp       timestamp  when the leader appended it (UTC, ms precision)
    event_type      string     KvPut, TopicCreated, Txn... (statemachines.events)
    key             string     the record key: the entity key (kv/app/x; txn/<first op's key> for a Txn)
    actor           string     the acting principal ("" when none)
    request_id      string     the client's request id ("" when none)
    schema_version  int32      the event's schema version
    payload         string     the event as JSON (bytes in base64)
    applied         boolean    whether applying it changed the views (false: rejected, or a retry of
                               an earlier request); null when the source could not tell
    value           binary     typed payload fields, null where the event has none: a kv put's value
    lease           int64        (a ConfigChanged's value as UTF-8), the lease a put or session is
    expected_version int64       attached to or a lease event's id, a compare-and-set's expected
    broker_name     string       version, a broker event's broker name, and its epoch (broker epoch,
    epoch           int64        or a group's master epoch)
    date            string     partition column: the UTC day of `timestamp`, YYYY-MM-DD (ASCII, so
                               every reader parses the directory names alike)

The typed columns came after the first tables: `open_or_create` adds them (nullable; a metadata-only
commit) to a table that lacks them, so its older rows read them as null.

Table properties: `delta.appendOnly=true`. Exactly once: per group an app transaction
`exporter/<group>` whose version is the highest offset exported (every event of the group at or
below it is in the table, or was not an event: control batches, compacted ranges).

Time travel: `resolve(root, version=, as_of=)` opens the table as it was, and refuses what delta-rs
would answer silently or obscurely (a missing version, a time before the table existed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa

from spark.errors import AuditError, ExportError
from spark.pruning import FileStats, file_stats
from spark.storage import TableLocation

Root = str | Path | TableLocation

TABLE_NAME = "events"
PARTITION_COLUMN = "date"
APP_ID_PREFIX = "exporter/"
TABLE_CONFIGURATION = {"delta.appendOnly": "true"}

FILE_SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("group", pa.string(), nullable=False),
    pa.field("term", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("event_type", pa.string(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("actor", pa.string(), nullable=False),
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("schema_version", pa.int32(), nullable=False),
    pa.field("payload", pa.string(), nullable=False),
    pa.field("applied", pa.bool_(), nullable=True),
    pa.field("value", pa.binary(), nullable=True),
    pa.field("lease", pa.int64(), nullable=True),
    pa.field("expected_version", pa.int64(), nullable=True),
    pa.field("broker_name", pa.string(), nullable=True),
    pa.field("epoch", pa.int64(), nullable=True),
])
"""Columns stored in the Parquet files (the partition column lives in the directory names)."""

TYPED_COLUMNS = ("value", "lease", "expected_version", "broker_name", "epoch")
BASE_COLUMNS = tuple(n for n in FILE_SCHEMA.names if n not in TYPED_COLUMNS)

TABLE_SCHEMA = FILE_SCHEMA.append(pa.field(PARTITION_COLUMN, pa.string(), nullable=False))

ROW_SCHEMA = pa.schema([f.with_nullable(True) for f in TABLE_SCHEMA])
"""Rows as Spark exchanges them (its Python data sources declare every column nullable)."""

SPARK_DDL = ("`offset` BIGINT, `group` STRING, `term` BIGINT, `timestamp` TIMESTAMP, `event_type` STRING, "
             "`key` STRING, `actor` STRING, `request_id` STRING, `schema_version` INT, `payload` STRING, "
             "`applied` BOOLEAN, `value` BINARY, `lease` BIGINT, `expected_version` BIGINT, `broker_name` STRING, "
             "`epoch` BIGINT, `date` STRING")
"""The table's schema for Spark readers (spark.read.schema(SPARK_DDL))."""


def app_id(group: str) -> str:
    return APP_ID_PREFIX + group


def is_table(root: Root) -> bool:
    from deltalake import DeltaTable

    loc = TableLocation.of(root)
    return bool(DeltaTable.is_deltatable(loc.uri, storage_options=loc.delta_options()))


def delta_table(root: Root, version: int | None = None) -> object:
    """deltalake.DeltaTable at `root` (any table, unchecked), latest or as of `version`."""
    from deltalake import DeltaTable

    loc = TableLocation.of(root)
    return DeltaTable(loc.uri, version=version, storage_options=loc.delta_options())


def open_table(root: Root) -> object:
    """The table at `root` (a deltalake.DeltaTable), checked to be an events table."""
    if not is_table(root):
        raise ExportError(f"{root} is not a Delta table")
    dt = delta_table(root)
    _check_schema(dt, root)
    return dt


def open_or_create(root: Root) -> object:
    """The events table at `root`, created (version 0, empty) if there is none.

    Creation races with another exporter are harmless: mode "ignore" keeps whichever came first."""
    from deltalake import DeltaTable

    loc = TableLocation.of(root)
    if not is_table(loc):
        if loc.is_local:
            path = Path(loc.uri)
            if path.exists() and not path.is_dir():
                raise ExportError(f"{path} exists and is not a directory")
            path.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(loc.uri, TABLE_SCHEMA, mode="ignore", partition_by=[PARTITION_COLUMN],
                          name=TABLE_NAME, description="Epochlog committed events, one row per event",
                          configuration=TABLE_CONFIGURATION, storage_options=loc.delta_options())
    dt = open_table(loc)
    missing = [n for n in TYPED_COLUMNS if n not in {f.name for f in dt.schema().fields}]  # type: ignore[attr-defined]
    if missing:
        from deltalake import Field
        from deltalake.exceptions import CommitFailedError

        fields = [Field.from_arrow(FILE_SCHEMA.field(n)) for n in missing]
        try:
            dt.alter.add_columns(fields)  # type: ignore[attr-defined]
        except CommitFailedError:
            pass   # another exporter added them meanwhile: checked below
        dt = open_table(loc)
        assert all(n in {f.name for f in dt.schema().fields} for n in missing), "typed columns not added"  # type: ignore[attr-defined]
    return dt


def _check_schema(dt: object, root: Root) -> None:
    names = {f.name for f in dt.schema().fields}  # type: ignore[attr-defined]
    missing = [n for n in (*BASE_COLUMNS, PARTITION_COLUMN) if n not in names]
    if missing:
        raise ExportError(f"{root} is a Delta table but not an Epochlog events table (no column "
                          f"{', '.join(missing)})")


def exported_through(dt: object, groups: list[str]) -> dict[str, int]:
    """Per group, the highest offset exported so far (-1: nothing yet), from the app transactions."""
    out = {}
    for g in groups:
        version = dt.transaction_version(app_id(g))  # type: ignore[attr-defined]
        out[g] = -1 if version is None else int(version)
    return out


def referenced_paths(dt: object) -> set[str]:
    """Relative paths of every data file the table's current version references."""
    actions = dt.get_add_actions(flatten=True)  # type: ignore[attr-defined]
    table = pa.table(actions) if not isinstance(actions, pa.Table) else actions
    return set(table.column("path").to_pylist()) if table.num_rows else set()


# --- time travel ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Snapshot:
    """The table as of one version: its files (absolute URIs) and when that version was committed."""

    root: str
    version: int
    committed_ms: int
    files: list[str]
    location: TableLocation | None = None
    stats: tuple[FileStats, ...] = ()        # per file, in `files` order (spark.pruning)
    watermarks: dict[str, int] | None = None  # group -> exported through, at this version


def parse_time(text: str) -> datetime:
    """An ISO 8601 / RFC 3339 time (a trailing Z allowed; a time without an offset is UTC), or epoch
    milliseconds."""
    raw = text.strip()
    if re.fullmatch(r"-?\d{10,}", raw):
        return datetime.fromtimestamp(int(raw) / 1000, tz=UTC)
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise AuditError(f"{text!r} is not a time: use ISO 8601 (2026-11-03T12:00:00Z) or epoch "
                         f"milliseconds") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _history(dt: object) -> list[tuple[int, int]]:
    """(version, commit timestamp ms) of every version still in the log, oldest first."""
    rows = [(int(h["version"]), int(h["timestamp"])) for h in dt.history()  # type: ignore[attr-defined]
            if "version" in h and "timestamp" in h]
    return sorted(rows)


def resolve(root: Root, *, version: int | None = None, as_of: str | datetime | None = None) -> Snapshot:
    """The table at `root` as of `version`, or as of the time `as_of` (the last version committed at
    or before it), or its latest version. AuditError for a version that does not exist, a time
    before the table's first version, or a path that is no events table."""
    from deltalake.exceptions import DeltaError

    loc = TableLocation.of(root)
    if version is not None and as_of is not None:
        raise AuditError("give a table version or a time, not both")
    if not is_table(root):
        raise AuditError(f"{root} is not a Delta table (export to it first: epochlog export --to {root})")
    latest = delta_table(loc)
    try:
        _check_schema(latest, root)
    except ExportError as exc:
        raise AuditError(str(exc)) from None
    history = _history(latest)
    if version is not None:
        if version < 0 or version > latest.version():
            raise AuditError(f"table version {version} does not exist: {root} has versions "
                             f"{history[0][0] if history else 0}..{latest.version()}")
        try:
            dt = delta_table(loc, version)
        except DeltaError as exc:
            raise AuditError(f"table version {version} of {root} cannot be read (its log entry may have "
                             f"been cleaned up): {exc}") from None
    elif as_of is not None:
        when = parse_time(as_of) if isinstance(as_of, str) else as_of
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        when_ms = int(when.timestamp() * 1000)
        first = history[0] if history else (0, 0)
        if when_ms < first[1]:
            # delta-rs would silently answer version 0 here
            raise AuditError(f"{when.isoformat()} is before the table existed: its first version "
                             f"({first[0]}) was committed at {_iso(first[1])}")
        chosen = max(v for v, ts in history if ts <= when_ms)
        dt = delta_table(loc, chosen)
    else:
        dt = latest
    ts = dict(history).get(dt.version(), 0)
    actions = dt.get_add_actions(flatten=True)  # type: ignore[attr-defined]
    actions = actions if isinstance(actions, pa.Table) else pa.table(actions)
    stats = tuple(file_stats(actions, lambda path: loc.file_uri(unquote(path))))
    marks = {g: v for g in logged_groups(dt) if (v := dt.transaction_version(app_id(g))) is not None}  # type: ignore[attr-defined]
    return Snapshot(loc.uri, dt.version(), ts, [s.uri for s in stats], loc, stats, marks)


def logged_groups(dt: object, commits: int = 1000) -> list[str]:
    """The groups exported by the table's last `commits` commits (their custom metadata: delta-rs
    lists no app transactions)."""
    import json

    groups: set[str] = set()
    for entry in dt.history(limit=commits):  # type: ignore[attr-defined]
        spans = entry.get("epochlog.export")
        if spans:
            try:
                groups |= set(json.loads(spans))
            except ValueError:
                continue
    return sorted(groups)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
