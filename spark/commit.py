"""Parquet files and the one Delta commit of an export run (delta-rs), exactly once per offset.

`DayFiles` writes a task's rows as Parquet files under the table root, one file per partition
value (`date=YYYY-MM-DD/part-<uuid>.zstd.parquet`), and describes them as `DataFile`s (picklable:
they travel from Spark executors to the driver in commit messages). Nothing is visible to readers
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

Files of a run killed before its commit stay in the directory unreferenced (invisible to Delta
readers); `vacuum` removes them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark.errors import ExportConflictError, ExportError
from spark.plan import ExportPlan
from spark.records import split_by_day
from spark.table import FILE_SCHEMA, PARTITION_COLUMN, TABLE_SCHEMA, app_id, exported_through, open_table, referenced_paths

COMMIT_ATTEMPTS = 20
_STAT_COLUMNS = ("offset", "term", "timestamp", "group", "event_type")


@dataclass(frozen=True, slots=True)
class DataFile:
    path: str              # relative to the table root
    day: str               # partition value
    size: int
    rows: int
    modification_ms: int
    stats: str             # Delta stats JSON (numRecords, minValues, maxValues, nullCount)


class _OpenFile:
    def __init__(self, root: Path, day: str) -> None:
        self.relative = f"{PARTITION_COLUMN}={day}/part-{uuid.uuid4().hex}.zstd.parquet"
        self.path = root / self.relative
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = pq.ParquetWriter(str(self.path), FILE_SCHEMA, compression="zstd")
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
        st = os.stat(self.path)
        stats = {"numRecords": self.rows,
                 "minValues": {k: _stat(v) for k, v in self.mins.items()},
                 "maxValues": {k: _stat(v) for k, v in self.maxs.items()},
                 "nullCount": self.nulls}
        return DataFile(self.relative, day, st.st_size, self.rows, int(st.st_mtime * 1000), json.dumps(stats))


def _stat(value: object) -> object:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return value


class DayFiles:
    """One task's output: Parquet files under `root`, one per partition value. Not thread-safe."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._open: dict[str, _OpenFile] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        """Rows of TABLE_SCHEMA (the day column decides the file)."""
        if batch.schema.names != TABLE_SCHEMA.names:
            batch = batch.select(TABLE_SCHEMA.names)
        for day, part in split_by_day(batch).items():
            f = self._open.get(day)
            if f is None:
                f = self._open[day] = _OpenFile(self.root, day)
            f.write(_conform(part))

    def close(self) -> list[DataFile]:
        files = [f.close(day) for day, f in self._open.items()]
        self._open = {}
        return files

    def discard(self) -> None:
        for f in self._open.values():
            try:
                f.writer.close()
            finally:
                f.path.unlink(missing_ok=True)
        self._open = {}


def _conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with exactly FILE_SCHEMA's types (Spark hands timestamps over in its session zone and
    nullable fields; the files keep one schema)."""
    if batch.schema.equals(FILE_SCHEMA):
        return batch
    arrays = [batch.column(name).cast(FILE_SCHEMA.field(name).type) for name in FILE_SCHEMA.names]
    return pa.RecordBatch.from_arrays(arrays, schema=FILE_SCHEMA)


def commit_run(root: str | Path, files: list[DataFile], plan: ExportPlan, *,
               attempts: int = COMMIT_ATTEMPTS) -> int:
    """Add `files` to the table in one commit that moves each planned group's app transaction to the
    end of its range; the table version created. See the module docstring for the checks."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction

    active = plan.active()
    if not active:
        raise ExportError("nothing planned: no commit")
    groups = [g.group for g in active]
    actions = [AddAction(f.path, f.size, {PARTITION_COLUMN: f.day}, f.modification_ms, True, f.stats) for f in files]
    txns = [Transaction(app_id(g.group), g.end - 1) for g in active]
    run = uuid.uuid4().hex
    metadata = {"epochlog.run": run, "epochlog.export": json.dumps({g.group: [g.start, g.end] for g in active}),
                "epochlog.rows": str(sum(f.rows for f in files))}
    delay = 0.05
    for attempt in range(attempts):
        dt = open_table(root)
        current = exported_through(dt, groups)
        for g in active:
            if current[g.group] >= g.start:
                raise ExportConflictError(
                    f"group {g.group}: offsets through {current[g.group]} were exported by another run while "
                    f"this one exported {g.start}..{g.end - 1}; nothing of this run was committed")
        try:
            dt.create_write_transaction(  # type: ignore[attr-defined]
                actions, mode="append", schema=TABLE_SCHEMA, partition_by=[PARTITION_COLUMN],
                commit_properties=CommitProperties(app_transactions=txns, custom_metadata=metadata,
                                                   max_commit_retries=0))
            return _version_of(root, run)
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _version_of(root: str | Path, run: str) -> int:
    """The table version our commit created (found by its run id among the latest commits)."""
    from deltalake import DeltaTable

    for entry in DeltaTable(str(root)).history(limit=50):
        if entry.get("epochlog.run") == run:
            return int(entry["version"])
    return -1


def delete_unreferenced(root: str | Path, files: list[DataFile]) -> list[str]:
    """Delete those of `files` that the table does not reference; the paths deleted."""
    try:
        referenced = referenced_paths(open_table(root))
    except ExportError:
        referenced = set()
    deleted = []
    for f in files:
        if f.path in referenced:
            continue
        (Path(root) / f.path).unlink(missing_ok=True)
        deleted.append(f.path)
    return deleted
