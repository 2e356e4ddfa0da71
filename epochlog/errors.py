"""Errors of the node layer (under the one hierarchy rooted at eventlog.errors.EpochlogError)."""

from __future__ import annotations

from eventlog.errors import EpochlogError
from epochlog.api import messages as p


class NodeError(EpochlogError):
    """A request the node cannot serve as asked (unknown group, bad consistency, ...)."""

    code = "invalid_argument"


class GroupHaltedError(EpochlogError):
    """The group halted on this node at a record its code cannot apply (the message names the offset, why,
    and the fix: upgrade the node, or `epochlog group skip`); another member may serve the call."""

    code = "group_halted"
    retriable = True


class RejectedError(EpochlogError):
    """The command was committed but applying it changed nothing (a failed condition, stale epoch...)."""

    code = "rejected"

    def __init__(self, result: p.WriteResult) -> None:
        self.result = result
        self.reason = result.code
        super().__init__(f"{result.code}: {result.message} (offset {result.offset})")
