"""Fixtures of the views tests: real views (RocksDB) in the test's directory, closed in teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine


@pytest.fixture
def views_dir(tmp_path: Path) -> Iterator[Callable[..., ViewsStateMachine]]:
    """`open_(name, config=None)`: the views of a `kv` group under the test's directory (reopening the
    same name reopens the same database)."""
    opened: list[ViewsStateMachine] = []

    def open_(name: str, config: ViewsConfig | None = None) -> ViewsStateMachine:
        sm = ViewsStateMachine(tmp_path / name / "kv", config)
        opened.append(sm)
        return sm

    yield open_
    for sm in opened:
        try:
            sm.close()
        except Exception:  # noqa: BLE001 - closed already
            pass
