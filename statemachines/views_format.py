"""The views format level of a group: which rows its applier writes for an event (docs/views.md).

Theory of operation. The views' rows and the running digest over them are compared by members at equal
offsets, so every member must write the same rows for the same entry: the format cannot change with the
code a node runs, only at an offset of the log. As Kafka's `metadata.version` (KIP-584), the level is
set by a committed event, `ViewsFormatRaised(level)`: every member applies the entries before it at the
old level and the entries after it at the new one, whatever version it runs, and the level (meta key
`views_format`, absent: level 1) is part of the views, so snapshots and restarts keep it and the digest
chains it.

Levels:

1. Every change of an entity writes its entity row and a `versions` row holding the state after it
   (what every Epochlog before levels wrote; a store without the meta key is at level 1).
2. For the kinds whose states one event type writes (`LATEST_IN_ENTITY`: kv, offset, lease, ...), the
   latest state lives only in the entity row; a `versions` row is written for a state once it is
   superseded (the previous state moves there, keyed by its own offset as before) or deleted (then a
   tombstone row too). A first write of a key is one row instead of two. The reads (statemachines/
   query.py) and the history pruner (prune.py) read an entity's history as its `versions` rows plus its
   entity row, so they answer alike at both levels (tests/statemachines/test_views_format.py).
3. As 2, and a client session's consecutive ok requests share one outcome row (statemachines/
   sessions.py `OkRun`): requests seq.. seq + n - 1 ok at offsets o.. o + n - 1 are one row keyed by
   the session and seq, holding (o, n). A request ok at offset o + n extends the run ending at its
   seq - 1; any other starts a run; a failed request keeps a row of its own `Outcome`, as before.
   Which row a request extends is read from the rows (the applier's mirror of them, read again from the
   views when it does not hold the session), so every replica writes the same rows. An entry of 100
   puts of one session writes one outcome row instead of 100, and forgetting answered requests deletes
   a row per run (and rewrites the run it cuts). Rows written at level 2 stay as they are and answer
   retries as before.

The rule for raising (`level_to_propose`): the leader of a group proposes the newest level every member
of the group's configuration can apply, once each has said so (the `views_format` feature of its peer
hello, eventlog/raft/runtime/transport.py), and only upwards. A node of a version without levels sends
no such feature (level 1), so a mixed-version cluster stays at level 1 until every member is upgraded; a
new cluster reaches the newest level with its first leader, as soon as every member has connected. A
node that meets a raise to a level it does not know (a member downgraded after saying it supports it, a
node added later from an older version) refuses it as a newer schema and halts the group there
(statemachines/apply.py): it never writes another level's rows.
"""

from __future__ import annotations

from collections.abc import Iterable

from statemachines.store_keys import decode_offset, encode_offset

FEATURE = "views_format"
"""The name of the peer-hello feature carrying the newest level a node can apply."""
META_KEY = b"views_format"
"""Meta key of the views: the level, 8-byte big-endian (absent: BASE)."""
BASE = 1
LATEST = 3
"""The newest level this code applies (and advertises)."""
OUTCOME_RUNS = 3
"""The level from which a session's consecutive ok requests share one outcome row (statemachines/sessions.py)."""

LATEST_IN_ENTITY: dict[bytes, str] = {
    b"kv": "KvPut", b"offset": "OffsetCommitted", b"lease": "LeaseGranted", b"session": "SessionOpened",
    b"config": "ConfigChanged", b"kafka-group": "KafkaGroupStored", b"user": "UserAdded", b"acl": "AclGranted",
}
"""At level 2: entity kinds whose latest state is only in the entity row, and the one event type that
writes their states (the `event` of their history rows: no row needs to say it). Brokers, broker groups,
topics and members are written by several event types and keep a `versions` row for every state."""


def decode_level(raw: bytes | None) -> int:
    return BASE if raw is None else decode_offset(raw)


def encode_level(level: int) -> bytes:
    return encode_offset(level)


def latest_in_entity(level: int, entity_key: bytes) -> bool:
    """Whether a state of `entity_key` written at `level` leaves its `versions` row until it is superseded
    (from level 2 on)."""
    return level >= 2 and entity_key.partition(b"/")[0] in LATEST_IN_ENTITY


def level_to_propose(current: int, supported: Iterable[int | None]) -> int | None:
    """The level a group's leader proposes: the newest every member can apply (`supported`: each member's
    advertised level, this node's own included; None: not heard yet), when above `current`; else None."""
    levels = list(supported)
    if not levels or any(level is None for level in levels):
        return None
    target = min(LATEST, *(level for level in levels if level is not None))
    return target if target > current else None
