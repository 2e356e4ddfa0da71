"""The disk-fault spec of eventlog/fault_injection.py, in process and fast: what EPOCHLOG_FAULTS parses
to, a fault that lets N calls through and then fails for good, and a node process that refuses to
start with a malformed spec. (The faults themselves, on real nodes: tests/eventlog/raft/runtime/
test_disk_faults.py; the crash points: tests/compaction/test_crash_steps.py.)
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventlog import fault_injection as faults
from tests.support.nodes import ROOT

pytestmark = pytest.mark.timeout(60)


def test_fault_spec_parses_and_rejects() -> None:
    assert faults.parse("") == faults.FaultSpec()
    assert faults.parse("fdatasync-eio-after=3, disk-full-after-segments=0") == faults.FaultSpec(3, 0)
    assert faults.parse("disk-full-after-segments=2,disk-full-slow-ms=500") == faults.FaultSpec(
        disk_full_after_segments=2, disk_full_slow_ms=500)
    for bad in ("fdatasync-eio-after", "fdatasync-eio-after=-1", "disk-full=2", "fdatasync-eio-after=x",
                "disk-full-slow-ms=500"):
        with pytest.raises(ValueError, match="EPOCHLOG_FAULTS"):
            faults.parse(bad)


def test_fail_after_lets_n_calls_through_then_fails_for_good() -> None:
    calls: list[int] = []
    wrapped = faults._fail_after(calls.append, 2, errno.EIO, "append")
    wrapped(1)
    wrapped(2)
    for i in (3, 4):
        with pytest.raises(OSError) as info:
            wrapped(i)
        assert info.value.errno == errno.EIO
    assert calls == [1, 2], "a failed call must not reach the real function"


def test_a_slow_failure_fails_only_after_its_delay() -> None:
    wrapped = faults._fail_after(lambda: None, 0, errno.ENOSPC, "nothing", slow_s=0.2)
    started = time.monotonic()
    with pytest.raises(OSError):
        wrapped()
    assert time.monotonic() - started >= 0.2


def test_node_refuses_to_start_with_a_bad_fault_spec(tmp_path: Path) -> None:
    """`epochlog serve` installs the faults before anything else: a typo is an error, not a healthy node."""
    config = tmp_path / "node.toml"
    config.write_text('[cluster]\n[[cluster.members]]\nid = 1\npeer_address = "127.0.0.1:1"\n')
    env = {**os.environ, faults.ENV_VAR: "fdatasync-eio-afterr=3"}
    done = subprocess.run([sys.executable, "-m", "epochlog", "serve", "--config", str(config),
                           "--node-id", "1", "--data-dir", str(tmp_path / "data")], check=False, cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "EPOCHLOG_FAULTS: bad item 'fdatasync-eio-afterr=3'" in done.stderr
    assert "READY" not in done.stdout and not (tmp_path / "data").exists()
