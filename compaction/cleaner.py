"""Key compaction of sealed segments below a horizon: Kafka's log cleaner, for one segmented log.

Theory of operation (Kafka's `LogCleaner`, whose design this follows):

- The log below the horizon `clean_below` is cleaned in passes. Only whole SEALED segments wholly
  below it are touched, never the active segment. Segments below the log's *dirty offset* (where
  the previous pass stopped mapping) form the clean section; the rest up to the horizon is dirty.
  A pass runs only when the dirty bytes are at least `min_cleanable_dirty_ratio` of all the bytes
  below the horizon, because it rewrites all of them.
- **Offset map.** The pass reads the dirty section and maps each record's compaction key
  (`key_of(record key)`: by default the record key itself) to the offset of its latest record
  there, in a bounded map (`offset_map_max_keys`, Kafka's dedupe buffer: keys up to 48 bytes as
  they are, longer ones by a 128-bit BLAKE2b digest, as Kafka hashes with MD5). When it fills,
  the pass maps no further: records past the last mapped one are kept as they are and the next
  pass starts there.
- **Horizon semantics.** Only records below the horizon supersede: a record is dropped when a later
  record of the same key, also below the horizon (and mapped), exists. Records at or above the
  horizon are never considered, so reading the cleaned log up to the horizon gives every key's
  state at the horizon (the latest record of each key), and everything from the horizon on is the
  log as written. (Kafka's "first uncleanable offset" plays the same role.)
- **Tombstones** (`is_tombstone(record)`: by default a null value, Kafka's rule; asked only of a
  record that is its key's latest, in a batch past the delete horizon) are kept while
  they are the latest of their key, until `delete_retention_ms` after the newest data of the clean
  section (log time, from record timestamps: Kafka measures from the segment's modification time),
  then dropped, so a reader who starts at the log start has that long to see a delete.
- **Rewriting.** The segments from the log start up to the end of the mapped section are grouped
  (consecutive segments whose sizes add up to at most `segment_bytes`, offsets spanning less than
  2**31) and each group is rewritten as ONE cleaned segment holding the batches it keeps: a batch
  whose records are all kept is copied byte for byte; one that lost some is rebuilt with
  `records.retain_spans` (same base offset, last offset delta, epoch, timestamps, producer fields;
  the kept records' bytes copied as they are, so every kept record keeps its offset, and the
  batch's partitionLeaderEpoch stays the Raft term); one that lost all disappears. Every batch
  read is CRC-checked first, so damage is never laundered into a fresh CRC. The groups are then
  swapped in, in order, by `Log.swap_cleaned` (crash-safe, see `eventlog.cleaned`); a pass that
  finds the log changed (retention, truncation, reset) abandons what is left.
- **Records the cleaner cannot judge** are kept: records whose key function returns None (null
  keys; for Epochlog's events, those whose record key does not name what they overwrite, such as
  a `txn/...` transaction), and batches compressed with a codec other than gzip.
- **Why the key is a function of the record key**: mapping must not decode values (it is the hot
  loop, and the log layer knows nothing of event types); Epochlog's record key is the entity key.

Costs and manners: the cleaner runs in its own thread (`LogCleaner`), never on a group's loop, and
by default the CPU work of each pass (mapping, filtering, writing the cleaned files:
`compaction.rewrite.run_pass`) runs in a worker process (`compaction.worker`, niced), because a
CPU-bound thread in the node's process holds the interpreter lock: measured, it multiplied the p99
latency of a paced appender by about 4, a worker process by about 1.6 (bench/RESULTS.md,
"cleaner"). The log's lock is taken only to list the segments and to swap the segment list; the
segment files are read without it. IO is throttled (`max_io_bytes_per_second`).

A Raft group's log must only be cleaned below min(commit offset, latest snapshot index + 1): the
storage serves no entry below `Log.clean_end_offset` (a follower that needs one gets the snapshot).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from compaction.config import CleanerConfig
from compaction.rewrite import (
    CleanedGroup,
    CleanerAbortedError,
    CleaningJob,
    CompactionKey,
    IsTombstone,
    KeyOf,
    OffsetMap,
    Pacer,
    PassAbandonedError,
    PassOutput,
    RecordKeyOf,
    discard_cleaned,
    group_segments,
    null_value,
    record_key,
    run_pass,
    skip_reason,
)
from eventlog.cleaned import CleanedSegment
from eventlog import kafka_codes as kc
from eventlog.errors import EpochlogError
from eventlog.log import Log

__all__ = ["CleanResult", "CleanerAbortedError", "CleanerFailedError", "CompactionKey", "IsTombstone", "KeyOf",
           "LogCleaner", "OffsetMap", "Pacer", "RecordKeyOf", "clean_log", "group_segments", "null_value",
           "record_key", "skip_reason"]

logger = logging.getLogger(__name__)

WORKER_POLL_S = 0.1


class CleanerFailedError(EpochlogError):
    """A cleaning pass failed in its worker process (the message says why: a damaged batch, a full
    disk...); nothing was swapped in by it, its cleaned files are deleted."""

    code = "cleaner_failed"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one cleaning pass of one log did."""

    clean_below: int            # the horizon asked for
    cleaned_through: int        # end of the last segment rewritten (a segment boundary); the log start if none
    dirty_offset: int           # where the next pass starts mapping
    segments_before: int        # segments rewritten
    segments_after: int         # cleaned segments that replaced them
    bytes_before: int
    bytes_after: int
    records_read: int
    records_kept: int
    records_dropped: int        # superseded by a later record of their key, tombstones included
    tombstones_dropped: int     # of which: tombstones past their retention
    offset_map_keys: int
    offset_map_full: bool       # the map filled up: the next pass continues from `dirty_offset`
    seconds: float
    skipped: str | None = None  # why the pass did nothing
    aborted: str | None = None  # why it stopped before the end (what it swapped in stays)
    pass_rss_anon_kib: int = 0  # anonymous memory of the process that ran the pass, offset map built
    noops_dropped: int = 0      # of `records_dropped`: records that changed nothing (`drop_offsets`)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_before / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for people."""
        if self.skipped:
            return f"nothing cleaned: {self.skipped}"
        text = (f"cleaned {self.segments_before} segments into {self.segments_after} below offset "
                f"{self.cleaned_through}: {self.bytes_before:,} -> {self.bytes_after:,} bytes, "
                f"{self.records_kept:,} records kept, {self.records_dropped:,} dropped "
                f"({self.tombstones_dropped:,} tombstones, {self.noops_dropped:,} no-ops) in {self.seconds:.2f} s")
        if self.offset_map_full:
            text += f"; offset map full ({self.offset_map_keys:,} keys): the next pass continues at {self.dirty_offset}"
        if self.aborted:
            text += f"; stopped early: {self.aborted}"
        return text


def clean_log(log: Log, clean_below: int, config: CleanerConfig | None = None, *,
              key_of: KeyOf = record_key, is_tombstone: IsTombstone = null_value, force: bool = False,
              pacer: Pacer | None = None, should_stop: Callable[[], bool] | None = None,
              record_key_of: RecordKeyOf | None = None,
              drop_offsets: Iterable[int] | Callable[[int, int], Iterable[int]] = ()) -> CleanResult:
    """One cleaning pass of `log` below `clean_below` (see the module docstring). The pass's CPU work
    runs in a worker process when `config.worker_process` (then `key_of`, `record_key_of` and
    `is_tombstone` must be importable module-level functions), else in the calling thread; the swaps
    run in the calling thread. `force` ignores the dirty ratio.

    `record_key_of(key, value)`, when given, replaces `key_of` and can tell records that set a whole
    entity from records that set part of it (`CompactionKey`). `drop_offsets`: offsets of records that
    changed nothing when applied (or a function of (dirty offset, clean_below) returning them: called
    once the pass knows where it starts): those records are dropped and supersede nothing.

    Never blocks appends. Raises what the log raises (DiskFullError, LogFailedError...),
    LogCorruptionError (in a thread) or CleanerFailedError (in a worker) for a damaged batch, and
    CleanerAbortedError when `should_stop()` became true.
    """
    config = config or CleanerConfig()
    config.validate()
    started = time.perf_counter()
    state = log.cleanable_segments(clean_below)
    skipped = skip_reason(list(state.segments), state.dirty_offset, config, force=force)
    if skipped is not None:   # no worker process started for nothing
        return CleanResult(clean_below, log.start_offset, state.dirty_offset, 0, 0, 0, 0, 0, 0, 0, 0, 0, False,
                           time.perf_counter() - started, skipped)
    drop = frozenset(drop_offsets(state.dirty_offset, clean_below) if callable(drop_offsets) else drop_offsets)
    job = CleaningJob(str(log.directory), tuple(state.segments), state.dirty_offset, config,
                      log.config.segment_bytes, log.config.index_interval_bytes, force, key_of, is_tombstone,
                      record_key_of, drop)

    def result(groups: list[CleanedGroup], output: PassOutput, dirty: int, *, skipped: str | None = None,
               aborted: str | None = None) -> CleanResult:
        through = groups[-1].end_offset if groups else log.start_offset
        return CleanResult(clean_below, through, dirty, sum(g.segments for g in groups), len(groups),
                           sum(g.bytes_before for g in groups), sum(g.size for g in groups),
                           sum(g.records_read for g in groups), sum(g.records_kept for g in groups),
                           sum(g.records_dropped for g in groups), sum(g.tombstones_dropped for g in groups),
                           output.offset_map_keys, output.offset_map_full, time.perf_counter() - started,
                           skipped, aborted, output.rss_anon_kib, sum(g.noops_dropped for g in groups))

    try:
        if config.worker_process:
            output = run_in_worker(job, should_stop)
        else:
            output = run_pass(job, pacer or Pacer(config.max_io_bytes_per_second), should_stop)
    except PassAbandonedError as exc:
        return result([], PassOutput(), state.dirty_offset, aborted=str(exc))
    if output.skipped:
        return result([], output, state.dirty_offset, skipped=output.skipped)
    swapped: list[CleanedGroup] = []
    dirty = state.dirty_offset
    pending = list(output.groups)
    try:
        while pending:
            if should_stop is not None and should_stop():
                raise CleanerAbortedError(f"stopped while swapping cleaned segments into {log.directory}")
            group = pending.pop(0)
            cleaned = CleanedSegment(log.directory, group.base_offset, group.end_offset, group.size, group.indexes)
            if not log.swap_cleaned(cleaned, generation=state.generation, dirty_offset=group.dirty_offset):
                return result(swapped, output, dirty,
                              aborted=f"the log changed (truncated, reset or retention) before "
                                      f"[{group.base_offset}, {group.end_offset}) was swapped in")
            swapped.append(group)
            dirty = group.dirty_offset
    finally:
        for group in pending:
            discard_cleaned(log.directory, group)
    final = result(swapped, output, dirty)
    logger.info("log %s: %s", log.directory, final.summary())
    return final


def run_in_worker(job: CleaningJob, should_stop: Callable[[], bool] | None = None) -> PassOutput:
    """Run `job` in a fresh worker process (`python -m compaction.worker`), waiting for it; killed
    (and its cleaned files deleted) when `should_stop()` becomes true."""
    try:
        data = pickle.dumps(job)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise CleanerFailedError(f"the cleaning job cannot go to a worker process ({exc}): key_of and "
                                 f"is_tombstone must be module-level functions") from None
    proc = subprocess.Popen([sys.executable, "-m", "compaction.worker", str(os.getpid())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = True
    while True:
        try:
            out, err = proc.communicate(input=data if first else None, timeout=WORKER_POLL_S)
            break
        except subprocess.TimeoutExpired:
            first = False
            if should_stop is not None and should_stop():
                proc.kill()
                proc.communicate()
                _remove_cleaned_files(Path(job.directory))
                raise CleanerAbortedError(f"stopped while cleaning {job.directory}") from None
    try:
        kind, payload = pickle.loads(out)
    except Exception:  # noqa: BLE001 - a worker that died prints nothing we can read
        _remove_cleaned_files(Path(job.directory))
        raise CleanerFailedError(f"the cleaner's worker process exited with {proc.returncode}: "
                                 f"{err.decode(errors='replace').strip()[-2000:]}") from None
    if kind == "ok":
        assert isinstance(payload, PassOutput)
        return payload
    if kind == "gone":
        raise PassAbandonedError(payload)
    raise CleanerFailedError(f"cleaning {job.directory}: {payload}")


def _remove_cleaned_files(directory: Path) -> None:
    """Cleaned files a killed worker left (no swap ever names them: the swaps run here)."""
    for p in directory.glob("*.cleaned"):
        p.unlink(missing_ok=True)


class LogCleaner:
    """A background thread that cleans logs on request, one pass at a time (Kafka's cleaner thread).

    `submit(log, clean_below)` queues a pass and returns a Future of its `CleanResult` (a request for
    a log already queued raises that request's horizon and shares its Future). Passes run one at a
    time, so the throttle (`max_io_bytes_per_second`) bounds the whole node. `close()` stops it: a
    pass under way stops (its worker process killed; what it swapped in stays; its cleaned files not
    yet swapped in are deleted) and queued requests are cancelled.

    Thread-safety: `submit`, `close` and the properties may be called from any thread.
    """

    def __init__(self, config: CleanerConfig | None = None, *, key_of: KeyOf = record_key,
                 is_tombstone: IsTombstone = null_value, record_key_of: RecordKeyOf | None = None,
                 name: str = "log-cleaner") -> None:
        self.config = config or CleanerConfig()
        self.config.validate()
        self._key_of = key_of
        self._is_tombstone = is_tombstone
        self._record_key_of = record_key_of
        self._pacer = Pacer(self.config.max_io_bytes_per_second)   # passes in this thread share it
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._closed = False
        self._last: CleanResult | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, log: Log, clean_below: int, *, force: bool = False,
               drop_offsets: DropOffsets | None = None) -> Future[CleanResult]:
        """Queue a pass of `log` below `clean_below`. `drop_offsets(dirty offset, clean_below)`, called in
        the cleaner's thread as the pass starts, returns the offsets of records that changed nothing
        (see `clean_log`); a request merged into a queued one for the same log keeps the queued one's."""
        with self._cond:
            if self._closed:
                raise CleanerAbortedError("the log cleaner is closed")
            for i, queued in enumerate(self._queue):
                if queued.log is log:
                    self._queue[i] = replace(queued, clean_below=max(queued.clean_below, clean_below),
                                             force=queued.force or force,
                                             drop_offsets=drop_offsets or queued.drop_offsets)
                    return queued.future
            request = _Request(log, clean_below, force, Future(), drop_offsets)
            self._queue.append(request)
            self._cond.notify()
            return request.future

    @property
    def last_result(self) -> CleanResult | None:
        """The result of the last pass that finished."""
        return self._last

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for request in pending:
            request.future.cancel()
        self._thread.join(timeout)

    def _stopping(self) -> bool:
        return self._closed

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                request = self._queue.popleft()
            if not request.future.set_running_or_notify_cancel():
                continue
            try:
                outcome = clean_log(request.log, request.clean_below, self.config, key_of=self._key_of,
                                    is_tombstone=self._is_tombstone, force=request.force, pacer=self._pacer,
                                    should_stop=self._stopping, record_key_of=self._record_key_of,
                                    drop_offsets=request.drop_offsets or ())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the Future
                if not isinstance(exc, CleanerAbortedError):
                    logger.error("cleaning %s below %d failed: %s", request.log.directory, request.clean_below, exc)
                request.future.set_exception(exc)
                continue
            self._last = outcome
            request.future.set_result(outcome)


DropOffsets = Callable[[int, int], Iterable[int]]


@dataclass(frozen=True, slots=True)
class _Request:
    log: Log
    clean_below: int
    force: bool
    future: Future[CleanResult]
    drop_offsets: DropOffsets | None = None
