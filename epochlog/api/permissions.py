"""What each call of the client API asks permission for: a call in, its `Action`s out (pure).

The native protocol and gRPC carry the same calls (epochlog/api/messages.py), so this one table
serves both; statemachines/access.py decides the actions. A call maps to every action it needs,
so a call is allowed whole or refused whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochlog.api import messages as p
from epochlog.api.routing import group_of_key
from statemachines.access import Action, Operation, event_actions

DESCRIBE = (Action(Operation.DESCRIBE),)
ADMIN = (Action(Operation.ADMIN),)


def call_actions(call: p.Call) -> tuple[Action, ...]:
    """The actions `call` needs; a call type without an entry here is a bug (every call is listed)."""
    return _ACTIONS[type(call)](call)


def _read(key: str) -> Action:
    return Action(Operation.READ, key)


def _list(call: p.List) -> tuple[Action, ...]:
    if call.end:
        # Every key in [start, end) starts with the two bounds' common prefix: conservative.
        common = _common_prefix(call.start, call.end)
        return (Action(Operation.READ, common, prefix=True),)
    return (Action(Operation.READ, call.prefix, prefix=True),)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _watch(call: p.Watch) -> tuple[Action, ...]:
    if not call.prefix:   # the whole log of a group
        return (Action(Operation.READ_LOG, f"log/{call.group or group_of_key(call.prefix + '/')}"),)
    return (Action(Operation.READ, call.prefix, prefix=True),)


def _broker(cluster: str, group: str, name: str) -> Action:
    return Action(Operation.BROKER, f"broker/{cluster}/{group}/{name}")


_ACTIONS: dict[type, Callable[[Any], tuple[Action, ...]]] = {
    p.Write: lambda c: tuple(a for e in c.events for a in event_actions(e)),
    p.Get: lambda c: (_read(c.key),),
    p.Gets: lambda c: tuple(_read(g.key) for g in c.gets),
    p.List: _list,
    p.History: lambda c: (_read(c.key),),
    p.LeaseGrant: lambda c: (Action(Operation.WRITE, f"lease/{c.lease_id:020d}"),),
    p.LeaseKeepAlive: lambda c: (Action(Operation.WRITE, f"lease/{c.lease_id:020d}"),),
    p.Watch: _watch,
    p.WatchAck: lambda c: DESCRIBE,          # the connection's own watches
    p.CancelWatch: lambda c: DESCRIBE,
    p.ReadEvents: lambda c: (Action(Operation.READ_LOG, f"log/{c.group}"),),
    p.ReadLog: lambda c: (Action(Operation.READ_LOG, f"log/{c.group}"),),
    p.Status: lambda c: DESCRIBE,
    p.Ping: lambda c: DESCRIBE,
    p.MemberList: lambda c: DESCRIBE,
    p.RouteQuery: lambda c: DESCRIBE,
    p.BrokerList: lambda c: DESCRIBE,
    p.CompactionStatus: lambda c: (Action(Operation.INSPECT),),
    p.TransferLeader: lambda c: ADMIN,
    p.Snapshot: lambda c: ADMIN,
    p.GroupSkip: lambda c: ADMIN,
    p.MemberAdd: lambda c: ADMIN,
    p.MemberPromote: lambda c: ADMIN,
    p.MemberRemove: lambda c: ADMIN,
    p.BrokerRegister: lambda c: tuple(_broker(b.cluster, b.group, b.name) for b in c.brokers),
    p.BrokerHeartbeats: lambda c: tuple(_broker(h.cluster, h.group, h.name) for h in c.heartbeats),
    p.SyncStateSetReport: lambda c: (_broker(c.cluster, c.group, c.name),),
    p.BrokerShutdown: lambda c: (_broker(c.cluster, c.group, c.name),),
}
