"""docs/protocol.md cannot drift from epochlog.api (messages and frames).

Two independent checks: the generated sections (message tables, events, errors, examples) are what
docs/protocol_examples.py prints from the current code; and every example frame, parsed from the
document itself, decodes with `epochlog.api.frames`, re-encodes to the same bytes, and matches the
JSON shown next to it (nested msgpack included: events and entity states decode too).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from epochlog.api import messages as p
from epochlog.api.frames import ClientFrame, FrameDecoder, ServerFrame, encode_frame
from statemachines import events as ev
from statemachines.state import decode_state

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
GENERATOR = ROOT / "docs" / "protocol_examples.py"

EXAMPLE = re.compile(r"^#### Example (\d+): (.+?)\n\n(Client → server|Server → client)\. .*?\n\n"
                     r"```json\n(.*?)```\n\n```hex\n(.*?)```", re.S | re.M)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("protocol_examples", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _examples() -> list[tuple[str, str, str, bytes]]:
    found = [(f"{n}: {title}", direction, body, bytes.fromhex("".join(hexdump.split())))
             for n, title, direction, body, hexdump in EXAMPLE.findall(DOC.read_text())]
    assert len(found) >= 20, f"expected the examples of {DOC}, found {len(found)}"
    return found


def _view(value: Any) -> Any:
    """The document's JSON view of decoded msgpack (written here again, not imported from the generator)."""
    if isinstance(value, bytes):
        out: dict[str, Any] = {"$bin": value.hex()}
        try:
            inner = msgspec.msgpack.decode(value)
        except msgspec.DecodeError:
            inner = None
        if isinstance(inner, dict):
            out["$msgpack"] = _view(inner)
        return out
    if isinstance(value, dict):
        return {k: _view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_view(v) for v in value]
    return value


def test_generated_sections_match_the_code() -> None:
    stale = _generator().stale_sections(DOC.read_text())
    assert not stale, (f"docs/protocol.md sections {stale} differ from the code: run "
                       f".venv/bin/python docs/protocol_examples.py --write and review the diff")


@pytest.mark.parametrize("name,direction,body,data", _examples(), ids=[e[0] for e in _examples()])
def test_example_decodes_with_the_protocol(name: str, direction: str, body: str, data: bytes) -> None:
    assert int.from_bytes(data[:4], "big") == len(data) - 4, "length prefix"
    client = direction == "Client → server"
    frames = FrameDecoder(ClientFrame if client else ServerFrame).feed(data)
    assert len(frames) == 1
    frame = frames[0]
    assert isinstance(frame, (p.ClientHello, p.Requests) if client else (p.ServerHello, p.Replies))
    assert encode_frame(frame) == data, "the example is not what the protocol encodes today"
    assert json.loads(body) == _view(msgspec.msgpack.decode(data[4:])), "JSON view and hex disagree"
    _check_nested(frame)


def _check_nested(frame: Any) -> None:
    """Events and entity states inside bin fields decode with their own schemas."""
    if isinstance(frame, p.Requests):
        for request in frame.requests:
            if isinstance(request.call, p.Write):
                for event in request.call.events:
                    ev.decode_event(ev.encode_event(event))
    if isinstance(frame, p.Replies):
        for reply in frame.replies:
            assert (reply.result is None) != (reply.error is None), "exactly one of result and error"
            result = reply.result
            items = [result.item] if isinstance(result, p.Got) and result.item else []
            items += result.items if isinstance(result, p.Listed) else []
            for item in items:
                decode_state(item.key.encode(), item.state)
            records = result.events if isinstance(result, (p.WatchEvents, p.Events)) else []
            for record in records:
                assert record.value is not None
                assert ev.decode_event(record.value).key() == record.key


def test_examples_cover_the_frame_types_and_a_watch() -> None:
    seen: set[str] = set()
    for _, direction, _, data in _examples():
        decoder = FrameDecoder(ClientFrame if direction == "Client → server" else ServerFrame)
        (frame,) = decoder.feed(data)
        seen.add(type(frame).__name__)
        if isinstance(frame, p.Requests):
            seen.update(type(r.call).__name__ for r in frame.requests)
        if isinstance(frame, p.Replies):
            seen.update(type(r.result).__name__ for r in frame.replies if r.result is not None)
            seen.update(f"error:{r.error.code}" for r in frame.replies if r.error is not None)
    expected = {"ClientHello", "ServerHello", "Requests", "Replies", "Write", "Get", "Watch", "WatchAck",
                "CancelWatch", "WatchStarted", "WatchEvents", "Written", "Got", "error:not_leader",
                "error:bad_frame", "error:cancelled"}
    assert expected <= seen, expected - seen
