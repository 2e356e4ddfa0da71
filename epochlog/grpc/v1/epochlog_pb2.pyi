from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSISTENCY_UNSPECIFIED: _ClassVar[Consistency]
    LINEARIZABLE: _ClassVar[Consistency]
    LEASE: _ClassVar[Consistency]
    LOCAL: _ClassVar[Consistency]
CONSISTENCY_UNSPECIFIED: Consistency
LINEARIZABLE: Consistency
LEASE: Consistency
LOCAL: Consistency

class PutRequest(_message.Message):
    __slots__ = ("name", "value", "lease", "expected_version", "request_id", "actor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    lease: int
    expected_version: int
    request_id: str
    actor: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ..., lease: _Optional[int] = ..., expected_version: _Optional[int] = ..., request_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("name", "expected_version", "request_id", "actor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    expected_version: int
    request_id: str
    actor: str
    def __init__(self, name: _Optional[str] = ..., expected_version: _Optional[int] = ..., request_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("key", "version")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class TxnOp(_message.Message):
    __slots__ = ("put", "delete")
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    put: PutRequest
    delete: DeleteRequest
    def __init__(self, put: _Optional[_Union[PutRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ...) -> None: ...

class TxnRequest(_message.Message):
    __slots__ = ("conditions", "ops", "request_id", "actor")
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    ops: _containers.RepeatedCompositeFieldContainer[TxnOp]
    request_id: str
    actor: str
    def __init__(self, conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., ops: _Optional[_Iterable[_Union[TxnOp, _Mapping]]] = ..., request_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class CommandRequest(_message.Message):
    __slots__ = ("type", "event_msgpack", "event_json", "broker_registered", "broker_fenced", "broker_unfenced", "broker_unregistered", "topic_created", "topic_updated", "topic_deleted", "offset_committed")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_MSGPACK_FIELD_NUMBER: _ClassVar[int]
    EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    BROKER_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    BROKER_FENCED_FIELD_NUMBER: _ClassVar[int]
    BROKER_UNFENCED_FIELD_NUMBER: _ClassVar[int]
    BROKER_UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    TOPIC_CREATED_FIELD_NUMBER: _ClassVar[int]
    TOPIC_UPDATED_FIELD_NUMBER: _ClassVar[int]
    TOPIC_DELETED_FIELD_NUMBER: _ClassVar[int]
    OFFSET_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    type: str
    event_msgpack: bytes
    event_json: str
    broker_registered: BrokerRegistered
    broker_fenced: BrokerFenced
    broker_unfenced: BrokerUnfenced
    broker_unregistered: BrokerUnregistered
    topic_created: TopicCreated
    topic_updated: TopicUpdated
    topic_deleted: TopicDeleted
    offset_committed: OffsetCommitted
    def __init__(self, type: _Optional[str] = ..., event_msgpack: _Optional[bytes] = ..., event_json: _Optional[str] = ..., broker_registered: _Optional[_Union[BrokerRegistered, _Mapping]] = ..., broker_fenced: _Optional[_Union[BrokerFenced, _Mapping]] = ..., broker_unfenced: _Optional[_Union[BrokerUnfenced, _Mapping]] = ..., broker_unregistered: _Optional[_Union[BrokerUnregistered, _Mapping]] = ..., topic_created: _Optional[_Union[TopicCreated, _Mapping]] = ..., topic_updated: _Optional[_Union[TopicUpdated, _Mapping]] = ..., topic_deleted: _Optional[_Union[TopicDeleted, _Mapping]] = ..., offset_committed: _Optional[_Union[OffsetCommitted, _Mapping]] = ...) -> None: ...

class BrokerRegistered(_message.Message):
    __slots__ = ("cluster", "group", "name", "address", "incarnation", "broker_id", "broker_epoch", "actor", "request_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    group: str
    name: str
    address: str
    incarnation: str
    broker_id: int
    broker_epoch: int
    actor: str
    request_id: str
    def __init__(self, cluster: _Optional[str] = ..., group: _Optional[str] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[str] = ..., broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class BrokerFenced(_message.Message):
    __slots__ = ("cluster", "group", "name", "broker_epoch", "reason", "actor", "request_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    group: str
    name: str
    broker_epoch: int
    reason: str
    actor: str
    request_id: str
    def __init__(self, cluster: _Optional[str] = ..., group: _Optional[str] = ..., name: _Optional[str] = ..., broker_epoch: _Optional[int] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class BrokerUnfenced(_message.Message):
    __slots__ = ("cluster", "group", "name", "broker_epoch", "actor", "request_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    group: str
    name: str
    broker_epoch: int
    actor: str
    request_id: str
    def __init__(self, cluster: _Optional[str] = ..., group: _Optional[str] = ..., name: _Optional[str] = ..., broker_epoch: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class BrokerUnregistered(_message.Message):
    __slots__ = ("cluster", "group", "name", "broker_epoch", "actor", "request_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    group: str
    name: str
    broker_epoch: int
    actor: str
    request_id: str
    def __init__(self, cluster: _Optional[str] = ..., group: _Optional[str] = ..., name: _Optional[str] = ..., broker_epoch: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class TopicCreated(_message.Message):
    __slots__ = ("name", "read_queues", "write_queues", "perm", "broker_groups", "config", "actor", "request_id")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUES_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUES_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    BROKER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    read_queues: int
    write_queues: int
    perm: int
    broker_groups: _containers.RepeatedScalarFieldContainer[str]
    config: _containers.ScalarMap[str, str]
    actor: str
    request_id: str
    def __init__(self, name: _Optional[str] = ..., read_queues: _Optional[int] = ..., write_queues: _Optional[int] = ..., perm: _Optional[int] = ..., broker_groups: _Optional[_Iterable[str]] = ..., config: _Optional[_Mapping[str, str]] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class TopicUpdated(_message.Message):
    __slots__ = ("name", "read_queues", "write_queues", "perm", "broker_groups", "set_broker_groups", "config", "set_config", "expected_version", "actor", "request_id")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUES_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUES_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    BROKER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    SET_BROKER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SET_CONFIG_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    read_queues: int
    write_queues: int
    perm: int
    broker_groups: _containers.RepeatedScalarFieldContainer[str]
    set_broker_groups: bool
    config: _containers.ScalarMap[str, str]
    set_config: bool
    expected_version: int
    actor: str
    request_id: str
    def __init__(self, name: _Optional[str] = ..., read_queues: _Optional[int] = ..., write_queues: _Optional[int] = ..., perm: _Optional[int] = ..., broker_groups: _Optional[_Iterable[str]] = ..., set_broker_groups: _Optional[bool] = ..., config: _Optional[_Mapping[str, str]] = ..., set_config: _Optional[bool] = ..., expected_version: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class TopicDeleted(_message.Message):
    __slots__ = ("name", "expected_version", "actor", "request_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    expected_version: int
    actor: str
    request_id: str
    def __init__(self, name: _Optional[str] = ..., expected_version: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class OffsetCommitted(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "offset", "actor", "request_id")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    actor: str
    request_id: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., actor: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("offset", "group", "ok", "code", "message", "duplicate")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    group: str
    ok: bool
    code: str
    message: str
    duplicate: bool
    def __init__(self, offset: _Optional[int] = ..., group: _Optional[str] = ..., ok: _Optional[bool] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key", "consistency", "min_offset", "as_of", "json")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    key: str
    consistency: Consistency
    min_offset: int
    as_of: int
    json: bool
    def __init__(self, key: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., min_offset: _Optional[int] = ..., as_of: _Optional[int] = ..., json: _Optional[bool] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("name", "value", "lease", "created")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    lease: int
    created: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ..., lease: _Optional[int] = ..., created: _Optional[int] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("key", "version", "state_msgpack", "kv", "state_json")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_MSGPACK_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    state_msgpack: bytes
    kv: KeyValue
    state_json: str
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ..., state_msgpack: _Optional[bytes] = ..., kv: _Optional[_Union[KeyValue, _Mapping]] = ..., state_json: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("item", "applied")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    item: Item
    applied: int
    def __init__(self, item: _Optional[_Union[Item, _Mapping]] = ..., applied: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "start", "end", "limit", "after", "consistency", "min_offset", "as_of", "json")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    start: str
    end: str
    limit: int
    after: str
    consistency: Consistency
    min_offset: int
    as_of: int
    json: bool
    def __init__(self, prefix: _Optional[str] = ..., start: _Optional[str] = ..., end: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., min_offset: _Optional[int] = ..., as_of: _Optional[int] = ..., json: _Optional[bool] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("items", "next_after", "applied")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Item]
    next_after: str
    applied: int
    def __init__(self, items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ..., next_after: _Optional[str] = ..., applied: _Optional[int] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("key", "limit", "after_offset", "consistency", "min_offset", "json")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    key: str
    limit: int
    after_offset: int
    consistency: Consistency
    min_offset: int
    json: bool
    def __init__(self, key: _Optional[str] = ..., limit: _Optional[int] = ..., after_offset: _Optional[int] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., min_offset: _Optional[int] = ..., json: _Optional[bool] = ...) -> None: ...

class HistoryRow(_message.Message):
    __slots__ = ("offset", "event", "deleted", "state_msgpack", "kv", "state_json")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    STATE_MSGPACK_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    offset: int
    event: str
    deleted: bool
    state_msgpack: bytes
    kv: KeyValue
    state_json: str
    def __init__(self, offset: _Optional[int] = ..., event: _Optional[str] = ..., deleted: _Optional[bool] = ..., state_msgpack: _Optional[bytes] = ..., kv: _Optional[_Union[KeyValue, _Mapping]] = ..., state_json: _Optional[str] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("rows", "applied")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[HistoryRow]
    applied: int
    def __init__(self, rows: _Optional[_Iterable[_Union[HistoryRow, _Mapping]]] = ..., applied: _Optional[int] = ...) -> None: ...

class BatchOp(_message.Message):
    __slots__ = ("put", "delete", "txn", "command", "get")
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    put: PutRequest
    delete: DeleteRequest
    txn: TxnRequest
    command: CommandRequest
    get: GetRequest
    def __init__(self, put: _Optional[_Union[PutRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., txn: _Optional[_Union[TxnRequest, _Mapping]] = ..., command: _Optional[_Union[CommandRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[BatchOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[BatchOp, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("write", "get")
    WRITE_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    write: WriteResponse
    get: GetResponse
    def __init__(self, write: _Optional[_Union[WriteResponse, _Mapping]] = ..., get: _Optional[_Union[GetResponse, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class LeaseGrantRequest(_message.Message):
    __slots__ = ("ttl_ms", "lease_id", "request_id")
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    lease_id: int
    request_id: str
    def __init__(self, ttl_ms: _Optional[int] = ..., lease_id: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class LeaseKeepAliveRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class LeaseRevokeRequest(_message.Message):
    __slots__ = ("lease_id", "request_id", "actor")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    request_id: str
    actor: str
    def __init__(self, lease_id: _Optional[int] = ..., request_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("lease_id", "ttl_ms", "offset")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    ttl_ms: int
    offset: int
    def __init__(self, lease_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("offset", "key", "type", "event_msgpack", "timestamp", "event_json", "term", "applied")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_MSGPACK_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    offset: int
    key: str
    type: str
    event_msgpack: bytes
    timestamp: int
    event_json: str
    term: int
    applied: bool
    def __init__(self, offset: _Optional[int] = ..., key: _Optional[str] = ..., type: _Optional[str] = ..., event_msgpack: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., event_json: _Optional[str] = ..., term: _Optional[int] = ..., applied: _Optional[bool] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("prefix", "from_offset", "group", "json")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    from_offset: int
    group: str
    json: bool
    def __init__(self, prefix: _Optional[str] = ..., from_offset: _Optional[int] = ..., group: _Optional[str] = ..., json: _Optional[bool] = ...) -> None: ...

class WatchStarted(_message.Message):
    __slots__ = ("group", "from_offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_offset: int
    def __init__(self, group: _Optional[str] = ..., from_offset: _Optional[int] = ...) -> None: ...

class WatchEvents(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("started", "events")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    started: WatchStarted
    events: WatchEvents
    def __init__(self, started: _Optional[_Union[WatchStarted, _Mapping]] = ..., events: _Optional[_Union[WatchEvents, _Mapping]] = ...) -> None: ...

class ReadEventsRequest(_message.Message):
    __slots__ = ("group", "from_offset", "max_events", "max_bytes", "json")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_offset: int
    max_events: int
    max_bytes: int
    json: bool
    def __init__(self, group: _Optional[str] = ..., from_offset: _Optional[int] = ..., max_events: _Optional[int] = ..., max_bytes: _Optional[int] = ..., json: _Optional[bool] = ...) -> None: ...

class ReadEventsResponse(_message.Message):
    __slots__ = ("events", "next_offset", "log_start", "commit_offset")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    next_offset: int
    log_start: int
    commit_offset: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., next_offset: _Optional[int] = ..., log_start: _Optional[int] = ..., commit_offset: _Optional[int] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("group", "from_offset", "max_bytes")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_offset: int
    max_bytes: int
    def __init__(self, group: _Optional[str] = ..., from_offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadLogResponse(_message.Message):
    __slots__ = ("batches", "start_offset", "next_offset", "log_start", "commit_offset", "noops", "unknown")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NOOPS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    batches: bytes
    start_offset: int
    next_offset: int
    log_start: int
    commit_offset: int
    noops: _containers.RepeatedScalarFieldContainer[int]
    unknown: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batches: _Optional[bytes] = ..., start_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., log_start: _Optional[int] = ..., commit_offset: _Optional[int] = ..., noops: _Optional[_Iterable[int]] = ..., unknown: _Optional[_Iterable[int]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeerInfo(_message.Message):
    __slots__ = ("id", "role", "match_offset")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MATCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    id: int
    role: str
    match_offset: int
    def __init__(self, id: _Optional[int] = ..., role: _Optional[str] = ..., match_offset: _Optional[int] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "node", "role", "term", "leader", "commit_offset", "applied_offset", "last_offset", "log_start", "snapshot_offset", "peers")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    APPLIED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    group: str
    node: int
    role: str
    term: int
    leader: int
    commit_offset: int
    applied_offset: int
    last_offset: int
    log_start: int
    snapshot_offset: int
    peers: _containers.RepeatedCompositeFieldContainer[PeerInfo]
    def __init__(self, group: _Optional[str] = ..., node: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader: _Optional[int] = ..., commit_offset: _Optional[int] = ..., applied_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., log_start: _Optional[int] = ..., snapshot_offset: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[PeerInfo, _Mapping]]] = ...) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("id", "peer_address", "client_address", "grpc_address")
    ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: int
    peer_address: str
    client_address: str
    grpc_address: str
    def __init__(self, id: _Optional[int] = ..., peer_address: _Optional[str] = ..., client_address: _Optional[str] = ..., grpc_address: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("cluster", "node", "groups", "members")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    node: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    members: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    def __init__(self, cluster: _Optional[str] = ..., node: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ..., members: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ...) -> None: ...

class TransferLeaderRequest(_message.Message):
    __slots__ = ("group", "to")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    group: str
    to: int
    def __init__(self, group: _Optional[str] = ..., to: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class DoneResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class MemberListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberAddRequest(_message.Message):
    __slots__ = ("node_id", "peer_address", "client_address", "manual_promote")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MANUAL_PROMOTE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    peer_address: str
    client_address: str
    manual_promote: bool
    def __init__(self, node_id: _Optional[int] = ..., peer_address: _Optional[str] = ..., client_address: _Optional[str] = ..., manual_promote: _Optional[bool] = ...) -> None: ...

class MemberPromoteRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class MemberRemoveRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class MembersResponse(_message.Message):
    __slots__ = ("members", "voters", "learners")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    voters: _containers.RepeatedScalarFieldContainer[int]
    learners: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, members: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ..., voters: _Optional[_Iterable[int]] = ..., learners: _Optional[_Iterable[int]] = ...) -> None: ...

class CompactionStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExportPin(_message.Message):
    __slots__ = ("table", "watermark", "floor", "capped_by")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    CAPPED_BY_FIELD_NUMBER: _ClassVar[int]
    table: str
    watermark: int
    floor: int
    capped_by: str
    def __init__(self, table: _Optional[str] = ..., watermark: _Optional[int] = ..., floor: _Optional[int] = ..., capped_by: _Optional[str] = ...) -> None: ...

class CleanPass(_message.Message):
    __slots__ = ("clean_below", "cleaned_through", "seconds", "segments_before", "segments_after", "bytes_before", "bytes_after", "records_kept", "records_dropped", "tombstones_dropped", "noops_dropped", "finished_at", "aborted")
    CLEAN_BELOW_FIELD_NUMBER: _ClassVar[int]
    CLEANED_THROUGH_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_AFTER_FIELD_NUMBER: _ClassVar[int]
    BYTES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    BYTES_AFTER_FIELD_NUMBER: _ClassVar[int]
    RECORDS_KEPT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    NOOPS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    clean_below: int
    cleaned_through: int
    seconds: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_kept: int
    records_dropped: int
    tombstones_dropped: int
    noops_dropped: int
    finished_at: float
    aborted: str
    def __init__(self, clean_below: _Optional[int] = ..., cleaned_through: _Optional[int] = ..., seconds: _Optional[float] = ..., segments_before: _Optional[int] = ..., segments_after: _Optional[int] = ..., bytes_before: _Optional[int] = ..., bytes_after: _Optional[int] = ..., records_kept: _Optional[int] = ..., records_dropped: _Optional[int] = ..., tombstones_dropped: _Optional[int] = ..., noops_dropped: _Optional[int] = ..., finished_at: _Optional[float] = ..., aborted: _Optional[str] = ...) -> None: ...

class CompactionGroup(_message.Message):
    __slots__ = ("group", "role", "log_start", "log_end", "segments", "log_bytes", "snapshot_offset", "snapshots_taken", "last_snapshot_ms", "last_snapshot_at", "snapshot_error", "history_floor", "horizon", "horizon_bound", "log_floor", "log_bound", "pins", "pruned_floor", "prune_passes", "rows_pruned", "views_bytes", "last_run_at", "last_run_ms", "segments_deleted", "disk_full", "cleanup_policy", "clean_end_offset", "cleaned_segments", "clean_below", "clean_waiting", "clean_running", "clean_passes", "clean_failures", "clean_error", "clean_bytes_reclaimed", "last_clean")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_TAKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_AT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ERROR_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FLOOR_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    HORIZON_BOUND_FIELD_NUMBER: _ClassVar[int]
    LOG_FLOOR_FIELD_NUMBER: _ClassVar[int]
    LOG_BOUND_FIELD_NUMBER: _ClassVar[int]
    PINS_FIELD_NUMBER: _ClassVar[int]
    PRUNED_FLOOR_FIELD_NUMBER: _ClassVar[int]
    PRUNE_PASSES_FIELD_NUMBER: _ClassVar[int]
    ROWS_PRUNED_FIELD_NUMBER: _ClassVar[int]
    VIEWS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_RUN_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_RUN_MS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    DISK_FULL_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_POLICY_FIELD_NUMBER: _ClassVar[int]
    CLEAN_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CLEANED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CLEAN_BELOW_FIELD_NUMBER: _ClassVar[int]
    CLEAN_WAITING_FIELD_NUMBER: _ClassVar[int]
    CLEAN_RUNNING_FIELD_NUMBER: _ClassVar[int]
    CLEAN_PASSES_FIELD_NUMBER: _ClassVar[int]
    CLEAN_FAILURES_FIELD_NUMBER: _ClassVar[int]
    CLEAN_ERROR_FIELD_NUMBER: _ClassVar[int]
    CLEAN_BYTES_RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    LAST_CLEAN_FIELD_NUMBER: _ClassVar[int]
    group: str
    role: str
    log_start: int
    log_end: int
    segments: int
    log_bytes: int
    snapshot_offset: int
    snapshots_taken: int
    last_snapshot_ms: float
    last_snapshot_at: float
    snapshot_error: str
    history_floor: int
    horizon: int
    horizon_bound: str
    log_floor: int
    log_bound: str
    pins: _containers.RepeatedCompositeFieldContainer[ExportPin]
    pruned_floor: int
    prune_passes: int
    rows_pruned: int
    views_bytes: int
    last_run_at: float
    last_run_ms: float
    segments_deleted: int
    disk_full: str
    cleanup_policy: str
    clean_end_offset: int
    cleaned_segments: int
    clean_below: int
    clean_waiting: str
    clean_running: bool
    clean_passes: int
    clean_failures: int
    clean_error: str
    clean_bytes_reclaimed: int
    last_clean: CleanPass
    def __init__(self, group: _Optional[str] = ..., role: _Optional[str] = ..., log_start: _Optional[int] = ..., log_end: _Optional[int] = ..., segments: _Optional[int] = ..., log_bytes: _Optional[int] = ..., snapshot_offset: _Optional[int] = ..., snapshots_taken: _Optional[int] = ..., last_snapshot_ms: _Optional[float] = ..., last_snapshot_at: _Optional[float] = ..., snapshot_error: _Optional[str] = ..., history_floor: _Optional[int] = ..., horizon: _Optional[int] = ..., horizon_bound: _Optional[str] = ..., log_floor: _Optional[int] = ..., log_bound: _Optional[str] = ..., pins: _Optional[_Iterable[_Union[ExportPin, _Mapping]]] = ..., pruned_floor: _Optional[int] = ..., prune_passes: _Optional[int] = ..., rows_pruned: _Optional[int] = ..., views_bytes: _Optional[int] = ..., last_run_at: _Optional[float] = ..., last_run_ms: _Optional[float] = ..., segments_deleted: _Optional[int] = ..., disk_full: _Optional[str] = ..., cleanup_policy: _Optional[str] = ..., clean_end_offset: _Optional[int] = ..., cleaned_segments: _Optional[int] = ..., clean_below: _Optional[int] = ..., clean_waiting: _Optional[str] = ..., clean_running: _Optional[bool] = ..., clean_passes: _Optional[int] = ..., clean_failures: _Optional[int] = ..., clean_error: _Optional[str] = ..., clean_bytes_reclaimed: _Optional[int] = ..., last_clean: _Optional[_Union[CleanPass, _Mapping]] = ...) -> None: ...

class CompactionStatusResponse(_message.Message):
    __slots__ = ("node", "groups", "free_disk_bytes")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    node: int
    groups: _containers.RepeatedCompositeFieldContainer[CompactionGroup]
    free_disk_bytes: int
    def __init__(self, node: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[CompactionGroup, _Mapping]]] = ..., free_disk_bytes: _Optional[int] = ...) -> None: ...

class SessionCall(_message.Message):
    __slots__ = ("id", "timeout_ms", "put", "get", "delete", "list", "history", "txn", "command", "batch", "lease_grant", "lease_keep_alive", "lease_revoke", "read_events", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_GRANT_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    LEASE_REVOKE_FIELD_NUMBER: _ClassVar[int]
    READ_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    put: PutRequest
    get: GetRequest
    delete: DeleteRequest
    list: ListRequest
    history: HistoryRequest
    txn: TxnRequest
    command: CommandRequest
    batch: BatchRequest
    lease_grant: LeaseGrantRequest
    lease_keep_alive: LeaseKeepAliveRequest
    lease_revoke: LeaseRevokeRequest
    read_events: ReadEventsRequest
    status: StatusRequest
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., put: _Optional[_Union[PutRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., list: _Optional[_Union[ListRequest, _Mapping]] = ..., history: _Optional[_Union[HistoryRequest, _Mapping]] = ..., txn: _Optional[_Union[TxnRequest, _Mapping]] = ..., command: _Optional[_Union[CommandRequest, _Mapping]] = ..., batch: _Optional[_Union[BatchRequest, _Mapping]] = ..., lease_grant: _Optional[_Union[LeaseGrantRequest, _Mapping]] = ..., lease_keep_alive: _Optional[_Union[LeaseKeepAliveRequest, _Mapping]] = ..., lease_revoke: _Optional[_Union[LeaseRevokeRequest, _Mapping]] = ..., read_events: _Optional[_Union[ReadEventsRequest, _Mapping]] = ..., status: _Optional[_Union[StatusRequest, _Mapping]] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[SessionCall]
    def __init__(self, calls: _Optional[_Iterable[_Union[SessionCall, _Mapping]]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("status", "code", "message", "retriable", "leader", "leader_address", "reason", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRIABLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: int
    code: str
    message: str
    retriable: bool
    leader: int
    leader_address: str
    reason: str
    offset: int
    def __init__(self, status: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., retriable: _Optional[bool] = ..., leader: _Optional[int] = ..., leader_address: _Optional[str] = ..., reason: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class SessionReply(_message.Message):
    __slots__ = ("id", "error", "write", "get", "list", "history", "batch", "lease", "read_events", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    READ_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    error: Error
    write: WriteResponse
    get: GetResponse
    list: ListResponse
    history: HistoryResponse
    batch: BatchResponse
    lease: LeaseResponse
    read_events: ReadEventsResponse
    status: StatusResponse
    def __init__(self, id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., write: _Optional[_Union[WriteResponse, _Mapping]] = ..., get: _Optional[_Union[GetResponse, _Mapping]] = ..., list: _Optional[_Union[ListResponse, _Mapping]] = ..., history: _Optional[_Union[HistoryResponse, _Mapping]] = ..., batch: _Optional[_Union[BatchResponse, _Mapping]] = ..., lease: _Optional[_Union[LeaseResponse, _Mapping]] = ..., read_events: _Optional[_Union[ReadEventsResponse, _Mapping]] = ..., status: _Optional[_Union[StatusResponse, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[SessionReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[SessionReply, _Mapping]]] = ...) -> None: ...
