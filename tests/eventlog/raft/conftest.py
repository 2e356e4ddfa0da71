"""Options of the Raft core tests: `pytest tests/eventlog/raft --rewrite` regenerates the expected output of
the interaction scripts under testdata/ in place (review the diff before keeping it)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rewrite", action="store_true", default=False,
                     help="rewrite the expected output of tests/eventlog/raft/testdata/*.txt with the actual output")


@pytest.fixture
def rewrite(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--rewrite", default=False))
