"""The call path every face shares: how a call's failure becomes the error its face reports.

Every face (native, gRPC, Kafka) reports an error by its row of the one error table
(eventlog/errors.py); what is decided here is which row: the call's own error, or
`deadline_exceeded` when the call's deadline cut it.
"""

from __future__ import annotations

from eventlog.errors import DeadlineExceededError, EpochlogError, as_error
from epochlog.api import messages as p


def call_error(exc: BaseException, *, timeout: float | None = None, deadline_passed: bool = False) -> EpochlogError:
    """The error a call ends with: its row of the table. A timeout, or a retriable error raised once the
    call's deadline passed (a wait the deadline cut: not caught up, no leader yet...), is
    `deadline_exceeded`, naming what the call was waiting for."""
    error = as_error(exc)
    if not (isinstance(exc, TimeoutError) or (deadline_passed and error.retriable)):
        return error
    waited = "" if timeout is None else f" of {timeout:.3g} s"
    detail = "" if error.code == DeadlineExceededError.code else f": {error}"
    return DeadlineExceededError(f"the deadline{waited} passed before the call completed{detail}")


def wire_error(error: EpochlogError, leader_address: str = "") -> p.WireError:
    """The native protocol's form of an error (`leader_address`: the leader's client address, if known)."""
    return p.WireError(error.code, str(error), error.retriable, error.leader_hint, leader_address)
