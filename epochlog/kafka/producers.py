"""Idempotent producers on the leader: is an incoming batch new, a retry, or refused?

An idempotent Kafka producer stamps each batch with (producer id, producer epoch, base sequence);
Epochlog stores each producer batch as its own Raft entry whose RecordBatch header keeps them, and
applies them with the producer's state in the views (statemachines/producers.py: the rules, `judge`,
and why a batch is never applied twice even if it reached the log twice). The leader decides before
appending, on the same rules, from the producer's committed state in its views plus the producer's
batches in its log past the applied offset (appended, not yet applied: a Raft leader never drops its
own entries; they commit in its term or it loses leadership):

- a retry of one of the producer's last CACHED_BATCHES batches gets that batch's original offset and
  is not appended;
- a gap is OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch INVALID_PRODUCER_EPOCH, and a producer with no
  state (expired, after `producer.id.expiration` of committed time) may only start at sequence 0:
  any other batch is refused with UNKNOWN_PRODUCER_ID rather than appended a second time (kafka-python
  and aiokafka then bump the producer's epoch, KIP-360).

Leader changes, snapshots and key compaction lose nothing: the state is in the views. Call from the
node's loop (it reads the views and the log).
"""

from __future__ import annotations

from typing import Protocol

from eventlog.errors import KafkaError, rejection
from eventlog.log import LogRead
from eventlog.records import NO_PRODUCER_ID
from statemachines import producers as sp
from statemachines.producers import BatchMeta, ProducerState, Verdict


class LogReader(Protocol):
    """What `check` reads of a group's log: the node's GroupLog (epochlog/group_log.py), or eventlog's Log."""

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    def read(self, offset: int, max_bytes: int = ..., *, max_offset: int | None = None) -> LogRead: ...


def refused(reason: str, message: str) -> KafkaError:
    """A producer batch refused for `reason` (statemachines/producers.py), with its Kafka code (its row of
    eventlog.errors.REJECTIONS)."""
    code = rejection(reason).kafka_error
    assert code is not None, f"refusal {reason!r} has no Kafka code in REJECTIONS"
    return KafkaError(code, message)


def check(views: sp.Reader, log: LogReader, applied: int, producer_id: int, epoch: int, first_seq: int, count: int,
          partition: str = "") -> BatchMeta | None:
    """None: append the batch. A BatchMeta: it is a retry of that stored batch (answer its offsets).
    Raises KafkaError OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH or UNKNOWN_PRODUCER_ID.

    `views` holds the state applied through `applied`; the producer's batches in `log` past it are
    applied on top here, as the applier will."""
    state = sp.load(views, partition, producer_id)
    for batch in _pending(log, applied, producer_id, partition):
        state = _after(state, producer_id, batch)
    j = sp.judge(state, producer_id, epoch, first_seq, count, leader=True)
    if j.verdict is Verdict.DUPLICATE:
        return j.batch
    if j.verdict is Verdict.REFUSED:
        raise refused(j.code, j.message)
    return None


def _pending(log: LogReader, applied: int, producer_id: int, partition: str) -> list[tuple[int, int, BatchMeta]]:
    """(epoch, first sequence, batch) of the producer's batches of `partition` in `log` past `applied`."""
    out = []
    offset = max(applied + 1, log.start_offset)
    while offset < log.end_offset:
        chunk = log.read(offset, 4 << 20)
        if chunk is None or chunk.next_offset <= offset:
            break
        for batch in chunk.batches():
            h = batch.header
            if h.producer_id != producer_id or h.producer_id == NO_PRODUCER_ID or h.base_sequence < 0 or h.is_control:
                continue
            first = next(iter(batch.records()), None)
            if sp.partition_of(None if first is None else first.key) != partition:
                continue
            last = h.base_offset + h.last_offset_delta
            out.append((h.producer_epoch, h.base_sequence,
                        BatchMeta(h.base_sequence, sp.last_sequence(h.base_sequence, h.last_offset_delta + 1),
                                  h.base_offset, last)))
        offset = chunk.next_offset
    return out


def _after(state: ProducerState | None, producer_id: int, pending: tuple[int, int, BatchMeta]) -> ProducerState | None:
    """The state once a pending batch is applied (as the applier judges it)."""
    epoch, first_seq, batch = pending
    count = batch.last_offset - batch.first_offset + 1
    if sp.judge(state, producer_id, epoch, first_seq, count, leader=False).verdict is not Verdict.APPEND:
        return state
    return sp.appended(state, epoch, batch, state.deadline_ms if state is not None else 0)
