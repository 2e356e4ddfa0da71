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

A bounded run (`max_offsets`) reads at most that many offsets over all groups (spark.plan.cap);
`export_backlog` repeats bounded runs up to the commit offsets seen at its start, one commit each, so
a large backlog is exported in steps that each survive a failure of a later one.

`--follow` is a Structured Streaming query (`follow`): `spark.readStream.format("epochlog")` (offsets
per group, `maxOffsetsPerTrigger`) into `writeStream.format("epochlog_delta")` (one Delta commit per
micro-batch, a replayed batch skipped), checkpointed, started from the table's watermarks; the
driver reports the watermark to the cluster after each micro-batch that committed.

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
                range_offsets: int = 250_000, max_offsets: int | None = None, until: dict[str, int] | None = None,
                progress: Progress | None = None, on_plan: Callable[[ExportPlan, list[str]], None] | None = None,
                bounds: dict[str, tuple[int, int]] | None = None) -> RunResult:
    """One run: everything committed now (or, bounded, `max_offsets` of it; or up to `until`, group ->
    end exclusive), in one commit. `on_plan(plan, members)`: the plan and which member serves each of
    its ranges (`plan.ranges()` order; "" for an offline source)."""
    from spark.datasource import READER_NAME, WRITER_NAME
    from spark.session import activate

    started = time.monotonic()
    root = TableLocation.of(table_root)
    dt = open_or_create(root)
    bounds = source.bounds() if bounds is None else bounds
    exported = exported_through(dt, sorted(bounds))
    plan = ExportPlan.make(exported, bounds, range_offsets=range_offsets, max_offsets=max_offsets, until=until)
    warnings = [f"group {g.group}: offsets {g.exported_through + 1}..{g.start - 1} were compacted before "
                f"they were exported (the table has a gap there)" for g in plan.groups if g.skipped]
    if plan.empty:
        if on_plan is not None:
            on_plan(plan, [])
        return RunResult(plan, None, 0, exported, time.monotonic() - started, warnings=warnings)
    source = source.prepared()   # a cluster's readers: every member serves some ranges
    if on_plan is not None:
        on_plan(plan, serving_members(source, plan))
    if callable(spark):
        spark = spark()   # a factory: the session starts only when there is something to export
    activate(spark)       # this thread may not be the one that made it
    df = spark.read.format(READER_NAME).options(**reader_options(source, plan)).load()
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


def reader_options(source: ClusterSource | OfflineSource, plan: ExportPlan) -> dict[str, str]:
    """The `epochlog` reader's options that read exactly `plan` from `source`."""
    active = plan.active()
    out = source_options(source)
    out.update({"groups": ",".join(g.group for g in active),
                "startingOffsets": json.dumps({g.group: g.start for g in active}),
                "endingOffsets": json.dumps({g.group: g.end for g in active}),
                "rangeOffsets": str(plan.range_offsets)})
    if isinstance(source, ClusterSource) and source.readers:
        out["readers"] = json.dumps(list(source.readers))
    return out


def source_options(source: ClusterSource | OfflineSource) -> dict[str, str]:
    """The `epochlog` reader's options naming `source` (endpoints or offline, groups, timeout)."""
    if isinstance(source, ClusterSource):
        out = {"endpoints": ",".join(source.endpoints), "timeout": str(source.timeout_s)}
        if source.only:
            out["groups"] = ",".join(source.only)
        return out
    directories = {str(Path(g.directory).parent.parent) if Path(g.directory).parent.name == "groups"
                   else g.directory for g in source.groups}
    if len(directories) != 1:
        raise ExportError("an offline export reads the groups of one data directory")
    return {"offline": directories.pop(), "groups": ",".join(g.group for g in source.groups)}


def serving_members(source: ClusterSource | OfflineSource, plan: ExportPlan) -> list[str]:
    """Which member each range of `plan` is read from (ranges spread over the members in turn; a
    member that fails or lags hands its range to the leader, see spark.sources)."""
    readers = source.readers if isinstance(source, ClusterSource) else ()
    return [readers[i % len(readers)] if readers else "" for i in range(len(plan.ranges()))]


def export_backlog(spark: Any | Callable[[], Any], table_root: str | Path | TableLocation,
                   source: ClusterSource | OfflineSource, *, max_offsets: int, range_offsets: int = 250_000,
                   progress: Progress | None = None,
                   on_plan: Callable[[ExportPlan, list[str]], None] | None = None,
                   on_run: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Bounded runs of at most `max_offsets` offsets each, one commit each, until the table holds
    everything committed when this started (what is committed later is the next call's). A failure
    stops it with the runs before committed: the next call resumes after them."""
    bounds = source.bounds()
    target = {g: commit + 1 for g, (_, commit) in bounds.items()}
    runs: list[RunResult] = []
    while True:
        run = export_once(spark, table_root, source, range_offsets=range_offsets, max_offsets=max_offsets,
                          until=target, progress=progress, on_plan=on_plan, bounds=bounds)
        if on_run is not None:
            on_run(run)
        runs.append(run)
        if run.table_version is None or all(run.exported_through.get(g, -1) >= t - 1 for g, t in target.items()):
            return runs
        bounds = source.bounds()


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One micro-batch of `follow` that read something."""

    batch_id: int
    rows: int
    seconds: float
    end_offsets: dict[str, int]          # per group, the next offset the stream reads
    exported_through: dict[str, int]     # the table's watermarks after the batch
    dead_files_removed: int = 0


def follow(spark: Any, table_root: str | Path | TableLocation, source: ClusterSource | OfflineSource, *,
           checkpoint: str, interval_s: float = 5.0, max_offsets: int | None = None,
           range_offsets: int = 250_000, on_batch: Callable[[BatchReport], None] | None = None,
           stop: threading.Event | None = None, cleanup_interval_s: float = 60.0) -> None:
    """Run the streaming export until `stop` is set or the query fails (ExportError). A new checkpoint
    starts after the table's watermarks; an existing one resumes from its own offsets (Spark replays a
    batch it had not finished: the sink skips it if its commit was made)."""
    from spark.datasource import READER_NAME, WRITER_NAME

    root = TableLocation.of(table_root)
    dt = open_or_create(root)
    bounds = source.bounds()
    plan = ExportPlan.make(exported_through(dt, sorted(bounds)), bounds)
    options = source_options(source)
    options.update({"startingOffsets": json.dumps({g.group: g.start for g in plan.groups}),
                    "rangeOffsets": str(range_offsets)})
    if max_offsets is not None:
        options["maxOffsetsPerTrigger"] = str(max_offsets)
    query = (spark.readStream.format(READER_NAME).options(**options).load()
             .writeStream.format(WRITER_NAME).options(**root.to_spark_options())
             .option("checkpointLocation", checkpoint).trigger(processingTime=f"{interval_s} seconds").start())
    seen = -1
    last_cleanup = 0.0
    try:
        while query.isActive and not (stop is not None and stop.is_set()):
            query.awaitTermination(min(interval_s, 1.0))
            for progress in query.recentProgress:
                if progress.batchId <= seen:
                    continue
                seen = progress.batchId
                rows = int(progress.numInputRows)
                if rows == 0:
                    continue
                marks = exported_through(open_table(root), sorted(bounds))
                removed = 0
                if time.monotonic() - last_cleanup >= cleanup_interval_s:
                    removed = len(remove_dead_files(root, open_table(root)))
                    last_cleanup = time.monotonic()
                end = json.loads(progress.sources[0].endOffset) if progress.sources else {}
                if on_batch is not None:
                    on_batch(BatchReport(progress.batchId, rows, progress.batchDuration / 1000, end, marks, removed))
        error = query.exception()
        if error is not None:
            raise _job_failure(error)
    finally:
        if query.isActive:
            query.stop()


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
