"""Views on a real 3-node cluster in one process: writes, reads at every consistency level, watch,
leases and their expiry, and replica digests. Three NodeHosts share one asyncio loop but talk over
real TCP on 127.0.0.1 and keep real segmented logs and RocksDB views on disk."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from eventlog.raft.errors import CompactedError, NotCaughtUpError, NotFoundError, NotLeaderError
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.proposals import Committed
from statemachines import events as ev
from statemachines.query import Query
from statemachines.state import Outcome
from tests.support.hosts import HostCluster, run_cluster, views


async def write(group: RaftGroup, *events: ev.Event) -> list[Outcome]:
    committed = await group.submit([ev.event_record(e) for e in events])
    return list(committed.outcomes)  # type: ignore[arg-type]


def run(scenario: Callable[[HostCluster], Awaitable[None]], tmp_path: Path, **options: int) -> None:
    asyncio.run(run_cluster(HostCluster(tmp_path, **options), scenario, timeout=60))


def test_writes_reads_at_every_consistency_level_and_dedupe(tmp_path: Path) -> None:
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        follower = next(hosts.group(n) for n in hosts.hosts if hosts.group(n) is not leader)
        [put] = await write(leader, ev.KvPut(name="app/a", value=b"1", actor="alice", request_id="req-1"))
        assert put.ok
        # a retry of the same request changes nothing and returns the first outcome
        [retry] = await write(leader, ev.KvPut(name="app/a", value=b"other", actor="alice", request_id="req-1"))
        assert retry.duplicate and retry.ok and retry.offset == put.offset
        # compare-and-set: a stale version is rejected, nothing changes
        [stale] = await write(leader, ev.KvPut(name="app/a", value=b"2", expected_version=put.offset + 100))
        assert not stale.ok and stale.code == "version_mismatch"
        [cas] = await write(leader, ev.KvPut(name="app/a", value=b"2", expected_version=put.offset))
        assert cas.ok
        # linearizable and lease reads on the leader see the write
        for consistency in ("linearizable", "lease"):
            at = await leader.read_barrier(consistency)
            assert at >= cas.offset
            item = Query(views(leader).store).get("kv/app/a")
            assert item is not None and item.state.value == b"2" and item.version == cas.offset
        with pytest.raises(NotLeaderError) as info:
            await follower.read_barrier("linearizable")
        assert info.value.leader_hint == leader.node_id
        # read-your-writes on a follower with the write's offset as min_offset
        await follower.read_barrier("local", min_offset=cas.offset)
        assert Query(views(follower).store).get("kv/app/a").state.value == b"2"
        with pytest.raises(NotCaughtUpError):
            await follower.read_barrier("local", min_offset=cas.offset + 10_000, timeout=0.2)
        # point in time: the value as of the first write
        assert Query(views(follower).store).get("kv/app/a", as_of=put.offset).state.value == b"1"
        # every replica holds the same views at the same applied offset
        await asyncio.gather(*(hosts.group(n).wait_applied(cas.offset, 5) for n in hosts.hosts))
        digests = {views(hosts.group(n)).digest for n in hosts.hosts if views(hosts.group(n)).applied_index == cas.offset}
        assert len(digests) == 1
    run(scenario, tmp_path)


def test_the_leader_applies_its_own_batches_from_what_it_proposed_with_the_followers_digest(tmp_path: Path) -> None:
    """The leader's applier takes the records of the entries it built from the proposal (`Applier.proposed`),
    the followers parse the same entries from the log: the same views and digest at the same offset."""
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        last = 0
        for i in range(5):
            outcomes = await write(leader, *(ev.KvPut(name=f"own/{j % 7}", value=bytes([i, j]) * 50, actor="a",
                                                      request_id=f"own-{i}-{j}") for j in range(20)))
            assert all(o.ok for o in outcomes)
            last = outcomes[-1].offset
        await asyncio.gather(*(hosts.group(n).wait_applied(last, 5) for n in hosts.hosts))
        groups = [hosts.group(n) for n in hosts.hosts]
        assert views(leader).applier.records_handed >= 100
        assert views(leader).applier.records_parsed_instead == 0
        assert all(views(g).applier.records_handed == 0 for g in groups if g is not leader)
        at = {views(g).applied_index for g in groups}
        assert len(at) == 1, at
        assert len({views(g).digest for g in groups}) == 1
        rows = [Query(views(g).store).get("kv/own/3") for g in groups]
        assert all(r is not None and r == rows[0] for r in rows)
    run(scenario, tmp_path)


def test_the_leader_prepares_applying_its_entries_before_they_commit_with_the_followers_digest(tmp_path: Path) -> None:
    """One write at a time: the leader prepares applying each entry while the followers store it
    (`ViewsStateMachine.speculate`) and its commit only writes that; the followers apply the same entries
    from the log as always: the same outcomes, views and digest at the same offset."""
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        before = views(leader).speculations.committed
        for i in range(30):
            [first] = await write(leader, ev.KvPut(name=f"spec/{i % 4}", value=b"%d" % i, actor="a",
                                                   request_id=f"spec-{i}"))
            assert first.ok and not first.duplicate
            # the offset the outcome names is the record's (prepared from the entry as the log stores it,
            # stamped with its offset: not the proposal's bytes, whose batch starts at 0)
            item = Query(views(leader).store).get(f"kv/spec/{i % 4}")
            assert item is not None and first.offset == item.version == views(leader).applied_index, (first, item)
            [again] = await write(leader, ev.KvPut(name=f"spec/{i % 4}", value=b"x", actor="a",
                                                   request_id=f"spec-{i}"))
            assert again.duplicate and again.offset == first.offset
        last = views(leader).applied_index   # a duplicate's outcome names the first write's offset
        spec = views(leader).speculations
        # each write's entry was prepared and committed as prepared (a tick's lease check or an election
        # may come first now and then: those are abandoned, never applied twice)
        assert spec.committed - before >= 50, spec
        await asyncio.gather(*(hosts.group(n).wait_applied(last, 5) for n in hosts.hosts))
        groups = [hosts.group(n) for n in hosts.hosts]
        assert all(views(g).speculations.prepared == 0 for g in groups if g is not leader)
        assert len({views(g).applied_index for g in groups}) == 1
        assert len({views(g).digest for g in groups}) == 1
        rows = [Query(views(g).store).get("kv/spec/1") for g in groups]
        assert all(r is not None and r == rows[0] and r.state.value == b"29" for r in rows)
    run(scenario, tmp_path)


def test_a_told_write_is_answered_before_the_views_write_it_and_they_have_it_before_anything_else_runs(
        tmp_path: Path) -> None:
    """A write told at once (`RaftGroup.submit_told`) whose entry the leader prepared is answered from the
    apply, before the views write it (`ViewsStateMachine.apply_answering`); the write follows in the same
    call, so the next callback of the loop (any read) finds it applied. Outcomes and digest as a follower's."""
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        loop = asyncio.get_running_loop()
        seen: list[tuple[object, int, int]] = []   # (outcome, applied when told, applied at the next callback)
        for i in range(20):
            done = loop.create_future()
            record = ev.event_record(ev.KvPut(name=f"told/{i % 3}", value=b"%d" % i, actor="a", request_id=f"told-{i}"))

            def then(committed: object, done: asyncio.Future[None] = done) -> None:
                told_at = views(leader).applied_index

                def next_callback() -> None:
                    seen.append((committed, told_at, views(leader).applied_index))
                    done.set_result(None)

                loop.call_soon(next_callback)

            leader.submit_told([record], then)
            await asyncio.wait_for(done, 10)
        early = 0
        for committed, told_at, after in seen:
            assert isinstance(committed, Committed), committed
            (outcome,) = committed.outcomes
            assert isinstance(outcome, Outcome) and outcome.ok and outcome.offset == committed.offset
            assert after >= committed.offset, (committed, told_at, after)   # written before anything else ran
            early += told_at < committed.offset
        assert early >= 10, seen   # most were answered before their write (a tick's entry may come between)
        last = seen[-1][0].offset  # type: ignore[attr-defined]
        await asyncio.gather(*(hosts.group(n).wait_applied(last, 5) for n in hosts.hosts))
        groups = [hosts.group(n) for n in hosts.hosts]
        assert len({views(g).applied_index for g in groups}) == 1
        assert len({views(g).digest for g in groups}) == 1
        rows = [Query(views(g).store).get("kv/told/1") for g in groups]
        assert all(r is not None and r == rows[0] and r.state.value == b"19" for r in rows)
    run(scenario, tmp_path)


def test_watch_streams_from_an_offset_and_reports_compaction(tmp_path: Path) -> None:
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        outcomes = []
        for i in range(5):
            outcomes += await write(leader, ev.KvPut(name=f"w/{i}", value=b"%d" % i), ev.KvPut(name=f"x/{i}", value=b"-"))
        seen = []
        async for e in leader.watch(b"kv/w/", outcomes[2].offset):
            seen.append((e.offset, ev.decode_event(e.value).name))
            if len(seen) == 4:
                break
        assert seen == [(o.offset, f"w/{i // 2}") for i, o in enumerate(outcomes) if i % 2 == 0][1:]
        # a live watcher gets new events as they are applied
        follower = next(hosts.group(n) for n in hosts.hosts if hosts.group(n) is not leader)

        async def first_new() -> int:
            async for e in follower.watch(b"kv/late", outcomes[-1].offset + 1):
                return e.offset
            raise AssertionError("watch ended")
        waiter = asyncio.create_task(first_new())
        await asyncio.sleep(0.1)
        [late] = await write(leader, ev.KvPut(name="late", value=b"!"))
        assert await asyncio.wait_for(waiter, 5) == late.offset
        # after a snapshot and compaction, a watcher from offset 0 is told to resync
        storage = leader.storage
        meta = storage.create_snapshot(views(leader).applied_index, leader.node.conf, views(leader).write_snapshot)
        storage.compact(meta.index)
        if storage.log.start_offset > 0:
            with pytest.raises(CompactedError, match="resync from the snapshot"):
                async for _ in leader.watch(b"kv/", 0):
                    pass
    run(scenario, tmp_path)


def test_leases_expire_as_events_and_survive_keepalive_and_leader_change(tmp_path: Path) -> None:
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        [a, b] = await write(leader, ev.LeaseGranted(lease_id=1, ttl_ms=400), ev.LeaseGranted(lease_id=2, ttl_ms=400))
        assert a.ok and b.ok
        await write(leader, ev.KvPut(name="eph/1", value=b"x", lease=1), ev.SessionOpened(client_id="c2", lease=2),
                    ev.KvPut(name="eph/2", value=b"y", lease=2))
        # lease 2 is kept alive; lease 1 is not and expires by an event that deletes its key
        for _ in range(10):
            assert leader.keepalive(2) == 400
            await asyncio.sleep(0.1)
        q = Query(views(leader).store)
        assert q.get("kv/eph/1") is None and q.get("lease/00000000000000000001") is None
        assert q.get("kv/eph/2") is not None and q.get("session/c2") is not None
        history = q.history("kv/eph/1")
        assert history[-1].event == "LeaseExpired" and history[-1].state is None
        with pytest.raises(NotFoundError):
            leader.keepalive(1)
        # a new leader restarts lease 2's clock in full: it survives the change for its TTL
        target = next(n for n in hosts.hosts if n != leader.node_id)
        leader.node.transfer_leadership(target)
        new_leader = None
        for _ in range(200):
            await asyncio.sleep(0.01)
            if hosts.group(target).node.role.value == "leader":
                new_leader = hosts.group(target)
                break
        assert new_leader is not None
        await asyncio.sleep(0.2)
        assert Query(views(new_leader).store).get("kv/eph/2") is not None, "cut short by the leader change"
        await asyncio.sleep(0.8)  # no keepalives: it expires on the new leader
        await new_leader.read_barrier("linearizable")
        assert Query(views(new_leader).store).get("kv/eph/2") is None
        assert Query(views(new_leader).store).get("session/c2") is None
    run(scenario, tmp_path)


def test_a_follower_behind_the_log_start_installs_the_views_checkpoint(tmp_path: Path) -> None:
    async def scenario(hosts: HostCluster) -> None:
        leader = await hosts.leader()
        lagging = next(n for n in (1, 2, 3) if n != leader.node_id)
        await hosts.stop(lagging)
        last = None
        for i in range(60):  # 60 batches of 20 puts: the others snapshot and compact meanwhile
            outs = await write(leader, *(ev.KvPut(name=f"s/{i}/{j}", value=b"v" * 100) for j in range(20)))
            last = outs[-1]
        assert last is not None and leader.storage.log.start_offset > 0, "the leader's log was not compacted"
        await hosts.start(lagging)
        follower = hosts.group(lagging)
        await follower.wait_applied(last.offset, timeout=20)
        assert follower.storage.snapshot().index > 0, "caught up by snapshot"
        q = Query(views(follower).store)
        assert q.get("kv/s/0/0").state.value == b"v" * 100 and q.get("kv/s/59/19") is not None
        assert len(q.list("kv/s/", limit=10_000).items) == 1200
        assert q.get("kv/s/0/0", as_of=last.offset) is not None, "history came with the checkpoint"
        await leader.wait_applied(last.offset, 5)
        if views(leader).applied_index == views(follower).applied_index:
            assert views(leader).digest == views(follower).digest
    run(scenario, tmp_path, snapshot_every_entries=300)
