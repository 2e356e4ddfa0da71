"""The controller as a sans-IO state machine: registry + heartbeat clocks + decisions.

`ControllerCore` is what runs on the metadata group's leader, minus the IO. The runtime
(controller.runtime) feeds it heartbeats (`heartbeat`, answered at once, never logged), asks it
what time has decided (`due`: fences for brokers past their timeout, unfences for fenced brokers
heard from again), has it `decide` commands into events, commits them, and hands back what the
views hold afterwards (`refresh`). The deterministic simulation in tests/controller drives the
very same class with a fake clock.

`decide` applies its own events to the registry at once (optimistically, with the applier's
rules), so the next command of the same batch sees them; after each command it gives every group
the command touched a master if it needs one (controller.decisions.elect). A new core starts every
broker's clock in full: the grace period of a new controller (controller.liveness).

Not thread-safe; time is the caller's monotonic clock in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller import decisions as d
from controller.config import ControllerConfig
from controller.errors import ControllerError
from controller.liveness import Liveness
from controller.registry import Registry, broker_key, group_key, group_key_of
from eventlog.errors import FENCED, NOT_FOUND
from statemachines import events as ev
from statemachines.state import BrokerState, GroupState

# heartbeat answers: OK, FENCED (another incarnation holds the name: stop), NOT_FOUND (not registered
# any more: register again)
OK = ""


@dataclass(frozen=True, slots=True)
class Register:
    cluster: str
    group: str
    name: str
    address: str
    incarnation: str


@dataclass(frozen=True, slots=True)
class Fence:
    key: str
    broker_epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class Unfence:
    key: str
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class AlterSyncStateSet:
    cluster: str
    group: str
    name: str
    broker_epoch: int
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Shutdown:
    cluster: str
    group: str
    name: str
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class Reconcile:
    """Give the group a master if it needs one (a new controller checks every group)."""

    group_key: str


Command = Register | Fence | Unfence | AlterSyncStateSet | Shutdown | Reconcile


class _Clocks:
    """The liveness at one moment, as decisions see it."""

    __slots__ = ("liveness", "now")

    def __init__(self, liveness: Liveness, now: float) -> None:
        self.liveness = liveness
        self.now = now

    def alive(self, key: str) -> bool:
        return self.liveness.alive(key, self.now)

    def offset(self, key: str) -> int:
        return self.liveness.offset(key)


class ControllerCore:
    """See the module docstring."""

    def __init__(self, config: ControllerConfig, registry: Registry, now: float) -> None:
        self.config = config
        self.registry = registry
        self.liveness = Liveness(config.timeout_s)
        for key, broker in registry.brokers.items():
            self.liveness.track(key, broker.broker_epoch, broker.fenced, now)
        self._unfence: dict[str, int] = {}

    # --- heartbeats (the hot path: no allocation beyond the answer) -------------------------------

    def heartbeat(self, key: str, broker_epoch: int, offset: int, now: float) -> str:
        """One heartbeat: OK, FENCED or NOT_FOUND. A fenced broker heard from is unfenced by `due`."""
        clock = self.liveness.clocks.get(key)
        if clock is None or clock.epoch != broker_epoch:
            broker = self.registry.brokers.get(key)
            if broker is None:
                return NOT_FOUND
            if broker.broker_epoch != broker_epoch:
                return FENCED
            clock = self.liveness.track(key, broker_epoch, broker.fenced, now)
        clock.deadline = now + self.liveness.timeout_s
        clock.last_beat = now
        if offset >= 0:
            clock.offset = offset
        if clock.fenced:
            self._unfence[key] = broker_epoch
        return OK

    @property
    def unfence_pending(self) -> bool:
        return bool(self._unfence)

    def due(self, now: float) -> list[Command]:
        """What time decided since the last call: fences of silent brokers, unfences of returning ones."""
        commands: list[Command] = [Unfence(k, e) for k, e in self._unfence.items()]
        self._unfence.clear()
        commands += [Fence(k, e, "heartbeat timeout") for k, e in self.liveness.expired(now)]
        return commands

    def reconcile_all(self) -> list[Command]:
        return [Reconcile(k) for k in sorted(self.registry.groups)]

    # --- decisions --------------------------------------------------------------------------------

    def decide(self, command: Command, now: float, next_offset: int) -> d.Decision:
        """The events for `command` (applied to the registry already), or its refusal.

        `next_offset`: the earliest offset the first event can be committed at (broker epochs)."""
        clocks = _Clocks(self.liveness, now)
        reg = self.registry
        unclean = self.config.unclean_election
        touched: str | None = None
        if isinstance(command, Register):
            decision = d.register(reg, command.cluster, command.group, command.name, command.address,
                                  command.incarnation, next_offset)
            touched = group_key(command.cluster, command.group)
        elif isinstance(command, Fence):
            decision = d.fence(reg, command.key, command.broker_epoch, command.reason)
            touched = _group_of(reg, command.key)
        elif isinstance(command, Unfence):
            decision = d.unfence(reg, command.key, command.broker_epoch)
            touched = _group_of(reg, command.key)
        elif isinstance(command, AlterSyncStateSet):
            decision = d.alter_sync_state_set(reg, command.cluster, command.group, command.name,
                                              command.broker_epoch, command.master_epoch,
                                              command.sync_state_set_epoch, command.sync_state_set, clocks)
        elif isinstance(command, Shutdown):
            decision = d.shutdown(reg, command.cluster, command.group, command.name, command.broker_epoch, clocks,
                                  unclean=unclean)
            touched = group_key(command.cluster, command.group)
        else:
            decision = d.NOTHING
            touched = command.group_key
        if decision.error is not None:
            return decision
        events = list(decision.events)
        self._apply(events, next_offset, now)
        if touched is not None:
            more = d.elect(reg, touched, clocks, unclean=unclean).events
            self._apply(more, next_offset + len(events), now)
            events += more
        return d.Decision(tuple(events))

    def _apply(self, events: list[ev.Event] | tuple[ev.Event, ...], first_offset: int, now: float) -> None:
        for i, event in enumerate(events):
            ok, code = self.registry.apply(event, first_offset + i)
            assert ok, f"the controller decided an event its own registry rejects ({code}): {event!r}"
            if isinstance(event, ev.BrokerRegistered | ev.BrokerFenced | ev.BrokerUnfenced | ev.BrokerUnregistered):
                self._sync_clock(event.key(), now)

    # --- the views' word after a commit ------------------------------------------------------------

    def refresh_broker(self, key: str, state: BrokerState | None, now: float) -> None:
        self.registry.put_broker(key, state)
        self._sync_clock(key, now)

    def refresh_group(self, key: str, state: GroupState | None) -> None:
        self.registry.put_group(key, state)

    def _sync_clock(self, key: str, now: float) -> None:
        broker = self.registry.brokers.get(key)
        clock = self.liveness.clocks.get(key)
        if broker is None:
            self.liveness.forget(key)
            self._unfence.pop(key, None)
        elif clock is None or clock.epoch != broker.broker_epoch:
            self.liveness.track(key, broker.broker_epoch, broker.fenced, now)   # a new registration
        else:
            self.liveness.set_fenced(key, broker.fenced, now)
            if not broker.fenced:
                self._unfence.pop(key, None)

    # --- answers ----------------------------------------------------------------------------------

    def broker(self, cluster: str, group: str, name: str) -> BrokerState | None:
        return self.registry.brokers.get(broker_key(cluster, group, name))

    def group(self, cluster: str, group: str) -> GroupState | None:
        return self.registry.groups.get(group_key(cluster, group))


def _group_of(reg: Registry, key: str) -> str | None:
    broker = reg.brokers.get(key)
    return None if broker is None else group_key_of(broker)


__all__ = ["AlterSyncStateSet", "Command", "ControllerCore", "ControllerError", "FENCED", "Fence", "NOT_FOUND",
           "OK", "Reconcile", "Register", "Shutdown", "Unfence"]
