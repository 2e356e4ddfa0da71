"""The errors Raft raises: rows of the one error table (eventlog/errors.py), by the names Raft uses."""

from __future__ import annotations

from eventlog.errors import (
    CompactedError,
    ConfChangeError,
    LogRefetchingError,
    NotCaughtUpError,
    NotFoundError,
    NotLeaderError,
    ProposalDroppedError,
    RaftError,
    UnavailableError,
)

__all__ = ["CompactedError", "ConfChangeError", "LogRefetchingError", "NotCaughtUpError", "NotFoundError",
           "NotLeaderError", "ProposalDroppedError", "RaftError", "UnavailableError"]
