"""Topic routes and broker listings (the NameServer's answers), computed from view states.

Pure functions over BrokerState / GroupState / TopicState. A fenced broker drops out of every
route the moment its BrokerFenced is applied (no 120 s NameServer expiry), and a group whose master
is gone says so in `status` instead of routing writes to a dead address. Route changes are not
polled: clients watch the `topic/`, `group/` and `broker/` prefixes and recompute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from epochlog.api import messages as p
from statemachines.state import BrokerState, GroupState, TopicState

OK = "ok"


def group_status(group: GroupState, brokers: Sequence[BrokerState]) -> str:
    """"ok", or why the group has no usable master."""
    if group.master >= 0:
        master = next((b for b in brokers if b.broker_id == group.master), None)
        if master is None:
            return f"no master: broker {group.master} is not registered"
        if master.fenced:
            return f"no master: master {group.master} ({master.name}) is fenced, election pending"
        return OK
    if not brokers:
        return "no master: no brokers registered"
    live = [b.broker_id for b in brokers if not b.fenced]
    in_sync = [i for i in live if i in group.sync_state_set]
    if not live:
        return "no master: every broker is fenced"
    if group.master_epoch > 0 and not in_sync:
        return (f"no master: no live broker of the sync state set {list(group.sync_state_set)} "
                f"(unclean election disabled)")
    return "no master: election pending"


def group_info(group: GroupState, brokers: Sequence[BrokerState]) -> p.BrokerGroupInfo:
    return p.BrokerGroupInfo(group.cluster, group.group, group.master, group.master_epoch, list(group.sync_state_set),
                             group.sync_state_set_epoch, group_status(group, brokers))


def group_route(group: GroupState, brokers: Sequence[BrokerState]) -> p.GroupRoute:
    master = None
    replicas = []
    for b in sorted(brokers, key=lambda b: b.broker_id):
        if b.fenced:
            continue
        entry = p.RouteBroker(b.broker_id, b.name, b.address)
        if b.broker_id == group.master:
            master = entry
        else:
            replicas.append(entry)
    return p.GroupRoute(group.cluster, group.group, master, group.master_epoch, replicas,
                        group_status(group, brokers))


def topic_route(topic: TopicState, version: int, groups: Iterable[GroupState],
                brokers_of: Callable[[GroupState], Sequence[BrokerState]], applied: int,
                cluster: str = "") -> p.TopicRoute:
    """The route of `topic`: its broker groups (every group when it names none), in name order."""
    wanted = set(topic.broker_groups)
    chosen = [g for g in groups if (not wanted or g.group in wanted) and (not cluster or g.cluster == cluster)]
    chosen.sort(key=lambda g: (g.group, g.cluster))
    return p.TopicRoute(topic.name, topic.read_queues, topic.write_queues, topic.perm,
                        [group_route(g, brokers_of(g)) for g in chosen], version, applied)


def broker_info(broker: BrokerState, group: GroupState | None, offset: int = -1,
                heartbeat_age_ms: int = -1) -> p.BrokerInfo:
    master = group is not None and group.master == broker.broker_id
    return p.BrokerInfo(broker.cluster, broker.group, broker.name, broker.broker_id, broker.address,
                        "master" if master else "slave", broker.broker_epoch,
                        group.master_epoch if group is not None else 0, broker.fenced, broker.incarnation,
                        offset, heartbeat_age_ms)
