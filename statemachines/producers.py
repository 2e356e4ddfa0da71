"""Kafka idempotent producers' sequence state, applied with the entries: no leader change, snapshot or
compaction loses it.

An idempotent Kafka producer stamps each batch with (producer id, producer epoch, base sequence); the
Kafka face (epochlog/kafka) stores each such batch as one Raft entry whose RecordBatch header keeps
them. Sequences are per (partition, producer): the group's own topic (partition key "") or a hosted
partition ("topic/partition", from the first record's key). `judge` decides what an incoming batch
is, given the producer's state, and both sides use it: the leader before appending (it answers a
retry with the original offsets without appending it), and the applier on every committed producer
entry, so even a batch that reached the log twice (a new leader's log holding the first attempt, the
retry appended before it learned so) is applied once:

- same epoch, same first and last sequence as one of the last CACHED_BATCHES batches: a retry
  (DUPLICATE, with the stored batch's offsets); its records change nothing;
- an older epoch: INVALID_PRODUCER_EPOCH; a newer epoch must start at sequence 0;
- same epoch, the sequence after the last one: appended; anything else OUT_OF_ORDER_SEQUENCE_NUMBER;
- no state: the leader appends a first batch (sequence 0) and refuses any other with
  UNKNOWN_PRODUCER_ID (its state expired: it could be the retry of a batch applied long ago); the
  applier applies it and records the state (views of an Epochlog from before this module hold no
  producer state, and must apply what the leader of that time accepted, as its peers do).

State expires PRODUCER_EXPIRY_MS of committed time (statemachines/sessions.Clock) after the producer's
latest batch, as Kafka's `producer.id.expiration.ms`, and at most MAX_PRODUCERS are kept per group
(the one closest to expiry goes first). Rows (column families of statemachines/store.py):

    producers           partition key + b"\\0" + 8-byte producer id -> ProducerState
    producer_deadlines  8-byte deadline (ms) + producers key -> b""
    meta                b"producers_live": 8-byte count; b"producers_checked_ms" (deadlines.py)

Pure functions over the applier's pending writes (and a store, for the leader's reads).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Protocol

import msgspec

from eventlog.errors import INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER
from statemachines.deadlines import Deadlines
from statemachines.state import Outcome, encode
from statemachines.store import encode_offset

if TYPE_CHECKING:
    from statemachines.apply import Overlay

PRODUCERS: Final = "producers"
DEADLINES: Final = Deadlines("producer_deadlines", live=b"producers_live", checked=b"producers_checked_ms",
                             per_entry=16)
CACHED_BATCHES: Final = 5            # Kafka keeps the last 5 batches per producer (max in-flight requests)
SEQUENCE_MODULUS: Final = 1 << 31    # sequences wrap at Int32.MAX_VALUE
PRODUCER_EXPIRY_MS: Final = 86_400_000
MAX_PRODUCERS: Final = 100_000
DEADLINE_STEP_MS: Final = 60_000     # the deadline row moves at most once a minute per producer

# Outcome codes of refused producer batches (the Kafka face maps them to Kafka's error codes).


class BatchMeta(msgspec.Struct, frozen=True, array_like=True):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


class ProducerState(msgspec.Struct, frozen=True, array_like=True):
    epoch: int
    batches: tuple[BatchMeta, ...]      # the last CACHED_BATCHES, oldest first
    deadline_ms: int = 0

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


_decoder = msgspec.msgpack.Decoder(ProducerState)


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    REFUSED = "refused"


class Judgement(msgspec.Struct, frozen=True):
    verdict: Verdict
    batch: BatchMeta | None = None       # DUPLICATE: the stored batch it repeats
    code: str = ""                       # REFUSED: why (OUT_OF_ORDER_SEQUENCE, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER)
    message: str = ""


def last_sequence(first_seq: int, count: int) -> int:
    return (first_seq + count - 1) % SEQUENCE_MODULUS


def judge(state: ProducerState | None, producer_id: int, epoch: int, first_seq: int, count: int, *,
          leader: bool) -> Judgement:
    """What an incoming batch of `count` records is, given the producer's state (module docstring);
    `leader`: judged before appending (an unknown producer must start at sequence 0)."""
    last = last_sequence(first_seq, count)
    if state is None:
        if first_seq == 0 or not leader:
            return Judgement(Verdict.APPEND)
        return Judgement(Verdict.REFUSED, code=UNKNOWN_PRODUCER,
                         message=f"producer {producer_id} has no state here (expired, or never produced): a batch "
                                 f"at sequence {first_seq} may repeat one applied long ago and is not appended")
    if epoch < state.epoch:
        return Judgement(Verdict.REFUSED, code=INVALID_PRODUCER_EPOCH,
                         message=f"producer {producer_id} epoch {epoch} is older than its current epoch {state.epoch}")
    if epoch > state.epoch:
        if first_seq != 0:
            return Judgement(Verdict.REFUSED, code=OUT_OF_ORDER_SEQUENCE,
                             message=f"producer {producer_id}: a new epoch {epoch} starts at sequence 0, not {first_seq}")
        return Judgement(Verdict.APPEND)
    for b in state.batches:
        if b.first_seq == first_seq and b.last_seq == last:
            return Judgement(Verdict.DUPLICATE, batch=b)
    expected = (state.last_seq + 1) % SEQUENCE_MODULUS
    if first_seq != expected:
        return Judgement(Verdict.REFUSED, code=OUT_OF_ORDER_SEQUENCE,
                         message=f"producer {producer_id} epoch {epoch}: sequence {first_seq}, expected {expected}")
    return Judgement(Verdict.APPEND)


def appended(state: ProducerState | None, epoch: int, batch: BatchMeta, deadline_ms: int) -> ProducerState:
    """The state after appending `batch` (judged APPEND) in `epoch`."""
    kept = () if state is None or epoch > state.epoch else state.batches[-(CACHED_BATCHES - 1):]
    return ProducerState(epoch, (*kept, batch), deadline_ms)


HOSTED_NAME_PREFIX: Final = "kafka/"
"""Kv names of hosted Kafka topics' records: kafka/<topic>/<partition>/... (epochlog/kafka/hosted.py)."""
_HOSTED_KEY_PREFIX: Final = b"kv/" + HOSTED_NAME_PREFIX.encode()


def partition_of(first_record_key: bytes | memoryview | None) -> str:
    """The partition a producer batch belongs to, from its first record's key: "T/P" for a hosted
    partition, "" for the group's own topic."""
    if first_record_key is None:
        return ""
    key = bytes(first_record_key)
    if not key.startswith(_HOSTED_KEY_PREFIX):
        return ""
    parts = key.split(b"/", 4)
    return f"{parts[2].decode()}/{parts[3].decode()}" if len(parts) == 5 else ""


def producer_key(partition: str, producer_id: int) -> bytes:
    return partition.encode() + b"\x00" + encode_offset(producer_id)


class Reader(Protocol):
    def get(self, cf: str, key: bytes) -> bytes | None: ...


def load(store: Reader, partition: str, producer_id: int) -> ProducerState | None:
    """A producer's committed state (from the views, or the applier's pending writes)."""
    raw = store.get(PRODUCERS, producer_key(partition, producer_id))
    return None if raw is None else _decoder.decode(raw)


def apply_batch(ov: Overlay, partition: str, producer_id: int, epoch: int, first_seq: int, first_offset: int,
                last_offset: int, now_ms: int) -> Outcome | None:
    """Judge a committed producer entry: None (apply its records; the state is recorded), or the outcome
    every one of its records gets instead (a retry's, pointing at the original, or a refusal)."""
    key = producer_key(partition, producer_id)
    state = load(ov, partition, producer_id)
    if state is not None and now_ms >= state.deadline_ms:
        _evict(ov, state.deadline_ms, key)
        state = None
    count = last_offset - first_offset + 1
    j = judge(state, producer_id, epoch, first_seq, count, leader=False)
    if j.verdict is Verdict.DUPLICATE:
        assert j.batch is not None
        return Outcome(True, j.batch.first_offset, "", f"a retry of the batch at offsets {j.batch.first_offset}-"
                                                       f"{j.batch.last_offset}", duplicate=True)
    if j.verdict is Verdict.REFUSED:
        return Outcome(False, first_offset, j.code, j.message)
    if state is None:
        while DEADLINES.count(ov) >= MAX_PRODUCERS:   # evict the one closest to its deadline
            first = DEADLINES.first(ov)
            if first is None:
                break
            _evict(ov, *first)
    deadline = now_ms + PRODUCER_EXPIRY_MS
    if state is None:
        DEADLINES.add(ov, deadline, key)
    elif deadline - state.deadline_ms >= DEADLINE_STEP_MS:
        DEADLINES.move(ov, state.deadline_ms, deadline, key)
    else:
        deadline = state.deadline_ms
    batch = BatchMeta(first_seq, last_sequence(first_seq, count), first_offset, last_offset)
    ov.put(PRODUCERS, key, encode(appended(state, epoch, batch, deadline)))
    return None


def expire(ov: Overlay, now_ms: int) -> None:
    """Drop producers whose deadline passed (a few per entry: statemachines/deadlines.py); call once per entry."""
    for deadline, key in DEADLINES.due(ov, now_ms):
        _evict(ov, deadline, key)


def _evict(ov: Overlay, deadline_ms: int, key: bytes) -> None:
    """Forget the producer whose deadline row is (deadline_ms, key)."""
    ov.delete(PRODUCERS, key)
    DEADLINES.remove(ov, deadline_ms, key)
