"""Membership changes on a cluster of real `epochlog serve` processes, through the SDK.

A 4th node, started outside the configured members (`--peer-address`, `--client-address`), is added:
it becomes a learner of every group, is promoted to voter once caught up (by snapshot: the groups
snapshot every 40 offsets), and serves, with consistency=local, data written before it joined. Then
the metadata group's leader is removed: it hands leadership over, leaves every group, and the cluster
keeps taking writes. A full restart (node 4 without its flags: it remembers its addresses) keeps
the membership. Last, a 5th node is added without automatic promotion: a learner until promoted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from epochlog.api import messages as p
from epochlog.client.errors import ClientError, NotFoundError
from epochlog.client.sync import Client
from epochlog.identity import resolve_member
from eventlog.errors import ConfigError
from eventlog.raft.runtime.config import load_node_configs
from statemachines import events as ev
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until

GROUPS = ("metadata", "offsets", "kv")


def confs(client: Client, endpoint: str) -> dict[str, tuple[set[int], set[int]]]:
    """group -> (voters, learners) as the node at `endpoint` sees them."""
    status = client.status(endpoint)
    return {g.group: ({x.id for x in g.peers if x.role == "voter"}, {x.id for x in g.peers if x.role == "learner"})
            for g in status.groups}


def every_group(client: Client, endpoints: list[str], voters: set[int]) -> bool:
    try:
        return all(c == (voters, set()) for e in endpoints for c in confs(client, e).values())
    except ClientError:
        return False


def test_add_a_node_remove_the_metadata_leader_and_restart(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=3, groups=GROUPS, snapshot_every_entries=40)
    cluster.start()
    with Client(cluster.endpoints, timeout=20.0) as client:
        before = [client.put(f"before/{i}", b"v%d" % i) for i in range(60)]
        offset = client.command(ev.OffsetCommitted(consumer_group="cg", topic="t", queue_id=0, offset=7))
        topic = client.command(ev.TopicCreated(name="orders"))
        # member records are the node's own business
        with pytest.raises(ClientError, match="member_add"):
            client.command(ev.MemberAdded(node_id=9, peer_address="127.0.0.1:1"))

        joiner = cluster.start_joiner(4)
        members = client.member_add(4, joiner.peer_address, joiner.client_address)
        assert p.MemberInfo(4, joiner.peer_address, joiner.client_address) in members.members
        assert 4 in members.learners or 4 in members.voters
        endpoints = [cluster.endpoint(i) for i in (1, 2, 3, 4)]
        wait_until(lambda: every_group(client, endpoints, {1, 2, 3, 4}), 30,
                   "node 4 promoted to voter in every group, on every node")
        # a retried add changes nothing
        again = client.member_add(4, joiner.peer_address, joiner.client_address)
        assert sorted(again.voters) == [1, 2, 3, 4] and not again.learners

        with Client([joiner.client_address], timeout=10.0) as local:
            got = local.get("before/0", consistency="local", min_offset=before[-1].offset)
            assert got is not None and got.value == b"v0"
            page = local.list("before/", limit=1000, consistency="local", min_offset=before[-1].offset)
            assert len(page.items) == 60
            assert local.get_entity("offset/cg/t/0", consistency="local", min_offset=offset.offset) is not None
            assert local.get_entity("topic/orders", consistency="local", min_offset=topic.offset) is not None
            assert local.members().members == again.members

        # remove the metadata group's leader: it hands over, leaves every group, the others go on
        def metadata_leader() -> int:
            return next(g.leader for g in client.status().groups if g.group == "metadata")
        if metadata_leader() == 4:   # rare: node 4 stays, for the restart below
            client.transfer_leader("metadata", 1)
            wait_until(lambda: metadata_leader() not in (0, 4), 10, "metadata leadership off node 4")
        leader = wait_until(metadata_leader, 10, "a metadata leader")
        members = client.member_remove(leader)
        assert leader not in {m.id for m in members.members} and leader not in members.voters
        rest = sorted({1, 2, 3, 4} - {leader})
        rest_endpoints = [cluster.endpoint(i) for i in rest]
        wait_until(lambda: every_group(client, rest_endpoints, set(rest)), 20,
                   f"node {leader} out of every group's configuration")
        cluster.stop(leader)
        with Client(rest_endpoints, timeout=20.0) as survivors:
            assert sorted(survivors.member_remove(leader).voters) == rest   # a retry finds it done
            with pytest.raises(NotFoundError):
                survivors.member_remove(99)
            after = survivors.put("after-remove", b"x")
            survivors.command(ev.OffsetCommitted(consumer_group="cg", topic="t", queue_id=0, offset=8))
            survivors.command(ev.TopicCreated(name="after-remove"))

            # a full restart keeps the membership (node 4 starts without its flags)
            for i in rest:
                assert cluster.stop(i) == 0
            cluster.start(rest)
            assert "--peer-address" not in " ".join(map(str, cluster.nodes[4].proc.args))  # type: ignore[union-attr]
            wait_until(lambda: every_group(survivors, rest_endpoints, set(rest)), 20,
                       "the same configuration after the restart")
            listed = survivors.members()
            assert sorted(m.id for m in listed.members) == rest and sorted(listed.voters) == rest
            assert p.MemberInfo(4, joiner.peer_address, joiner.client_address) in listed.members
            last = survivors.put("after-restart", b"y")
            assert last.offset > after.offset
            with Client([joiner.client_address], timeout=10.0) as local:
                got = local.get("after-restart", consistency="local", min_offset=last.offset)
                assert got is not None and got.value == b"y"

            # a learner without automatic promotion stays one until promoted
            fifth = cluster.start_joiner(5)
            members = survivors.member_add(5, fifth.peer_address, fifth.client_address, auto_promote=False)
            assert 5 in members.learners
            every = [*rest_endpoints, fifth.client_address]
            wait_until(lambda: all(c == (set(rest), {5}) for e in every for c in confs(survivors, e).values()), 20,
                       "node 5 a learner of every group, on every node")
            members = survivors.member_promote(5)
            assert sorted(members.voters) == sorted([*rest, 5]) and not members.learners
            wait_until(lambda: every_group(survivors, every, {*rest, 5}), 20, "node 5 a voter of every group")


def test_a_joining_node_gives_its_addresses_once(tmp_path: Path) -> None:
    configs = load_node_configs(ROOT / "configs" / "local-3.toml")
    data = tmp_path / "node-4"
    with pytest.raises(ConfigError, match="needs --peer-address"):
        resolve_member(configs, 4, data)
    with pytest.raises(ConfigError, match="configured member"):
        resolve_member(configs, 1, data, peer_address="127.0.0.1:7999")
    with pytest.raises(ConfigError, match="address of a configured member"):
        resolve_member(configs, 4, data, peer_address=configs.cluster.member(2).peer_address)
    joined = resolve_member(configs, 4, data, peer_address="127.0.0.1:7104", client_address="127.0.0.1:7204")
    assert (joined.id, joined.peer_address, joined.client_address) == (4, "127.0.0.1:7104", "127.0.0.1:7204")
    assert resolve_member(configs, 4, data) == joined            # remembered in the data dir
    assert resolve_member(configs, 1, data) == configs.cluster.member(1)
    with pytest.raises(ConfigError, match="belongs to node 4"):
        resolve_member(configs, 5, data)
