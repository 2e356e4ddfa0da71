"""What each Epochlog event sets, for key compaction of a group's log (`compact_groups`).

The log cleaner (compaction/cleaner.py) keeps, below its horizon, only the records a reader
rebuilding state from the log still needs: per entity, its latest record that set the WHOLE state,
and the records after it that set part of it. `compaction_key(record key, record value)` says which
a record is (`CompactionKey`); `is_delete(record)` says whether a whole-state record is a delete
(a tombstone: kept `delete_retention_ms`, then dropped). Both are module-level functions of the
record alone, so the cleaner's worker process imports them (no views, no state).

Whole state (the entity now equals this; supersedes every earlier record of the entity):
BrokerRegistered, TopicCreated, OffsetCommitted, KvPut (hosted Kafka topics' records included),
LeaseGranted, SessionOpened, ConfigChanged, MemberAdded, MemberRemoved (kept: it keeps a configured
member out), KafkaGroupStored, HistoryPruned (one entity, `retention/history`: only the latest floor
matters), ClientSessionOpened (the sessions themselves live in the views: statemachines/sessions.py),
UserAdded, AclGranted, ViewsFormatRaised (one entity, `views/format`: levels only rise, the latest
is the level), and the deletes BrokerUnregistered, TopicDeleted, KvDeleted, SessionClosed,
ClientSessionClosed, UserRemoved, AclRevoked, ConfigChanged with no value.

Part of the state, set wholly (an *aspect*: superseded by a later record of the aspect or of the
whole entity): BrokerFenced / BrokerUnfenced (the `fenced` flag of a registered broker).

Part of the state, not set wholly by any record (superseded only by a later whole-state record):
TopicUpdated (the fields it names).

Never compacted (None: kept, supersedes nothing), because their effect is not "this entity now
equals this record": a `Txn` (its record key names its first operation only; it may touch up to 128
entities, all or nothing), LeaseRevoked / LeaseExpired (they delete every entity attached to the
lease too), SyncStateSetChanged / MasterElected (they change a broker group whose brokers, master
epoch and sync-state-set epoch no single record carries), records with no key, a value that is no
event this code knows (a newer Epochlog's: never guessed), and anything that does not decode. Raft's
own control records (`__raft/noop`, `__raft/conf`) are compacted by their key, as the cleaner
always did.

Records that changed nothing when applied (rejected, retried request ids, skipped) are not judged
here: the node hands their offsets to the cleaner, which drops them (statemachines/noops.py).
"""

from __future__ import annotations

from typing import Final

import msgspec

from compaction.rewrite import CompactionKey
from eventlog.records import Record
from statemachines import events as ev

WHOLE: Final = frozenset({
    "BrokerRegistered", "BrokerUnregistered", "TopicCreated", "TopicDeleted", "OffsetCommitted", "KvPut",
    "KvDeleted", "LeaseGranted", "SessionOpened", "SessionClosed", "ConfigChanged", "MemberAdded",
    "MemberRemoved", "KafkaGroupStored", "HistoryPruned", "ClientSessionOpened", "ClientSessionClosed",
    "UserAdded", "UserRemoved", "AclGranted", "AclRevoked", "ViewsFormatRaised"})
ASPECTS: Final = {"BrokerFenced": b"fenced", "BrokerUnfenced": b"fenced"}
PARTIAL: Final = frozenset({"TopicUpdated"})
NEVER: Final = frozenset({"Txn", "LeaseRevoked", "LeaseExpired", "SyncStateSetChanged", "MasterElected"})
DELETES: Final = frozenset({"BrokerUnregistered", "TopicDeleted", "KvDeleted", "SessionClosed", "ClientSessionClosed",
                            "UserRemoved", "AclRevoked"})
CONTROL_PREFIX: Final = b"__raft/"

_STR8 = 0xD9


def event_type(value: bytes | memoryview | None) -> str | None:
    """The type tag of an encoded event, read from its first bytes (msgspec writes the tag field
    first), or None when `value` does not start like one."""
    if value is None or len(value) < 7:
        return None
    view = memoryview(value)
    first = view[0]
    if 0x80 <= first <= 0x8F:
        pos = 1
    elif first == 0xDE:
        pos = 3
    elif first == 0xDF:
        pos = 5
    else:
        return None
    if bytes(view[pos:pos + 5]) != b"\xa4type":
        return None
    pos += 5
    if pos >= len(view):
        return None
    head = view[pos]
    if 0xA0 <= head <= 0xBF:
        length, pos = head - 0xA0, pos + 1
    elif head == _STR8 and pos + 1 < len(view):
        length, pos = view[pos + 1], pos + 2
    else:
        return None
    if pos + length > len(view):
        return None
    try:
        return bytes(view[pos:pos + length]).decode("ascii")
    except UnicodeDecodeError:
        return None


def compaction_key(key: bytes | None, value: bytes | memoryview | None) -> CompactionKey | None:
    """What the record (key, value) sets (see the module docstring); None: never compacted."""
    if not key:
        return None
    if key.startswith(CONTROL_PREFIX):
        return CompactionKey(bytes(key))
    kind = event_type(value)
    if kind is None:
        return None
    if kind in WHOLE:
        return CompactionKey(bytes(key))
    aspect = ASPECTS.get(kind)
    if aspect is not None:
        return CompactionKey(bytes(key), aspect)
    if kind in PARTIAL:
        return CompactionKey(bytes(key), b"")
    return None   # NEVER, or a type this code does not know


def is_delete(record: Record) -> bool:
    """Whether a whole-state record deletes its entity (a tombstone, dropped once `delete_retention_ms`
    passed): BrokerUnregistered, TopicDeleted, KvDeleted, SessionClosed, a ConfigChanged without
    value. Asked of records `compaction_key` maps as whole-state only; anything that does not decode
    is no tombstone (kept)."""
    kind = event_type(record.value)
    if kind in DELETES:
        return True
    if kind != "ConfigChanged" or record.value is None:
        return False
    try:
        event = ev.decode_event(record.value)
    except (ev.EventError, ev.SchemaVersionError, RecursionError, msgspec.MsgspecError):
        return False
    return isinstance(event, ev.ConfigChanged) and event.value is None
