"""The state of each kind of entity, as stored in its column family, and apply outcomes.

Every state carries `version` (the offset of the event that last changed it, etcd's mod_revision:
the token for compare-and-set) and `created` (the offset that created it).
"""

from __future__ import annotations

import msgspec

from statemachines.credentials import BearerToken, ScramCredential
from statemachines.events import KafkaGroupMember


class BrokerState(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str
    group: str
    name: str
    address: str
    incarnation: str
    broker_id: int
    broker_epoch: int
    fenced: bool = False
    version: int
    created: int


class GroupState(msgspec.Struct, frozen=True, kw_only=True):
    """A broker group (RocketMQ broker name): its master and SyncStateSet, both epoch-stamped."""

    cluster: str
    group: str
    master: int = -1
    master_epoch: int = 0
    sync_state_set: tuple[int, ...] = ()
    sync_state_set_epoch: int = 0
    brokers: dict[str, int] = {}   # broker name -> broker id
    version: int
    created: int


class TopicState(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    read_queues: int
    write_queues: int
    perm: int
    broker_groups: tuple[str, ...]
    config: dict[str, str]
    version: int
    created: int


class OffsetState(msgspec.Struct, frozen=True, kw_only=True):
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    version: int
    created: int


class KvState(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    value: bytes
    lease: int = 0
    version: int
    created: int


class LeaseState(msgspec.Struct, frozen=True, kw_only=True):
    lease_id: int
    ttl_ms: int
    version: int
    created: int


class SessionState(msgspec.Struct, frozen=True, kw_only=True):
    client_id: str
    node: str
    clean: bool
    lease: int
    version: int
    created: int


class ConfigState(msgspec.Struct, frozen=True, kw_only=True):
    scope: str
    name: str
    value: str
    version: int
    created: int


class MemberState(msgspec.Struct, frozen=True, kw_only=True):
    """A node's addresses; `removed` marks a node that left (a configured member too, which has no
    record otherwise): the configured list overlaid by these records is the cluster's address book."""

    node_id: int
    peer_address: str
    client_address: str = ""
    removed: bool = False
    version: int
    created: int


class KafkaGroupState(msgspec.Struct, frozen=True, kw_only=True):
    """A Kafka consumer group as its coordinator last stored it (events.KafkaGroupStored)."""

    group_id: str
    generation: int
    protocol_type: str
    protocol: str
    leader: str
    members: tuple[KafkaGroupMember, ...]
    version: int
    created: int


class UserState(msgspec.Struct, frozen=True, kw_only=True):
    """A user's credentials (statemachines/credentials.py: salted SCRAM keys, token hashes)."""

    name: str
    scram: tuple[ScramCredential, ...] = ()
    tokens: tuple[BearerToken, ...] = ()
    version: int
    created: int


class AclState(msgspec.Struct, frozen=True, kw_only=True):
    """One grant of one principal (statemachines/grants.py); the key lists a principal's grants."""

    principal: str
    role: str
    resource: str = ""
    version: int
    created: int


AnyState = (BrokerState | GroupState | TopicState | OffsetState | KvState | LeaseState | SessionState
            | ConfigState | MemberState | KafkaGroupState | UserState | AclState)
STATE_TYPES: dict[str, type[msgspec.Struct]] = {
    "broker": BrokerState, "group": GroupState, "topic": TopicState, "offset": OffsetState, "kv": KvState,
    "lease": LeaseState, "session": SessionState, "config": ConfigState, "member": MemberState,
    "kafka-group": KafkaGroupState, "user": UserState, "acl": AclState,
}


class Version(msgspec.Struct, frozen=True, array_like=True):
    """One row of the `versions` history: which event changed the entity, and its state after it."""

    event: str
    state: bytes | None   # encoded state; None = deleted


class Outcome(msgspec.Struct, frozen=True, array_like=True):
    """What applying one record did: `ok`, or the reason it was rejected (the event changed nothing).

    `duplicate` marks a retried request id: the outcome is that of its first application, at
    `offset`.
    """

    ok: bool
    offset: int
    code: str = ""
    message: str = ""
    duplicate: bool = False


_encoders: dict[type, msgspec.msgpack.Encoder] = {}
_encoder = msgspec.msgpack.Encoder()
_decoders = {kind.encode(): msgspec.msgpack.Decoder(cls) for kind, cls in STATE_TYPES.items()}
_version_decoder = msgspec.msgpack.Decoder(Version)
_outcome_decoder = msgspec.msgpack.Decoder(Outcome)


def encode(obj: msgspec.Struct) -> bytes:
    return _encoder.encode(obj)


def decode_state(entity_key: bytes, data: bytes) -> msgspec.Struct:
    return _decoders[entity_key.partition(b"/")[0]].decode(data)


def decode_version(data: bytes) -> Version:
    return _version_decoder.decode(data)


def decode_outcome(data: bytes) -> Outcome:
    return _outcome_decoder.decode(data)
