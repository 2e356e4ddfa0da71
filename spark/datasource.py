"""The Spark side: Python data sources (pyspark.sql.datasource, Spark 4.2+).

- `epochlog` (reader, batch and stream): committed events of a cluster (or of a stopped node's
  files) by offsets per group (options: see `EventsSource`). A batch read is planned on the driver
  when the DataFrame is created; a stream reads offsets [start, end) per group per micro-batch, with
  `maxOffsetsPerTrigger` as its read limit. One input partition per range of `rangeOffsets` offsets
  (`ExportPlan.ranges()`), read on the executors through `spark.sources` and spread over the members;
  rows are Arrow batches of the events table's schema.
- `epochlog_delta` (writer, Arrow, batch and stream): each task writes its rows as Parquet files below
  the table root (`spark.commit.DayFiles`) and returns their descriptions; the commit (once, on the
  driver side) adds them all in ONE Delta commit with the app transactions (`spark.commit`); abort
  deletes only the files the Delta log does not reference. Options: `path` (the table root),
  `storage.<KEY>` (object storage settings) and, for a batch export run, `plan`.
- `epochlog_files` (reader): a table version's Parquet files, read through pyarrow's filesystems
  (the audit of a table on object storage).

Python data sources cannot be used from SQL on a path or with `VERSION AS OF`; the audit reads the
table's Parquet files as of a Delta version instead (spark.audit).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)

from spark.commit import DataFile, DayFiles, commit_batch, commit_run, delete_unreferenced
from spark.plan import ExportPlan, cap, parse_offsets
from spark.records import to_batch
from spark.sources import ClusterSource, OfflineGroup, OfflineSource
from spark.storage import TableLocation
from spark.table import FILE_SCHEMA, PARTITION_COLUMN, ROW_SCHEMA, SPARK_DDL

READER_NAME = "epochlog"
WRITER_NAME = "epochlog_delta"
DEFAULT_RANGE_OFFSETS = 250_000


def source_json(source: ClusterSource | OfflineSource) -> str:
    if isinstance(source, ClusterSource):
        return msgspec.json.encode({"kind": "cluster", "endpoints": list(source.endpoints),
                                    "timeout_s": source.timeout_s, "only": list(source.only),
                                    "readers": list(source.readers)}).decode()
    return msgspec.json.encode({"kind": "offline",
                                "groups": [[g.group, g.directory] for g in source.groups]}).decode()


def source_from_json(text: str) -> ClusterSource | OfflineSource:
    raw = msgspec.json.decode(text)
    if raw["kind"] == "cluster":
        return ClusterSource(tuple(raw["endpoints"]), float(raw["timeout_s"]), tuple(raw.get("only", ())),
                             readers=tuple(raw.get("readers", ())))
    return OfflineSource(tuple(OfflineGroup(name, directory) for name, directory in raw["groups"]))


def source_of(options: Any) -> ClusterSource | OfflineSource:
    """The source the reader options name: `endpoints` (a cluster: HOST:PORT,...) or `offline` (a
    stopped node's data directory), `groups` (G1,G2: only these), `timeout` (seconds per call)."""
    from spark.errors import ExportError

    only = tuple(g.strip() for g in options.get("groups", "").split(",") if g.strip())
    endpoints = tuple(e.strip() for e in options.get("endpoints", "").split(",") if e.strip())
    offline = options.get("offline")
    if bool(endpoints) == bool(offline):
        raise ExportError("the epochlog source needs the option endpoints (HOST:PORT,...) or offline (a data "
                          "directory), one of them")
    if offline:
        return OfflineSource.discover(offline, only)
    return ClusterSource(endpoints, float(options.get("timeout", 10.0)), only)


class RangePartition(InputPartition):
    """Offsets [lo, hi) of one group, and where to read them (the source as JSON, with its readers)."""

    def __init__(self, group: str, lo: int, hi: int, slot: int, source: str) -> None:
        super().__init__((group, lo, hi))
        self.group = group
        self.lo = lo
        self.hi = hi
        self.slot = slot      # which member serves it (ClusterSource.readers)
        self.source = source


def partitions_of(plan: ExportPlan, source: ClusterSource | OfflineSource) -> list[InputPartition]:
    text = source_json(source)
    return [RangePartition(r.group, r.lo, r.hi, i, text) for i, r in enumerate(plan.ranges())]


def _read(partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition):
        return   # Spark reads once with no partition of ours when a plan has no ranges
    source = source_from_json(partition.source)
    for chunk in source.read(partition.group, partition.lo, partition.hi, partition.slot):
        yield to_batch(partition.group, chunk)


def _check_loss(options: Any, starts: dict[str, int], bounds: dict[str, tuple[int, int]]) -> None:
    """A start below a group's log start means events compacted before they were read: an error
    unless the option failOnDataLoss is false (then the read starts at the log start)."""
    from spark.errors import ExportError

    if str(options.get("failOnDataLoss", "true")).lower() == "false":
        return
    lost = {g: (o, bounds[g][0]) for g, o in starts.items() if o < bounds[g][0]}
    if lost:
        detail = ", ".join(f"{g} from {o} (log start {start})" for g, (o, start) in sorted(lost.items()))
        raise ExportError(f"offsets were compacted before they were read: {detail}; set failOnDataLoss=false "
                          f"to start at the log start")


class EventsReader(DataSourceReader):
    """A bounded read: planned here, on the driver, when the DataFrame is created."""

    def __init__(self, options: Any) -> None:
        source = source_of(options)
        bounds = source.bounds()
        try:
            starts = parse_offsets(options.get("startingOffsets"), bounds, default="earliest")
            ends = parse_offsets(options.get("endingOffsets"), bounds, default="latest")
        except ValueError as exc:
            from spark.errors import ExportError

            raise ExportError(str(exc)) from None
        readers = options.get("readers")
        if readers is not None and isinstance(source, ClusterSource):
            self.source: ClusterSource | OfflineSource = ClusterSource(
                source.endpoints, source.timeout_s, source.only, tuple(msgspec.json.decode(readers)))
        else:
            self.source = source.prepared()
        _check_loss(options, starts, bounds)
        self.plan = ExportPlan.make({g: o - 1 for g, o in starts.items()}, bounds, until=ends,
                                    range_offsets=int(options.get("rangeOffsets", DEFAULT_RANGE_OFFSETS)))

    def partitions(self) -> list[InputPartition]:
        return partitions_of(self.plan, self.source)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition)


class EventsStreamReader(DataSourceStreamReader):
    """An unbounded read: per micro-batch, offsets [start, end) of every group, `end` at most one past
    the commit offset the source reports then (and within `maxOffsetsPerTrigger` over all groups).
    The offset of a micro-batch is {group: next offset to read}; Spark checkpoints it."""

    def __init__(self, options: Any) -> None:
        self.options = options
        self.source = source_of(options)
        self.range_offsets = int(options.get("rangeOffsets", DEFAULT_RANGE_OFFSETS))
        raw = options.get("maxOffsetsPerTrigger")
        self.max_offsets = int(raw) if raw else None
        self.starting = options.get("startingOffsets")

    def initialOffset(self) -> dict:
        return parse_offsets(self.starting, self.source.bounds(), default="earliest")

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadAllAvailable() if self.max_offsets is None else ReadMaxRows(self.max_offsets)

    def latestOffset(self, start: dict, limit: Any) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        bounds = self.source.bounds()
        starts = {g: max(int(start.get(g, bounds[g][0])), bounds[g][0]) for g in bounds}
        ends = {g: max(starts[g], bounds[g][1] + 1) for g in bounds}
        if isinstance(limit, ReadMaxRows):
            ends = cap(starts, ends, limit.max_rows)
        return {g: ends[g] if ends[g] > starts[g] else int(start.get(g, starts[g])) for g in bounds}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        bounds = self.source.bounds()
        groups = sorted(set(end) & set(bounds))
        _check_loss(self.options, {g: int(start[g]) for g in groups if g in start and int(end[g]) > int(start[g])},
                    bounds)
        plan = ExportPlan.make({g: int(start.get(g, bounds[g][0])) - 1 for g in groups},
                               {g: bounds[g] for g in groups}, until={g: int(end[g]) for g in groups},
                               range_offsets=self.range_offsets)
        return partitions_of(plan, self.source.prepared() if plan.active() else self.source)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition)

    def commit(self, end: dict) -> None:
        return None


class EventsSource(DataSource):
    """The committed events of an Epochlog cluster (or of a stopped node's files), as rows of the events
    table's schema:

        spark.read.format("epochlog").option("endpoints", "127.0.0.1:7001,...")
             .option("groups", "kv").option("startingOffsets", '{"kv": 0}').option("endingOffsets", "latest").load()
        spark.readStream.format("epochlog").option("endpoints", ...).option("maxOffsetsPerTrigger", 100000).load()

    Options: `endpoints` or `offline`; `groups`; `startingOffsets` (earliest | latest | JSON {group:
    offset}, inclusive; default earliest); `endingOffsets` (batch: latest | JSON, exclusive; default
    latest: the commit offsets when the DataFrame is created); `maxOffsetsPerTrigger` (stream: offsets
    per micro-batch over all groups); `rangeOffsets` (offsets per Spark partition); `timeout`;
    `failOnDataLoss` (default true: a start below a group's log start, i.e. compacted events, is an
    error)."""

    @classmethod
    def name(cls) -> str:
        return READER_NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return EventsReader(self.options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EventsStreamReader(self.options)


@dataclass
class FilesWritten(WriterCommitMessage):
    files: list[DataFile]


def _write_files(root: TableLocation, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
    out = DayFiles(root)
    try:
        for batch in iterator:
            if batch.num_rows:
                out.write(batch)
    except BaseException:
        out.discard()
        raise
    return FilesWritten(out.close())


def _files_of(messages: list[WriterCommitMessage | None]) -> list[DataFile]:
    return [f for m in messages if isinstance(m, FilesWritten) for f in m.files]


class DeltaEventsWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.root = TableLocation.from_spark_options(options)
        self.plan_text = options["plan"]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write_files(self.root, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_run(self.root, _files_of(messages), ExportPlan.from_json(self.plan_text))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        delete_unreferenced(self.root, _files_of(messages))


class DeltaEventsStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch: Parquet files on the executors, then ONE Delta commit (spark.commit.commit_batch)
    that is skipped when a replayed batch finds its rows already committed."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = TableLocation.from_spark_options(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write_files(self.root, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.root, _files_of(messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        delete_unreferenced(self.root, _files_of(messages))


class DeltaEventsSink(DataSource):
    """`df.write.format("epochlog_delta").mode("append").option("path", ...).option("plan", ...).save()` (a
    planned export run), or `df.writeStream.format("epochlog_delta").option("path", ...)
    .option("checkpointLocation", ...).start()` (the rows of an `epochlog` stream). `storage.<KEY>`
    options: object storage settings (spark.storage)."""

    @classmethod
    def name(cls) -> str:
        return WRITER_NAME

    def schema(self) -> str:
        return SPARK_DDL

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise ValueError("the events table is append-only: use mode('append')")
        return DeltaEventsWriter(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise ValueError("the events table is append-only: use outputMode('append')")
        return DeltaEventsStreamWriter(dict(self.options))


# --- the table's files, read where Spark's own Parquet reader cannot (object storage) ---------------

FILES_NAME = "epochlog_files"


class FilePartition(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class TableFilesReader(DataSourceReader):
    """Parquet files of an events table version (or of its state checkpoints: option `schema` =
    `state`) read with pyarrow's filesystems (no Hadoop jars), the partition column taken from each
    file's directory name; a column a file lacks (written before it existed) reads as null."""

    def __init__(self, options: Any) -> None:
        self.loc = TableLocation.from_spark_options(options)
        self.files: list[str] = msgspec.json.decode(options["files"])
        self.state = options.get("schema", "events") == "state"

    def partitions(self) -> list[InputPartition]:
        return [FilePartition(f) for f in self.files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        from spark.checkpoints import STATE_SCHEMA

        assert isinstance(partition, FilePartition)
        stored, out = (STATE_SCHEMA, STATE_SCHEMA) if self.state else (FILE_SCHEMA, ROW_SCHEMA)
        day = next((part.split("=", 1)[1] for part in partition.path.split("/")
                    if part.startswith(PARTITION_COLUMN + "=")), None)
        fs, _ = self.loc.filesystem()
        with fs.open_input_file(self.loc.path(partition.path)) as f:
            parquet = pq.ParquetFile(f)
            present = [n for n in stored.names if n in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=64 * 1024, columns=present):
                n = batch.num_rows
                columns = [batch.column(name).cast(stored.field(name).type) if name in present
                           else pa.nulls(n, stored.field(name).type) for name in stored.names]
                if not self.state:
                    columns.append(pa.array([day] * n, pa.string()))
                yield pa.RecordBatch.from_arrays(columns, schema=out)


class TableFilesSource(DataSource):
    """`spark.read.format("epochlog_files").options(**location.to_spark_options()).option("files", json)`"""

    @classmethod
    def name(cls) -> str:
        return FILES_NAME

    def schema(self) -> str:
        from spark.checkpoints import STATE_DDL

        return STATE_DDL if self.options.get("schema", "events") == "state" else SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return TableFilesReader(self.options)
