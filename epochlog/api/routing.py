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

**One key space.** Every surface a user names a key on (CLI, SDK, gRPC, watch, transaction conditions,
audit) takes the same spelling, the *user key*, and shows keys back in it:

    app/x                 the kv entry app/x (the kind is implicit, as in etcd: `put app/x 1`)
    topic/orders          any other entity: its kind, then its name (broker/c/g/n, lease/..., offset/...)

The first segment decides: an entity kind names that entity, anything else is a kv name. So a kv key
is never written `kv/app/x`, and a kv name cannot start with an entity kind (`config/x` names a config
entity); both are refused with the spelling to use, never read as a key that cannot exist (a watch of
it would wait forever). The log, the native wire protocol, the Delta table's `key` column and the
Kafka face's `__metadata` record keys hold the *entity key* (`kv/app/x`): the storage form, which
`entity_key` and `user_key` translate, and which `group_of_key` checks for the same mistakes.
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
KV_PREFIX = "kv/"
# The first segments a kv name cannot have: they name other entities (or the kv kind itself).
RESERVED_KINDS = frozenset((*GROUP_OF_KIND, CLIENT_SESSION_KIND))


def _refuse_wrong_space(name: str, what: str) -> None:
    """Refuse a kv name (or name prefix) that belongs to another space: `kv/...` or `<kind>/...`."""
    kind, sep, rest = name.partition("/")
    if not sep or kind not in RESERVED_KINDS:
        return
    if kind == "kv":
        raise EventError(f"{what} {name!r}: kv keys are written without kv/, e.g. {rest!r} "
                         f"(epochlog/api/routing.py: one key space)")
    raise EventError(f"{what} {name!r}: keys starting with {kind}/ name {kind} entities, not kv entries; "
                     f"give the kv entry another first segment, e.g. {'app/' + name!r}")


def kv_name(key: str) -> str:
    """The kv name of a user key given where only kv entries can be meant (put, delete, a txn operation)."""
    if not key:
        raise EventError("a kv key is not empty")
    _refuse_wrong_space(key, "key")
    return key


def entity_key(key: str) -> str:
    """The entity key (storage form) a user key names: `app/x` -> `kv/app/x`; `topic/orders` unchanged."""
    if not key:
        raise EventError("a key is not empty")
    kind, sep, rest = key.partition("/")
    if kind == "kv" and sep:
        _refuse_wrong_space(key, "key")
    if sep and kind in RESERVED_KINDS:
        if not rest:
            raise EventError(f"key {key!r} names no entity: give a name after {kind}/ ({kind}/...)")
        return key
    return KV_PREFIX + key


def entity_prefix(prefix: str) -> str:
    """The entity key prefix a user key prefix names (watch, list, audit state): `app/` -> `kv/app/`,
    `` (empty) -> every kv entry, `broker/` -> every broker. A prefix without a `/` is a kv name prefix."""
    kind, sep, _ = prefix.partition("/")
    if sep and kind == "kv":
        _refuse_wrong_space(prefix, "prefix")
    if sep and kind in RESERVED_KINDS:
        return prefix
    return KV_PREFIX + prefix


def user_key(key: str) -> str:
    """The user key of an entity key: `kv/app/x` -> `app/x`; other kinds unchanged."""
    return key[len(KV_PREFIX):] if key.startswith(KV_PREFIX) else key


def group_of_key(key: str) -> str:
    """The group that owns the entity key (or entity key prefix) `key`; a kv key that cannot exist under the
    one key space (`kv/kv/...`, `kv/topic/...`) is refused here, on every face, rather than waited for.
    (Once per event a leader proposes: one partition of the key, no list.)"""
    kind, sep, rest = key.partition("/")
    if kind == CLIENT_SESSION_KIND:
        named, has_rest, _ = rest.partition("/")
        if has_rest and named:
            return named
    group = GROUP_OF_KIND.get(kind)
    if group is None or not sep:
        raise EventError(f"{key!r} is not an entity key (one of {', '.join(k + '/...' for k in GROUP_OF_KIND)})")
    if kind == "kv":
        _refuse_wrong_space(rest, "kv name")
    return group


_KV_KEY = KV_PREFIX.encode()
_RESERVED_KIND_BYTES = frozenset(kind.encode() for kind in RESERVED_KINDS)


def group_of_record_key(key: bytes) -> str:
    """`group_of_key` of a record key (the entity key, UTF-8): a kv key whose name does not start with a
    reserved kind is routed without decoding it (the leader routes every put of a write this way); any
    other key, and every refusal, is `group_of_key`'s."""
    if key.startswith(_KV_KEY):
        first, sep, _ = key[3:].partition(b"/")
        if not sep or first not in _RESERVED_KIND_BYTES:
            return "kv"
    return group_of_key(key.decode())


def group_of_event(event: Event) -> str:
    if isinstance(event, Txn):
        groups = {group_of_key(op.key()) for op in event.ops} | {group_of_key(c.key) for c in event.conditions}
        if len(groups) != 1:
            raise EventError(f"a transaction stays within one group; this one spans {sorted(groups)}")
        return groups.pop()
    return group_of_key(event.key())
