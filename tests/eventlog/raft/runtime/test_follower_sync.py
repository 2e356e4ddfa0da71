"""Where a follower's appends are synced: on its loop when nothing else is in flight, else by the flusher.

One real `RaftGroup` (node 1, a follower) on a real log (`group` flush policy) is fed appends from a
leader (node 2) that the test plays. The log's observer records which thread ran each sync; every
acknowledgement records the log's durable offset at the moment it was sent. A slow or failing disk is
`os.fdatasync` wrapped in the test process (as eventlog/fault_injection.py does for real processes).

- a lone append is synced on the loop and acknowledged in the same turn (no flusher-thread sync);
- appends that arrive while the flusher's sync is in flight go to the flusher and share its next sync
  (group commit), and nothing is acknowledged before it is durable;
- after a slow sync, the next append goes to the flusher thread (the loop is not held by a slow disk);
- an append that also commits: acknowledged, then the follower yields its core, then applies;
- a failed sync stops the group whether the loop or the flusher ran it, and acknowledges nothing.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from bench.raft_node import ChecksumStateMachine
from eventlog.config import LogConfig
from eventlog.errors import LogError
from eventlog.log import Log
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime import ready_loop
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.ready_loop import INLINE_SYNC_MAX_BYTES, INLINE_SYNC_MAX_SECONDS
from eventlog.raft.types import Append, AppendResp, ConfState, Entry, EntryKind, Message
from eventlog.records import encode_batch

CFG = LogConfig(segment_bytes=4 << 20, flush_policy="group", preallocate_next_segment=False)
CONF = ConfState(voters=(1, 2, 3))
TERM = 3
LEADER = 2
WAIT_S = 20.0


def entry(index: int, value_bytes: int = 40) -> Entry:
    """One entry of one record at `index`, its value `value_bytes` long."""
    return Entry(index, TERM, 1, EntryKind.NORMAL, encode_batch([(b"k%d" % index, b"v" * value_bytes)],
                                                                 timestamp_ms=1000 + index))


def append(prev: int, e: Entry) -> Append:
    return Append(term=TERM, src=LEADER, dst=1, prev_index=prev, prev_term=TERM if prev >= 0 else 0,
                  entries=(e,), commit=-1)


class SyncThreads:
    """LogObserver: the thread of every sync of the log, and how long the log says it took."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.seconds: list[float] = []
        self.log: Log | None = None

    def appended(self, seconds: float, size: int) -> None:
        pass

    def synced(self, seconds: float) -> None:
        assert self.log is not None
        self.threads.append(threading.current_thread().name)
        self.seconds.append(self.log.last_sync_seconds)


class Disk:
    """`os.fdatasync` of this process, made slow or failing on request (the real sync still runs)."""

    def __init__(self) -> None:
        self.gate_flusher = threading.Event()   # set: the flusher thread's syncs wait for `release`
        self.release = threading.Event()
        self.flusher_waiting = threading.Event()
        self.delay_next_s = 0.0
        self.fail = False
        self._real = os.fdatasync

    def fdatasync(self, fd: int) -> None:
        if self.fail:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        if self.gate_flusher.is_set() and threading.current_thread().name.startswith("log-flusher"):
            self.flusher_waiting.set()
            assert self.release.wait(WAIT_S), "the test never released the flusher's sync"
        if self.delay_next_s:
            time.sleep(self.delay_next_s)
            self.delay_next_s = 0.0
        self._real(fd)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    d = Disk()
    monkeypatch.setattr(os, "fdatasync", d.fdatasync)
    yield d
    d.release.set()


async def wait(check: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Follower:
    """Node 1 of group `g`, its storage, and what it sent (each ack with the durable offset at sending)."""

    def __init__(self, path: Path) -> None:
        self.storage = LogStorage.open(path, CFG, CONF)
        self.syncs = SyncThreads()
        self.syncs.log = self.storage.log
        self.storage.log.observer = self.syncs
        self.acks: list[tuple[AppendResp, int]] = []
        self.group = RaftGroup("g", 1, self.storage, ChecksumStateMachine(), RaftConfig(election_timeout_ticks=1000),
                               self._send, tick_interval_ms=50, rng=random.Random(1))

    def _send(self, dst: int, group: str, m: Message) -> None:
        if isinstance(m, AppendResp):
            self.acks.append((m, self.storage.log.durable_offset))

    def acked(self) -> int:
        """The highest index acknowledged (-1: none)."""
        return max((m.index for m, _ in self.acks if not m.reject), default=-1)

    def check_acks_durable(self) -> None:
        for m, durable in self.acks:
            assert durable > m.index, f"{m} sent with the log durable only below {durable}"


def run(main: Callable[[], object]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))  # type: ignore[arg-type]


def test_a_lone_append_is_synced_on_the_loop_and_acknowledged_in_that_turn(tmp_path: Path, disk: Disk) -> None:
    """Appends one at a time: each synced on the loop, unless the sync before it was slow (this disk's
    speed decides which, the test checks the choice matches it; the first is always on the loop)."""
    async def main() -> None:
        f = Follower(tmp_path / "f")
        f.group.start()
        try:
            loop_thread = threading.current_thread().name
            for i in range(10):   # one at a time, each acknowledged before the next leaves the "leader"
                f.group.deliver(LEADER, append(i - 1, entry(i)))
                await wait(lambda i=i: f.acked() == i, f"the ack of entry {i}")
                assert len(f.syncs.threads) == i + 1, "one sync per append"
            where = ["loop" if t == loop_thread else "flusher" if t.startswith("log-flusher") else t
                     for t in f.syncs.threads]
            expected = ["loop"] + ["flusher" if slow > INLINE_SYNC_MAX_SECONDS else "loop"
                                   for slow in f.syncs.seconds[:-1]]
            assert where == expected, f"synced on, and the sync before took: {f.syncs.seconds}"
            f.check_acks_durable()
            assert f.group.failed is None and not f.group.stopped
        finally:
            await f.group.close()

    run(main)


def test_appends_during_the_flushers_sync_share_its_next_sync(tmp_path: Path, disk: Disk) -> None:
    big = INLINE_SYNC_MAX_BYTES + 1000   # above the bound: the flusher thread syncs it

    async def main() -> None:
        f = Follower(tmp_path / "f")
        f.group.start()
        log = f.storage.log
        try:
            disk.gate_flusher.set()
            f.group.deliver(LEADER, append(-1, entry(0, big)))
            await wait(disk.flusher_waiting.is_set, "the flusher's sync of entry 0 under way")
            for i in (1, 2):   # each in a turn of its own, while that sync is still in flight
                f.group.deliver(LEADER, append(i - 1, entry(i)))
                await wait(lambda i=i: log.end_offset == i + 1, f"entry {i} written")
            assert f.acks == [], "nothing acknowledged before it is durable"
            assert f.syncs.threads == [], "no sync on the loop while the flusher's is in flight"
            disk.release.set()
            await wait(lambda: f.acked() == 2, "the acks of entries 0-2")
            assert len(f.syncs.threads) == 2 and all(t.startswith("log-flusher") for t in f.syncs.threads), \
                f"entry 0, then entries 1 and 2 in one sync of the flusher: {f.syncs.threads}"
            f.check_acks_durable()
        finally:
            await f.group.close()

    run(main)


def test_after_a_slow_sync_the_next_append_goes_to_the_flusher(tmp_path: Path, disk: Disk) -> None:
    async def main() -> None:
        f = Follower(tmp_path / "f")
        f.group.start()
        try:
            loop_thread = threading.current_thread().name
            disk.delay_next_s = INLINE_SYNC_MAX_SECONDS * 5
            f.group.deliver(LEADER, append(-1, entry(0)))
            await wait(lambda: f.acked() == 0, "the ack of entry 0")
            assert f.storage.log.last_sync_seconds > INLINE_SYNC_MAX_SECONDS
            f.group.deliver(LEADER, append(0, entry(1)))
            await wait(lambda: f.acked() == 1, "the ack of entry 1")
            assert f.syncs.threads[0] == loop_thread and f.syncs.threads[1].startswith("log-flusher"), f.syncs.threads
            f.check_acks_durable()
        finally:
            await f.group.close()

    run(main)


def test_a_follower_yields_its_core_after_the_ack_and_before_applying(tmp_path: Path, disk: Disk,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An append that also commits the previous entry: the follower acknowledges it, then yields its core
    (the acknowledgement woke the leader, whose commit is the write's path), then applies; an append
    that commits nothing does not yield."""
    # The yield comes with an inline sync; on a loaded machine entry 0's sync may take longer than the bound
    # that sends the next one to the flusher thread (tested above): not what this test is about.
    monkeypatch.setattr(ready_loop, "INLINE_SYNC_MAX_SECONDS", 60.0)

    async def main() -> None:
        f = Follower(tmp_path / "f")
        sm = f.group.sm
        assert isinstance(sm, ChecksumStateMachine)
        yields: list[tuple[int, int]] = []   # (highest index acknowledged, applied index) at each yield
        monkeypatch.setattr(os, "sched_yield", lambda: yields.append((f.acked(), sm.applied_index)))
        f.group.start()
        try:
            f.group.deliver(LEADER, append(-1, entry(0)))
            await wait(lambda: f.acked() == 0, "the ack of entry 0")
            assert yields == [], "nothing committed, nothing to apply: no yield"
            f.group.deliver(LEADER, msgspec.structs.replace(append(0, entry(1)), commit=0))
            await wait(lambda: sm.applied_index == 0, "entry 0 applied")
            assert yields == [(1, -1)], f"acknowledged entry 1 before the yield, applied entry 0 after: {yields}"
            f.check_acks_durable()
        finally:
            await f.group.close()

    run(main)


@pytest.mark.parametrize("where", ["loop", "flusher"])
def test_a_failed_sync_stops_the_group_and_acknowledges_nothing(tmp_path: Path, disk: Disk, where: str) -> None:
    size = 40 if where == "loop" else INLINE_SYNC_MAX_BYTES + 1000

    async def main() -> None:
        f = Follower(tmp_path / "f")
        f.group.start()
        try:
            f.group.deliver(LEADER, append(-1, entry(0)))
            await wait(lambda: f.acked() == 0, "the ack of entry 0")
            disk.fail = True
            f.group.deliver(LEADER, append(0, entry(1, size)))
            await wait(lambda: f.group.stopped, "the group stopped")
            failure = f.group.failed
            assert isinstance(failure, LogError) and "fdatasync" in str(failure), failure
            assert f.storage.log.failure is failure
            assert f.acked() == 0, "entry 1 was never acknowledged"
            f.group.deliver(LEADER, append(1, entry(2)))
            await asyncio.sleep(0.2)
            assert f.acked() == 0 and f.storage.log.end_offset == 2, "a stopped group appends nothing"
        finally:
            await f.group.close()

    run(main)
