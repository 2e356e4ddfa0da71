"""The SparkSession of the export and audit commands (local mode by default, any master via `master`).

Spark's Python workers must run this interpreter (it has the epochlog packages), hence
PYSPARK_PYTHON; on a real cluster the epochlog package must be installed on every executor. The
session uses UTC (the table's partition days are UTC days), no UI, few shuffle partitions (the
audit queries are small aggregations), logs errors only (spark/log4j2.properties), starts its
Python workers through spark/worker_daemon.py (PySpark compiled from its installed package, not from
Spark's zip) and has both data sources registered. The JVM keeps its temporary files (Spark's scratch
directories) where Python keeps its own, in $TMPDIR (Java alone would use /tmp). The JVM's own start-up
lines (an incubator-module warning, "Setting default log level") would land on the user's terminal: the
JVM is started with its stderr in a file instead (`jvm_log_path()`; its tail is printed if the start
fails), so a command prints only its own output. The file is removed when the process exits; a process
that could not remove it (killed) leaves it to the next one that starts Spark, which removes the files of
processes no longer running: a scheduled `epochlog export` leaves nothing behind in $TMPDIR, and a
failed start's log stays until then.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
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

    java_options = " ".join((_java_option("log4j2.configurationFile",
                                          Path(__file__).with_name("log4j2.properties").as_uri()),
                             _java_option("java.io.tmpdir", tempfile.gettempdir())))

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.python.worker.reuse", "true")
               .config("spark.python.daemon.module", "spark.worker_daemon")
               .config("spark.driver.extraJavaOptions", java_options)
               .config("spark.executor.extraJavaOptions", java_options))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    remove_stale_jvm_logs()
    log = jvm_log_path()
    with _stderr_to(log):
        session = builder.getOrCreate()
    atexit.register(_remove, log)
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def _java_option(name: str, value: str) -> str:
    """`-Dname=value` as one word of Spark's extraJavaOptions (which it splits at blanks outside quotes)."""
    return '"-D' + name + "=" + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def register(session: Any) -> None:
    from spark.datasource import DeltaEventsSink, EventsSource, TableFilesSource

    session.dataSource.register(EventsSource)
    session.dataSource.register(DeltaEventsSink)
    session.dataSource.register(TableFilesSource)


def activate(session: Any) -> None:
    """Make `session` the active one of the calling thread. Spark looks a Python data source up in the
    thread's active session when it writes (DataFrameWriter.save), and a thread other than the one that
    made the session (asyncio.to_thread, a worker pool) has none: the writer would not be found."""
    session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)


JVM_LOG = re.compile(r"epochlog-spark-(\d+)\.log")
"""The name of a process's JVM log in $TMPDIR (its pid)."""


def jvm_log_path() -> Path:
    """Where the JVM of this process writes its stderr (Spark's start-up lines, a crash's last words)."""
    return Path(tempfile.gettempdir()) / f"epochlog-spark-{os.getpid()}.log"


def remove_stale_jvm_logs() -> list[Path]:
    """Remove the JVM logs of processes that no longer run (killed before they could remove their own);
    the paths removed. A log of a running process, or one this user may not remove, is left."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob("epochlog-spark-*.log"):
        named = JVM_LOG.fullmatch(path.name)
        if named is None or _running(int(named.group(1))):
            continue
        if _remove(path):
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at `path` while a child (the JVM) is started: it inherits that; this
    process gets its stderr back afterwards. On failure the file's tail is printed, then the error."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    except BaseException:
        os.dup2(saved, 2)
        with contextlib.suppress(OSError):
            tail = path.read_text(errors="replace")[-4000:]
            print(f"Spark did not start; its log ({path}) ends with:\n{tail}", file=sys.stderr)
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)
