"""Conversions of the gRPC face without a node: events from typed messages and JSON, the error table,
the `grpc_address` config key, and the grpcurl examples of docs/grpc.md against the schema."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import grpc
import msgspec
import pytest
from google.protobuf import json_format

from eventlog.errors import ConfigError
from eventlog.raft.errors import (CompactedError, NotCaughtUpError, NotFoundError, NotLeaderError,
                                  ProposalDroppedError)
from eventlog.raft.runtime.config import ClusterConfig, MemberConfig
from epochlog.api import messages as p
from epochlog.grpc import convert as cv
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.errors import GroupHaltedError, RejectedError
from statemachines import events as ev

ROOT = Path(__file__).resolve().parents[3]
S = grpc.StatusCode


def test_typed_events_match_the_event_types() -> None:
    """Every typed message names an event type and only carries fields that event has."""
    oneof = pb.CommandRequest.DESCRIPTOR.oneofs_by_name["event"]
    typed = [f.message_type for f in oneof.fields if f.message_type]
    assert len(typed) == 8
    for message in typed:
        cls = ev.EVENT_TYPES[message.name]
        fields = {f.name for f in message.fields if not f.name.startswith("set_")}
        assert fields <= set(cls.__struct_fields__), (message.name, fields - set(cls.__struct_fields__))
        assert {f.name for f in msgspec.structs.fields(cls) if f.required} <= fields


def test_typed_event_conversion() -> None:
    created = cv.command_event(pb.CommandRequest(topic_created=pb.TopicCreated(
        name="t", write_queues=2, broker_groups=["a", "b"], config={"k": "v"}, actor="ops")))
    assert created == ev.TopicCreated(name="t", write_queues=2, broker_groups=("a", "b"), config={"k": "v"},
                                      actor="ops")
    assert created.read_queues == 8 and created.perm == 6          # absent optionals: the event's defaults
    updated = cv.command_event(pb.CommandRequest(topic_updated=pb.TopicUpdated(name="t",
                                                                               broker_groups=["x"])))
    assert updated == ev.TopicUpdated(name="t")                     # set_broker_groups false: not changed
    updated = cv.command_event(pb.CommandRequest(topic_updated=pb.TopicUpdated(
        name="t", set_broker_groups=True, read_queues=0, expected_version=0)))
    assert updated == ev.TopicUpdated(name="t", broker_groups=(), read_queues=0, expected_version=0)
    registered = cv.command_event(pb.CommandRequest(
        type="BrokerRegistered",
        broker_registered=pb.BrokerRegistered(cluster="c", group="g", name="n", address="h:1",
                                              incarnation="i", broker_epoch=3)))
    assert registered == ev.BrokerRegistered(cluster="c", group="g", name="n", address="h:1", incarnation="i",
                                             broker_id=0, broker_epoch=3)


def test_command_forms_agree() -> None:
    event = ev.OffsetCommitted(consumer_group="cg", topic="t", queue_id=1, offset=42, request_id="r")
    as_json = json.dumps({"type": "OffsetCommitted", "consumer_group": "cg", "topic": "t", "queue_id": 1,
                          "offset": 42, "request_id": "r"})
    typed = pb.OffsetCommitted(consumer_group="cg", topic="t", queue_id=1, offset=42, request_id="r")
    assert cv.command_event(pb.CommandRequest(event_msgpack=ev.encode_event(event))) == event
    assert cv.command_event(pb.CommandRequest(event_json=as_json)) == event
    assert cv.command_event(pb.CommandRequest(offset_committed=typed)) == event
    put = ev.KvPut(name="a", value=b"\x00\xff")
    as_json = cv.to_json(ev.encode_event(put))            # bytes become base64, and back
    assert cv.command_event(pb.CommandRequest(event_json=as_json)) == put
    # A newer schema version converts, and the node refuses it (invalid_argument) like any event it
    # could not apply: the one check of statemachines.events.event_record, whatever the face.
    newer_json = json.dumps({"type": "KvPut", "name": "a", "value": "", "v": 9})
    newer_msgpack = msgspec.msgpack.encode({"type": "KvPut", "name": "a", "value": b"", "v": 9})
    for request in (pb.CommandRequest(event_json=newer_json), pb.CommandRequest(event_msgpack=newer_msgpack)):
        newer = cv.command_event(request)
        assert newer.v == 9
        with pytest.raises(ev.EventError, match="KvPut version 9 is newer") as refused:
            ev.event_record(newer)
        assert refused.value.code == "invalid_argument"
    with pytest.raises(cv.RequestError, match="nested too deeply"):
        cv.command_event(pb.CommandRequest(event_msgpack=b"\x82\xa4type\xa5KvPut\xa1x" + b"\x91" * 100_000 + b"\x00"))
    with pytest.raises(cv.RequestError, match="event_msgpack: a string is not UTF-8"):
        cv.command_event(pb.CommandRequest(event_msgpack=ev.encode_event(ev.KvPut(name="ab", value=b"c"))
                                           .replace(b"\xa2ab", b"\xa2\xff\xfe")))
    with pytest.raises(cv.RequestError, match="does not match"):
        cv.command_event(pb.CommandRequest(type="KvPut", event_msgpack=ev.encode_event(event)))
    assert cv.event_type(ev.encode_event(event)) == "OffsetCommitted" and cv.event_type(b"\x01") == ""


def rejected(reason: str) -> RejectedError:
    return RejectedError(p.WriteResult(9, "kv", False, reason, "m"))


def test_error_table() -> None:
    addresses = {1: "10.0.0.1:7401", 2: ""}
    cases: list[tuple[BaseException, grpc.StatusCode, str]] = [
        (NotLeaderError(3, 1, 7), S.UNAVAILABLE, "not_leader"),
        (ev.EventError("bad"), S.INVALID_ARGUMENT, "invalid_argument"),
        (cv.RequestError("bad"), S.INVALID_ARGUMENT, "invalid_argument"),
        (NotFoundError("no lease"), S.NOT_FOUND, "not_found"),
        (CompactedError("compacted"), S.OUT_OF_RANGE, "compacted"),
        (TimeoutError(), S.DEADLINE_EXCEEDED, "deadline_exceeded"),
        (ProposalDroppedError("transfer"), S.UNAVAILABLE, "proposal_dropped"),
        (NotCaughtUpError("behind"), S.UNAVAILABLE, "not_caught_up"),
        (ev.SchemaVersionError("newer"), S.FAILED_PRECONDITION, "schema_version"),
        (GroupHaltedError("halted at 5"), S.UNAVAILABLE, "group_halted"),
        (ValueError("bug"), S.INTERNAL, "internal"),
        (rejected("version_mismatch"), S.FAILED_PRECONDITION, "rejected"),
        (rejected("condition_failed"), S.FAILED_PRECONDITION, "rejected"),
        (rejected("stale_epoch"), S.FAILED_PRECONDITION, "rejected"),
        (rejected("not_found"), S.NOT_FOUND, "rejected"),
        (rejected("already_exists"), S.ALREADY_EXISTS, "rejected"),
    ]
    for exc, status, code in cases:
        f = cv.failure(exc, addresses)
        assert (f.status, f.error.code, f.error.status) == (status, code, status.value[0]), exc
        md = dict(f.metadata())
        assert md["epochlog-code"] == code and md["epochlog-retriable"] in ("true", "false")

    f = cv.failure(NotLeaderError(3, 1, 7), addresses)
    assert dict(f.metadata())["epochlog-leader"] == "10.0.0.1:7401" and "10.0.0.1:7401" in f.message
    assert f.error.leader == 1 and f.error.retriable
    assert "serves no gRPC" in cv.failure(NotLeaderError(3, 2, 7), addresses).message
    assert dict(cv.failure(NotLeaderError(3, 0, 7), addresses).metadata())["epochlog-leader"] == ""
    cas = cv.failure(rejected("version_mismatch"), addresses)
    assert dict(cas.metadata())["epochlog-reason"] == "version_mismatch"
    assert dict(cas.metadata())["epochlog-offset"] == "9" and cas.error.offset == 9

    # A retriable wait cut by the deadline is DEADLINE_EXCEEDED and says what it waited for.
    late = cv.failure(NotCaughtUpError("applied 5, not yet 9"), addresses, timeout=0.5, deadline_passed=True)
    assert late.status == S.DEADLINE_EXCEEDED and "0.5 s" in late.message and "not yet 9" in late.message
    assert cv.failure(ev.EventError("bad"), addresses, deadline_passed=True).status == S.INVALID_ARGUMENT


def test_undecodable_messages_and_out_of_range_values_are_invalid_arguments() -> None:
    parse = cv.lenient(pb.GetRequest)
    assert parse(pb.GetRequest(key="a").SerializeToString()) == pb.GetRequest(key="a")
    broken = parse(b"\x0a\xff\xff\xff\xff")          # field 1, a length running past the end
    assert isinstance(broken, cv.Undecodable) and broken.message_type == "GetRequest"
    with pytest.raises(cv.RequestError, match="not a valid GetRequest message"):
        cv.decoded(broken)
    assert cv.failure(cv.RequestError("x"), {}).status == S.INVALID_ARGUMENT
    cases = [
        (lambda: cv.get_call(pb.GetRequest(key="a", as_of=-5)), "get.as_of: expected `int` >= 0, got -5"),
        (lambda: cv.get_call(pb.GetRequest(key="a", min_offset=-2)), "get.min_offset: expected `int` >= -1"),
        (lambda: cv.list_call(pb.ListRequest(prefix="app/", limit=20_000)), "list.limit: expected `int` <= 10000"),
        (lambda: cv.history_call(pb.HistoryRequest(key="a", after_offset=-7)), "history.after_offset"),
        (lambda: cv.read_events_call(pb.ReadEventsRequest(group="kv", from_offset=-1)), "read_events.from_offset"),
        (lambda: cv.watch_call(pb.WatchRequest(prefix="app/", from_offset=-3)), "watch.from_offset"),
    ]
    for make, message in cases:
        with pytest.raises(cv.RequestError) as error:
            make()
        assert message in str(error.value)
    assert cv.get_call(pb.GetRequest(key="a", as_of=0)).as_of == 0


def test_grpc_address_config() -> None:
    def cluster(*members: MemberConfig) -> ClusterConfig:
        return ClusterConfig(members=members)

    ok = cluster(MemberConfig(id=1, peer_address="h:1", grpc_address="h:3"),
                 MemberConfig(id=2, peer_address="h:2"))
    ok.validate()
    for m in ok.members:
        m.validate("cluster.members")
    with pytest.raises(ConfigError, match="grpc_address"):
        MemberConfig(id=1, peer_address="h:1", grpc_address="nohost").validate("cluster.members[0]")
    with pytest.raises(ConfigError, match="must be unique"):
        cluster(MemberConfig(id=1, peer_address="h:1", client_address="h:2", grpc_address="h:2")).validate()


def test_docs_examples_parse() -> None:
    """Each grpcurl example of docs/grpc.md names a method of the service and sends a valid request."""
    text = (ROOT / "docs" / "grpc.md").read_text()
    service = pb.DESCRIPTOR.services_by_name["Epochlog"]
    # A command runs to the first line end not escaped by a backslash.
    commands = re.findall(r"^grpcurl .*?(?<!\\)$", text, re.M | re.S)
    examples = [shlex.split(c.replace("\\\n", " "), comments=True) for c in commands]   # a comment may follow
    assert len(examples) >= 8
    for args in examples:
        method = service.methods_by_name[args[-1].rsplit("/", 1)[1]]
        if "-d" in args:
            body = args[args.index("-d") + 1]
            if body != "@":
                json_format.Parse(body, getattr(pb, method.input_type.name)())
