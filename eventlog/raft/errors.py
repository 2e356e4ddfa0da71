"""Errors raised by the Raft core (all under EpochlogError)."""

from __future__ import annotations

from eventlog.errors import EpochlogError


class RaftError(EpochlogError):
    code = "raft"


class NotLeaderError(RaftError):
    """This node is not the leader; `leader_hint` is the leader it knows of (0 = unknown)."""

    code = "not_leader"
    retriable = True

    def __init__(self, node: int, leader_hint: int, term: int) -> None:
        self.node = node
        self.leader_hint = leader_hint
        self.term = term
        hint = f"try node {leader_hint}" if leader_hint else "no leader known"
        super().__init__(f"node {node} is not the leader in term {term} ({hint})")


class ProposalDroppedError(RaftError):
    """The leader cannot take the proposal now (a leadership transfer is in progress, ...)."""

    code = "proposal_dropped"
    retriable = True


class NotCaughtUpError(RaftError):
    """This replica has not applied far enough yet (a `local` read with `min_offset`): retry, or ask
    another replica."""

    code = "not_caught_up"
    retriable = True


class NotFoundError(RaftError):
    """The named entity (lease, key...) does not exist."""

    code = "not_found"


class ConfChangeError(RaftError):
    """A membership change that is not allowed now or at all; the message says why."""

    code = "conf_change"


class CompactedError(RaftError):
    """The requested index was compacted into a snapshot."""

    code = "compacted"


class UnavailableError(RaftError):
    """The requested index is beyond the log's last index."""

    code = "unavailable"


class LogRefetchingError(RaftError):
    """This node dropped part of its log (a damaged batch, eventlog/raft/runtime/repair.py) and is
    fetching it again from the leader: another member serves those offsets meanwhile."""

    code = "log_refetching"
    retriable = True
