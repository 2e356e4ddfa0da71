"""Generates the parts of docs/protocol.md that must match the code, from the code itself.

    .venv/bin/python docs/protocol_examples.py            # print the generated sections
    .venv/bin/python docs/protocol_examples.py --write    # rewrite them in docs/protocol.md
    .venv/bin/python docs/protocol_examples.py --check    # exit 1 when docs/protocol.md is stale

Four sections, each between `<!-- generated:NAME begin -->` and `<!-- generated:NAME end -->`:

- `messages`: every protocol struct (epochlog.api.messages) with its wire shape and fields, read with
  `msgspec.inspect` (field comments come from the source);
- `events`: the event types a Write carries and the entity states reads return (statemachines);
- `errors`: every error code with its `retriable` flag, from the EpochlogError classes;
- `examples`: frames built from real protocol objects and encoded by `epochlog.api.frames.encode_frame`,
  shown as hex and as a JSON view of their msgpack.

tests/epochlog/test_protocol_doc.py fails when a section differs from what this script prints, and
decodes every example with `epochlog.api.frames` independently of this script.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eventlog.errors import EpochlogError  # noqa: E402
from eventlog.raft.errors import CompactedError, NotLeaderError  # noqa: E402
from epochlog.api import messages as p  # noqa: E402
from epochlog.api.frames import encode_frame  # noqa: E402
from statemachines import events as ev  # noqa: E402
from statemachines import state as st  # noqa: E402

DOC = ROOT / "docs" / "protocol.md"
SECTIONS = ("messages", "events", "errors", "examples")

# Modules whose EpochlogError subclasses can reach a client as a wire error code.
ERROR_MODULES = ("eventlog.errors", "eventlog.raft.errors", "statemachines.events", "epochlog.errors",
                 "epochlog.server", "controller.errors")
# Codes produced by the protocol layer itself rather than by an error class.
PROTOCOL_CODES = {
    "bad_frame": (False, "The connection sent something that is not a frame of this protocol (or a request "
                  "before the hello); the reply has id 0 and the server closes the connection."),
    "cancelled": (False, "Ends a watch after the client's CancelWatch."),
}
# What a code means where its classes say nothing useful (no docstring, or the hierarchy's root).
CODE_NOTES = {
    "internal": "An unexpected failure on the node (a bug): the message names the exception.",
    "deadline_exceeded": "The request's deadline (`timeout_ms`) passed before it completed; a write may or "
                         "may not have been committed.",
    "raft": "The group cannot serve (it failed, e.g. its disk, or was stopped); the message says why.",
}


# --- type rendering ---------------------------------------------------------------------------------

_UNIONS: dict[frozenset[type], str] = {}


def _union_name(types: tuple[Any, ...]) -> str | None:
    if not _UNIONS:
        _UNIONS[frozenset(p.Call.__args__)] = "Call"
        _UNIONS[frozenset(p.Result.__args__)] = "Result"
        _UNIONS[frozenset(ev.AnyEvent.__args__)] = "Event"
    classes = frozenset(t.cls for t in types if isinstance(t, mi.StructType))
    if len(classes) != len(types):
        return None
    if classes in _UNIONS:
        return _UNIONS[classes]
    return " or ".join(sorted(c.__name__ for c in classes))


def _bounds(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f" {low}..{high}"
    if low is not None:
        return f" ≥ {low}"
    return "" if high is None else f" ≤ {high}"


def type_name(t: mi.Type) -> str:
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (None if t.gt is None else t.gt + 1)
        high = t.le if t.le is not None else (None if t.lt is None else t.lt - 1)
        return "int" + _bounds(low, high)
    if isinstance(t, mi.StrType):
        return "str"
    if isinstance(t, mi.BytesType):
        return "bin"
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.NoneType):
        return "nil"
    if isinstance(t, mi.FloatType):
        return "float"
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        length = _bounds(t.min_length, t.max_length)
        return f"array<{type_name(t.item_type)}>" + (f" (length{length})" if length else "")
    if isinstance(t, mi.DictType):
        return f"map<{type_name(t.key_type)}, {type_name(t.value_type)}>"
    if isinstance(t, mi.StructType):
        return t.cls.__name__
    if isinstance(t, mi.UnionType):
        named = _union_name(t.types)
        if named is not None:
            return named
        structs = [x for x in t.types if isinstance(x, mi.StructType)]
        if structs and len(structs) < len(t.types):
            rest = [x for x in t.types if not isinstance(x, mi.StructType)]
            named = _union_name(tuple(structs))
            return " or ".join([named or "?"] + [type_name(x) for x in rest])
        return " or ".join(type_name(x) for x in t.types)
    if isinstance(t, mi.AnyType):
        return "any"
    raise TypeError(f"no wire name for {t!r}")


def default_text(field: mi.Field) -> str:
    if field.required:
        return "required"
    if field.default_factory is not msgspec.NODEFAULT:
        return json.dumps(field.default_factory())
    value = field.default
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, bytes):
        return f"bin {value.hex() or '(empty)'}"
    return "nil" if value is None else json.dumps(value)


def field_comments(cls: type) -> dict[str, str]:
    """Trailing `# comments` of the field lines in the class source."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ not in ("epochlog.api.messages", "statemachines.events", "statemachines.state"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            m = re.match(r"^    (\w+): [^#]*#\s*(.+)$", line)
            if m:
                comments[m.group(1)] = m.group(2).strip()
    return comments


def doc_text(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split())


def struct_section(cls: type, level: str = "####") -> list[str]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    if info.array_like:
        shape = "msgpack **array** (fields by position)"
    elif info.tag is not None:
        shape = f"msgpack **map**, `\"{info.tag_field}\": \"{info.tag}\"`"
    else:
        shape = "msgpack **map** (untagged)"
    out = [f"{level} {cls.__name__}", "", shape + ".", ""]
    doc = doc_text(cls)
    if doc:
        out += [doc, ""]
    comments = field_comments(cls)
    if not info.fields:
        return out + ["No fields.", ""]
    if info.array_like:
        out += ["| # | field | type | default | notes |", "|---|---|---|---|---|"]
        for i, f in enumerate(info.fields):
            out.append(f"| {i} | `{f.encode_name}` | `{type_name(f.type)}` | {default_text(f)} | "
                       f"{comments.get(f.name, '')} |")
    else:
        out += ["| key | type | default | notes |", "|---|---|---|---|"]
        for f in info.fields:
            out.append(f"| `{f.encode_name}` | `{type_name(f.type)}` | {default_text(f)} | "
                       f"{comments.get(f.name, '')} |")
    return out + [""]


def _nested_structs(roots: list[type], skip: set[type]) -> list[type]:
    """Structs reachable from `roots` (fields, arrays, unions) not in `skip`, in order of discovery."""
    found: list[type] = []
    seen = set(skip) | set(roots)

    def walk(t: mi.Type) -> None:
        if isinstance(t, mi.StructType):
            if t.cls not in seen:
                seen.add(t.cls)
                found.append(t.cls)
                for f in t.fields:
                    walk(f.type)
        elif isinstance(t, (mi.ListType, mi.VarTupleType)):
            walk(t.item_type)
        elif isinstance(t, mi.DictType):
            walk(t.value_type)
        elif isinstance(t, mi.UnionType):
            for x in t.types:
                walk(x)

    for cls in roots:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            walk(f.type)
    return found


ENVELOPES: list[type] = [p.ClientHello, p.ServerHello, p.Requests, p.Request, p.Replies, p.Reply, p.WireError]


def messages_section() -> list[str]:
    calls: list[type] = list(p.Call.__args__)
    results: list[type] = list(p.Result.__args__)
    events: set[type] = set(ev.AnyEvent.__args__)
    out = ["### Frames and envelopes", ""]
    for cls in ENVELOPES:
        out += struct_section(cls)
    out += ["### Calls (`Request.call`)", ""]
    for cls in calls:
        out += struct_section(cls)
    out += ["### Results (`Reply.result`)", ""]
    for cls in results:
        out += struct_section(cls)
    nested = _nested_structs(ENVELOPES + calls + results, events | set(ENVELOPES) | set(calls) | set(results))
    nested = [c for c in nested if c.__module__ == "epochlog.api.messages"]
    out += ["### Nested values", ""]
    for cls in nested:
        out += struct_section(cls)
    return out


def events_section() -> list[str]:
    out = ["### Event types (`Write.events`)", ""]
    for cls in ev.AnyEvent.__args__:
        out += struct_section(cls)
    nested = _nested_structs(list(ev.AnyEvent.__args__), set(ev.AnyEvent.__args__))
    for cls in nested:
        out += struct_section(cls)
    out += ["### Entity states (`Item.state`, `HistoryRow.state`)", "",
            "The state is chosen by the first segment of the entity key:", "",
            "| key kind | state |", "|---|---|"]
    out += [f"| `{kind}/` | [{cls.__name__}](#{cls.__name__.lower()}) |" for kind, cls in st.STATE_TYPES.items()]
    out.append("")
    for cls in dict.fromkeys(st.STATE_TYPES.values()):
        out += struct_section(cls)
    return out


def _error_classes() -> Iterator[type[EpochlogError]]:
    stack: list[type[EpochlogError]] = [EpochlogError]
    while stack:
        cls = stack.pop()
        if cls.__module__ in ERROR_MODULES:
            yield cls
        stack.extend(cls.__subclasses__())


def errors_section() -> list[str]:
    import epochlog.node  # noqa: F401  (their errors)
    import epochlog.server  # noqa: F401

    by_code: dict[str, list[type[EpochlogError]]] = {}
    for cls in _error_classes():
        by_code.setdefault(cls.code, []).append(cls)
    rows: dict[str, tuple[bool, str]] = {}
    for code, classes in by_code.items():
        classes.sort(key=lambda c: (c.__module__, c.__name__))
        flags = {c.retriable for c in classes}
        assert len(flags) == 1, f"classes of code {code} disagree on retriable: {classes}"
        # A subclass keeping its parent's code refines it (e.g. for one caller): the parent says what the code means.
        texts = [doc_text(c) for c in classes if c is not EpochlogError
                 and not any(getattr(b, "code", None) == code for b in c.__bases__)]
        rows[code] = (flags.pop(), CODE_NOTES.get(code) or " ".join(dict.fromkeys(t for t in texts if t)))
    for code, row in PROTOCOL_CODES.items():
        if code not in rows:
            rows[code] = row
    out = ["| code | retriable | meaning |", "|---|---|---|"]
    for code in sorted(rows):
        retriable, text = rows[code]
        out.append(f"| `{code}` | {'yes' if retriable else 'no'} | {text} |")
    return out + [""]


# --- examples ---------------------------------------------------------------------------------------

class Direction(enum.Enum):
    CLIENT = "Client → server"
    SERVER = "Server → client"


@dataclass(frozen=True)
class Example:
    title: str
    direction: Direction
    frame: Any
    text: str


def _kv_state(name: str, value: bytes, version: int, created: int) -> bytes:
    return st.encode(st.KvState(name=name, value=value, lease=0, version=version, created=created))


TS = 1735689600000   # 2025-01-01T00:00:00Z in ms: the examples' record timestamp
PUT = ev.KvPut(name="app/color", value=b"blue", actor="svc-a", request_id="019ab2c4-8e1f-7a3b-9c4d-5e6f7a8b9c0d")
CAS = ev.KvPut(name="app/color", value=b"red", expected_version=40)   # Example 9's, rejected at offset 43
TERM = 3   # the term of the leader that appended the examples' records


def examples() -> list[Example]:
    not_leader = NotLeaderError(1, 2, 7)
    compacted = CompactedError("compacted: offset 12 is no longer in the log of group kv (it starts at 100001); "
                               "resync from the snapshot at offset 100000, then read from the offset after it")
    return [
        Example("client hello", Direction.CLIENT, p.ClientHello(p.PROTOCOL_VERSION, "example-client/1.0"),
                "The first frame of every connection."),
        Example("server hello", Direction.SERVER, p.ServerHello(p.PROTOCOL_VERSION, "local", 1),
                "The answer to a hello this node accepts: the cluster's name and the node's id."),
        Example("version refused", Direction.SERVER,
                p.ServerHello(p.PROTOCOL_VERSION, "local", 1,
                              "protocol version 2 is not supported (this node speaks 1)"),
                "The answer to `ClientHello(version=2)`; the server closes the connection after it."),
        Example("a write and a read, pipelined in one frame", Direction.CLIENT,
                p.Requests([p.Request(1, p.Write([PUT]), 5000),
                            p.Request(2, p.Get("kv/app/size"), 5000)]),
                "Two requests with deadlines of 5 s. The write's event carries a request id (and the "
                "actor that scopes it), so a retry after a lost reply is answered from the dedupe table "
                "instead of applied twice."),
        Example("their replies, coalesced, in completion order", Direction.SERVER,
                p.Replies([p.Reply(2, p.Got(p.Item("kv/app/size", _kv_state("app/size", b"XL", 17, 9), 17), 41)),
                           p.Reply(1, p.Written([p.WriteResult(42, "kv", True)]))]),
                "The read finished first. `Item.state` is msgpack itself (a KvState); the write committed "
                "at offset 42 of group `kv`."),
        Example("read your writes on any node", Direction.CLIENT,
                p.Requests([p.Request(3, p.Get("kv/app/color", "local", min_offset=42), 5000)]),
                "A `local` read served by whichever node receives it once it applied offset 42 (the "
                "write's offset), so the writer sees its write even on a follower."),
        Example("not the leader", Direction.SERVER,
                p.Replies([p.Reply(1, error=p.WireError(not_leader.code, str(not_leader), not_leader.retriable,
                                                        not_leader.leader_hint, "127.0.0.1:7202"))]),
                "A write sent to a follower: resend it to `leader_address` (node 2) with the same request ids."),
        Example("a retried write", Direction.SERVER,
                p.Replies([p.Reply(4, p.Written([p.WriteResult(42, "kv", True, duplicate=True)]))]),
                "The same event (same actor and request id) sent again after its reply was lost: the "
                "result of the first application, flagged `duplicate`; nothing was applied twice."),
        Example("a rejected compare-and-set", Direction.SERVER,
                p.Replies([p.Reply(5, p.Written([p.WriteResult(
                    43, "kv", False, "version_mismatch", "kv/app/color is at version 42, not 40")]))]),
                "`KvPut(expected_version=40)` was committed at offset 43 but changed nothing: a result "
                "with `ok` false, not an error."),
        Example("start a watch", Direction.CLIENT,
                p.Requests([p.Request(7, p.Watch("kv/app/", from_offset=42, window=256), 0)]),
                "Events of keys under `kv/app/` from offset 42, at most 256 unacknowledged."),
        Example("watch started, then events", Direction.SERVER,
                p.Replies([p.Reply(7, p.WatchStarted(7, "kv", 42)),
                           p.Reply(7, p.WatchEvents(7, [
                               p.EventRecord(42, "kv/app/color", ev.encode_event(PUT), TS, TERM, True),
                               p.EventRecord(43, "kv/app/color", ev.encode_event(CAS), TS + 1, TERM, False),
                               p.EventRecord(45, "kv/app/size",
                                             ev.encode_event(ev.KvDeleted(name="app/size")), TS + 3, TERM,
                                             True)]))]),
                "All replies of a watch carry its request id. Each record's `value` is the event, msgpack; "
                "`applied` false at 43: the compare-and-set of Example 9, committed but rejected (offset 44 "
                "was another key)."),
        Example("acknowledge and cancel", Direction.CLIENT,
                p.Requests([p.Request(8, p.WatchAck(7, 2), 0), p.Request(9, p.CancelWatch(7), 0)]),
                "Flow control: 2 events of watch 7 processed. Then the watch is cancelled."),
        Example("the watch ends", Direction.SERVER,
                p.Replies([p.Reply(8, p.Done()), p.Reply(9, p.Done()),
                           p.Reply(7, error=p.WireError("cancelled", "the watch was cancelled by the client"))]),
                "Acks and cancels are answered with `done`; the watch's own id gets its final error."),
        Example("a list page", Direction.CLIENT,
                p.Requests([p.Request(10, p.List(prefix="kv/app/", limit=2, consistency="lease"), 5000)]),
                "The first page of at most 2 entities under `kv/app/`, read under the leader's lease."),
        Example("the page", Direction.SERVER,
                p.Replies([p.Reply(10, p.Listed([
                    p.Item("kv/app/color", _kv_state("app/color", b"blue", 42, 42), 42),
                    p.Item("kv/app/size", _kv_state("app/size", b"XL", 17, 9), 17)], "kv/app/size", 45))]),
                "`next_after` is the last key: send it as `after` for the next page (nil: no more)."),
        Example("history of an entity", Direction.SERVER,
                p.Replies([p.Reply(11, p.HistoryRows([
                    p.HistoryRow(9, "KvPut", _kv_state("app/size", b"M", 9, 9)),
                    p.HistoryRow(17, "KvPut", _kv_state("app/size", b"XL", 17, 9)),
                    p.HistoryRow(45, "KvDeleted", None)], 45))]),
                "The answer to `History(key=\"kv/app/size\")`: each event that changed it, with the state "
                "after it (nil: deleted)."),
        Example("grant a lease", Direction.CLIENT,
                p.Requests([p.Request(12, p.LeaseGrant(10_000, request_id="019ab2c4-9a30-7b12-8f00-1d2e3f405162"), 5000),
                            p.Request(13, p.LeaseKeepAlive(4242424243), 5000)]),
                "A 10 s lease (the server picks its id) and a keepalive of another one."),
        Example("leases", Direction.SERVER,
                p.Replies([p.Reply(12, p.Lease(1152921504606846977, 10_000, 46)),
                           p.Reply(13, p.Lease(4242424243, 10_000))]),
                "The grant's commit offset; a keepalive is not logged (offset -1)."),
        Example("read committed events", Direction.CLIENT,
                p.Requests([p.Request(14, p.ReadEvents("kv", 42, max_events=2), 5000)]),
                "An exporter reads group `kv` from offset 42."),
        Example("events", Direction.SERVER,
                p.Replies([p.Reply(14, p.Events([p.EventRecord(42, "kv/app/color", ev.encode_event(PUT), TS,
                                                               TERM, True),
                                                 p.EventRecord(43, "kv/app/color", ev.encode_event(CAS), TS + 1,
                                                               TERM, False)],
                                                44, 0, 46))]),
                "Continue from `next_offset`."),
        Example("compacted", Direction.SERVER,
                p.Replies([p.Reply(15, error=p.WireError(compacted.code, str(compacted), compacted.retriable))]),
                "A ReadEvents or Watch below the log start: resync from the snapshot, then read on."),
        Example("status", Direction.SERVER,
                p.Replies([p.Reply(16, p.StatusInfo("local", 1, [
                    p.GroupInfo("kv", 1, "leader", 7, 1, 46, 46, 46, 0, -1,
                                [p.PeerInfo(1, "voter", 46), p.PeerInfo(2, "voter", 46), p.PeerInfo(3, "voter", 44)])],
                    [p.MemberInfo(1, "127.0.0.1:7101", "127.0.0.1:7201"),
                     p.MemberInfo(2, "127.0.0.1:7102", "127.0.0.1:7202"),
                     p.MemberInfo(3, "127.0.0.1:7103", "127.0.0.1:7203")]))]),
                "The answer to `Status` (one group shown). `GroupInfo` is an untagged map."),
        Example("a frame the server refuses", Direction.SERVER,
                p.Replies([p.Reply(0, error=p.WireError("bad_frame", "the first frame must be a client hello"))]),
                "Sent with id 0 before the server closes the connection."),
    ]


def bin_view(value: Any) -> Any:
    """The JSON view of a decoded msgpack value: bin becomes {"$bin": hex} (plus "$msgpack": its
    decoded content when it is itself a msgpack map, e.g. an event or an entity state)."""
    if isinstance(value, bytes):
        out: dict[str, Any] = {"$bin": value.hex()}
        try:
            inner = msgspec.msgpack.decode(value)
        except msgspec.DecodeError:
            inner = None
        if isinstance(inner, dict):
            out["$msgpack"] = bin_view(inner)
        return out
    if isinstance(value, dict):
        return {k: bin_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [bin_view(v) for v in value]
    return value


def pretty(value: Any, indent: int = 0, used: int = 0, width: int = 100) -> str:
    """JSON with every container that fits in the rest of its line kept on one line (`used`: the
    characters before it on its line)."""
    flat = json.dumps(value, ensure_ascii=False)
    if used + len(flat) <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            head = f"{pad}{json.dumps(k)}: "
            items.append(head + pretty(v, indent + 2, len(head), width))
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + pretty(v, indent + 2, len(pad), width) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def json_view(frame_bytes: bytes) -> str:
    """The payload of one frame (length prefix dropped) as JSON."""
    return pretty(bin_view(msgspec.msgpack.decode(frame_bytes[4:])))


def hex_view(frame_bytes: bytes) -> str:
    lines = [frame_bytes[:4].hex(" ")]
    lines += [frame_bytes[i:i + 16].hex(" ") for i in range(4, len(frame_bytes), 16)]
    return "\n".join(lines)


def examples_section() -> list[str]:
    out: list[str] = []
    for i, ex in enumerate(examples(), 1):
        frame = encode_frame(ex.frame)
        out += [f"#### Example {i}: {ex.title}", "", f"{ex.direction.value}. {ex.text}", "",
                "```json", json_view(frame), "```", "", "```hex", hex_view(frame), "```", ""]
    return out


# --- the document -----------------------------------------------------------------------------------

RENDER: dict[str, Callable[[], list[str]]] = {
    "messages": messages_section, "events": events_section, "errors": errors_section,
    "examples": examples_section,
}


def render(name: str) -> str:
    return "\n".join(RENDER[name]()).strip("\n") + "\n"


def section_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} begin[^>]*-->\n)(.*?)(<!-- generated:{name} end -->)", re.S)


def stale_sections(text: str) -> list[str]:
    stale = []
    for name in SECTIONS:
        m = section_pattern(name).search(text)
        if m is None or m.group(2) != render(name):
            stale.append(name)
    return stale


def rewrite(text: str) -> str:
    for name in SECTIONS:
        pattern = section_pattern(name)
        if pattern.search(text) is None:
            raise SystemExit(f"{DOC} has no generated:{name} markers")
        body = render(name)
        text = pattern.sub(lambda m: m.group(1) + body + m.group(3), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the generated sections of {DOC}")
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated section is stale")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(rewrite(DOC.read_text()))
        return 0
    if args.check:
        stale = stale_sections(DOC.read_text())
        if stale:
            print(f"stale sections of {DOC}: {', '.join(stale)} (run {Path(__file__).relative_to(ROOT)} --write)")
        return 1 if stale else 0
    for name in SECTIONS:
        print(f"<!-- generated:{name} -->\n{render(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
