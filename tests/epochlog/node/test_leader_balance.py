"""Leader balance on three real nodes (`[cluster] leader_balance`, eventlog/raft/runtime/leader_balance.py).

After a start the three groups' leaders end on three different members, each on the member the group
prefers (group i of `groups` prefers the voters sorted by id rotated by i: metadata 1, offsets 2, kv 3),
and stay there (no balance move counted); an operator's leader transfer stands; a member killed loses
its groups to others by election, and once restarted and caught up (writes went on meanwhile; its group
does not move on while it is away) it gets its group back (the moves counted), and the group the
operator moved returns to its first choice.
"""

from __future__ import annotations

import time

from epochlog.api import messages as p
from epochlog.client import Client
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

PREFERRED = {"metadata": 1, "offsets": 2, "kv": 3}
SETTLE_MS = 1000


def leaders(cluster: NodeCluster) -> dict[str, tuple[int, int]]:
    """Each group's (leader, term) as the running nodes' own status says (every one of them answering:
    asked again until they do, on a loaded machine one may not within its 2 s): the highest term a node
    leads in; a group no running node leads is left out."""
    def ask() -> list[p.StatusInfo] | None:
        infos = [cluster.status(i) for i in cluster.running()]
        return None if any(info is None for info in infos) else infos  # type: ignore[return-value]

    found: dict[str, tuple[int, int]] = {}
    for info in wait_until(ask, 30, "every running node to answer status"):
        for g in info.groups:
            if g.role == "leader" and g.term > found.get(g.group, (0, -1))[1]:
                found[g.group] = (g.node, g.term)
    return found


def balance_transfers(cluster: NodeCluster) -> int:
    """Leaderships handed over for balance, summed over the running members and groups (their metrics,
    asked again until each answers)."""
    total = 0
    for i in cluster.running():
        metrics = wait_until(lambda i=i: cluster.metrics(i), 30, f"node {i} to answer /metrics")
        total += int(sum(v for (name, _), v in metrics.items() if name == "epochlog_leader_balance_transfers_total"))
    return total


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
    moves = balance_transfers(cluster)
    time.sleep(3 * SETTLE_MS / 1000)
    assert leaders(cluster) == first, "a settled, balanced cluster moved a leader"
    assert balance_transfers(cluster) == moves, "a settled cluster counted a balance move"

    # An operator's move stands (the balancer only moves what an election placed) ...
    with Client(cluster.endpoints, timeout=10) as client:
        client.transfer_leader("kv", 2)
    moved = wait_until(lambda: (lambda now: now if now.get("kv", (0, 0))[0] == 2 else None)(leaders(cluster)), 30,
                       "node 2 to lead kv")
    time.sleep(3 * SETTLE_MS / 1000)
    assert leaders(cluster) == moved, "the balancer undid an operator's leader transfer"

    # ... until an election: node 2 (offsets' first choice, kv's leader) is killed, both groups are
    # elected elsewhere and stay there while it is away (writes go on meanwhile) ...
    victim = 2
    cluster.kill9(victim)
    away = wait_until(lambda: (lambda now: now if {"kv", "offsets"} <= set(now) and victim not in
                               (now["kv"][0], now["offsets"][0]) else None)(leaders(cluster)), 30,
                      "other members to lead kv and offsets")
    print(f"node {victim} killed: {away}")
    with Client([cluster.endpoint(i) for i in cluster.running()], timeout=10) as client:
        offsets = [client.put(f"balance/{n}", b"v%d" % n).offset for n in range(20)]
    time.sleep(2 * SETTLE_MS / 1000)
    now = leaders(cluster)
    assert now["offsets"] == away["offsets"], "offsets moved on while its first choice was away (churn)"

    # ... and once it is back and caught up, every group is led by its first choice again.
    moves = balance_transfers(cluster)
    cluster.restart(victim)
    back = wait_until(lambda: settled_on(cluster, PREFERRED), 60, f"the groups led as preferred again: {PREFERRED}")
    print(f"node {victim} restarted: {back}")
    assert back["offsets"][1] > away["offsets"][1], "offsets moved back by a new term"
    assert balance_transfers(cluster) >= moves + 1, "the balancer's moves back are not counted"
    assert back["metadata"] == first["metadata"], "metadata moved although its first choice never left"
    kv = cluster.wait_group_status(3, "kv")
    assert kv.applied_offset >= max(offsets), "kv's leader holds the writes"
