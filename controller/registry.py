"""The controller's in-memory copy of the broker registry: `broker/` and `group/` entities of the views.

The controller decides against this copy, not against RocksDB: heartbeats must not touch the disk,
and a batch of decisions (a registration storm, a fence followed by an election) must see the
effects of the decisions before it that are not committed yet. So the copy is updated
optimistically with `apply`, a model of the applier's broker and group rules
(statemachines/apply.py: the same epoch checks, the same resulting states; tests/controller checks
the two agree event for event), and then made authoritative again by `put_broker` / `put_group`
with what the views hold once the batch is applied (a rejection there simply overwrites the
optimistic guess).

Not thread-safe; no IO.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from statemachines import events as ev
from statemachines.state import BrokerState, GroupState


def broker_key(cluster: str, group: str, name: str) -> str:
    return f"broker/{cluster}/{group}/{name}"


def group_key(cluster: str, group: str) -> str:
    return f"group/{cluster}/{group}"


def group_key_of(broker: BrokerState) -> str:
    return f"group/{broker.cluster}/{broker.group}"


class Registry:
    """Brokers and broker groups by entity key, with each group's brokers indexed."""

    def __init__(self, brokers: Iterable[BrokerState] = (), groups: Iterable[GroupState] = ()) -> None:
        self.brokers: dict[str, BrokerState] = {}
        self.groups: dict[str, GroupState] = {}
        self._members: dict[str, set[str]] = {}   # group key -> broker keys
        for g in groups:
            self.put_group(group_key(g.cluster, g.group), g)
        for b in brokers:
            self.put_broker(broker_key(b.cluster, b.group, b.name), b)

    # --- reads -----------------------------------------------------------------------------------

    def brokers_of(self, gkey: str) -> list[BrokerState]:
        """The registered brokers of a group, by broker id."""
        found = [self.brokers[k] for k in self._members.get(gkey, ()) if k in self.brokers]
        return sorted(found, key=lambda b: b.broker_id)

    def broker_by_id(self, gkey: str, broker_id: int) -> BrokerState | None:
        for k in self._members.get(gkey, ()):
            b = self.brokers.get(k)
            if b is not None and b.broker_id == broker_id:
                return b
        return None

    # --- authoritative updates (from the views) -------------------------------------------------

    def put_broker(self, key: str, state: BrokerState | None) -> None:
        old = self.brokers.get(key)
        if old is not None:
            self._members.get(group_key_of(old), set()).discard(key)
        if state is None:
            self.brokers.pop(key, None)
            return
        self.brokers[key] = state
        self._members.setdefault(group_key_of(state), set()).add(key)

    def put_group(self, key: str, state: GroupState | None) -> None:
        if state is None:
            self.groups.pop(key, None)
        else:
            self.groups[key] = state

    # --- the model of the applier ----------------------------------------------------------------

    def apply(self, event: ev.Event, offset: int) -> tuple[bool, str]:
        """Apply a broker or group event as statemachines/apply.py would: (applied, rejection code)."""
        try:
            event.validate()
        except ev.EventError as exc:
            return False, exc.code
        if isinstance(event, ev.BrokerRegistered):
            return self._registered(event, offset)
        if isinstance(event, ev.BrokerFenced | ev.BrokerUnfenced | ev.BrokerUnregistered):
            return self._broker_change(event, offset)
        if isinstance(event, ev.SyncStateSetChanged):
            return self._sync_state_set(event, offset)
        if isinstance(event, ev.MasterElected):
            return self._master_elected(event, offset)
        raise AssertionError(f"not a broker or group event: {type(event).__name__}")

    def _registered(self, e: ev.BrokerRegistered, offset: int) -> tuple[bool, str]:
        key = e.key()
        current = self.brokers.get(key)
        if current is not None and current.broker_epoch >= e.broker_epoch:
            return False, "stale_epoch"
        created = current.created if current is not None else offset
        self.put_broker(key, BrokerState(cluster=e.cluster, group=e.group, name=e.name, address=e.address,
                                         incarnation=e.incarnation, broker_id=e.broker_id,
                                         broker_epoch=e.broker_epoch, version=offset, created=created))
        gkey = e.group_key()
        group = self.groups.get(gkey)
        if group is not None:
            group = msgspec.structs.replace(group, brokers={**group.brokers, e.name: e.broker_id}, version=offset)
        else:
            group = GroupState(cluster=e.cluster, group=e.group, brokers={e.name: e.broker_id}, version=offset,
                               created=offset)
        self.put_group(gkey, group)
        return True, ""

    def _broker_change(self, e: ev.BrokerFenced | ev.BrokerUnfenced | ev.BrokerUnregistered,
                       offset: int) -> tuple[bool, str]:
        key = e.key()
        current = self.brokers.get(key)
        if current is None:
            return False, "not_found"
        if current.broker_epoch != e.broker_epoch:
            return False, "stale_epoch"
        if isinstance(e, ev.BrokerUnregistered):
            self.put_broker(key, None)
            group = self.groups.get(e.group_key())
            if group is not None:
                brokers = {n: i for n, i in group.brokers.items() if n != e.name}
                self.put_group(e.group_key(), msgspec.structs.replace(group, brokers=brokers, version=offset))
            return True, ""
        self.put_broker(key, msgspec.structs.replace(current, fenced=isinstance(e, ev.BrokerFenced), version=offset))
        return True, ""

    def _sync_state_set(self, e: ev.SyncStateSetChanged, offset: int) -> tuple[bool, str]:
        group = self.groups.get(e.key())
        if group is None:
            return False, "not_found"
        if (group.master_epoch, group.sync_state_set_epoch) != (e.master_epoch, e.sync_state_set_epoch):
            return False, "stale_epoch"
        if group.master not in e.sync_state_set:
            return False, "invalid_argument"
        self.put_group(e.key(), msgspec.structs.replace(group, sync_state_set=tuple(sorted(set(e.sync_state_set))),
                                                        sync_state_set_epoch=group.sync_state_set_epoch + 1,
                                                        version=offset))
        return True, ""

    def _master_elected(self, e: ev.MasterElected, offset: int) -> tuple[bool, str]:
        group = self.groups.get(e.key())
        if group is None:
            group = GroupState(cluster=e.cluster, group=e.group, version=offset, created=offset)
        if group.master_epoch != e.master_epoch:
            return False, "stale_epoch"
        sync = tuple(sorted(set(e.sync_state_set))) if e.sync_state_set else ((e.master,) if e.master >= 0 else ())
        self.put_group(e.key(), msgspec.structs.replace(group, master=e.master, master_epoch=group.master_epoch + 1,
                                                        sync_state_set=sync,
                                                        sync_state_set_epoch=group.sync_state_set_epoch + 1,
                                                        version=offset))
        return True, ""
