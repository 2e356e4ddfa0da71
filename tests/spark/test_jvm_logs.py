"""The JVM logs in $TMPDIR (spark/session.py): the next process that starts Spark removes those of processes
that no longer run, and leaves a running process's and any other file."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spark.session import jvm_log_path, remove_stale_jvm_logs


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_logs_of_processes_that_no_longer_run_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"epochlog-spark-{_dead_pid()}.log"
    mine = jvm_log_path()
    init = tmp_path / "epochlog-spark-1.log"   # pid 1 always runs
    others = [tmp_path / "epochlog-spark-notapid.log", tmp_path / "epochlog-spark-12.log.old",
              tmp_path / "other-spark-99999999.log"]
    for path in (dead, mine, init, *others):
        path.write_text("WARNING: Using incubator modules: jdk.incubator.vector\n")
    assert mine.parent == tmp_path and mine.name == f"epochlog-spark-{os.getpid()}.log"

    assert remove_stale_jvm_logs() == [dead]
    assert sorted(tmp_path.iterdir()) == sorted([mine, init, *others])
    assert remove_stale_jvm_logs() == []
