"""A tick wakes a group's Ready loop only when it left the loop something to do.

One real `RaftGroup` (node 1) on a real log, ticking every 5 ms, fed by a leader the test plays (node 2):

- as a follower that heard from its leader, ticks that change nothing run no turn of the Ready loop
  (each used to: an empty turn, 20 a second for every group a node follows);
- once its leader goes quiet, a tick's election timeout still wakes the loop: it campaigns (its vote
  requests leave).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.raft_node import ChecksumStateMachine
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.ready_loop import ReadyLoop
from eventlog.raft.types import Message, PreVote
from tests.eventlog.raft.runtime.test_follower_sync import CFG, CONF, LEADER, append, entry, run, wait


def test_ticks_that_change_nothing_run_no_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    turns: list[int] = []
    release = ReadyLoop._release_persisted

    def counted(self: ReadyLoop) -> None:   # the first thing of every turn (and after every Ready)
        turns.append(self.node.ticks)
        release(self)

    monkeypatch.setattr(ReadyLoop, "_release_persisted", counted)
    sent: list[Message] = []

    async def main() -> None:
        storage = LogStorage.open(tmp_path / "f", CFG, CONF)
        group = RaftGroup("g", 1, storage, ChecksumStateMachine(), RaftConfig(election_timeout_ticks=40),
                          lambda dst, g, m: sent.append(m), tick_interval_ms=5, rng=random.Random(1))
        group.start()
        try:
            group.deliver(LEADER, append(-1, entry(0)))
            await wait(lambda: storage.log.durable_offset == 1 and group.node.leader == LEADER, "entry 0 taken")
            quiet_from = group.node.ticks
            turns.clear()
            await wait(lambda: group.node.ticks >= quiet_from + 20, "20 ticks")
            assert [t for t in turns if t < quiet_from + 20] == [], "ticks that changed nothing woke the loop"
            await wait(lambda: any(isinstance(m, PreVote) for m in sent), "a campaign once the leader went quiet")
        finally:
            await group.close()

    run(main)
