"""Raft storage over the segmented log: what one group keeps on disk.

Layout of a group directory::

    quorum-state                    JSON: term, vote, commit, membership entries (atomic writes)
    log/                            the segmented log (eventlog.log); entries as record batches
    snapshots/<index>-<term>/       a snapshot: `data` (opaque bytes of the state machine) + `meta`
    snapshots/incoming.tmp          chunks of a snapshot being received from the leader
    snapshots/local-*.tmp           a snapshot of this node being written (removed on open)

`quorum-state` also lists the offsets of membership-change entries, so a restart need not read the
whole log to find the configuration: entries past `conf_scanned_to` are scanned on open, listed
offsets are re-checked, and a truncation lowers `conf_scanned_to` before new entries can follow.

Durability: `append` writes entries (durable once the log's durable offset passes them: the runtime
waits for it before anything that acknowledges them); `set_hard_state`, snapshot staging and
installation are durable when they return. A snapshot of this node is written in three steps
(`new_snapshot_dir`, the data plus `seal_snapshot_data` in any thread, `finish_snapshot`): a crash at
any step leaves the previous snapshot current and the log untouched.

Not thread-safe: used by one group's task (the log itself is thread-safe).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec

from eventlog.config import LogConfig
from eventlog.errors import EpochlogError, LogCorruptionError
from eventlog.fileutil import atomic_write, fsync_dir, io_error
from eventlog.log import Log
from eventlog.raft.errors import CompactedError, UnavailableError
from eventlog.raft.runtime.entries import batch_to_entry, entry_to_batch
from eventlog.raft.types import ConfState, Entry, EntryKind, HardState, SnapshotMeta

QUORUM_STATE = "quorum-state"
SNAPSHOTS = "snapshots"
INCOMING = "incoming.tmp"


class QuorumState(msgspec.Struct):
    version: int = 1
    term: int = 0
    vote: int = 0
    commit: int = -1
    conf_offsets: list[int] = []
    conf_scanned_to: int = 0


class LogStorage:
    """`eventlog.raft.storage.Storage` backed by a segmented log, a quorum-state file and snapshots."""

    def __init__(self, directory: Path, log: Log, state: QuorumState, snapshot: SnapshotMeta) -> None:
        self.directory = directory
        self.log = log
        self._state = state
        self._snapshot = snapshot
        self._conf_offsets = list(state.conf_offsets)
        self._snapshot_seq = 0
        self._anchor: tuple[int, int | None] = (-1, None)   # see _anchored

    @classmethod
    def open(cls, directory: str | Path, log_config: LogConfig, initial_conf: ConfState) -> LogStorage:
        """Open (or create) a group's storage; `initial_conf` is the membership of a new group."""
        path = Path(directory)
        (path / SNAPSHOTS).mkdir(parents=True, exist_ok=True)
        state = _read_quorum_state(path / QUORUM_STATE)
        snapshot = _latest_snapshot(path / SNAPSHOTS) or SnapshotMeta(index=-1, term=0, conf=initial_conf)
        log = Log.open(path / "log", log_config)
        storage = cls(path, log, state, snapshot)
        storage._reconcile()
        return storage

    def _reconcile(self) -> None:
        """Repair what a crash between two writes can leave: a log behind its snapshot, stale offsets."""
        snap = self._snapshot
        if snap.index >= 0 and (self.log.end_offset <= snap.index or self.log.start_offset > snap.index + 1
                                or self._log_term(snap.index) not in (None, snap.term)):
            self.log.reset(snap.index + 1)  # the snapshot was installed; the log reset did not happen
        end = self.log.end_offset
        valid = []
        first = self._written_from()
        for offset in self._conf_offsets:
            if offset < end and offset >= first and self._entry_at(offset).kind is EntryKind.CONF_CHANGE:
                valid.append(offset)
        scan_from = max(min(self._state.conf_scanned_to, end), first)
        for batch in self.log.batches(scan_from):
            if batch.header.is_control and batch_to_entry(batch).kind is EntryKind.CONF_CHANGE:
                if batch.header.base_offset not in valid:
                    valid.append(batch.header.base_offset)
        self._conf_offsets = sorted(o for o in valid if o > snap.index)

    # --- Storage protocol ------------------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        s = self._state
        return HardState(term=s.term, vote=s.vote, commit=s.commit), self._snapshot

    def first_index(self) -> int:
        """The first entry served to the core: the log's, when it still holds entries the snapshot
        covers, so a follower that lags behind the latest snapshot catches up from the log (and keeps
        a key-compacted prefix); it installs a snapshot only when it needs an entry the log no longer
        holds as written.

        Below `clean_end_offset` key compaction may have rewritten entries: never served (a follower
        that needs them gets the snapshot), so the cleaner must stay at or below snapshot + 1. The core
        checks the term of the offset before the first entry it sends, so the first entry served is
        one whose predecessor's term is known (`_anchored`)."""
        snapshot_next = self._snapshot.index + 1
        held = self._written_from()
        if held < snapshot_next:
            first = self._anchored(held)
            if first is not None and first < snapshot_next:
                return first
        return max(held, snapshot_next)

    def _anchored(self, held: int) -> int | None:
        """`held` when the term of the offset before it is known (offset -1: term 0; the end of a
        cleaned range: the leader epoch cache), else the offset after the entry at `held` (after a
        truncation the epoch before the log start is gone). Cached per `held`: the core asks often."""
        if held == 0 or self.log.epoch_for_offset(held - 1) is not None:
            return held
        if self._anchor[0] != held:
            try:
                first: int | None = self._entry_at(held).last_index + 1
            except (EpochlogError, StopIteration):
                first = None
            self._anchor = (held, first)
        return self._anchor[1]

    def _written_from(self) -> int:
        """The first offset from which the log holds every entry as written (past the log start and
        the key-compacted range)."""
        return max(self.log.start_offset, self.log.clean_end_offset)

    def last_index(self) -> int:
        return max(self.log.end_offset - 1, self._snapshot.index)

    def term(self, index: int) -> int:
        if index == self._snapshot.index:
            return self._snapshot.term
        first = self.first_index()
        if index < first - 1:
            raise CompactedError(f"index {index} is compacted (log starts at {first})")
        if index == -1:
            return 0   # the empty prefix every log shares
        term = self._log_term(index)
        if term is None:
            raise UnavailableError(f"index {index} is beyond the last index {self.last_index()}")
        return term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.first_index():
            raise CompactedError(f"index {lo} is compacted (log starts at {self.first_index()})")
        out: list[Entry] = []
        size = 0
        offset = lo
        while offset < hi:
            chunk = self.log.read(offset, max(1, max_bytes - size), max_offset=hi)
            if chunk.next_offset == chunk.start_offset:
                break
            for batch in chunk.batches():
                entry = batch_to_entry(batch)
                if out and size + entry.size > max_bytes:
                    return out
                out.append(entry)
                size += entry.size
            offset = chunk.next_offset
        if lo < self._written_from():
            # A cleaner pass swapped in a cleaned segment while this read ran (entries below the
            # snapshot are served while the cleaner may still clean them): what was read may lack records.
            raise CompactedError(f"index {lo} was compacted while it was read")
        if not out and lo <= self.last_index():
            raise UnavailableError(f"no entry starts at {lo}")
        return out

    def entry_bounds(self, index: int) -> tuple[int, int]:
        if index == self._snapshot.index and not self._written_from() <= index < self.log.end_offset:
            return index, index
        e = self._entry_at(index)
        return e.index, e.last_index

    def conf_entries(self) -> list[Entry]:
        return [self._entry_at(o) for o in self._conf_offsets]

    def snapshot(self) -> SnapshotMeta:
        return self._snapshot

    def snapshot_chunk(self, index: int, offset: int, max_bytes: int) -> bytes:
        """Chunk of the current snapshot or of the one before it (a transfer in progress when a new
        snapshot is taken finishes instead of starting over, so a slow follower is not starved)."""
        for p in (self.directory / SNAPSHOTS).glob(f"{index}-*"):
            if p.is_dir() and not p.name.endswith(".tmp"):
                with open(p / "data", "rb") as f:
                    f.seek(offset)
                    return f.read(max_bytes)
        raise CompactedError(f"snapshot {index} was replaced by snapshot {self._snapshot.index}")

    # --- writes (the runtime applying a Ready) -------------------------------------------------

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> int:
        """Write entries, first truncating any stored suffix they replace. Returns the last index.

        The entries are durable once `log.durable_offset` passes the returned index.
        """
        first = entries[0].index
        if first <= self.log.end_offset - 1:
            self.log.truncate_suffix(first)
            self._conf_offsets = [o for o in self._conf_offsets if o < first]
            if self._state.conf_scanned_to > first:
                self._state.conf_scanned_to = first
                self._write_state()  # before any entry can land below the old scanned-to mark
        data = b"".join(bytes(entry_to_batch(e)) for e in entries)
        self.log.append_replica(data)
        for e in entries:
            if e.kind is EntryKind.CONF_CHANGE:
                self._conf_offsets.append(e.index)
        return entries[-1].last_index

    def set_hard_state(self, hs: HardState) -> None:
        """Persist term, vote and commit (and the membership bookkeeping) atomically."""
        s = self._state
        s.term, s.vote, s.commit = hs.term, hs.vote, hs.commit
        s.conf_offsets = list(self._conf_offsets)
        s.conf_scanned_to = self.log.durable_offset
        self._write_state()

    def _write_state(self) -> None:
        atomic_write(self.directory / QUORUM_STATE, msgspec.json.encode(self._state))

    def stage_snapshot_chunk(self, meta: SnapshotMeta, offset: int, data: bytes) -> None:
        """Write a received chunk of snapshot `meta` at `offset` (durable on return)."""
        path = self.directory / SNAPSHOTS / INCOMING
        if offset == 0:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            (path / "meta").write_bytes(msgspec.json.encode(meta))
        elif msgspec.json.decode((path / "meta").read_bytes(), type=SnapshotMeta) != meta:
            raise LogCorruptionError(str(path), offset, f"chunk of snapshot {meta.index} on another snapshot")
        fd = os.open(path / "data", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, offset)
            os.pwrite(fd, data, offset)
            os.fsync(fd)
        except OSError as exc:
            raise io_error(f"staging snapshot chunk in {path}", exc) from exc
        finally:
            os.close(fd)

    def install_snapshot(self, meta: SnapshotMeta) -> Path:
        """Make the staged snapshot the current one and reset the log behind it; returns its directory.

        The state machine loads its state from `<dir>/data` afterwards.
        """
        staged = self.directory / SNAPSHOTS / INCOMING
        if os.path.getsize(staged / "data") != meta.size:
            raise LogCorruptionError(str(staged / "data"), 0, f"staged snapshot is not {meta.size} bytes")
        target = self.snapshot_dir(meta)
        shutil.rmtree(target, ignore_errors=True)
        fsync_dir(staged)
        os.rename(staged, target)
        fsync_dir(target.parent)
        self._snapshot = meta
        # The whole log goes: the core asks for an install only when its log does not hold the
        # snapshot's last entry (it keeps a matching suffix itself, §5.6), so anything stored past it
        # would be a suffix the core no longer knows about.
        self.log.reset(meta.index + 1)
        self._conf_offsets = []
        self._drop_old_snapshots()
        return target

    def create_snapshot(self, index: int, conf: ConfState, write_data: Callable[[Path], None]) -> SnapshotMeta:
        """Record the state machine's snapshot at applied `index`: `write_data(path)` writes the bytes.

        The three steps below in one call; a runtime that must not stall runs the middle one (the bytes)
        in a thread: `new_snapshot_dir` and `finish_snapshot` are quick and touch this object's state."""
        tmp = self.new_snapshot_dir()
        try:
            write_data(tmp / "data")
            seal_snapshot_data(tmp)
            meta = self.finish_snapshot(tmp, index, conf)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        assert meta is not None, f"snapshot at {index} is not newer than {self._snapshot.index}"
        return meta

    def new_snapshot_dir(self) -> Path:
        """An empty directory for a snapshot being written (`data` goes in it); removed on open if a
        crash leaves it behind."""
        self._snapshot_seq += 1
        tmp = self.directory / SNAPSHOTS / f"local-{os.getpid()}-{self._snapshot_seq}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    def finish_snapshot(self, tmp: Path, index: int, conf: ConfState) -> SnapshotMeta | None:
        """Make the snapshot written (and sealed: `seal_snapshot_data`) in `tmp` the current one, taken
        at applied `index`. None, and `tmp` removed, when it is no longer newer than the current
        snapshot (one was installed from the leader meanwhile) or its index left the log."""
        if index <= self._snapshot.index:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        try:
            term = self.term(index)
        except (CompactedError, UnavailableError):
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        meta = SnapshotMeta(index=index, term=term, conf=conf, size=(tmp / "data").stat().st_size)
        atomic_write(tmp / "meta", msgspec.json.encode(meta))
        target = self.snapshot_dir(meta)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        fsync_dir(target.parent)
        self._snapshot = meta
        self._conf_offsets = [o for o in self._conf_offsets if o > index]
        self._drop_old_snapshots()
        return meta

    def compact(self, index: int) -> int:
        """Drop log segments wholly at or below `index` (covered by the snapshot). Returns how many."""
        doomed = self.detach_through(index)
        for path in doomed:
            path.unlink(missing_ok=True)
        return sum(1 for p in doomed if p.name.endswith(".log.deleted"))

    def detach_through(self, index: int) -> list[Path]:
        """`compact` without the unlinking: the segments leave the log (durably) and their renamed files
        are returned for the caller to unlink off the event loop (Log.detach_segments_below)."""
        if index > self._snapshot.index:
            raise CompactedError(f"cannot compact through {index}: the snapshot is at {self._snapshot.index}")
        return self.log.detach_segments_below(index + 1)

    def snapshot_dir(self, meta: SnapshotMeta) -> Path:
        return self.directory / SNAPSHOTS / f"{meta.index}-{meta.term}"

    def _drop_old_snapshots(self, keep: int = 2) -> None:
        """Keep the newest `keep` snapshots (a transfer of the previous one may be under way)."""
        snapshots = []
        for p in (self.directory / SNAPSHOTS).iterdir():
            if p.name == INCOMING or p.name.endswith(".tmp"):
                continue
            index, _, _term = p.name.partition("-")
            snapshots.append((int(index), p))
        for _, p in sorted(snapshots, reverse=True)[keep:]:
            shutil.rmtree(p, ignore_errors=True)

    def close(self) -> None:
        self.log.close()

    # --- helpers -------------------------------------------------------------------------------

    def _log_term(self, index: int) -> int | None:
        return self.log.epoch_for_offset(index)

    def _entry_at(self, index: int) -> Entry:
        chunk = self.log.read(index, 1)
        return batch_to_entry(next(chunk.batches()))


def seal_snapshot_data(tmp: Path) -> None:
    """Make a snapshot directory's `data` durable (fsync file and directory). Thread-safe: touches only
    `tmp`, so a runtime can run it with the writing of the data, off its event loop."""
    fd = os.open(tmp / "data", os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        raise io_error(f"syncing snapshot data in {tmp}", exc) from exc
    finally:
        os.close(fd)
    fsync_dir(tmp)


def _read_quorum_state(path: Path) -> QuorumState:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return QuorumState()
    try:
        return msgspec.json.decode(raw, type=QuorumState)
    except msgspec.DecodeError as exc:
        # Written atomically: damage, not a torn write. Refuse rather than forget a vote (§5.1).
        raise LogCorruptionError(str(path), 0, f"unreadable quorum state: {exc}") from None


def _latest_snapshot(directory: Path) -> SnapshotMeta | None:
    best: SnapshotMeta | None = None
    for p in directory.iterdir():
        if p.name.endswith(".tmp") or not (p / "meta").exists():
            if p.name.endswith(".tmp") and p.name != INCOMING:
                shutil.rmtree(p, ignore_errors=True)  # an interrupted create_snapshot
            continue
        meta = msgspec.json.decode((p / "meta").read_bytes(), type=SnapshotMeta)
        if best is None or meta.index > best.index:
            best = meta
    return best
