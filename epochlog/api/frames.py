"""The client protocol's framing (sans-IO: bytes in, messages out; docs/protocol.md is the spec).

A connection is a stream of frames: a 4-byte big-endian length, then a msgpack payload holding one
message of epochlog/api/messages.py. The first frame each way is a hello; after it the client sends
`Requests` frames and the server sends `Replies` frames. A frame carries every request (or reply)
that was queued while the previous frame was being written, so concurrent calls on one connection
share frames and syscalls.

Decoding a frame checks the ranges the message types declare; a request that does not decode (a
wrong type, a value out of range, an unknown event type) is answered on its own with
`invalid_argument` naming the field, the valid range and the value (`salvage_requests`), and the
other requests of its frame go on. Only a frame that yields no request id to answer is a `bad_frame`
that closes the connection. `problem(call)` applies the same checks to a call built in code (the
gRPC face builds them).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from epochlog.api.messages import Call, ClientHello, Replies, Request, Requests, ServerHello
from statemachines.events import DECODE_ERRORS, decode_problem

MAX_FRAME_BYTES = 16 << 20
_LENGTH = struct.Struct(">I")

ClientFrame = ClientHello | Requests
ServerFrame = ServerHello | Replies

_encoder = msgspec.msgpack.Encoder()


def encode_frame(frame: Any) -> bytes:
    payload = _encoder.encode(frame)
    return _LENGTH.pack(len(payload)) + payload


def encode_frames(items: Sequence[Any], wrap: Callable[[list[Any]], Any], *,
                  oversize: Callable[[Any, int], Sequence[Any]] | None = None,
                  max_frame_bytes: int = MAX_FRAME_BYTES) -> list[bytes]:
    """Frames `wrap(part)` carrying `items` (requests or replies) in order: one frame when it fits,
    else as many as needed, each within `max_frame_bytes`, so coalescing never builds a frame the
    peer must refuse. An item too large on its own goes to `oversize(item, payload_bytes)`, which
    returns what to send instead (smaller items, or nothing); without it, FrameError.
    """
    items = list(items)
    frame = encode_frame(wrap(items))
    if len(frame) - 4 <= max_frame_bytes or not items:
        return [frame]
    if len(items) > 1:   # rare: halve until the parts fit (each half is encoded again)
        half = len(items) // 2
        return (encode_frames(items[:half], wrap, oversize=oversize, max_frame_bytes=max_frame_bytes)
                + encode_frames(items[half:], wrap, oversize=oversize, max_frame_bytes=max_frame_bytes))
    if oversize is None:
        raise FrameError(f"a message of {len(frame) - 4} bytes exceeds the frame limit of {max_frame_bytes}")
    instead = oversize(items[0], len(frame) - 4)
    return encode_frames(instead, wrap, oversize=oversize, max_frame_bytes=max_frame_bytes) if instead else []


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol; the connection must close."""


class BadRequest(msgspec.Struct, frozen=True):
    """Not on the wire: what `FrameDecoder` yields for a request of a frame that does not decode but
    whose id is known, so it can be answered (`invalid_argument`, `problem` says why)."""

    id: int
    problem: str


class FrameDecoder:
    """Splits a byte stream into decoded frames (sans-IO: feed bytes, get frames).

    `salvage(payload, error)`: called for a payload that does not decode as `frame_type`; returns what
    can still be answered (e.g. `salvage_requests`) or raises FrameError. Without it, FrameError.
    `pending_bytes` is what the decoder holds of frames not complete yet (the server budgets it).
    """

    def __init__(self, frame_type: Any, max_frame_bytes: int = MAX_FRAME_BYTES, *,
                 salvage: Callable[[bytes, Exception], list[Any]] | None = None) -> None:
        self._decoder = msgspec.msgpack.Decoder(frame_type)
        self._max = max_frame_bytes
        self._salvage = salvage
        self._buf = bytearray()
        self._pos = 0

    @property
    def pending_bytes(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        self._buf += data
        frames: list[Any] = []
        buf = self._buf
        while len(buf) - self._pos >= 4:
            (n,) = _LENGTH.unpack_from(buf, self._pos)
            if n > self._max:
                raise FrameError(f"frame of {n} bytes exceeds the limit of {self._max}")
            end = self._pos + 4 + n
            if len(buf) < end:
                break
            payload = memoryview(buf)[self._pos + 4:end]
            try:
                try:
                    frames.append(self._decoder.decode(payload))
                except DECODE_ERRORS as exc:
                    if self._salvage is None:
                        raise FrameError(f"malformed frame: {decode_problem(exc)}") from None
                    frames.extend(self._salvage(bytes(payload), exc))   # a copy: Raw values keep their buffer
            finally:
                payload.release()   # else the bytearray cannot be resized while a view exists
            self._pos = end
        if self._pos and self._pos * 2 >= len(buf):
            del buf[: self._pos]
            self._pos = 0
        if not buf and buf.__sizeof__() > 1 << 16:
            self._buf = bytearray()   # give a large frame's memory back
        return frames


class _RawRequests(msgspec.Struct, tag="requests"):
    requests: list[msgspec.Raw]


class _RequestId(msgspec.Struct, array_like=True):
    id: int


_raw_requests_decoder = msgspec.msgpack.Decoder(_RawRequests)
_request_decoder = msgspec.msgpack.Decoder(Request)
_request_id_decoder = msgspec.msgpack.Decoder(_RequestId)
_REQUEST_FIELDS = {"[0]": "id", "[1]": "call", "[2]": "timeout_ms"}
_AT = re.compile(r"^(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_STEP = re.compile(r"\[(\d+)\]|\.(\w+)")


def salvage_requests(payload: bytes, error: Exception) -> list[Any]:
    """A `Requests` frame one of whose requests does not decode: the others (one `Requests`) and a
    `BadRequest` for each one that does not, naming its field, the valid range and the value.
    FrameError when the frame is no `Requests` frame at all or a request's id cannot be read."""
    try:
        raw = _raw_requests_decoder.decode(payload)
    except DECODE_ERRORS:
        raise FrameError(f"malformed frame: {decode_problem(error)}") from None
    good: list[Request] = []
    bad: list[Any] = []
    for item in raw.requests:
        try:
            good.append(_request_decoder.decode(item))
        except DECODE_ERRORS as exc:
            try:
                rid = _request_id_decoder.decode(item).id
            except DECODE_ERRORS:
                raise FrameError(f"malformed request without a readable id: {decode_problem(exc)}") from None
            bad.append(BadRequest(rid, _describe(exc, item)))
    return ([Requests(good)] if good else []) + bad


def problem(call: Any) -> str | None:
    """What is wrong with a call built in code (not decoded from a frame), as a frame's decoding would
    say it, or None. The gRPC face checks the calls it builds with it."""
    try:
        _call_decoder.decode(_encoder.encode(call))
    except DECODE_ERRORS as exc:
        return _describe(exc, _encoder.encode(call), request=False)
    return None


_call_decoder = msgspec.msgpack.Decoder(Call)


def _describe(exc: BaseException, item: bytes | msgspec.Raw, *, request: bool = True) -> str:
    """`exc` (msgspec's "Expected `int` >= 0 - at `$[1].as_of`") as "get.as_of: expected `int` >= 0, got -5"."""
    text = decode_problem(exc)
    m = _AT.match(text)
    if m is None:
        return f"invalid request: {text}"
    what, path = m.group("what"), m.group("path")
    try:
        value: Any = msgspec.msgpack.decode(item)
    except DECODE_ERRORS:
        value = None
    field, got, found = [], value, value is not None
    steps = [(int(i) if i else k) for i, k in _STEP.findall(path)]
    for n, step in enumerate(steps):
        if request and n == 0:
            field.append(_REQUEST_FIELDS.get(f"[{step}]", f"[{step}]"))
            if step == 1 and isinstance(got, list) and len(got) > 1 and isinstance(got[1], dict):
                field[-1] = str(got[1].get("type", "call"))
        else:
            field.append(f"[{step}]" if isinstance(step, int) else f".{step}")
        try:
            got = got[step]
        except (KeyError, IndexError, TypeError):
            found = False
    if request and steps[:2] == [1, "type"]:
        field = ["call", ".type"]
    name = "".join(field).lstrip(".").replace(".[", "[") or "the request"
    if not request and isinstance(value, dict) and "type" in value:
        name = f"{value['type']}.{name}" if steps else str(value["type"])
    if what.startswith("Invalid value") and steps and steps[-1] == "type":
        return f"{name}: unknown type {got!r}" if found else f"{name}: {what}"
    ranged = re.search(r"[<>]=?|length", what) is not None
    shown = f", got {got!r}" if ranged and found and not isinstance(got, (dict, list)) and len(repr(got)) <= 64 else ""
    return f"{name}: {what[:1].lower()}{what[1:]}{shown}"
