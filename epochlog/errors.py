"""The node's errors: rows of the one error table (eventlog/errors.py), by the names the node uses."""

from __future__ import annotations

from eventlog.errors import GroupHaltedError, InvalidArgumentError, RejectedError

__all__ = ["GroupHaltedError", "InvalidArgumentError", "RejectedError"]
