"""The controller's in-memory copy of the broker registry: `broker/` and `group/` entities of the views.

The controller decides against this copy, not against RocksDB: heartbeats must not touch the disk,
and a batch of decisions (a registration storm, a fence followed by an election) must see the
effects of the decisions before it that are not committed yet. So the copy is updated
optimistically with `apply`, which runs the applier's own broker and group rules
(statemachines/brokers.py), and then made authoritative again by `put_broker` / `put_group` with
what the views hold once the batch is applied (a rejection there simply overwrites the optimistic
guess).

Not thread-safe; no IO.
"""

from __future__ import annotations

from collections.abc import Iterable


from statemachines import brokers
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
        """Apply a broker or group event by the applier's rules (statemachines/brokers.py): (applied,
        rejection code)."""
        try:
            event.validate()
        except ev.EventError as exc:
            return False, exc.code
        if isinstance(event, ev.BrokerRegistered | ev.BrokerFenced | ev.BrokerUnfenced | ev.BrokerUnregistered):
            key, gkey = event.key(), event.group_key()
            rule = brokers.broker_registered if isinstance(event, ev.BrokerRegistered) else brokers.broker_changed
            change = rule(self.brokers.get(key), self.groups.get(gkey), event, offset)  # type: ignore[arg-type]
            if isinstance(change, brokers.Rejected):
                return False, change.code
            self.put_broker(key, change.broker)
            if change.group is not None:
                self.put_group(gkey, change.group)
            return True, ""
        if isinstance(event, ev.SyncStateSetChanged | ev.MasterElected):
            group = self.groups.get(event.key())
            changed = (brokers.sync_state_set_changed(group, event, offset) if isinstance(event, ev.SyncStateSetChanged)
                       else brokers.master_elected(group, event, offset))
            if isinstance(changed, brokers.Rejected):
                return False, changed.code
            self.put_group(event.key(), changed)
            return True, ""
        raise AssertionError(f"not a broker or group event: {type(event).__name__}")
