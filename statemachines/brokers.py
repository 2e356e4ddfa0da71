"""The broker and broker-group rules, written once: what each controller event does to the registry.

Two places apply these events: the applier (statemachines/apply.py), to the views of the metadata
group, and the controller (controller/registry.py), to its in-memory copy, optimistically, before the
batch of decisions it belongs to commits. Both call these pure functions, so the copy cannot drift
from the views: each takes the current states (None: absent) and the event, and returns the new
states or a `Rejected` with the code and reason that the applier records.

Rules (each conditioned on an epoch, so a stale command changes nothing on every replica alike):

- BrokerRegistered: a newer broker epoch than the registered one (KRaft's broker epochs only grow);
  the broker joins its group's id table, the group is created if needed.
- BrokerFenced / BrokerUnfenced: the broker's current epoch; sets its `fenced` flag.
- BrokerUnregistered: the broker's current epoch; it leaves its group's id table.
- SyncStateSetChanged: the group's current master and sync-state-set epochs; the master stays in it.
- MasterElected: the group's current master epoch; a new master epoch, the new SyncStateSet (the
  master alone if none is given; empty for no master).
"""

from __future__ import annotations

import secrets
from typing import NamedTuple

import msgspec

from eventlog.errors import INVALID_ARGUMENT, NOT_FOUND, STALE_EPOCH
from statemachines import events as ev
from statemachines.state import BrokerState, GroupState


def new_incarnation(start_ns: int) -> str:
    """An incarnation id for a broker process started at `start_ns` (time.time_ns()): it sorts by start
    time (20 digits), and a random tail keeps two processes started in the same nanosecond apart. A newer
    incarnation fences the previous process of the same broker (controller/decisions.py)."""
    return f"{start_ns:020d}-{secrets.token_hex(4)}"


class Rejected(NamedTuple):
    code: str
    message: str


class BrokerChange(NamedTuple):
    """The states after a broker event: the broker (None: unregistered) and its group (None: unchanged)."""

    broker: BrokerState | None
    group: GroupState | None


def broker_registered(current: BrokerState | None, group: GroupState | None, e: ev.BrokerRegistered,
                      offset: int) -> BrokerChange | Rejected:
    if current is not None and current.broker_epoch >= e.broker_epoch:
        return Rejected(STALE_EPOCH, f"broker {e.name} is at epoch {current.broker_epoch}, not below "
                                       f"{e.broker_epoch}")
    created = current.created if current is not None else offset
    broker = BrokerState(cluster=e.cluster, group=e.group, name=e.name, address=e.address, incarnation=e.incarnation,
                         broker_id=e.broker_id, broker_epoch=e.broker_epoch, version=offset, created=created)
    if group is not None:
        group = msgspec.structs.replace(group, brokers={**group.brokers, e.name: e.broker_id}, version=offset)
    else:
        group = GroupState(cluster=e.cluster, group=e.group, brokers={e.name: e.broker_id}, version=offset,
                           created=offset)
    return BrokerChange(broker, group)


def broker_changed(current: BrokerState | None, group: GroupState | None,
                   e: ev.BrokerFenced | ev.BrokerUnfenced | ev.BrokerUnregistered,
                   offset: int) -> BrokerChange | Rejected:
    """BrokerFenced, BrokerUnfenced (the fenced flag) or BrokerUnregistered (the broker leaves)."""
    if current is None:
        return Rejected(NOT_FOUND, f"broker {e.name} of {e.group} is not registered")
    if current.broker_epoch != e.broker_epoch:
        return Rejected(STALE_EPOCH, f"broker {e.name} is at epoch {current.broker_epoch}, not {e.broker_epoch}")
    if isinstance(e, ev.BrokerUnregistered):
        if group is not None:
            group = msgspec.structs.replace(group, brokers={n: i for n, i in group.brokers.items() if n != e.name},
                                            version=offset)
        return BrokerChange(None, group)
    return BrokerChange(msgspec.structs.replace(current, fenced=isinstance(e, ev.BrokerFenced), version=offset), None)


def sync_state_set_changed(group: GroupState | None, e: ev.SyncStateSetChanged, offset: int) -> GroupState | Rejected:
    if group is None:
        return Rejected(NOT_FOUND, f"broker group {e.group} has no master yet")
    if (group.master_epoch, group.sync_state_set_epoch) != (e.master_epoch, e.sync_state_set_epoch):
        return Rejected(STALE_EPOCH, f"group {e.group} is at master epoch {group.master_epoch} and sync-state-set "
                                       f"epoch {group.sync_state_set_epoch}, not {e.master_epoch}/"
                                       f"{e.sync_state_set_epoch}")
    if group.master not in e.sync_state_set:
        return Rejected(INVALID_ARGUMENT, "the master must stay in its sync state set")
    return msgspec.structs.replace(group, sync_state_set=tuple(sorted(set(e.sync_state_set))),
                                   sync_state_set_epoch=group.sync_state_set_epoch + 1, version=offset)


def master_elected(group: GroupState | None, e: ev.MasterElected, offset: int) -> GroupState | Rejected:
    if group is None:
        group = GroupState(cluster=e.cluster, group=e.group, version=offset, created=offset)
    if group.master_epoch != e.master_epoch:
        return Rejected(STALE_EPOCH, f"group {e.group} is at master epoch {group.master_epoch}, not {e.master_epoch}")
    sync = tuple(sorted(set(e.sync_state_set))) if e.sync_state_set else ((e.master,) if e.master >= 0 else ())
    return msgspec.structs.replace(group, master=e.master, master_epoch=group.master_epoch + 1, sync_state_set=sync,
                                   sync_state_set_epoch=group.sync_state_set_epoch + 1, version=offset)
