"""Parquet files and the one Delta commit of an export run (delta-rs), exactly once per offset.

`DayFiles` writes a task's rows as Parquet files below the table root (a local directory or an S3
prefix, through pyarrow's filesystems: spark.storage), one file per partition value and group
(`date=YYYY-MM-DD/part-<group>-<first offset>-<uuid>.zstd.parquet`), and describes them as
`DataFile`s (picklable: they travel from Spark executors to the driver in commit messages). Nothing is visible to readers
until `commit_run` adds them all in ONE Delta commit, with one app transaction per group
(`exporter/<group>`, version = the highest offset of the run: `end - 1` of the group's plan).

Exactly once:
- the plan starts each group after its app transaction version, so nothing exported is read again;
- `commit_run` reloads the table and checks the versions again right before committing (delta-rs
  does not enforce that app transaction versions only grow): if another run committed any offset of
  this run's ranges meanwhile, it raises ExportConflictError and commits nothing;
- a concurrent commit (CommitFailedError) reloads the table and re-checks before retrying;
- `delete_unreferenced` (the Spark writer's abort) deletes only files the Delta log does not
  reference: Spark calls abort even when something fails after a successful Delta commit, and a
  committed file must never disappear.

Files of a run killed before its commit stay unreferenced (invisible to Delta readers) until the
next run's commit makes them dead: spark.cleanup deletes them then.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark.errors import ExportConflictError, ExportError
from spark.plan import ExportPlan
from spark.records import split_by_day
from spark.storage import TableLocation
from spark.table import (
    FILE_SCHEMA,
    PARTITION_COLUMN,
    TABLE_SCHEMA,
    app_id,
    delta_table,
    exported_through,
    open_table,
    referenced_paths,
)

COMMIT_ATTEMPTS = 20
_STAT_COLUMNS = ("offset", "term", "timestamp", "group", "event_type", "key")


@dataclass(frozen=True, slots=True)
class DataFile:
    path: str              # relative to the table root
    day: str               # partition value
    size: int
    rows: int
    modification_ms: int
    stats: str             # Delta stats JSON (numRecords, minValues, maxValues, nullCount)


class _OpenFile:
    """One Parquet file being written to the table's store (local or object storage)."""

    def __init__(self, loc: TableLocation, day: str, group: str, first_offset: int) -> None:
        self.relative = f"{PARTITION_COLUMN}={day}/{data_file_name(group, first_offset)}"
        fs, _ = loc.filesystem()
        path = loc.path(self.relative)
        if loc.is_local:
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        self.loc = loc
        self.stream = fs.open_output_stream(path)
        self.writer = pq.ParquetWriter(self.stream, FILE_SCHEMA, compression="zstd")
        self.rows = 0
        self.mins: dict[str, object] = {}
        self.maxs: dict[str, object] = {}
        self.nulls = {name: 0 for name in FILE_SCHEMA.names}

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch, row_group_size=256 * 1024)
        self.rows += batch.num_rows
        for name in _STAT_COLUMNS:
            mm = pc.min_max(batch.column(name))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None:
                self.mins[name] = lo if name not in self.mins else min(self.mins[name], lo)  # type: ignore[type-var]
                self.maxs[name] = hi if name not in self.maxs else max(self.maxs[name], hi)  # type: ignore[type-var]
        for name in FILE_SCHEMA.names:
            self.nulls[name] += batch.column(name).null_count

    def close(self, day: str) -> DataFile:
        self.writer.close()
        self.stream.close()
        size = self.loc.size(self.relative)
        assert size is not None, f"{self.relative} vanished right after it was written"
        stats = {"numRecords": self.rows,
                 "minValues": {k: _stat(v) for k, v in self.mins.items()},
                 "maxValues": {k: _stat(v) for k, v in self.maxs.items()},
                 "nullCount": self.nulls}
        return DataFile(self.relative, day, size, self.rows, int(time.time() * 1000), json.dumps(stats))

    def discard(self) -> None:
        try:
            self.writer.close()
            self.stream.close()
        finally:
            self.loc.delete(self.relative)


def data_file_name(group: str, first_offset: int) -> str:
    """`part-<group>-<first offset, 20 digits>-<uuid>.zstd.parquet`: the group and an offset of the
    file's rows, so that a file no commit references can be recognised as dead once the table's
    watermark of its group reaches that offset (spark.cleanup)."""
    return f"part-{group}-{first_offset:020d}-{uuid.uuid4().hex}.zstd.parquet"


def parse_data_file_name(path: str) -> tuple[str, int] | None:
    """(group, first offset) of a file named by `data_file_name`, else None."""
    name = path.rsplit("/", 1)[-1]
    if not (name.startswith("part-") and name.endswith(".zstd.parquet")):
        return None
    parts = name[len("part-"):-len(".zstd.parquet")].rsplit("-", 2)
    if len(parts) != 3 or len(parts[1]) != 20 or not parts[1].isdigit() or len(parts[2]) != 32:
        return None
    return parts[0], int(parts[1])


def _stat(value: object) -> object:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return value


class DayFiles:
    """One task's output: Parquet files below the table root, one per partition value and group.
    Not thread-safe."""

    def __init__(self, root: str | Path | TableLocation) -> None:
        self.loc = TableLocation.of(root)
        self._open: dict[tuple[str, str], _OpenFile] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        """Rows of TABLE_SCHEMA (the day and group columns decide the file)."""
        if batch.schema.names != TABLE_SCHEMA.names:
            batch = batch.select(TABLE_SCHEMA.names)
        for day, part in split_by_day(batch).items():
            groups = pc.unique(part.column("group")).to_pylist()
            for group in groups:
                rows = part if len(groups) == 1 else part.filter(pc.equal(part.column("group"), group))
                f = self._open.get((day, group))
                if f is None:
                    first = pc.min(rows.column("offset")).as_py()
                    f = self._open[(day, group)] = _OpenFile(self.loc, day, group, first)
                f.write(_conform(rows))

    def close(self) -> list[DataFile]:
        files = [f.close(day) for (day, _), f in self._open.items()]
        self._open = {}
        return files

    def discard(self) -> None:
        for f in self._open.values():
            f.discard()
        self._open = {}


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with exactly FILE_SCHEMA's types (Spark hands timestamps over in its session zone and
    nullable fields; the files keep one schema)."""
    if batch.schema.equals(FILE_SCHEMA):
        return batch
    arrays = [batch.column(name).cast(FILE_SCHEMA.field(name).type) for name in FILE_SCHEMA.names]
    return pa.RecordBatch.from_arrays(arrays, schema=FILE_SCHEMA)


def commit_run(root: str | Path | TableLocation, files: list[DataFile], plan: ExportPlan, *,
               attempts: int = COMMIT_ATTEMPTS) -> int:
    """Add `files` to the table in one commit that moves each planned group's app transaction to the
    end of its range; the table version created. See the module docstring for the checks."""
    active = plan.active()
    if not active:
        raise ExportError("nothing planned: no commit")
    groups = [g.group for g in active]

    def check(dt: Any) -> bool:
        current = exported_through(dt, groups)
        for g in active:
            if current[g.group] >= g.start:
                raise ExportConflictError(
                    f"group {g.group}: offsets through {current[g.group]} were exported by another run while "
                    f"this one exported {g.start}..{g.end - 1}; nothing of this run was committed")
        return True

    version = _commit(TableLocation.of(root), files, {g.group: g.end - 1 for g in active},
                      {"epochlog.export": json.dumps({g.group: [g.start, g.end] for g in active})}, check, attempts)
    assert version is not None
    return version


def commit_batch(root: str | Path | TableLocation, files: list[DataFile], batch_id: int, *,
                 attempts: int = COMMIT_ATTEMPTS) -> int | None:
    """Commit one micro-batch of an `epochlog` stream: the table version created, or None when there
    was nothing to commit (no rows) or the batch was committed before (Spark replays the last batch
    after a restart, with the same offsets: its rows are then at or below the watermarks).

    A stream's offsets per group are contiguous from batch to batch and each batch is read
    completely, so each group's app transaction moves to the highest offset of the batch's rows:
    every event at or below it is in the table. Files carry the rows' offset span per group in their
    stats; a batch whose rows are partly at or below a watermark overlaps another writer's export and
    is refused (ExportConflictError), as `commit_run` refuses an overlapping run."""
    spans: dict[str, tuple[int, int]] = {}
    for f in files:
        stats = json.loads(f.stats)
        group = stats["minValues"]["group"]
        assert group == stats["maxValues"]["group"], f"{f.path} holds rows of several groups"
        lo, hi = stats["minValues"]["offset"], stats["maxValues"]["offset"]
        old = spans.get(group)
        spans[group] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    if not spans:
        return None
    loc = TableLocation.of(root)

    def check(dt: Any) -> bool:
        current = exported_through(dt, sorted(spans))
        if all(current[g] >= hi for g, (_, hi) in spans.items()):
            delete_unreferenced(loc, files)   # a replayed batch, committed before
            return False
        for g, (lo, hi) in spans.items():
            if current[g] >= lo:
                raise ExportConflictError(
                    f"group {g}: offsets through {current[g]} were exported by another writer while this stream "
                    f"read {lo}..{hi}; nothing of micro-batch {batch_id} was committed")
        return True

    return _commit(loc, files, {g: hi for g, (_, hi) in sorted(spans.items())},
                   {"epochlog.stream_batch": str(batch_id),
                    "epochlog.export": json.dumps({g: [lo, hi + 1] for g, (lo, hi) in sorted(spans.items())})},
                   check, attempts)


def _commit(loc: TableLocation, files: list[DataFile], versions: dict[str, int], metadata: dict[str, str],
            check: Callable[[Any], bool], attempts: int) -> int | None:
    """Add `files` in one Delta commit that sets each group's app transaction to `versions[group]`: the
    table version created, or None when `check` says there is nothing to commit. `check(table)` runs on
    the table as reloaded before each attempt (it raises ExportConflictError for an overlap); a
    concurrent commit (CommitFailedError) is retried with a backoff, checked again."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction

    actions = [AddAction(f.path, f.size, {PARTITION_COLUMN: f.day}, f.modification_ms, True, f.stats) for f in files]
    txns = [Transaction(app_id(g), v) for g, v in versions.items()]
    run = uuid.uuid4().hex
    metadata = {"epochlog.run": run, **metadata, "epochlog.rows": str(sum(f.rows for f in files))}
    delay = 0.05
    for attempt in range(attempts):
        dt = open_table(loc)
        if not check(dt):
            return None
        try:
            dt.create_write_transaction(  # type: ignore[attr-defined]
                actions, mode="append", schema=TABLE_SCHEMA, partition_by=[PARTITION_COLUMN],
                commit_properties=CommitProperties(app_transactions=txns, custom_metadata=metadata,
                                                   max_commit_retries=0))
            return _version_of(loc, run)
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _version_of(root: str | Path | TableLocation, run: str) -> int:
    """The table version our commit created (found by its run id among the latest commits)."""
    for entry in delta_table(root).history(limit=50):  # type: ignore[attr-defined]
        if entry.get("epochlog.run") == run:
            return int(entry["version"])
    return -1


def delete_unreferenced(root: str | Path | TableLocation, files: list[DataFile]) -> list[str]:
    """Delete those of `files` that the table does not reference; the paths deleted."""
    try:
        referenced = referenced_paths(open_table(root))
    except ExportError:
        referenced = set()
    deleted = []
    for f in files:
        if f.path in referenced:
            continue
        TableLocation.of(root).delete(f.path)
        deleted.append(f.path)
    return deleted
