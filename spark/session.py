"""The SparkSession of the export and audit commands (local mode by default, any master via `master`).

Spark's Python workers must run this interpreter (it has the epochlog packages), hence
PYSPARK_PYTHON; on a real cluster the epochlog package must be installed on every executor. The
session uses UTC (the table's partition days are UTC days), no UI, few shuffle partitions (the
audit queries are small aggregations), logs errors only (spark/log4j2.properties), and has both
data sources registered.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_MASTER = "local[*]"


def get_session(master: str = DEFAULT_MASTER, app_name: str = "epochlog", *,
                conf: dict[str, str] | None = None) -> Any:
    """A SparkSession (getOrCreate: a second call in the same process returns the first session)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # local mode: no network interface needed
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.sql import SparkSession

    log4j = "-Dlog4j2.configurationFile=" + (Path(__file__).with_name("log4j2.properties")).as_uri()

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.python.worker.reuse", "true")
               .config("spark.driver.extraJavaOptions", log4j)
               .config("spark.executor.extraJavaOptions", log4j))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def register(session: Any) -> None:
    from spark.datasource import DeltaEventsSink, EventsSource, TableFilesSource

    session.dataSource.register(EventsSource)
    session.dataSource.register(DeltaEventsSink)
    session.dataSource.register(TableFilesSource)
