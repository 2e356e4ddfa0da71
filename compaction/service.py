"""Retention on one node: horizons, the committed history floor, log truncation, pruning, free space.

Theory of operation. Every `check_interval_ms` the service computes each group's horizon
(compaction/policy.py) from what this node sees: its applied offset, its log segments, its latest
snapshot and the export watermarks recorded in the metadata group. Then, per group:

- on the group's leader, when the horizon's history floor has risen by `PROPOSE_MIN_STEP` offsets
  or more above the committed one, it proposes `HistoryPruned(floor)`: committed like any event, it
  moves the floor on every replica at the same offset (so replicas agree on every `as_of` answer and
  on the digest). Requiring a step keeps an idle group quiet: the event itself advances the applied
  offset by one, which must not call for another;
- it truncates the log (`RaftGroup.truncate_log`: whole segments below min(snapshot, horizon)),
  which also happens after every snapshot, through `retention_floor`;
- it warns once per table when an export pin gets capped (`export_max_pin_*`).

Every `prune_interval_ms` each group's views delete one bounded chunk (`prune_chunk_rows`, at most
PRUNE_STEP_S of the loop) of the history rows the floor hides (statemachines/prune.py); while a pass
is under way the chunks follow each other with a 1 ms pause, so pruning keeps up with any write rate
without holding the loop. After a pass that deleted many rows, RocksDB compacts the pruned column
families in a thread to give the space back. The free space of the data directory is measured
with every check; below `min_free_disk_bytes` the groups refuse writes (`space_guard`).

Groups listed in `compact_groups` are never truncated: their log below the horizon is key-compacted
instead (compaction/cleaning.py, driven from every check); the pruning rounds also delete the
`noops` rows of records the log no longer holds as written. `on_check` callbacks run after every
check with each group's horizon.

Call everything from the node's event loop; every step is short (a chunk, a few file renames), and
what is slow (unlinking segments, writing snapshots, RocksDB compaction) runs in threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from compaction.cleaning import NodeCleaner
from compaction.config import CleanerConfig, CompactionConfig
from compaction.policy import GroupFacts, Horizon, SegmentSpan, horizon
from eventlog.cancellation import cancel_and_wait
from eventlog.errors import EpochlogError
from eventlog.raft.node import Role
from eventlog.raft.runtime.group import RaftGroup
from statemachines import events as ev
from statemachines.views import ViewsStateMachine

logger = logging.getLogger(__name__)

PROPOSE_MIN_STEP = 64
"""The history floor is proposed only when the horizon rose this many offsets above it."""
PRUNE_STEP_S = 0.0005
"""A pruning chunk stops after this long on the event loop, whatever its row budget."""
RECLAIM_MIN_ROWS = 20_000
"""RocksDB compacts the history column family after a pass once this many rows were deleted."""
ACTOR = "epochlog/compaction"

HorizonCallback = Callable[[str, Horizon], None]


@dataclass(slots=True)
class GroupRetention:
    """What the service did for one group on this node (status and metrics)."""

    horizon: Horizon | None = None
    last_check_at: float = 0.0          # time.time() of the last check (0: none yet)
    last_check_seconds: float = 0.0
    floors_proposed: int = 0
    last_proposed_floor: int = -1
    proposing: bool = False
    capped_warned: set[tuple[str, str]] = field(default_factory=set)
    rows_since_reclaim: int = 0
    reclaims: int = 0
    last_reclaim_seconds: float = 0.0


class CompactionService:
    """Retention of every group of one node (see the module docstring)."""

    def __init__(self, config: CompactionConfig, groups: Callable[[], Mapping[str, RaftGroup]],
                 views: Mapping[str, ViewsStateMachine], export_watermarks: Callable[[str], dict[str, int]],
                 data_dir: Path, cleaner_config: CleanerConfig | None = None) -> None:
        self.config = config
        self.cleaning = NodeCleaner(config, cleaner_config or CleanerConfig(), groups, views)
        self._groups = groups
        self._views = views
        self._export_watermarks = export_watermarks
        self.data_dir = data_dir
        self.groups: dict[str, GroupRetention] = {}
        self.free_disk_bytes = -1
        self._space_reason: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.on_check: list[HorizonCallback] = []

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.cleaning.start()
        self._tasks = [loop.create_task(self._every(self.config.check_interval_ms, self.check), name="compaction-check")]
        if self.config.prune_interval_ms:
            self._tasks.append(loop.create_task(self._prune_loop(), name="compaction-prune"))

    async def stop(self) -> None:
        await self.cleaning.stop()
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def _prune_loop(self) -> None:
        while True:
            busy = False
            try:
                busy = self.prune()
            except (EpochlogError, OSError) as exc:   # a group stopping: next round
                logger.warning("compaction: %s", exc)
            await asyncio.sleep(0.001 if busy else self.config.prune_interval_ms / 1000)

    async def _every(self, interval_ms: int, work: Callable[[], None]) -> None:
        while True:
            try:
                work()
            except (EpochlogError, OSError) as exc:   # a group stopping, a full disk: next round
                logger.warning("compaction: %s", exc)
            await asyncio.sleep(interval_ms / 1000)

    # --- hooks the runtime calls -------------------------------------------------------------------

    def retention_floor(self, group: str) -> int | None:
        """The lowest offset `group`'s log must keep besides what its snapshot needs (RaftGroup hook):
        0 for a compact group (never truncated: it is key-compacted instead)."""
        if self.config.cleanup_policy(group) == "compact":
            return 0
        h = self.horizon_of(group)
        return None if h is None else h.history_floor

    def ships_log_prefix(self, group: str) -> bool:
        """Whether `group`'s snapshots carry its log below them to a follower (NodeHost hook): a compact
        group's key-compacted log is its Kafka topic's history, which a follower that installs a
        snapshot must keep (eventlog/raft/runtime/snapshot_image.py)."""
        return self.config.cleanup_policy(group) == "compact"

    def space_guard(self) -> str | None:
        """Why the groups must refuse writes for lack of free space (RaftGroup hook), or None."""
        return self._space_reason

    def cleanable_below(self, group: str) -> int | None:
        """The offset below which the key-compaction cleaner may rewrite `group`'s sealed segments
        (the horizon's log floor; compaction/cleaning.py also keeps it at or below the commit offset + 1)."""
        state = self.groups.get(group)
        return None if state is None or state.horizon is None else state.horizon.cleanable_below()

    # --- the work ----------------------------------------------------------------------------------

    def horizon_of(self, name: str) -> Horizon | None:
        """`name`'s horizon as this node sees it now (None: no such group or views)."""
        group = self._groups().get(name)
        views = self._views.get(name)
        if group is None or views is None or group.stopped:
            return None
        log = group.storage.log

        def offset_at_ms(t: int) -> int:
            found = log.offset_for_timestamp(t)
            return log.end_offset if found is None else found

        facts = GroupFacts(name, views.applied_index, [SegmentSpan(*s) for s in log.segment_spans()],
                           group.storage.snapshot().index, self._export_watermarks(name), int(time.time() * 1000),
                           offset_at_ms)
        return horizon(facts, self.config)

    def check(self) -> None:
        """One round over every group: horizon, history floor proposal, truncation, warnings."""
        self._measure_free_space()
        for name, group in self._groups().items():
            started = time.perf_counter()
            h = self.horizon_of(name)
            if h is None:
                continue
            state = self.groups.setdefault(name, GroupRetention())
            state.horizon = h
            self._warn_capped(name, state, h)
            self._propose_floor(name, group, state, h)
            group.truncate_log()
            self.cleaning.check(name, group, h)
            for callback in self.on_check:
                callback(name, h)
            state.last_check_seconds = time.perf_counter() - started
            state.last_check_at = time.time()

    def prune(self) -> bool:
        """One bounded chunk of history pruning per group; RocksDB compaction after big passes. Whether
        a pass is still under way in some group."""
        busy = False
        for name, views in self._views.items():
            group = self._groups().get(name)
            if group is None or group.stopped:
                continue
            step = views.prune_step(self.config.prune_chunk_rows, PRUNE_STEP_S)
            busy = busy or views.pruner.busy
            self.cleaning.forget_noops(name, group, views)
            state = self.groups.setdefault(name, GroupRetention())
            state.rows_since_reclaim += step.deleted
            if step.pass_done and state.rows_since_reclaim >= RECLAIM_MIN_ROWS:
                future = views.reclaim_space()
                if future is not None:
                    state.rows_since_reclaim = 0
                    state.reclaims += 1
                    started = time.perf_counter()

                    def done(f: object, state: GroupRetention = state, started: float = started) -> None:
                        state.last_reclaim_seconds = time.perf_counter() - started
                    future.add_done_callback(done)
        return busy

    def _propose_floor(self, name: str, group: RaftGroup, state: GroupRetention, h: Horizon) -> None:
        if group.node.role is not Role.LEADER or state.proposing or group.disk_full:
            return
        committed = self._views[name].store.history_floor
        if h.history_floor < committed + PROPOSE_MIN_STEP:
            return
        state.proposing = True
        record = ev.event_record(ev.HistoryPruned(floor=h.history_floor, actor=ACTOR))

        async def propose() -> None:
            try:
                await group.submit([record])
                state.floors_proposed += 1
                state.last_proposed_floor = h.history_floor
            except EpochlogError as exc:   # leadership moved, the disk is full...: the next check retries
                logger.info("compaction: group %s: history floor %s not committed: %s", name, h.history_floor, exc)
            finally:
                state.proposing = False

        asyncio.get_running_loop().create_task(propose(), name=f"history-floor-{name}")

    def _warn_capped(self, name: str, state: GroupRetention, h: Horizon) -> None:
        capped = {(p.table, p.capped_by or "") for p in h.capped_pins}
        for pin in h.capped_pins:
            if (pin.table, pin.capped_by or "") not in state.capped_warned:
                logger.warning("compaction: group %s: export table %s (watermark %s) pins more than %s allows: "
                               "its pin is capped at offset %s, events below it may leave the log before the "
                               "table has them (release it: epochlog export --to PATH --release)",
                               name, pin.table, pin.watermark, pin.capped_by, pin.floor)
        state.capped_warned = capped

    def _measure_free_space(self) -> None:
        try:
            st = os.statvfs(self.data_dir)
        except OSError as exc:
            logger.warning("compaction: cannot measure free space of %s: %s", self.data_dir, exc)
            return
        self.free_disk_bytes = st.f_bavail * st.f_frsize
        reserve = self.config.min_free_disk_bytes
        if reserve and self.free_disk_bytes < reserve:
            self._space_reason = (f"{self.free_disk_bytes} bytes free on {self.data_dir}, below "
                                  f"[compaction] min_free_disk_bytes = {reserve}")
        else:
            self._space_reason = None


def allocated_bytes(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (as `du` counts them)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass   # removed while we walked (a compacted SST, an unlinked segment)
    return total
