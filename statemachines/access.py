"""Who may do what: THE authorization rule of every face (sans-IO, pure functions).

A request is turned into `Action`s (an operation on a resource) by its face's mapping: native and
gRPC calls in epochlog/api/permissions.py, events here (`event_actions`, shared by every face that
carries events: native Write, gRPC, Kafka produce to `__<group>`). `decide(principal, action)` says
whether the principal's grants (statemachines/grants.py) allow it; `authorize` checks every action of
a request and raises `PermissionDeniedError` at the first one refused, so a request is allowed whole
or not at all and nothing of a denied request is appended.

Resources are strings:

    an entity key            kv/app/x, topic/orders, offset/<consumer group>/<topic>/<queue>, broker/c/g/n,
                             group/c/g, config/s/n, user/<name>, acl/<principal>/..., lease/<id>, ...
    an entity key prefix     the same with `prefix=True` (list, watch): allowed only if every key it can
                             reach is allowed, judged from the prefix alone (conservative)
    log/<group>              a group's whole log (read_events, a watch of a whole group, Kafka __<group>)
    kafka-topic/<name>       a Kafka topic hosted by the Kafka face
    kafka-group/<id>         a Kafka consumer group: READ to find its coordinator and fetch its offsets, WRITE
                             to be one of its members (join, sync, heartbeat, leave) and commit its offsets
    broker/<c>/<g>/<n>       a broker's own calls (operation BROKER)
    cluster                  the cluster's description (DESCRIBE), its operation (ADMIN), the nodes'
                             operational detail (INSPECT)

Controller decisions (broker registry and broker group events: BrokerRegistered, BrokerFenced,
BrokerUnfenced, BrokerUnregistered, SyncStateSetChanged, MasterElected) need the CONTROLLER role and
the node's own records (MemberAdded/Removed, HistoryPruned, LeaseExpired, KafkaGroupStored, ViewsFormatRaised) the NODE
role. Neither role can be granted (grants.GRANTABLE), so no client principal holds them, admin
included: such an event from any client face is refused whoever sends it. Brokers reach the
controller through its calls (register, heartbeats, SyncStateSet reports, shutdown), each bound to
the broker's own identity. The metadata group's log is read-only to Kafka clients (as KRaft's
`__cluster_metadata`): APPEND_LOG on log/metadata is refused to everyone.

Admin is a super-user for everything a client may do, acting as any broker included (so one local
credential runs the whole demo); the auditor reads everything and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from eventlog.errors import AuthenticationError, PermissionDeniedError  # noqa: F401 - rows of the one error table
from statemachines import events as ev
from statemachines.grants import Grant, GrantSyntaxError, Role, parse_grant
from statemachines.query import MAX_LIMIT, Query
from statemachines.state import AclState


class Operation(StrEnum):
    READ = "read"                # an entity or a key prefix: get, list, history, watch of a prefix
    WRITE = "write"              # an entity, by a client's event
    READ_LOG = "read_log"        # a group's whole log
    APPEND_LOG = "append_log"    # records appended to a group's log as they are (Kafka produce to __<group>)
    DESCRIBE = "describe"        # the cluster's shape: status, members, routes, brokers, ping
    IDEMPOTENT_WRITE = "idempotent_write"   # a Kafka producer id (Kafka's IdempotentWrite on the cluster)
    CREATE = "create"            # a Kafka topic made by CreateTopics (Kafka's Create on the topic)
    INSPECT = "inspect"          # the nodes' operational detail: compaction status, /metrics
    ADMIN = "admin"              # membership, leader transfer, snapshot, group skip
    BROKER = "broker"            # a broker's own calls to the controller
    DECIDE = "decide"            # the controller's decisions
    NODE = "node"                # records only a node writes


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection authenticated as, and what the ACLs grant it (frozen: one per connection and
    ACL version). The empty name is the anonymous principal, which holds no grant.

    `roles` and the kv prefixes are derived once at construction: `decide` runs for every record a
    Kafka producer sends, so it reads them instead of scanning the grants each time."""

    name: str
    grants: frozenset[Grant] = frozenset()
    roles: frozenset[Role] = field(init=False, compare=False, repr=False)
    kv_writes: tuple[str, ...] = field(init=False, compare=False, repr=False)   # writer kv: prefixes
    kv_reads: tuple[str, ...] = field(init=False, compare=False, repr=False)    # reader or writer kv: prefixes

    def __post_init__(self) -> None:
        def prefixes(*roles: Role) -> tuple[str, ...]:
            return tuple(p for g in self.grants if g.role in roles and (p := g.kv_prefix()) is not None)

        object.__setattr__(self, "roles", frozenset(g.role for g in self.grants))
        object.__setattr__(self, "kv_writes", prefixes(Role.WRITER))
        object.__setattr__(self, "kv_reads", prefixes(Role.READER, Role.WRITER))

    def has(self, role: Role) -> bool:
        return role in self.roles

    def scoped(self, *roles: Role) -> Iterable[Grant]:
        return (g for g in self.grants if g.role in roles)

    def __str__(self) -> str:
        return self.name or "anonymous"


ANONYMOUS = Principal("")
CONTROLLER = Principal("epochlog/controller", frozenset({Grant(Role.CONTROLLER)}))
NODE = Principal("epochlog/node", frozenset({Grant(Role.NODE)}))


@dataclass(frozen=True, slots=True)
class Action:
    operation: Operation
    resource: str = "cluster"
    prefix: bool = False          # `resource` is a key prefix: every key starting with it

    def __str__(self) -> str:
        return f"{self.operation.value} {self.resource}{'*' if self.prefix else ''}"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""              # why not (for the denial's message and log line)


ALLOWED = Decision(True)

CONTROLLER_EVENTS = (ev.BrokerRegistered, ev.BrokerFenced, ev.BrokerUnfenced, ev.BrokerUnregistered,
                     ev.SyncStateSetChanged, ev.MasterElected)
NODE_EVENTS = (ev.MemberAdded, ev.MemberRemoved, ev.HistoryPruned, ev.LeaseExpired, ev.KafkaGroupStored,
               ev.ViewsFormatRaised)
ROUTE_KINDS = frozenset({"broker", "group", "topic", "member"})   # where things are: any granted principal reads
READ_ONLY_LOGS = frozenset({"metadata"})                          # APPEND_LOG refused to everyone


def principal_at(query: Query, name: str, *, as_of: int | None = None) -> Principal:
    """`name` with the grants the metadata group's views hold for it (at offset `as_of`: who could do
    what then). A grant this code cannot parse (a newer Epochlog's role) is left out: never guessed."""
    grants: set[Grant] = set()
    after = None
    while True:
        page = query.list(f"acl/{name}/", limit=MAX_LIMIT, after=after, as_of=as_of)
        for item in page.items:
            state = item.state
            assert isinstance(state, AclState), item
            try:
                grants.add(parse_grant(state.role, state.resource))
            except GrantSyntaxError:
                continue
        if page.next is None:
            return Principal(name, frozenset(grants))
        after = page.next


def event_actions(event: ev.Event) -> tuple[Action, ...]:
    """What writing `event` from a client face asks permission for (a Txn: each operation, and a read
    of each condition's key, whose version the outcome reveals)."""
    if isinstance(event, ev.Txn):
        return (*(a for op in event.ops for a in event_actions(op)),
                *(Action(Operation.READ, c.key) for c in event.conditions))
    if isinstance(event, CONTROLLER_EVENTS):
        return (Action(Operation.DECIDE, event.key()),)
    if isinstance(event, NODE_EVENTS):
        return (Action(Operation.NODE, event.key()),)
    return (Action(Operation.WRITE, event.key()),)


def authorize(principal: Principal, actions: Iterable[Action]) -> None:
    """PermissionDeniedError at the first action `principal` may not do (all or nothing)."""
    for action in actions:
        decision = decide(principal, action)
        if not decision.allowed:
            raise PermissionDeniedError(f"{principal} may not {action}: {decision.reason}")


def decide(principal: Principal, action: Action) -> Decision:
    op = action.operation
    if op is Operation.DECIDE:
        return _role(principal, Role.CONTROLLER, "only the controller decides this (brokers use its calls)")
    if op is Operation.NODE:
        return _role(principal, Role.NODE, "only a node writes this record")
    if not principal.grants:
        return Decision(False, "no role is granted to it")
    if op is Operation.APPEND_LOG:
        group = action.resource.removeprefix("log/")
        if group in READ_ONLY_LOGS:
            return Decision(False, f"the {group} group's log is read-only to Kafka clients (write its events "
                                   f"through the API)")
        return ALLOWED   # each record's event is then authorized on its own (event_actions)
    if principal.has(Role.ADMIN):
        return ALLOWED
    if op is Operation.DESCRIBE:
        return ALLOWED
    if op is Operation.IDEMPOTENT_WRITE:   # Kafka (KIP-679): a Write grant on any topic implies it
        return _role(principal, Role.WRITER, "needs admin or a writer grant")
    if op in (Operation.INSPECT, Operation.READ_LOG):
        return _role(principal, Role.AUDITOR, "needs admin or auditor")
    if op is Operation.ADMIN:
        return Decision(False, "needs admin")
    if op is Operation.CREATE:   # as Kafka's prefixed Create ACL: an app makes its own topics (Faust's changelogs)
        kind, rest = _kind(action)
        if kind == "kafka-topic" and _topic(principal, rest, (Role.WRITER,)):
            return ALLOWED
        return Decision(False, "needs admin, or a writer grant on the topic")
    if op is Operation.BROKER:
        bound = action.resource.removeprefix("broker/")
        if any(g.resource == bound for g in principal.scoped(Role.BROKER)):
            return ALLOWED
        return Decision(False, f"needs the broker role bound to {bound}")
    if op is Operation.READ:
        if principal.has(Role.AUDITOR):
            return ALLOWED
        return _read(principal, action)
    assert op is Operation.WRITE, op
    return _write(principal, action)


def _role(principal: Principal, role: Role, reason: str) -> Decision:
    return ALLOWED if principal.has(role) else Decision(False, reason)


def _kind(action: Action) -> tuple[str | None, str]:
    """The entity kind and the rest of the resource; kind None for a prefix that spans kinds."""
    kind, sep, rest = action.resource.partition("/")
    return (kind, rest) if sep else (None, "")


def _kv(name: str, prefixes: tuple[str, ...]) -> bool:
    return name.startswith(prefixes) if prefixes else False


READERS = (Role.READER, Role.WRITER)


def _topic(principal: Principal, topic: str | None, roles: tuple[Role, ...]) -> bool:
    return topic is not None and any(g.covers_topic(topic) for g in principal.scoped(*roles))


def _group(principal: Principal, group_id: str) -> bool:
    return any(g.covers_group(group_id) for g in principal.scoped(*READERS))


def _offset_topic(action: Action, rest: str) -> str | None:
    """The topic of an offset key `<consumer group>/<topic>/<queue>`; None when a prefix stops short of it."""
    parts = rest.split("/")
    if len(parts) < 2 or (action.prefix and len(parts) < 3):
        return None
    return parts[1]


def _read(principal: Principal, action: Action) -> Decision:
    kind, rest = _kind(action)
    if kind in ROUTE_KINDS:
        return ALLOWED
    if kind == "kv" and _kv(rest, principal.kv_reads):
        return ALLOWED
    if kind == "kafka-topic" and not action.prefix and _topic(principal, rest, READERS):
        return ALLOWED
    if kind == "offset" and _topic(principal, _offset_topic(action, rest), READERS):
        return ALLOWED
    if kind == "kafka-group" and not action.prefix and _group(principal, rest):
        return ALLOWED
    if kind in ("lease", "session") and principal.has(Role.WRITER):
        return ALLOWED
    return Decision(False, _needs(kind, "read"))


def _write(principal: Principal, action: Action) -> Decision:
    assert not action.prefix, action
    kind, rest = _kind(action)
    if kind == "kv" and _kv(rest, principal.kv_writes):
        return ALLOWED
    if kind == "kafka-topic" and _topic(principal, rest, (Role.WRITER,)):
        return ALLOWED
    if kind == "offset" and _topic(principal, _offset_topic(action, rest), READERS):
        return ALLOWED    # a consumer commits its own offsets (Kafka: Read on the topic)
    if kind == "kafka-group" and _group(principal, rest):
        return ALLOWED    # a consumer group's member (Kafka: Read on the group)
    if kind in ("lease", "session") and principal.has(Role.WRITER):
        return ALLOWED
    if kind == "client-session":
        return ALLOWED    # any granted principal opens and closes its own sessions
    return Decision(False, _needs(kind, "write"))


def _needs(kind: str | None, what: str) -> str:
    scoped = {"kv": "a writer grant on a kv prefix covering it" if what == "write"
              else "a reader or writer grant on a kv prefix covering it",
              "kafka-topic": f"a {'writer' if what == 'write' else 'reader or writer'} grant on the topic",
              "offset": "a reader or writer grant on the offset's topic",
              "kafka-group": "a reader or writer grant on the consumer group",
              "lease": "a writer grant", "session": "a writer grant"}
    extra = scoped.get(kind or "")
    base = "needs admin" if what == "write" else "needs admin or auditor"
    return f"{base}, or {extra}" if extra else base
