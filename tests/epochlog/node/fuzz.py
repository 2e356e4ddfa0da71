"""A seeded fuzzer of a node's two client faces: native frames and gRPC messages.

Theory of operation. Every case is drawn from one `random.Random(seed)`, so a seed replays the same
inputs (the node's timing may still differ). Native cases: valid requests mutated field by field
(wrong types, out-of-range numbers, unknown calls and event types, newer schema versions, unknown
keys holding deep nesting, odd ids and deadlines), random bytes, random msgpack, deeply nested
frames, truncated frames, lengths over the limit. gRPC cases: random bytes and mutated valid
messages to the unary methods, Watch and Session.

What each case checks (`Tally` counts, `failures` lists what broke a rule):

- native: every request whose id is readable gets exactly one reply, with a result or an error of a
  known code; a frame that yields no id gets one `bad_frame` reply (id 0) and the connection
  closes; nothing else closes a connection;
- gRPC: every call ends with a status other than UNKNOWN and INTERNAL; bytes that do not parse as
  the method's message get INVALID_ARGUMENT.

Writes: every write answered with its offset (applied or rejected at apply: committed either way) is
recorded as (group, offset), and every write whose outcome is unknown (deadline passed, leadership
changed, connection lost) is counted, so the test can check that every record committed during the
fuzzing is one of those (a refused request appends nothing) and that no entity changed but theirs.
Calls that change membership, leadership or the controller's registry are never generated (they
would be valid commands, not faults).
"""

from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgspec

from eventlog.errors import EpochlogError
from epochlog.grpc.v1 import epochlog_pb2 as pb
from statemachines.request_ids import uuid7
from tests.epochlog.node.raw import RawConnection

MAX_FRAME = 16 << 20
REPLY_WAIT_S = 12.0   # a request without timeout_ms has the node's default deadline, 10 s
SERVICE = "/epochlog.v1.Epochlog/"


def known_codes() -> set[str]:
    """Every wire error code a node can answer with (the classes' codes and the protocol's own)."""
    import controller.errors  # noqa: F401  (their codes)
    import epochlog.grpc.convert  # noqa: F401
    import epochlog.server  # noqa: F401

    codes, stack = set(), [EpochlogError]
    while stack:
        cls = stack.pop()
        codes.add(cls.code)
        stack.extend(cls.__subclasses__())
    return codes | {"bad_frame", "cancelled"}


@dataclass
class Tally:
    cases: int = 0
    requests: int = 0
    replies_ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    closes: int = 0
    grpc_calls: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    committed: set[tuple[str, int]] = field(default_factory=set)   # (group, offset) of writes answered with it
    unknown_writes: int = 0           # events of writes whose outcome is unknown (they may have committed)

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


# --- values ---------------------------------------------------------------------------------------

def deep(depth: int) -> bytes:
    """msgpack of `depth` nested one-element arrays around 0."""
    return b"\x91" * depth + b"\x00"


def value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able value: numbers at the edges, strings, bytes, nesting."""
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return rng.choice([0, 1, -1, -5, 2, 7, 1024, 10_001, 2**31, -2**31, 2**63 - 1, -2**63, 2**64 - 1])
    if kind == 1:
        return rng.randrange(-1000, 1000)
    if kind == 2:
        return rng.choice(["", "a/b", "kv/fuzz/x", "x" * rng.randrange(1, 2000), "\x00", "é/ü", "kv/", "nope"])
    if kind == 3:
        return rng.randbytes(rng.randrange(0, 40))
    if kind == 4:
        return None
    if kind == 5:
        return rng.random() < 0.5
    if kind == 6:
        return rng.random() * 1e6
    if kind == 7:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 12)))
    if kind == 8:
        return [value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if kind == 9:
        return {str(value(rng, depth + 1))[:8]: value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    if kind == 10:
        return {"type": rng.choice(["KvPut", "get", "requests", "Txn", "zzz"])}
    return rng.choice([[], {}, [[[]]], {"": {}}])


# --- native ---------------------------------------------------------------------------------------

SAFE_CALLS = ["get", "gets", "list", "history", "read_events", "status", "watch_ack", "cancel_watch",
              "lease_keepalive", "member_list"]


def corpus(rng: random.Random) -> dict[str, Any]:
    """A valid call (writes only under kv/fuzz/)."""
    name = f"fuzz/{rng.randrange(50)}"
    choices: list[dict[str, Any]] = [
        {"type": "get", "key": f"kv/{name}", "consistency": rng.choice(["linearizable", "lease", "local"]),
         "min_offset": -1, "as_of": None},
        {"type": "gets", "gets": [{"type": "get", "key": f"kv/fuzz/{i}"} for i in range(3)]},
        {"type": "list", "prefix": "kv/fuzz/", "limit": 10, "consistency": "local"},
        {"type": "history", "key": f"kv/{name}", "limit": 5, "consistency": "local"},
        {"type": "read_events", "group": "kv", "from_offset": 0, "max_events": 5, "max_bytes": 65536},
        {"type": "status"},
        {"type": "watch_ack", "watch_id": 99, "events": 1},
        {"type": "cancel_watch", "watch_id": 98},
        {"type": "lease_keepalive", "lease_id": 12345},
        {"type": "write", "events": [{"type": "KvPut", "v": 1, "name": name, "value": rng.randbytes(8),
                                      "request_id": uuid7()}]},
        {"type": "write", "events": [{"type": "KvDeleted", "name": name, "expected_version": None}]},
        {"type": "write", "events": [{"type": "Txn", "conditions": [{"key": f"kv/{name}", "version": 0}],
                                      "ops": [{"type": "KvPut", "name": name, "value": b"t"}]}]},
    ]
    return rng.choice(choices)


def mutate_call(rng: random.Random, call: dict[str, Any]) -> dict[str, Any]:
    call = dict(call)
    for _ in range(rng.randrange(1, 4)):
        what = rng.randrange(8)
        keys = [k for k in call if k != "type"]
        if what == 0 and keys:
            call[rng.choice(keys)] = value(rng)
        elif what == 1 and keys:
            del call[rng.choice(keys)]
        elif what == 2:
            call[rng.choice(["zz", "extra", "as_of", "limit", "min_offset"])] = value(rng)
        elif what == 3:
            call["type"] = rng.choice(SAFE_CALLS + ["nope", "", "write", "GET", "transfer"])
        elif (what == 4 and call.get("type") == "write" and isinstance(call.get("events"), list) and call["events"]
              and isinstance(call["events"][0], dict)):
            event = dict(call["events"][0])
            field_ = rng.choice(["v", "type", "name", "value", "lease", "expected_version", "actor", "request_id",
                                 "ops", "conditions", "unknown"])
            event[field_] = (rng.choice([0, 1, 2, 3, 99, -1]) if field_ == "v"
                             else rng.choice(["KvPut", "KvDeleted", "Txn", "QuotaChanged", "", "kvput"])
                             if field_ == "type" else value(rng))
            if field_ == "name" and isinstance(event[field_], str):
                event[field_] = "fuzz/" + event[field_][:40]
            call["events"] = [event] + call["events"][1:]
        elif what == 5:
            call[rng.choice(["as_of", "min_offset", "limit", "from_offset", "max_events", "after_offset"])] = \
                rng.choice([-5, -2, -1, 0, 10_001, 2**63 - 1])
        elif what == 6:
            call["events"] = [] if call.get("type") == "write" else call.get("events", [])
        else:
            call["deep"] = msgspec.Raw(deep(rng.choice([10, 200, 2000, 100_000])))
    return call


UNKNOWN_OUTCOME = {"deadline_exceeded", "proposal_dropped", "group_halted", "internal", "raft"}


def _events_of(call: Any) -> int:
    """How many events a call would write (0: not a write)."""
    if isinstance(call, dict) and call.get("type") == "write" and isinstance(call.get("events"), list):
        return len(call["events"])
    return 0


def native_frame(rng: random.Random, next_id: int) -> tuple[bytes, list[int] | None, bool, dict[int, int]]:
    """(frame bytes, ids whose replies are due (None: cannot be known), whether the server may close the
    connection instead, id -> events written by that request)."""
    kind = rng.randrange(11)
    if kind == 10:   # a valid frame with some bytes changed: strings that are not UTF-8, broken tags...
        call = corpus(rng)
        payload = msgspec.msgpack.encode({"type": "requests", "requests": [[next_id, call, 1500]]})
        payload = mutate_bytes(rng, payload[:-1]) + payload[-1:] if rng.random() < 0.5 else mutate_bytes(rng, payload)
        return struct.pack(">I", len(payload)) + payload, None, True, {}
    writes: dict[int, int] = {}
    if kind <= 4:   # a frame of (mostly mutated) requests
        requests, ids, may_close = [], [], False
        for i in range(rng.randrange(1, 5)):
            call = corpus(rng)
            if rng.random() < 0.8:
                call = mutate_call(rng, call)
            if "deep" in call:
                may_close = True   # nesting this deep may be past what the server decodes: bad_frame is fine
            rid: Any = next_id + i
            timeout: Any = rng.choice([1500, 800, 1, -1, -300])   # no long waits: a read may wait it out
            if rng.random() < 0.08:
                rid = rng.choice([0, -3, 2**64 - 1])
            if rng.random() < 0.05:
                timeout = rng.choice(["1000", None, 1.5])
            if rng.random() < 0.05:
                rid = rng.choice(["x", None, 1.5])     # no readable id: the frame is unanswerable
                may_close = True
            request = [rid, call, timeout]
            if rng.random() < 0.05:
                request = request[:2] if rng.random() < 0.5 else request + [value(rng)]
            requests.append(request)
            if isinstance(rid, int) and not isinstance(rid, bool):
                ids.append(rid)
                writes[rid] = writes.get(rid, 0) + _events_of(call)
        payload = msgspec.msgpack.encode({"type": "requests", "requests": requests})
        data = struct.pack(">I", len(payload)) + payload
        if rng.random() < 0.1:   # truncated: the rest never comes, then the socket closes
            return data[:rng.randrange(1, len(data))], [], True, {}
        return data, ids, may_close, writes
    if kind == 5:   # random bytes
        payload = rng.randbytes(rng.randrange(0, 300))
        return struct.pack(">I", len(payload)) + payload, [], True, {}
    if kind == 6:   # random msgpack
        payload = msgspec.msgpack.encode(value(rng))
        return struct.pack(">I", len(payload)) + payload, [], True, {}
    if kind == 7:   # a frame nested too deeply, or a request beside an unknown key nested deep
        depth = rng.choice([100, 1000, 100_000])
        if rng.random() < 0.3:
            payload = deep(depth)
            return struct.pack(">I", len(payload)) + payload, [], True, {}
        request = msgspec.msgpack.encode([[next_id, {"type": "status"}, 1000]])
        payload = b"\x83\xa4type\xa8requests\xa8requests" + request + b"\xa1x" + deep(depth)
        return struct.pack(">I", len(payload)) + payload, [next_id], True, {}
    if kind == 8:   # a length over the limit
        return struct.pack(">I", rng.choice([MAX_FRAME + 1, 2**32 - 1])) + rng.randbytes(10), [], True, {}
    # A valid frame sent in pieces (the decoder must reassemble it)
    payload = msgspec.msgpack.encode({"type": "requests", "requests": [[next_id, {"type": "status"}, 1000]]})
    return struct.pack(">I", len(payload)) + payload, [next_id], False, {}


class NativeFuzzer:
    def __init__(self, addresses: list[str], rng: random.Random, tally: Tally, codes: set[str]) -> None:
        self.addresses = addresses
        self.rng = rng
        self.tally = tally
        self.codes = codes
        self.conn: RawConnection | None = None
        self.next_id = 1
        self.previous = b""      # the frame sent before on the same connection (named in failures)
        self.current = b""

    def _connection(self) -> RawConnection:
        if self.conn is None:
            self.conn = RawConnection(self.rng.choice(self.addresses), timeout=REPLY_WAIT_S)
            self.conn.hello()
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.current = b""

    def _fail(self, message: str) -> None:
        self.tally.failures.append(f"{message} (sent before on this connection: {self.previous[:120]!r})")

    def case(self) -> None:
        t = self.tally
        t.cases += 1
        data, ids, may_close, writes = native_frame(self.rng, self.next_id)
        self.next_id += 8
        conn = self._connection()
        self.previous, self.current = self.current, data
        if ids and not may_close and self.rng.random() < 0.3:   # in pieces
            cut = self.rng.randrange(1, len(data))
            conn.send_bytes(data[:cut])
            time.sleep(0.002)
            conn.send_bytes(data[cut:])
        else:
            try:
                conn.send_bytes(data)
            except OSError:
                t.closes += 1
                self.close()
                return
        if ids is None:
            self._drain(conn, data)
            return
        t.requests += len(ids)
        if not ids:
            self._expect_close_or_silence(conn, may_close, data)
            return
        pending = list(ids)
        deadline = time.monotonic() + REPLY_WAIT_S + 1
        while pending:
            if time.monotonic() > deadline:
                self._fail(f"no reply for ids {pending} of {data[:200]!r}")
                self.close()
                return
            try:
                frame = conn.frame()
            except (TimeoutError, socket.timeout):
                self._fail(f"no reply within {REPLY_WAIT_S} s for ids {pending} of {data[:200]!r}")
                t.unknown_writes += sum(writes.get(i, 0) for i in pending)
                self.close()
                return
            if frame is None:
                if not may_close:
                    self._fail(f"connection closed without replies for {pending}: {data[:200]!r}")
                t.unknown_writes += sum(writes.get(i, 0) for i in pending)
                t.closes += 1
                self.close()
                return
            for reply in frame.get("replies", []):
                rid, result, error = reply[0], reply[1], reply[2]
                # bad_frame and connection_limit are connection-level (a request is never answered with them)
                if rid == 0 and error is not None and error[0] in ("bad_frame", "connection_limit"):
                    if not may_close:
                        self._fail(f"bad_frame for an answerable frame: {error[1]} ({data[:200]!r})")
                    t.closes += 1
                    self.close()
                    return
                if rid in pending:
                    pending.remove(rid)
                elif not (error is None and isinstance(result, dict) and result.get("type") == "watch_events"):
                    self._fail(f"unexpected reply {reply!r}")
                if (result is None) == (error is None):
                    self._fail(f"reply with both or neither of result and error: {reply!r}")
                elif error is not None:
                    if error[0] not in self.codes:
                        self._fail(f"unknown error code {error[0]!r}: {error!r}")
                    t.error(error[0])
                    if error[0] in UNKNOWN_OUTCOME or (error[0] == "not_leader" and writes.get(rid, 0) > 1):
                        t.unknown_writes += writes.get(rid, 0)   # it may have committed (a Write of several
                                                                 # groups: some of them)
                else:
                    t.replies_ok += 1
                    if result.get("type") == "written":
                        t.committed |= {(r[1], r[0]) for r in result["results"]}

    def _drain(self, conn: RawConnection, data: bytes) -> None:
        """Replies to a frame whose requests cannot be known: each well-formed, of a known code; then we
        hang up (the frame may also still be waiting for bytes that never come)."""
        t = self.tally
        conn.sock.settimeout(0.5)
        try:
            while True:
                frame = conn.frame()
                if frame is None:
                    t.closes += 1
                    break
                for reply in frame.get("replies", []):
                    rid, result, error = reply
                    if (result is None) == (error is None):
                        self._fail(f"reply with both or neither of result and error: {reply!r}")
                    elif error is not None:
                        if error[0] not in self.codes:
                            self._fail(f"unknown error code {error[0]!r}: {error!r}")
                        t.error(error[0])
                        t.unknown_writes += error[0] in UNKNOWN_OUTCOME
                    elif result.get("type") == "written":
                        t.committed |= {(r[1], r[0]) for r in result["results"]}
        except (TimeoutError, socket.timeout):
            t.unknown_writes += data.count(b"write")   # an unanswered write may still commit
        self.close()

    def _expect_close_or_silence(self, conn: RawConnection, may_close: bool, data: bytes) -> None:
        """A frame with nothing to answer: bad_frame and a close, or (a truncated frame) nothing yet."""
        if len(data) < 4 or len(data) - 4 < struct.unpack(">I", data[:4])[0] <= MAX_FRAME:
            self.close()    # truncated: the server waits for the rest; we hang up
            return
        try:
            frame = conn.frame()
        except (TimeoutError, socket.timeout):
            self._fail(f"no answer to an unanswerable frame within {REPLY_WAIT_S} s: {data[:200]!r}")
            self.close()
            return
        if frame is None:
            self._fail(f"closed without a bad_frame reply: {data[:200]!r}")
        else:
            replies = frame.get("replies") or [[None, None, None]]
            error = replies[0][2]
            if replies[0][0] != 0 or error is None or error[0] != "bad_frame":
                self._fail(f"expected bad_frame for {data[:200]!r}, got {frame!r}")
            elif not conn.closed():
                self._fail(f"connection left open after bad_frame: {data[:200]!r}")
        self.tally.closes += 1
        self.tally.error("bad_frame")
        self.close()


# --- gRPC -----------------------------------------------------------------------------------------

UNARY = {   # method -> (request class, response class)
    "Put": (pb.PutRequest, pb.WriteResponse), "Get": (pb.GetRequest, pb.GetResponse),
    "Delete": (pb.DeleteRequest, pb.WriteResponse), "List": (pb.ListRequest, pb.ListResponse),
    "History": (pb.HistoryRequest, pb.HistoryResponse), "Txn": (pb.TxnRequest, pb.WriteResponse),
    "Command": (pb.CommandRequest, pb.WriteResponse), "Batch": (pb.BatchRequest, pb.BatchResponse),
    "LeaseKeepAlive": (pb.LeaseKeepAliveRequest, pb.LeaseResponse),
    "ReadEvents": (pb.ReadEventsRequest, pb.ReadEventsResponse), "Status": (pb.StatusRequest, pb.StatusResponse),
}
ALLOWED_STATUS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OUT_OF_RANGE,
                  grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.CANCELLED}


def grpc_message(rng: random.Random, method: str) -> Any:
    """A valid-looking request for `method`, with values from the edges."""
    def num() -> int:
        return rng.choice([-5, -1, 0, 1, 3, 10_001, 2**62])
    name = f"fuzz/{rng.randrange(50)}"
    if method == "Put":
        return pb.PutRequest(name=rng.choice([name, "", "a\x00b"]), value=rng.randbytes(rng.randrange(0, 20)),
                             request_id=rng.choice([uuid7(), f"g-{rng.getrandbits(40)}"]))
    if method == "Get":
        m = pb.GetRequest(key=rng.choice([name, "nope", "kv/"]), consistency=rng.randrange(0, 6))
        if rng.random() < 0.5:
            m.as_of = num()
        if rng.random() < 0.5:
            m.min_offset = rng.choice([-2, -1, 0, 2])
        return m
    if method == "Delete":
        return pb.DeleteRequest(name=name)
    if method == "List":
        m = pb.ListRequest(prefix=rng.choice(["fuzz/", "kv/", "nope"]), limit=rng.choice([0, 5, 10_001, 2**31]),
                           consistency=3)
        if rng.random() < 0.5:
            m.as_of = num()
        return m
    if method == "History":
        m = pb.HistoryRequest(key=name, limit=rng.choice([0, 3, 20_000]), consistency=3)
        if rng.random() < 0.5:
            m.after_offset = num()
        return m
    if method == "Txn":
        return pb.TxnRequest(ops=[pb.TxnOp(put=pb.PutRequest(name=name, value=b"t"))],
                             conditions=[pb.Condition(key=name, version=rng.choice([0, -1, 5]))])
    if method == "Command":
        event = msgspec.msgpack.encode({"type": rng.choice(["KvPut", "QuotaChanged"]), "v": rng.choice([1, 2]),
                                        "name": name, "value": b"c"})
        return pb.CommandRequest(event_msgpack=event) if rng.random() < 0.7 else pb.CommandRequest(
            event_json=rng.choice(['{"type": "KvPut", "v": 3, "name": "fuzz/j", "value": ""}', "[[[[", "{}"]))
    if method == "Batch":
        return pb.BatchRequest(ops=[pb.BatchOp(get=pb.GetRequest(key=name, as_of=num()))])
    if method == "LeaseKeepAlive":
        return pb.LeaseKeepAliveRequest(lease_id=rng.choice([0, 1, 2**63]))
    if method == "ReadEvents":
        return pb.ReadEventsRequest(group=rng.choice(["kv", "nope", ""]), from_offset=num(),
                                    max_events=rng.choice([0, 1, 5]))
    return pb.StatusRequest()


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        what = rng.randrange(4)
        if what == 0 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif what == 1 and out:
            del out[rng.randrange(len(out)):]
        elif what == 2:
            out[rng.randrange(len(out) + 1):0] = rng.randbytes(rng.randrange(1, 6))
        else:
            out += rng.choice([b"\xff", b"\x0a\xff\xff\xff\x0f", b"\x08", b"\x12\x05ab"])
    return bytes(out)


def _grpc_writes(method: str, request: Any) -> int:
    """How many events a gRPC call (by method or Session call name) may have written."""
    name = method.lower()
    if name in ("put", "delete", "txn", "command", "lease_revoke", "leaserevoke", "lease_grant", "leasegrant"):
        return 1
    if name == "batch":
        return sum(1 for op in request.ops if op.WhichOneof("op") in ("put", "delete", "txn", "command"))
    return 0


def parses(cls: Any, data: bytes) -> bool:
    try:
        cls.FromString(data)
    except Exception:   # noqa: BLE001 - any refusal of the parser
        return False
    return True


class GrpcFuzzer:
    def __init__(self, addresses: list[str], rng: random.Random, tally: Tally) -> None:
        self.channels = [grpc.insecure_channel(a) for a in addresses]
        self.rng = rng
        self.tally = tally

    def close(self) -> None:
        for c in self.channels:
            c.close()

    def _check(self, what: str, code: grpc.StatusCode, data: bytes, undecodable: bool, detail: str) -> None:
        t = self.tally
        t.statuses[code.name] = t.statuses.get(code.name, 0) + 1
        if code not in ALLOWED_STATUS:
            t.failures.append(f"gRPC {what}: status {code.name} ({detail}) for {data[:120]!r}")
        elif undecodable and code is not grpc.StatusCode.INVALID_ARGUMENT:
            t.failures.append(f"gRPC {what}: undecodable bytes got {code.name} ({detail}), not INVALID_ARGUMENT")

    def case(self) -> None:
        rng, t = self.rng, self.tally
        t.grpc_calls += 1
        channel = rng.choice(self.channels)
        kind = rng.randrange(10)
        if kind <= 6:
            method = rng.choice(list(UNARY))
            request_cls, response_cls = UNARY[method]
            data = grpc_message(rng, method).SerializeToString()
            if kind >= 3:
                data = mutate_bytes(rng, data) if kind < 6 else rng.randbytes(rng.randrange(0, 64))
            undecodable = not parses(request_cls, data)
            call = channel.unary_unary(SERVICE + method)
            try:
                response = call(data, timeout=3.0)
            except grpc.RpcError as exc:
                self._check(method, exc.code(), data, undecodable, exc.details() or "")
                metadata = dict(exc.trailing_metadata() or ())
                code = metadata.get("epochlog-code", "")
                if code == "rejected" and method in ("Put", "Delete", "Txn"):   # committed, changed nothing
                    t.committed.add(("kv", int(metadata["epochlog-offset"])))
                elif not undecodable and (code in UNKNOWN_OUTCOME or code == "rejected"   # (a Command's group)
                                          or exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED
                                          or (code == "not_leader" and method == "Batch")):
                    t.unknown_writes += _grpc_writes(method, request_cls.FromString(data))
                return
            self._check(method, grpc.StatusCode.OK, data, undecodable, "ok")
            self._record(response_cls.FromString(response))
        elif kind <= 8:   # Watch: random or mutated request; a stream that starts is cut by its deadline
            watch = pb.WatchRequest(prefix="fuzz/", from_offset=rng.choice([-9, 0]))
            data = mutate_bytes(rng, watch.SerializeToString()) if kind == 7 else rng.randbytes(rng.randrange(1, 40))
            undecodable = not parses(pb.WatchRequest, data)
            try:
                for _ in channel.unary_stream(SERVICE + "Watch")(data, timeout=0.5):
                    pass
                self._check("Watch", grpc.StatusCode.OK, data, undecodable, "ended")
            except grpc.RpcError as exc:
                self._check("Watch", exc.code(), data, undecodable, exc.details() or "")
        else:   # Session: one message, random bytes or a mutated one
            good = pb.SessionRequest(calls=[pb.SessionCall(id=1, get=pb.GetRequest(key="fuzz/1", consistency=3))])
            data = (mutate_bytes(rng, good.SerializeToString()) if rng.random() < 0.5
                    else rng.randbytes(rng.randrange(1, 40)))
            undecodable = not parses(pb.SessionRequest, data)
            answered: set[int] = set()
            try:
                for raw in channel.stream_stream(SERVICE + "Session")(iter([data]), timeout=3.0):
                    for reply in pb.SessionResponse.FromString(raw).replies:
                        if reply.HasField("write"):
                            self._record(reply.write)
                        if not (reply.HasField("error") and reply.error.code in UNKNOWN_OUTCOME):
                            answered.add(reply.id)
                self._check("Session", grpc.StatusCode.OK, data, undecodable, "ended")
            except grpc.RpcError as exc:
                self._check("Session", exc.code(), data, undecodable, exc.details() or "")
            if not undecodable:   # calls without a definite answer may have written
                t.unknown_writes += sum(_grpc_writes(c.WhichOneof("call") or "", getattr(c, c.WhichOneof("call")))
                                        for c in pb.SessionRequest.FromString(data).calls
                                        if c.id not in answered and c.WhichOneof("call"))

    def _record(self, response: Any) -> None:
        if isinstance(response, pb.WriteResponse):
            self.tally.committed.add((response.group, response.offset))
        elif isinstance(response, pb.BatchResponse):
            for r in response.results:
                if r.HasField("write"):
                    self._record(r.write)
