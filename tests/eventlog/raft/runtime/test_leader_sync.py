"""Where a leader syncs its own log, and when the flusher thread's report of a sync wakes its Ready loop.

One real `RaftGroup` (node 1, made leader by the test, which plays nodes 2 and 3) on a real log (`group`
flush policy), with ticks an hour apart: nothing but a message or the flusher's report of durability
wakes the loop, so a report that is needed and skipped leaves the write waiting until the test's
deadline. The flusher thread's sync is held until the test releases it (`Disk`, test_follower_sync.py).

- a lone small write is synced on the loop (as a follower's append is), after its appends left, and the
  first acknowledgement commits it; unless the sync before it was slow: then the flusher thread syncs it.

Writes larger than INLINE_SYNC_MAX_BYTES always go to the flusher thread; with those:

- the sync completes before any acknowledgement: the report does not wake the loop (the Ready stays held);
  the follower's acknowledgement then commits the write at once;
- a follower acknowledges first: the leader's own copy completes the majority, so its report must wake the
  loop and commit;
- both followers acknowledge first (committed without the leader's copy): the leader applies only what its
  own log holds durably, so its report must wake the loop and apply.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.raft_node import ChecksumStateMachine
from eventlog.raft.config import RaftConfig
from eventlog.raft.node import Role
from eventlog.raft.runtime.group import Committed, RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.ready_loop import INLINE_SYNC_MAX_BYTES, INLINE_SYNC_MAX_SECONDS
from eventlog.raft.types import Append, AppendResp, Message, Vote, VoteResp
from tests.eventlog.raft.runtime.test_follower_sync import CFG, CONF, Disk, SyncThreads, run, wait

HOUR_MS = 3_600_000


@pytest.fixture(name="disk")
def held_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    d = Disk()
    monkeypatch.setattr(os, "fdatasync", d.fdatasync)
    yield d
    d.release.set()


class Leader:
    """Node 1 of group `g` and every message it sent."""

    def __init__(self, path: Path) -> None:
        self.storage = LogStorage.open(path, CFG, CONF)
        self.sent: list[Message] = []
        self.durable_at_send: list[int] = []   # the log's durable offset when each of `sent` was sent
        self.syncs = SyncThreads()
        self.syncs.log = self.storage.log
        self.storage.log.observer = self.syncs
        self.group = RaftGroup("g", 1, self.storage, ChecksumStateMachine(),
                               RaftConfig(election_timeout_ticks=1000, pre_vote=False), self._send,
                               tick_interval_ms=HOUR_MS, rng=random.Random(1))

    def _send(self, dst: int, group: str, m: Message) -> None:
        self.sent.append(m)
        self.durable_at_send.append(self.storage.log.durable_offset)

    def appends_to(self, peer: int) -> list[Append]:
        return [m for m in self.sent if isinstance(m, Append) and m.dst == peer and m.entries]

    def ack(self, peer: int, index: int) -> None:
        self.group.deliver(peer, AppendResp(term=self.group.node.term, src=peer, dst=1, index=index))

    async def elect(self) -> None:
        """Campaign, win node 2's vote, and commit the new term's first entry (node 2 acknowledges it)."""
        node = self.group.node
        node.campaign()
        self.group.wake()
        await wait(lambda: any(isinstance(m, Vote) and m.dst == 2 for m in self.sent), "the vote request")
        self.group.deliver(2, VoteResp(term=node.term, src=2, dst=1, granted=True))
        await wait(lambda: node.role is Role.LEADER and bool(self.appends_to(2)), "leadership and its first append")
        noop = self.appends_to(2)[-1].entries[-1].last_index
        self.ack(2, noop)
        await wait(lambda: self.group.sm.applied_index >= noop, "the first entry of the term applied")

    async def propose_held(self, disk: Disk) -> tuple[asyncio.Task[Committed], int]:
        """Propose one write while the flusher's sync of it is held; the task and the write's index.
        The write is larger than INLINE_SYNC_MAX_BYTES, so the flusher thread syncs it."""
        sent = len(self.appends_to(2))
        disk.flusher_waiting.clear()
        disk.release.clear()
        disk.gate_flusher.set()
        task = asyncio.ensure_future(self.group.submit([(b"k", b"v" * (INLINE_SYNC_MAX_BYTES + 1000))]))
        await wait(lambda: len(self.appends_to(2)) > sent, "the write's append to node 2")
        await wait(disk.flusher_waiting.is_set, "the leader's own sync of the write under way")
        return task, self.appends_to(2)[-1].entries[-1].last_index


async def release(disk: Disk, leader: Leader, index: int) -> None:
    disk.gate_flusher.clear()
    disk.release.set()
    await wait(lambda: leader.storage.log.durable_offset > index, "the leader's own sync done")


def test_a_lone_small_write_is_synced_on_the_loop_after_its_appends_left(tmp_path: Path, disk: Disk) -> None:
    """The term's first entry and ten writes one at a time: each synced on the leader's loop unless the sync
    before it was slow (this disk's speed decides which; the test checks the choice matches it, the first
    is always on the loop), each sent to the followers before the leader's own sync of it began, and each
    committed by node 2's acknowledgement."""
    async def main() -> None:
        leader = Leader(tmp_path / "l")
        leader.group.start()
        try:
            loop_thread = threading.current_thread().name
            await leader.elect()
            for _ in range(10):
                sent = len(leader.appends_to(2))
                task = asyncio.ensure_future(leader.group.submit([(b"k", b"v")]))
                await wait(lambda sent=sent: len(leader.appends_to(2)) > sent, "the write's append to node 2")
                index = leader.appends_to(2)[-1].entries[-1].last_index
                leader.ack(2, index)
                assert (await asyncio.wait_for(task, 20)).offset == index
            where = ["loop" if t == loop_thread else "flusher" if t.startswith("log-flusher") else t
                     for t in leader.syncs.threads]
            expected = ["loop"] + ["flusher" if slow > INLINE_SYNC_MAX_SECONDS else "loop"
                                   for slow in leader.syncs.seconds[:-1]]
            assert where == expected, f"synced on, and the sync before took: {leader.syncs.seconds}"
            for m, durable in zip(leader.sent, leader.durable_at_send):
                if isinstance(m, Append) and m.entries:
                    assert durable <= m.entries[0].index, f"{m} sent after the leader's own sync of it"
        finally:
            await leader.group.close()

    run(main)


def test_a_sync_done_before_any_ack_waits_for_the_ack_turn(tmp_path: Path, disk: Disk) -> None:
    async def main() -> None:
        leader = Leader(tmp_path / "l")
        leader.group.start()
        try:
            await leader.elect()
            task, index = await leader.propose_held(disk)
            await release(disk, leader, index)
            await asyncio.sleep(0.1)   # a wake-up, had the report made one, would have run by now
            assert not task.done()
            assert len(leader.group._ready._held) == 1, "the report of a sync nothing waited for woke the loop"
            leader.ack(2, index)
            assert (await asyncio.wait_for(task, 20)).offset == index
        finally:
            await leader.group.close()

    run(main)


def test_a_sync_done_after_one_ack_commits_the_write(tmp_path: Path, disk: Disk) -> None:
    async def main() -> None:
        leader = Leader(tmp_path / "l")
        leader.group.start()
        try:
            await leader.elect()
            task, index = await leader.propose_held(disk)
            leader.ack(2, index)
            await wait(lambda: leader.group.node.progress[2].match == index, "node 2's ack stepped")
            assert not task.done(), "committed before the leader's own copy was durable"
            await release(disk, leader, index)
            assert (await asyncio.wait_for(task, 20)).offset == index, "no commit without another message"
        finally:
            await leader.group.close()

    run(main)


def test_a_sync_done_after_both_acks_applies_the_write(tmp_path: Path, disk: Disk) -> None:
    async def main() -> None:
        leader = Leader(tmp_path / "l")
        leader.group.start()
        try:
            await leader.elect()
            task, index = await leader.propose_held(disk)
            await wait(lambda: bool(leader.appends_to(3)), "the append to node 3")
            leader.ack(2, index)
            leader.ack(3, index)
            await wait(lambda: leader.group.node.log.committed == index, "committed by the two followers")
            assert not task.done(), "applied before the leader's own copy was durable"
            await release(disk, leader, index)
            assert (await asyncio.wait_for(task, 20)).offset == index, "not applied without another message"
        finally:
            await leader.group.close()

    run(main)
