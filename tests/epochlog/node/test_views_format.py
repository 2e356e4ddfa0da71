"""The views format level on real `epochlog serve` processes (statemachines/views_format.py).

1. A new cluster: each group's first leader raises its views to the newest level once every member's
   peer hello says it applies it; every node says so in its status, and the replicas' digests agree.
2. A rolling upgrade: with one member that knows level 1 only (tests/support/builds.py `views-format-1`)
   every group stays at level 1 while writes go on; once that member runs this tree the leader raises
   the level. A member that said it applies the newest level but cannot (`views-format-1-stale`) halts the
   group at the raise (the poison path: no exit, status says where); upgraded, it applies it and catches up
   with equal views. With a member that knows levels 1-2 only (`views-format-2`) the groups stop at level
   2; upgraded, they rise to 3 while an SDK client's session goes on writing batches: its outcomes kept a
   row per request before the raise and a row per run after it, and the replicas' views stay equal.
3. `member add` refuses a node whose hello says it applies a lower level than the groups are at (it would
   read a snapshot of level-2 views as level 1), and adds the same node once it runs this tree. The
   refused node answers `members` not_leader (it once answered with its own book, which lists itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from epochlog.client import Client, ClientError, NotLeaderError
from statemachines import events as ev
from statemachines import views_format
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

GROUPS = ("metadata", "offsets", "kv")


def _levels(cluster: NodeCluster, group: str, nodes: tuple[int, ...] = (1, 2, 3)) -> list[int | None]:
    infos = [cluster.group_status(n, group) for n in nodes]
    return [None if g is None else g.views_format for g in infos]


def _wait_level(cluster: NodeCluster, level: int, nodes: tuple[int, ...] = (1, 2, 3)) -> None:
    for group in GROUPS:
        wait_until(lambda group=group: set(_levels(cluster, group, nodes)) == {level}, 30,
                   f"{group} at views format level {level} on nodes {nodes}")


def test_a_new_cluster_gets_the_newest_level_from_its_first_leader(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory()
    cluster.start()
    _wait_level(cluster, views_format.LATEST)
    with Client(cluster.endpoints, timeout=15) as client:
        first = client.put("app/a", b"1").offset
        second = client.put("app/a", b"2").offset
        assert client.get("app/a", as_of=first).value == b"1"
        assert [r.offset for r in client.history("app/a")][-2:] == [first, second]
    for n in (1, 2, 3):
        cluster.wait_applied(n, "kv", second)
    views = cluster.stop_converged(["kv"])["kv"]
    assert len(set(views.values())) == 1, f"applied offsets and digests differ: {views}"


def test_an_older_member_keeps_level_1_until_it_runs_code_that_applies_level_2(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory()
    cluster.nodes[3].build = "views-format-1"
    cluster.start()
    with Client(cluster.endpoints, timeout=15) as client:
        before = client.put("app/before", b"1").offset
        time.sleep(3.0)   # a leader checks at every tick: it had every chance to raise
        for group in GROUPS:
            assert _levels(cluster, group) == [1, 1, 1], group

        # The member comes back with a hello that says the newest level but code that cannot apply it: the
        # leader raises the level and that member halts there, no exit; the others go on at that level.
        cluster.nodes[3].build = "views-format-1-stale"
        cluster.restart(3)
        _wait_level(cluster, views_format.LATEST, (1, 2))
        wait_until(lambda: all((g := cluster.group_status(3, group)) is not None and g.halted is not None
                               for group in GROUPS), 30, "node 3 halted at the raise in every group")
        halt = cluster.wait_group_status(3, "kv").halted
        assert halt is not None and f"ViewsFormatRaised version {views_format.LATEST} is newer" in halt.reason, halt
        assert cluster.nodes[3].running
        after = client.put("app/after", b"2").offset
        assert client.get("app/before", as_of=before).value == b"1"

    # Upgraded, it applies the raise and everything after it.
    cluster.nodes[3].build = None
    cluster.restart(3)
    assert cluster.wait_applied(3, "kv", after, timeout=30).halted is None
    _wait_level(cluster, views_format.LATEST)
    views = cluster.stop_converged(["kv"])["kv"]
    assert len(set(views.values())) == 1, f"applied offsets and digests differ: {views}"


def test_a_member_that_knows_level_2_holds_the_groups_there_until_upgraded_and_sessions_go_on(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    assert views_format.LATEST == views_format.OUTCOME_RUNS == 3
    cluster = node_cluster_factory()
    cluster.nodes[3].build = "views-format-2"
    cluster.start()
    _wait_level(cluster, 2)
    with Client(cluster.endpoints, timeout=20) as client:
        first = client.commands([ev.KvPut(name=f"app/s/{i}", value=b"2") for i in range(50)])
        time.sleep(2.0)   # a leader checks at every tick: it had every chance to raise past 2
        for group in GROUPS:
            assert _levels(cluster, group) == [2, 2, 2], group
        cluster.nodes[3].build = None
        cluster.restart(3)
        _wait_level(cluster, views_format.LATEST)
        last = client.commands([ev.KvPut(name=f"app/s/{i}", value=b"3") for i in range(50)])   # the same session
        assert all(r.ok for r in first + last)
        assert client.get("app/s/7").value == b"3"   # type: ignore[union-attr]
    for n in (1, 2, 3):
        cluster.wait_applied(n, "kv", last[-1].offset)
    views = cluster.stop_converged(["kv"])["kv"]
    assert len(set(views.values())) == 1, f"applied offsets and digests differ: {views}"


def test_member_add_refuses_a_node_that_cannot_apply_the_groups_level(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory()
    cluster.start()
    _wait_level(cluster, views_format.LATEST)
    joiner = cluster.start_joiner(4, build="views-format-1")
    time.sleep(3.0)   # it dials the lower ids a second after it starts: its hello reaches the leader
    with Client(cluster.endpoints, timeout=20) as client:
        with pytest.raises(ClientError, match="applies views format level 1 at most") as info:
            client.member_add(4, joiner.peer_address, joiner.client_address)
        assert info.value.code == "conf_change"
        assert 4 not in {m.id for m in client.members().members}
        # Asked on its own, the refused node does not answer with its own book (where it lists itself): it
        # is not in the metadata group, so it names no leader.
        with Client([joiner.client_address], timeout=2) as alone, pytest.raises(NotLeaderError):
            alone.members()
        cluster.nodes[4].build = None
        cluster.stop(4)
        cluster.start([4])
        members = client.member_add(4, joiner.peer_address, joiner.client_address)
        assert 4 in members.learners or 4 in members.voters
    _wait_level(cluster, views_format.LATEST, (1, 2, 3, 4))
