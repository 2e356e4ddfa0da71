"""`epochlog export`, `epochlog audit ...` and `epochlog table ...`: the event history in a Delta table,
questions to it, and its maintenance (small-file compaction, vacuum).

pyspark is imported only when a command runs (the rest of the CLI starts fast). Spark runs in local
mode unless `--master` names another (its executors must have the epochlog package installed).

Output: a plain table for people, `--json` (one JSON document; `export --follow`: one per run) or
`--csv` (audit). Errors are EpochlogErrors (`error: <message>`, exit 3): an unknown table version,
a time before the table existed, a malformed key, an export that lost a race with another one.

These are commands of the `epochlog` CLI, which loads them lazily (epochlog/cli.py LAZY_COMMANDS) and
lends them what they share with its other commands through `CommandLine` (which cluster the options
name, how a table is printed): spark imports nothing of the CLI.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import click

from spark.errors import AuditError

DEFAULT_MASTER = "local[*]"
FOLLOW_INTERVAL_S = 5.0

_master_option = click.option("--master", default=DEFAULT_MASTER, show_default=True,
                              help="Spark master URL (local[N], spark://host:port, yarn...).")
_storage_option = click.option(
    "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="Object storage setting (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID...); repeatable; "
         "wins over the AWS_* environment variables.")


@dataclass(frozen=True, slots=True)
class CommandLine:
    """What the `epochlog` CLI lends its Spark commands: they share its cluster options and its output."""

    endpoints: Callable[[str | None, Path | None], tuple[str, ...]]
    """(--endpoints, --config) -> the client addresses they name (the CLI's defaults when neither is
    given); a click.UsageError when none can be found."""
    print_table: Callable[[Sequence[str], Sequence[Sequence[Any]]], None]
    """(headers, rows) -> printed as the other commands print theirs."""


COMMAND_LINE = "spark.cli.CommandLine"
"""The key of the `CommandLine` in click's context `meta` (shared by every nested context)."""


def _command_line() -> CommandLine:
    host = click.get_current_context().meta.get(COMMAND_LINE)
    assert isinstance(host, CommandLine), "the Spark commands run under the epochlog CLI (epochlog/cli.py)"
    return host


def _location(table: str, storage_options: tuple[str, ...]) -> Any:
    from spark.storage import TableLocation, parse_storage_options

    return TableLocation.parse(table, parse_storage_options(storage_options))


# --- export ----------------------------------------------------------------------------------------

def _spark_options(f: Callable[..., None]) -> Callable[..., None]:
    options = [
        click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
                     help="A Spark setting (spark.executor.cores=2, spark.sql.shuffle.partitions=16...); repeatable."),
        click.option("--driver-memory", default=None, metavar="SIZE", help="spark.driver.memory (512m, 4g...)."),
        click.option("--executor-memory", default=None, metavar="SIZE", help="spark.executor.memory (512m, 4g...)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command("export")
@click.option("--to", "table", required=True, metavar="PATH|s3://BUCKET/PREFIX",
              help="The Delta table: a directory or an S3 prefix (created on the first run).")
@_storage_option
@click.option("--endpoints", metavar="HOST:PORT,...", help="Client addresses of some nodes [env EPOCHLOG_ENDPOINTS].")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A cluster config: use every member's client_address.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds each call to the cluster may take.")
@click.option("--offline", "offline_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Read the segment files of a stopped node (its data directory) instead of a cluster.")
@click.option("--groups", default="", metavar="G1,G2", help="Export only these groups [default: all].")
@click.option("--follow", is_flag=True,
              help="Keep exporting as the logs grow: a Structured Streaming query, a micro-batch every --interval s.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=FOLLOW_INTERVAL_S, show_default=True,
              help="Seconds between micro-batches with --follow.")
@click.option("--checkpoint", default=None, metavar="DIR",
              help="The streaming query's checkpoint with --follow (a local or HDFS path) "
                   "[default: <table>/_epochlog/follow-checkpoint for a local table; required for S3].")
@click.option("--max-offsets-per-run", type=click.IntRange(min=1), default=None,
              help="Read at most this many offsets (all groups together) per commit: a larger backlog is "
                   "exported as several commits, each one kept if a later one fails; with --follow, "
                   "the micro-batch limit (maxOffsetsPerTrigger).")
@click.option("--range-offsets", type=click.IntRange(min=1), default=250_000, show_default=True,
              help="Offsets per Spark partition.")
@click.option("--release", is_flag=True,
              help="Delete this table's watermark from the cluster (its logs stop keeping events for it) and exit.")
@_master_option
@_spark_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document per run (or micro-batch).")
def export_command(table: str, storage_options: tuple[str, ...], endpoints: str | None, config_path: Path | None,
                   timeout: float, offline_dir: Path | None, groups: str, follow: bool, interval: float,
                   checkpoint: str | None, max_offsets_per_run: int | None, range_offsets: int, release: bool,
                   master: str, spark_conf: tuple[str, ...], driver_memory: str | None, executor_memory: str | None,
                   as_json: bool) -> None:
    """Export committed events into the Delta table at --to, exactly once (one Delta commit per run).

    On a cluster the table's watermark (the highest exported offset per group) is reported back, and
    the groups keep their logs above it when they compact."""
    from spark.sources import ClusterSource, OfflineSource

    only = tuple(g.strip() for g in groups.split(",") if g.strip())
    location = _location(table, storage_options)
    if offline_dir is not None:
        if endpoints or config_path or release:
            raise click.UsageError("--offline reads files: no --endpoints, --config or --release with it")
        source: Any = OfflineSource.discover(offline_dir, only)
        endpoints_used: tuple[str, ...] = ()
    else:
        endpoints_used = _command_line().endpoints(endpoints, config_path)
        source = ClusterSource(endpoints_used, timeout, only)
    if release:
        from spark.export import release_watermark

        released = release_watermark(endpoints_used, location, timeout_s=timeout)
        _emit(as_json, {"released": released, "table": str(location)},
              f"{'released' if released else 'no watermark recorded for'} {location}")
        return
    if follow and checkpoint is None:
        if not location.is_local:
            raise click.UsageError("--follow on object storage needs --checkpoint DIR (Spark keeps its checkpoint "
                                   "on a local or HDFS path)")
        checkpoint = location.uri + "/_epochlog/follow-checkpoint"
    conf = _spark_conf(spark_conf, driver_memory, executor_memory)
    session = _LazySession(master, conf)
    try:
        if follow:
            _follow(session(), location, source, endpoints_used, checkpoint or "", interval, max_offsets_per_run,
                    range_offsets, timeout, as_json)
        else:
            _runs(session, location, source, endpoints_used, range_offsets, max_offsets_per_run, timeout, as_json)
    except KeyboardInterrupt:
        if not follow:
            raise click.Abort() from None
    finally:
        session.stop()


def _spark_conf(pairs: tuple[str, ...], driver_memory: str | None, executor_memory: str | None) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--conf {pair!r}: give KEY=VALUE (e.g. spark.executor.cores=2)")
        conf[key.strip()] = value
    if driver_memory:
        conf["spark.driver.memory"] = driver_memory
    if executor_memory:
        conf["spark.executor.memory"] = executor_memory
    return conf


class _LazySession:
    """The SparkSession, started on first use (a run with nothing new starts no JVM)."""

    def __init__(self, master: str, conf: dict[str, str] | None = None) -> None:
        self.master = master
        self.conf = conf or {}
        self.session: Any = None

    def __call__(self) -> Any:
        if self.session is None:
            from spark.session import get_session

            self.session = get_session(self.master, "epochlog-export", conf=self.conf)
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()


def _runs(spark: Any, table: Any, source: Any, endpoints: tuple[str, ...], range_offsets: int,
          max_offsets: int | None, timeout: float, as_json: bool) -> None:
    """One run, or bounded runs until the backlog seen at the start is exported (one document each)."""
    from spark.export import export_backlog, export_once

    def report(result: Any, progress: _progress_bar) -> None:
        _report_run(spark, table, result, progress.members, endpoints, timeout, as_json)

    if max_offsets is None:
        with _progress_bar(as_json) as progress:
            result = export_once(spark, table, source, range_offsets=range_offsets, progress=progress.update,
                                 on_plan=progress.plan)
        report(result, progress)
        return
    progress = _progress_bar(as_json)

    def on_run(result: Any) -> None:
        progress.__exit__(None, None, None)
        report(result, progress)

    def on_plan(plan: Any, members: list[str]) -> None:
        progress.__enter__()
        progress.plan(plan, members)

    export_backlog(spark, table, source, max_offsets=max_offsets, range_offsets=range_offsets,
                   progress=progress.update, on_plan=on_plan, on_run=on_run)


def _report_run(spark: Any, table: Any, result: Any, members: list[str], endpoints: tuple[str, ...],
                timeout: float, as_json: bool) -> None:
    from spark.export import report_watermark

    if endpoints and result.table_version is not None:
        result.watermark_reported = report_watermark(endpoints, table, result.exported_through, timeout_s=timeout)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    ranges = [{"group": r.group, "from": r.lo, "to": r.hi - 1, "member": m or None}
              for r, m in zip(result.plan.ranges(), members, strict=False)]
    document = {
        "table": str(table), "table_version": result.table_version, "rows": result.rows,
        "seconds": round(result.seconds, 3),
        "events_per_second": round(result.rows / result.seconds) if result.seconds > 0 and result.rows else 0,
        "groups": [{"group": g.group, "from": g.start, "to": g.end - 1 if g.offsets else None,
                    "exported_through": result.exported_through.get(g.group, -1), "skipped": g.skipped}
                   for g in result.plan.groups],
        "ranges": ranges,
        "watermark_reported": result.watermark_reported,
        "dead_files_removed": len(result.dead_files_removed)}
    if spark.session is not None:
        document["spark"] = _session_facts(spark.session)
    if result.table_version is None:
        text = f"nothing new to export (table {table} has every committed event)"
    else:
        spans = ", ".join(f"{g.group} {g.start}..{g.end - 1}" for g in result.plan.active())
        text = (f"exported {result.rows} events ({spans}) in {result.seconds:.1f} s "
                f"({document['events_per_second']}/s): table version {result.table_version}"
                + ("; watermark reported to the cluster" if result.watermark_reported else ""))
    _emit(as_json, document, text)


def _session_facts(session: Any) -> dict[str, Any]:
    """What the Spark session runs with (the settings passed through, as the JVM took them)."""
    conf = session.sparkContext.getConf()
    runtime = session.sparkContext._jvm.java.lang.Runtime.getRuntime()
    return {"master": session.sparkContext.master, "driver_max_heap_bytes": int(runtime.maxMemory()),
            "conf": {k: v for k, v in conf.getAll() if k in _SHOWN_CONF}}


_SHOWN_CONF = ("spark.driver.memory", "spark.executor.memory", "spark.executor.cores", "spark.sql.shuffle.partitions",
               "spark.default.parallelism", "spark.task.cpus")


def _follow(spark: Any, table: Any, source: Any, endpoints: tuple[str, ...], checkpoint: str, interval: float,
            max_offsets: int | None, range_offsets: int, timeout: float, as_json: bool) -> None:
    from spark.export import follow, report_watermark

    def on_batch(batch: Any) -> None:
        reported = bool(endpoints) and report_watermark(endpoints, table, batch.exported_through, timeout_s=timeout)
        document = {"table": str(table), "batch": batch.batch_id, "rows": batch.rows,
                    "seconds": round(batch.seconds, 3), "end_offsets": batch.end_offsets,
                    "exported_through": batch.exported_through, "watermark_reported": reported,
                    "dead_files_removed": batch.dead_files_removed}
        _emit(as_json, document, f"micro-batch {batch.batch_id}: {batch.rows} events in {batch.seconds:.1f} s; "
                                 f"exported through {batch.exported_through}")

    if not as_json:
        click.echo(f"following into {table} (checkpoint {checkpoint}); Ctrl-C stops", err=True)
    follow(spark, table, source, checkpoint=checkpoint, interval_s=interval, max_offsets=max_offsets,
           range_offsets=range_offsets, on_batch=on_batch)


class _progress_bar:
    """The run's progress on stderr: a rich progress bar on a terminal; piped, a line every
    PIPED_PROGRESS_S and one when every range is done (nothing with --json)."""

    PIPED_PROGRESS_S = 5.0

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.members: list[str] = []
        self.enabled = not quiet and sys.stderr.isatty()
        self._progress: Any = None
        self._task: Any = None
        self._events = 0
        self._started = time.monotonic()
        self._said = 0.0

    def __enter__(self) -> Self:
        self._task = None
        self._started = time.monotonic()
        self._said = -1.0   # the first update is said at once
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("ranges"), TimeElapsedColumn(), console=Console(stderr=True),
                                      transient=True)
            self._progress.start()
        return self

    def plan(self, plan: Any, members: list[str]) -> None:
        """Say which member serves which range (on stderr, before the job starts)."""
        self._events = plan.offsets
        self.members = members
        if not self.quiet and members and any(members):
            by_member: dict[str, list[str]] = {}
            for r, m in zip(plan.ranges(), members, strict=False):
                by_member.setdefault(m, []).append(f"{r.group} {r.lo}..{r.hi - 1}")
            for m, spans in sorted(by_member.items()):
                click.echo(f"{m} serves {', '.join(spans)}", err=True)

    def update(self, done: int, total: int) -> None:
        if not self.quiet and not self.enabled:
            now = time.monotonic()
            if self._said < 0 or done >= total or now - self._said >= self.PIPED_PROGRESS_S:
                self._said = now
                click.echo(f"exporting up to {self._events} offsets: {done} of {total} ranges done "
                           f"({now - self._started:.0f} s)", err=True)
            return
        if self._progress is None:
            return
        if self._task is None:
            self._task = self._progress.add_task(f"exporting up to {self._events} offsets", total=total)
        self._progress.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _emit(as_json: bool, document: Any, text: str) -> None:
    click.echo(json.dumps(document) if as_json else text)


# --- audit -----------------------------------------------------------------------------------------

@click.group("audit")
def audit_group() -> None:
    """Questions to an exported events table (Spark SQL), at any table version (Delta time travel)."""


def _audit_options(f: Callable[..., None]) -> Callable[..., None]:
    options = [
        click.option("--table", required=True, metavar="PATH|s3://BUCKET/PREFIX",
                     help="The Delta table written by `epochlog export`."),
        _storage_option,
        click.option("--table-version", type=int, default=None,
                     help="Read the table as of this Delta version (time travel)."),
        click.option("--table-as-of", default=None, metavar="TIME",
                     help="Read the table as of this time (ISO 8601 or epoch ms): the last version committed then."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document."),
        click.option("--csv", "as_csv", is_flag=True, help="Print CSV (a header line, then one line per row)."),
        click.option("--engine", type=click.Choice(["auto", "local", "spark"]), default="auto", show_default=True,
                     help="local: answer in this process with pyarrow (seconds); spark: a Spark job (--master); "
                          "auto: local up to 2,000,000 rows, else Spark. The answers are the same."),
        _master_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


class _AuditRun:
    """The session and snapshot of one audit command."""

    def __init__(self, table: str, storage_options: tuple[str, ...], table_version: int | None,
                 table_as_of: str | None, master: str, engine: str = "auto") -> None:
        from spark.audit_local import LOCAL_MAX_ROWS, fits_local, table_rows
        from spark.table import resolve

        if table_version is not None and table_as_of is not None:
            raise click.UsageError("give --table-version or --table-as-of, not both")
        location = _location(table, storage_options)
        self.snapshot = resolve(location, version=table_version, as_of=table_as_of)   # errors before Spark starts
        self.master = master
        self.spark: Any = None
        self.engine = engine if engine != "auto" else "local" if fits_local(self.snapshot) else "spark"
        if engine == "auto" and self.engine == "spark":
            rows = table_rows(self.snapshot)
            click.echo(f"asking Spark: the table holds {'an unknown number of' if rows is None else f'{rows:,}'} "
                       f"rows (more than {LOCAL_MAX_ROWS:,} are not read in-process; --engine local forces it)",
                       err=True)

    def __enter__(self) -> Any:
        if self.engine == "local":
            from spark.audit_local import LocalAudit

            return LocalAudit(self.snapshot)
        from spark.audit import Audit
        from spark.session import get_session

        self.spark = get_session(self.master, "epochlog-audit")
        return Audit(self.spark, self.snapshot)

    def __exit__(self, *exc: object) -> None:
        if self.spark is not None:
            self.spark.stop()


def _point(at: str | None, offset: int | None, group: str | None, prefix: str, flag: str) -> Any:
    from spark.audit import Point
    from spark.table import parse_time

    if (at is None) == (offset is None):
        raise click.UsageError(f"give {flag}TIME or --offset N (one of them)")
    if at is not None:
        return Point(time=parse_time(at))
    if group is None:
        from epochlog.api.routing import group_of_key

        if not prefix:
            raise click.UsageError("an offset belongs to one group: name it with --group (or give a --prefix "
                                   "such as app/ or topic/)")
        group = group_of_key(prefix)
    return Point(group=group, offset=offset)


@audit_group.command("state")
@click.option("--at", default=None, metavar="TIME", help="The state at this time (ISO 8601 or epoch ms).")
@click.option("--offset", type=int, default=None, help="The state at this offset of --group.")
@click.option("--group", default=None, help="The group of --offset [default: the group of --prefix].")
@click.option("--prefix", default=None, help="Only keys starting with this: app/ (kv), topic/... [default: all].")
@_audit_options
def audit_state(at: str | None, offset: int | None, group: str | None, prefix: str, table: str,
                storage_options: tuple[str, ...], table_version: int | None, table_as_of: str | None, as_json: bool, as_csv: bool, engine: str, master: str) -> None:
    """The entities as they were at a time or an offset (the views replayed from the history)."""
    from spark.audit import check_prefix

    prefix = check_prefix(_stored_prefix(prefix))
    point = _point(at, offset, group, prefix, "--at ")
    with _AuditRun(table, storage_options, table_version, table_as_of, master, engine) as audit:
        rows = audit.state(point, prefix)
    _rows(rows, as_json, as_csv, ("key", "group", "offset", "event_type", "value", "timestamp", "actor"))


@audit_group.command("history")
@click.argument("key")
@_audit_options
def audit_history(key: str, table: str, storage_options: tuple[str, ...], table_version: int | None, table_as_of: str | None, as_json: bool,
                  as_csv: bool, engine: str, master: str) -> None:
    """Every event that touched KEY (app/x for a kv entry, topic/orders...), rejected ones included."""
    from epochlog.api.routing import entity_key
    from spark.audit import check_key

    key = check_key(entity_key(key))
    with _AuditRun(table, storage_options, table_version, table_as_of, master, engine) as audit:
        rows = audit.history(key)
    _rows(rows, as_json, as_csv, ("group", "offset", "timestamp", "event_type", "applied", "value", "actor",
                                  "request_id"))


@audit_group.command("diff")
@click.option("--from", "start", required=True, metavar="TIME", help="The earlier time.")
@click.option("--to", "end", required=True, metavar="TIME", help="The later time.")
@click.option("--prefix", default=None, help="Only keys starting with this: app/ (kv), topic/... [default: all].")
@_audit_options
def audit_diff(start: str, end: str, prefix: str, table: str, storage_options: tuple[str, ...],
               table_version: int | None, table_as_of: str | None,
               as_json: bool, as_csv: bool, engine: str, master: str) -> None:
    """What changed between two times: entities added, removed or changed."""
    from spark.audit import Point, check_prefix
    from spark.table import parse_time

    prefix = check_prefix(_stored_prefix(prefix))
    t1, t2 = parse_time(start), parse_time(end)
    if t2 < t1:
        raise AuditError(f"--to {end} is before --from {start}")
    with _AuditRun(table, storage_options, table_version, table_as_of, master, engine) as audit:
        rows = audit.diff(Point(time=t1), Point(time=t2), prefix)
    _rows(rows, as_json, as_csv, ("key", "change", "before_offset", "after_offset", "before", "after", "actor"))


@audit_group.command("actions")
@click.option("--actor", required=True, help="The principal whose actions to list.")
@click.option("--since", default=None, metavar="TIME", help="Only from this time on.")
@click.option("--until", default=None, metavar="TIME", help="Only up to this time.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@_audit_options
def audit_actions(actor: str, since: str | None, until: str | None, limit: int, table: str,
                  storage_options: tuple[str, ...], table_version: int | None, table_as_of: str | None, as_json: bool, as_csv: bool, engine: str, master: str) -> None:
    """Every event a principal wrote (accepted or rejected), oldest first."""
    from spark.table import parse_time

    s = None if since is None else parse_time(since)
    u = None if until is None else parse_time(until)
    with _AuditRun(table, storage_options, table_version, table_as_of, master, engine) as audit:
        rows = audit.actions(actor, since=s, until=u, limit=limit)
    _rows(rows, as_json, as_csv, ("timestamp", "group", "offset", "event_type", "key", "applied", "request_id"))


def _stored_prefix(prefix: str | None) -> str:
    """The table's key prefix (the storage form, kv/app/) of a --prefix as every command takes keys (app/)."""
    from epochlog.api.routing import entity_prefix

    return "" if prefix is None else entity_prefix(prefix)


def _rows(rows: list[dict[str, Any]], as_json: bool, as_csv: bool, columns: Sequence[str]) -> None:
    from epochlog.api.routing import user_key

    rows = [{**row, "key": user_key(row["key"])} if "key" in row else row for row in rows]
    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    if as_json:
        click.echo(json.dumps(rows))
        return
    if as_csv:
        fields = list(rows[0].keys()) if rows else list(columns)
        writer = csv.DictWriter(sys.stdout, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()})
        return
    _command_line().print_table(columns, [[_cell(row.get(c)) for c in columns] for row in rows])
    click.echo(f"({len(rows)} rows)")


def _cell(value: Any) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- table maintenance ----------------------------------------------------------------------------

@click.group("table")
def table_group() -> None:
    """Maintenance of an exported events table: files (info), small-file compaction (optimize) and
    deletion of files no version within a retention needs (vacuum). No Spark needed."""


def _table_option(f: Callable[..., None]) -> Callable[..., None]:
    f = _storage_option(f)
    return click.option("--table", required=True, metavar="PATH|s3://BUCKET/PREFIX",
                        help="The Delta table written by `epochlog export`.")(f)


@table_group.command("info")
@_table_option
@click.option("--target-file-mb", type=click.IntRange(min=1), default=128, show_default=True,
              help="Files below half of this count as small.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def table_info(table: str, storage_options: tuple[str, ...], target_file_mb: int, as_json: bool) -> None:
    """The current version's files per date partition, small files, unreferenced files on disk, watermarks."""
    from dataclasses import asdict

    from spark.maintenance import table_files

    info = table_files(_location(table, storage_options), target_file_mb << 20)
    text = (f"{table}: version {info.version}, {info.files} files ({info.small_files} small) in "
            f"{len(info.partitions)} partitions, {info.rows:,} rows, {info.bytes:,} bytes; "
            f"{info.unreferenced_files} unreferenced files ({info.unreferenced_bytes:,} bytes); "
            f"watermarks {info.watermarks}")
    _emit(as_json, asdict(info), text)


@table_group.command("optimize")
@_table_option
@click.option("--cluster/--no-cluster", default=True, show_default=True,
              help="Rewrite each partition's files ordered by key (Z-order), so audit questions about a key or a "
                   "prefix read a fraction of the files; --no-cluster only compacts small files.")
@click.option("--target-file-mb", type=click.IntRange(min=1), default=None,
              help="Approximate size of the written files (in memory; on disk they are about half) "
                   "[default: 16 with --cluster, 128 without].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def table_optimize(table: str, storage_options: tuple[str, ...], cluster: bool, target_file_mb: int | None,
                   as_json: bool) -> None:
    """Compact small files, or cluster them by key: ONE Delta commit, dataChange=false (rows, audit answers and
    export watermarks unchanged; older versions keep their files until vacuum)."""
    from dataclasses import asdict

    from spark.maintenance import (
        DEFAULT_CLUSTER_FILE_BYTES,
        DEFAULT_TARGET_FILE_BYTES,
        optimize_table,
        table_files,
    )

    target = (target_file_mb << 20) if target_file_mb else (DEFAULT_CLUSTER_FILE_BYTES if cluster
                                                           else DEFAULT_TARGET_FILE_BYTES)
    table = _location(table, storage_options)
    if not as_json:
        before = table_files(table, target)
        click.echo(f"{'clustering' if cluster else 'optimizing'} {table}: {before.files} files "
                   f"({before.small_files} small) in {len(before.partitions)} partitions...", err=True)
    result = optimize_table(table, target_file_bytes=target, cluster=cluster)
    if result.table_version == result.table_version_before:
        text = f"nothing to compact in {table} (version {result.table_version})"
    else:
        text = (f"{'clustered' if cluster else 'compacted'} {result.files_removed} files into {result.files_added} "
                f"in {result.partitions_optimized} partitions ({result.bytes_before:,} -> {result.bytes_after:,} "
                f"bytes) in {result.seconds:.1f} s: table version {result.table_version}")
    _emit(as_json, asdict(result), text)


@table_group.command("checkpoint")
@_table_option
@click.option("--every", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Make the state checkpoints at every multiple of this offset, per group, up to its watermark.")
@_master_option
@_spark_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def table_checkpoint(table: str, storage_options: tuple[str, ...], every: int, master: str,
                     spark_conf: tuple[str, ...], driver_memory: str | None, executor_memory: str | None,
                     as_json: bool) -> None:
    """State checkpoints (the state of every key of a group at an offset, in the side table
    <table>/_epochlog/state), so that `audit state --offset N` replays only from the nearest one."""
    from spark.checkpoints import make_checkpoints

    location = _location(table, storage_options)
    session = _LazySession(master, _spark_conf(spark_conf, driver_memory, executor_memory))
    try:
        made = make_checkpoints(session(), location, every)
    finally:
        session.stop()
    _emit(as_json, {"table": str(location), "checkpoints": [{"group": g, "offset": o, "keys": n} for g, o, n in made]},
          f"{len(made)} state checkpoints made in {location}" + "".join(f"\n  {g} at {o}: {n} keys" for g, o, n in made))


@table_group.command("vacuum")
@_table_option
@click.option("--retain-hours", type=click.IntRange(min=0), default=168, show_default=True,
              help="Keep every file a version committed within this many hours needs (time travel window).")
@click.option("--force", is_flag=True, help="Allow a retention below the table's minimum "
              "(delta.deletedFileRetentionDuration, 168 h by default): it can delete the files of an export "
              "still writing and break time travel.")
@click.option("--dry-run", is_flag=True, help="List the files that would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def table_vacuum(table: str, storage_options: tuple[str, ...], retain_hours: int, force: bool, dry_run: bool,
                 as_json: bool) -> None:
    """Delete files no version within the retention references: files an optimize removed, and files of
    killed export or optimize runs (never committed), older than --retain-hours."""
    from dataclasses import asdict

    from spark.maintenance import vacuum_table

    table = _location(table, storage_options)
    result = vacuum_table(table, retain_hours=retain_hours, force=force, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    _emit(as_json, asdict(result), f"{verb} {len(result.files)} files ({result.bytes:,} bytes) older than "
                                   f"{retain_hours} h from {table}: table version {result.table_version}")


def register(cli: click.Group) -> None:
    """Add export, audit and table to the `epochlog` group (epochlog/cli.py, when one of them is first used)."""
    cli.add_command(export_command, "export")
    cli.add_command(audit_group, "audit")
    cli.add_command(table_group, "table")
