"""Every election is diagnosable from a node's log: who campaigned, why, and how it ended.

One real `RaftGroup` (node 1) on a real log, ticking every 5 ms (election timeout 40 ticks), fed by
peers the test plays (node 2 leads term 3 at first, node 3 answers votes). Its log
(eventlog/raft/runtime/election_log.py) must say:

- nothing while its leader is heard from (steady state: no line per heartbeat);
- once the leader goes quiet: a pre-vote for term 4 on election timeout, naming the silent leader and
  for how long; the election after node 3 grants it, naming the grant; node 1 leading; then, with no
  follower answering, its check-quorum step-down, naming whom it heard from;
- on a TimeoutNow: an election by leadership transfer, naming the node that sent it;
- a vote request of a later term: the vote granted, or refused with the reason.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from bench.raft_node import ChecksumStateMachine
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import Heartbeat, Message, PreVote, PreVoteResp, TimeoutNow, Vote, VoteResp
from tests.eventlog.raft.runtime.test_follower_sync import CFG, CONF, LEADER, TERM, append, entry, run, wait

ELECTION_LOG = "eventlog.raft.runtime.election_log"
ELECTION_TIMEOUT_TICKS = 40   # 200-400 ms: a loaded machine's scheduling gaps do not make an election


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ELECTION_LOG]


def _group(path: Path, sent: list[Message]) -> tuple[RaftGroup, LogStorage]:
    storage = LogStorage.open(path, CFG, CONF)
    group = RaftGroup("g", 1, storage, ChecksumStateMachine(), RaftConfig(election_timeout_ticks=ELECTION_TIMEOUT_TICKS),
                      lambda dst, g, m: sent.append(m), tick_interval_ms=5, rng=random.Random(1))
    return group, storage


def test_a_timeout_election_and_a_check_quorum_step_down_say_why(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    sent: list[Message] = []

    async def main() -> None:
        group, storage = _group(tmp_path / "n1", sent)
        group.start()
        try:
            group.deliver(LEADER, append(-1, entry(0)))
            await wait(lambda: storage.log.durable_offset == 1 and group.node.leader == LEADER, "entry 0 taken")
            start = group.node.ticks
            while group.node.ticks < start + 3 * ELECTION_TIMEOUT_TICKS:   # heartbeats: nothing to say
                group.deliver(LEADER, Heartbeat(term=TERM, src=LEADER, dst=1, commit=0))
                tick = group.node.ticks
                await wait(lambda: group.node.ticks >= tick + 2, "two ticks")
            assert _lines(caplog) == [], "steady state logged election lines"
            assert group.node.term == TERM

            await wait(lambda: any(isinstance(m, PreVote) for m in sent), "a pre-vote once the leader went quiet")
            [pre] = _lines(caplog)
            assert pre.startswith(f"group g: node 1 starts a pre-vote for term {TERM + 1}: election timeout: "
                                  f"no message from leader {LEADER} for "), pre
            assert "wall clock: its latest message of any kind arrived" in pre, pre

            group.deliver(3, PreVoteResp(term=TERM + 1, src=3, dst=1, granted=True))
            await wait(lambda: any(isinstance(m, Vote) for m in sent), "the election after the pre-vote")
            campaign = _lines(caplog)[1]
            assert campaign.startswith(f"group g: node 1 campaigns in term {TERM + 1} (pre-vote granted by 3): "
                                       f"election timeout: no message from leader {LEADER}"), campaign

            group.deliver(3, VoteResp(term=TERM + 1, src=3, dst=1, granted=True))
            await wait(lambda: group.node.role.value == "leader", "node 1 to lead")
            # Nobody answers its heartbeats: check-quorum steps it down within two election timeouts.
            def down() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.name == ELECTION_LOG and "steps down" in r.getMessage()]
            await wait(lambda: bool(down()), "the check-quorum step-down")
            assert group.node.role.value == "follower" and group.node.term == TERM + 1
            [line] = down()
            assert line.levelno == logging.WARNING, line
            assert line.getMessage().startswith(
                f"group g: node 1 steps down as leader in term {TERM + 1}: heard from only 1 of voters 1, 2, 3 "
                f"within the election timeout, 200 ms (40 ticks) (check-quorum); latest answers: node 2 none in "
                f"this term (wall clock: its latest message of any kind arrived "), line.getMessage()
            assert "; node 3 none in this term" in line.getMessage(), line.getMessage()
        finally:
            await group.close()

    run(main)


def test_a_transfer_and_votes_say_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    sent: list[Message] = []

    async def main() -> None:
        group, storage = _group(tmp_path / "n1", sent)
        group.start()
        try:
            group.deliver(LEADER, append(-1, entry(0)))
            await wait(lambda: storage.log.durable_offset == 1 and group.node.leader == LEADER, "entry 0 taken")
            group.deliver(LEADER, TimeoutNow(term=TERM, src=LEADER, dst=1))
            await wait(lambda: any(isinstance(m, Vote) for m in sent), "the election the transfer starts")
            assert _lines(caplog) == [f"group g: node 1 campaigns in term {TERM + 1}: leadership transfer "
                                      f"(TimeoutNow from node {LEADER})"]

            # Node 3's request for a later term: granted (node 1's own election is lost with it).
            caplog.clear()
            group.deliver(3, Vote(term=TERM + 2, src=3, dst=1, last_index=0, last_term=TERM))
            await wait(lambda: group.node.vote == 3, "the vote for node 3")
            assert _lines(caplog) == [f"group g: node 1 votes for node 3 in term {TERM + 2}"]
            # Node 2's, for a later term still, with a log that lacks entry 0: refused, and said why.
            caplog.clear()
            group.deliver(LEADER, Vote(term=TERM + 3, src=LEADER, dst=1, last_index=-1, last_term=0))
            await wait(lambda: group.node.term == TERM + 3 and group.node.has_ready() is False and _lines(caplog),
                       "the refusal")
            assert _lines(caplog) == [f"group g: node 1 refuses its vote to node {LEADER} in term {TERM + 3}: its "
                                      f"log (last 0/-1) is behind ours ({TERM}/0)"]
        finally:
            await group.close()

    run(main)
