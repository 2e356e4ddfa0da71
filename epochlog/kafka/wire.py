"""Kafka framing, response headers and the zero-copy Fetch response encoding. Pure: bytes in, bytes out.

A request frame is `int32 size` + header (`int16 api_key, int16 api_version, int32 correlation_id,
nullable string client_id`, then a tag buffer for flexible versions) + body. Requests are decoded
with kafka-python's protocol classes; responses are encoded by them too, except Fetch: its records
are segment bytes, handed over as memoryviews of the mapped segment (`FetchPartitionOut.records`),
so the response is a list of buffers (written with one writev) instead of one copied blob.

Response header: v0 (correlation id) for non-flexible versions, v1 (plus an empty tag buffer) for
flexible ones, except ApiVersions, whose response header is always v0 (KIP-511).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

Buffer = bytes | bytearray | memoryview

REQUEST_PREFIX: Final = struct.Struct(">hhi")   # api_key, api_version, correlation_id
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_FIXED = struct.Struct(">ihqq")      # partition_index, error_code, high_watermark, last_stable_offset
_I64 = struct.Struct(">q")
API_VERSIONS_KEY: Final = 18


LARGE_FRAME_BYTES: Final = 1 << 20


class FrameTooLarge(Exception):
    """A frame declares a size above the limit (or a negative one): the connection must close."""


class RequestFrames:
    """Splits one connection's byte stream into request frames (each without its size prefix). Pure.

    Small frames are cut from a buffer that the bytes received are appended to. A frame larger than
    LARGE_FRAME_BYTES is assembled in an anonymous mapping of exactly its size, written as its bytes
    arrive, and handed out as a view of that mapping: no buffer grows by reallocation (which copies,
    and leaves the allocator's heap larger than what is in use), no copy is made when the frame is
    complete, and the memory goes back to the system, whole, when the last view of the frame is
    dropped. `pending_bytes` is what the frame being received holds so far.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._large: mmap.mmap | None = None
        self._filled = 0

    @property
    def pending_bytes(self) -> int:
        return self._filled if self._large is not None else len(self._buffer)

    def feed(self, data: Buffer) -> list[memoryview]:
        """The frames `data` completes, in order; FrameTooLarge for a size above the limit."""
        frames: list[memoryview] = []
        view = memoryview(data)
        while view:
            if self._large is not None:
                n = min(len(view), len(self._large) - self._filled)
                self._large[self._filled:self._filled + n] = view[:n]
                self._filled += n
                view = view[n:]
                if self._filled == len(self._large):
                    frames.append(memoryview(self._large))
                    self._large, self._filled = None, 0
                continue
            self._buffer += view
            view = view[len(view):]
            self._cut(frames)
            if self._large is not None and len(self._buffer):   # the bytes past the header go to the frame
                view, self._buffer = memoryview(bytes(self._buffer)), bytearray()
        return frames

    def _cut(self, frames: list[memoryview]) -> None:
        buf = self._buffer
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _I32.unpack_from(buf, pos)
            if size < 0 or size > self.max_frame_bytes:
                raise FrameTooLarge(f"a request frame of {size} bytes exceeds {self.max_frame_bytes}")
            if len(buf) - pos - 4 >= size:
                with memoryview(buf) as whole:   # one copy of the frame (a bytearray slice would be a second)
                    frames.append(memoryview(bytes(whole[pos + 4:pos + 4 + size])))
                pos += 4 + size
            elif size > LARGE_FRAME_BYTES:
                self._large = mmap.mmap(-1, size)
                pos += 4
                break
            else:
                break
        del buf[:pos]

    def clear(self) -> None:
        """Drop the frame being received (the connection is closing)."""
        self._buffer = bytearray()
        self._large, self._filled = None, 0


def metadata_topic_count(frame: Buffer, version: int) -> int:
    """How many topics a Metadata request frame names (-1: every topic), read from its bytes without
    decoding it, so that a request naming 200,000 topics is refused before 200,000 objects exist.
    The header is v1 (v2 with a tag buffer from Metadata v9, the first flexible version); the topics
    array is the body's first field (an int32 count, or from v9 a uvarint of count + 1). ValueError
    (struct.error) for a frame too short to hold them."""
    pos = 8
    (client_id_len,) = _I16.unpack_from(frame, pos)
    pos += 2 + max(client_id_len, 0)
    if version >= 9:
        tags, pos = _read_uvarint(frame, pos)
        for _ in range(tags):
            _, pos = _read_uvarint(frame, pos)
            size, pos = _read_uvarint(frame, pos)
            pos += size
        count, pos = _read_uvarint(frame, pos)
        return count - 1
    (count,) = _I32.unpack_from(frame, pos)
    return count


def _read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise ValueError("a truncated or overlong uvarint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def response_frame(correlation_id: int, flexible_header: bool, body: Sequence[Buffer]) -> list[Buffer]:
    """The buffers of one response: size, header, body."""
    header = _I32.pack(correlation_id) + (b"\x00" if flexible_header else b"")
    size = len(header) + sum(len(b) for b in body)
    return [_I32.pack(size) + header, *body]


@dataclass(slots=True)
class FetchPartitionOut:
    """One partition of a Fetch response; `records` are whole batches (views of segments)."""

    partition: int
    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    records: list[Buffer] = field(default_factory=list)

    @property
    def records_bytes(self) -> int:
        return sum(len(r) for r in self.records)


def encode_fetch_response(version: int, topics: Sequence[tuple[str, Sequence[FetchPartitionOut]]], *,
                          error_code: int = 0, throttle_time_ms: int = 0) -> list[Buffer]:
    """The body of a Fetch response, v4 to v12 (sessionless: session id 0), as buffers."""
    if not 4 <= version <= 12:
        raise ValueError(f"Fetch v{version} is not encoded here (v4-v12)")
    flexible = version >= 12
    out: list[Buffer] = []
    head = bytearray(_I32.pack(throttle_time_ms))
    if version >= 7:
        head += _I16.pack(error_code) + _I32.pack(0)
    head += _array_len(len(topics), flexible)
    for name, partitions in topics:
        raw = name.encode()
        head += (uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw
        head += _array_len(len(partitions), flexible)
        for p in partitions:
            head += _PARTITION_FIXED.pack(p.partition, p.error_code, p.high_watermark, p.high_watermark)
            if version >= 5:
                head += _I64.pack(p.log_start_offset)
            head += b"\x01" if flexible else _I32.pack(0)        # aborted transactions: none
            if version >= 11:
                head += _I32.pack(-1)                             # preferred read replica: none
            size = p.records_bytes
            head += uvarint(size + 1) if flexible else _I32.pack(size)
            if size:
                out.append(bytes(head))
                out.extend(p.records)
                head = bytearray()
            if flexible:
                head += b"\x00"                                   # partition tag buffer
        if flexible:
            head += b"\x00"                                       # topic tag buffer
    if flexible:
        head += b"\x00"                                           # response tag buffer
    out.append(bytes(head))
    return out


def _array_len(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else _I32.pack(n)
