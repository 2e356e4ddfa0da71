"""Fixtures of the controller's end-to-end tests: a node cluster with fast controller timing, and
`epochlog broker run` processes (each stopped by its pid in teardown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fixtures import seed_for
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until

HEARTBEAT_INTERVAL_MS = 250
HEARTBEAT_TIMEOUT_MS = 2500
CLUSTER = "e2e"


# Fast heartbeats for tests: the [controller] section of the cluster's config.
CONTROLLER = {"heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS, "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
              "check_interval_ms": 25}


@dataclass
class BrokerProcess:
    group: str
    name: str
    proc: subprocess.Popen[bytes]
    out: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> float:
        t = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return t


class Brokers:
    """Starts `epochlog broker run` processes against a cluster; kills them all (by pid) on close."""

    def __init__(self, cluster: NodeCluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.procs: list[BrokerProcess] = []

    def start(self, group: str, name: str, port: int, timeout: float = 30.0) -> BrokerProcess:
        out = self.root / f"broker-{group}-{name}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPOCHLOG_")}
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "epochlog", "broker", "run", "--endpoints", ",".join(self.cluster.endpoints),
                 "--cluster", CLUSTER, "--group", group, "--name", name, "--address", f"127.0.0.1:{port}",
                 "--offset-rate", "200"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        broker = BrokerProcess(group, name, proc, out)
        self.procs.append(broker)
        def registered() -> bool:
            assert broker.running, f"broker {name} exited with {proc.returncode}:\n{broker.stdout()[-3000:]}"
            return "REGISTERED" in broker.stdout()
        try:
            wait_until(registered, timeout, f"broker {name} to register")
        except AssertionError:
            print(broker.stdout()[-3000:])
            raise
        return broker

    def close(self) -> None:
        for b in self.procs:
            if b.running:
                b.proc.send_signal(signal.SIGKILL)
                try:
                    b.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass


@pytest.fixture(scope="module")
def controller_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """A started 3-node cluster with fast controller timing, shared by a module's tests."""
    cluster = NodeCluster(tmp_path_factory.mktemp("controller"), seed=seed_for("controller cluster"),
                          name="controller-test", controller=CONTROLLER)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        print(cluster.describe())


@pytest.fixture
def brokers(controller_cluster: NodeCluster, tmp_path: Path) -> Iterator[Brokers]:
    fleet = Brokers(controller_cluster, tmp_path)
    try:
        yield fleet
    finally:
        fleet.close()
        for b in fleet.procs:
            print(f"--- broker {b.group}/{b.name} (pid {b.proc.pid}) output tail:\n{b.stdout()[-1500:]}")
