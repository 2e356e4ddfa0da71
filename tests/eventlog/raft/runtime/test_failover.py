"""Failover on real processes: kill -9 the leader in the middle of a write stream.

Three nodes with the default timing (tick 50 ms, election timeout 10 ticks: 0.5-1 s) host two
groups (multi-raft: both share each node's connections). Writers stream to both groups' leaders;
the leader of `g0` is killed with SIGKILL. Checked:

- a new leader of g0 is elected and commits a write within 2 s of the kill (thesis §3.6: the
  election timeout bounds unavailability; 2 s leaves room for a loaded machine);
- no acknowledged write is lost: after every node is stopped, each acknowledged offset holds exactly
  the acknowledged records in every node's log (read offline with eventlog.log.Log), and the
  committed range is byte-identical on the three nodes;
- the killed node restarts and catches up: by log in the first test; in the second, the survivors
  snapshot and compact their logs while it is down (snapshot_every_entries), so their logs start
  beyond its old log end and only an InstallSnapshot can bring it back; its status must then show a
  snapshot past its old log end and the same applied digest and record count as the others. In the
  third the survivors snapshot past its old log end but their logs (16 MiB segments) still hold the
  entries it lacks: it must catch up from the log, keeping its log from offset 0 (no install).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from eventlog.offline import dump_log_dir
from tests.eventlog.raft.runtime.cluster import (
    Cluster,
    WriteStream,
    check_acks,
    compare_committed,
    run_test,
)
from tests.support.wait import eventually

GROUPS = ("g0", "g1")
FAILOVER_BOUND_S = 2.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _old_log_end(cluster: Cluster, node: int, group: str) -> int:
    """End offset of a killed node's group log, read without opening (or repairing) it."""
    rows = list(dump_log_dir(cluster.group_dir(node, group) / "log"))
    return rows[-1].last_offset + 1 if rows else 0


async def _failover(cluster: Cluster, *, by_snapshot: bool, snapshots_ahead: bool = False) -> None:
    await cluster.start()
    streams = {g: WriteStream(cluster, g, proposers=4) for g in GROUPS}
    for s in streams.values():
        s.start()
    g0 = streams["g0"]
    await eventually(lambda: len(g0.acks) >= 40 and len(streams["g1"].acks) >= 10, 15.0,
                     "the first acknowledged writes")
    leader = await cluster.wait_leader("g0")
    victim = leader.node
    survivors = [n for n in cluster.nodes if n != victim]
    acks_before = len(g0.acks)
    t_kill = cluster.kill(victim)
    print(f"killed node {victim}, leader of g0 in term {leader.term}, after {acks_before} acks")

    # A new leader commits a write within the bound.
    # (An ack of the victim's can be recorded just after the kill: its reply was read before.)
    first = await eventually(lambda: next((a for a in g0.acks if a.acked > t_kill and a.node != victim),
                                          None), 10.0, "a write acknowledged by a survivor after the kill")
    new_leader = await cluster.wait_leader("g0", among=survivors, min_term=leader.term + 1)
    took = first.acked - t_kill
    print(f"node {first.node} acknowledged offset {first.offset} {took:.3f}s after the kill; "
          f"g0 leader now node {new_leader.node} in term {new_leader.term}")
    late = [a for a in g0.acks if a.node == victim and a.sent > t_kill]
    assert not late, late
    assert took < FAILOVER_BOUND_S, f"first commit {took:.3f}s after the kill (bound {FAILOVER_BOUND_S}s)"

    old_end = _old_log_end(cluster, victim, "g0")
    if by_snapshot:
        # Keep writing until every survivor compacted g0 past the victim's old log end.
        async def compacted() -> bool:
            states = await cluster.states("g0", survivors)
            return len(states) == 2 and all(s.log_start > old_end for s in states.values())
        await eventually(compacted, 30.0, f"the survivors to compact g0 beyond offset {old_end}")
    elif snapshots_ahead:
        # Keep writing until every survivor took a snapshot past the victim's old log end.
        async def snapshotted() -> bool:
            states = await cluster.states("g0", survivors)
            return len(states) == 2 and all(s.snapshot_index > old_end for s in states.values())
        await eventually(snapshotted, 30.0, f"the survivors to snapshot g0 beyond offset {old_end}")
    else:
        await asyncio.sleep(0.5)

    await cluster.start_node(victim)
    await asyncio.sleep(0.5)   # the restarted node catches up under load
    for s in streams.values():
        await s.stop()
    print({g: s.summary() for g, s in streams.items()})

    converged = {g: await cluster.wait_converged(g, timeout=20.0) for g in GROUPS}
    for g, states in converged.items():
        digests = {(s.applied, s.records, s.digest) for s in states.values()}
        assert len(digests) == 1, f"{g}: replicas differ at the same applied index: {states}"
    restarted = converged["g0"][victim]
    if by_snapshot:
        assert restarted.snapshot_index > old_end, (old_end, restarted)
        assert restarted.log_start > old_end, (old_end, restarted)
    elif snapshots_ahead:
        assert restarted.log_start == 0, f"installed a snapshot instead of catching up from the log: {restarted}"
    else:
        assert restarted.snapshot_index == -1 and restarted.log_start == 0, restarted
    print(f"node {victim} back: old g0 log end {old_end}, now {restarted}")

    codes = await cluster.stop_all()
    assert codes == {n: 0 for n in cluster.nodes}, f"exit codes {codes}\n{cluster.describe()}"
    for g, stream in streams.items():
        logs = {n: cluster.read_log(n, g) for n in cluster.nodes}
        checked = check_acks(stream.acks, logs)
        commit = next(iter(converged[g].values())).commit
        if not by_snapshot:
            assert all(log.start == 0 for log in logs.values()), {n: log.start for n, log in logs.items()}
        lo, hi, batches = compare_committed(logs, commit)
        print(f"{g}: {len(stream.acks)} acks, {checked} record checks; batches of [{lo}, {hi}] held by two "
              f"nodes or more ({batches}) byte-identical; logs {[(x.start, x.end) for x in logs.values()]}")
        assert stream.acks, g
        # Acknowledged records compacted away everywhere cannot be read back; the replicas' equal
        # digests cover them, and at least their number of records was applied.
        acked_records = sum(len(a.records) for a in stream.acks)
        assert all(s.records >= acked_records for s in converged[g].values()), (acked_records, converged[g])


def test_leader_killed_mid_stream_new_leader_and_catch_up_by_log(
        cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory(groups=GROUPS)
    run_test(cluster, lambda c: _failover(c, by_snapshot=False))


def test_leader_killed_mid_stream_catch_up_by_snapshot(cluster_factory: Callable[..., Cluster]) -> None:
    # 16 KiB segments and a snapshot every 200 offsets: the survivors drop whole segments while
    # the killed node is down, so its next index falls below their first index.
    cluster = cluster_factory(groups=GROUPS, snapshot_every_entries=200, log={"segment_bytes": 16 << 10})
    run_test(cluster, lambda c: _failover(c, by_snapshot=True))


def test_leader_killed_mid_stream_catch_up_by_log_behind_the_snapshots(
        cluster_factory: Callable[..., Cluster]) -> None:
    # A snapshot every 200 offsets, but 16 MiB segments: no segment lies wholly below a snapshot, so
    # the survivors' logs keep every entry and the victim needs no InstallSnapshot.
    cluster = cluster_factory(groups=GROUPS, snapshot_every_entries=200, log={"segment_bytes": 16 << 20})
    run_test(cluster, lambda c: _failover(c, by_snapshot=False, snapshots_ahead=True))
