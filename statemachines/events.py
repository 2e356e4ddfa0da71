"""Typed, versioned metadata events: the record values of the log.

Every metadata change is one event: a frozen msgspec struct with a type tag, encoded as msgpack in
the record value; the record key is the entity key (`Event.key()`). Each event carries the acting
principal (`actor`), the client's request id (`request_id`, for idempotent retries) and the domain
epochs or versions it is conditioned on (broker epoch, master epoch, sync-state-set epoch, expected
version), so a stale command is rejected deterministically when it is applied, on every replica.

Schema evolution: a field added later must have a default, so older readers simply ignore it (msgspec
skips unknown fields) and newer readers fill it in. `v` is the schema version the writer used; a
reader refuses an event of a newer version than it knows (`SchemaVersionError`) instead of
misreading it, and an unknown event type is refused the same way.

`validate()` checks names, sizes and required fields. Whether this code can apply a record at all is
ONE function, `applicable(value)`: decode (known type, known schema version, every operation of a
`Txn` included) and validate. The applier (statemachines/apply.py) calls it on every committed
record, and the leader calls it (through `event_record`) on the very bytes it is about to propose,
so a leader never proposes a record its own version could not apply: the two checks cannot drift.
"""

from __future__ import annotations

import re
from typing import ClassVar

import msgspec

from eventlog.errors import InvalidArgumentError, SchemaVersionError
from statemachines import views_format
from statemachines.credentials import BearerToken, ScramCredential, check_credential
from statemachines.grants import GrantSyntaxError, check_principal, parse_grant

MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1 << 20
MAX_NAME = 128
MAX_SEQ = 2**63 - 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_TOPIC = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:-]{0,127}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")


class EventError(InvalidArgumentError):
    """An event (or command) is invalid; nothing was appended."""


class InvalidEventError(EventError):
    """A record that decodes but whose fields are invalid (`event` is what it decoded to)."""

    def __init__(self, event: Event, message: str) -> None:
        super().__init__(message)
        self.event = event


def _name(field: str, value: str) -> None:
    if not _NAME.match(value):
        raise EventError(f"{field} {value!r} must be 1-{MAX_NAME} characters of letters, digits, '.', '_', ':', '-' "
                         f"starting with a letter or digit")


SESSIONS_SCHEMA = 2
"""The schema version an event needs to carry client-session fields: a node that knows only version 1
would ignore them and apply a retry twice, so it must refuse (halt on) such an event instead."""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event. `VERSION` is the newest schema version of the type this code knows.

    `session_id`, `seq` and `answered_below` place the event in a client session (statemachines/
    sessions.py): request `seq` of session `session_id` of this group (opened at offset
    session_id - 1), sent when every request of the session below `answered_below` had been answered.
    0: no session.
    """

    VERSION: ClassVar[int] = 2
    v: int = 1
    actor: str = ""
    request_id: str = ""
    session_id: int = 0
    seq: int = 0
    answered_below: int = 0

    def key(self) -> str:
        raise NotImplementedError

    def validate(self) -> None:
        if len(self.actor) > 256:
            raise EventError("actor is longer than 256 characters")
        if len(self.request_id) > 128:
            raise EventError("request_id is longer than 128 characters")
        if self.v < 1:
            raise EventError(f"schema version {self.v} is not valid")
        if self.session_id:
            if self.session_id < 0 or not 1 <= self.seq <= MAX_SEQ:
                raise EventError(f"a request of a session has a session id >= 0 and a seq of 1-{MAX_SEQ}, "
                                 f"got session {self.session_id} seq {self.seq}")
            if not 0 <= self.answered_below <= self.seq:
                raise EventError(f"answered_below {self.answered_below} must be between 0 and the request's "
                                 f"seq {self.seq}")
            if self.v < SESSIONS_SCHEMA:
                raise EventError(f"an event in a client session has schema version {SESSIONS_SCHEMA} or newer "
                                 f"(v={self.v})")
        elif self.seq or self.answered_below:
            raise EventError("seq and answered_below belong to a request of a session (session_id is 0)")


# --- brokers (the controller's registry) -----------------------------------------------------------

class _BrokerEvent(Event, frozen=True, kw_only=True):
    cluster: str
    group: str       # broker group (RocketMQ broker name), e.g. "broker-a"
    name: str        # this broker within the group

    def key(self) -> str:
        return f"broker/{self.cluster}/{self.group}/{self.name}"

    def group_key(self) -> str:
        return f"group/{self.cluster}/{self.group}"

    def validate(self) -> None:
        super().validate()
        _name("cluster", self.cluster)
        _name("group", self.group)
        _name("name", self.name)


class BrokerRegistered(_BrokerEvent, frozen=True, kw_only=True, tag="BrokerRegistered"):
    address: str
    incarnation: str
    broker_id: int
    broker_epoch: int

    def validate(self) -> None:
        super().validate()
        if not _ADDRESS.match(self.address):
            raise EventError(f"address {self.address!r} must be host:port")
        if not self.incarnation or len(self.incarnation) > 128:
            raise EventError("incarnation is required (at most 128 characters)")
        if self.broker_id < 0 or self.broker_epoch < 1:
            raise EventError("broker_id must be >= 0 and broker_epoch >= 1")


class BrokerFenced(_BrokerEvent, frozen=True, kw_only=True, tag="BrokerFenced"):
    broker_epoch: int
    reason: str = ""


class BrokerUnfenced(_BrokerEvent, frozen=True, kw_only=True, tag="BrokerUnfenced"):
    broker_epoch: int


class BrokerUnregistered(_BrokerEvent, frozen=True, kw_only=True, tag="BrokerUnregistered"):
    broker_epoch: int


# --- broker groups: SyncStateSet and master (RocketMQ controller mode) ------------------------------

class _GroupEvent(Event, frozen=True, kw_only=True):
    cluster: str
    group: str

    def key(self) -> str:
        return f"group/{self.cluster}/{self.group}"

    def validate(self) -> None:
        super().validate()
        _name("cluster", self.cluster)
        _name("group", self.group)


class SyncStateSetChanged(_GroupEvent, frozen=True, kw_only=True, tag="SyncStateSetChanged"):
    """The master reports its in-sync replicas; applied only if both epochs are current."""

    sync_state_set: tuple[int, ...]
    master_epoch: int
    sync_state_set_epoch: int


class MasterElected(_GroupEvent, frozen=True, kw_only=True, tag="MasterElected"):
    """A new master (-1: none eligible) in the epoch after `master_epoch`, which must be current."""

    master: int
    master_epoch: int
    sync_state_set: tuple[int, ...] = ()


# --- topics and routes (NameServer) --------------------------------------------------------------

PERM_READ = 4
PERM_WRITE = 2


class _TopicEvent(Event, frozen=True, kw_only=True):
    name: str

    def key(self) -> str:
        return f"topic/{self.name}"

    def validate(self) -> None:
        super().validate()
        _name("topic", self.name)


def _queues(read: int | None, write: int | None, perm: int | None, groups: tuple[str, ...] | None) -> None:
    for label, n in (("read_queues", read), ("write_queues", write)):
        if n is not None and not 0 <= n <= 1024:
            raise EventError(f"{label} must be between 0 and 1024, got {n}")
    if perm is not None and not 0 <= perm <= 7:
        raise EventError(f"perm must be between 0 and 7, got {perm}")
    for g in groups or ():
        _name("broker group", g)


class TopicCreated(_TopicEvent, frozen=True, kw_only=True, tag="TopicCreated"):
    read_queues: int = 8
    write_queues: int = 8
    perm: int = PERM_READ | PERM_WRITE
    broker_groups: tuple[str, ...] = ()
    config: dict[str, str] = {}

    def validate(self) -> None:
        super().validate()
        _queues(self.read_queues, self.write_queues, self.perm, self.broker_groups)


class TopicUpdated(_TopicEvent, frozen=True, kw_only=True, tag="TopicUpdated"):
    read_queues: int | None = None
    write_queues: int | None = None
    perm: int | None = None
    broker_groups: tuple[str, ...] | None = None
    config: dict[str, str] | None = None
    expected_version: int | None = None

    def validate(self) -> None:
        super().validate()
        _queues(self.read_queues, self.write_queues, self.perm, self.broker_groups)


class TopicDeleted(_TopicEvent, frozen=True, kw_only=True, tag="TopicDeleted"):
    expected_version: int | None = None


# --- consumer offsets ----------------------------------------------------------------------------

class OffsetCommitted(Event, frozen=True, kw_only=True, tag="OffsetCommitted"):
    consumer_group: str
    topic: str
    queue_id: int
    offset: int

    def key(self) -> str:
        return f"offset/{self.consumer_group}/{self.topic}/{self.queue_id}"

    def validate(self) -> None:
        super().validate()
        _name("consumer_group", self.consumer_group)
        if not _TOPIC.match(self.topic):   # Kafka's internal-style names (`__kv`) included
            raise EventError(f"topic {self.topic!r} must be 1-{MAX_NAME} characters of letters, digits, '.', '_', "
                             f"':', '-'")
        if self.queue_id < 0 or self.offset < 0:
            raise EventError("queue_id and offset must be >= 0")


class KafkaGroupMember(msgspec.Struct, frozen=True, kw_only=True):
    """One member of a Kafka consumer group, as its coordinator knows it after a rebalance."""

    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 60_000
    metadata: bytes = b""     # the member's subscription, for the group's protocol
    assignment: bytes = b""   # what the leader assigned it


class KafkaGroupStored(Event, frozen=True, kw_only=True, tag="KafkaGroupStored"):
    """A Kafka consumer group's state after a rebalance completed or the group emptied (the
    coordinator, epochlog/kafka/groups.py, writes it), so a new coordinator resumes the generation
    and its members keep their assignment across a coordinator failover."""

    group_id: str
    generation: int
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: tuple[KafkaGroupMember, ...] = ()

    def key(self) -> str:
        return f"kafka-group/{self.group_id}"

    def validate(self) -> None:
        super().validate()
        _name("group_id", self.group_id)
        if self.generation < 0:
            raise EventError("generation must be >= 0")
        if len(self.members) > 10_000:
            raise EventError(f"{len(self.members)} members exceed 10000")
        for m in self.members:
            if not m.member_id or len(m.member_id) > 512:
                raise EventError("a member id is 1-512 characters")
            if len(m.metadata) + len(m.assignment) > MAX_VALUE_BYTES:
                raise EventError(f"member {m.member_id}: metadata and assignment exceed {MAX_VALUE_BYTES} bytes")


# --- key-value data, leases and sessions ---------------------------------------------------------

def _kv_key(key: str) -> None:
    raw = key.encode()
    if not raw or len(raw) > MAX_KEY_BYTES or "\x00" in key:
        raise EventError(f"a key is 1-{MAX_KEY_BYTES} bytes of UTF-8 without NUL")


class KvPut(Event, frozen=True, kw_only=True, tag="KvPut"):
    """Set `name` (the user's key) to `value`; with `expected_version` a compare-and-set (0: must not exist)."""

    name: str
    value: bytes
    lease: int = 0
    expected_version: int | None = None

    def key(self) -> str:
        return f"kv/{self.name}"

    def validate(self) -> None:
        if not self.plainly_valid():
            self.check_each()

    def check_each(self) -> None:
        """Every check of a put, one by one: the first that fails raises its EventError."""
        super().validate()
        _kv_key(self.name)
        if len(self.value) > MAX_VALUE_BYTES:
            raise EventError(f"value of {len(self.value)} bytes exceeds {MAX_VALUE_BYTES}")
        if self.lease < 0:
            raise EventError("lease ids are positive (0 = no lease)")

    def plainly_valid(self) -> bool:
        """True only for a put every check of `check_each` passes: the common one (an ASCII key, a value
        within bounds, a request of a client session or of none), in one expression instead of three
        frames; False says nothing (`check_each` decides, with its message). The applier validates every
        committed KvPut (tests/statemachines/test_events.py holds the two together)."""
        name = self.name
        sid = self.session_id
        return (0 < len(name) <= MAX_KEY_BYTES and name.isascii() and "\x00" not in name
                and len(self.value) <= MAX_VALUE_BYTES and self.lease >= 0
                and len(self.actor) <= 256 and len(self.request_id) <= 128
                and ((sid > 0 and 0 <= self.answered_below <= self.seq <= MAX_SEQ and self.seq >= 1
                      and self.v >= SESSIONS_SCHEMA)
                     or (sid == 0 and self.seq == 0 and self.answered_below == 0 and self.v >= 1)))


class KvDeleted(Event, frozen=True, kw_only=True, tag="KvDeleted"):
    name: str
    expected_version: int | None = None

    def key(self) -> str:
        return f"kv/{self.name}"

    def validate(self) -> None:
        super().validate()
        _kv_key(self.name)


class _LeaseEvent(Event, frozen=True, kw_only=True):
    lease_id: int

    def key(self) -> str:
        return f"lease/{self.lease_id:020d}"

    def validate(self) -> None:
        super().validate()
        if self.lease_id <= 0:
            raise EventError("lease ids are positive integers")


class LeaseGranted(_LeaseEvent, frozen=True, kw_only=True, tag="LeaseGranted"):
    ttl_ms: int

    def validate(self) -> None:
        super().validate()
        if not 100 <= self.ttl_ms <= 7 * 24 * 3600 * 1000:
            raise EventError(f"ttl_ms must be between 100 ms and 7 days, got {self.ttl_ms}")


class LeaseRevoked(_LeaseEvent, frozen=True, kw_only=True, tag="LeaseRevoked"):
    pass


class LeaseExpired(_LeaseEvent, frozen=True, kw_only=True, tag="LeaseExpired"):
    pass


class SessionOpened(Event, frozen=True, kw_only=True, tag="SessionOpened"):
    """An MQTT-style client session, attached to a lease when ephemeral."""

    client_id: str
    node: str = ""
    clean: bool = True
    lease: int = 0

    def key(self) -> str:
        return f"session/{self.client_id}"

    def validate(self) -> None:
        super().validate()
        _kv_key(self.client_id)


class SessionClosed(Event, frozen=True, kw_only=True, tag="SessionClosed"):
    client_id: str

    def key(self) -> str:
        return f"session/{self.client_id}"

    def validate(self) -> None:
        super().validate()
        _kv_key(self.client_id)


class ConfigChanged(Event, frozen=True, kw_only=True, tag="ConfigChanged"):
    scope: str
    name: str
    value: str | None = None   # None removes the setting

    def key(self) -> str:
        return f"config/{self.scope}/{self.name}"

    def validate(self) -> None:
        super().validate()
        _name("scope", self.scope)
        _name("config name", self.name)


# --- client sessions (statemachines/sessions.py) ------------------------------------------------------

class _ClientSessionEvent(Event, frozen=True, kw_only=True):
    group: str       # the Raft group the session is in (the record key names it, for routing)
    client: str      # the client that opened it: a name and a random part (diagnostics; the record key)

    def key(self) -> str:
        return f"client-session/{self.group}/{self.client}"

    def validate(self) -> None:
        super().validate()
        _name("group", self.group)
        if not 1 <= len(self.client.encode()) <= 256 or "\x00" in self.client:
            raise EventError("client is 1-256 bytes of UTF-8 without NUL")


class ClientSessionOpened(_ClientSessionEvent, frozen=True, kw_only=True, tag="ClientSessionOpened"):
    """A writing client's session in `group`; its id is the offset this record commits at. The leader
    stamps the bounds from its config before proposing, so every replica applies the same ones."""

    timeout_ms: int = 3_600_000
    max_outcomes: int = 10_000
    max_sessions: int = 100_000

    def validate(self) -> None:
        super().validate()
        if self.session_id:
            raise EventError("a session is opened outside any session")
        if not 1_000 <= self.timeout_ms <= 30 * 24 * 3600 * 1000:
            raise EventError(f"timeout_ms must be between 1 s and 30 days, got {self.timeout_ms}")
        if not 1 <= self.max_outcomes <= 1_000_000 or not 1 <= self.max_sessions <= 100_000_000:
            raise EventError("max_outcomes (1-1000000) and max_sessions (1-100000000) are positive")


class ClientSessionClosed(_ClientSessionEvent, frozen=True, kw_only=True, tag="ClientSessionClosed"):
    """The client is done with its session (a request of that session): its outcomes are forgotten."""

    def validate(self) -> None:
        super().validate()
        if not self.session_id:
            raise EventError("a session is closed by a request of that session (session_id)")


# --- cluster members (written by the node's membership operations, never by clients) -----------------

class _MemberEvent(Event, frozen=True, kw_only=True):
    node_id: int

    def key(self) -> str:
        return f"member/{self.node_id}"

    def validate(self) -> None:
        super().validate()
        if self.node_id <= 0:
            raise EventError("node ids are positive integers")


class MemberAdded(_MemberEvent, frozen=True, kw_only=True, tag="MemberAdded"):
    """A node joins the cluster: where its peers and clients reach it (every node dials from this)."""

    peer_address: str
    client_address: str = ""

    def validate(self) -> None:
        super().validate()
        if not _ADDRESS.match(self.peer_address):
            raise EventError(f"peer_address {self.peer_address!r} must be host:port")
        if self.client_address and not _ADDRESS.match(self.client_address):
            raise EventError(f"client_address {self.client_address!r} must be host:port")


class MemberRemoved(_MemberEvent, frozen=True, kw_only=True, tag="MemberRemoved"):
    """A node left the cluster (configured members too): nodes stop dialing it and refuse it."""


# --- retention (written by the leader's compaction service, never by clients) ---------------------------

class HistoryPruned(Event, frozen=True, kw_only=True, tag="HistoryPruned"):
    """The views' history starts at `floor` from this offset on: `as_of` below it is refused as
    compacted, and history rows it hides may be deleted. Committed like any event, so every replica
    prunes the same history at the same offset (compaction/policy.py decides the floor)."""

    floor: int

    def key(self) -> str:
        return "retention/history"

    def validate(self) -> None:
        super().validate()
        if self.floor < 0:
            raise EventError(f"a history floor is an offset >= 0, got {self.floor}")


class ViewsFormatRaised(Event, frozen=True, kw_only=True, tag="ViewsFormatRaised"):
    """The group's views are written at format `level` from the next offset on (statemachines/
    views_format.py). Proposed by the group's leader once every member can apply it, never by clients.

    A raise to level L is written with schema version v = L, so a node whose code knows fewer levels
    refuses it as a newer schema and halts there (statemachines/apply.py) instead of going on at the
    old level."""

    VERSION: ClassVar[int] = views_format.LATEST
    level: int

    def key(self) -> str:
        return "views/format"

    def validate(self) -> None:
        super().validate()
        if self.level <= views_format.BASE or self.v != self.level:
            raise EventError(f"a views format raise goes to a level above {views_format.BASE}, written with "
                             f"schema version v equal to it (level {self.level}, v {self.v})")


# --- users and ACLs (statemachines/credentials.py, statemachines/grants.py, statemachines/access.py) ------

class UserAdded(Event, frozen=True, kw_only=True, tag="UserAdded"):
    """A user and its credentials, whole (adding an existing user replaces them: a password change, a
    token added or revoked). Only salted SCRAM keys and token hashes: never a password or a token."""

    name: str
    scram: tuple[ScramCredential, ...] = ()
    tokens: tuple[BearerToken, ...] = ()

    def key(self) -> str:
        return f"user/{self.name}"

    def validate(self) -> None:
        super().validate()
        _principal(self.name)
        if len({c.mechanism for c in self.scram}) != len(self.scram):
            raise EventError("at most one SCRAM credential per mechanism")
        for c in self.scram:
            problem = check_credential(c)
            if problem:
                raise EventError(f"user {self.name}: {problem}")
        if len(self.tokens) > 64:
            raise EventError("at most 64 bearer tokens per user")
        for t in self.tokens:
            if len(t.sha256) != 32 or t.expires_ms < 0:
                raise EventError("a bearer token is stored as its 32-byte SHA-256 and an expiry >= 0")


class UserRemoved(Event, frozen=True, kw_only=True, tag="UserRemoved"):
    name: str

    def key(self) -> str:
        return f"user/{self.name}"

    def validate(self) -> None:
        super().validate()
        _principal(self.name)


class _AclEvent(Event, frozen=True, kw_only=True):
    principal: str   # a user's name or a client certificate's name
    role: str
    resource: str = ""

    def key(self) -> str:
        return f"acl/{self.principal}/{self.role}:{self.resource}"

    def validate(self) -> None:
        super().validate()
        _principal(self.principal)
        try:
            parse_grant(self.role, self.resource)
        except GrantSyntaxError as exc:
            raise EventError(str(exc)) from None


class AclGranted(_AclEvent, frozen=True, kw_only=True, tag="AclGranted"):
    """`principal` holds the role (scoped to `resource`) from this offset on."""


class AclRevoked(_AclEvent, frozen=True, kw_only=True, tag="AclRevoked"):
    """`principal` no longer holds the role (scoped to `resource`) from this offset on."""


def _principal(name: str) -> None:
    try:
        check_principal(name)
    except GrantSyntaxError as exc:
        raise EventError(str(exc)) from None


# --- transactions ----------------------------------------------------------------------------------

ENTITY_KINDS = ("broker", "group", "topic", "offset", "kv", "lease", "session", "config", "member", "kafka-group",
                "user", "acl")


class Condition(msgspec.Struct, frozen=True):
    """A transaction guard on an entity: its version must equal `version` (0 = must not exist)."""

    key: str
    version: int

    def validate(self) -> None:
        if self.key.split("/", 1)[0] not in ENTITY_KINDS or "/" not in self.key:
            raise EventError(f"condition key {self.key!r} is not an entity key ({', '.join(ENTITY_KINDS)}/...)")
        if self.version < 0:
            raise EventError("a condition's version is >= 0 (0: the entity must not exist)")


class Txn(Event, frozen=True, kw_only=True, tag="Txn"):
    """Several events applied all or nothing, if every condition holds."""

    conditions: tuple[Condition, ...] = ()
    ops: tuple[KvPut | KvDeleted | OffsetCommitted | ConfigChanged | TopicCreated | TopicUpdated
               | TopicDeleted, ...] = ()

    def key(self) -> str:
        return f"txn/{self.ops[0].key()}" if self.ops else "txn/"

    def validate(self) -> None:
        super().validate()
        if not self.ops or len(self.ops) > 128:
            raise EventError("a transaction has 1 to 128 operations")
        for cond in self.conditions:
            cond.validate()
        for op in self.ops:
            op.validate()
        if len({op.key() for op in self.ops}) != len(self.ops):
            raise EventError("a transaction touches each key at most once")


AnyEvent = (BrokerRegistered | BrokerFenced | BrokerUnfenced | BrokerUnregistered | SyncStateSetChanged
            | MasterElected | TopicCreated | TopicUpdated | TopicDeleted | OffsetCommitted | KvPut | KvDeleted
            | LeaseGranted | LeaseRevoked | LeaseExpired | SessionOpened | SessionClosed | ConfigChanged | Txn
            | MemberAdded | MemberRemoved | KafkaGroupStored | HistoryPruned | ClientSessionOpened
            | ClientSessionClosed | UserAdded | UserRemoved | AclGranted | AclRevoked | ViewsFormatRaised)
EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls for cls in AnyEvent.__args__  # type: ignore[attr-defined]
}

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyEvent)

# What decoding untrusted msgpack or JSON may raise: msgspec's errors, RecursionError (nesting deeper
# than this process decodes) and UnicodeDecodeError (msgspec up to 0.22 raised it for a str that is not
# UTF-8; 0.23 raises a DecodeError instead).
DECODE_ERRORS = (msgspec.DecodeError, RecursionError, UnicodeDecodeError)


def decode_problem(exc: BaseException) -> str:
    """What a decode error of DECODE_ERRORS says, in words that stay the same on every msgspec version
    (clients and tests match on them): "nested too deeply", "a string is not UTF-8 (...)", else msgspec's."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"a string is not UTF-8 ({exc.reason} at byte {exc.start} of it)"
    text = str(exc)
    return "a string is not UTF-8" if text.startswith("Invalid UTF-8") else text


decode_any = _decoder.decode
"""The event of a record value, unchecked: `decode_event` without its error wording and version check
(msgspec's exceptions as they are), for a fast path that hands any error back to `decode_event`."""


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


def decode_event(data: bytes | memoryview) -> Event:
    """Decode a record value; refuses unknown types and newer schema versions with a clear error.

    SchemaVersionError: a type or version this code does not know (a newer Epochlog wrote it).
    EventError: bytes that are no event (not msgpack, a field of the wrong type, nested too deeply).
    """
    try:
        event: Event = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        kind = _peek_type(data)
        if kind is not None and kind not in EVENT_TYPES:
            raise SchemaVersionError(f"unknown event type {kind!r}: written by a newer Epochlog?") from None
        raise EventError(f"malformed event: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:   # alike on every replica
        raise EventError(f"malformed event: {decode_problem(exc)}") from None
    except RecursionError:
        # Only an unknown field can nest without bound (every known field has a bounded shape);
        # how deep this process can decode depends on its stack, so this is not "malformed" alike
        # on every replica: the applier halts on it instead of rejecting it (statemachines/apply.py).
        raise RecursionError("event nested too deeply to decode") from None
    if event.v > type(event).VERSION or isinstance(event, Txn):   # what `check_versions` returns at once for
        check_versions(event)                                        # (the common case) without its call
    return event


def written_keys(record_key: bytes | memoryview | None, value: bytes | memoryview | None) -> tuple[bytes, ...]:
    """The entity keys a record writes besides its own key: a Txn's record key names its first operation
    only (`txn/<key>`), so a reader matching keys (a watch on a prefix) asks for its operations' keys here.
    () for any other record, and for a value that does not decode (it applied nothing)."""
    if record_key is None or value is None or bytes(record_key[:4]) != b"txn/":
        return ()
    try:
        event = _decoder.decode(value)
    except DECODE_ERRORS:
        return ()
    return tuple(op.key().encode() for op in event.ops) if isinstance(event, Txn) else ()


def check_versions(event: Event) -> None:
    """SchemaVersionError when `event`, or an operation of a `Txn`, has a newer schema version than this code."""
    if event.v <= type(event).VERSION and not isinstance(event, Txn):
        return   # the common case, without building the tuple below
    for e in (event, *event.ops) if isinstance(event, Txn) else (event,):
        known = type(e).VERSION
        if e.v > known:
            raise SchemaVersionError(f"{type(e).__name__} version {e.v} is newer than this Epochlog knows ({known})")


def applicable(value: bytes | memoryview) -> Event:
    """The event of a record value when this code can apply it: THE test shared by the applier and the
    leader's check before proposing (`event_record`).

    SchemaVersionError: this code is too old for it (a newer schema version or an unknown type);
    upgrading the node helps. InvalidEventError (an EventError): it decodes, but its fields are invalid;
    EventError: it does not decode. Neither is applied by any version of this code.
    """
    event = decode_event(value)
    try:
        event.validate()
    except EventError as exc:
        raise InvalidEventError(event, str(exc)) from None
    return event


def _peek_type(data: bytes | memoryview) -> str | None:
    try:
        raw = msgspec.msgpack.decode(data)
    except DECODE_ERRORS:
        return None
    return raw.get("type") if isinstance(raw, dict) else None


def event_record(event: Event) -> tuple[bytes, bytes]:
    """(record key, record value) of an event this code can apply; else EventError (invalid_argument):
    nothing is appended. The encoded value goes through `applicable`, the applier's own test, so no
    record a leader proposes can stop its replicas of the same version."""
    key, value, _ = checked_record(event)
    return key, value


def checked_record(event: Event) -> tuple[bytes, bytes, Event]:
    """`event_record`'s (key, value) and the event `applicable` decoded from that value: what the
    applier of the same code gets from the record, so the leader can hand it over instead of the
    applier decoding the value a second time (statemachines/apply.py `Applier.expect`)."""
    value = encode_event(event)
    try:
        checked = applicable(value)
    except SchemaVersionError as exc:
        raise EventError(f"{exc}: refused, nothing was written (a node writes only what it can apply)") from None
    except RecursionError as exc:
        raise EventError(str(exc)) from None
    return checked.key().encode(), value, checked


_events_decoder = msgspec.msgpack.Decoder(list[AnyEvent])


def checked_records(events: list[Event]) -> list[tuple[bytes, bytes, Event]] | None:
    """`checked_record` of each of `events` with one decode call for all their values (the leader checks
    a write's hundred events in one call instead of a hundred), or None when any of them would not pass
    `checked_record`: the caller then checks them one by one, which raises its error at its event.

    The same test, not a weaker one: each value is what `encode_event` made of one event, a single whole
    msgpack object, and msgpack is self-delimiting, so the array of the values joined decodes each of them
    exactly as `applicable` decodes it alone (an object that ends at its last byte alone ends there in the
    array; msgspec refuses trailing bytes). The version check and `validate` are `applicable`'s, per event.
    """
    count = len(events)
    head = bytes((0x90 | count,)) if count < 16 else b"\xdc" + count.to_bytes(2, "big") if count < 1 << 16 else (
        b"\xdd" + count.to_bytes(4, "big"))
    try:
        values = [_encoder.encode(e) for e in events]
        decoded: list[Event] = _events_decoder.decode(head + b"".join(values))
        out = []
        for value, event in zip(values, decoded, strict=True):
            check_versions(event)
            event.validate()
            out.append((event.key().encode(), value, event))
    except Exception:   # noqa: BLE001 - not hidden: the caller's one-by-one check meets it again, at its event
        return None
    return out
