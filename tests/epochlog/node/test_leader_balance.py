"""Leader balance on three real nodes (`[cluster] leader_balance`, eventlog/raft/runtime/leader_balance.py).

After a start the three groups' leaders end on three different members, each on the member the group
prefers (group i of `groups` prefers the voters sorted by id rotated by i: metadata 1, offsets 2, kv 3),
and stay there; a member killed loses its group to another member, and once restarted and caught up
(writes went on meanwhile; the group does not move on while it is away) it gets that group back.
"""

from __future__ import annotations

import time

from epochlog.client import Client
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

PREFERRED = {"metadata": 1, "offsets": 2, "kv": 3}
SETTLE_MS = 1000


def leaders(cluster: NodeCluster) -> dict[str, tuple[int, int]]:
    """Each group's (leader, term) as the running nodes' own status says: the highest term a node leads
    in; a group no running node leads is left out."""
    found: dict[str, tuple[int, int]] = {}
    for i in cluster.running():
        info = cluster.status(i)
        for g in info.groups if info is not None else ():
            if g.role == "leader" and g.term > found.get(g.group, (0, -1))[1]:
                found[g.group] = (g.node, g.term)
    return found


def settled_on(cluster: NodeCluster, expected: dict[str, int]) -> dict[str, tuple[int, int]] | None:
    now = leaders(cluster)
    return now if {g: lt[0] for g, lt in now.items()} == expected else None


def test_leaders_spread_after_start_and_after_a_member_returns(node_cluster_factory) -> None:
    cluster: NodeCluster = node_cluster_factory(cluster={"leader_balance": True,
                                                         "leader_balance_settle_ms": SETTLE_MS})
    cluster.start()
    first = wait_until(lambda: settled_on(cluster, PREFERRED), 60, f"the groups led as preferred: {PREFERRED}")
    print(f"after start: {first}")

    # Settled: nothing moves any more (three settle times, plus the moves' own back-off, pass quietly).
    time.sleep(3 * SETTLE_MS / 1000)
    assert leaders(cluster) == first, "a settled, balanced cluster moved a leader"

    victim = PREFERRED["kv"]
    cluster.kill9(victim)
    moved = wait_until(lambda: (lambda now: now if now.get("kv", (victim, 0))[0] != victim else None)(
        leaders(cluster)), 30, "another member to lead kv")
    print(f"node {victim} killed: {moved}")
    with Client([cluster.endpoint(i) for i in cluster.running()], timeout=10) as client:
        offsets = [client.put(f"balance/{n}", b"v%d" % n).offset for n in range(20)]
    time.sleep(2 * SETTLE_MS / 1000)
    assert leaders(cluster)["kv"] == moved["kv"], "kv moved on while its first choice was away (churn)"

    cluster.restart(victim)
    back = wait_until(lambda: settled_on(cluster, PREFERRED), 60, f"kv back on node {victim}")
    print(f"node {victim} restarted: {back}")
    assert back["kv"][1] > moved["kv"][1], "kv moved by a new term"
    for group in ("metadata", "offsets"):
        assert back[group] == first[group], f"{group} moved although its preferred member never left"
    kv = cluster.group_status(victim, "kv")
    assert kv is not None and kv.applied_offset >= max(offsets), "the new kv leader holds the writes made without it"
