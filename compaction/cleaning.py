"""Key compaction on the node: which groups, below which offset, with which no-ops, and what it did.

Theory of operation. Each group has a cleanup policy (`[compaction] compact_groups`, Kafka's
`cleanup.policy`): `delete` groups have their log truncated below the horizon (compaction/service.py);
`compact` groups never do (only a follower's snapshot install resets a log), and their log below
the horizon is key-compacted instead, by one `LogCleaner` per node (its own thread, each pass's CPU
work in a worker process: compaction/cleaner.py):

- After every retention check the service hands each compact group's horizon here. The offset below
  which its log may be cleaned is min(the horizon's log floor, commit offset + 1), the log floor
  being min(policy, export pins, snapshot + 1): the cleaner's own constraint (Raft serves no entry
  below the cleaned range, so a follower that needs one must be able to get a snapshot), and no
  record that a reader or an export still needs record by record is rewritten.
- A pass is submitted when the log holds sealed segments below that offset that the cleaner has not
  judged and the dirty ratio calls for it (`compaction.rewrite.skip_reason`, asked here first so no
  worker process starts for nothing), and no pass of the group is under way.
- What a record sets comes from `compaction.event_keys` (whole entity, an aspect, part of it, or
  never compacted). Records that changed nothing when applied are dropped and supersede nothing:
  as the pass starts (in the cleaner's thread), it asks this module for the offsets of the `noops`
  rows (statemachines/noops.py) in [its dirty offset, its horizon); the rows are read on the event
  loop (the views' one user) in chunks of NOOPS_CHUNK, so a range with many no-ops does not hold
  the loop.
- Rows of records the log no longer holds as written (below the cleaner's dirty offset, or below the
  log start) are deleted afterwards, a bounded chunk per pruning round (`forget_noops`).

Call everything but the no-op look-up from the node's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from compaction.cleaner import CleanerAbortedError, CleanResult, LogCleaner, skip_reason
from compaction.config import CleanerConfig, CompactionConfig
from compaction.event_keys import compaction_key, is_delete
from compaction.policy import Horizon
from eventlog.raft.runtime.group import RaftGroup
from statemachines import noops
from statemachines.views import ViewsStateMachine

logger = logging.getLogger(__name__)

NOOPS_CHUNK = 5_000
"""`noops` rows read per turn of the event loop when a pass asks for its no-op offsets."""
NOOPS_FETCH_TIMEOUT_S = 120.0
FORGET_CHUNK = 2_000
"""`noops` rows deleted per group and pruning round at most."""


@dataclass(slots=True)
class GroupCleaning:
    """Key compaction of one group on this node since it started (status, metrics)."""

    policy: str                           # "compact" or "delete"
    clean_below: int = -1                 # the offset the next pass cleans below, as of the last check
    running: bool = False
    passes: int = 0                       # passes that rewrote segments
    passes_failed: int = 0
    bytes_reclaimed: int = 0
    records_dropped: int = 0
    noops_dropped: int = 0
    tombstones_dropped: int = 0
    last: CleanResult | None = None       # the last pass that ran (skipped ones are in `waiting`)
    last_error: str = ""
    last_finished_at: float = 0.0         # time.time() of the last pass's end (0: none yet)
    waiting: str = ""                     # why no pass runs now (the dirty ratio, nothing below...)
    noops_forgotten: int = 0              # `noops` rows deleted
    noops_floor: int = 0                  # no row below this is left (this node's own pace)
    noops_store: int = 0                  # id() of the store the floor is about (a restore replaces it)


class NodeCleaner:
    """The key compaction of a node's compact groups (see the module docstring)."""

    def __init__(self, config: CompactionConfig, cleaner_config: CleanerConfig,
                 groups: Callable[[], Mapping[str, RaftGroup]], views: Mapping[str, ViewsStateMachine]) -> None:
        self.config = config
        self.cleaner_config = cleaner_config
        self._groups = groups
        self._views = views
        self.groups: dict[str, GroupCleaning] = {}
        self._cleaner: LogCleaner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def state(self, name: str) -> GroupCleaning:
        state = self.groups.get(name)
        if state is None:
            state = self.groups[name] = GroupCleaning(self.config.cleanup_policy(name))
        return state

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.config.compact_groups and self.cleaner_config.enabled:
            self._cleaner = LogCleaner(self.cleaner_config, record_key_of=compaction_key, is_tombstone=is_delete,
                                       name="log-cleaner")

    async def stop(self) -> None:
        """Stop the cleaner: a pass under way stops (its worker killed; what it swapped in stays). The
        loop keeps running meanwhile (the pass may be waiting for its no-op offsets from it)."""
        cleaner, self._cleaner = self._cleaner, None
        if cleaner is not None:
            await asyncio.get_running_loop().run_in_executor(None, cleaner.close)

    # --- after every retention check ---------------------------------------------------------------

    def check(self, name: str, group: RaftGroup, h: Horizon) -> None:
        """Submit a pass of `name`'s log when it is compact and one is worth running."""
        state = self.state(name)
        if state.policy != "compact":
            return
        log = group.storage.log
        below = min(h.cleanable_below(), group.node.log.committed + 1, group.storage.snapshot().index + 1)
        state.clean_below = below
        if self._cleaner is None:
            state.waiting = "the cleaner is disabled ([compaction.cleaner] enabled = false)"
            return
        if state.running or group.stopped or log.failure is not None:
            return
        segments = log.cleanable_segments(below)
        waiting = skip_reason(list(segments.segments), segments.dirty_offset, self.cleaner_config)
        if waiting is not None:
            state.waiting = waiting
            return
        state.waiting = ""
        state.running = True
        try:
            future = self._cleaner.submit(log, below, drop_offsets=self._noop_lookup(name))
        except CleanerAbortedError:   # closing
            state.running = False
            return
        loop = asyncio.get_running_loop()

        def done(f: Future[CleanResult]) -> None:
            try:
                loop.call_soon_threadsafe(self._finished, name, f)
            except RuntimeError:
                pass   # the loop is closed: the node is gone
        future.add_done_callback(done)

    def _finished(self, name: str, future: Future[CleanResult]) -> None:
        state = self.state(name)
        state.running = False
        state.last_finished_at = time.time()
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            if not isinstance(exc, CleanerAbortedError):
                state.passes_failed += 1
                state.last_error = str(exc)
                logger.warning("compaction: group %s: cleaning pass failed (the next check retries): %s", name, exc)
            return
        result = future.result()
        if result.skipped:
            state.waiting = result.skipped
            return
        state.last = result
        state.last_error = ""
        if result.segments_before:
            state.passes += 1
        state.bytes_reclaimed += max(0, result.bytes_before - result.bytes_after)
        state.records_dropped += result.records_dropped
        state.noops_dropped += result.noops_dropped
        state.tombstones_dropped += result.tombstones_dropped

    def _noop_lookup(self, name: str) -> Callable[[int, int], list[int]]:
        """What the pass calls, in the cleaner's thread, for the no-op offsets of [lo, hi)."""
        loop = self._loop
        assert loop is not None

        def lookup(lo: int, hi: int) -> list[int]:
            return asyncio.run_coroutine_threadsafe(self._noop_offsets(name, lo, hi), loop).result(
                NOOPS_FETCH_TIMEOUT_S)
        return lookup

    async def _noop_offsets(self, name: str, lo: int, hi: int) -> list[int]:
        out: list[int] = []
        cursor = lo
        while True:
            chunk = noops.noop_offsets(self._views[name].store, cursor, hi, NOOPS_CHUNK)
            out += chunk
            if len(chunk) < NOOPS_CHUNK:
                return out
            cursor = chunk[-1] + 1
            await asyncio.sleep(0)

    # --- forgetting no-op rows ------------------------------------------------------------------

    def forget_noops(self, name: str, group: RaftGroup, views: ViewsStateMachine) -> int:
        """Delete one bounded chunk of `noops` rows the log no longer needs: below the log start, and
        for a compact group below the cleaner's dirty offset (every record below it was judged by a
        pass, which dropped the no-ops). Rows deleted."""
        state = self.state(name)
        log = group.storage.log
        floor = log.cleaner_dirty_offset if state.policy == "compact" else log.start_offset
        store = views.store
        if state.noops_store != id(store):   # a snapshot restore replaced the views: start over
            state.noops_store, state.noops_floor = id(store), 0
        if floor <= state.noops_floor:
            return 0
        deleted, state.noops_floor = noops.forget_below(store, floor, FORGET_CHUNK, state.noops_floor)
        state.noops_forgotten += deleted
        return deleted
