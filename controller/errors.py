"""Errors of the controller: why a broker's request was refused (codes go on the wire as they are)."""

from __future__ import annotations

from eventlog.errors import EpochlogError


class ControllerError(EpochlogError):
    """Base of the controller's refusals."""

    code = "controller"


class ControllerStartingError(ControllerError):
    """This node leads the metadata group but its controller is still loading the registry: retry."""

    code = "controller_starting"
    retriable = True


class FencedError(ControllerError):
    """The broker's epoch is not its current one: another incarnation registered since (or it is an
    older incarnation trying to come back). This process must stop acting as that broker."""

    code = "fenced"


class StaleEpochError(ControllerError):
    """A master or sync-state-set epoch that is not the group's current one: a deposed master (or a
    report that crossed an election) cannot change anything."""

    code = "stale_epoch"


class UnknownBrokerError(ControllerError):
    """No such broker is registered (unregistered, or never was): register first."""

    code = "not_found"


class InvalidRequestError(ControllerError):
    """A request the controller can never accept as given (not the master, master not in its set...)."""

    code = "invalid_argument"
