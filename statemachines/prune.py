"""Deleting the history rows below the history floor, a bounded chunk at a time.

Theory of operation. The floor F is committed (`HistoryPruned`, statemachines/apply.py), so every
replica agrees on it at every offset; the reads (statemachines/query.py) already ignore every row it
hides. This module only reclaims their space, on each replica at its own pace, outside the apply
path: its deletions are not in the digest and change no answer. For each entity the rows hidden by F
are every row older than its newest row at or below F, and that newest row too when it is a deletion
below F (the entity did not exist at F); at views format level 2, that newest row too when the entity
row holds a newer state at or below F (views_format.py: the latest state has no row). Rows at or above F are never touched (so whether an event
at or above F changed the views can still be told from its row), and rows written after the pass
started are above F (a floor is never beyond its own offset).

A pass visits the entities of the `versions` column family in key order from a cursor: per entity it
seeks to the entity's first row, reads its rows up to F and seeks past the entity (no seek when it read
the entity to its end: the iterator stands on the next entity then), so the rows kept above F (most of
them, with a short retention) are never read. An entity's hidden rows are contiguous
(from its first row to its newest at or below F); they are deleted one by one (range deletions would
save the next passes stepping over tombstones, but RocksDB re-fragments every range tombstone of the
memtable for each new iterator: with one per entity per pass, seeks slowed to ~0.1 ms each and reads
with them). RocksDB drops the tombstones when it compacts (`reclaim`). A `step` examines at most
`max_rows` rows (a seek counts as one) for at most `max_seconds`, and deletes in one WriteBatch (no
meta key is written, so a kill at any moment leaves a store that answers exactly as before: the next
pass deletes what this one did not).
A pass starts when the floor has risen above the one the last pass completed by at least twice the
number of entities that pass visited (a pass costs a seek per entity, whatever it deletes: so each
seek pays for a deleted row or more, and at most that many hidden rows wait for the next pass); the
first pass after a restart walks everything once. RocksDB reclaims the space as it compacts; `reclaim` asks it to
compact the versions column family now (run it in a thread: rocksdict releases the GIL there).

Not thread-safe: call `step` from the group's loop (the store's one user).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from statemachines import views_format
from statemachines.state import decode_state, decode_version
from statemachines.store import ViewStore, cf_for, decode_offset


@dataclass(frozen=True, slots=True)
class PruneStep:
    """What one step did."""

    examined: int
    deleted: int
    pass_done: bool
    seconds: float


@dataclass(slots=True)
class PruneCounters:
    """Pruning of one group's history on this node since it started."""

    passes: int = 0                 # completed passes
    rows_deleted: int = 0
    pruned_floor: int = 0           # every row hidden by this floor is deleted (the last completed pass's)
    pass_floor: int = 0             # the floor of the pass under way (0: none)
    last_step_seconds: float = 0.0
    max_step_seconds: float = 0.0
    last_pass_seconds: float = 0.0
    last_pass_at: float = 0.0       # time.time() when the last pass completed


class HistoryPruner:
    """Deletes the `versions` rows a store's history floor hides (see the module docstring)."""

    def __init__(self) -> None:
        self.counters = PruneCounters()
        self._store: ViewStore | None = None
        self._cursor: bytes | None = None        # where the next step seeks (None: no pass under way)
        self._entities = 0                       # entities the pass under way visited so far
        self._last_entities = 0                  # ... and the last completed pass in all
        self._pass_started = 0.0

    @property
    def busy(self) -> bool:
        return self._cursor is not None

    def step(self, store: ViewStore, max_rows: int, max_seconds: float = 0.002, *, eager: bool = False
             ) -> PruneStep:
        """Examine at most `max_rows` history rows (for about `max_seconds` at most) and delete those
        the floor hides. `eager`: start a pass as soon as the floor rose at all."""
        started = time.perf_counter()
        if store is not self._store:        # first call, or the views were replaced by a snapshot
            self._store, self._cursor = store, None
            self.counters.pruned_floor = self._last_entities = 0
        c = self.counters
        if self._cursor is None:
            floor = store.history_floor
            if floor <= c.pruned_floor or (not eager and floor - c.pruned_floor < 2 * self._last_entities):
                return PruneStep(0, 0, False, time.perf_counter() - started)
            self._cursor, c.pass_floor, self._entities = b"", floor, 0
            self._pass_started = time.perf_counter()
        floor = c.pass_floor
        budget = max(max_rows, 3)   # a seek and two rows: every step gets past at least one row
        deadline = started + max_seconds
        doomed: list[bytes] = []
        examined = 0
        done = False
        it = store.cfs["versions"].iter()
        # At views format level 2 an entity's newest state may be its entity row alone (views_format.py).
        level2 = views_format.decode_level(store.meta(views_format.META_KEY)) >= 2
        cursor = self._cursor
        at_cursor = False   # the iterator already stands where `it.seek(cursor)` would put it
        entities = 0
        while examined < budget:
            entities += 1
            if entities % 32 == 0 and time.perf_counter() > deadline:
                break
            if not at_cursor:
                it.seek(cursor)
            examined += 1   # a seek, or the step past the last entity that made one needless
            at_cursor = False
            if not it.valid():
                done = True
                break
            first = it.key()
            entity = first[:-9]
            self._entities += 1
            newest: bytes | None = None   # key of the newest row at or below F seen
            newest_value: bytes | None = None   # its value, when read on the way (the entity's first row)
            complete = False
            all_below = False   # every row of the entity is at or below F
            while True:
                if not it.valid():
                    complete = at_cursor = all_below = True   # the end: seeking past the entity finds nothing either
                    break
                key = it.key()
                if key[:-9] != entity:
                    # The next entity's first row: the first key >= entity + b"\x01" (entity keys hold
                    # no NUL), where the next visit would seek to.
                    complete = at_cursor = all_below = True
                    break
                if decode_offset(key[-8:]) > floor:
                    complete = True
                    break
                if examined >= budget or (examined % 64 == 0 and time.perf_counter() > deadline):
                    budget = examined   # out of time: this entity is the step's last
                    break
                if newest is not None:
                    doomed.append(newest)      # an older row than this one, both at or below F
                    newest_value = None
                else:
                    newest_value = it.value()   # most entities below F have one row: no seek back for it
                newest = key
                examined += 1
                it.next()
            if complete and newest is not None and decode_offset(newest[-8:]) < floor:
                if newest_value is None:
                    it.seek(newest)
                    newest_value = it.value()
                    at_cursor = False
                if decode_version(newest_value).state is None:
                    doomed.append(newest)      # the entity's state at F is "deleted": nothing to keep
                elif level2 and all_below and _superseded_at(store, entity, decode_offset(newest[-8:]), floor):
                    doomed.append(newest)      # its state at F is the entity row's, newer than this row
            if not complete:
                # Out of budget inside the entity: the newest row seen may not be its newest at or
                # below F, so it stays for now and the next step reads the entity on from it.
                cursor = first if newest is None else newest
                break
            cursor = entity + b"\x01"          # past every row of the entity (entity keys hold no NUL)
        self._cursor = cursor
        if doomed:
            batch = store.new_batch()
            for key in doomed:
                store.delete(batch, "versions", key)
            store.write(batch)
        deleted = len(doomed)
        seconds = time.perf_counter() - started
        c.rows_deleted += deleted
        c.last_step_seconds = seconds
        c.max_step_seconds = max(c.max_step_seconds, seconds)
        if done:
            self._cursor = None
            self._last_entities = self._entities
            c.passes += 1
            c.pruned_floor = floor
            c.pass_floor = 0
            c.last_pass_seconds = time.perf_counter() - self._pass_started
            c.last_pass_at = time.time()
        return PruneStep(examined, deleted, done, seconds)


def _superseded_at(store: ViewStore, entity: bytes, offset: int, floor: int) -> bool:
    """Whether the entity's current state (its entity row) is newer than `offset` and at or below the
    floor: then it, not the row at `offset`, is the entity's state at the floor."""
    raw = store.get(cf_for(entity), entity)
    if raw is None:
        return False
    version: int = decode_state(entity, raw).version  # type: ignore[attr-defined]
    return offset < version <= floor


RECLAIMED_CFS = ("versions", "dedupe", "dedupe_expiry")
"""The column families whose rows retention deletes (history rows here, request ids in apply)."""


def reclaim(store: ViewStore) -> None:
    """Compact the column families retention deletes from, so RocksDB drops the deleted rows from its
    files now (blocking: run it in a thread, and keep the store open until it returns)."""
    for cf in RECLAIMED_CFS:
        store.cfs[cf].compact_range(None, None)
