"""The errors the SDK raises: rows of the one error table (eventlog/errors.py), as the server raises them.

An error reply becomes the class that names its code (`from_wire`); the SDK raises the same classes
for what it finds itself (no node answered, a deadline passed). `ClientError` is the SDK's name for
the table's root, `EpochlogError`: catching it catches every one.
"""

from __future__ import annotations

from eventlog.errors import (
    AuthenticationError,
    CompactedError,
    DeadlineExceededError,
    DiskFullError,
    EpochlogError,
    InvalidArgumentError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
    PermissionDeniedError,
    RejectedError,
    UnavailableError,
    from_code,
)
from epochlog.api import messages as p

ClientError = EpochlogError


class NoAnswerError(UnavailableError):
    """A node did not answer: no reply to an attempt within its per-attempt limit, or the connection
    missed its liveness pings (it is closed). The request may or may not have been applied there; the
    SDK retries it elsewhere within the call's deadline (epochlog/client/retry.py)."""


def from_wire(error: p.WireError) -> EpochlogError:
    """The error of a reply: the class that names its code, with the reply's message, flag and leader."""
    return from_code(error.code, error.message, retriable=error.retriable, leader_hint=error.leader,
                     leader_address=error.leader_address)


__all__ = ["AuthenticationError", "ClientError", "CompactedError", "DeadlineExceededError", "DiskFullError",
           "InvalidArgumentError", "NoAnswerError", "NotFoundError", "NotLeaderError", "OutcomeUnknownError",
           "PermissionDeniedError", "RejectedError", "UnavailableError", "from_wire"]
