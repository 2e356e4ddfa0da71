"""Failover on real processes: kill -9 the leader in the middle of a write stream.

Three `epochlog serve` nodes with the default timing (tick 50 ms, election timeout 10 ticks: 0.5-1 s)
host their groups (multi-raft: all share each node's connections). Writers stream to the leaders of
`kv` and `offsets`; the leader of `kv` is killed with SIGKILL. Checked:

- a new leader of kv is elected and commits a write within 2 s of the kill (thesis §3.6: the
  election timeout bounds unavailability; 2 s leaves room for a loaded machine); its log says it
  campaigned on an election timeout;
- no acknowledged write is lost: after every node is stopped, each acknowledged offset holds exactly
  the acknowledged records in every node's log (read offline with eventlog.log.Log), the committed
  range is byte-identical on the three nodes, and every node's views hold every acknowledged entity
  at the offset of its write, with the same applied offset and digest on every node;
- the killed node restarts and catches up: by log in the first test; in the second, the survivors
  snapshot and compact their logs while it is down (snapshot_every_entries), so their logs start
  beyond its old log end and only an InstallSnapshot can bring it back; its status must then show a
  snapshot past its old log end. In the third the survivors snapshot past its old log end but their
  logs (16 MiB segments) still hold the entries it lacks: it must catch up from the log, keeping its
  log from offset 0 (no install).

The logs are kept as Raft wrote them (`compact_groups = []`: no key compaction rewrites them).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from eventlog.offline import dump_log_dir
from statemachines.query import Query
from statemachines.store import ViewStore
from tests.support.nodes import NodeCluster
from tests.support.offline import compare_committed
from tests.support.wait import wait_until
from tests.support.writes import Ack, WriteStream, check_acks

G = "kv"
GROUPS = ("kv", "offsets")
FAILOVER_BOUND_S = 2.0
RAFT_LOGS = {"compact_groups": []}
SNAPSHOTS_CUT_THE_LOG = {"compact_groups": [], "retain_offsets": 0}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _old_log_end(cluster: NodeCluster, node: int, group: str) -> int:
    """End offset of a killed node's group log, read without opening (or repairing) it."""
    rows = list(dump_log_dir(cluster.group_dir(node, group) / "log"))
    return rows[-1].last_offset + 1 if rows else 0


def _views_hold(cluster: NodeCluster, node: int, group: str, acks: list[Ack]) -> int:
    """A stopped node's views hold every acknowledged entity as its write left it (keys are never
    written twice); how many were checked."""
    store = ViewStore.open(cluster.group_dir(node, group) / "views")
    try:
        query = Query(store, group)
        for ack in acks:
            for j, (key, _) in enumerate(ack.records):
                item = query.get(key.decode())
                assert item is not None and item.version == ack.offset + j, (
                    f"node {node}: {key!r}, acknowledged at offset {ack.offset + j}, is {item!r} in its views")
        return sum(len(a.records) for a in acks)
    finally:
        store.close()


def _failover(cluster: NodeCluster, *, by_snapshot: bool, snapshots_ahead: bool = False) -> None:
    cluster.start()
    streams = {g: WriteStream(cluster, g, proposers=4) for g in GROUPS}
    for s in streams.values():
        s.start()
    kv = streams[G]
    wait_until(lambda: len(kv.acks) >= 40 and len(streams["offsets"].acks) >= 10, 15.0,
               "the first acknowledged writes")
    leader = cluster.wait_leader(G)
    victim, term = leader.node, leader.term
    survivors = [n for n in cluster.nodes if n != victim]
    acks_before = len(kv.acks)
    t_kill = cluster.kill9(victim)
    print(f"killed node {victim}, leader of kv in term {term}, after {acks_before} acks")

    # A new leader commits a write within the bound.
    # (An ack of the victim's can be recorded just after the kill: its reply was read before.)
    first = wait_until(lambda: next((a for a in kv.acks if a.acked > t_kill and a.node != victim), None), 10.0,
                       "a write acknowledged by a survivor after the kill")
    new_leader = cluster.wait_leader(G, among=survivors, min_term=term + 1, timeout=10.0)
    took = first.acked - t_kill
    print(f"node {first.node} acknowledged offset {first.offset} {took:.3f}s after the kill; "
          f"kv leader now node {new_leader.node} in term {new_leader.term}")
    late = [a for a in kv.acks if a.node == victim and a.sent > t_kill]
    assert not late, late
    # The new leader's log says why it campaigned (eventlog/raft/runtime/election_log.py).
    campaign = f"group {G}: node {new_leader.node} campaigns in term {new_leader.term}"
    said = [line for line in cluster.nodes[new_leader.node].stderr().splitlines() if campaign in line]
    assert said and "election timeout: no message from leader" in said[-1], said
    assert took < FAILOVER_BOUND_S, f"first commit {took:.3f}s after the kill (bound {FAILOVER_BOUND_S}s)"

    old_end = _old_log_end(cluster, victim, G)
    states = lambda: [cluster.group_status(n, G) for n in survivors]  # noqa: E731
    if by_snapshot:
        # Keep writing until every survivor compacted kv past the victim's old log end.
        wait_until(lambda: all(s is not None and s.log_start > old_end for s in states()), 30.0,
                   f"the survivors to compact kv beyond offset {old_end}")
    elif snapshots_ahead:
        # Keep writing until every survivor took a snapshot past the victim's old log end.
        wait_until(lambda: all(s is not None and s.snapshot_offset > old_end for s in states()), 30.0,
                   f"the survivors to snapshot kv beyond offset {old_end}")
    else:
        time.sleep(0.5)

    cluster.start([victim])
    time.sleep(0.5)   # the restarted node catches up under load
    for s in streams.values():
        s.stop()
    print({g: s.summary() for g, s in streams.items()})

    converged = {g: cluster.wait_converged(g, timeout=20.0) for g in GROUPS}
    restarted = converged[G][victim]
    if by_snapshot:
        assert restarted.snapshot_offset > old_end, (old_end, restarted)
        assert restarted.log_start > old_end, (old_end, restarted)
    elif snapshots_ahead:
        assert restarted.log_start == 0, f"installed a snapshot instead of catching up from the log: {restarted}"
    else:
        assert restarted.snapshot_offset == -1 and restarted.log_start == 0, restarted
    print(f"node {victim} back: old kv log end {old_end}, now {restarted}")

    views = cluster.stop_converged(GROUPS)   # every node stopped with SIGTERM, exit code 0
    for g, stream in streams.items():
        assert len(set(views[g].values())) == 1, f"{g}: replicas differ (applied offset, digest): {views[g]}"
        logs = {n: cluster.read_log(n, g) for n in cluster.nodes}
        checked = check_acks(stream.acks, logs)
        commit = next(iter(converged[g].values())).commit_offset
        if not by_snapshot:
            assert all(log.start == 0 for log in logs.values()), {n: log.start for n, log in logs.items()}
        lo, hi, batches = compare_committed(logs, commit)
        print(f"{g}: {len(stream.acks)} acks, {checked} record checks; batches of [{lo}, {hi}] held by two "
              f"nodes or more ({batches}) byte-identical; logs {[(x.start, x.end) for x in logs.values()]}")
        assert stream.acks, g
        # Acknowledged records compacted away everywhere cannot be read back from the logs: the views
        # hold each acknowledged entity, and the replicas' equal digests cover the rest.
        for n in cluster.nodes:
            _views_hold(cluster, n, g, stream.acks)


def test_leader_killed_mid_stream_new_leader_and_catch_up_by_log(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(compaction=RAFT_LOGS)
    _failover(cluster, by_snapshot=False)


def test_leader_killed_mid_stream_catch_up_by_snapshot(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    # 16 KiB segments and a snapshot every 200 offsets: the survivors drop whole segments while
    # the killed node is down, so its next index falls below their first index.
    cluster = node_cluster_factory(snapshot_every_entries=200, log={"segment_bytes": 16 << 10},
                                   compaction=SNAPSHOTS_CUT_THE_LOG)
    _failover(cluster, by_snapshot=True)


def test_leader_killed_mid_stream_catch_up_by_log_behind_the_snapshots(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    # A snapshot every 200 offsets, but 16 MiB segments: no segment lies wholly below a snapshot, so
    # the survivors' logs keep every entry and the victim needs no InstallSnapshot.
    cluster = node_cluster_factory(snapshot_every_entries=200, log={"segment_bytes": 16 << 20},
                                   compaction=SNAPSHOTS_CUT_THE_LOG)
    _failover(cluster, by_snapshot=False, snapshots_ahead=True)
