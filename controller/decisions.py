"""The controller's decisions: pure functions from the registry (and the brokers' liveness) to events.

Nothing here writes anything: each function returns the events to append (in order) or the error
to answer, and the runtime commits them. Every event carries the epochs it was decided under, so
the applier rejects it on every replica alike if the registry moved on in between (a deposed
controller's or a deposed master's decision changes nothing).

The rules (RocketMQ 5 controller mode, KRaft's broker lifecycle):

- register: a broker is (cluster, group, name) plus an incarnation id, which names one process
  run and sorts by its start (`statemachines.brokers.new_incarnation`). The same incarnation registering again changes
  nothing (a retry). A newer one replaces the registration with a higher broker epoch, so the
  previous process is fenced: its heartbeats and reports carry a stale epoch. An older one is
  refused (`FencedError`). Broker epochs are taken from the log's next offset (KRaft uses the
  registration record's offset), so they only grow, even across unregistration. A broker keeps its
  id for as long as its name is known in the group; a new name gets 0 in an empty group, else one
  above every id the group has used (its brokers, its master, its SyncStateSet).
- elect: a group needs a new master when its master is -1, fenced, leaving, or no longer
  registered. Eligible: the live (unfenced, heard from within the timeout) members of the
  SyncStateSet; a group that never had a master (master epoch 0) takes any live broker (the first
  broker of a group becomes its master); with `unclean` any live broker when no in-sync one is.
  The highest replicated offset wins (the last heartbeat's), then the lowest id. The new master's
  SyncStateSet is itself alone (it expands it as replicas catch up). No eligible broker: the group
  gets master -1 and keeps its SyncStateSet, so the first in-sync broker to come back is elected.
- alter_sync_state_set: only the group's current master, at its current broker epoch, with the
  group's current master epoch and SyncStateSet epoch; the set keeps the master; a broker added to
  it must be live.
- shutdown: a master hands mastership over first (an election without it), then it is fenced.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from controller.errors import ControllerError, FencedError, StaleEpochError
from eventlog.errors import InvalidArgumentError, NotFoundError
from controller.registry import Registry, broker_key, group_key
from statemachines import events as ev
from statemachines.state import BrokerState, GroupState

ACTOR = "epochlog/controller"


class Clocks(Protocol):
    """What decisions need of the brokers' liveness (controller.liveness, bound to a moment)."""

    def alive(self, key: str) -> bool: ...

    def offset(self, key: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The events to append, in order (possibly none), or why the request is refused."""

    events: tuple[ev.Event, ...] = ()
    error: ControllerError | None = None


NOTHING = Decision()


def _refuse(error: ControllerError) -> Decision:
    return Decision((), error)


def _check_broker(reg: Registry, key: str, broker_epoch: int) -> BrokerState | ControllerError:
    broker = reg.brokers.get(key)
    if broker is None:
        return NotFoundError(f"{key} is not registered")
    if broker.broker_epoch != broker_epoch:
        return FencedError(f"{key} is at broker epoch {broker.broker_epoch}, not {broker_epoch}: another "
                           f"incarnation registered since")
    return broker


# --- registration ---------------------------------------------------------------------------------

def register(reg: Registry, cluster: str, group: str, name: str, address: str, incarnation: str,
             next_offset: int) -> Decision:
    """Register one broker; `next_offset`: the offset the first event will get at the earliest."""
    key = broker_key(cluster, group, name)
    current = reg.brokers.get(key)
    gstate = reg.groups.get(group_key(cluster, group))
    if current is not None:
        if incarnation == current.incarnation and address == current.address:
            return NOTHING   # a retry of a registration that succeeded: nothing to change
        if incarnation < current.incarnation:
            return _refuse(FencedError(f"{key}: incarnation {incarnation!r} is older than the registered "
                                       f"{current.incarnation!r}"))
        broker_id = current.broker_id
    elif gstate is not None and name in gstate.brokers:
        broker_id = gstate.brokers[name]
    else:
        broker_id = _next_id(gstate)
    epoch = max(next_offset, 1 if current is None else current.broker_epoch + 1)
    event = ev.BrokerRegistered(cluster=cluster, group=group, name=name, address=address, incarnation=incarnation,
                                broker_id=broker_id, broker_epoch=epoch, actor=ACTOR)
    try:
        event.validate()
    except ev.EventError as exc:
        return _refuse(InvalidArgumentError(str(exc)))
    return Decision((event,))


def _next_id(group: GroupState | None) -> int:
    if group is None:
        return 0
    used = set(group.brokers.values()) | set(group.sync_state_set) | ({group.master} if group.master >= 0 else set())
    return max(used) + 1 if used else 0


# --- liveness transitions -------------------------------------------------------------------------

def fence(reg: Registry, key: str, broker_epoch: int, reason: str) -> Decision:
    """Fence a broker (timeout): nothing if it is fenced already or re-registered since."""
    broker = reg.brokers.get(key)
    if broker is None or broker.fenced or broker.broker_epoch != broker_epoch:
        return NOTHING
    return Decision((ev.BrokerFenced(cluster=broker.cluster, group=broker.group, name=broker.name,
                                     broker_epoch=broker_epoch, reason=reason, actor=ACTOR),))


def unfence(reg: Registry, key: str, broker_epoch: int) -> Decision:
    """A fenced broker heartbeats again at its current epoch."""
    broker = reg.brokers.get(key)
    if broker is None or not broker.fenced or broker.broker_epoch != broker_epoch:
        return NOTHING
    return Decision((ev.BrokerUnfenced(cluster=broker.cluster, group=broker.group, name=broker.name,
                                       broker_epoch=broker_epoch, actor=ACTOR),))


# --- master election ------------------------------------------------------------------------------

def needs_master(reg: Registry, gkey: str, clocks: Clocks, exclude: Collection[int] = ()) -> bool:
    group = reg.groups.get(gkey)
    if group is None:
        return False
    if group.master < 0 or group.master in exclude:
        return True
    master = reg.broker_by_id(gkey, group.master)
    return master is None or master.fenced or not clocks.alive(broker_key(master.cluster, master.group, master.name))


def elect(reg: Registry, gkey: str, clocks: Clocks, *, unclean: bool, exclude: Collection[int] = ()) -> Decision:
    """A MasterElected for the group if it needs a master (see the module docstring), else nothing."""
    group = reg.groups.get(gkey)
    if group is None or not needs_master(reg, gkey, clocks, exclude):
        return NOTHING
    live = [b for b in reg.brokers_of(gkey)
            if b.broker_id not in exclude and not b.fenced and clocks.alive(broker_key(b.cluster, b.group, b.name))]
    if group.master_epoch == 0:
        eligible = live
    else:
        eligible = [b for b in live if b.broker_id in group.sync_state_set]
        if not eligible and unclean:
            eligible = live
    if eligible:
        best = max(eligible, key=lambda b: (clocks.offset(broker_key(b.cluster, b.group, b.name)), -b.broker_id))
        return Decision((ev.MasterElected(cluster=group.cluster, group=group.group, master=best.broker_id,
                                          master_epoch=group.master_epoch, sync_state_set=(best.broker_id,),
                                          actor=ACTOR),))
    if group.master < 0:
        return NOTHING   # masterless already: wait for an eligible broker
    return Decision((ev.MasterElected(cluster=group.cluster, group=group.group, master=-1,
                                      master_epoch=group.master_epoch, sync_state_set=group.sync_state_set,
                                      actor=ACTOR),))


# --- reports from brokers -------------------------------------------------------------------------

def alter_sync_state_set(reg: Registry, cluster: str, group: str, name: str, broker_epoch: int, master_epoch: int,
                         sync_state_set_epoch: int, sync_state_set: Collection[int], clocks: Clocks) -> Decision:
    """The master's shrink or expand of its SyncStateSet (see the module docstring)."""
    checked = _check_broker(reg, broker_key(cluster, group, name), broker_epoch)
    if isinstance(checked, ControllerError):
        return _refuse(checked)
    gkey = group_key(cluster, group)
    gstate = reg.groups.get(gkey)
    if gstate is None:
        return _refuse(NotFoundError(f"{gkey} does not exist"))
    if (gstate.master_epoch, gstate.sync_state_set_epoch) != (master_epoch, sync_state_set_epoch):
        return _refuse(StaleEpochError(master_epoch, gstate.master_epoch,
                                       f"{gkey} is at master epoch {gstate.master_epoch} and sync-state-set epoch "
                                       f"{gstate.sync_state_set_epoch}, not {master_epoch}/{sync_state_set_epoch}"))
    if checked.fenced:
        return _refuse(FencedError(f"{checked.name} of {group} is fenced"))
    if gstate.master != checked.broker_id:
        return _refuse(InvalidArgumentError(f"broker {checked.broker_id} is not the master of {group} "
                                            f"(master: {gstate.master})"))
    wanted = tuple(sorted(set(sync_state_set)))
    if gstate.master not in wanted:
        return _refuse(InvalidArgumentError("the master must stay in its sync state set"))
    for broker_id in wanted:
        if broker_id in gstate.sync_state_set:
            continue
        member = reg.broker_by_id(gkey, broker_id)
        if member is None:
            return _refuse(InvalidArgumentError(f"broker {broker_id} is not a broker of {group}"))
        if member.fenced or not clocks.alive(broker_key(cluster, group, member.name)):
            return _refuse(InvalidArgumentError(f"broker {broker_id} ({member.name}) is not alive: it cannot join "
                                                f"the sync state set"))
    if wanted == gstate.sync_state_set:
        return NOTHING
    return Decision((ev.SyncStateSetChanged(cluster=cluster, group=group, sync_state_set=wanted,
                                            master_epoch=master_epoch, sync_state_set_epoch=sync_state_set_epoch,
                                            actor=ACTOR),))


def shutdown(reg: Registry, cluster: str, group: str, name: str, broker_epoch: int, clocks: Clocks, *,
             unclean: bool) -> Decision:
    """Controlled shutdown: an election without the broker if it is the master, then its fence."""
    key = broker_key(cluster, group, name)
    checked = _check_broker(reg, key, broker_epoch)
    if isinstance(checked, ControllerError):
        return _refuse(checked)
    gkey = group_key(cluster, group)
    gstate = reg.groups.get(gkey)
    events: list[ev.Event] = []
    if gstate is not None and gstate.master == checked.broker_id:
        events += elect(reg, gkey, clocks, unclean=unclean, exclude=(checked.broker_id,)).events
    if not checked.fenced:
        events.append(ev.BrokerFenced(cluster=cluster, group=group, name=name, broker_epoch=broker_epoch,
                                      reason="controlled shutdown", actor=ACTOR))
    return Decision(tuple(events))
