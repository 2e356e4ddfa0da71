"""Which Raft group owns which entity: the routing table every node and client shares.

Entities are routed by kind so that everything one command can touch atomically lives in one group:

    broker/ group/ topic/ config/   -> metadata   (the controller's and NameServer's state)
    member/                         -> metadata   (node addresses: written by membership changes only)
    user/ acl/                      -> metadata   (users' credentials and grants: statemachines/access.py)
    offset/ kafka-group/            -> offsets    (consumer offsets, Kafka consumer groups: own leader)
    kv/ lease/ session/             -> kv         (leases delete the kv entries and sessions attached)
    client-session/<group>/         -> <group>    (a writing client's session is in the group it writes
                                                   to: statemachines/sessions.py)

A transaction must stay within one group.
"""

from __future__ import annotations

from statemachines.events import Event, EventError, Txn

GROUP_OF_KIND = {
    "broker": "metadata", "group": "metadata", "topic": "metadata", "config": "metadata", "member": "metadata",
    "user": "metadata", "acl": "metadata",
    "offset": "offsets", "kafka-group": "offsets",
    "kv": "kv", "lease": "kv", "session": "kv",
}
REQUIRED_GROUPS = ("metadata", "offsets", "kv")


CLIENT_SESSION_KIND = "client-session"


def group_of_key(key: str) -> str:
    kind = key.split("/", 1)[0]
    if kind == CLIENT_SESSION_KIND:
        parts = key.split("/", 2)
        if len(parts) == 3 and parts[1]:
            return parts[1]
    group = GROUP_OF_KIND.get(kind)
    if group is None or "/" not in key:
        raise EventError(f"{key!r} is not an entity key (one of {', '.join(k + '/...' for k in GROUP_OF_KIND)})")
    return group


def group_of_event(event: Event) -> str:
    if isinstance(event, Txn):
        groups = {group_of_key(op.key()) for op in event.ops} | {group_of_key(c.key) for c in event.conditions}
        if len(groups) != 1:
            raise EventError(f"a transaction stays within one group; this one spans {sorted(groups)}")
        return groups.pop()
    return group_of_key(event.key())
