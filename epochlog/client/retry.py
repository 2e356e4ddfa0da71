"""How the SDK spends one call's deadline over attempts on several nodes (sans-IO: no sockets, no loop).

Theory of operation. A call has one deadline (the client's `timeout`); `AsyncClient._call` spends it
in attempts, each on one node, until one answers or the deadline passes. A node may stop answering
while its connection stays open: stopped (SIGSTOP, a long GC or swap), or cut off from its peers
while its client port is reachable. Its group then elects a new leader within a few election
timeouts, and the call must move there instead of waiting on the old one for the whole deadline.
Everything here is derived from the cluster's base election timeout E (`ServerHello.election_timeout_ms`;
a follower campaigns after [E, 2E) without hearing from its leader):

- `attempt_s` (2E, at least 1 s): an attempt without an answer by then is abandoned, and the call
  moves to the other members, which by then answer `not_leader` naming the new leader if the node
  was really cut off; unless the node says (a status call, answered from memory) that it still
  leads the group: a leader cut off from its peers steps down within one or two E (check-quorum),
  one that still leads is slow, not stuck, and is waited for (asked again every E) rather than sent
  the request twice. The limit doubles for the call's next attempts.
- `ping_after_s` (E/2) and `ping_timeout_s` (E, at least 0.5 s): a connection with calls pending
  that has received nothing for `ping_after_s` sends a `ping` (answered by the node's loop without
  Raft); receiving nothing for `ping_timeout_s` after it marks the connection dead, and its pending
  calls fail with `NoAnswerError` (retried elsewhere). No pings while nothing is pending or while
  replies keep arriving.
- `suspect_s` (2E, at least 1 s): a node that did not answer (or could not be connected to) is
  avoided for that long, redirects to it included, unless every member is suspect.

`Attempts` records, for one call, whether any attempt may have reached a node that could have
proposed it ("in doubt"). Client sessions (exactly-once writes) need it: a write whose earlier
attempt is in doubt must not be re-sent under a new session.
"""

from __future__ import annotations

from dataclasses import dataclass

from epochlog.client.errors import ClientError
from eventlog.errors import (BatchTooLargeError, DiskFullError, InvalidArgumentError, NotCaughtUpError,
                             NotLeaderError)

DEFAULT_ELECTION_TIMEOUT_MS = 1000   # assumed for a node that does not say (before ServerHello had the field)

# Answers that prove the request was refused before anything was proposed: a follower's not_leader
# (checked before proposing, and again when the proposal is taken), a full disk (refused before the
# log), a request the node cannot accept as given, a batch over the limit, a replica not caught up
# (reads). Every other error after sending leaves the request's fate unknown.
NOT_PROPOSED = frozenset(cls.code for cls in (NotLeaderError, DiskFullError, InvalidArgumentError, BatchTooLargeError,
                                               NotCaughtUpError))


@dataclass(frozen=True, slots=True)
class Timing:
    """The SDK's waits on one node, from the cluster's base election timeout (see the module docstring)."""

    election_timeout_s: float

    @classmethod
    def from_hello(cls, election_timeout_ms: int) -> Timing:
        """From `ServerHello.election_timeout_ms` (0: a node that does not say, `DEFAULT_ELECTION_TIMEOUT_MS`)."""
        return cls((election_timeout_ms if election_timeout_ms > 0 else DEFAULT_ELECTION_TIMEOUT_MS) / 1000)

    @property
    def attempt_s(self) -> float:
        return max(1.0, 2 * self.election_timeout_s)

    @property
    def ping_after_s(self) -> float:
        return max(0.05, self.election_timeout_s / 2)

    @property
    def ping_timeout_s(self) -> float:
        return max(0.5, self.election_timeout_s)

    @property
    def suspect_s(self) -> float:
        return max(1.0, 2 * self.election_timeout_s)

    @property
    def backoff_max_s(self) -> float:
        """The longest pause between rounds of attempts (while no member knows a leader)."""
        return min(0.5, max(0.05, self.election_timeout_s / 4))


@dataclass(slots=True)
class Attempts:
    """What the attempts of one call did; pass one to `AsyncClient._call`, read it after it returns or raises.

    `sent`: attempts whose request was handed to a connection. `in_doubt`: some attempt may have
    reached a node that could have proposed the request (no answer within its limit, the connection
    lost with it outstanding, `deadline_exceeded`, `proposal_dropped`, `group_halted`, a cancelled
    call...). Refusals that prove nothing was proposed (`NOT_PROPOSED`: a follower's `not_leader`,
    `disk_full`) and connections that failed to open leave it False. A write answered after an
    in-doubt attempt was still applied once (its request id is deduplicated); the flag matters when
    the call fails, or when its answer is one the retry alone could earn.
    """

    sent: int = 0
    in_doubt: bool = False

    def settle(self, error: BaseException | None) -> None:
        """Record how a sent attempt ended: None for a result, else the error it ended with."""
        if error is not None and fate_unknown(error):
            self.in_doubt = True


def fate_unknown(error: BaseException) -> bool:
    """Whether a request that was sent and then ended with `error` may have been proposed."""
    return not (isinstance(error, ClientError) and error.code in NOT_PROPOSED)
