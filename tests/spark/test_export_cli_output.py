"""What `epochlog export` prints when piped: its own progress lines and result on stderr/stdout, none of
the JVM's start-up lines (they go to the Spark log file, spark/session.py); and what it leaves in $TMPDIR:
nothing (its JVM log removed at exit, a killed process's removed at the start)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from statemachines import events as ev
from tests.spark.synthetic import BASE_TIMESTAMP_MS, write_events
from tests.support.nodes import ROOT

JVM_NOISE = ("Using incubator modules", "Setting default log level", "setLogLevel(newLevel)")


@pytest.mark.timeout(600)
def test_a_piped_export_says_its_progress_and_no_jvm_noise(tmp_path: Path, dead_pid: int) -> None:
    data, table = tmp_path / "node", tmp_path / "events"
    offsets = write_events(data, "kv", [(BASE_TIMESTAMP_MS + i, ev.KvPut(name=f"k{i % 9}", value=b"%d" % i))
                                        for i in range(300)])
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    stale = tmp / f"epochlog-spark-{dead_pid}.log"   # a killed export's
    stale.write_text("WARNING: Using incubator modules: jdk.incubator.vector\n")
    done = subprocess.run([sys.executable, "-m", "epochlog", "export", "--to", str(table), "--offline", str(data),
                           "--range-offsets", "100", "--master", "local[1]"],
                          capture_output=True, text=True, cwd=ROOT, timeout=540, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"exported {len(offsets)} events" in done.stdout, done.stdout
    progress = [line for line in done.stderr.splitlines() if line.startswith("exporting up to")]
    assert progress and progress[0].endswith(" s)") and " of 3 ranges done" in progress[-1], done.stderr
    assert progress[-1].startswith(f"exporting up to {len(offsets)} offsets: 3 of 3"), progress
    assert not [n for n in JVM_NOISE if n in done.stderr + done.stdout], done.stderr
    assert not list(tmp.glob("epochlog-spark-*.log")), sorted(p.name for p in tmp.iterdir())
