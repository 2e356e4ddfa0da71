"""A cluster of NodeHosts in this process: the one in-process harness of the suite.

Theory of operation. `HostCluster` runs the members of one small cluster as `NodeHost`s on the test's
event loop. They talk over real TCP on 127.0.0.1 with mutual TLS (a CA and member certificates made in
the test's directory, tests/support/tls.py), keep real segmented logs, and apply into real RocksDB views
(`ViewsStateMachine`): what differs from `epochlog serve` is only that no client face runs, so a test
reaches into the groups (`group(node)`) and their state machines directly. Use it for what a real
process cannot show (a group's internals, a state machine's column families); use tests/support/nodes.py
for what a client sees.

`cluster_configs` is the cluster's configuration, also for a child process that runs one member of
the same cluster (tests/statemachines/crash_child.py). Members 1..`members` are configured; a node
with a higher id (up to `members + joiners`) has ports too and starts outside the configuration, to
join at runtime.

Call everything from one event loop (the test's); `close()` stops every host still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from eventlog.config import LogConfig
from eventlog.raft.config import RaftConfig
from eventlog.raft.node import Role
from eventlog.raft.runtime.config import ClusterConfig, MemberConfig, NodeConfigs
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.host import NodeHost
from statemachines.views import ViewsStateMachine
from tests.support.ports import free_ports
from tests.support.tls import provision
from tests.support.wait import eventually

GROUP = "kv-0"
TICK_MS = 20


def cluster_configs(ports: list[int], *, name: str = "views", members: int = 3, group: str = GROUP,
                    snapshot_every_entries: int = 0) -> NodeConfigs:
    """Members 1..`members` on 127.0.0.1:`ports[i - 1]`, one group, 20 ms ticks, 64 KiB segments, no leader
    balancing (tests pick a leader and act on it)."""
    configured = tuple(MemberConfig(id=i, peer_address=f"127.0.0.1:{ports[i - 1]}") for i in range(1, members + 1))
    return NodeConfigs(ClusterConfig(name=name, members=configured, groups=(group,), tick_interval_ms=TICK_MS,
                                     snapshot_every_entries=snapshot_every_entries, leader_balance=False),
                       RaftConfig(), LogConfig(segment_bytes=64 * 1024))


class HostCluster:
    """NodeHosts with views of one cluster, in this process (see the module docstring)."""

    def __init__(self, root: Path, *, name: str = "views", members: int = 3, joiners: int = 0,
                 snapshot_every_entries: int = 0, ports: list[int] | None = None) -> None:
        self.root = root
        self.ports = ports or free_ports(members + joiners)
        self.configs = cluster_configs(self.ports, name=name, members=members,
                                       snapshot_every_entries=snapshot_every_entries)
        self.configured = members
        self.hosts: dict[int, NodeHost] = {}
        provision(root / "ca", name, {i: self.data_dir(i) for i in range(1, members + joiners + 1)})

    def data_dir(self, node: int) -> Path:
        return self.root / f"n{node}"

    async def start(self, node: int) -> NodeHost:
        """Start (or restart) `node`; one above the configured members starts outside the configuration."""
        joiner = MemberConfig(id=node, peer_address=f"127.0.0.1:{self.ports[node - 1]}") \
            if node > self.configured else None
        host = NodeHost(node, self.data_dir(node), self.configs,
                        lambda name, directory: ViewsStateMachine(directory), seed=node, member=joiner)
        await host.start()
        self.hosts[node] = host
        return host

    async def stop(self, node: int) -> None:
        await self.hosts.pop(node).stop()

    async def close(self) -> None:
        """Stop every host still running."""
        for node in list(self.hosts):
            await self.stop(node)

    def group(self, node: int) -> RaftGroup:
        return self.hosts[node].groups[GROUP]

    async def leader(self, among: tuple[int, ...] | None = None, timeout: float = 10.0) -> RaftGroup:
        """The group of a running node of `among` (default: any) that leads."""
        def leading() -> RaftGroup | None:
            return next((h.groups[GROUP] for n, h in self.hosts.items()
                         if h.groups[GROUP].node.role is Role.LEADER and (among is None or n in among)), None)
        return await eventually(leading, timeout, f"a leader of {GROUP} among {among or 'the running nodes'}")


def views(group: RaftGroup) -> ViewsStateMachine:
    """The views a group applies into."""
    assert isinstance(group.sm, ViewsStateMachine)
    return group.sm


async def run_cluster(cluster: HostCluster, scenario: Callable[[HostCluster], Awaitable[None]],
                      timeout: float = 60.0) -> None:
    """Start the configured members, run `scenario(cluster)` within `timeout`, and stop every host."""
    async def main() -> None:
        try:
            for n in range(1, cluster.configured + 1):
                await cluster.start(n)
            await scenario(cluster)
        finally:
            await cluster.close()
    await asyncio.wait_for(main(), timeout)
