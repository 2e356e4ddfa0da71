"""`epochlog up` drives only the cluster it started: real processes on free ports.

- an address another process listens on is refused before any node starts (one line, exit 3);
- a node `up` started, killed and restarted by hand on its data directory is shown up (its new pid,
  "by hand") and left running at the end;
- another cluster's node answering on a member's client address (same cluster name, same node id,
  another data directory) is never shown or counted as that member, and fails the run.

Every process a test starts is ended by the pid it got from Popen, or from the up.json `up` wrote
(tests/epochlog/local_cluster.py checks /proc before signalling).
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.raft.runtime.config import parse_address
from tests.epochlog.local_cluster import (ROOT, cluster_document, epochlog_argv, kill_leftovers, live_node_pids,
                                          recorded_nodes, write_config)
from tests.support.tls import provision

START_S = 120.0   # a 3-node start on a loaded 2-core machine, and the waits below


@pytest.fixture
def rng() -> random.Random:
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    return random.Random(seed)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    left = kill_leftovers(path)
    assert not left, f"node processes outlived `epochlog up`: {left}"


class Up:
    """A running `epochlog up` (stdout+stderr in a file), and processes the test started beside it."""

    def __init__(self, tmp_path: Path, config: Path, data_dir: Path) -> None:
        self.out = tmp_path / "up.out"
        self.extra: list[subprocess.Popen[bytes]] = []
        with self.out.open("wb") as sink:
            self.proc = subprocess.Popen(epochlog_argv("up", "--config", str(config), "--data-dir", str(data_dir)),
                                         stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = START_S, after: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text()[after:], re.MULTILINE)
            if found:
                return found
            assert self.proc.poll() is None, f"up exited ({self.proc.returncode}) before {pattern!r}:\n{self.text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {pattern!r}:\n{self.text()}"
            time.sleep(0.1)

    def start(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as sink:
            proc = subprocess.Popen(epochlog_argv(*args), stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
        self.extra.append(proc)
        return proc

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(90)

    def close(self) -> None:
        for proc in [self.proc, *self.extra]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def _ready(path: Path, proc: subprocess.Popen[bytes], timeout: float = START_S) -> None:
    deadline = time.monotonic() + timeout
    while "READY" not in path.read_text(errors="replace"):
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{path.read_text(errors='replace')}"
        assert time.monotonic() < deadline, path.read_text(errors="replace")
        time.sleep(0.05)


def test_an_address_in_use_is_refused_in_one_line_before_any_node_starts(tmp_path, rng, data_dir):
    document = cluster_document(3, rng)
    config = write_config(tmp_path / "cluster.toml", document)
    taken = document["cluster"]["members"][1]["admin_address"]
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(parse_address(taken, "test"))
        listener.listen()
        result = subprocess.run(epochlog_argv("up", "--config", str(config), "--data-dir", str(data_dir), "--once"),
                                capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 3, result
    assert result.stdout == "", result.stdout
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {taken} (admin_address of node 2) is in use by another process"), result
    assert not recorded_nodes(data_dir), "no node may have been started"


def test_a_node_restarted_by_hand_is_shown_up_and_left_running(tmp_path, rng, data_dir):
    config = write_config(tmp_path / "cluster.toml", cluster_document(3, rng))
    up = Up(tmp_path, config, data_dir)
    try:
        up.wait_for(r"every group has a leader")
        started = recorded_nodes(data_dir)[2]["pid"]
        assert started in live_node_pids(data_dir)
        os.kill(started, signal.SIGKILL)
        seen = up.wait_for(rf"node 2 \(pid {started}\) is down").end()
        hand = up.start("serve", "--config", str(config), "--node-id", "2", "--data-dir", str(data_dir / "node-2"),
                        log=tmp_path / "hand.out")
        _ready(tmp_path / "hand.out", hand)
        up.wait_for(rf"nodes 3/3 up \| 2 up by hand \(pid {hand.pid}\)", after=seen)
        assert up.stop() == 1   # node 2 went down on its own: still a problem of the run
        assert hand.poll() is None, "up must leave a node it did not start running"
    finally:
        up.close()
    text = up.text()
    assert re.search(rf"^  node 2: up, pid {hand.pid} \(by hand\), instance [0-9a-f]{{8}}, ", text, re.MULTILINE), text
    assert f"node 2 runs as pid {hand.pid}, started by hand: left running" in text, text
    assert f"problem: node 2 (pid {started}) went down on its own (killed by SIGKILL)" in text, text
    assert text.count("stopped, exit code 0") == 2, text


def test_another_clusters_node_on_a_members_address_is_never_shown_as_that_member(tmp_path, rng, data_dir):
    document = cluster_document(3, rng)
    config = write_config(tmp_path / "cluster.toml", document)
    # The impostor: the same cluster name and node id on node 2's addresses, but its own data directory
    # (a single-member cluster of its own, without peer TLS to keep the test short).
    other = {**document, "cluster": {**document["cluster"], "members": [document["cluster"]["members"][1]],
                                     "tls": {"insecure": True}}}
    other_config = write_config(tmp_path / "other.toml", other)
    up = Up(tmp_path, config, data_dir)
    try:
        up.wait_for(r"every group has a leader")
        started = recorded_nodes(data_dir)[2]["pid"]
        os.kill(started, signal.SIGKILL)
        seen = up.wait_for(rf"node 2 \(pid {started}\) is down").end()
        # Its faces speak TLS with a member certificate of the same CA, so `up`'s client gets its answer.
        provision(data_dir / "ca", "test", {2: tmp_path / "other-node-2"})
        impostor = up.start("serve", "--config", str(other_config), "--node-id", "2",
                            "--data-dir", str(tmp_path / "other-node-2"), log=tmp_path / "other.out")
        _ready(tmp_path / "other.out", impostor)
        up.wait_for(rf"node 2: another cluster's node 2 of cluster 'test' \(pid {impostor.pid}, data directory id "
                    rf"[0-9a-f]{{8}}\) answers at 127\.0\.0\.1:\d+: ignored", after=seen)
        # Seconds of status lines with the impostor answering: node 2 is never counted up.
        shown = len(up.text())
        time.sleep(3)
        later = up.text()[shown:]
        lines = re.findall(r"^\[ *[\d.]+s\] nodes (\d)/3 up(.*)$", later, re.MULTILINE)
        assert lines and all(n == "2" and "2 down" in rest for n, rest in lines), later
        assert up.stop() == 1
        assert impostor.poll() is None
    finally:
        up.close()
    text = up.text()
    assert re.search(r"^  node 2: down \(killed by SIGKILL\), pid \d+, ", text, re.MULTILINE), text
    assert "problem: not this cluster's: node 2 of cluster 'test'" in text, text
    assert "by hand" not in text, text
