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
