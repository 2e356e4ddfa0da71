"""The Spark side: Python data sources (pyspark.sql.datasource, Spark 4).

- `epochlog` (reader): committed events of a planned export run. Options: `plan` (ExportPlan JSON)
  and `source` (where to read: a cluster's endpoints, or offline group directories; JSON). One
  input partition per planned range (`ExportPlan.ranges()`), read on the executors through
  `spark.sources`; rows are Arrow batches of the events table's schema.
- `epochlog_delta` (writer, Arrow): each task writes its rows as Parquet files under the table root
  (`spark.commit.DayFiles`) and returns their descriptions; `commit()` (once, on the driver side)
  adds them all in ONE Delta commit with the run's app transactions (`spark.commit.commit_run`);
  `abort()` deletes only the files the Delta log does not reference. Options: `path` (the table
  root) and `plan` (the same JSON as the reader's).

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
    InputPartition,
    WriterCommitMessage,
)

from spark.commit import DataFile, DayFiles, commit_run, delete_unreferenced
from spark.plan import ExportPlan
from spark.records import to_batch
from spark.sources import ClusterSource, OfflineGroup, OfflineSource
from spark.storage import TableLocation
from spark.table import FILE_SCHEMA, PARTITION_COLUMN, ROW_SCHEMA, SPARK_DDL

READER_NAME = "epochlog"
WRITER_NAME = "epochlog_delta"


def source_json(source: ClusterSource | OfflineSource) -> str:
    if isinstance(source, ClusterSource):
        return msgspec.json.encode({"kind": "cluster", "endpoints": list(source.endpoints),
                                    "timeout_s": source.timeout_s, "readers": list(source.readers)}).decode()
    return msgspec.json.encode({"kind": "offline",
                                "groups": [[g.group, g.directory] for g in source.groups]}).decode()


def source_from_json(text: str) -> ClusterSource | OfflineSource:
    raw = msgspec.json.decode(text)
    if raw["kind"] == "cluster":
        return ClusterSource(tuple(raw["endpoints"]), float(raw["timeout_s"]), readers=tuple(raw.get("readers", ())))
    return OfflineSource(tuple(OfflineGroup(name, directory) for name, directory in raw["groups"]))


class RangePartition(InputPartition):
    def __init__(self, group: str, lo: int, hi: int, slot: int) -> None:
        super().__init__((group, lo, hi))
        self.group = group
        self.lo = lo
        self.hi = hi
        self.slot = slot      # which member serves it (ClusterSource.readers)


class EventsReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.plan = ExportPlan.from_json(options["plan"])
        self.source_text = options["source"]

    def partitions(self) -> list[InputPartition]:
        return [RangePartition(r.group, r.lo, r.hi, i) for i, r in enumerate(self.plan.ranges())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        source = source_from_json(self.source_text)
        for chunk in source.read(partition.group, partition.lo, partition.hi, partition.slot):
            yield to_batch(partition.group, chunk)


class EventsSource(DataSource):
    """`spark.read.format("epochlog").option("plan", ...).option("source", ...).load()`"""

    @classmethod
    def name(cls) -> str:
        return READER_NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return EventsReader(dict(self.options))


@dataclass
class FilesWritten(WriterCommitMessage):
    files: list[DataFile]


class DeltaEventsWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.root = TableLocation.from_spark_options(options)
        self.plan_text = options["plan"]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        out = DayFiles(self.root)
        try:
            for batch in iterator:
                if batch.num_rows:
                    out.write(batch)
        except BaseException:
            out.discard()
            raise
        return FilesWritten(out.close())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [f for m in messages if isinstance(m, FilesWritten) for f in m.files]
        commit_run(self.root, files, ExportPlan.from_json(self.plan_text))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [f for m in messages if isinstance(m, FilesWritten) for f in m.files]
        delete_unreferenced(self.root, files)


class DeltaEventsSink(DataSource):
    """`df.write.format("epochlog_delta").mode("append").option("path", ...).option("plan", ...).save()`"""

    @classmethod
    def name(cls) -> str:
        return WRITER_NAME

    def schema(self) -> str:
        return SPARK_DDL

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise ValueError("the events table is append-only: use mode('append')")
        return DeltaEventsWriter(dict(self.options))


# --- the table's files, read where Spark's own Parquet reader cannot (object storage) ---------------

FILES_NAME = "epochlog_files"


class FilePartition(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class TableFilesReader(DataSourceReader):
    """Parquet files of an events table version read with pyarrow's filesystems (no Hadoop jars), the
    partition column taken from each file's directory name."""

    def __init__(self, options: dict[str, str]) -> None:
        self.loc = TableLocation.from_spark_options(options)
        self.files: list[str] = msgspec.json.decode(options["files"])

    def partitions(self) -> list[InputPartition]:
        return [FilePartition(f) for f in self.files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        assert isinstance(partition, FilePartition)
        day = next((part.split("=", 1)[1] for part in partition.path.split("/")
                    if part.startswith(PARTITION_COLUMN + "=")), None)
        fs, _ = self.loc.filesystem()
        with fs.open_input_file(self.loc.path(partition.path)) as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=64 * 1024, columns=FILE_SCHEMA.names):
                days = pa.array([day] * batch.num_rows, pa.string())
                yield pa.RecordBatch.from_arrays([*batch.columns, days], schema=ROW_SCHEMA)


class TableFilesSource(DataSource):
    """`spark.read.format("epochlog_files").options(**location.to_spark_options()).option("files", json)`"""

    @classmethod
    def name(cls) -> str:
        return FILES_NAME

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return TableFilesReader(dict(self.options))
