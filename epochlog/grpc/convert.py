"""Conversions between the gRPC messages (epochlog/v1) and the native protocol, events and errors.

The gRPC face adds no behaviour: a request becomes the `epochlog.api.messages` call or the events the
Node takes, a result becomes its message, and an error becomes a status through one table
(`failure`). Kept apart from the server so both the unary methods and the Session stream use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import msgspec
from google.protobuf.message import Message

from eventlog.errors import InvalidArgumentError, NotLeaderError, RejectedError
from epochlog.api import frames, messages as p
from epochlog.api.routing import entity_key, entity_prefix, user_key
from epochlog.calls import call_error
from epochlog.grpc.v1 import epochlog_pb2 as pb
from statemachines import events as ev
from statemachines.state import KvState, decode_state

# --- requests -------------------------------------------------------------------------------------


class RequestError(InvalidArgumentError):
    """A gRPC request that does not translate into a valid call (a malformed event, a bad enum...)."""


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What the server's deserializers hand over instead of raising for bytes that are not the method's
    message, so the call is answered INVALID_ARGUMENT (grpc would answer UNKNOWN for a deserializer's
    exception)."""

    message_type: str
    error: str


def lenient(message_class: Any) -> Any:
    """A request deserializer for `message_class` that returns `Undecodable` instead of raising."""
    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except Exception as exc:   # DecodeError, or any other refusal of the parser (nesting...)
            return Undecodable(message_class.DESCRIPTOR.name, f"{type(exc).__name__}: {exc}")
    return parse


def decoded(request: Any) -> Any:
    """`request`, or RequestError (invalid_argument) when it did not parse."""
    if isinstance(request, Undecodable):
        raise RequestError(f"the request is not a valid {request.message_type} message ({request.error})")
    return request


C = TypeVar("C")


def checked(call: C) -> C:
    """A native call built from a request, once its values are in range (the ranges of epochlog.api.messages,
    which frames are checked against when decoded); else RequestError naming the field and the range."""
    problem = frames.problem(call)
    if problem is not None:
        raise RequestError(problem)
    return call


_CONSISTENCY = {pb.CONSISTENCY_UNSPECIFIED: "linearizable", pb.LINEARIZABLE: "linearizable",
                pb.LEASE: "lease", pb.LOCAL: "local"}


def consistency(value: int) -> str:
    try:
        return _CONSISTENCY[value]
    except KeyError:
        raise RequestError(f"consistency {value} is not one of LINEARIZABLE, LEASE, LOCAL") from None


def _opt(msg: Any, name: str, default: Any) -> Any:
    return getattr(msg, name) if msg.HasField(name) else default


def get_call(r: pb.GetRequest) -> p.Get:
    return checked(p.Get(entity_key(r.key), consistency(r.consistency), _opt(r, "min_offset", -1), _opt(r, "as_of", None)))


def list_call(r: pb.ListRequest) -> p.List:
    # Keys and prefixes are user keys (`app/x`, `topic/orders`: epochlog/api/routing.py).
    prefix = entity_prefix(r.prefix) if r.prefix or not (r.start or r.end) else ""
    after = _opt(r, "after", None)
    return checked(p.List(prefix=prefix, start=r.start and entity_key(r.start), end=r.end and entity_key(r.end),
                          limit=r.limit or 100, after=None if after is None else entity_key(after),
                          consistency=consistency(r.consistency),
                          min_offset=_opt(r, "min_offset", -1), as_of=_opt(r, "as_of", None)))


def history_call(r: pb.HistoryRequest) -> p.History:
    return checked(p.History(entity_key(r.key), r.limit or 1000, _opt(r, "after_offset", -1), consistency(r.consistency),
                             _opt(r, "min_offset", -1)))


def read_events_call(r: pb.ReadEventsRequest) -> p.ReadEvents:
    return checked(p.ReadEvents(r.group, r.from_offset, r.max_events or 1000, r.max_bytes or (1 << 20)))


def watch_call(r: pb.WatchRequest) -> p.Watch:
    return checked(p.Watch(entity_prefix(decoded(r).prefix), _opt(r, "from_offset", -1), r.group))


def put_event(r: pb.PutRequest) -> ev.KvPut:
    return ev.KvPut(name=r.name, value=r.value, lease=r.lease,
                    expected_version=_opt(r, "expected_version", None), actor=r.actor,
                    request_id=r.request_id)


def delete_event(r: pb.DeleteRequest) -> ev.KvDeleted:
    return ev.KvDeleted(name=r.name, expected_version=_opt(r, "expected_version", None), actor=r.actor,
                        request_id=r.request_id)


def txn_event(r: pb.TxnRequest) -> ev.Txn:
    ops: list[ev.KvPut | ev.KvDeleted] = []
    for op in r.ops:
        kind = op.WhichOneof("op")
        if kind == "put":
            ops.append(ev.KvPut(name=op.put.name, value=op.put.value, lease=op.put.lease,
                                expected_version=_opt(op.put, "expected_version", None)))
        elif kind == "delete":
            ops.append(ev.KvDeleted(name=op.delete.name,
                                    expected_version=_opt(op.delete, "expected_version", None)))
        else:
            raise RequestError("every transaction op is a put or a delete")
    return ev.Txn(conditions=tuple(ev.Condition(entity_key(c.key), c.version) for c in r.conditions), ops=tuple(ops),
                  actor=r.actor, request_id=r.request_id)


def lease_revoke_event(r: pb.LeaseRevokeRequest) -> ev.LeaseRevoked:
    return ev.LeaseRevoked(lease_id=r.lease_id, actor=r.actor, request_id=r.request_id)


_json_event_decoder = msgspec.json.Decoder(ev.AnyEvent)
_msgpack_event_decoder = msgspec.msgpack.Decoder(ev.AnyEvent)


def command_event(r: pb.CommandRequest) -> ev.Event:
    """The event of a Command: msgpack, JSON or a typed message (whose name is the event's type)."""
    kind = r.WhichOneof("event")
    event: ev.Event
    if kind is None:
        raise RequestError("a command carries an event (event_msgpack, event_json or a typed event)")
    if kind == "event_msgpack":
        # Versions are not checked here: the node refuses what it could not apply (events.event_record).
        try:
            event = _msgpack_event_decoder.decode(r.event_msgpack)
        except msgspec.ValidationError as exc:
            raise RequestError(f"event_msgpack: {exc} (event types: {', '.join(ev.EVENT_TYPES)})") from None
        except ev.DECODE_ERRORS as exc:
            raise RequestError(f"event_msgpack: {ev.decode_problem(exc)}") from None
    elif kind == "event_json":
        try:
            event = _json_event_decoder.decode(r.event_json)
        except msgspec.ValidationError as exc:
            raise RequestError(f"event_json: {exc} (event types: {', '.join(ev.EVENT_TYPES)})") from None
        except ev.DECODE_ERRORS as exc:
            raise RequestError(f"event_json: {ev.decode_problem(exc)}") from None
    else:
        event = typed_event(getattr(r, kind))
    tag = type(event).__struct_config__.tag
    if r.type and r.type != tag:
        raise RequestError(f"type {r.type!r} does not match the event, a {tag}")
    return event


def typed_event(msg: Message) -> ev.Event:
    """A typed event message -> its event: fields map by name; an optional field that is absent, or a
    `set_X`-guarded field whose flag is false, takes the event's default."""
    cls = ev.EVENT_TYPES[msg.DESCRIPTOR.name]
    fields: dict[str, Any] = {}
    guarded = {f.name[4:] for f in msg.DESCRIPTOR.fields if f.name.startswith("set_")}
    for f in msg.DESCRIPTOR.fields:
        name = f.name
        if name.startswith("set_"):
            continue
        if name in guarded and not getattr(msg, "set_" + name):
            continue
        if f.has_presence and f.message_type is None and not msg.HasField(name):
            continue
        value = getattr(msg, name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value = dict(value)
        elif f.is_repeated:
            value = list(value)
        fields[name] = value
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        raise RequestError(f"{msg.DESCRIPTOR.name}: {exc}") from None


# --- results --------------------------------------------------------------------------------------

class _Tagged(msgspec.Struct):
    type: str = ""


_tag_decoder = msgspec.msgpack.Decoder(_Tagged)
_json_encoder = msgspec.json.Encoder()


def to_json(msgpack: bytes) -> str:
    """A msgpack document as JSON text (binary values become base64 strings); "" for one that does not
    decode (a committed record no version applies may be anything)."""
    try:
        return _json_encoder.encode(msgspec.msgpack.decode(msgpack)).decode()
    except ev.DECODE_ERRORS:
        return ""


def event_type(value: bytes | None) -> str:
    if not value:
        return ""
    try:
        return _tag_decoder.decode(value).type
    except ev.DECODE_ERRORS:
        return ""


def _kv(key: str, state: bytes) -> pb.KeyValue:
    s = decode_state(key.encode(), state)
    assert isinstance(s, KvState)
    return pb.KeyValue(name=s.name, value=s.value, lease=s.lease, created=s.created)


def item(i: p.Item, json: bool) -> pb.Item:
    out = pb.Item(key=user_key(i.key), version=i.version, state_msgpack=i.state,
                  state_json=to_json(i.state) if json else "")
    if i.key.startswith("kv/"):
        out.kv.CopyFrom(_kv(i.key, i.state))
    return out


def got(g: p.Got, json: bool) -> pb.GetResponse:
    out = pb.GetResponse(applied=g.applied)
    if g.item is not None:
        out.item.CopyFrom(item(g.item, json))
    return out


def listed(listed_: p.Listed, json: bool) -> pb.ListResponse:
    out = pb.ListResponse(items=[item(i, json) for i in listed_.items], applied=listed_.applied)
    if listed_.next_after is not None:
        out.next_after = user_key(listed_.next_after)
    return out


def history_rows(key: str, h: p.HistoryRows, json: bool) -> pb.HistoryResponse:
    """`key`: the request's (a user key, `app/x`)."""
    key = entity_key(key)
    rows = []
    for r in h.rows:
        row = pb.HistoryRow(offset=r.offset, event=r.event, deleted=r.state is None)
        if r.state is not None:
            row.state_msgpack = r.state
            if json:
                row.state_json = to_json(r.state)
            if key.startswith("kv/"):
                row.kv.CopyFrom(_kv(key, r.state))
        rows.append(row)
    return pb.HistoryResponse(rows=rows, applied=h.applied)


def write_result(r: p.WriteResult) -> pb.WriteResponse:
    return pb.WriteResponse(offset=r.offset, group=r.group, ok=r.ok, code=r.code, message=r.message,
                            duplicate=r.duplicate)


def lease(lease_: p.Lease) -> pb.LeaseResponse:
    return pb.LeaseResponse(lease_id=lease_.lease_id, ttl_ms=lease_.ttl_ms, offset=lease_.offset)


def event(r: p.EventRecord, json: bool, *, watched: bool = False) -> pb.Event:
    """`watched`: an event of a Watch, keyed as the user named its prefix (`app/x`); else a log record,
    keyed by its record key (the storage form, `kv/app/x`: epochlog/api/routing.py)."""
    value = r.value or b""
    return pb.Event(offset=r.offset, key=user_key(r.key) if watched else r.key, type=event_type(value), event_msgpack=value,
                    timestamp=r.timestamp, event_json=to_json(value) if json and value else "",
                    term=r.term, applied=r.applied)   # applied None: the field stays absent


def read_log_call(r: pb.ReadLogRequest) -> p.ReadLog:
    return checked(p.ReadLog(r.group, r.from_offset, r.max_bytes or (4 << 20)))


def log_batches(b: p.LogBatches) -> pb.ReadLogResponse:
    return pb.ReadLogResponse(batches=b.data, start_offset=b.start_offset, next_offset=b.next_offset,
                              log_start=b.log_start, commit_offset=b.commit_offset, noops=b.noops, unknown=b.unknown)


def events(e: p.Events, json: bool) -> pb.ReadEventsResponse:
    return pb.ReadEventsResponse(events=[event(r, json) for r in e.events], next_offset=e.next_offset,
                                 log_start=e.log_start, commit_offset=e.commit_offset)


def _member(m: p.MemberInfo, grpc_addresses: Mapping[int, str]) -> pb.MemberInfo:
    return pb.MemberInfo(id=m.id, peer_address=m.peer_address, client_address=m.client_address,
                         grpc_address=grpc_addresses.get(m.id, ""))


def status(s: p.StatusInfo, grpc_addresses: Mapping[int, str]) -> pb.StatusResponse:
    groups = [pb.GroupInfo(group=g.group, node=g.node, role=g.role, term=g.term, leader=g.leader,
                           commit_offset=g.commit_offset, applied_offset=g.applied_offset,
                           last_offset=g.last_offset, log_start=g.log_start,
                           snapshot_offset=g.snapshot_offset,
                           peers=[pb.PeerInfo(id=x.id, role=x.role, match_offset=x.match_offset)
                                  for x in g.peers])
              for g in s.groups]
    return pb.StatusResponse(cluster=s.cluster, node=s.node, groups=groups,
                             members=[_member(m, grpc_addresses) for m in s.members])


def compaction(c: p.CompactionInfo) -> pb.CompactionStatusResponse:
    """The native `compaction_info`, field for field (the proto messages use the same names)."""
    groups = []
    for g in c.groups:
        fields = msgspec.structs.asdict(g)
        pins = [pb.ExportPin(**msgspec.structs.asdict(x)) for x in fields.pop("pins")]
        last = fields.pop("last_clean")
        last_clean = None if last is None else pb.CleanPass(**msgspec.structs.asdict(last))
        groups.append(pb.CompactionGroup(**fields, pins=pins, last_clean=last_clean))
    return pb.CompactionStatusResponse(node=c.node, groups=groups, free_disk_bytes=c.free_disk_bytes)


def members(m: p.Members, grpc_addresses: Mapping[int, str]) -> pb.MembersResponse:
    return pb.MembersResponse(members=[_member(x, grpc_addresses) for x in m.members], voters=m.voters,
                              learners=m.learners)


# --- errors ---------------------------------------------------------------------------------------

STATUS: dict[str, grpc.StatusCode] = {status.name: status for status in grpc.StatusCode}
"""The gRPC status of each name the error table uses (`EpochlogError.grpc_status`)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """An error as gRPC reports it: the status, the message, and the Epochlog details."""

    status: grpc.StatusCode
    error: pb.Error

    @property
    def message(self) -> str:
        return self.error.message

    def metadata(self) -> tuple[tuple[str, str], ...]:
        e = self.error
        md = [("epochlog-code", e.code), ("epochlog-retriable", "true" if e.retriable else "false")]
        if e.code == NotLeaderError.code:
            md += [("epochlog-leader", e.leader_address), ("epochlog-leader-id", str(e.leader))]
        if e.code == RejectedError.code:
            md += [("epochlog-reason", e.reason), ("epochlog-offset", str(e.offset))]
        return tuple(md)


def failure(exc: BaseException, grpc_addresses: Mapping[int, str], *, timeout: float | None = None,
            deadline_passed: bool = False) -> Failure:
    """The status of an exception: its row of the error table (a rejected write's: its reason's). A
    retriable error (not caught up, no leader yet...) raised because the call's deadline passed is
    DEADLINE_EXCEEDED, naming what it was waiting for (epochlog.calls.call_error)."""
    error = call_error(exc, timeout=timeout, deadline_passed=deadline_passed)
    status = STATUS[error.grpc_status]
    message = str(error)
    leader_address = ""
    if error.leader_hint:
        leader_address = grpc_addresses.get(error.leader_hint, "")
        message += (f"; the leader's gRPC address is {leader_address}" if leader_address else
                    f"; node {error.leader_hint} serves no gRPC")
    reason, offset = (error.reason, error.offset) if isinstance(error, RejectedError) else ("", 0)
    return Failure(status, pb.Error(status=status.value[0], code=error.code, message=message,
                                    retriable=error.retriable, leader=error.leader_hint,
                                    leader_address=leader_address, reason=reason, offset=offset))


__all__ = ["Failure", "RequestError", "STATUS", "failure"]
