"""A group's materialized views as the Raft state machine: apply, snapshot, restore.

The views live in `<group dir>/views/` (RocksDB). `applied_index` is the offset stored in the same
WriteBatch as the mutations, so after a crash the group replays the log from exactly there.

Snapshots are RocksDB checkpoints packed into one file (the opaque content Raft sends in chunks).
Restoring unpacks the checkpoint next to the live views and swaps directories:

    views/            the live database
    views.restore/    an unpacked snapshot, about to replace `views/`
    views.old/        the database being replaced

A crash in the middle of a swap is finished on open: `views.restore` without `views` is moved into
place, and leftovers are removed.

A record this node cannot apply halts the views before it (`halt`, statemachines/apply.py): the
group keeps replicating, nothing raises, and this class logs it once and stops proposing lease
expiries (its clocks would be stale). `resume` applies again from the log after an operator's skip.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eventlog.errors import EpochlogError
from eventlog.fileutil import fsync_dir
from eventlog.raft.types import Entry, EntryKind, SnapshotMeta
from statemachines.apply import Applier, Halt, Prepared
from statemachines import views_format
from statemachines.events import Event, LeaseExpired, ViewsFormatRaised, event_record
from statemachines.leases import LeaseClock
from statemachines.prune import HistoryPruner, PruneStep, reclaim
from statemachines.state import LeaseState, Outcome, decode_state
from statemachines.store import DIGEST, ViewsConfig, ViewStore

logger = logging.getLogger(__name__)

FORMAT_CHECK_S = 1.0
"""A raise of the views format level proposed and not yet applied is proposed again at most this often (a
second one applied is rejected, changing nothing)."""
SPECULATE_BYTES = 256 << 10
"""Entries a leader prepares applying before they commit (`ViewsStateMachine.speculate`) at most: what a
turn applies (eventlog/raft/runtime/ready_loop.py APPLY_BYTES_PER_TURN), so preparing holds the loop no
longer than applying them would."""


@dataclass(slots=True)
class Speculations:
    """How often a leader prepared applying entries before their commit, and what became of it."""

    prepared: int = 0
    committed: int = 0    # their commit only wrote what was prepared
    abandoned: int = 0    # something else came first: applied again from scratch
    failed: int = 0       # preparing raised (a store read): left to their apply


class ViewsStateMachine:
    """The views of one group. Call from the group's loop only."""

    def __init__(self, group_dir: str | Path, config: ViewsConfig | None = None, *, name: str = "") -> None:
        self.config = config or ViewsConfig()
        self.name = name or Path(group_dir).name
        self.base = Path(group_dir)
        self.path = self.base / "views"
        self._finish_swap()
        self.store = ViewStore.open(self.path, self.config)
        self.applier = Applier(self.store, self.config)
        self.lease_clock: LeaseClock | None = None   # only on the leader
        self.pruner = HistoryPruner()
        self._reclaimer: concurrent.futures.ThreadPoolExecutor | None = None
        self._reclaiming: concurrent.futures.Future[None] | None = None
        self._flushing = threading.Lock()   # held by a snapshot thread while it flushes the store
        # Set by the node: the views format level each member of the group's configuration advertises
        # (None: not heard), for the leader's raise (statemachines/views_format.py). None: never raise.
        self.format_support: Callable[[], Iterable[int | None]] | None = None
        self._format_proposed_at = -math.inf
        self._speculation: Prepared | None = None   # `speculate`
        self.speculations = Speculations()

    def _finish_swap(self) -> None:
        restore, old = self.base / "views.restore", self.base / "views.old"
        if restore.exists() and not self.path.exists():
            os.rename(restore, self.path)
            fsync_dir(self.base)
        shutil.rmtree(restore, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)

    @property
    def applied_index(self) -> int:
        return self.store.applied

    @property
    def digest(self) -> bytes:
        """Running digest of every mutation applied so far (equal on replicas at equal offsets)."""
        return self.store.meta(DIGEST) or b""

    @property
    def halt(self) -> Halt | None:
        """Why applying stopped on this node (None: it did not)."""
        return self.applier.halt

    def apply(self, entries: Sequence[Entry], *, resume: bool = False,
              answer: Callable[[dict[int, Outcome]], None] | None = None) -> dict[int, Outcome]:
        before = self.applier.halt
        outcomes: dict[int, Outcome] = {}
        held = self._settle(entries if not resume else ())
        if held is not None:   # the speculation was these very entries: only its write is left
            if answer is not None and len(held.entries) == len(entries):
                answer(held.outcomes)   # what the write below makes visible, before anything else runs
            outcomes = self.applier.commit(held)
            self._leases_changed()
            entries = entries[len(held.entries):]
        if entries or held is None:
            outcomes.update(self.applier.apply_entries(entries, resume=resume))
            self._leases_changed()
        halt = self.applier.halt
        if halt is not None and halt is not before:
            self.lease_clock = None
            logger.critical("%s", halt.describe(self.name))
        return outcomes

    def apply_answering(self, entries: Sequence[Entry],
                        answer: Callable[[dict[int, Outcome]], None]) -> dict[int, Outcome]:
        """`apply`, calling `answer(outcomes)` first when the entries are the speculation held: their
        outcomes are known, only the write is left, and it follows in this call (nothing of the loop runs
        between, so no read sees the views without them after a caller was answered). A caller told at
        once (a client's write) replies a RocksDB write sooner. Other entries: `apply` alone."""
        return self.apply(entries, answer=answer)

    def speculate(self, entries: Sequence[Entry]) -> None:
        """Entries this node appended as the leader and nobody acknowledged yet: prepare applying them now,
        while the followers store them, so that their commit only writes what this prepared
        (`Applier.prepare`; a write's path: its commit, apply and reply follow the follower's
        acknowledgement at once). Only right after the applied offset, not halted, nothing held yet, at
        most SPECULATE_BYTES; an entry that would halt or raise the views format level is left to its
        apply, and so is one whose preparing raises. Whatever comes instead of their commit abandons it
        (`apply` of other entries, a snapshot's restore, a skip, another writer of the store): the work is
        lost, never its outcome."""
        applier = self.applier
        if (self._speculation is not None or applier.halt is not None or not entries
                or entries[0].index != self.store.applied + 1
                or any(e.kind is not EntryKind.NORMAL for e in entries)
                or sum(len(e.data) for e in entries) > SPECULATE_BYTES):
            return
        level, access = applier.level, applier.access_changes
        try:
            prepared = applier.prepare(entries)
        except Exception:   # noqa: BLE001 - their apply meets it again, and fails the group if it must
            applier.recover(None, access)
            self.speculations.failed += 1
            return
        if applier.halt is not None or applier.level != level:
            applier.abandon(prepared)   # applied at its commit, which logs the halt or raises the level
            return
        self._speculation = prepared
        self.speculations.prepared += 1

    def _settle(self, entries: Sequence[Entry]) -> Prepared | None:
        """The speculation held, if `entries` begin with its entries and nothing wrote the store since
        (then the caller commits it); else abandon it (None)."""
        held, self._speculation = self._speculation, None
        if held is None:
            return None
        spec = held.entries
        if (len(entries) >= len(spec) and held.store_writes == self.store.writes
                and all(a.index == b.index and a.term == b.term and a.count == b.count
                        for a, b in zip(entries, spec))):
            self.speculations.committed += 1
            return held
        self.applier.abandon(held)
        self.speculations.abandoned += 1
        return None

    def _leases_changed(self) -> None:
        """Tell the leader's lease clocks what the last commit granted and ended."""
        clock = self.lease_clock
        if clock is not None and self.applier.lease_changes:
            now = time.monotonic()
            for lease_id, ttl_ms, offset in self.applier.lease_changes:
                if ttl_ms:
                    clock.granted(lease_id, ttl_ms, offset, now)
                else:
                    clock.ended(lease_id)

    def expect(self, records: Iterable[tuple[bytes, bytes, Event]]) -> None:
        """Records this node proposes as the leader, with their checked events (`Applier.expect`)."""
        self.applier.expect(records)

    def proposed(self, index: int, data: bytes, records: list[tuple[bytes | None, bytes | None]]) -> None:
        """An entry this node proposes as the leader, its batch and records (`Applier.proposed`)."""
        self.applier.proposed(index, data, records)

    @property
    def views_format(self) -> int:
        """The format level the views are written at (statemachines/views_format.py)."""
        return self.applier.level

    def on_tick(self, leader: bool) -> list[tuple[bytes, bytes]]:
        """Called by the group every tick: on the leader, the LeaseExpired events to propose, and a raise
        of the views format level as soon as every member can apply it (checked every tick below the newest
        level; proposed again at most every FORMAT_CHECK_S while it is not applied)."""
        if not leader or self.applier.halt is not None:
            self.lease_clock = None
            return []
        now = time.monotonic()
        records = [event_record(LeaseExpired(lease_id=lease_id, actor="epochlog/leader",
                                             request_id=f"expire/{lease_id}/{version}"))
                   for lease_id, version in self._leader_clock(now).expired(now)]
        if (self.format_support is not None and self.applier.level < views_format.LATEST
                and now - self._format_proposed_at >= FORMAT_CHECK_S):
            level = views_format.level_to_propose(self.applier.level, self.format_support())
            if level is not None:
                self._format_proposed_at = now
                logger.info("group %s: every member applies views format level %s: raising it from %s",
                            self.name, level, self.applier.level)
                records.append(event_record(ViewsFormatRaised(level=level, v=level, actor="epochlog/leader")))
        return records

    def keepalive(self, lease_id: int) -> int | None:
        """Restart a lease's clock (call on the leader); its TTL in ms, or None if there is no such lease."""
        now = time.monotonic()
        return self._leader_clock(now).keepalive(lease_id, now)

    def _leader_clock(self, now: float) -> LeaseClock:
        if self.lease_clock is None:
            # A new leader restarts every lease's clock in full: it cannot know when its
            # predecessor last heard a keepalive, and cutting a lease short is the one thing not allowed.
            leases = [decode_state(k, v) for k, v in self.store.scan_prefix("leases", b"lease/")]
            self.lease_clock = LeaseClock(((s.lease_id, s.ttl_ms, s.version) for s in leases
                                           if isinstance(s, LeaseState)), now)
        return self.lease_clock

    def skip(self, offset: int) -> None:
        """Skip the record this group halted at (durably); `resume` then applies past it."""
        self._settle(())
        self.applier.skip(offset)
        logger.warning("group %s: the record at offset %s is skipped by the operator", self.name, offset)

    def resume(self, read: Callable[[int], Sequence[Entry]], handed_out: Callable[[], int]) -> Halt | None:
        """Apply, from the log, what the group handed over while this was halted; clear the halt once
        caught up. `read(offset)` gives entries from `offset` on (some, not necessarily all), and
        `handed_out()` the last offset the group handed over. Returns the halt still in force (None:
        applying goes on), e.g. at a later record this code cannot apply either.

        Synchronous in chunks of what `read` returns; call it again while it returns the same halt
        with `applied_index < handed_out()` (the caller may yield to the loop between calls)."""
        halt = self.applier.halt
        if halt is None:
            return None
        target = handed_out()
        if self.applied_index < target:
            self.apply(read(self.applied_index + 1), resume=True)
        if self.applier.halt is halt and self.applied_index >= handed_out():
            self.applier.halt = None
            logger.warning("group %s: applying again from offset %s", self.name, self.applied_index + 1)
        return self.applier.halt

    def write_snapshot(self, path: Path) -> None:
        self.store.write_snapshot(path)

    def snapshot_job(self) -> Callable[[Path], int]:
        """A function that writes a snapshot from another thread while applies go on (RaftGroup runs it
        off its loop) and returns the applied offset it holds. Call this on the loop.

        rocksdict holds the GIL while it makes a checkpoint (~25 ms with full memtables, stalling the
        loop as much), not while it flushes: so the thread flushes the memtables first, the checkpoint
        itself (a few ms of hard links) runs on the loop, where no apply can come between it and the
        applied offset it records, and the thread packs it. A restore waits for the flush (it replaces
        the store); a snapshot whose store was replaced meanwhile is abandoned."""
        loop = asyncio.get_running_loop()
        store = self.store

        def write(path: Path) -> int:
            with self._flushing:
                if self.store is not store:
                    raise EpochlogError("the views were replaced by a snapshot from the leader: snapshot abandoned")
                store.flush()
            ckpt = path.with_name(path.name + ".ckpt")
            taken: concurrent.futures.Future[int] = concurrent.futures.Future()

            def checkpoint() -> None:
                if not taken.set_running_or_notify_cancel():
                    return
                try:
                    if self.store is not store:
                        raise EpochlogError("the views were replaced by a snapshot from the leader: snapshot "
                                            "abandoned")
                    taken.set_result(store.checkpoint(ckpt))
                except BaseException as exc:  # handed to the thread waiting for it
                    taken.set_exception(exc)

            loop.call_soon_threadsafe(checkpoint)
            applied = taken.result()
            store.pack_checkpoint(ckpt, path)
            return applied

        return write

    # --- history pruning (statemachines/prune.py) ------------------------------------------------

    def prune_step(self, max_rows: int, max_seconds: float = 0.002, *, eager: bool = False) -> PruneStep:
        """Delete a bounded chunk of the history rows the floor hides (call from the group's loop). A chunk
        that deletes rows abandons a held `speculate` at the next apply (the store was written)."""
        return self.pruner.step(self.store, max_rows, max_seconds, eager=eager)

    def reclaim_space(self) -> concurrent.futures.Future[None] | None:
        """Compact the history column family in a thread (RocksDB frees the pruned rows' space); None
        when a compaction is already running. Restore and close wait for it."""
        if self._reclaiming is not None and not self._reclaiming.done():
            return None
        if self._reclaimer is None:
            self._reclaimer = concurrent.futures.ThreadPoolExecutor(1, "views-reclaim")
        self._reclaiming = self._reclaimer.submit(reclaim, self.store)
        return self._reclaiming

    def _wait_reclaim(self) -> None:
        if self._reclaiming is not None:
            concurrent.futures.wait([self._reclaiming])
            self._reclaiming = None

    def restore(self, path: Path, meta: SnapshotMeta) -> None:
        self._wait_reclaim()
        with self._flushing:   # a snapshot thread flushing the store being replaced
            self._restore(path, meta)

    def _restore(self, path: Path, meta: SnapshotMeta) -> None:
        self._settle(())   # before the store (and applier) it was prepared on is replaced
        restore, old = self.base / "views.restore", self.base / "views.old"
        ViewStore.unpack_snapshot(path, restore)
        fsync_dir(restore)
        self.store.close()
        os.rename(self.path, old)
        os.rename(restore, self.path)
        fsync_dir(self.base)
        shutil.rmtree(old, ignore_errors=True)
        self.store = ViewStore.open(self.path, self.config)
        self.applier = Applier(self.store, self.config)
        assert self.store.applied == meta.index, (self.store.applied, meta.index)

    def close(self) -> None:
        self._wait_reclaim()
        with self._flushing:
            pass   # a snapshot thread's flush is over
        if self._reclaimer is not None:
            self._reclaimer.shutdown(wait=True)
        self.store.close()
