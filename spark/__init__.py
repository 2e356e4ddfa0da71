"""The event history in Delta Lake: export committed events with Spark, audit and time travel.

- `plan`: which offset ranges of which groups a run exports (pure).
- `records`: committed records -> Arrow rows of the `events` table (pure).
- `sources`: reading records by offset range, from a running cluster (SDK) or offline segments.
- `table`: the Delta table (delta-rs): schema, creation, app transactions, versions, files.
- `commit`: Parquet files and the one Delta commit of a run (used by the Spark writer and the
  plain pyarrow writer of the benchmark alike).
- `datasource`: the Spark Python data sources (`epochlog` reader, `epochlog_delta` writer).
- `export`: the driver of a run (`epochlog export`); `audit`: the audit queries (`epochlog audit`).
- `cli`: the click commands.

Only `datasource`, `session`, `export` and `audit` import pyspark, and only when called.
"""
