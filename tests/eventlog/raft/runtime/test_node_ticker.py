"""Every group of a node ticks in the same loop turn (eventlog/raft/runtime/ticker.py).

One real `NodeHost` (a one-member cluster with mutual TLS, real logs) with three groups, ticking every
5 ms: in every tick period the three groups' ticks run in one turn of the event loop, so the node wakes
once per period and what the ticks send to a peer leaves in one write (the transport flushes once per
turn). Each group used to sleep on a timer of its own, and timers of one period drift apart: the groups
ticked in separate turns. The ticks still drive the core: each group elects its one member.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import pytest

from bench.raft_node import ChecksumStateMachine
from eventlog.config import LogConfig
from eventlog.raft.config import RaftConfig
from eventlog.raft.node import RaftNode, Role
from eventlog.raft.runtime.config import ClusterConfig, MemberConfig, NodeConfigs
from eventlog.raft.runtime.host import NodeHost
from tests.support.ports import free_ports
from tests.support.tls import provision
from tests.support.wait import eventually

GROUPS = ("a", "b", "c")
ROUNDS = 100


class Turns:
    """Numbers the loop's turns as code running in them sees them: the first call in a turn schedules
    the increment, which runs in the next turn (call_soon)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.turn = 0
        self._marked = False

    def current(self) -> int:
        if not self._marked:
            self._marked = True
            self.loop.call_soon(self._next)
        return self.turn

    def _next(self) -> None:
        self.turn += 1
        self._marked = False


def test_a_nodes_groups_tick_in_one_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    turns_of: dict[int, list[int]] = defaultdict(list)   # id(core) -> the turn of each of its ticks
    counter: list[Turns] = []
    tick = RaftNode.tick

    def recorded(self: RaftNode) -> None:
        if counter:
            turns_of[id(self)].append(counter[0].current())
        tick(self)

    monkeypatch.setattr(RaftNode, "tick", recorded)

    async def main() -> None:
        port = free_ports(1)[0]
        cluster = ClusterConfig(name="ticks", members=(MemberConfig(id=1, peer_address=f"127.0.0.1:{port}"),),
                                groups=GROUPS, tick_interval_ms=5, leader_balance=False)
        provision(tmp_path / "ca", "ticks", {1: tmp_path / "n1"})
        host = NodeHost(1, tmp_path / "n1", NodeConfigs(cluster, RaftConfig(), LogConfig(segment_bytes=64 * 1024)),
                        lambda name, directory: ChecksumStateMachine(), seed=1)
        counter.append(Turns(asyncio.get_running_loop()))
        await host.start()
        try:
            cores = [host.groups[g].node for g in GROUPS]
            await eventually(lambda: all(len(turns_of[id(c)]) >= ROUNDS for c in cores), 30.0, f"{ROUNDS} ticks each")
            rounds = [tuple(turns_of[id(c)][r] for c in cores) for r in range(ROUNDS)]
            apart = [r for r in rounds if len(set(r)) > 1]
            assert not apart, f"{len(apart)} of {ROUNDS} tick rounds ran in more than one turn: {apart[:5]}"
            await eventually(lambda: all(c.role is Role.LEADER for c in cores), 30.0, "each group electing node 1")
        finally:
            await host.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
