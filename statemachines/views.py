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

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from eventlog.fileutil import fsync_dir
from eventlog.raft.types import Entry, SnapshotMeta
from statemachines.apply import Applier, Halt
from statemachines.events import LeaseExpired, event_record
from statemachines.leases import LeaseClock
from statemachines.state import LeaseState, Outcome, decode_state
from statemachines.store import DIGEST, ViewsConfig, ViewStore

logger = logging.getLogger(__name__)


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

    def apply(self, entries: Sequence[Entry], *, resume: bool = False) -> dict[int, Outcome]:
        before = self.applier.halt
        outcomes = self.applier.apply_entries(entries, resume=resume)
        halt = self.applier.halt
        if halt is not None and halt is not before:
            self.lease_clock = None
            logger.critical("%s", halt.describe(self.name))
        clock = self.lease_clock
        if clock is not None and self.applier.lease_changes:
            now = time.monotonic()
            for lease_id, ttl_ms, offset in self.applier.lease_changes:
                if ttl_ms:
                    clock.granted(lease_id, ttl_ms, offset, now)
                else:
                    clock.ended(lease_id)
        return outcomes

    def on_tick(self, leader: bool) -> list[tuple[bytes, bytes]]:
        """Called by the group every tick: on the leader, the LeaseExpired events to propose."""
        if not leader or self.applier.halt is not None:
            self.lease_clock = None
            return []
        now = time.monotonic()
        return [event_record(LeaseExpired(lease_id=lease_id, actor="epochlog/leader",
                                          request_id=f"expire/{lease_id}/{version}"))
                for lease_id, version in self._leader_clock(now).expired(now)]

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

    def restore(self, path: Path, meta: SnapshotMeta) -> None:
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
        self.store.close()
