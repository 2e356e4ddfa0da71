"""Fixtures of the Spark tests: ONE SparkSession for the whole session (starting one costs 5-15 s), and
the pid of a process that no longer runs.

local[2]: the machine has 2 cores; the session is stopped at the end of the test session.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    from spark.session import get_session

    session = get_session("local[2]", "epochlog-tests", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process this test started and reaped (a killed command's, as its files name it)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
