"""The tests of the gRPC face: real `epochlog serve` processes with a gRPC address each (a NodeCluster), and
gRPC stubs to them.

The `cluster3` fixture is shared by the tests of a module (starting processes costs seconds); tests
use their own keys, so they do not see each other's data. Elections happen only when a leader is
silent for 1-2 s (20 ticks): the tests assume stable leaders on a busy machine. No retention policy
(`retain_offsets = 0`): a snapshot cuts the log as far as it covers (test_read_events_and_compaction).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from tests.support.fixtures import seed_for
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until


class GrpcNodes:
    """gRPC stubs to the members of a started NodeCluster (one channel per node, closed by `close`)."""

    def __init__(self, cluster: NodeCluster) -> None:
        self.cluster = cluster
        self.grpc = {i: n.grpc_address for i, n in cluster.nodes.items()}
        self.client = {i: n.client_address for i, n in cluster.nodes.items()}
        self.channels: dict[int, grpc.Channel] = {}

    def stub(self, node: int) -> pb_grpc.EpochlogStub:
        if node not in self.channels:
            self.channels[node] = grpc.insecure_channel(self.grpc[node])
        return pb_grpc.EpochlogStub(self.channels[node])

    def leader(self, group: str, timeout: float = 15.0) -> int:
        """The node every member agrees leads `group` (asked over gRPC)."""
        def agreed() -> int | None:
            seen = set()
            for i in self.cluster.nodes:
                try:
                    status = self.stub(i).Status(pb.StatusRequest(), timeout=2)
                except grpc.RpcError:
                    return None
                seen |= {g.leader for g in status.groups if g.group == group}
            return seen.pop() if len(seen) == 1 and 0 not in seen else None
        return wait_until(agreed, timeout, f"the members to agree on a leader of {group}")

    def follower(self, group: str) -> int:
        leader = self.leader(group)
        return next(i for i in self.cluster.nodes if i != leader)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcNodes]:
    cluster = NodeCluster(tmp_path_factory.mktemp("grpc-cluster"), seed=seed_for("grpc cluster"), name="grpc-test",
                          grpc=True, raft={"election_timeout_ticks": 20}, log={"segment_bytes": 256 << 10},
                          compaction={"retain_offsets": 0})
    nodes = GrpcNodes(cluster)
    try:
        cluster.start()
        for group in cluster.groups:
            nodes.leader(group)
        yield nodes
        nodes.close()
        codes = cluster.stop_all()
        # Open streams must not keep a node from stopping cleanly on SIGTERM.
        assert all(code == 0 for code in codes.values()), (codes, cluster.describe())
    finally:
        nodes.close()
        cluster.close()
