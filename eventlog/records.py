"""Kafka RecordBatch v2 (magic 2): the byte format of every log entry.

Byte layout of one batch (big-endian; Kafka's `DefaultRecordBatch`)::

    offset  size  field
         0     8  baseOffset            \\  outside the CRC: the log assigns them at append
         8     4  batchLength           |  (bytes after this field)
        12     4  partitionLeaderEpoch  /  the Raft term that wrote the batch
        16     1  magic (= 2)
        17     4  crc                   CRC32C of bytes 21..end
        21     2  attributes            bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control
        23     4  lastOffsetDelta
        27     8  baseTimestamp
        35     8  maxTimestamp
        43     8  producerId            -1 when not idempotent
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordsCount
        61     .  records

Each record: varint length, int8 attributes, varlong timestampDelta, varint offsetDelta, varint key
length (-1 = null) + key, varint value length + value, varint header count, then per header varint
key length + UTF-8 key, varint value length + value. Varints are zigzag-encoded (protobuf style).

baseOffset and partitionLeaderEpoch sit outside the CRC, so a batch can be encoded once and
stamped with its offset and epoch by the log without recomputing the checksum (`stamp`).

This module is pure (bytes in, bytes out). Encoding is hand-written with `struct` and `crc32c`
because it is the append hot path; it is byte-identical to kafka-python's builder (tested).
"""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import struct
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeVar

from eventlog.errors import BatchTooLargeError, InvalidBatchError, UnsupportedCompressionError

MAGIC: Final = 2
HEADER: Final = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE: Final = HEADER.size  # 61
LOG_OVERHEAD: Final = 12  # baseOffset + batchLength: bytes not counted in batchLength
LENGTH_OFFSET: Final = 8
EPOCH_OFFSET: Final = 12
MAGIC_OFFSET: Final = 16
CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21
# Smallest legal batchLength: the header after the length field, with zero records.
MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20
COMPRESSION_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

NO_PRODUCER_ID: Final = -1

_PREFIX = struct.Struct(">qiibI")  # baseOffset, batchLength, epoch, magic, crc
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (40 bytes, inside the CRC)
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


def _crc32c_function() -> Callable[[bytes | bytearray | memoryview, int], int]:
    """The crc32c package's C function, loaded without the package's `__init__`: that one imports
    importlib.metadata (for `__version__`), argparse and email, about 35 ms of CPU in every process that
    reads or writes a record (each `epochlog serve` start). The module is registered under its own
    name, so a later `import crc32c` reuses it; anything unexpected falls back to the plain import."""
    name = "crc32c._crc32c"
    module = sys.modules.get(name)
    if module is None:
        package = importlib.util.find_spec("crc32c")
        locations = package.submodule_search_locations if package is not None else None
        spec = importlib.machinery.PathFinder.find_spec(name, list(locations)) if locations else None
        if spec is None or spec.loader is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            import crc32c

            return crc32c.crc32c  # type: ignore[no-any-return]
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module.crc32c  # type: ignore[no-any-return]


_crc = _crc32c_function()


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli), continuing from `value`."""
    return _crc(data, value)


# --- varints -------------------------------------------------------------------------------------

def _encode_zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# Pre-encoded zigzag varints for -1..16383: record lengths, deltas and key/value lengths of
# metadata events almost always fall here, so encoding is a list lookup.
_SMALL_LIMIT = 16384
# Built from the encodings' shape (zigzag of n >= 0 is 2n: one byte below 64, two below 8192, three
# up to the limit), which costs a tenth of encoding each one at every start; test_records checks it
# against _encode_zigzag.
_SMALL: Final = [b"\x01", *(bytes((2 * n,)) for n in range(64)),
                 *(bytes((2 * n & 0x7F | 0x80, 2 * n >> 7)) for n in range(64, 8192)),
                 *(bytes((2 * n & 0x7F | 0x80, 2 * n >> 7 & 0x7F | 0x80, 2 * n >> 14)) for n in range(8192, _SMALL_LIMIT))]


def encode_varint(n: int) -> bytes:
    """Zigzag varint (Kafka's `ByteUtils.writeVarint` / `writeVarlong`)."""
    if -1 <= n < _SMALL_LIMIT:
        return _SMALL[n + 1]
    return _encode_zigzag(n)


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zigzag varint at `pos`; returns (value, next position)."""
    try:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
        z = b & 0x7F
        shift = 7
        pos += 1
        while True:
            b = buf[pos]
            pos += 1
            z |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise InvalidBatchError("varint is longer than 10 bytes")
    except IndexError:
        raise InvalidBatchError("varint runs past the end of the batch") from None
    return (z >> 1) ^ -(z & 1), pos


# --- values --------------------------------------------------------------------------------------

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch, with its absolute offset and timestamp (ms)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


class BatchHeader(NamedTuple):
    """The 61-byte header of a batch, decoded."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at `pos` without checking anything (see `check_batch`)."""
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def check_batch(buf: bytes | bytearray | memoryview, pos: int, limit: int) -> BatchHeader | str:
    """Validate the batch at `buf[pos:limit]`: the header or a reason it is not a valid batch.

    Checks length bounds, magic, record count / offset delta consistency and the CRC. Returns the
    reason as a string (not an exception) because recovery probes many positions.
    """
    if limit - pos < HEADER_SIZE:
        return f"only {limit - pos} bytes left, a batch header needs {HEADER_SIZE}"
    h = BatchHeader._make(HEADER.unpack_from(buf, pos))
    if h.batch_length < MIN_BATCH_LENGTH:
        return f"batch length {h.batch_length} is below the minimum {MIN_BATCH_LENGTH}"
    end = pos + LOG_OVERHEAD + h.batch_length
    if end > limit:
        return f"batch length {h.batch_length} runs {end - limit} bytes past the end of the data"
    if h.magic != MAGIC:
        return f"magic {h.magic}, expected {MAGIC}"
    if h.records_count < 0 or h.last_offset_delta < 0 or (
        h.records_count > 0 and h.last_offset_delta < h.records_count - 1
    ):
        return f"{h.records_count} records cannot have last offset delta {h.last_offset_delta}"
    actual = _crc(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end])
    if actual != h.crc:
        return f"CRC mismatch (stored {h.crc:#010x}, computed {actual:#010x})"
    return h


# --- encoding ------------------------------------------------------------------------------------

def encode_batch(
    entries: Sequence[tuple[bytes | None, bytes | None]],
    *,
    timestamp_ms: int,
    base_offset: int = 0,
    leader_epoch: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """Encode (key, value) pairs that share one timestamp as a batch: the append hot path."""
    if not entries:
        raise InvalidBatchError("a batch needs at least one record")
    small = _SMALL
    parts: list[bytes] = []
    append = parts.append
    for delta, (key, value) in enumerate(entries):
        # attributes (0) and timestampDelta (0), offsetDelta, key, value, header count (0). Lengths and
        # bytes are appended apart: a key or value is copied once (by the join), not first into `len + key`.
        if key is None:
            k = b"\x01"
            klen = 0
        else:
            klen = len(key)
            k = small[klen + 1] if klen < _SMALL_LIMIT else encode_varint(klen)
        if value is None:
            v = b"\x01"
            vlen = 0
        else:
            vlen = len(value)
            v = small[vlen + 1] if vlen < _SMALL_LIMIT else encode_varint(vlen)
        d = small[delta + 1] if delta < _SMALL_LIMIT else encode_varint(delta)
        body_len = 3 + len(d) + len(k) + klen + len(v) + vlen
        append(small[body_len + 1] if body_len < _SMALL_LIMIT else encode_varint(body_len))
        append(b"\x00\x00")
        append(d)
        append(k)
        if klen:
            append(key)   # type: ignore[arg-type]
        append(v)
        if vlen:
            append(value)   # type: ignore[arg-type]
        append(b"\x00")
    attributes = TRANSACTIONAL_MASK if transactional else 0
    count = len(entries)
    return _finish(b"".join(parts), base_offset, leader_epoch, attributes, count - 1, timestamp_ms,
                   timestamp_ms, producer_id, producer_epoch, base_sequence, count)


def encode_records(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    leader_epoch: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode records with their own offsets, timestamps and headers (offsets may have gaps).

    `base_offset` defaults to the first record's offset; offsets must strictly increase.
    """
    if not records:
        raise InvalidBatchError("a batch needs at least one record")
    base = records[0].offset if base_offset is None else base_offset
    base_ts = records[0].timestamp
    max_ts = max(r.timestamp for r in records)
    payload = _encode_records(records, base, base_ts)
    attributes = (TRANSACTIONAL_MASK if transactional else 0) | (CONTROL_MASK if control else 0)
    return _finish(payload, base, leader_epoch, attributes, records[-1].offset - base, base_ts, max_ts,
                   producer_id, producer_epoch, base_sequence, len(records))


def retain_records(header: BatchHeader, records: Sequence[Record]) -> bytes:
    """The batch `header` describes, rewritten to hold only `records` (some of its records, in order).

    Log compaction's rule for magic v2 (Kafka's "On compaction"): the batch keeps its baseOffset and
    lastOffsetDelta (so its offset range, and the sequence range of an idempotent producer, are
    unchanged), its partitionLeaderEpoch, attributes, baseTimestamp, maxTimestamp, producer id,
    epoch and baseSequence; each record keeps its own offset and timestamp (offset deltas may now
    have gaps). A gzip batch is compressed again; other codecs are never rewritten (they cannot be
    decoded here).
    """
    if not records:
        raise InvalidBatchError("a retained batch needs at least one record")
    codec = header.compression
    if codec not in (0, 1):
        raise UnsupportedCompressionError(
            f"compression {COMPRESSION_NAMES.get(codec, codec)!s} cannot be rewritten (only none and gzip)")
    if records[0].offset < header.base_offset or records[-1].offset > header.last_offset:
        raise InvalidBatchError(f"records {records[0].offset}..{records[-1].offset} are outside the batch "
                                f"[{header.base_offset}, {header.last_offset}]")
    payload = _encode_records(records, header.base_offset, header.base_timestamp)
    if codec == 1:
        payload = gzip.compress(payload, mtime=0)
    return _finish(payload, header.base_offset, header.leader_epoch, header.attributes, header.last_offset_delta,
                   header.base_timestamp, header.max_timestamp, header.producer_id, header.producer_epoch,
                   header.base_sequence, len(records))


class RecordSpan(NamedTuple):
    """Where one record lies in a batch's (uncompressed) records payload, and what a cleaner needs
    of it without decoding it: its offset, key, and whether its value is null."""

    offset: int
    key: bytes | None
    null_value: bool
    start: int
    end: int


def records_payload(header: BatchHeader, raw: bytes | bytearray | memoryview,
                    max_bytes: int | None = None) -> bytes | memoryview:
    """The records part of a batch (`raw`: the whole batch), decompressed; UnsupportedCompressionError
    for a codec other than none and gzip. With `max_bytes`, BatchTooLargeError for a payload larger
    than that, raised before more than `max_bytes` + 1 bytes are inflated (`gunzip`)."""
    return _payload(header, memoryview(raw)[HEADER_SIZE:header.size], max_bytes)


def _payload(header: BatchHeader, body: memoryview, max_bytes: int | None) -> bytes | memoryview:
    codec = header.compression
    if codec == 0:
        if max_bytes is not None and len(body) > max_bytes:
            raise BatchTooLargeError(f"the batch's records take {len(body)} bytes, more than {max_bytes}")
        return body
    if codec == 1:
        return gunzip(body, max_bytes)
    raise UnsupportedCompressionError(
        f"compression {COMPRESSION_NAMES.get(codec, codec)!s} is not supported (only none and gzip)")


def gunzip(data: bytes | memoryview, max_bytes: int | None = None) -> bytes:
    """What `gzip.decompress(data)` gives (every member; zero padding between and after members is
    skipped), InvalidBatchError where it raises, and where a member sets reserved header flag bits
    (RFC 1952 says they must be zero; gzip.decompress ignores them). With `max_bytes`: BatchTooLargeError as soon as the
    output passes it, having inflated at most `max_bytes` + 1 bytes: a small batch that would inflate
    to gigabytes costs no more memory and time than one of `max_bytes`."""
    out = bytearray()
    rest = bytes(data)
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)   # gzip framing; checks each member's CRC and size
        try:
            if max_bytes is None:
                out += inflater.decompress(rest)
            else:
                out += inflater.decompress(rest, max_bytes - len(out) + 1)
        except zlib.error as exc:
            raise InvalidBatchError(f"gzip payload does not decompress: {exc}") from None
        if max_bytes is not None and len(out) > max_bytes:
            raise BatchTooLargeError(f"the batch's records inflate to more than {max_bytes} bytes "
                                     f"({len(data)} bytes compressed)")
        if not inflater.eof:
            raise InvalidBatchError("gzip payload does not decompress: compressed data ended before the "
                                    "end-of-stream marker was reached")
        rest = inflater.unused_data.lstrip(b"\x00")
    return bytes(out)


def record_spans(header: BatchHeader, payload: bytes | memoryview) -> list[RecordSpan]:
    """Every record of a batch as a `RecordSpan`, reading only lengths, offset delta and key (the
    log cleaner's hot loop; one-byte varints inlined, about 3x faster than `RecordBatch.records()`)."""
    data = bytes(payload)
    dv = decode_varint
    base = header.base_offset
    out: list[RecordSpan] = []
    pos = 0
    end = len(data)
    for _ in range(header.records_count):
        start = pos
        b = data[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            length, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            length, pos = dv(data, pos)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise InvalidBatchError(f"record length {length} runs past the end of the batch")
        pos += 1                                   # attributes
        b = data[pos]
        pos = pos + 1 if b < 0x80 else dv(data, pos)[1]   # timestamp delta
        b = data[pos]
        if b < 0x80:
            delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            delta, pos = dv(data, pos)
        b = data[pos]
        if b < 0x80:
            klen, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            klen, pos = dv(data, pos)
        if klen >= 0:
            key: bytes | None = data[pos:pos + klen]
            pos += klen
        else:
            key = None
        # The value length: null is -1; a zigzag varint's sign is the low bit of its first byte.
        null_value = data[pos] & 1 == 1
        out.append(RecordSpan(base + delta, key, null_value, start, record_end))
        pos = record_end
    if pos != end:
        raise InvalidBatchError(f"{end - pos} bytes left over after {header.records_count} records")
    return out


def span_value(payload: bytes | memoryview, span: RecordSpan) -> memoryview | None:
    """The value of the record `span` locates in `payload` (a view of it, no copy; None for a null
    value): what a key function that looks at the value needs, without decoding the record."""
    view = memoryview(payload)
    _length, pos = decode_varint(view, span.start)
    pos += 1                                        # attributes
    _ts, pos = decode_varint(view, pos)
    _delta, pos = decode_varint(view, pos)
    klen, pos = decode_varint(view, pos)
    pos += max(klen, 0)
    vlen, pos = decode_varint(view, pos)
    if vlen < 0:
        return None
    if pos + vlen > span.end:
        raise InvalidBatchError(f"the value of the record at offset {span.offset} runs past the record")
    return view[pos:pos + vlen]


def retain_spans(header: BatchHeader, payload: bytes | memoryview, spans: Sequence[RecordSpan]) -> bytes:
    """`retain_records` from raw record bytes: the kept records are copied as they are (their offset
    and timestamp deltas stay valid: the batch keeps its base offset and base timestamp)."""
    if not spans:
        raise InvalidBatchError("a retained batch needs at least one record")
    codec = header.compression
    view = memoryview(payload)
    body = b"".join(view[s.start:s.end] for s in spans)
    if codec == 1:
        body = gzip.compress(body, mtime=0)
    elif codec != 0:
        raise UnsupportedCompressionError(
            f"compression {COMPRESSION_NAMES.get(codec, codec)!s} cannot be rewritten (only none and gzip)")
    return _finish(body, header.base_offset, header.leader_epoch, header.attributes, header.last_offset_delta,
                   header.base_timestamp, header.max_timestamp, header.producer_id, header.producer_epoch,
                   header.base_sequence, len(spans))


def decode_record(header: BatchHeader, payload: bytes | memoryview, span: RecordSpan) -> Record:
    """The one record at `span` of a batch's payload, decoded."""
    one = header._replace(records_count=1)
    return next(decode_records(one, memoryview(payload)[span.start:span.end], Record))


def _encode_records(records: Sequence[Record], base: int, base_ts: int) -> bytes:
    """The records part of a batch: offsets strictly increasing from `base`, timestamps from `base_ts`."""
    parts: list[bytes] = []
    previous = base - 1
    for r in records:
        if r.offset <= previous:
            raise InvalidBatchError(f"record offsets must increase: {r.offset} after {previous}")
        previous = r.offset
        body = [b"\x00", encode_varint(r.timestamp - base_ts), encode_varint(r.offset - base)]
        body += _encode_bytes(r.key)
        body += _encode_bytes(r.value)
        body.append(encode_varint(len(r.headers)))
        for hkey, hvalue in r.headers:
            body += _encode_bytes(hkey.encode("utf-8"))
            body += _encode_bytes(hvalue)
        raw = b"".join(body)
        parts.append(encode_varint(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def _encode_bytes(data: bytes | None) -> list[bytes]:
    if data is None:
        return [b"\x01"]
    return [encode_varint(len(data)), data]


def _finish(records: bytes, base_offset: int, leader_epoch: int, attributes: int,
            last_offset_delta: int, base_ts: int, max_ts: int, producer_id: int,
            producer_epoch: int, base_sequence: int, count: int) -> bytes:
    try:
        tail = _TAIL.pack(attributes, last_offset_delta, base_ts, max_ts, producer_id, producer_epoch,
                          base_sequence, count)
        crc = _crc(records, _crc(tail))
        batch_length = HEADER_SIZE - LOG_OVERHEAD + len(records)
        prefix = _PREFIX.pack(base_offset, batch_length, leader_epoch, MAGIC, crc)
    except struct.error as exc:
        raise InvalidBatchError(f"a batch field is out of range: {exc}") from None
    return b"".join((prefix, tail, records))


def stamp(batch: bytearray | memoryview, base_offset: int, leader_epoch: int) -> None:
    """Write baseOffset and partitionLeaderEpoch into an encoded batch (both outside the CRC)."""
    _INT64.pack_into(batch, 0, base_offset)
    _INT32.pack_into(batch, EPOCH_OFFSET, leader_epoch)


# --- decoding ------------------------------------------------------------------------------------

class RecordBatch:
    """A decoded view of one batch; records are decoded lazily by `records()`.

    Holds a reference to the buffer it was read from (often a view of a mapped segment).
    """

    __slots__ = ("header", "_buf")

    def __init__(self, header: BatchHeader, buf: memoryview) -> None:
        self.header = header
        self._buf = buf

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> RecordBatch:
        """Parse exactly one batch from `data` (which may hold more bytes after it)."""
        view = memoryview(data)
        if verify_crc:
            checked = check_batch(view, 0, len(view))
            if isinstance(checked, str):
                raise InvalidBatchError(checked)
            header = checked
        else:
            if len(view) < HEADER_SIZE:
                raise InvalidBatchError(f"{len(view)} bytes cannot hold a batch header")
            header = read_header(view)
            # Skipping the CRC must not skip framing: a length below the header would make
            # iter_batches step by zero or backwards, forever.
            if not MIN_BATCH_LENGTH <= header.batch_length <= len(view) - LOG_OVERHEAD:
                raise InvalidBatchError(f"batch length {header.batch_length} does not fit {len(view)} bytes")
            if header.magic != MAGIC:
                raise InvalidBatchError(f"magic {header.magic}, expected {MAGIC}")
        return cls(header, view[: header.size])

    @property
    def raw(self) -> memoryview:
        """The batch bytes as stored."""
        return self._buf

    def records(self, max_bytes: int | None = None) -> Iterator[Record]:
        """Decode the records (decompressing gzip; other codecs raise UnsupportedCompressionError).
        With `max_bytes`: BatchTooLargeError, at once, for records taking more than that uncompressed
        (a batch from outside: it never inflates past the bound, `gunzip`)."""
        h = self.header
        return decode_records(h, _payload(h, self._buf[HEADER_SIZE:], max_bytes), Record)

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def __repr__(self) -> str:
        h = self.header
        return (f"RecordBatch(base_offset={h.base_offset}, records={h.records_count}, "
                f"epoch={h.leader_epoch}, size={h.size})")


R = TypeVar("R")


def decode_records(h: BatchHeader, payload: bytes | memoryview,
                   make: Callable[[int, int, bytes | None, bytes | None, tuple[Header, ...]], R]) -> Iterator[R]:
    """The records of a batch's records part (`payload`, decompressed), each built by
    `make(offset, timestamp, key, value, headers)`: `Record` for `RecordBatch.records()`, a reader's own
    row type elsewhere (eventlog/offline.py `read_committed`), so every reader shares this one decoder.

    The hot loop of every read: the payload is copied to `bytes` once (slices of it are then the keys
    and values, one copy each instead of two), and the one-byte case of each varint is decoded inline
    (`decode_varint` does the longer ones)."""
    data = payload.tobytes() if isinstance(payload, memoryview) else payload
    pos = 0
    end = len(data)
    dv = decode_varint
    base_offset = h.base_offset
    base_ts = h.base_timestamp
    # LogAppendTime: every record's timestamp is the batch's max timestamp (the broker's clock).
    log_append_time = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_MASK else None
    for _ in range(h.records_count):
        try:
            b = data[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:   # two bytes: a value's length, an offset delta of 64 or more
                z = (b & 0x7F) | data[pos + 1] << 7
                length, pos = (z >> 1) ^ -(z & 1), pos + 2
            else:
                length, pos = dv(data, pos)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise InvalidBatchError(f"record length {length} runs past the end of the batch")
            pos += 1  # record attributes (unused in v2)
            b = data[pos]
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                ts_delta, pos = dv(data, pos)
            b = data[pos]
            if b < 0x80:
                offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:   # two bytes: a value's length, an offset delta of 64 or more
                z = (b & 0x7F) | data[pos + 1] << 7
                offset_delta, pos = (z >> 1) ^ -(z & 1), pos + 2
            else:
                offset_delta, pos = dv(data, pos)
            b = data[pos]
            if b < 0x80:
                klen, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                klen, pos = dv(data, pos)
            if klen >= 0:
                key: bytes | None = data[pos:pos + klen]
                pos += klen
            else:
                key = None
            b = data[pos]
            if b < 0x80:
                vlen, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:   # two bytes: a value's length, an offset delta of 64 or more
                z = (b & 0x7F) | data[pos + 1] << 7
                vlen, pos = (z >> 1) ^ -(z & 1), pos + 2
            else:
                vlen, pos = dv(data, pos)
            if vlen >= 0:
                value: bytes | None = data[pos:pos + vlen]
                pos += vlen
            else:
                value = None
            b = data[pos]
            if b < 0x80:
                nheaders, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                nheaders, pos = dv(data, pos)
        except IndexError:
            raise InvalidBatchError("varint runs past the end of the batch") from None
        if nheaders < 0:
            raise InvalidBatchError(f"record header count {nheaders} is negative")
        if not nheaders:   # the usual record: no headers, no list
            if pos != record_end:
                raise InvalidBatchError(f"record declares {length} bytes but its fields take "
                                        f"{pos - record_end + length}")
            yield make(base_offset + offset_delta, base_ts + ts_delta if log_append_time is None else log_append_time,
                       key, value, ())
            continue
        headers: list[Header] = []
        for _h in range(nheaders):
            hklen, pos = dv(data, pos)
            if hklen < 0:
                raise InvalidBatchError("a header key cannot be null")
            hkey = data[pos:pos + hklen].decode("utf-8", errors="replace")
            pos += hklen
            hvlen, pos = dv(data, pos)
            if hvlen >= 0:
                hvalue: bytes | None = data[pos:pos + hvlen]
                pos += hvlen
            else:
                hvalue = None
            headers.append((hkey, hvalue))
        if pos != record_end:
            raise InvalidBatchError(f"record declares {length} bytes but its fields take {pos - record_end + length}")
        timestamp = base_ts + ts_delta if log_append_time is None else log_append_time
        yield make(base_offset + offset_delta, timestamp, key, value, tuple(headers))
    if pos != end:
        raise InvalidBatchError(f"{end - pos} bytes left over after {h.records_count} records")


class _NotCommon(Exception):
    """A record `record_rows` leaves to `decode_records` (a shape outside the common one, or an error)."""


Row = tuple[int, bytes | None, bytes | None]
"""A record's offset, key and value: what an applier reads of it."""


def _row(offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: object) -> Row:
    return offset, key, value


# The zigzag varints `record_rows` reads, by their bytes: `_ZIGZAG_1[b]` the value of a one-byte varint b
# (None: b has the continuation bit, the varint is longer); `_ZIGZAG_2[b & 0x7F | c << 7]` that of the
# two-byte varint b, c (c < 0x80). test_records checks both against `decode_varint`.
_ZIGZAG_1: Final[list[int | None]] = [(b >> 1) ^ -(b & 1) if b < 0x80 else None for b in range(256)]
_ZIGZAG_2: Final[list[int]] = [v for n in range(1 << 13) for v in (n, ~n)]   # zigzag order: 0, -1, 1, -2, ...


def record_rows(h: BatchHeader, payload: bytes | memoryview) -> list[Row]:
    """(offset, key, value) of every record of a batch's records part: exactly what
    `list(decode_records(h, payload, make))` gives with `make` keeping those three, and its
    InvalidBatchError with the same message, but about twice as fast on the batches a leader encodes.

    The applier's hot loop (a follower parses every committed batch): one pass, no generator, no call
    per record, for the common shape (no timestamp delta past one byte, keys under 64 bytes, lengths and
    offset deltas under two bytes, no headers). Anything else, a damaged record included, hands the whole
    batch to `decode_records`, so this never accepts what it refuses nor reads a record differently."""
    data = payload.tobytes() if isinstance(payload, memoryview) else payload
    rows: list[Row] = []
    append = rows.append
    base = h.base_offset
    one, two = _ZIGZAG_1, _ZIGZAG_2   # a varint's value by its byte(s): lookups instead of arithmetic
    pos = 0
    end = len(data)
    try:
        for _ in range(h.records_count):
            length = one[data[pos]]
            if length is None:
                c = data[pos + 1]
                if c >= 0x80:
                    raise _NotCommon
                length = two[data[pos] & 0x7F | c << 7]
                pos += 2
            else:
                pos += 1
            record_end = pos + length
            if data[pos + 1] >= 0x80:   # after the attributes: a timestamp delta of one byte
                raise _NotCommon
            delta = one[data[pos + 2]]
            if delta is None:
                c = data[pos + 3]
                if c >= 0x80:
                    raise _NotCommon
                delta = two[data[pos + 2] & 0x7F | c << 7]
                pos += 4
            else:
                pos += 3
            klen = one[data[pos]]
            if klen is None:
                raise _NotCommon
            if klen >= 0:
                pos += 1 + klen
                key: bytes | None = data[pos - klen:pos]
            else:
                key = None
                pos += 1
            vlen = one[data[pos]]
            if vlen is None:
                c = data[pos + 1]
                if c >= 0x80:
                    raise _NotCommon
                vlen = two[data[pos] & 0x7F | c << 7]
                pos += 2
            else:
                pos += 1
            if vlen >= 0:
                pos += vlen
                value: bytes | None = data[pos - vlen:pos]
            else:
                value = None
            # No headers, and the record ends there (so its length was neither negative nor past the end:
            # this is the test of both)
            if pos + 1 != record_end or data[pos]:
                raise _NotCommon
            pos = record_end
            append((base + delta, key, value))
        if pos != end:
            raise _NotCommon
    except (_NotCommon, IndexError):
        return list(decode_records(h, data, _row))
    return rows


def iter_batches(data: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> Iterator[RecordBatch]:
    """Iterate the batches laid end to end in `data` (for example the result of a log read)."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        batch = RecordBatch.parse(view[pos:], verify_crc=verify_crc)
        yield batch
        pos += batch.header.size


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """(base offset, total size) of the batch at `pos`, read from its first 12 bytes only."""
    base, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    return base, length + LOG_OVERHEAD
