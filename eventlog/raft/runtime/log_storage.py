"""Raft storage over the segmented log: what one group keeps on disk.

Layout of a group directory::

    quorum-state                    JSON: term, vote, commit, membership entries (atomic writes)
    log/                            the segmented log (eventlog.log); entries as record batches
    snapshots/<index>-<term>/       a snapshot: `data` (opaque bytes of the state machine) + `meta`
                                    (+ `prefix/`: a received log prefix until the log adopted it)
    snapshots/incoming.tmp          chunks of a snapshot being received from the leader
    snapshots/local-*.tmp           a snapshot of this node being written (removed on open)
    snapshots/*.image-*.tmp         hard links to the files (data, log segments) of an image being sent (removed on open)

A snapshot travels as an *image* (eventlog/raft/runtime/snapshot_image.py): its data, and for a
group that `ships_log_prefix` (key-compacted: its log is kept from its start for Kafka readers) the
log below the snapshot too. `snapshot()` gives the core the image's size; a follower stages the
image into `incoming.tmp` (data, `prefix/` segment files, checked batch by batch) and installing it
resets the log onto that prefix (`Log.reset` with a `PrefixInstall`), so its log keeps the
key-compacted history the leader's has, as cleaned segments that Raft never serves as entries.

`quorum-state` also lists the offsets of membership-change entries, so a restart need not read the
whole log to find the configuration: entries past `conf_scanned_to` are scanned on open, listed
offsets are re-checked, and a truncation lowers `conf_scanned_to` before new entries can follow.

Durability: `append` writes entries (durable once the log's durable offset passes them: the runtime
waits for it before anything that acknowledges them); `set_hard_state`, snapshot staging and
installation are durable when they return. A snapshot of this node is written in three steps
(`new_snapshot_dir`, the data plus `seal_snapshot_data` in any thread, `finish_snapshot`): a crash at
any step leaves the previous snapshot current and the log untouched. Installing one renames the
staged directory into place (the commit point), then resets the log (with its prefix: crash-safe in
the log, `eventlog.prefix`), then drops the manifest of `prefix/`: a crash anywhere is finished on
open (`_reconcile`), which installs the prefix again unless the log already holds it.

Damage (eventlog/damage.py). What the log finds damaged is never handed to the core: reading it for
replication or applying raises CompactedError here (a follower that needs it gets a snapshot; applying
waits), and an image whose log prefix holds it is built again without it. `drop_from` removes it when
the runtime drops the damaged entries (eventlog/raft/runtime/repair.py); the vote floor of
`RaftNode.drop_entries` is kept in `quorum-state` with term and vote.

Not thread-safe: used by one group's task (the log itself is thread-safe). Chunks of an image are
read ahead in a thread of its own (the image's files never change once linked).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from eventlog.config import LogConfig
from eventlog.errors import CorruptBatchError, EpochlogError, LogCorruptionError
from eventlog.fileutil import atomic_write, fsync_dir, io_error
from eventlog.log import Log
from eventlog.prefix import PrefixInstall
from eventlog.raft.errors import CompactedError, UnavailableError
from eventlog.raft.runtime.entries import batch_to_entry, entry_to_batch
from eventlog.raft.runtime.snapshot_image import PREFIX_DIR, ImageCheck, ImageStaging, SnapshotImage, build_image
from eventlog.raft.types import ConfState, Entry, EntryKind, HardState, SnapshotMeta

QUORUM_STATE = "quorum-state"
SNAPSHOTS = "snapshots"
INCOMING = "incoming.tmp"
READ_AHEAD = 4
"""Image chunks read ahead at most (one per transfer under way, up to this many transfers)."""
IMAGE_IDLE_S = 60.0
"""An image whose snapshot was replaced stays while a transfer read from it this recently."""
RECENT_ENTRIES_BYTES = 2 << 20
"""The latest appended entries kept in memory (at least the last one), as stored: what `entries` serves
without reading the log back. Every write is applied (and, on a leader, sent) right after its commit,
a few entries behind the end of the log; reading it back cost a read, a batch parse and a copy on
every node per write (issue-20-put-latency in bench/RESULTS.md)."""


class QuorumState(msgspec.Struct):
    version: int = 1
    term: int = 0
    vote: int = 0
    commit: int = -1
    conf_offsets: list[int] = []
    conf_scanned_to: int = 0
    floor_index: int = -1      # the vote floor (HardState): -1 while the node dropped no entries
    floor_term: int = 0


class LogStorage:
    """`eventlog.raft.storage.Storage` backed by a segmented log, a quorum-state file and snapshots."""

    def __init__(self, directory: Path, log: Log, state: QuorumState, snapshot: SnapshotMeta, *,
                 ships_log_prefix: bool = False) -> None:
        self.directory = directory
        self.log = log
        self.ships_log_prefix = ships_log_prefix   # images carry the log below the snapshot (module docstring)
        self._state = state
        self._snapshot = snapshot
        self._conf_offsets = list(state.conf_offsets)
        self._snapshot_seq = 0
        self._anchor: tuple[int, int | None] = (-1, None)   # see _anchored
        self._images: dict[int, SnapshotImage] = {}          # snapshot index -> its image, as served
        self._staging: ImageStaging | None = None            # the image being received
        self._ahead: dict[tuple[int, int, int], concurrent.futures.Future[bytes]] = {}
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        # (first, last) index of the last entry appended, while the log still ends with it: the entry
        # nearly every message names (a follower's prev_index, an acknowledged index), known without
        # reading it back from the log (see entry_bounds).
        self._last_entry: tuple[int, int] | None = None
        # The latest entries appended, contiguous and ending at the log's end (RECENT_ENTRIES_BYTES),
        # each as `entries` reads it back (a NORMAL entry's data stamped with its index and term).
        self._recent: list[Entry] = []
        self._recent_bytes = 0
        # (log.files_generation, snapshot index) -> `_written_from()` and `first_index()` as of then: the
        # core asks for them ~10 times per entry, and the log's start and cleaned range change only with
        # its files generation (each computation takes the log's lock, which its flusher thread shares).
        self._written: tuple[int, int] = (-1, 0)
        self._first: tuple[tuple[int, int], int] = ((-1, -2), 0)

    @classmethod
    def open(cls, directory: str | Path, log_config: LogConfig, initial_conf: ConfState, *,
             ships_log_prefix: bool = False) -> LogStorage:
        """Open (or create) a group's storage; `initial_conf` is the membership of a new group, and
        `ships_log_prefix` says whether snapshots sent from here carry the log below them (a group
        whose log is key-compacted rather than truncated)."""
        path = Path(directory)
        (path / SNAPSHOTS).mkdir(parents=True, exist_ok=True)
        state = read_quorum_state(path / QUORUM_STATE)
        snapshot = _latest_snapshot(path / SNAPSHOTS) or SnapshotMeta(index=-1, term=0, conf=initial_conf)
        log = Log.open(path / "log", log_config)
        storage = cls(path, log, state, snapshot, ships_log_prefix=ships_log_prefix)
        storage._reconcile()
        return storage

    def _reconcile(self) -> None:
        """Repair what a crash between two writes can leave: a log behind its snapshot, a log prefix
        not adopted, stale offsets."""
        snap = self._snapshot
        if snap.index >= 0:
            self._adopt_prefix(self.snapshot_dir(snap), snap, reopened=True)
        # The term at the snapshot index is compared only where the log holds it as written: in a
        # key-compacted range its batch may be gone (and it was committed anyway).
        if snap.index >= 0 and (self.log.end_offset <= snap.index or self.log.start_offset > snap.index + 1
                                or (self._written_from() <= snap.index
                                    and self._log_term(snap.index) not in (None, snap.term))):
            self.log.reset(snap.index + 1)  # the snapshot was installed; the log reset did not happen
        end = self.log.end_offset
        valid = []
        first = self._written_from()
        for offset in self._conf_offsets:
            if offset < end and offset >= first and self._entry_at(offset).kind is EntryKind.CONF_CHANGE:
                valid.append(offset)
        scan_from = max(min(self._state.conf_scanned_to, end), first)
        try:
            for batch in self.log.batches(scan_from):
                if batch.header.is_control and batch_to_entry(batch).kind is EntryKind.CONF_CHANGE:
                    if batch.header.base_offset not in valid:
                        valid.append(batch.header.base_offset)
        except CorruptBatchError:
            pass   # damaged (logged by the log): the entries from there on are dropped and fetched again
        self._conf_offsets = sorted(o for o in valid if o > snap.index)

    # --- Storage protocol ------------------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        s = self._state
        return (HardState(term=s.term, vote=s.vote, commit=s.commit, floor_index=s.floor_index,
                          floor_term=s.floor_term), self._snapshot)

    def first_index(self) -> int:
        """The first entry served to the core: the log's, when it still holds entries the snapshot
        covers, so a follower that lags behind the latest snapshot catches up from the log (and keeps
        a key-compacted prefix); it installs a snapshot only when it needs an entry the log no longer
        holds as written.

        Below `clean_end_offset` key compaction may have rewritten entries: never served (a follower
        that needs them gets the snapshot), so the cleaner must stay at or below snapshot + 1. The core
        checks the term of the offset before the first entry it sends, so the first entry served is
        one whose predecessor's term is known (`_anchored`). Cached per files generation and snapshot
        (what it is computed from changes with one of them: the leader epoch cache below the log start
        only with a truncation or reset, which bump the generation)."""
        key = (self.log.files_generation, self._snapshot.index)   # read before computing: see _written_from
        cached = self._first
        if cached[0] == key:
            return cached[1]
        snapshot_next = self._snapshot.index + 1
        held = self._written_from()
        first = max(held, snapshot_next)
        if held < snapshot_next:
            anchored = self._anchored(held)
            if anchored is not None and anchored < snapshot_next:
                first = anchored
        self._first = (key, first)
        return first

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
        the key-compacted range). Cached per files generation: the log bumps it, under its lock, with
        every change of its first segment or cleaned range (a deletion, swap, truncation or reset, from
        whichever thread). The generation is read before the offsets, so a change that lands between
        the two is seen again at the next call, never missed."""
        log = self.log
        generation = log.files_generation
        cached = self._written
        if cached[0] == generation:
            return cached[1]
        held = log.clean_end_offset   # the larger of the log start and the end of the cleaned range
        self._written = (generation, held)
        return held

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
        recent = self._recent
        if recent:
            last = recent[-1]   # the entry nearly every term asked for is in (an acknowledged index, prev_index)
            if last.index <= index <= last.last_index and last.last_index == self.log.end_offset - 1:
                return last.term   # its batch's epoch, as the log would say
        term = self._log_term(index)
        if term is None:
            raise UnavailableError(f"index {index} is beyond the last index {self.last_index()}")
        return term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.first_index():
            raise CompactedError(f"index {lo} is compacted (log starts at {self.first_index()})")
        recent = self._recent_from(lo)
        if recent is not None:
            out = []
            size = 0
            for e in recent:
                if e.index >= hi or (out and size + e.size > max_bytes):
                    break
                out.append(e)
                size += e.size
            return out
        out = []
        size = 0
        offset = lo
        while offset < hi:
            try:
                chunk = self.log.read(offset, max(1, max_bytes - size), max_offset=hi)
            except CorruptBatchError as exc:
                if out:
                    return out   # what precedes the damage; the next call starts at it
                raise CompactedError(f"index {offset} cannot be served: {exc}") from None
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

    def _recent_from(self, lo: int) -> list[Entry] | None:
        """The recent entries from the one at `lo` on, if it is one of them (and they still end the log)."""
        recent = self._recent
        if not recent or lo < recent[0].index or recent[-1].last_index != self.log.end_offset - 1:
            return None
        if lo < self._written_from():
            return None   # a cleaner may have rewritten it: `entries` refuses it as when read
        for i in range(len(recent) - 1, -1, -1):   # the wanted one is nearly always among the last few
            if recent[i].index == lo:
                return recent[i:]
            if recent[i].index < lo:
                return None   # inside an entry: not where one starts (the log read says so)
        return None

    def _forget_recent(self) -> None:
        self._recent = []
        self._recent_bytes = 0

    def _remember(self, stored: list[Entry]) -> None:
        """Keep `stored`, just appended after the recent entries, and drop the oldest past the budget."""
        recent = self._recent
        if recent and recent[-1].last_index + 1 != stored[0].index:
            recent.clear()
            self._recent_bytes = 0
        added = 0
        for e in stored:
            recent.append(e)
            added += e.size
        self._recent_bytes += added
        drop = 0
        while len(recent) - drop > 1 and self._recent_bytes > RECENT_ENTRIES_BYTES:
            self._recent_bytes -= recent[drop].size
            drop += 1
        if drop:
            del recent[:drop]

    def entry_bounds(self, index: int) -> tuple[int, int]:
        if index == self._snapshot.index and not self._written_from() <= index < self.log.end_offset:
            return index, index
        last = self._last_entry
        if last is not None and last[0] <= index <= last[1] and last[1] == self.log.end_offset - 1:
            return last
        try:
            e = self._entry_at(index)
        except CorruptBatchError as exc:
            raise CompactedError(f"index {index} cannot be read: {exc}") from None
        return e.index, e.last_index

    def conf_entries(self) -> list[Entry]:
        """The membership changes in the log. One the log cannot read (damaged) ends the list: the
        entries from the damage on are dropped and fetched again before this node can campaign (its
        vote floor), and those that reach it from the leader bring the changes back."""
        out = []
        for o in self._conf_offsets:
            try:
                out.append(self._entry_at(o))
            except CorruptBatchError:
                break
        return out

    def snapshot(self) -> SnapshotMeta:
        """The latest snapshot as it is sent: `size` is its image's (data and, when this group
        `ships_log_prefix`, the log below it). Built from a listing of the log the first time (and
        again while no transfer read it, when the log's files changed); `latest_snapshot` is the
        snapshot as stored."""
        snap = self._snapshot
        if snap.index < 0:
            return snap
        self._drop_idle_images()
        image = self._images.get(snap.index)
        if image is None or image.meta.term != snap.term or (not image.linked and self._stale(image)):
            image = self._images[snap.index] = self._build_image(snap)
        return image.meta

    @property
    def latest_snapshot(self) -> SnapshotMeta:
        """The latest snapshot as stored (`size`: its data's)."""
        return self._snapshot

    def snapshot_chunk(self, index: int, offset: int, max_bytes: int) -> bytes:
        """Chunk of the image of snapshot `index`: the current one, or an older one a transfer is
        still reading (a transfer in progress when new snapshots are taken finishes instead of
        starting over, so a slow follower is not starved). The first read of an image links its
        files; if a log segment changed since it was listed, the image is built again and
        CompactedError makes the core start over with it."""
        image = self._images.get(index)
        if image is None:
            raise CompactedError(f"snapshot {index} was replaced by snapshot {self._snapshot.index}")
        if not image.linked:
            self._link(image)
        image.last_read = time.monotonic()
        ahead = self._ahead.pop((index, offset, max_bytes), None)
        if ahead is not None and ahead.done() and not ahead.cancelled() and ahead.exception() is None:
            data = ahead.result()
        else:
            try:
                data = image.read(offset, max_bytes)
            except CorruptBatchError as exc:
                self._image_damaged(image, exc)
                raise CompactedError(f"snapshot {index}: its log prefix holds a damaged batch ({exc}); "
                                     f"built again without it") from None
        following = offset + len(data)
        if data and following < image.meta.size:
            while len(self._ahead) >= READ_AHEAD:
                self._ahead.pop(next(iter(self._ahead))).cancel()
            self._ahead[(index, following, max_bytes)] = self._reader_pool().submit(image.read, following, max_bytes)
        return data

    def _image_damaged(self, image: SnapshotImage, exc: CorruptBatchError) -> None:
        """A part of `image` holds a damaged batch: tell the log (if the part is still its segment file) and
        drop the image, so the next `snapshot()` lists the log again, leaving the damage out."""
        path = Path(exc.path)
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            inode = -1
        self.log.report_damage(int(path.name[:20]), inode, exc.position, exc.offset, exc.reason)
        if self._images.get(image.meta.index) is image:
            self._drop_image(self._images.pop(image.meta.index))

    def _build_image(self, snap: SnapshotMeta) -> SnapshotImage:
        old = self._images.pop(snap.index, None)
        if old is not None:
            self._drop_image(old)
        return build_image(snap, self.snapshot_dir(snap) / "data", self.log if self.ships_log_prefix else None)

    def _stale(self, image: SnapshotImage) -> bool:
        return bool(image.parts) and self.log.files_generation != image.generation

    def _link(self, image: SnapshotImage) -> None:
        if self._try_link(image):
            return
        # A segment file changed since the listing (a cleaner swap): no transfer read this image, so
        # it is built again, and linked now so that the transfer starting over gets a fixed one (if
        # the log changed once more meanwhile, it is linked at its first read).
        fresh = self._images[image.meta.index] = self._build_image(image.meta)
        self._try_link(fresh)
        raise CompactedError(f"the log below snapshot {image.meta.index} changed while its image was listed")

    def _try_link(self, image: SnapshotImage) -> bool:
        if image.linked:
            return True
        self._snapshot_seq += 1
        links = self.directory / SNAPSHOTS / f"{image.meta.index}-{image.meta.term}.image-{self._snapshot_seq}.tmp"
        shutil.rmtree(links, ignore_errors=True)
        links.mkdir()
        if image.parts and not self.log.link_prefix(image.generation, image.parts, links):
            shutil.rmtree(links, ignore_errors=True)
            return False
        try:
            os.link(image.data, links / "data")
        except OSError as exc:
            shutil.rmtree(links, ignore_errors=True)
            raise io_error(f"linking {image.data}", exc) from exc
        image.data, image.links = links / "data", links
        return True

    def _drop_idle_images(self) -> None:
        """Drop the images of snapshots no longer kept, but those a transfer read from lately."""
        now = time.monotonic()
        for image in list(self._images.values()):
            if (not self.snapshot_dir(image.meta).exists()
                    and (not image.linked or now - image.last_read > IMAGE_IDLE_S)):
                self._drop_image(self._images.pop(image.meta.index))

    def _drop_image(self, image: SnapshotImage) -> None:
        for key in [k for k in self._ahead if k[0] == image.meta.index]:
            self._ahead.pop(key).cancel()
        if image.links is not None:   # unlinking a replaced segment frees its blocks: off the loop
            self._reader_pool().submit(shutil.rmtree, image.links, True)

    def _reader_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(1, f"snapshot-image-{self.directory.name}")
        return self._reader

    # --- writes (the runtime applying a Ready) -------------------------------------------------

    def append(self, entries: tuple[Entry, ...] | list[Entry], *, sync: bool = False) -> int:
        """Write entries, first truncating any stored suffix they replace. Returns the last index.

        The entries are durable once `log.durable_offset` passes the returned index; with `sync`, when
        this returns (`Log.append_replica`).
        """
        first = entries[0].index
        if first <= self.log.end_offset - 1:
            self._forget_recent()
            self.log.truncate_suffix(first)
            self._conf_offsets = [o for o in self._conf_offsets if o < first]
            if self._state.conf_scanned_to > first:
                self._state.conf_scanned_to = first
                self._write_state()  # before any entry can land below the old scanned-to mark
        batches = [entry_to_batch(e) for e in entries]
        self._last_entry = None
        try:
            self.log.append_replica(batches[0] if len(batches) == 1 else b"".join(batches), sync=sync)
        except BaseException:
            self._forget_recent()   # written or not, in part or whole: read back from the log from now on
            raise
        last = entries[-1]
        last_index = last.index + last.count - 1
        self._last_entry = (last.index, last_index)
        self._remember([e if e.kind is not EntryKind.NORMAL or e.data is b else Entry(e.index, e.term, e.count, e.kind, b)
                        for e, b in zip(entries, batches)])
        for e in entries:
            if e.kind is EntryKind.CONF_CHANGE:
                self._conf_offsets.append(e.index)
        return last_index

    def drop_from(self, index: int) -> None:
        """Remove the entries from `index` on, found damaged (after the vote floor of
        `RaftNode.drop_entries` was persisted); durable on return. At or below the snapshot the log
        restarts empty after it: the snapshot holds what Raft needs, and the log cannot go on from an
        offset below it. (For a group that ships its log prefix that gives up, on this node only, its
        key-compacted history below the snapshot: readers there are told `compacted`.)"""
        snap = self._snapshot.index
        self._last_entry = None
        self._forget_recent()
        if index <= snap:
            self.log.reset(snap + 1)
        else:
            self.log.truncate_suffix(index)
        self._conf_offsets = [o for o in self._conf_offsets if o < index]
        self._anchor = (-1, None)
        if self._state.conf_scanned_to > index:
            self._state.conf_scanned_to = index
        self._write_state()

    def set_hard_state(self, hs: HardState) -> None:
        """Persist term, vote, commit and vote floor (and the membership bookkeeping) atomically."""
        s = self._state
        s.term, s.vote, s.commit = hs.term, hs.vote, hs.commit
        s.floor_index, s.floor_term = hs.floor_index, hs.floor_term
        s.conf_offsets = list(self._conf_offsets)
        s.conf_scanned_to = self.log.durable_offset
        self._write_state()

    def _write_state(self) -> None:
        atomic_write(self.directory / QUORUM_STATE, msgspec.json.encode(self._state))

    def snapshot_chunk_refusal(self, meta: SnapshotMeta, offset: int, data: bytes) -> str | None:
        """Why `stage_snapshot_chunk` (and, for the last chunk, `install_snapshot`) would refuse this
        chunk, or None; nothing is written. The runtime asks before the core may accept a chunk, so the
        core never takes one its storage cannot stage (peer_check.PeerCheck.check_snapshot_chunk).

        The core stages only a chunk at offset 0 (a new image) or the one continuing the image it is
        receiving, which is the image staged here: any other chunk is None (the core answers it with
        the offset it expects, staging nothing)."""
        staging = self._staging
        if offset == 0:
            check = ImageCheck(self.directory / SNAPSHOTS / INCOMING, meta)
        elif staging is not None and staging.meta == meta and staging.received == offset:
            check = staging.check.copy()
        else:
            return None
        try:
            check.feed(offset, data)
            if check.received == meta.size:
                check.check_whole()
        except LogCorruptionError as exc:
            return f"byte {exc.position}: {exc.reason}"
        return None

    def stage_snapshot_chunk(self, meta: SnapshotMeta, offset: int, data: bytes) -> None:
        """Write a received chunk of the image of snapshot `meta` at `offset` (durable on return).

        Chunks come in order from offset 0 (the core accepts no other); offset 0 starts over. A chunk
        the image refuses (LogCorruptionError: `snapshot_chunk_refusal` says so beforehand) leaves
        the staged image as it was (at offset 0: empty)."""
        path = self.directory / SNAPSHOTS / INCOMING
        if offset == 0:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            (path / "meta").write_bytes(msgspec.json.encode(meta))
            self._staging = ImageStaging(path, meta, self.log.config.index_interval_bytes)
        elif self._staging is None or self._staging.meta != meta:
            raise LogCorruptionError(str(path), offset, f"chunk of snapshot {meta.index} on another snapshot")
        self._staging.write(offset, data)

    def install_snapshot(self, meta: SnapshotMeta) -> Path:
        """Make the staged snapshot the current one and reset the log behind it (onto the image's
        log prefix, if it has one); returns its directory.

        The state machine loads its state from `<dir>/data` afterwards.
        """
        staged = self.directory / SNAPSHOTS / INCOMING
        staging = self._staging
        if staging is None or staging.meta != meta:
            raise LogCorruptionError(str(staged), 0, f"no staged image of snapshot {meta.index}")
        staging.finish()
        self._staging = None
        stored = msgspec.json.decode((staged / "meta").read_bytes(), type=SnapshotMeta)
        target = self.snapshot_dir(meta)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(staged, target)
        fsync_dir(target.parent)
        self._snapshot = stored
        self._last_entry = None
        self._forget_recent()
        # The whole log goes: the core asks for an install only when its log does not hold the
        # snapshot's last entry (it keeps a matching suffix itself, §5.6), so anything stored past it
        # would be a suffix the core no longer knows about.
        self._adopt_prefix(target, stored, reopened=False)
        self._conf_offsets = []
        self._drop_old_snapshots()
        return target

    def _adopt_prefix(self, directory: Path, snap: SnapshotMeta, *, reopened: bool) -> None:
        """Reset the log behind installed snapshot `snap` (in `directory`), onto the log prefix it
        brought (`prefix/`), then forget the prefix. `reopened`: finishing what a crash interrupted,
        so only a prefix not yet adopted is installed (the log ends at the snapshot and its cleaned
        segments are the prefix's: it was)."""
        source = directory / PREFIX_DIR
        install = PrefixInstall.load(source) if source.is_dir() else None
        if install is not None:
            log = self.log
            adopted = (log.end_offset == install.end and log.start_offset == install.start
                       and log.cleaned_segments[:len(install.parts)] == [(p.base, p.end) for p in install.parts])
            if not (reopened and adopted):
                log.reset(snap.index + 1, install, source)
            # First the manifest, strictly: left behind, it would install the prefix again on open,
            # over entries appended since.
            PrefixInstall.remove(source)
        elif not reopened:
            self.log.reset(snap.index + 1)
        if source.exists():
            shutil.rmtree(source, ignore_errors=True)

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
        """Keep the newest `keep` snapshots (a transfer of the previous one may be under way), and the
        images of those (and of any a transfer is still reading)."""
        snapshots = []
        for p in (self.directory / SNAPSHOTS).iterdir():
            if p.name == INCOMING or p.name.endswith(".tmp"):
                continue
            index, _, _term = p.name.partition("-")
            snapshots.append((int(index), p))
        for _, p in sorted(snapshots, reverse=True)[keep:]:
            shutil.rmtree(p, ignore_errors=True)
        self._drop_idle_images()

    def close(self) -> None:
        for image in self._images.values():
            self._drop_image(image)
        self._images.clear()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
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


def read_quorum_state(path: Path) -> QuorumState:
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
