"""Fixtures of the Spark tests: ONE SparkSession for the whole session (starting one costs 5-15 s).

local[2]: the machine has 2 cores; the session is stopped at the end of the test session.
"""

from __future__ import annotations

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
