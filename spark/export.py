"""The driver of `epochlog export`: plan a run, let Spark read and write it, report the watermark.

One run (`export_once`):

1. open (or create) the Delta table and read each group's app transaction version;
2. ask the source for each group's log start and commit offset, and plan the ranges in between
   (spark.plan): a committed prefix fixed now, whatever the cluster does meanwhile;
3. `spark.read.format("epochlog")` reads the ranges (one Spark partition each) and
   `.write.format("epochlog_delta")` writes Parquet on the executors and makes ONE Delta commit
   (spark.datasource, spark.commit); a run with nothing new makes no commit and starts no job;
4. on a cluster, report the table's watermark (the highest exported offset per group) in the
   metadata group as a config entry `config/export/<table id>` (value: JSON {group: offset}).
   Every node keeps the log above the lowest watermark recorded for a group when it compacts
   (compaction/policy.py, the retention horizon), so no event is compacted before it is in Delta. A
   table no longer exported pins the logs until `[compaction] export_max_pin_*` caps it (logged, and
   named by `epochlog compaction status`) or `epochlog export --to PATH --release` deletes its entry.

`--follow` is a loop of such batch runs (one commit each) every `interval_s`, not Structured
Streaming: each run is a plain, bounded Spark job with the same exactly-once commit, so a run that
dies is simply re-planned by the next one, and quiet periods cost no Spark job at all.

Killing the process at any moment is safe: before the Delta commit nothing is visible (the files
written so far are unreferenced), after it the app transactions say what is exported.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from spark.cleanup import remove_dead_files
from spark.errors import ExportError
from spark.plan import ExportPlan
from spark.sources import ClusterSource, OfflineSource
from spark.storage import TableLocation
from spark.table import exported_through, open_or_create, open_table

WATERMARK_SCOPE = "export"
_OWN_RECORD_SCAN_LIMIT = 64


@dataclass
class RunResult:
    plan: ExportPlan
    table_version: int | None            # the commit this run made (None: nothing to export)
    rows: int
    exported_through: dict[str, int]     # per group, after the run
    seconds: float
    watermark_reported: bool = False
    warnings: list[str] = field(default_factory=list)
    dead_files_removed: list[str] = field(default_factory=list)   # left by failed runs (spark.cleanup)


Progress = Callable[[int, int], None]    # (tasks done, tasks) while a run's Spark job runs


def export_once(spark: Any | Callable[[], Any], table_root: str | Path | TableLocation,
                source: ClusterSource | OfflineSource, *,
                range_offsets: int = 250_000, progress: Progress | None = None,
                on_plan: Callable[[ExportPlan], None] | None = None) -> RunResult:
    from spark.datasource import READER_NAME, WRITER_NAME, source_json

    started = time.monotonic()
    root = TableLocation.of(table_root)
    dt = open_or_create(root)
    bounds = source.bounds()
    exported = exported_through(dt, sorted(bounds))
    plan = ExportPlan.make(exported, bounds, range_offsets=range_offsets)
    if on_plan is not None:
        on_plan(plan)
    warnings = [f"group {g.group}: offsets {g.exported_through + 1}..{g.start - 1} were compacted before "
                f"they were exported (the table has a gap there)" for g in plan.groups if g.skipped]
    if plan.empty:
        return RunResult(plan, None, 0, exported, time.monotonic() - started, warnings=warnings)
    source = source.prepared()   # a cluster's readers: every member serves some ranges
    if callable(spark):
        spark = spark()   # a factory: the session starts only when there is something to export
    df = (spark.read.format(READER_NAME).option("plan", plan.to_json()).option("source", source_json(source))
          .load())
    writer = df.write.format(WRITER_NAME).mode("append").options(**root.to_spark_options()).option(
        "plan", plan.to_json())
    with _JobProgress(spark, progress, len(plan.ranges())):
        try:
            writer.save()
        except Exception as exc:
            after = exported_through(open_table(root), sorted(bounds))
            if any(after[g.group] < g.end - 1 for g in plan.active()):
                raise _job_failure(exc) from exc
            # The Delta commit was made, then something failed (abort kept the committed files).
            warnings.append(f"the Spark job reported a failure after the Delta commit: {_job_failure(exc)}")
    after_dt = open_table(root)
    after = exported_through(after_dt, sorted(bounds))
    for g in plan.active():
        if after[g.group] < g.end - 1:
            raise ExportError(f"group {g.group}: the run ended but the table says {after[g.group]}, "
                              f"not {g.end - 1} (was the commit lost?)")
    version, rows = _find_commit(after_dt, plan)
    removed = remove_dead_files(root, after_dt)   # now that this commit moved the watermarks
    return RunResult(plan, version, rows, after, time.monotonic() - started, warnings=warnings,
                     dead_files_removed=removed)


def _job_failure(exc: Exception) -> ExportError:
    """The error to report for a failed Spark job: ours when one of ours caused it (Spark wraps it
    in its own exception, with the Python traceback in the message)."""
    from spark.errors import ExportConflictError

    text = str(exc)
    for cls in (ExportConflictError, ExportError):
        marker = f"{cls.__module__}.{cls.__name__}: "
        marker_short = f"{cls.__name__}: "
        for m in (marker, marker_short):
            if m in text:
                message = text.split(m, 1)[1].splitlines()[0].strip()
                return cls(message)
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return ExportError(f"the Spark job failed: {first[:500]}")


def _find_commit(dt: Any, plan: ExportPlan) -> tuple[int, int]:
    """(version, rows) of the commit made for `plan` (matched by its ranges in the commit info)."""
    wanted = {g.group: [g.start, g.end] for g in plan.active()}
    for entry in dt.history(limit=50):
        raw = entry.get("epochlog.export")
        if raw and json.loads(raw) == wanted:
            return int(entry["version"]), int(entry.get("epochlog.rows", 0))
    return -1, 0


class _JobProgress:
    """Reports (tasks done, tasks) of the running Spark job from a polling thread."""

    def __init__(self, spark: Any, callback: Progress | None, tasks: int) -> None:
        self.spark = spark
        self.callback = callback
        self.tasks = tasks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        if self.callback is not None:
            self.callback(0, self.tasks)
            self._thread = threading.Thread(target=self._poll, name="export-progress", daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        shown = 0
        while not self._stop.wait(0.25):
            done = 0
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info is not None:
                    done += info.numCompletedTasks
            shown = max(shown, min(done, self.tasks))   # a finished stage leaves the active list
            assert self.callback is not None
            self.callback(shown, self.tasks)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if exc[0] is None and self.callback is not None:
                self.callback(self.tasks, self.tasks)


# --- the watermark in the cluster ----------------------------------------------------------------------

def table_id(table_root: str | Path | TableLocation) -> str:
    """The config name a table reports its watermark under: `table-<Delta table id>`."""
    dt = open_table(table_root)
    return "table-" + str(dt.metadata().id)  # type: ignore[attr-defined]


def report_watermark(endpoints: tuple[str, ...], table_root: str | Path | TableLocation, through: dict[str, int], *,
                     timeout_s: float = 10.0) -> bool:
    """Record the table's watermark in the cluster (compare-and-set: watermarks only go up; a record
    that would only cover the previous report itself is skipped, so a quiet `--follow` does not keep
    writing). True if a new record was written."""
    from epochlog.client import Client, RejectedError
    from statemachines import events as ev

    name = table_id(table_root)
    key = f"config/{WATERMARK_SCOPE}/{name}"
    with Client(list(endpoints), timeout=timeout_s, name="epochlog-export") as client:
        for _ in range(10):
            current = client.get_entity(key)
            old: dict[str, int] = {} if current is None else json.loads(current.state.value)  # type: ignore[attr-defined]
            new = {g: max(o, old.get(g, -1)) for g, o in through.items() if o >= 0}
            new.update({g: o for g, o in old.items() if g not in new})
            if new == old:
                return False
            if current is not None and _only_own_records(client, old, new, current.version, key):
                return False
            event = ev.ConfigChanged(scope=WATERMARK_SCOPE, name=name, value=json.dumps(new, sort_keys=True),
                                     actor="epochlog-export")
            try:
                client.txn([event], [(key, 0 if current is None else current.version)])
            except RejectedError:
                continue   # another exporter of this table reported meanwhile: read again
            return True
    return False


def _only_own_records(client: Any, old: dict[str, int], new: dict[str, int], own_offset: int, key: str) -> bool:
    """Whether the only change is the metadata group's watermark moving over our own record(s)."""
    changed = {g for g in new if new[g] != old.get(g)}
    if changed != {"metadata"} or new["metadata"] < own_offset:
        return False
    lo, hi = old.get("metadata", -1) + 1, new["metadata"] + 1
    if hi - lo > _OWN_RECORD_SCAN_LIMIT:
        return False
    got = client.read_events("metadata", lo, max_events=_OWN_RECORD_SCAN_LIMIT)
    return all(e.key in (key, "txn/" + key) for e in got.events if e.offset < hi)


def release_watermark(endpoints: tuple[str, ...], table_root: str | Path | TableLocation, *,
                      timeout_s: float = 10.0) -> bool:
    """Delete the table's watermark record: the logs no longer wait for this table. True if it existed."""
    from epochlog.client import Client
    from statemachines import events as ev

    name = table_id(table_root)
    with Client(list(endpoints), timeout=timeout_s, name="epochlog-export") as client:
        if client.get_entity(f"config/{WATERMARK_SCOPE}/{name}") is None:
            return False
        client.command(ev.ConfigChanged(scope=WATERMARK_SCOPE, name=name, value=None, actor="epochlog-export"))
        return True
