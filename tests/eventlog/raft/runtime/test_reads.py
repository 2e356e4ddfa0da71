"""Reads.commit_barrier at a follower (eventlog/raft/runtime/reads.py): it asks its leader for the commit
index, except a leader whose hello did not say it takes a ReadIndex (an older version, during a rolling
upgrade), which would close the connection on one: then it serves what it knows to be committed.

A real core (a follower of leader 2 in term 1, entries 0-1 held, 0 committed) and a state machine that
applied what the core handed out; no network: the messages the core would send are inspected."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from eventlog.errors import NotCaughtUpError
from eventlog.raft.node import RaftNode
from eventlog.raft.runtime.group import GroupCounters
from eventlog.raft.runtime.reads import Reads
from eventlog.raft.types import Entry, Heartbeat, ReadIndex
from tests.eventlog.raft.paper import drain, node, storage


@dataclass
class Applied:
    applied_index: int = -1


def follower() -> RaftNode:
    n = node(1, storage(entries=[Entry(index=0, term=1), Entry(index=1, term=1)], term=1))
    n.step(Heartbeat(term=1, src=2, dst=1, commit=0))
    drain(n)
    assert (n.leader, n.log.committed) == (2, 0)
    return n


@pytest.mark.parametrize("leader_takes_it", [True, False])
def test_a_follower_asks_its_leader_unless_the_leader_cannot_take_a_read_index(leader_takes_it: bool) -> None:
    async def main() -> None:
        n = follower()
        sm = Applied(n.log.committed)
        reads = Reads("kv", n, sm, loop=asyncio.get_running_loop(), wake=lambda: None, tick_interval=0.05,
                      counters=GroupCounters(), peer_reads_index=lambda peer: peer == 2 and leader_takes_it)
        if leader_takes_it:
            with pytest.raises(NotCaughtUpError):   # asked, never answered here
                await reads.commit_barrier(0.2)
            assert [m for m in drain(n) if isinstance(m, ReadIndex)] == [ReadIndex(term=1, src=1, dst=2, ctx=1)]
        else:
            assert await reads.commit_barrier(0.2) == 0   # what it knows to be committed, applied
            assert not [m for m in drain(n) if isinstance(m, ReadIndex)]
    asyncio.run(main())
