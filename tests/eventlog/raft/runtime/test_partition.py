"""Partitions on real processes, through the frame-aware proxies of tests/support/proxy.py.

Every node pair's connection goes through a `Link` (dialer -> proxy -> acceptor). Default timing:
tick 50 ms, election timeout 10 ticks (0.5-1 s), heartbeat every tick, pre-vote and check-quorum on.

- An isolated leader (one link silently dropping frames both ways, the other severed: TCP aborted
  and reconnections refused) steps down on its own within a bounded time (check-quorum, thesis
  §6.2: within two election timeouts); the majority elects a new leader and commits; nothing the
  isolated leader was asked after the cut is acknowledged; the isolated node's term does not move
  (pre-vote, §9.6), so healing does not disturb the new leader.
- One-way partitions: a follower that stops hearing the leader cannot depose it (pre-vote and
  leader stickiness: the others still hear the leader); a leader whose outgoing frames are all
  dropped is replaced and learns the new term from the new leader's heartbeats; a delay on every
  link slows commits by at least a round trip and causes no election.
- After healing, every node holds the same committed log: the nodes are stopped and the batches
  of the committed range are compared byte for byte (eventlog.log.Log over each group directory),
  and every acknowledged write is there with its content.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.eventlog.raft.runtime.cluster import (
    Cluster,
    WriteStream,
    check_acks,
    compare_committed,
    run_test,
)
from tests.support.wait import eventually

G = "g0"
STEP_DOWN_BOUND_S = 2.0   # check-quorum fires within two election timeouts (1 s) of the cut

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


async def _heal_and_compare(cluster: Cluster, stream: WriteStream, leader: tuple[int, int]) -> None:
    """Heal, write a little more, then check that every node holds the same committed log and that
    `leader` (node, term) still leads: a healed node never deposes it (pre-vote, check-quorum)."""
    assert cluster.net is not None
    cluster.net.heal()
    acks = len(stream.acks)
    await eventually(lambda: len(stream.acks) >= acks + 20, 10.0, "writes after healing")
    await stream.stop()
    print(f"writes: {stream.summary()}")
    states = await cluster.wait_converged(G, timeout=15.0)
    assert len({(s.applied, s.records, s.digest) for s in states.values()}) == 1, states
    assert {(s.leader, s.term) for s in states.values()} == {leader}, (leader, states)
    codes = await cluster.stop_all()
    assert codes == {n: 0 for n in cluster.nodes}, codes
    logs = {n: cluster.read_log(n, G) for n in cluster.nodes}
    checked = check_acks(stream.acks, logs)
    assert all(log.start == 0 for log in logs.values()), {n: log.start for n, log in logs.items()}
    lo, hi, batches = compare_committed(logs, next(iter(states.values())).commit)
    print(f"{len(stream.acks)} acks ({checked} record checks); offsets [{lo}, {hi}] ({batches} batches) "
          f"byte-identical on all nodes")


async def _isolated_leader(cluster: Cluster) -> None:
    net = cluster.net
    assert net is not None
    await cluster.start()
    stream = WriteStream(cluster, G, proposers=4)
    stream.start()
    await eventually(lambda: len(stream.acks) >= 30, 15.0, "the first acknowledged writes")
    old = await cluster.wait_leader(G)
    a, b = [n for n in cluster.nodes if n != old.node]
    net.partition(old.node, a)   # silent: the connection stays up, frames vanish
    net.sever(old.node, b)       # loud: the connection is reset, reconnections refused
    t_cut = time.monotonic()
    print(f"isolated node {old.node}, leader in term {old.term}")

    async def stepped_down() -> float | None:
        s = (await cluster.states(G, [old.node])).get(old.node)
        return time.monotonic() if s is not None and s.role != "leader" else None
    t_down = await eventually(stepped_down, STEP_DOWN_BOUND_S + 3.0, f"node {old.node} to step down", 0.02)
    print(f"node {old.node} stepped down {t_down - t_cut:.3f}s after the cut")
    assert t_down - t_cut <= STEP_DOWN_BOUND_S, f"step-down took {t_down - t_cut:.3f}s"

    new = await cluster.wait_leader(G, among=[a, b], min_term=old.term + 1, timeout=5.0)
    await eventually(lambda: next((x for x in stream.acks if x.node == new.node and x.sent > t_cut), None),
                     5.0, f"a write committed by the new leader {new.node}")
    late = [x for x in stream.acks if x.node == old.node and x.sent > t_cut]
    assert not late, f"the isolated leader acknowledged writes sent after the cut: {late[:3]}"
    await asyncio.sleep(1.5)   # the isolated node keeps trying to campaign: pre-vote must hold its term
    isolated = (await cluster.states(G, [old.node]))[old.node]
    assert isolated.term == old.term and isolated.role != "leader", isolated
    assert net.link(old.node, b).refused > 0, "the severed link saw no reconnection attempt"

    await _heal_and_compare(cluster, stream, (new.node, new.term))


async def _one_way(cluster: Cluster) -> None:
    net = cluster.net
    assert net is not None
    await cluster.start()
    stream = WriteStream(cluster, G, proposers=4)
    stream.start()
    await eventually(lambda: len(stream.acks) >= 30, 15.0, "the first acknowledged writes")
    leader = await cluster.wait_leader(G)
    deaf, other = [n for n in cluster.nodes if n != leader.node]

    # 1. The leader's frames to one follower are dropped; the follower's frames still arrive.
    net.drop(leader.node, deaf)
    await asyncio.sleep(0.2)   # frames already past the proxy land first
    before = await cluster.states(G)
    acks = len(stream.acks)
    await asyncio.sleep(2.0)   # two to four election timeouts of the deaf follower
    after = await cluster.states(G)
    print(f"leader {leader.node} -> {deaf} dropped: before {before}\nafter {after}")
    assert after[leader.node].role == "leader" and after[leader.node].term == leader.term, after[leader.node]
    assert after[other].leader == leader.node and after[other].term == leader.term, after[other]
    assert after[deaf].term == leader.term, f"the deaf follower raised its term: {after[deaf]}"
    assert after[deaf].last_index == before[deaf].last_index, "entries reached the deaf follower"
    assert len(stream.acks) > acks + 20, "commits stalled while one follower was deaf"
    net.heal()
    await _catch_up(cluster, deaf)

    # 2. Everything the leader sends is dropped; it still hears the others.
    muted = leader.node
    net.drop(muted, deaf)
    net.drop(muted, other)
    t_mute = time.monotonic()
    new = await cluster.wait_leader(G, among=[deaf, other], min_term=leader.term + 1, timeout=5.0)

    async def knows_new_leader() -> bool:
        s = (await cluster.states(G, [muted])).get(muted)
        return s is not None and s.role == "follower" and s.leader == new.node and s.term == new.term
    await eventually(knows_new_leader, 3.0, f"node {muted} to follow the new leader {new.node}")
    await eventually(lambda: next((x for x in stream.acks if x.node == new.node and x.sent > t_mute), None),
                     5.0, f"a write committed by the new leader {new.node}")
    late = [x for x in stream.acks if x.node == muted and x.sent > t_mute]
    assert not late, f"the muted leader acknowledged writes sent after it was muted: {late[:3]}"
    print(f"muted leader {muted} replaced by node {new.node} in term {new.term}")
    net.heal()
    await _catch_up(cluster, muted)

    # 3. A delay on every direction of every link: slower commits, same leader.
    delay = 0.04
    for x in cluster.nodes:
        for y in cluster.nodes:
            if x != y:
                net.delay(x, y, delay)
    t_delay = time.monotonic()
    await asyncio.sleep(1.5)
    slow = [x.acked - x.sent for x in stream.acks if x.sent > t_delay]
    states = await cluster.states(G)
    assert slow, "no write committed under delay"
    assert min(slow) >= 2 * delay, f"a commit took {min(slow):.3f}s under a {delay}s one-way delay"
    assert {(s.leader, s.term) for s in states.values()} == {(new.node, new.term)}, states
    print(f"{len(slow)} commits under delay, fastest {min(slow):.3f}s")

    await _heal_and_compare(cluster, stream, (new.node, new.term))


async def _catch_up(cluster: Cluster, node: int) -> None:
    """Wait (writes still flowing) until `node` follows the leader and applied what it had committed."""
    leader = await cluster.wait_leader(G)

    async def caught_up() -> bool:
        mine = (await cluster.states(G, [node])).get(node)
        return mine is not None and mine.leader == leader.node and mine.applied >= leader.commit
    await eventually(caught_up, 10.0, f"node {node} to catch up to offset {leader.commit} after healing")


def test_isolated_leader_steps_down_majority_elects_and_logs_agree(
        cluster_factory: Callable[..., Cluster]) -> None:
    run_test(cluster_factory(proxied=True), _isolated_leader)


def test_one_way_partitions_and_delay(cluster_factory: Callable[..., Cluster]) -> None:
    run_test(cluster_factory(proxied=True), _one_way)
