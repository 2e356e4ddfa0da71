"""A snapshot the group writes in a thread, overtaken by the leader's snapshot, is superseded, not failed.

A real `RaftGroup` (node 1, a follower, on a real `LogStorage`) applies entries from a leader the test
plays (node 2) and starts a snapshot of its own; the state machine's job is held until the test
releases it. Meanwhile the leader's snapshot (a real leader storage's image, as
tests/eventlog/raft/runtime/test_image_refusal.py makes it) installs and replaces the state; released,
the job raises as the views do when their store was replaced under it.

Checked: the group counts no failed snapshot and keeps no error (before, it did, and held the next
snapshot back SNAPSHOT_RETRY_S), and its next snapshot is taken from the installed state on.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path

from bench.raft_node import ChecksumStateMachine
from eventlog.errors import EpochlogError
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import Append, InstallSnapshot, Message
from tests.eventlog.raft.runtime.test_image_refusal import CFG, CONF, LEADER, TERM, WAIT_S, entries, leader_image, wait

SNAPSHOT_EVERY = 20


class HeldJobs(ChecksumStateMachine):
    """Snapshots written by `snapshot_job` in the group's thread; the first one waits for `release`
    and then, if `restore` replaced the state meanwhile, raises as ViewsStateMachine's job does."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()
        self.restores = 0
        self.jobs = 0

    def restore(self, path: Path, meta: object) -> None:
        super().restore(path, meta)   # type: ignore[arg-type]
        self.restores += 1

    def snapshot_job(self) -> Callable[[Path], int]:
        self.jobs += 1
        first, restores, applied = self.jobs == 1, self.restores, self.applied_index
        state = (self.records, self.digest)

        def write(path: Path) -> int:
            if first:
                self.started.set()
                assert self.release.wait(WAIT_S), "the test never released the snapshot job"
                if self.restores != restores:
                    raise EpochlogError("the state was replaced by a snapshot from the leader: snapshot abandoned")
            path.write_text('{"applied": %d, "records": %d, "digest": "%s"}' % (applied, *state))
            return applied

        return write


def test_a_snapshot_overtaken_by_the_leaders_is_superseded_not_failed(tmp_path: Path) -> None:
    meta, image, leader_sm, leader_st = leader_image(tmp_path / "leader")
    log = entries(0, 150)   # the leader's entries 0..299, two offsets each

    async def main() -> None:
        sent: list[Message] = []
        storage = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
        sm = HeldJobs()
        group = RaftGroup("g", 1, storage, sm, RaftConfig(election_timeout_ticks=1000),
                          lambda dst, g, m: sent.append(m), tick_interval_ms=50, rng=random.Random(1),
                          snapshot_every_entries=SNAPSHOT_EVERY)
        group.start()
        try:
            first = log[:15]   # offsets 0..29: a snapshot is due after 20
            group.deliver(LEADER, Append(term=TERM, src=LEADER, dst=1, prev_index=-1, prev_term=0,
                                         entries=tuple(first), commit=first[-1].last_index))
            await wait(lambda: sm.applied_index == 29, "the first entries applied")
            await wait(sm.started.is_set, "the follower's own snapshot under way")
            group.deliver(LEADER, InstallSnapshot(term=TERM, src=LEADER, dst=1, meta=meta, offset=0, data=image,
                                                  done=True))
            await wait(lambda: group.snapshots.installed == 1, "the leader's snapshot installed")
            sm.release.set()
            await wait(lambda: group._snapshot_task is None, "the follower's own snapshot job ended")
            assert (group.snapshots.failed, group.snapshots.last_error) == (0, ""), group.snapshots
            assert (sm.applied_index, sm.digest) == (299, leader_sm.digest)
            nxt = entries(300, SNAPSHOT_EVERY // 2 + 1)
            group.deliver(LEADER, Append(term=TERM, src=LEADER, dst=1, prev_index=299, prev_term=TERM,
                                         entries=tuple(nxt), commit=nxt[-1].last_index))
            await wait(lambda: group.snapshots.taken == 1, "the next snapshot, from the installed state on")
            assert storage.snapshot().index == nxt[-1].last_index and group.snapshots.failed == 0
            assert group.failed is None and not group.stopped
        finally:
            sm.release.set()
            await group.close()

    asyncio.run(asyncio.wait_for(main(), 60))
    leader_st.close()
