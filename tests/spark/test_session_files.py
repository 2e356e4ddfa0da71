"""What a process that starts Spark keeps in $TMPDIR (spark/session.py): the JVM's temporary files (Spark's
scratch directories) and its log, removed at exit; the next such process removes the logs of processes
that no longer run, and leaves a running process's and any other file."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spark.session import jvm_log_path, remove_stale_jvm_logs
from tests.support.nodes import ROOT


def test_the_logs_of_processes_that_no_longer_run_are_removed(tmp_path: Path, dead_pid: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"epochlog-spark-{dead_pid}.log"
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


SHOW_TEMP_DIRS = """
from spark.session import get_session
s = get_session("local[1]", "epochlog-tmpdir-test")
jvm = s._jvm
print(jvm.java.lang.System.getProperty("java.io.tmpdir"))
print(jvm.org.apache.spark.util.Utils.getLocalDir(s.sparkContext._jsc.sc().conf()))
s.stop()
"""


@pytest.mark.timeout(300)
def test_the_jvm_keeps_its_temporary_files_in_tmpdir_and_leaves_none(tmp_path: Path) -> None:
    tmp = tmp_path / 'a "quoted" dir'   # a blank and quotes: one word of Spark's extraJavaOptions
    tmp.mkdir()
    done = subprocess.run([sys.executable, "-c", SHOW_TEMP_DIRS], capture_output=True, text=True, cwd=ROOT,
                          timeout=240, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr[-3000:]
    java_tmp, local_dir = done.stdout.splitlines()[-2:]
    assert java_tmp == str(tmp), done.stdout
    assert Path(local_dir).parent == tmp, done.stdout   # Spark's scratch: <TMPDIR>/spark-<uuid>
    assert not list(tmp.iterdir()), sorted(p.name for p in tmp.iterdir())
