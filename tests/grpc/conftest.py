"""Real `epochlog serve` processes with a gRPC address each, for the tests of the gRPC face.

`GrpcCluster` writes one TOML config (peer, client and gRPC addresses on free 127.0.0.1 ports) and
runs each member as `python -m epochlog serve` (so uvloop and RunningNode are the production ones),
with stdout and stderr in files under the test directory. A node counts as started once it printed
`READY <id>`. Processes are only signalled through the Popen objects that started them; `close()`
(SIGTERM, then SIGKILL past a deadline) runs in the fixture's teardown. Every wait is bounded.

The `cluster3` fixture is shared by the tests of a module (starting processes costs seconds); tests
use their own keys, so they do not see each other's data.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from tests.support.ports import free_ports
from tests.support.tls import provision

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class GrpcCluster:
    def __init__(self, root: Path, size: int, seed: int) -> None:
        self.root = root
        self.size = size
        self.seed = seed
        ports = free_ports(3 * size, random.Random(seed))
        self.peer = {i: f"127.0.0.1:{ports[3 * i - 3]}" for i in range(1, size + 1)}
        self.client = {i: f"127.0.0.1:{ports[3 * i - 2]}" for i in range(1, size + 1)}
        self.grpc = {i: f"127.0.0.1:{ports[3 * i - 1]}" for i in range(1, size + 1)}
        lines = ["[cluster]", 'name = "grpc-test"', 'groups = ["metadata", "offsets", "kv"]',
                 "tick_interval_ms = 50", ""]
        for i in range(1, size + 1):
            lines += ["[[cluster.members]]", f"id = {i}", f'peer_address = "{self.peer[i]}"',
                      f'client_address = "{self.client[i]}"', f'grpc_address = "{self.grpc[i]}"', ""]
        # Elections only when a leader is silent for 1-2 s: the tests assume stable leaders on a busy machine.
        lines += ["[raft]", "election_timeout_ticks = 20", ""]
        lines += ["[log]", "segment_bytes = 262144", "", "[views]", "block_cache_bytes = 8388608",
                  "write_buffer_bytes = 4194304", ""]
        # No retention policy: a snapshot cuts the log as far as it covers (test_read_events_and_compaction).
        lines += ["[compaction]", "retain_offsets = 0", ""]
        self.config = root / "cluster.toml"
        self.config.write_text("\n".join(lines))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.channels: dict[int, grpc.Channel] = {}

    def start(self) -> None:
        provision(self.root / "ca", "grpc-test", {i: self.root / f"node-{i}" for i in range(1, self.size + 1)})
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPOCHLOG_")}
        for i in range(1, self.size + 1):
            out_path, err_path = self.root / f"node-{i}.out", self.root / f"node-{i}.err"
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                self.procs[i] = subprocess.Popen(
                    [sys.executable, "-m", "epochlog", "serve", "--config", str(self.config),
                     "--node-id", str(i), "--data-dir", str(self.root / f"node-{i}"),
                     "--seed", str(self.seed + i)],
                    cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        deadline = time.monotonic() + START_TIMEOUT_S
        for i, proc in self.procs.items():
            while f"READY {i} " not in (self.root / f"node-{i}.out").read_text():
                assert proc.poll() is None, f"node {i} exited with {proc.returncode}:\n{self.stderr(i)}"
                assert time.monotonic() < deadline, f"node {i} not READY:\n{self.stderr(i)}"
                time.sleep(0.05)

    def stderr(self, i: int) -> str:
        return (self.root / f"node-{i}.err").read_text(errors="replace")[-3000:]

    def stub(self, node: int) -> pb_grpc.EpochlogStub:
        if node not in self.channels:
            self.channels[node] = grpc.insecure_channel(self.grpc[node])
        return pb_grpc.EpochlogStub(self.channels[node])

    def leader(self, group: str, timeout: float = 15.0) -> int:
        """The node every running member agrees leads `group` (asked over gRPC)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = set()
            for i in self.procs:
                try:
                    status = self.stub(i).Status(pb.StatusRequest(), timeout=2)
                except grpc.RpcError:
                    seen.add(0)
                    continue
                seen |= {g.leader for g in status.groups if g.group == group}
            if len(seen) == 1 and 0 not in seen:
                return seen.pop()
            assert time.monotonic() < deadline, f"no agreed leader of {group}: {seen}"
            time.sleep(0.05)

    def follower(self, group: str) -> int:
        leader = self.leader(group)
        return next(i for i in self.procs if i != leader)

    def close(self) -> dict[int, int | None]:
        """Stop every node (SIGTERM, SIGKILL past a deadline); their exit codes."""
        for channel in self.channels.values():
            channel.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        return {i: proc.returncode for i, proc in self.procs.items()}


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcCluster]:
    seed = random.SystemRandom().randrange(1 << 30)
    print(f"grpc cluster seed {seed}")
    cluster = GrpcCluster(tmp_path_factory.mktemp("grpc-cluster"), 3, seed)
    try:
        cluster.start()
        for group in ("metadata", "offsets", "kv"):
            cluster.leader(group)
        yield cluster
    finally:
        codes = cluster.close()
    # Open streams must not keep a node from stopping cleanly on SIGTERM.
    assert all(code == 0 for code in codes.values()), (codes, {i: cluster.stderr(i) for i in codes})
