"""Groups halted on this node: a committed record this node's code cannot apply (statemachines/apply.py).

A halted group stops applying before that record, and only on this node: the process, its other
groups and the group's Raft replication go on (its log still takes and acknowledges entries, so the
other members keep committing). What the node does about it:

- it refuses the group's client calls that need its views (writes, reads, leases, new watches) with
  `group_halted` (retriable: the SDK goes to another member) naming the offset, the reason and the
  fix; `status`, `read_events` (what it applied) and the admin calls still work;
- it does not lead the group: a halted leader hands leadership to the most caught-up voter, again
  after a back-off if leadership comes back (every member may be halted);
- status (`GroupInfo.halted`), /readyz, the metric `epochlog_apply_halted{group}` and one CRITICAL log
  line (statemachines.views) name the group, the offset, the reason and the fix.

Recovery: an upgraded node applies the record after a restart (a newer schema version); when no
version ever will (a record an older node accepted without checking), the operator skips it on every
member (`skip`, `epochlog group skip`), which records it as skipped on each (no change, like a
rejection: the digests stay equal) and applies on from the log.

Halts sees the node through its `LocalGroups` and a way to hand a group's leadership over.

Call everything from the node's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from eventlog.cancellation import cancel_and_wait
from eventlog.errors import EpochlogError
from eventlog.raft.node import Role
from epochlog.api import messages as p
from epochlog.errors import GroupHaltedError, InvalidArgumentError
from epochlog.local_groups import LocalGroups

if TYPE_CHECKING:
    from eventlog.raft.runtime.group import RaftGroup
    from eventlog.raft.types import Entry

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.2
TRANSFER_BACKOFF_S = (1.0, 30.0)      # first and longest wait before handing leadership away again
RESUME_CHUNK_BYTES = 4 << 20          # log read per step of a resume (the loop runs between steps)


class Halts:
    """Watches the groups of this node for halts: refusals, leadership, skip and resume.

    `transfer_leader(group)` hands the group's leadership to its most caught-up other voter (or raises
    an EpochlogError saying why it cannot)."""

    def __init__(self, local: LocalGroups, transfer_leader: Callable[[str], object]) -> None:
        self.local = local
        self._transfer_leader = transfer_leader
        self._task: asyncio.Task[None] | None = None
        self._backoff: dict[str, tuple[float, float]] = {}   # group -> (next transfer allowed at, wait)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="halts")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def info(self, group: str) -> p.HaltInfo | None:
        views = self.local.views.get(group)
        halt = None if views is None else views.halt
        return None if halt is None else p.HaltInfo(halt.offset, halt.reason, halt.fix)

    def check(self, group: str) -> None:
        """GroupHaltedError when `group` is halted on this node (its views cannot serve)."""
        views = self.local.views.get(group)
        if views is not None and views.halt is not None:
            raise GroupHaltedError(f"node {self.local.node_id}: {views.halt.describe(group)}")

    async def skip(self, call: p.GroupSkip) -> p.Done:
        """Skip the record `call.group` halted at (it must be `call.offset`) and apply on from the log."""
        group = self.local.group(call.group)
        views = self.local.views[call.group]
        try:
            views.skip(call.offset)
        except EpochlogError as exc:
            raise InvalidArgumentError(f"node {self.local.node_id}: {exc}") from None
        await self._resume(group)
        return p.Done(views.applied_index)

    async def _resume(self, group: RaftGroup) -> None:
        views = self.local.views[group.name]
        log = group.node.log

        def read(offset: int) -> list[Entry]:
            return log.entries(offset, log.applied + 1, RESUME_CHUNK_BYTES)

        while True:
            before = views.halt
            halt = views.resume(read, lambda: log.applied)
            if halt is None or halt is not before:
                return   # applying again, or halted at another record (logged)
            await asyncio.sleep(0)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            for name, group in self.local.groups().items():
                views = self.local.views.get(name)
                if views is None or views.halt is None:
                    self._backoff.pop(name, None)
                elif group.node.role is Role.LEADER and not group.stopped:
                    self._step_down(name, group)

    def _step_down(self, name: str, group: RaftGroup) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        allowed, wait = self._backoff.get(name, (0.0, TRANSFER_BACKOFF_S[0]))
        if now < allowed:
            return
        self._backoff[name] = (now + wait, min(wait * 2, TRANSFER_BACKOFF_S[1]))
        try:
            self._transfer_leader(name)
            logger.warning("group %s is halted on this node: handing leadership over", name)
        except EpochlogError as exc:
            logger.warning("group %s is halted on this node and cannot hand leadership over: %s", name, exc)
