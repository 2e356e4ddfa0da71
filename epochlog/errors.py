"""Errors of the node layer (under the one hierarchy rooted at eventlog.errors.EpochlogError)."""

from __future__ import annotations

from eventlog.errors import EpochlogError
from epochlog import protocol as p


class NodeError(EpochlogError):
    """A request the node cannot serve as asked (unknown group, bad consistency, ...)."""

    code = "invalid_argument"


class RejectedError(EpochlogError):
    """The command was committed but applying it changed nothing (a failed condition, stale epoch...)."""

    code = "rejected"

    def __init__(self, result: p.WriteResult) -> None:
        self.result = result
        self.reason = result.code
        super().__init__(f"{result.code}: {result.message} (offset {result.offset})")
