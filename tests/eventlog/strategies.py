"""Hypothesis strategies for Kafka RecordBatch v2 contents, shared by the event-log tests.

Sizes are chosen to cross every varint width the codec has to handle: zigzag varints switch
from 1 to 2 bytes at 64, from 2 to 3 at 8192 and from 3 to 4 at 2**20, and `records.py` keeps a
table of pre-encoded varints below 16384, so `large_bytes` lands on both sides of that limit.
Large values are a short pattern stretched to length: Hypothesis then only has to draw a few
bytes, and gzip has something to compress.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from hypothesis import strategies as st

from eventlog.records import NO_PRODUCER_ID, Record

INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

# Timestamps stay within +-2**62 so that the delta between any two of them fits a varlong, which
# is all Kafka's wire format can carry.
TIMESTAMP_BOUND = 2**62 - 1
SMALL_VARINT_LIMIT = 16384  # records._SMALL_LIMIT: the boundary between cached and computed varints


def _stretch(pattern: bytes, size: int) -> bytes:
    return (pattern * (size // len(pattern) + 1))[:size]


large_bytes = st.builds(
    _stretch,
    st.binary(min_size=1, max_size=16),
    st.one_of(
        st.integers(SMALL_VARINT_LIMIT - 3, SMALL_VARINT_LIMIT + 3),
        st.integers(SMALL_VARINT_LIMIT + 1, 70_000),
    ),
)

# None, empty, short and large payloads: keys, values and header values use all four.
payloads = st.one_of(st.none(), st.just(b""), st.binary(max_size=64), large_bytes)

header_keys = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
headers = st.lists(
    st.tuples(header_keys, st.one_of(st.none(), st.binary(max_size=24), large_bytes)),
    max_size=4,
).map(tuple)

timestamps = st.one_of(
    st.integers(1_500_000_000_000, 1_900_000_000_000),  # wall-clock milliseconds
    st.integers(-TIMESTAMP_BOUND, TIMESTAMP_BOUND),
)


class ProducerFields(TypedDict):
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool


@dataclass(frozen=True)
class Producer:
    """Producer fields of a batch header (KIP-98); `idle` is the non-idempotent default."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False

    def kwargs(self) -> ProducerFields:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "base_sequence": self.base_sequence,
            "transactional": self.transactional,
        }


producers = st.one_of(
    st.just(Producer()),
    st.builds(
        Producer,
        producer_id=st.integers(0, INT64[1]),
        producer_epoch=st.integers(0, INT16[1]),
        base_sequence=st.integers(0, INT32[1]),
        transactional=st.booleans(),
    ),
    # Values no real producer sends still have to survive the wire format.
    st.builds(
        Producer,
        producer_id=st.integers(*INT64),
        producer_epoch=st.integers(*INT16),
        base_sequence=st.integers(*INT32),
        transactional=st.booleans(),
    ),
)

base_offsets = st.integers(0, 2**62)
leader_epochs = st.integers(*INT32)


@st.composite
def record_lists(
    draw: st.DrawFn,
    *,
    max_size: int = 12,
    first_offsets: st.SearchStrategy[int] = base_offsets,
    values: st.SearchStrategy[bytes | None] | None = None,
    header_lists: st.SearchStrategy[tuple[tuple[str, bytes | None], ...]] | None = None,
) -> list[Record]:
    """Records with strictly increasing offsets (gaps included) and arbitrary timestamps.

    Gaps are bounded so that the last offset delta fits the header's int32.
    """
    values = payloads if values is None else values
    header_lists = headers if header_lists is None else header_lists
    n = draw(st.integers(1, max_size))
    offset = draw(first_offsets)
    gaps = draw(st.lists(st.one_of(st.just(1), st.integers(1, 2**24)), min_size=n - 1, max_size=n - 1))
    out = []
    for i in range(n):
        if i:
            offset += gaps[i - 1]
        out.append(Record(offset, draw(timestamps), draw(values), draw(values), draw(header_lists)))
    return out


entry_lists = st.lists(st.tuples(payloads, payloads), min_size=1, max_size=12)

# Without large payloads: for tests that try every byte position or every length of a batch.
small_payloads = st.one_of(st.none(), st.binary(max_size=32))
small_entry_lists = st.lists(st.tuples(small_payloads, small_payloads), min_size=1, max_size=6)
small_headers = st.lists(st.tuples(header_keys, small_payloads), max_size=2).map(tuple)
small_record_lists = record_lists(max_size=6, values=small_payloads, header_lists=small_headers)


# kafka-python's builder writes base offset 0, so the first offset is an offset delta: int32.
delta_offsets = st.integers(0, 2**20)
kafka_record_lists = record_lists(first_offsets=delta_offsets)
small_kafka_record_lists = record_lists(
    max_size=6, first_offsets=delta_offsets, values=small_payloads, header_lists=small_headers)
