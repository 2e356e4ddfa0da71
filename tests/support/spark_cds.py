"""A class-data-sharing (CDS) archive of the classes a Spark driver JVM loads, for the suite's JVMs.

Starting a local SparkSession and running its first queries costs its JVM about 20 s of CPU on the
suite's 2-core machine, much of it loading and verifying the same classes from Spark's jars every
time. A dynamic CDS archive (JDK 13+: `-XX:ArchiveClassesAtExit` writes it when a JVM exits,
`-XX:SharedArchiveFile` maps it) holds them parsed and verified. Measured at load 5-10, runs interleaved: a session's start and
its first two queries took 21.4, 21.3 s of JVM CPU without it and 11.0, 11.3 s with it (wall 49, 41 s
-> 25, 28 s).

The archive is made once per machine and Spark/Java build (its name is a hash of them), by a JVM
that starts a session, runs a few queries and exits; that runs beside the first tests, and a JVM
started before it is ready simply runs without it. A JVM whose classpath does not match the archive
ignores it (`-Xshare:auto`, the default). Nothing a test asserts depends on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Unified logging writes its warnings to stdout by default: an `epochlog export --json`'s stdout
# must stay its own. Warnings go to stderr, which spark/session.py points at the JVM's log file.
QUIET = "-Xlog:disable -Xlog:all=warning:stderr"
MAKE_TIMEOUT_S = 600.0

_DUMP_SCRIPT = """
from spark.session import get_session
s = get_session("local[1]", "epochlog-cds", conf={"spark.sql.shuffle.partitions": "2"})
s.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
s.createDataFrame([(1, "a"), (2, "b")], ["n", "s"]).where("n > 1").collect()
print(s.sparkContext._gateway.proc.pid, flush=True)
s.stop()
"""


def archive_path(java_options: str) -> Path:
    """Where the archive for this machine's Java, Spark jars and `java_options` lives."""
    import pyspark

    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    java = Path(shutil.which("java") or "java").resolve()
    stat = java.stat() if java.exists() else None
    key = "\n".join([str(java), str(stat.st_mtime_ns if stat else 0), pyspark.__version__, java_options, *jars])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "epochlog-tests"
    return cache / f"spark-cds-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def java_options(base: str, archive: Path) -> str:
    """`base`, plus the archive once it exists."""
    return f"{base} -XX:SharedArchiveFile={archive} {QUIET}" if archive.exists() else base


class ArchiveMaker:
    """Makes the archive in the background (one maker per machine at a time: a lock file), renamed
    into place only when the dumping JVM has exited and written it whole."""

    def __init__(self, archive: Path, base_options: str) -> None:
        self.archive = archive
        self.base_options = base_options
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-cds", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End a dump still running (the suite is over); the archive is then made next time."""
        self._stopped.set()
        proc = self._proc
        if proc is not None and self._thread.is_alive():   # its JVM may outlive it: the process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)
        self._thread.join(10)

    def _run(self) -> None:
        self.archive.parent.mkdir(parents=True, exist_ok=True)
        with open(self.archive.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)      # another suite on this machine may be making it
            if self.archive.exists() or self._stopped.is_set():
                return
            partial = self.archive.with_suffix(f".{os.getpid()}.partial")
            log = self.archive.with_suffix(".log")
            try:
                self._dump(partial, log)
            finally:
                partial.unlink(missing_ok=True)    # a dump that did not finish

    def _dump(self, partial: Path, log: Path) -> None:
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{self.base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}"}
        with open(log, "wb") as out:
            self._proc = subprocess.Popen([sys.executable, "-c", _DUMP_SCRIPT], cwd=ROOT, env=env,
                                          stdout=subprocess.PIPE, stderr=out, start_new_session=True)
        try:
            stdout, _ = self._proc.communicate(timeout=MAKE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, 9)
            self._proc.wait(10)
            return
        words = stdout.split()
        if self._proc.returncode != 0 or not words:
            return
        jvm = Path(f"/proc/{int(words[-1])}")   # it outlives the Python process: it writes the archive as it exits
        deadline = time.monotonic() + 120
        while jvm.exists() and time.monotonic() < deadline:
            if self._stopped.wait(0.2):
                return
        if not jvm.exists() and partial.exists() and partial.stat().st_size > 0:
            os.replace(partial, self.archive)
