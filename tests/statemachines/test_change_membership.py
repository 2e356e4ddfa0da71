"""RaftGroup.change_membership on an in-process cluster (NodeHosts over real TCP, RocksDB views):
a node joins as a learner and is promoted once caught up, a voter and then the leader are removed,
and the configuration survives restarts, from the log and from snapshots."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from eventlog.raft.errors import ConfChangeError, NotLeaderError
from eventlog.raft.node import Role
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.types import ConfChange, ConfChangeKind, ConfState
from statemachines import events as ev
from statemachines.query import Query
from tests.support.hosts import GROUP, TICK_MS, HostCluster, run_cluster
from tests.support.wait import eventually


async def put(group: RaftGroup, *names: str) -> int:
    done = await group.submit([ev.event_record(ev.KvPut(name=n, value=n.encode())) for n in names])
    return done.offset + len(names) - 1


def test_join_promote_remove_and_restart_keep_the_configuration(tmp_path: Path) -> None:
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        last = await put(leader, *(f"before/{i}" for i in range(20)))
        follower = next(hosts.group(n) for n in (1, 2, 3) if hosts.group(n) is not leader)

        # errors come from the core unchanged; followers refuse
        with pytest.raises(NotLeaderError) as not_leader:
            await follower.change_membership(ConfChange(ConfChangeKind.ADD_LEARNER, 4))
        assert not_leader.value.leader_hint == leader.node_id
        with pytest.raises(ConfChangeError, match="already a member"):
            await leader.change_membership(ConfChange(ConfChangeKind.ADD_LEARNER, follower.node_id))

        # node 4 starts outside the configuration: it never campaigns, it waits to be added
        joiner_host = await hosts.start(4)
        joiner = joiner_host.groups[GROUP]
        await asyncio.sleep(30 * TICK_MS / 1000)   # more than two election timeouts
        assert joiner.node.role is Role.FOLLOWER and joiner.node.term == 0 and joiner.sm.applied_index == -1
        assert not joiner.node.conf.contains(4)

        # The configured nodes were not told node 4's address: node 4 dials them (it joined at
        # runtime, so it dials lower ids too), and the leader replicates over that connection.
        conf = await leader.change_membership(ConfChange(ConfChangeKind.ADD_LEARNER, 4, auto_promote=True))
        assert conf == ConfState(voters=(1, 2, 3), learners=(4,), auto_promote=(4,))
        await joiner.wait_applied(last, timeout=10)
        assert Query(joiner.sm.store).get("kv/before/19").state.value == b"before/19"  # type: ignore[attr-defined]
        await eventually(lambda: leader.node.conf.voters == (1, 2, 3, 4), 10, "the automatic promotion of node 4")
        await eventually(lambda: joiner.node.conf.voters == (1, 2, 3, 4), 5, "node 4 to see its promotion")

        # the configured nodes learn node 4's address: the lower id's connection replaces node 4's
        for n in (1, 2, 3):
            hosts.hosts[n].transport.add_peer(4, ("127.0.0.1", hosts.ports[3]))
        await asyncio.sleep(0.3)
        assert all(hosts.hosts[n].transport.connected(4) for n in (1, 2, 3))

        # conf-change entries reach the state machine, but never as records
        applied = leader.sm.applied_index
        keys = []
        async for e in leader.watch(b"", 0):
            keys.append(e.key)
            if e.offset >= last:
                break
        assert len(keys) == 20 and all(k.startswith(b"kv/before/") for k in keys)
        assert leader.sm.applied_index >= applied

        # remove a follower that is not node 4; the cluster keeps committing
        gone = next(n for n in (1, 2, 3) if n != leader.node_id)
        conf = await leader.change_membership(ConfChange(ConfChangeKind.REMOVE, gone))
        assert gone not in conf.voters and conf.voters == tuple(sorted({1, 2, 3, 4} - {gone}))
        await hosts.stop(gone)
        last = await put(leader, "after-remove")
        expected = leader.node.conf

        # a snapshot carries the configuration; restarts rebuild it from the snapshot (node 4) and
        # from the log's conf-change entries (the leader, no snapshot)
        joiner.snapshot_now()
        assert joiner.storage.snapshot().conf == expected
        await hosts.stop(4)
        old_leader = leader.node_id
        await hosts.stop(old_leader)
        for n in (4, old_leader):
            host = await hosts.start(n)
            assert host.groups[GROUP].node.conf == expected, f"node {n} restarted with another configuration"
        leader = await hosts.leader()
        last = await put(leader, "after-restart")
        await hosts.group(4).wait_applied(last, timeout=10)

        # removing the leader: it commits its removal, steps down, and the others elect a new leader
        removed = leader.node_id
        conf = await leader.change_membership(ConfChange(ConfChangeKind.REMOVE, removed))
        assert removed not in conf.voters and len(conf.voters) == 2
        await eventually(lambda: leader.node.role is not Role.LEADER, 5, "the removed leader to step down")
        new_leader = await hosts.leader(among=conf.voters)
        await put(new_leader, "after-leader-removed")
        with pytest.raises(ConfChangeError, match="not a member"):
            await new_leader.change_membership(ConfChange(ConfChangeKind.REMOVE, removed))

    # Configured members 1-3 plus node 4, which is not in the config (it joins at runtime).
    asyncio.run(run_cluster(HostCluster(tmp_path, name="membership", joiners=1), scenario, timeout=60))
