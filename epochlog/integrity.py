"""Integrity of a node's groups as clients and operators see it: damaged logs and diverged views.

Damage, a batch of a group's log failing its checks on this node's disk, is found and repaired below
(eventlog/damage.py, eventlog/scrub.py, eventlog/raft/runtime/repair.py); `damage_info` says so in
status (`GroupInfo.damage`), which /readyz and the metrics read.

Diverged views (etcd's corruption check). Every member's views chain a digest over the mutations of
each entry they apply (statemachines/apply.py) and note it at the same offsets on every member
(`[views] digest_checkpoint_offsets`). Every `digest_check_interval_ms` the leader of each group asks
every other member for its notes (`status`, through the SDK) and compares the digests at the latest
offset both noted. Members that applied the same committed entries hold the same digest; a difference
means their views diverged: nondeterministic apply code, another build, or views changed behind the
node's back (log damage cannot cause it: a damaged batch is never applied). No later entry repairs
that, so the leader raises the **digest alarm**: `GroupInfo.digest_alarms` (on the leader), the gauge
`epochlog_views_digest_mismatch{group,member}` and one CRITICAL log line per member and offset, naming
the member, the offset and both digests.

The alarm stops nothing, by decision: which side is wrong cannot be told from two digests (the
majority's is most likely right), and refusing writes cluster-wide (etcd's CORRUPT alarm) would turn
one member's bad views into an outage for every client. Reads the odd member serves may be wrong; the
fix is the operator's: stop that member, remove its group's `views/` directory (or the whole group
directory) and restart it, so it installs a snapshot from the leader. The alarm clears when a later
comparison with that member matches.

The check sees the node through its `LocalGroups` and the members' client addresses.

Call everything from the node's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from eventlog.cancellation import cancel_and_wait
from eventlog.errors import EpochlogError
from eventlog.raft.node import Role
from eventlog.raft.runtime.repair import RepairStatus
from epochlog.api import messages as p
from epochlog.local_groups import LocalGroups

if TYPE_CHECKING:
    from epochlog.client.aio import AsyncClient
    from epochlog.client.tls import ClientTls

logger = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 2.0


def damage_info(repair: RepairStatus | None) -> p.DamageInfo | None:
    """The status form of a group's repair (None: its log is whole)."""
    if repair is None or repair.damage is None:
        return None
    d = repair.damage
    return p.DamageInfo(d.offset, d.path, d.position, d.reason, repair.state)


class DigestCheck:
    """The leader's comparison of views digests with every member's (see the module docstring)."""

    def __init__(self, local: LocalGroups, client_addresses: Callable[[], Mapping[int, str]],
                 interval_ms: int, client_tls: Callable[[], ClientTls | None] = lambda: None) -> None:
        self.local = local
        self._client_tls = client_tls   # what its status calls present (the member certificate)
        self._client_addresses = client_addresses
        self.interval_s = interval_ms / 1000
        self.alarms: dict[str, dict[int, p.DigestAlarm]] = {}   # group -> member -> alarm
        self.checks: dict[str, int] = {}                         # group -> comparisons made
        self._task: asyncio.Task[None] | None = None
        self._client: AsyncClient | None = None

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="digest-check")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    def digests(self, group: str) -> list[p.DigestAt]:
        """What this node's views of `group` noted (oldest first)."""
        views = self.local.views.get(group)
        if views is None:
            return []
        return [p.DigestAt(offset, digest.hex()) for offset, digest in views.applier.digest_checkpoints]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check_once()
            except (EpochlogError, OSError, TimeoutError) as exc:
                logger.info("views digest check: %s", exc)

    async def check_once(self) -> None:
        """One round: every group this node leads, against every other member that answers."""
        led = {name: group for name, group in self.local.groups().items() if group.node.role is Role.LEADER}
        for name in list(self.alarms):
            if name not in led:
                del self.alarms[name]   # the new leader compares now
        members = {m for group in led.values() for m in (*group.node.conf.voters, *group.node.conf.learners)}
        members.discard(self.local.node_id)
        statuses = {}
        for member in sorted(members):
            status = await self._status(member)
            if status is not None:
                statuses[member] = status
        for name, group in led.items():
            mine = {d.offset: d.digest for d in self.digests(name)}
            for member in (*group.node.conf.voters, *group.node.conf.learners):
                status = statuses.get(member)
                theirs = None if status is None else next((g for g in status.groups if g.group == name), None)
                if theirs is not None and mine:
                    self._compare(name, member, mine, {d.offset: d.digest for d in theirs.digests})

    def _compare(self, group: str, member: int, mine: dict[int, str], theirs: dict[int, str]) -> None:
        common = set(mine) & set(theirs)
        if not common:
            return   # one of the two restarted (or lags far behind) since the notes kept
        at = max(common)
        self.checks[group] = self.checks.get(group, 0) + 1
        alarms = self.alarms.setdefault(group, {})
        if mine[at] == theirs[at]:
            if alarms.pop(member, None) is not None:
                logger.warning("group %s: the views of node %d match the leader's again at offset %d", group,
                               member, at)
            return
        alarm = p.DigestAlarm(member, at, theirs[at], mine[at])
        if member not in alarms:
            logger.critical("group %s: the views of node %d differ from the leader's at applied offset %d "
                            "(digest %s, the leader's %s): their state diverged; reads node %d serves may be "
                            "wrong. Rebuild the views of the member that differs from the majority (stop it, "
                            "remove its groups/%s/views, restart it)", group, member, at, theirs[at][:16],
                            mine[at][:16], member, group)
        alarms[member] = alarm

    async def _status(self, member: int) -> p.StatusInfo | None:
        address = self._client_addresses().get(member, "")
        if not address:
            return None
        if self._client is None:
            from epochlog.client.aio import AsyncClient

            self._client = AsyncClient([address], timeout=STATUS_TIMEOUT_S, name=f"epochlog-node-{self.local.node_id}",
                                       sessions=False, tls=self._client_tls())
        try:
            return await asyncio.wait_for(self._client.status(address), STATUS_TIMEOUT_S)
        except (EpochlogError, OSError, TimeoutError):
            return None
