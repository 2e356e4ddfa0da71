"""Errors the client raises: every one is an EpochlogError with the server's stable `code`."""

from __future__ import annotations

from eventlog.errors import EpochlogError
from epochlog.api import messages as p


class ClientError(EpochlogError):
    """An error reply from a node (or no node could answer). `code` is the protocol's error code."""

    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, retriable: bool | None = None,
                 leader: int = 0, leader_address: str = "") -> None:
        super().__init__(message)
        if code is not None:
            self.code = code  # type: ignore[misc]
        if retriable is not None:
            self.retriable = retriable  # type: ignore[misc]
        self.leader = leader
        self.leader_address = leader_address


class NotLeaderError(ClientError):
    code = "not_leader"
    retriable = True


class InvalidArgumentError(ClientError):
    code = "invalid_argument"


class NotFoundError(ClientError):
    code = "not_found"


class CompactedError(ClientError):
    """The offset asked for is below the log start: resync from a snapshot (the message names it)."""

    code = "compacted"


class DiskFullError(ClientError):
    """The node refused the write for lack of disk space (nothing was appended); the SDK retries it with a
    backoff until the call's timeout, as the node resumes by itself once space is freed."""

    code = "disk_full"
    retriable = True


class DeadlineExceededError(ClientError):
    code = "deadline_exceeded"
    retriable = True


class UnavailableError(ClientError):
    """No node answered (all unreachable, or no leader) before the deadline."""

    code = "unavailable"
    retriable = True


class NoAnswerError(UnavailableError):
    """A node did not answer: no reply to an attempt within its per-attempt limit, or the connection
    missed its liveness pings (it is closed). The request may or may not have been applied there; the
    SDK retries it elsewhere within the call's deadline (epochlog/client/retry.py)."""


class RejectedError(ClientError):
    """The command was committed but changed nothing: `reason` says why (version_mismatch, stale_epoch,
    not_found, already_exists, condition_failed...); `offset` is where it was committed."""

    code = "rejected"

    def __init__(self, result: p.WriteResult) -> None:
        super().__init__(f"{result.code}: {result.message} (committed at offset {result.offset}, changed nothing)")
        self.reason = result.code
        self.offset = result.offset
        self.result = result


_BY_CODE: dict[str, type[ClientError]] = {
    cls.code: cls for cls in (NotLeaderError, InvalidArgumentError, NotFoundError, CompactedError,
                              DeadlineExceededError, UnavailableError, DiskFullError)
}


def from_wire(error: p.WireError) -> ClientError:
    cls = _BY_CODE.get(error.code, ClientError)
    return cls(error.message, code=error.code, retriable=error.retriable, leader=error.leader,
               leader_address=error.leader_address)
