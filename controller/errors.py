"""The controller's refusals: rows of the one error table (eventlog/errors.py), on the wire by their codes.

A refusal is any EpochlogError (`fenced`, `stale_epoch`, `not_found`, `invalid_argument`,
`controller_starting`...); `ControllerError` names their root where the controller speaks of refusals.
"""

from __future__ import annotations

from eventlog.errors import ControllerStartingError, EpochlogError, FencedError, StaleEpochError

ControllerError = EpochlogError

__all__ = ["ControllerError", "ControllerStartingError", "FencedError", "StaleEpochError"]
