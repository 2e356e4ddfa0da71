"""Offline, read-only access to a log directory: `epochlog log dump`, `epochlog log verify`, and the
public reader of committed records (`read_committed`) that the export reads a stopped node with.

Nothing here writes to the directory or takes its lock: it can look at the log of a stopped node
or a backup, and at a running node's log (with the caveat that the tail may be moving). It applies
the same rules as recovery (`eventlog.scan`) to every segment, including those below the recovery
point that `Log.open` would trust, so `verify` says exactly what `Log.open` would do. Cleaned
segments (key compaction, `eventlog.cleaned`) are checked by the cleaner checkpoint's rules, and a
swap or a log prefix install (`eventlog.prefix`) a crash interrupted is judged on the files
`Log.open` would end up with (it finishes or undoes them before anything else).

A directory without a single segment file is no log at all (`Log.open` always leaves one): `verify`
refuses it (`NotALogError`, naming the log directories below it, such as a node's
`groups/<group>/log`) instead of calling it clean.

`read_committed` yields the records of an offset range of a group's log (`<group dir>/log`) up to the
commit bound the caller gives (`committed_offset` reads the one Raft persisted), every batch CRC-checked,
control batches skipped, and raises LogError rather than return fewer offsets than asked. Whether a
record changed the views is the views' to say (statemachines/offline.py): the caller passes that lookup.
`decode_batches` is the same decoder for batches a running node sent as its log stores them (its
`read_log` call): the live export decodes on its own workers, not on the serving node.
"""

from __future__ import annotations

import enum
import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from eventlog.cleaned import SWAP_SUFFIX, CleanerCheckpoint, cleaned_path, cleaned_ranges
from eventlog import kafka_codes as kc
from eventlog.epoch_cache import CHECKPOINT_NAME as EPOCH_CHECKPOINT_NAME
from eventlog.epoch_cache import LeaderEpochCache
from eventlog.errors import EpochlogError, LogError
from eventlog.offsets_checkpoint import read_offsets_checkpoint
from eventlog.prefix import PrefixInstall, prefix_path
from eventlog.raft.runtime.log_storage import QUORUM_STATE, read_quorum_state
from eventlog.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    RecordBatch,
    check_batch,
    decode_records,
    read_header,
    records_payload,
)
from eventlog.scan import ScanStatus, scan_segment
from eventlog.segment import LOG_SUFFIX, parse_segment_name


class NotALogError(LogError):
    """The directory given to `verify` holds no segment file (the message says where logs are below it)."""

    code = "not_a_log"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR
    exit_code = 2   # `log verify`: no log to verify, as mid-log corruption


def find_logs(directory: Path, depth: int = 3) -> list[Path]:
    """Directories at most `depth` levels below `directory` that hold segment files, in path order."""
    found: list[Path] = []
    level = [directory]
    for _ in range(depth):
        below = []
        for d in level:
            try:
                children = sorted(c for c in d.iterdir() if c.is_dir() and not c.is_symlink())
            except OSError:
                continue
            for c in children:
                try:
                    if any(parse_segment_name(f.name) is not None for f in c.iterdir()):
                        found.append(c)
                        continue
                except OSError:
                    continue
                below.append(c)
        level = below
    return sorted(found)


class Verdict(enum.IntEnum):
    """`epochlog log verify` exit codes."""

    CLEAN = 0
    TORN_TAIL = 1      # recovery would repair and open normally: cut a torn tail, or finish or undo
                       # a cleaner swap a crash interrupted (see VerifyReport.verdict_name)
    CORRUPT = 2        # recovery would refuse to open (mid-log corruption)


@dataclass(slots=True)
class SegmentCheck:
    path: Path
    base_offset: int
    file_bytes: int
    status: ScanStatus
    batches: int
    records: int
    valid_bytes: int
    next_offset: int
    bytes_to_cut: int
    problem: str | None
    cleaned: bool = False   # a cleaned segment: offsets [base_offset, next_offset) with gaps


@dataclass(slots=True)
class VerifyReport:
    directory: Path
    segments: list[SegmentCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    verdict: Verdict = Verdict.CLEAN
    log_start_offset: int = 0
    recovery_point: int = 0
    epochs: list[tuple[int, int]] = field(default_factory=list)
    interrupted_swap: str | None = None   # what open would do with a cleaner swap or prefix install a crash interrupted
    torn_tail: bool = False

    def _worsen(self, verdict: Verdict, problem: str) -> None:
        self.problems.append(problem)
        self.verdict = max(self.verdict, verdict)

    @property
    def verdict_name(self) -> str:
        """clean, torn_tail, interrupted_swap, torn_tail_and_interrupted_swap or corrupt."""
        if self.verdict is Verdict.TORN_TAIL and self.interrupted_swap:
            return "torn_tail_and_interrupted_swap" if self.torn_tail else "interrupted_swap"
        return self.verdict.name.lower()


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """(base offset, path) of every segment file, in offset order."""
    if not directory.is_dir():
        raise LogError(f"{directory} is not a directory")
    found = [(base, p) for p in directory.iterdir() if (base := parse_segment_name(p.name)) is not None]
    return sorted(found)


@contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """A read-only view of a whole file (empty for an empty file)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                yield view
            finally:
                view.release()
    finally:
        os.close(fd)


def effective_layout(directory: Path) -> tuple[CleanerCheckpoint, list[tuple[int, Path]], str | None]:
    """The cleaner checkpoint and segment files as `Log.open` would have them once it finished or
    undid an interrupted swap (`eventlog.cleaned`) or finished a prefix install (`eventlog.prefix`),
    and a sentence saying which it would do."""
    install = PrefixInstall.load(directory)
    if install is not None:
        files = []
        for p in install.parts:
            staged = prefix_path(directory, p.base)
            files.append((p.base, staged if staged.exists() else directory / staged.name[:-len(".prefix")]))
        sentence = (f"an install of a log prefix [{install.start}, {install.end}) was interrupted after its "
                    f"commit point: open completes it")
        return CleanerCheckpoint(install.dirty_offset, tuple((p.base, p.end) for p in install.parts)), files, sentence
    checkpoint = CleanerCheckpoint.load(directory)
    files = segment_files(directory)
    if checkpoint.swap is None:
        return checkpoint, files, None
    base, end, _ = checkpoint.swap
    if cleaned_path(directory, base).exists():
        return checkpoint.without_swap(), files, (f"a swap of cleaned segment [{base}, {end}) was interrupted "
                                                  f"before its commit point: open deletes the cleaned file")
    swap_file = cleaned_path(directory, base, LOG_SUFFIX, SWAP_SUFFIX)
    if swap_file.exists():
        files = sorted([(b, p) for b, p in files if not base <= b < end] + [(base, swap_file)])
    return checkpoint.after_swap(), files, (f"a swap of cleaned segment [{base}, {end}) was interrupted after "
                                            f"its commit point: open completes it")


def verify_log_dir(directory: str | Path) -> VerifyReport:
    """Check every batch CRC of every segment and the links between segments."""
    directory = Path(directory)
    report = VerifyReport(directory)
    if not segment_files(directory) and PrefixInstall.load(directory) is None:
        logs = find_logs(directory)
        where = (f"; logs below it: {', '.join(str(d) for d in logs[:3])}{', ...' if len(logs) > 3 else ''}"
                 if logs else "")
        raise NotALogError(f"{directory} holds no log (no segment file *{LOG_SUFFIX}){where}")
    try:
        cleaner, all_files, report.interrupted_swap = effective_layout(directory)
    except EpochlogError as exc:
        report._worsen(Verdict.CORRUPT, str(exc))
        return report
    if report.interrupted_swap:
        report._worsen(Verdict.TORN_TAIL, report.interrupted_swap)
    report.log_start_offset, report.recovery_point = read_offsets_checkpoint(directory)
    expected_epoch = None
    checkpoint = directory / EPOCH_CHECKPOINT_NAME
    install = PrefixInstall.load(directory)
    if install is not None:   # what open writes as it completes the install (the active segment is empty)
        report.log_start_offset, report.recovery_point = install.start, install.end
        cache = LeaderEpochCache(checkpoint, list(install.epochs))
        report.epochs = cache.entries
        expected_epoch = cache.epoch_for_offset
    elif checkpoint.exists():
        try:
            cache = LeaderEpochCache.load(checkpoint)
            report.epochs = cache.entries
            expected_epoch = cache.epoch_for_offset
        except EpochlogError as exc:
            report.problems.append(f"{exc} (open rebuilds it from the batches)")
    if expected_epoch is None:
        report.recovery_point = 0  # like open: without the checkpoint every segment is rescanned
    files = [(b, p) for b, p in all_files if b >= report.log_start_offset]
    if not files:
        report.problems.append("no segment files")
        return report
    cleaned_ends = cleaned_ranges(cleaner, [b for b, _ in files])
    last_epoch = -1
    for i, (base, path) in enumerate(files):
        is_last = i == len(files) - 1
        cleaned_end = cleaned_ends.get(base)
        with _mapped(path) as view:
            scan = scan_segment(view, base, recovery_point=report.recovery_point, min_epoch=last_epoch,
                                expected_epoch=expected_epoch, cleaned_end=cleaned_end)
        if scan.last_epoch is not None:
            last_epoch = scan.last_epoch
        if cleaned_end is not None and not is_last and scan.status is ScanStatus.CLEAN:
            scan.next_offset = files[i + 1][0]   # a cleaned segment covers up to the next one
        report.segments.append(SegmentCheck(path, base, path.stat().st_size, scan.status, scan.batches,
                                            scan.records, scan.valid_bytes, scan.next_offset,
                                            scan.bytes_to_cut, scan.problem, cleaned_end is not None))
        if scan.status is ScanStatus.CORRUPT:
            report._worsen(Verdict.CORRUPT, f"{path}: byte {scan.valid_bytes}: {scan.problem}")
        elif scan.status is ScanStatus.TORN_TAIL:
            if is_last:
                report.torn_tail = True
                report._worsen(Verdict.TORN_TAIL, f"{path}: torn tail of {scan.bytes_to_cut} bytes at byte "
                                                  f"{scan.valid_bytes}: {scan.problem}")
            else:
                report._worsen(Verdict.CORRUPT, f"{path}: damaged at byte {scan.valid_bytes} but later "
                                                f"segments exist: {scan.problem}")
        if not is_last and scan.status is ScanStatus.CLEAN and scan.next_offset != files[i + 1][0]:
            report._worsen(Verdict.CORRUPT, f"{path}: ends at offset {scan.next_offset} but the next "
                                            f"segment starts at {files[i + 1][0]}")
    return report


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One line of `epochlog log dump`."""

    segment: str
    position: int
    base_offset: int
    last_offset: int
    epoch: int
    max_timestamp: int
    records: int
    size: int
    crc_ok: bool
    problem: str | None
    keys: tuple[bytes | None, ...]
    cleaned: bool = False   # in a cleaned segment (offsets may have gaps before it)


def dump_log_dir(directory: str | Path, *, start_offset: int = 0, max_keys: int = 5) -> Iterator[BatchRow]:
    """Every batch from `start_offset` on, in order, with its CRC status and first keys.

    A damaged batch is listed (crc_ok False, with the problem) and the walk of that segment stops
    there, since its length field cannot be trusted.
    """
    directory = Path(directory)
    try:
        cleaner, files, _ = effective_layout(directory)
    except EpochlogError:
        cleaner, files = CleanerCheckpoint(), segment_files(directory)
    cleaned = cleaned_ranges(cleaner, [b for b, _ in files])
    for i, (base, path) in enumerate(files):
        if i + 1 < len(files) and files[i + 1][0] <= start_offset:
            continue
        with _mapped(path) as view:
            yield from _dump_segment(path, view, start_offset, max_keys, base in cleaned)


def _dump_segment(path: Path, view: memoryview, start_offset: int, max_keys: int,
                  cleaned: bool = False) -> Iterator[BatchRow]:
    pos = 0
    size = len(view)
    while pos + LOG_OVERHEAD <= size:
        checked = check_batch(view, pos, size)
        if isinstance(checked, str):
            if bytes(view[pos:pos + LOG_OVERHEAD]) == bytes(LOG_OVERHEAD):
                return  # the zeroed, preallocated end of the segment
            h = read_header(view, pos) if size - pos >= HEADER_SIZE else None
            yield _row(path, pos, h, False, checked, (), cleaned)
            return
        h = checked
        if h.base_offset + h.last_offset_delta >= start_offset:
            keys = _first_keys(view[pos:pos + h.size], h, max_keys)
            yield _row(path, pos, h, True, None, keys, cleaned)
        pos += h.size


def _first_keys(raw: memoryview, h: BatchHeader, max_keys: int) -> tuple[bytes | None, ...]:
    keys: list[bytes | None] = []
    try:
        for record in RecordBatch(h, raw).records():
            if len(keys) >= max_keys:
                break
            keys.append(record.key)
    except EpochlogError:
        pass  # compressed with an unsupported codec: the CRC is fine, keys are unknown
    return tuple(keys)


def _row(path: Path, pos: int, h: BatchHeader | None, ok: bool, problem: str | None,
         keys: tuple[bytes | None, ...], cleaned: bool = False) -> BatchRow:
    if h is None:
        return BatchRow(path.name, pos, -1, -1, -1, -1, 0, 0, ok, problem, keys, cleaned)
    return BatchRow(path.name, pos, h.base_offset, h.base_offset + h.last_offset_delta, h.leader_epoch,
                    h.max_timestamp, h.records_count, h.batch_length + LOG_OVERHEAD, ok, problem, keys, cleaned)


# --- committed records -------------------------------------------------------------------------------

class CommittedRecord(NamedTuple):
    """One committed record of a group's log, as the node's `read_events` serves it online."""

    offset: int
    key: str                  # the record key as text (bytes that are not UTF-8 backslash-escaped)
    value: bytes | None
    timestamp: int            # ms since the epoch
    term: int                 # the leader epoch of its batch: the Raft term that appended it
    applied: bool | None      # it changed the views (False: rejected, a retry, skipped); None: not known


AppliedLookup = Callable[[bytes | None, int], bool | None]
"""(record key, offset) -> whether applying the record changed the views (None: cannot tell)."""


def log_start(log_dir: str | Path) -> int:
    """The first offset the segment files hold every committed record of, as written: past the log
    start and past the key-compacted range (cleaned segments hold each entity's latest record only),
    as the node's read_events reports it online."""
    log_dir = Path(log_dir)
    start, _ = read_offsets_checkpoint(log_dir)
    cleaner, files, _ = effective_layout(log_dir)
    if not files:
        return start
    cleaned = cleaned_ranges(cleaner, [b for b, _ in files])
    return max(start, files[0][0], max(cleaned.values(), default=0))


def committed_offset(group_dir: str | Path) -> int:
    """The commit index a group's Raft storage persisted in `<group_dir>/quorum-state` (-1: none). It is
    written lazily, so a lower bound of what was committed."""
    return read_quorum_state(Path(group_dir) / QUORUM_STATE).commit


def read_committed(log_dir: str | Path, lo: int, hi: int, *, applied: AppliedLookup | None = None,
                   chunk: int = 10_000) -> Iterator[list[CommittedRecord]]:
    """The records of offsets [lo, hi) in lists of about `chunk`, from the segment files in `log_dir`
    (read-only, without the log's lock, every batch CRC-checked). `hi` must not pass the commit bound:
    records past it may still be truncated by a new leader. LogError when the files do not hold every
    offset of the range (a cleaned segment's missing offsets are compacted away, not missing)."""
    log_dir = Path(log_dir)
    cleaner, files, _ = effective_layout(log_dir)
    cleaned = cleaned_ranges(cleaner, [b for b, _ in files])
    out: list[CommittedRecord] = []
    offset = lo
    for i, (base, path) in enumerate(files):
        seg_end = files[i + 1][0] if i + 1 < len(files) else None
        if seg_end is not None and seg_end <= lo:
            continue
        if base >= hi:
            break
        if base > offset:
            raise LogError(f"{log_dir}: offsets {offset}..{base - 1} are missing (segment {path.name})")
        for header, raw in _batches_from(path, lo):
            if header.base_offset >= hi:
                break
            offset = header.base_offset + header.last_offset_delta + 1
            _decode_into(out, header, raw, lo, hi, applied)
            if len(out) >= chunk:
                yield out
                out = []
        if seg_end is not None and base in cleaned:
            offset = max(offset, seg_end)   # the rest of a cleaned segment's range was compacted away
        if offset >= hi:
            break
    if out:
        yield out
    if offset < hi:
        raise LogError(f"{log_dir}: the log ends at offset {offset}, before {hi} (the commit bound)")


def decode_batches(data: bytes | memoryview, lo: int, hi: int, *,
                   applied: AppliedLookup | frozenset[int] | None = None) -> tuple[list[CommittedRecord], int]:
    """The records of offsets [lo, hi) in `data`, whole batches as a log stores them (a node's
    `read_log` reply: epochlog/api/messages.py `LogBatches`), and the offset after the last batch. The
    same decoding as `read_committed`, every batch CRC-checked, control batches skipped; a batch that
    fails its check, or offsets missing between `lo` and the last batch, is a LogError (a node only
    sends contiguous batches its own read checked, so the bytes changed on the way), never a shorter
    answer. `applied`: a lookup, or the offsets of the records that changed nothing (every other did)."""
    view = memoryview(data)
    out: list[CommittedRecord] = []
    pos, end, offset = 0, len(view), lo
    while pos < end:
        checked = check_batch(view, pos, end)
        if isinstance(checked, str):
            raise LogError(f"a batch at byte {pos} of the {end} read, after offset {offset - 1}, is damaged: {checked}")
        if checked.base_offset >= hi:
            break
        if checked.base_offset > offset or (pos and checked.base_offset != offset):
            raise LogError(f"offsets {offset}..{checked.base_offset - 1} are missing from the batches read "
                           f"(a batch at byte {pos} starts at {checked.base_offset})")
        offset = checked.base_offset + checked.last_offset_delta + 1
        _decode_into(out, checked, view[pos:pos + checked.size], lo, hi, applied)
        pos += checked.size
    return out, offset


def _decode_into(out: list[CommittedRecord], header: BatchHeader, raw: bytes | memoryview, lo: int, hi: int,
                 applied: AppliedLookup | frozenset[int] | None) -> None:
    """Append the records of offsets [lo, hi) of one checked batch (`raw`: all of it) to `out`."""
    if header.is_control:
        return
    records = decode_records(header, records_payload(header, raw), _maker(header.leader_epoch, applied))
    if lo <= header.base_offset and header.last_offset < hi:
        out.extend(records)
    else:
        out.extend(r for r in records if lo <= r.offset < hi)


def _maker(term: int, applied: AppliedLookup | frozenset[int] | None) -> Callable[..., CommittedRecord]:
    """What `decode_records` builds each record with: the export's hot loop, so the tuple is made
    directly (`tuple.__new__`, as `CommittedRecord._make` does) rather than through the class's
    Python-level constructor."""
    new = tuple.__new__
    if isinstance(applied, frozenset):   # every record changed the views but those: no call per record
        return lambda offset, timestamp, key, value, _headers: new(CommittedRecord, (
            offset, "" if key is None else key.decode("utf-8", "backslashreplace"), value, timestamp, term,
            offset not in applied))
    if applied is None:
        return lambda offset, timestamp, key, value, _headers: new(CommittedRecord, (
            offset, "" if key is None else key.decode("utf-8", "backslashreplace"), value, timestamp, term, None))
    return lambda offset, timestamp, key, value, _headers: new(CommittedRecord, (
        offset, "" if key is None else key.decode("utf-8", "backslashreplace"), value, timestamp, term,
        applied(key, offset)))


def _batches_from(path: Path, lo: int) -> Iterator[tuple[BatchHeader, bytes]]:
    """(header, bytes) of each valid batch of a segment file holding offsets at or above `lo`, up to
    the first invalid one (the zeroed, preallocated end, or a torn tail past the commit bound).
    Batches below `lo` are stepped over by their headers (no CRC: they are not read)."""
    with _mapped(path) as view:
        size = len(view)
        pos = 0
        while pos + HEADER_SIZE <= size:
            h = read_header(view, pos)
            if h.magic != MAGIC or h.batch_length < MIN_BATCH_LENGTH or pos + h.size > size:
                return
            if h.base_offset + h.last_offset_delta < lo:
                pos += h.size
                continue
            checked = check_batch(view, pos, size)
            if isinstance(checked, str):
                return
            end = pos + checked.size
            yield checked, bytes(view[pos:end])   # a copy: nothing outlives the mapping
            pos = end
