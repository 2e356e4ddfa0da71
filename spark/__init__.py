"""The event history in Delta Lake: export committed events with Spark, audit and time travel.

- `plan`: which offset ranges of which groups a run exports, bounded runs (pure).
- `records`: committed records -> Arrow rows of the `events` table (pure).
- `sources`: reading records by offset range, from a running cluster (SDK) or offline segments.
- `storage`: where a table lives (a local directory or S3) and the settings each library takes.
- `table`: the Delta table (delta-rs): schema, creation, app transactions, versions, files.
- `commit`: Parquet files and the one Delta commit of a run or of a streaming micro-batch.
- `cleanup`: deleting the files of failed runs once no commit can use them.
- `datasource`: the Spark Python data sources (`epochlog` batch and stream reader, `epochlog_delta`
  batch and stream writer, `epochlog_files` reader of a table's files on object storage).
- `export`: the driver of a run, bounded runs and `--follow` (`epochlog export`).
- `audit`: the audit queries (`epochlog audit`); `pruning`: which files a question reads;
  `checkpoints`: state checkpoints in a side table.
- `maintenance`: optimize (compaction, clustering by key) and vacuum; `cli`: the click commands.

Only `datasource`, `session`, `export` and `audit` import pyspark, and only when called.
"""
