"""Idempotent producers: per-partition sequence state, rebuilt from the log (as Kafka does).

An idempotent Kafka producer stamps each batch with (producer id, producer epoch, base sequence);
the leader appends a batch only if its first sequence follows the producer's last one, answers a
retry of one of the producer's last `CACHED_BATCHES` batches with that batch's original offset, and
refuses a gap with OUT_OF_ORDER_SEQUENCE_NUMBER. Epochlog stores each producer batch as its own
Raft entry whose RecordBatch header keeps the producer's id, epoch and base sequence (the records
keep their count and order), so the state is a function of the log: a new leader rebuilds it by
reading the batch headers of its log, uncommitted tail included (a Raft leader never drops its own
entries; they commit in its term or it loses leadership, and then the next leader rebuilds again).

`ProducerStateTable` is pure: it is fed batch headers (`observe`) and asked about an incoming batch
(`check`). `sync` reads a log's headers; the caller decides when (the Kafka face: before each
idempotent append on the leader). Not thread-safe: call from one loop.

Producers whose batches all left the log (truncation) are unknown again: their next batch is
accepted whatever its sequence (the state that could refuse it is gone), as Kafka does once it has
expired a producer's state. A rebuild reads the log from where it holds every batch as written
(`full_history_start`): below, key compaction may have dropped a producer's latest batches whole
and kept older ones, which would make its next batch look like a gap (Kafka's cleaner keeps the last
batch of every producer instead; here those producers are unknown again, like expired ones). A
batch's last sequence is its base sequence plus its last offset delta (Kafka's definition, true of a
batch that lost records too).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

from epochlog.kafka import errors as ke
from epochlog.kafka.errors import KafkaError
from epochlog.kafka.hosted import partition_key_of
from eventlog.log import Log
from eventlog.raft.runtime.group import full_history_start
from eventlog.records import NO_PRODUCER_ID, BatchHeader

CACHED_BATCHES: Final = 5          # Kafka keeps the last 5 batches per producer (max in-flight requests)
SEQUENCE_MODULUS: Final = 1 << 31  # sequences wrap at Int32.MAX_VALUE


@dataclass(frozen=True, slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


def last_sequence(first_seq: int, count: int) -> int:
    return (first_seq + count - 1) % SEQUENCE_MODULUS


class ProducerStateTable:
    """The producers of the partitions one Raft group's log holds: its own topic (partition key "")
    and the hosted partitions (epochlog/kafka/hosted.py: partition key "topic/partition", from the
    first record key of a batch). Sequences are per (partition, producer), as in Kafka."""

    def __init__(self) -> None:
        self.producers: dict[tuple[str, int], ProducerEntry] = {}
        self.scanned_to = -1      # next offset to read; -1: never scanned
        self.term = -1            # the leader term the scan belongs to

    def observe(self, h: BatchHeader, partition: str = "") -> None:
        """Account for a batch stored in the log (of `partition`)."""
        if h.producer_id == NO_PRODUCER_ID or h.base_sequence < 0 or h.is_control:
            return
        entry = self.producers.get((partition, h.producer_id))
        if entry is None or h.producer_epoch > entry.epoch:
            entry = self.producers[(partition, h.producer_id)] = ProducerEntry(h.producer_epoch)
        elif h.producer_epoch < entry.epoch:
            return   # a fenced epoch's batch (cannot be appended by this code; ignore it)
        entry.batches.append(BatchMeta(h.base_sequence, last_sequence(h.base_sequence, h.last_offset_delta + 1),
                                       h.base_offset, h.base_offset + h.last_offset_delta))

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int,
              partition: str = "") -> BatchMeta | None:
        """None: append the batch. A BatchMeta: it is a retry of that stored batch (answer its offsets).
        Raises KafkaError OUT_OF_ORDER_SEQUENCE_NUMBER or INVALID_PRODUCER_EPOCH."""
        entry = self.producers.get((partition, producer_id))
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise KafkaError(ke.INVALID_PRODUCER_EPOCH, f"producer {producer_id} epoch {epoch} is older than the "
                                                        f"current epoch {entry.epoch}")
        last = last_sequence(first_seq, count)
        if epoch > entry.epoch:
            if first_seq != 0:
                raise KafkaError(ke.OUT_OF_ORDER_SEQUENCE_NUMBER, f"producer {producer_id}: a new epoch {epoch} "
                                                                  f"starts at sequence 0, not {first_seq}")
            return None
        for b in entry.batches:
            if b.first_seq == first_seq and b.last_seq == last:
                return b
        expected = (entry.last_seq + 1) % SEQUENCE_MODULUS
        if first_seq != expected:
            raise KafkaError(ke.OUT_OF_ORDER_SEQUENCE_NUMBER,
                             f"producer {producer_id} epoch {epoch}: sequence {first_seq}, expected {expected}")
        return None

    def sync(self, log: Log, term: int) -> None:
        """Read the headers of every batch appended to `log` since the last call (all of them from
        `full_history_start` after a term change, or when the log was truncated under the scan)."""
        if term != self.term or self.scanned_to < log.start_offset or self.scanned_to > log.end_offset:
            self.producers.clear()
            self.scanned_to = full_history_start(log)
            self.term = term
        while self.scanned_to < log.end_offset:
            chunk = log.read(self.scanned_to, 4 << 20)
            if chunk.next_offset <= self.scanned_to:
                break
            for batch in chunk.batches():
                h = batch.header
                if h.producer_id != NO_PRODUCER_ID and not h.is_control:
                    first = next(iter(batch.records()), None)
                    self.observe(h, partition_key_of(None if first is None else first.key))
            self.scanned_to = chunk.next_offset
