"""Opening a log directory after a crash (as Kafka's LogLoader): what `Log.open` finds on disk and makes whole.

In order: roll forward a prefix install past its commit point (eventlog.prefix) and finish or undo an
interrupted key-compaction swap (eventlog.cleaned); remove leftovers (temp files, `.deleted` files,
orphaned indexes) and segments below the log start; then scan, with CRC, offset and epoch checks,
every segment from the one holding the recovery point to the end (`eventlog.scan`). Segments below
the recovery point are trusted as flushed and opened lazily. A torn tail is cut; damage with valid
data after it raises `LogCorruptionError`, or with `repair` cuts the log there. The leader epoch
cache is checked against the batches (or rebuilt from them when its checkpoint is missing or
damaged), and the recovered tail is synced before anyone relies on it.

The loader fills the `LogSegments` it is given, so the log closes whatever it opened if loading fails
part way. Call it before the log is shared with other threads.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from eventlog.cleaned import CleanerCheckpoint, cleaned_ranges, finish_interrupted_swap
from eventlog.config import LogConfig
from eventlog.epoch_cache import CHECKPOINT_NAME as EPOCH_CHECKPOINT_NAME
from eventlog.epoch_cache import LeaderEpochCache
from eventlog.errors import LogCorruptionError
from eventlog.fileutil import fsync_dir, io_error
from eventlog.log_segments import LogSegments, install_segment, prepare_segment_file
from eventlog.offsets_checkpoint import read_offsets_checkpoint, write_offsets_checkpoint
from eventlog.preallocate import PREALLOCATED_NAME
from eventlog.prefix import PREFIX_SUFFIX, PrefixInstall, replace_segments
from eventlog.scan import ScanStatus, SegmentScan, scan_segment
from eventlog.segment import INDEX_SUFFIX, TIMEINDEX_SUFFIX, Segment, parse_segment_name, segment_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the log found and did."""

    segments: int
    segments_scanned: int
    batches_scanned: int
    records_scanned: int
    bytes_scanned: int
    bytes_truncated: int
    truncated_file: str | None
    truncated_position: int | None
    repaired: bool
    problem: str | None
    seconds: float

    @property
    def records_per_second(self) -> float:
        return self.records_scanned / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        """One human-readable line: what was scanned and what was cut."""
        text = (f"scanned {self.segments_scanned} of {self.segments} segments ({self.records_scanned:,} records, "
                f"{self.bytes_scanned:,} bytes) in {self.seconds * 1000:.1f} ms")
        if self.bytes_truncated:
            text += (f"; cut {self.bytes_truncated:,} bytes at byte {self.truncated_position} of "
                     f"{self.truncated_file} ({self.problem})")
        if self.repaired:
            text += "; REPAIRED: data after the corruption was dropped"
        return text


@dataclass(frozen=True, slots=True)
class LoadedLog:
    """The state a loaded log starts from (its segments are in the `LogSegments` the loader filled);
    every offset below `end_offset` is on disk."""

    log_start: int
    recovery_point: int
    end_offset: int
    cleaner: CleanerCheckpoint
    epochs: LeaderEpochCache
    report: RecoveryReport


def write_install_checkpoints(directory: Path, install: PrefixInstall) -> tuple[CleanerCheckpoint, LeaderEpochCache]:
    """Step 5 of `eventlog.prefix`: the cleaner, leader epoch and offsets checkpoints of the log a prefix
    install leaves; returns the first two (the offsets are the install's start and end). Shared by
    `Log.reset` and by the loader, which rolls an interrupted install forward."""
    cleaner = CleanerCheckpoint(install.dirty_offset, tuple((p.base, p.end) for p in install.parts))
    cleaner.write(directory)
    epochs = LeaderEpochCache(directory / EPOCH_CHECKPOINT_NAME, list(install.epochs))
    epochs.write()
    write_offsets_checkpoint(directory, install.start, install.end)
    return cleaner, epochs


class LogLoader:
    """Loads one log directory into a `LogSegments` (see the module docstring). Used once, by `Log.open`."""

    def __init__(self, directory: Path, config: LogConfig, segments: LogSegments) -> None:
        self.directory = directory
        self.config = config
        self.segments = segments
        self._log_start = 0
        self._recovery_point = 0
        self._end_offset = 0
        self._cleaner = CleanerCheckpoint()
        self._epochs = LeaderEpochCache(directory / EPOCH_CHECKPOINT_NAME)

    def load(self, repair: bool) -> LoadedLog:
        started = time.perf_counter()
        self._finish_interrupted_install()
        self._cleaner = finish_interrupted_swap(self.directory)
        self._remove_leftovers()
        self._log_start, self._recovery_point = read_offsets_checkpoint(self.directory)
        bases = sorted(b for p in self.directory.iterdir() if (b := parse_segment_name(p.name)) is not None)
        for base in [b for b in bases if b < self._log_start]:
            # Below the log start: left over from a deletion or reset that a crash interrupted.
            for suffix in (".log", INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                (self.directory / segment_name(base, suffix)).unlink(missing_ok=True)
        bases = [b for b in bases if b >= self._log_start]
        cleaned_ends = cleaned_ranges(self._cleaner, bases)
        epochs_trusted = self._load_epoch_cache()
        # Without a checkpoint the epochs are derived from the batches themselves: rescan everything.
        rp = self._recovery_point if epochs_trusted else 0
        expected_epoch = self._epochs.epoch_for_offset if epochs_trusted else None
        stats = _ScanStats()
        segments: list[Segment] = []
        for i, base in enumerate(bases):
            is_last = i == len(bases) - 1
            next_base = None if is_last else bases[i + 1]
            cleaned_end = cleaned_ends.get(base)
            if not is_last and next_base is not None and next_base <= rp:
                segments.append(Segment.sealed_lazy(self.directory, base, next_base,
                                                    self.config.index_interval_bytes, cleaned=cleaned_end is not None))
                continue
            seg = Segment(self.directory, base, self.config.index_interval_bytes)
            seg.cleaned = cleaned_end is not None
            min_epoch = stats.last_epoch if stats.last_epoch is not None else -1
            scan = scan_segment(seg.open_for_scan(), base, index_interval_bytes=self.config.index_interval_bytes,
                                recovery_point=rp, min_epoch=min_epoch, expected_epoch=expected_epoch,
                                cleaned_end=cleaned_end)
            stats.add(scan)
            damaged = scan.status is not ScanStatus.CLEAN
            # A cleaned segment covers up to the next segment's base, whatever its last kept batch.
            covered = next_base if cleaned_end is not None and next_base is not None and not damaged else scan.next_offset
            gap = next_base is not None and not damaged and covered != next_base
            if gap:
                scan.problem = f"segment ends at offset {scan.next_offset} but the next one starts at {next_base}"
            if (damaged and (scan.status is ScanStatus.CORRUPT or not is_last)) or gap:
                if not repair:
                    seg.close()
                    raise LogCorruptionError(str(seg.path), scan.valid_bytes, scan.problem or "damaged")
                stats.repaired = True
            seg.adopt_scan(scan.valid_bytes, covered, scan.builder)  # type: ignore[arg-type]
            if scan.bytes_to_cut:
                seg.zero_range(scan.valid_bytes, scan.data_end)
                stats.cut(seg, scan)
            segments.append(seg)
            if damaged or gap:
                # Everything after the damage goes (a torn tail in the last segment, or a repair).
                for later in bases[i + 1:]:
                    Segment(self.directory, later, 0).delete()
                fsync_dir(self.directory)
                break
            if not is_last:
                seg.trim_file()
        kept = self._cleaner.keeping([s.base_offset for s in segments])
        if kept != self._cleaner:
            # Lines of segments deleted or cut away: gone before any new segment could reuse a base.
            self._cleaner = kept
            kept.write(self.directory)
        if not segments:
            # Nothing prepared in the background yet: the file is prepared now.
            prepared = prepare_segment_file(self.directory, self.config.segment_bytes, None)
            self.segments.append(install_segment(self.directory, self._log_start, prepared,
                                                 self.config.index_interval_bytes))
        else:
            for seg in segments:
                self.segments.append(seg)
            active = segments[-1]
            active.activate(max(self.config.segment_bytes, active.size))
        self._end_offset = self.segments.active.next_offset
        self.segments.changed()
        if self._recovery_point > self._end_offset:
            # A repair cut the log below the checkpointed recovery point. Left there until the next
            # roll or close, it would make a crash's torn tail (offsets between the new end and the
            # old point) look like flushed data: the next open would refuse it as corruption.
            self._recovery_point = self._end_offset
            write_offsets_checkpoint(self.directory, self._log_start, self._recovery_point)
        self._reconcile_epochs(stats, epochs_trusted)
        # Whatever the crash left in the page cache is now made durable before anyone relies on it.
        self.segments.active.sync()
        report = stats.report(len(self.segments), time.perf_counter() - started)
        if report.bytes_truncated or report.repaired:
            logger.warning("log %s recovered: %s", self.directory, report.summary())
        return LoadedLog(self._log_start, self._recovery_point, self._end_offset, self._cleaner, self._epochs,
                         report)

    def _load_epoch_cache(self) -> bool:
        """Load the leader epoch checkpoint; False when it is missing or damaged (to be rebuilt)."""
        path = self._epochs.path
        if not path.exists():
            return False
        try:
            self._epochs = LeaderEpochCache.load(path)
        except LogCorruptionError as exc:
            logger.warning("%s; rebuilding it from the whole log", exc)
            return False
        return True

    def _reconcile_epochs(self, stats: _ScanStats, trusted: bool) -> None:
        """Make the epoch cache agree with the recovered log, and persist it if it changed.

        A trusted checkpoint was checked batch by batch during the scan: only entries outside the
        recovered range go (epochs whose batches a crash cut, or below a deletion). Otherwise every
        segment was scanned and the cache is rebuilt from the epochs the batches carry.
        """
        cache = self._epochs
        if trusted:
            changed = cache.truncate_from_start(self._log_start)
            changed |= cache.truncate_from_end(self._end_offset)
        else:
            cache.clear()
            for epoch, start in stats.epoch_starts:
                cache.assign(epoch, start)
            changed = True
        if changed:
            cache.write()

    def _finish_interrupted_install(self) -> None:
        """Roll forward a prefix install a crash interrupted after its commit point (steps 3-7 of
        `eventlog.prefix`); nothing when there is no `prefix-install` journal."""
        install = PrefixInstall.load(self.directory)
        if install is None:
            return
        logger.warning("%s: completing an interrupted install of a log prefix [%d, %d)", self.directory,
                       install.start, install.end)
        replace_segments(self.directory, install)
        self._cleaner, self._epochs = write_install_checkpoints(self.directory, install)
        self._log_start, self._recovery_point = install.start, install.end
        active = self.directory / segment_name(install.end)
        if not active.exists():
            try:
                os.close(os.open(active, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            except OSError as exc:
                raise io_error(f"creating {active}", exc) from exc
            fsync_dir(self.directory)
        PrefixInstall.remove(self.directory)

    def _remove_leftovers(self) -> None:
        for p in self.directory.iterdir():
            name = p.name
            if name.endswith((".tmp", ".deleted", PREFIX_SUFFIX)) or name == PREALLOCATED_NAME:
                p.unlink(missing_ok=True)
            elif name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX)):
                stem = name.rsplit(".", 1)[0]
                if not (self.directory / (stem + ".log")).exists():
                    p.unlink(missing_ok=True)


class _ScanStats:
    """Totals of the segments scanned during recovery."""

    def __init__(self) -> None:
        self.scanned = self.batches = self.records = self.bytes = self.truncated = 0
        self.truncated_file: str | None = None
        self.truncated_position: int | None = None
        self.problem: str | None = None
        self.repaired = False
        self.epoch_starts: list[tuple[int, int]] = []
        self.last_epoch: int | None = None

    def add(self, scan: SegmentScan) -> None:
        self.scanned += 1
        self.batches += scan.batches
        self.records += scan.records
        self.bytes += scan.valid_bytes
        self.epoch_starts += scan.epoch_starts
        if scan.last_epoch is not None:
            self.last_epoch = scan.last_epoch
        if scan.problem:
            self.problem = scan.problem

    def cut(self, seg: Segment, scan: SegmentScan) -> None:
        self.truncated += scan.bytes_to_cut
        self.truncated_file = str(seg.path)
        self.truncated_position = scan.valid_bytes

    def report(self, segments: int, seconds: float) -> RecoveryReport:
        return RecoveryReport(segments, self.scanned, self.batches, self.records, self.bytes, self.truncated,
                              self.truncated_file, self.truncated_position, self.repaired, self.problem, seconds)
