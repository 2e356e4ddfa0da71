"""What every test shares: Python's bytecode cache, and how the JVMs Spark starts compile (the suite's
SparkSession and every `epochlog export`, `audit` or `up --tour` process a test runs).

The suite starts well over a thousand Python processes (every `epochlog serve` node, CLI call, crash
child). With PYTHONDONTWRITEBYTECODE set (this machine's environment sets it; CI runs with that
environment) none of them wrote a .pyc, so each compiled every module it imports from source again: a
node's imports took 0.45 s of CPU instead of 0.28 s (the shared 2-core machine; test_poison.py and
eventlog/test_crash.py together 90, 94 s -> 70, 74 s at load 3-5). The suite writes the cache
(`__pycache__/`, git-ignored; Python checks each .pyc against its source) for its own process and the
processes it starts.

A test's JVM lives seconds to a few minutes on tables of thousands of rows; the server JIT's (C2)
compiler threads and G1's concurrent threads then cost the 2 cores more than they give back. The
suite's JVMs compile with C1 only and collect with the serial collector (SPARK_SUBMIT_OPTS, read by
spark-submit for the driver JVM; outside the suite the product's defaults stay). Measured on the shared
2-core machine, runs interleaved: the JVM's own CPU time (/proc) for a local session's start 14.2, 13.4 s
-> 8.6, 7.5 s and for its first two queries 7.1, 7.0 s -> 4.2, 3.7 s (load 21-23); wall time of
test_export_cli_output (one `epochlog export` process) 159, 196 s -> 151, 130 s (load 9-22). They also
map a class-data-sharing archive of Spark's classes once one is made (tests/support/spark_cds.py: the
suite makes it beside its first tests, once per machine). Nothing a test asserts depends on the JIT
or the archive; set SPARK_SUBMIT_OPTS yourself (even empty) to run the suite with your own JVM options.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import spark_cds

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CDS_ARCHIVE_ENV = "EPOCHLOG_TEST_SPARK_CDS"
"""The archive's path, when the suite sets the JVMs' options (xdist's workers inherit it)."""

if "SPARK_SUBMIT_OPTS" not in os.environ:
    os.environ[CDS_ARCHIVE_ENV] = str(spark_cds.archive_path(JVM_OPTIONS))
    os.environ["SPARK_SUBMIT_OPTS"] = JVM_OPTIONS

_MAKER = pytest.StashKey[spark_cds.ArchiveMaker]()


def _runs_spark_tests(config: pytest.Config) -> bool:
    """Whether the run covers tests/spark (the whole suite does): a run of a few other files does not
    start the archive's JVM for nothing."""
    spark_tests = Path(__file__).parent / "spark"
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == spark_tests or path in spark_tests.parents or spark_tests in path.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    archive = os.environ.get(CDS_ARCHIVE_ENV)
    if (archive and not hasattr(config, "workerinput") and not Path(archive).exists()
            and _runs_spark_tests(config)):
        maker = spark_cds.ArchiveMaker(Path(archive), JVM_OPTIONS)
        maker.start()
        config.stash[_MAKER] = maker


def pytest_unconfigure(config: pytest.Config) -> None:
    maker = config.stash.get(_MAKER, None)
    if maker is not None:
        maker.stop()


@pytest.hookimpl(tryfirst=True)   # before the test's fixtures start a SparkSession
def pytest_runtest_setup(item: pytest.Item) -> None:
    archive = os.environ.get(CDS_ARCHIVE_ENV)
    if archive:   # the archive may have been made since the last test
        os.environ["SPARK_SUBMIT_OPTS"] = spark_cds.java_options(JVM_OPTIONS, Path(archive))


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist (a dev dependency)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` (`make test`) that ends a run in which a worker died (tests/support/schedule.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.support.schedule import EndsAfterACrash

    return EndsAfterACrash(config, log)
