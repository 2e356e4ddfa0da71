"""A follower takes from the appends it steps together only what its log can store without a roll that
waits for the next segment's preparation.

One real `RaftGroup` (node 1, a follower) on a real log of 4 KiB segments whose next segment's file is
prepared in the background; the test plays the leader (node 2). `os.posix_fallocate` of this process is
held, then fails with ENOSPC, from the moment the test says so: the next segment is "still being prepared,
and will fail", the state in which the group must drop what does not fit (the leader sends it again) rather
than roll into the preparation, whose failure would stop the group (tests/eventlog/raft/runtime/
test_disk_faults.py runs the same over real processes). Two appends delivered together, each fitting the
active segment alone but not both: the first is stored and acknowledged, the second dropped, the group
goes on. (It stepped both: each was checked against the log as it was before either was written.)
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
from pathlib import Path

import pytest

from bench.raft_node import ChecksumStateMachine
from eventlog.config import LogConfig
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import AppendResp, Message
from tests.eventlog.raft.runtime.test_follower_sync import CONF, LEADER, append, entry, run, wait

SEGMENT_BYTES = 4096
VALUE_BYTES = 1300   # a batch of ~1,375 bytes: two fit the segment after the roll, three do not


class Fallocate:
    """`os.posix_fallocate`, held and then failing with ENOSPC once `fail_next` is set."""

    def __init__(self) -> None:
        self.fail_next = False
        self.held = threading.Event()      # a failing call waits in it
        self.release = threading.Event()
        self._real = os.posix_fallocate

    def __call__(self, fd: int, offset: int, length: int) -> None:
        if self.fail_next:
            self.held.set()
            assert self.release.wait(20), "the test never released the held preparation"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real(fd, offset, length)


def test_appends_stepped_together_that_need_a_roll_the_log_cannot_make_yet_are_dropped_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fallocate = Fallocate()
    monkeypatch.setattr(os, "posix_fallocate", fallocate)

    async def main() -> None:
        cfg = LogConfig(segment_bytes=SEGMENT_BYTES, flush_policy="group")
        storage = LogStorage.open(tmp_path / "f", cfg, CONF)
        acks: list[int] = []

        def send(dst: int, group: str, m: Message) -> None:
            if isinstance(m, AppendResp) and not m.reject:
                acks.append(m.index)

        group = RaftGroup("g", 1, storage, ChecksumStateMachine(), RaftConfig(election_timeout_ticks=1000), send,
                          tick_interval_ms=50, rng=random.Random(1))
        log = storage.log
        group.start()
        try:
            await wait(lambda: log.room(SEGMENT_BYTES) is True, "the next segment prepared")
            for i in range(3):   # entries 0-1 fill the first segment, entry 2 rolls into the prepared one
                if i == 2:
                    fallocate.fail_next = True   # the preparation the roll asks for is held, then fails
                group.deliver(LEADER, append(i - 1, entry(i, VALUE_BYTES)))
                await wait(lambda i=i: max(acks, default=-1) == i, f"the ack of entry {i}")
            await asyncio.get_running_loop().run_in_executor(None, fallocate.held.wait, 20)
            assert log.space_error is None and log.room(SEGMENT_BYTES) is False, "the next segment is being prepared"
            assert log.room(2 * (VALUE_BYTES + 100)) is False and log.room(VALUE_BYTES + 100) is True

            # Both in the inbox before the loop turns: each fits the active segment alone, not both.
            group.deliver(LEADER, append(2, entry(3, VALUE_BYTES)))
            group.deliver(LEADER, append(3, entry(4, VALUE_BYTES)))
            threading.Timer(0.5, fallocate.release.set).start()   # a roll would wait for it, then fail
            await wait(lambda: max(acks, default=-1) >= 3 or group.stopped, "entry 3 acknowledged")
            assert not group.stopped, f"the group stopped: {group.failed!r}"
            assert max(acks) == 3, "entry 4 needed the segment still being prepared: dropped, not acknowledged"
            assert group.counters.appends_dropped == 1
            await wait(lambda: log.space_error is not None, "the preparation failed")
            group.deliver(LEADER, append(3, entry(4, VALUE_BYTES)))   # the leader sends it again: refused
            await wait(lambda: group.counters.appends_dropped == 2 or group.stopped, "the resend dropped")
            assert not group.stopped and max(acks) == 3 and group.counters.appends_dropped == 2
        finally:
            fallocate.release.set()
            await group.close()

    run(main)
