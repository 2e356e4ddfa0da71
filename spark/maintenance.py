"""Maintenance of an exported events table (delta-rs): small-file compaction and vacuum.

Every export run commits its own Parquet files, one per day partition it touched, so a table fed by
`epochlog export --follow` (a run every few seconds) gathers thousands of small files a day, and
every reader pays per file. Two operations keep it lean:

- **Optimize** (`optimize_table`, delta-rs `DeltaTable.optimize.compact`): per date partition, the
  small files are rewritten into files of about `target_file_bytes` (rows keep their order within a
  partition), in ONE Delta commit (operation OPTIMIZE) whose add and remove actions all carry
  `dataChange=false`. The table's `delta.appendOnly=true` allows it: an append-only table refuses
  only removes that change data. The rows, and so every audit answer, are the same before and after;
  the app transactions (`exporter/<group>`, the export watermarks) are table state that the commit
  leaves alone, so the next export run continues exactly where the last one ended. Versions before
  the optimize still read their own files (time travel) until a vacuum deletes them. A run killed
  in the middle leaves its new files unreferenced (invisible) and the table at its previous version.
- **Clustering** (`optimize_table(cluster=True)`, delta-rs `DeltaTable.optimize.z_order(["key"])`;
  `epochlog table optimize` does it by default): every file of each date partition is rewritten with
  its rows ordered by key (a Z-order over one column is a sort), in files of about the target size,
  in one OPTIMIZE commit with `dataChange=false` like a compaction. Each file then holds a slice of the
  key space, so `audit history KEY` and `audit state --prefix P` read the few files whose key
  statistics may hold the key (spark.pruning) instead of every file. It rewrites every partition each
  time (delta-rs has no incremental Z-order), so run it after large exports rather than after each.
- **Vacuum** (`vacuum_table`, delta-rs `DeltaTable.vacuum(full=True)`): deletes the files no version
  within the retention needs: files removed (by an optimize) more than `retain_hours` ago, and files
  no commit ever referenced (left by a killed export or optimize run) older than `retain_hours`. A
  retention below the table's `delta.deletedFileRetentionDuration` (Delta's default: 7 days) is
  refused unless forced: it would delete the files of an export run still writing (they are in no
  commit yet) and break time travel to versions readers may still use.

Both are safe while exports run: an export's commit and an optimize's commit do not conflict (an
append adds files the optimize does not remove); a commit that loses a race is retried.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from spark.errors import MaintenanceError
from spark.storage import TableLocation
from spark.table import APP_ID_PREFIX, PARTITION_COLUMN, Root, is_table, logged_groups, open_table

MIB = 1 << 20
DEFAULT_TARGET_FILE_BYTES = 128 * MIB
DEFAULT_CLUSTER_FILE_BYTES = 16 * MIB   # delta-rs's target counts rows in memory: files of about 5-8 MiB on disk
CLUSTER_COLUMN = "key"
DEFAULT_RETAIN_HOURS = 168            # Delta's default delta.deletedFileRetentionDuration (1 week)
COMMIT_ATTEMPTS = 5
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1, "day": 24, "week": 168}


@dataclass(frozen=True, slots=True)
class TableFiles:
    """What the current version of a table holds, per partition, and what lies around it."""

    version: int
    files: int
    bytes: int
    rows: int
    partitions: dict[str, int]          # date -> files
    small_files: int                    # files below half the target size
    unreferenced_files: int             # Parquet files on disk the current version does not reference
    unreferenced_bytes: int
    watermarks: dict[str, int]          # group -> highest exported offset (the app transactions)


@dataclass(frozen=True, slots=True)
class OptimizeResult:
    table_version_before: int
    table_version: int                  # the OPTIMIZE commit (equal to before: nothing to compact)
    files_removed: int
    files_added: int
    partitions_optimized: int
    bytes_before: int
    bytes_after: int
    seconds: float
    watermarks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VacuumResult:
    table_version: int
    retain_hours: float
    dry_run: bool
    files: list[str]                    # deleted (or, with dry_run, that would be)
    bytes: int
    seconds: float


def _table(root: Root) -> Any:
    if not is_table(root):
        raise MaintenanceError(f"{root} is not a Delta table (export to it first: epochlog export --to {root})")
    try:
        return open_table(root)
    except Exception as exc:  # noqa: BLE001 - an ExportError (not an events table) or a delta-rs error
        raise MaintenanceError(str(exc)) from None


def watermarks(dt: Any) -> dict[str, int]:
    """group -> app transaction version (`exporter/<group>`), read from the table's transactions."""
    out: dict[str, int] = {}
    for group in logged_groups(dt):
        version = dt.transaction_version(APP_ID_PREFIX + group)
        if version is not None:
            out[group] = int(version)
    return out


def table_files(root: Root, target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES) -> TableFiles:
    """Files of the current version per partition, how many are small, and the unreferenced ones."""
    import pyarrow as pa

    dt = _table(root)
    actions = dt.get_add_actions(flatten=True)
    table = actions if isinstance(actions, pa.Table) else pa.table(actions)
    paths = table.column("path").to_pylist() if table.num_rows else []
    sizes = table.column("size_bytes").to_pylist() if table.num_rows else []
    rows = table.column("num_records").to_pylist() if table.num_rows and "num_records" in table.column_names else []
    days_col = f"partition.{PARTITION_COLUMN}"
    days = table.column(days_col).to_pylist() if table.num_rows and days_col in table.column_names else []
    partitions: dict[str, int] = {}
    for day in days:
        partitions[day] = partitions.get(day, 0) + 1
    referenced = set(paths)
    stray = [f for f in TableLocation.of(root).list_files() if f.path not in referenced]
    return TableFiles(dt.version(), len(paths), int(sum(sizes)), int(sum(r or 0 for r in rows)), partitions,
                      sum(1 for s in sizes if s < target_file_bytes // 2), len(stray),
                      sum(f.size for f in stray), watermarks(dt))


def optimize_table(root: Root, *, target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
                   max_concurrent_tasks: int | None = None, cluster: bool = False) -> OptimizeResult:
    """Compact each date partition's small files in one Delta commit, or with `cluster`, rewrite every
    partition's files ordered by key (see the module docstring)."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    if target_file_bytes < MIB:
        raise MaintenanceError(f"a target file size of {target_file_bytes} bytes is below 1 MiB")
    started = time.perf_counter()
    before = table_files(root, target_file_bytes)
    delay = 0.05
    for attempt in range(COMMIT_ATTEMPTS):
        dt = _table(root)
        try:
            if cluster:
                metrics = dt.optimize.z_order(
                    [CLUSTER_COLUMN], target_size=target_file_bytes, max_concurrent_tasks=max_concurrent_tasks,
                    commit_properties=CommitProperties(custom_metadata={"epochlog.maintenance": "cluster"}))
            else:
                metrics = dt.optimize.compact(
                    target_size=target_file_bytes, max_concurrent_tasks=max_concurrent_tasks,
                    commit_properties=CommitProperties(custom_metadata={"epochlog.maintenance": "optimize"}))
            break
        except CommitFailedError:
            # A concurrent commit that conflicts (an export appends without conflict): compact again.
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    after = table_files(root, target_file_bytes)
    if after.watermarks != before.watermarks and any(after.watermarks.get(g, -1) < v
                                                     for g, v in before.watermarks.items()):
        raise AssertionError(f"an optimize moved export watermarks back: {before.watermarks} -> {after.watermarks}")
    return OptimizeResult(before.version, after.version, int(metrics.get("numFilesRemoved", 0)),
                          int(metrics.get("numFilesAdded", 0)), int(metrics.get("partitionsOptimized", 0)),
                          before.bytes, after.bytes, time.perf_counter() - started, after.watermarks)


def retention_minimum_hours(dt: Any) -> float:
    """The table's `delta.deletedFileRetentionDuration` in hours (Delta's default: 168)."""
    raw = (dt.metadata().configuration or {}).get("delta.deletedFileRetentionDuration")
    if not raw:
        return float(DEFAULT_RETAIN_HOURS)
    match = _INTERVAL.match(raw)
    if match is None:
        raise MaintenanceError(f"delta.deletedFileRetentionDuration = {raw!r} is not an interval such as "
                               f"'interval 7 days'")
    return int(match.group(1)) * _UNIT_HOURS[match.group(2).lower()]


def vacuum_table(root: Root, *, retain_hours: float = DEFAULT_RETAIN_HOURS, force: bool = False,
                 dry_run: bool = False) -> VacuumResult:
    """Delete the files no version within `retain_hours` needs (see the module docstring)."""
    started = time.perf_counter()
    dt = _table(root)
    minimum = retention_minimum_hours(dt)
    if retain_hours < 0:
        raise MaintenanceError(f"retention of {retain_hours} hours: must be >= 0")
    if retain_hours < minimum and not force:
        raise MaintenanceError(
            f"a retention of {retain_hours:g} hours is below the table's minimum of {minimum:g} hours "
            f"(delta.deletedFileRetentionDuration): it could delete the files of an export run still writing "
            f"and break time travel to recent versions; pass --force to do it anyway")
    if retain_hours != int(retain_hours):
        raise MaintenanceError(f"retention of {retain_hours} hours: delta-rs takes whole hours")
    loc = TableLocation.of(root)
    listed = dt.vacuum(retention_hours=int(retain_hours), dry_run=True, enforce_retention_duration=False, full=True)
    size = sum(loc.size(loc.relative(p)) or 0 for p in listed)
    if not dry_run and listed:
        dt.vacuum(retention_hours=int(retain_hours), dry_run=False, enforce_retention_duration=False, full=True)
    return VacuumResult(_table(root).version(), retain_hours, dry_run, sorted(listed), size,
                        time.perf_counter() - started)

