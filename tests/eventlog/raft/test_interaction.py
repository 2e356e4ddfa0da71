"""Runs every interaction script under testdata/ (see interaction.py for the format)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eventlog.raft.interaction import Script, run_script

TESTDATA = Path(__file__).parent / "testdata"


def _params() -> list[object]:
    params: list[object] = []
    for path in sorted(TESTDATA.glob("*.txt")):
        reason = Script.parse(path).xfail
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(path, id=path.stem, marks=marks))
    return params


@pytest.mark.parametrize("path", _params())
def test_script(path: Path, rewrite: bool) -> None:
    if rewrite and Script.parse(path).xfail:
        # Its expected output is the correct behaviour, written by hand: never overwrite it with
        # what the buggy core does. The strict xfail still runs (and must still fail).
        rewrite = False
    run_script(path, rewrite)
