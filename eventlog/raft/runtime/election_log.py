"""The log lines that make every election diagnosable: who campaigned, why, and how it ended.

The core reports the facts (`Ready.elections`: eventlog/raft/node.py); this module turns them into
lines of the logger `eventlog.raft.runtime.election_log`, with ticks as milliseconds and the wall-clock
time since a peer's latest message (which ticks do not see when the loop stalls). The line that a
node leads (`group G: node N leads in term T`) is the Ready loop's.

- INFO `group G: node N starts a pre-vote for term T: <reason>` and `... campaigns in term T: <reason>`,
  the reason being `election timeout` (with how long the node heard nothing from its leader, its timeout
  and the wall-clock time since the leader's latest message), `leadership transfer (TimeoutNow from
  node L)` or `requested`; an election after a won pre-vote says who granted it. A node that cannot
  reach anyone campaigns every timeout: after the first campaign since it last heard from a leader,
  only the 2nd, 4th, 8th... (and their outcomes) are logged.
- INFO `group G: node N lost the pre-vote for term T (...)` / `lost the election in term T (...)`
  (a won election is the `leads in term` line).
- WARNING `group G: node N steps down as leader in term T: heard from only ... (check-quorum)`, INFO
  for the other step-downs (a message of a later term, its own removal).
- INFO `group G: node N votes for node C in term T` / `refuses its vote to node C in term T: why`,
  for vote requests of a term above the node's own: a vote is granted at most once per term, and at most
  one refusal per term is logged.

Steady state (a leader heartbeating its followers) logs nothing. Call only from the group's loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from eventlog.raft.node import (
    CampaignLost,
    CampaignReason,
    CampaignStarted,
    ElectionEvent,
    StepDownReason,
    SteppedDown,
    VoteCast,
)

logger = logging.getLogger(__name__)


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in ids) or "none"


def _logged_attempt(attempt: int) -> bool:
    """The 1st, 2nd, 4th, 8th... campaign since the node last heard from a leader."""
    return attempt & (attempt - 1) == 0


class ElectionLog:
    """Logs one group's election events on this node (see the module docstring)."""

    def __init__(self, name: str, node_id: int, tick_interval: float, heard_at: Mapping[int, float],
                 ticked_at: Callable[[], float]) -> None:
        self.name = name
        self.node_id = node_id
        self.tick_interval = tick_interval
        self._heard_at = heard_at    # peer -> loop time of its latest message
        # The loop time of the latest tick: a timeout or a check-quorum happened then (a stalled loop
        # may hand the Ready to this log much later, after messages that came meanwhile).
        self._ticked_at = ticked_at
        self._refusal_said_term = 0   # refusals: one line per term (a vote is granted once per term)
        self._campaign_said = True   # the latest campaign's start was logged (so is its outcome)

    def report(self, events: Iterable[ElectionEvent]) -> None:
        for event in events:
            if isinstance(event, CampaignStarted):
                self._started(event)
            elif isinstance(event, CampaignLost):
                if self._campaign_said:
                    logger.info("group %s: node %s lost the %s (granted by %s; refused by %s)", self.name,
                                self.node_id, f"pre-vote for term {event.term}" if event.pre_vote
                                else f"election in term {event.term}", _ids(event.granted), _ids(event.refused))
            elif isinstance(event, SteppedDown):
                self._stepped_down(event)
            elif event.granted or event.term > self._refusal_said_term:   # VoteCast
                if not event.granted:
                    self._refusal_said_term = event.term
                self._vote(event)

    def _ms(self, ticks: int) -> str:
        return f"{ticks * self.tick_interval * 1000:.0f} ms ({ticks} ticks)"

    def _before_tick(self, peer: int) -> str:
        at = self._heard_at.get(peer)
        if at is None:
            return "never"
        ms = (self._ticked_at() - at) * 1000
        return f"{ms:.0f} ms before that tick" if ms >= 0 else f"{-ms:.0f} ms after that tick"

    def _started(self, e: CampaignStarted) -> None:
        self._campaign_said = bool(e.pre_vote_granted) or _logged_attempt(e.attempt) or \
            e.reason is not CampaignReason.TIMEOUT
        if not self._campaign_said:
            return
        if e.reason is CampaignReason.TRANSFER:
            why = f"leadership transfer (TimeoutNow from node {e.transfer_from})"
        elif e.reason is CampaignReason.REQUESTED:
            why = "requested"
        elif e.leader == self.node_id:
            why = f"election timeout: it stopped leading {self._ms(e.silent_ticks)} ago, timeout {self._ms(e.timeout_ticks)}"
        elif e.leader:
            why = (f"election timeout: no message from leader {e.leader} for {self._ms(e.silent_ticks)}, "
                   f"timeout {self._ms(e.timeout_ticks)}; wall clock: its latest message of any kind arrived "
                   f"{self._before_tick(e.leader)}")
        else:
            why = f"election timeout: no leader heard from since this node started, timeout {self._ms(e.timeout_ticks)}"
        if e.attempt > 1:
            why += f"; campaign {e.attempt} since it last heard from a leader"
        if e.pre_vote:
            logger.info("group %s: node %s starts a pre-vote for term %s: %s", self.name, self.node_id, e.term, why)
        elif e.pre_vote_granted:
            logger.info("group %s: node %s campaigns in term %s (pre-vote granted by %s): %s", self.name,
                        self.node_id, e.term, _ids(e.pre_vote_granted), why)
        else:
            logger.info("group %s: node %s campaigns in term %s: %s", self.name, self.node_id, e.term, why)

    def _stepped_down(self, e: SteppedDown) -> None:
        if e.reason is StepDownReason.CHECK_QUORUM:
            silent = "; ".join(
                f"node {v} {'none in this term' if ticks < 0 else self._ms(ticks) + ' ago'} (wall clock: its latest "
                f"message of any kind arrived {self._before_tick(v)})" for v, ticks in e.last_heard)
            logger.warning("group %s: node %s steps down as leader in term %s: heard from only %s of voters %s "
                           "within the election timeout, %s (check-quorum); latest answers: %s", self.name,
                           self.node_id, e.term, _ids(e.heard_from), _ids(e.voters), self._ms(e.timeout_ticks),
                           silent)
        elif e.reason is StepDownReason.HIGHER_TERM:
            logger.info("group %s: node %s steps down as leader in term %s: %s of term %s from node %s", self.name,
                        self.node_id, e.term, e.message, e.new_term, e.src)
        else:
            logger.info("group %s: node %s steps down as leader in term %s: its removal from the group is committed",
                        self.name, self.node_id, e.term)

    def _vote(self, e: VoteCast) -> None:
        if e.granted:
            logger.info("group %s: node %s votes for node %s in term %s", self.name, self.node_id, e.candidate, e.term)
        else:
            logger.info("group %s: node %s refuses its vote to node %s in term %s: %s", self.name, self.node_id,
                        e.candidate, e.term, e.refusal)
