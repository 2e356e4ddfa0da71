"""What a group does about a damaged batch in its log (eventlog/damage.py): never serve it, drop it, fetch it again.

The log never hands a damaged batch out (reads stop before it or raise CorruptBatchError; the storage
turns that into CompactedError for the Raft core, so a follower that needs it gets a snapshot and
applying waits). What removes the damage is decided here, every tick, by the role this node has:

- a **follower that knows a leader** drops the damaged batch and everything after it
  (`RaftNode.drop_entries`: the vote floor is made durable first, then `LogStorage.drop_from`
  truncates the log, or resets it after the snapshot when the damage lies below it), and tells the
  leader, which sends the entries again, or its snapshot when its own log no longer holds them. The
  leader holds every committed entry (Leader Completeness), so nothing committed can be lost this way.
  The views applied the entries before the damage happened: the copies that come back are not applied
  again, and a snapshot older than what the views applied replaces the log only (`RaftGroup`);
- a **leader** first hands leadership to a voter that holds everything past the damaged segment, then
  repairs as a follower. With no such voter (the damaged copy is the only one of those entries: the
  others are behind, or were wiped) it goes on leading without ever serving the damaged range: a
  follower that needs it gets a snapshot, which the leader takes at once when its latest one does not
  cover the damaged segment (its views applied it before the damage). The raw records of that range
  are then gone from every log (readers are told `compacted`, the snapshot holds their effect); the
  leader hands over as soon as a voter has caught up, and drops the damage;
- a candidate, or a follower that knows no leader, waits: dropping entries with nobody to send them
  again could lose the last copy.

Until the damage is gone and the dropped entries are back (the vote floor cleared), `RepairStatus`
says so (status, /readyz, metrics), and the node refuses the offsets it lacks with the retriable
`log_refetching`.

Call everything from the group's loop (`RaftGroup` ticks it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.damage import Damage
from eventlog.raft.node import Role

if TYPE_CHECKING:
    from eventlog.raft.runtime.group import RaftGroup

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RepairStatus:
    """A group's log repair on this node, as status and metrics show it."""

    damage: Damage | None     # the damaged batch still in the log, or the last one dropped while its
                              # entries are fetched again (None: the log is whole)
    state: str                # what this node is doing about it ("": nothing to do)
    found: int                # damaged batches found since the node started
    repairs: int              # times it dropped entries to fetch them again

    @property
    def active(self) -> bool:
        return bool(self.state)


class LogRepair:
    """The repair of one group's log on this node (see the module docstring)."""

    def __init__(self, group: RaftGroup) -> None:
        self.group = group
        self._seen: Damage | None = None       # the damage the counters last saw
        self._dropped: Damage | None = None    # the last damage dropped, while the entries come back
        self._state = ""
        self._found = 0
        self._repairs = 0
        self._snapshot_for: int = -1           # the damaged segment end a snapshot was requested for

    def status(self) -> RepairStatus:
        damage = self.group.storage.log.damage
        state = self._state or ("found: acting on it at the next tick" if damage is not None else "")
        return RepairStatus(damage if damage is not None else self._dropped, state, self._found, self._repairs)

    def tick(self) -> None:
        g = self.group
        node = g.node
        damage = g.storage.log.damage
        if damage is None:
            if node.vote_floor is None:
                self._dropped, self._state = None, ""
            else:
                self._state = (f"fetching its log again from offset {node.log.last_index() + 1} "
                               f"(from node {node.leader or 'none known yet'})")
            return
        if damage != self._seen:
            self._seen = damage
            self._found += 1
        if node.role is Role.LEADER:
            self._lead_with(damage)
        elif node.role is Role.FOLLOWER and node.leader:
            self._drop(damage)
        else:
            self._state = f"waiting for a leader to fetch offsets {damage.drop_offset} on again from"

    def _drop(self, damage: Damage) -> None:
        g = self.group
        node = g.node
        leader = node.leader
        hard = node.drop_entries(damage.drop_offset)
        g.storage.set_hard_state(hard)                 # the vote floor, durable before the entries go
        g.discard_held_from(damage.drop_offset)
        g.storage.drop_from(damage.drop_offset)
        node.entries_dropped()
        g.wake()
        self._repairs += 1
        self._dropped = damage
        self._state = f"fetching its log again from offset {node.log.last_index() + 1} (from node {leader})"
        logger.warning("group %s: dropped its log from offset %d (%s); fetching it again from node %d",
                       g.name, damage.drop_offset, damage.describe(), leader)

    def _lead_with(self, damage: Damage) -> None:
        g = self.group
        holds = damage.segment_end - 1     # a voter that holds this does not need the damaged range
        target = g.hand_over(f"damaged batch at offset {damage.offset}", min_match=holds)
        if target:
            self._state = f"handing leadership to node {target} before dropping offsets {damage.drop_offset} on"
            return
        self._state = ("leading without serving offsets "
                       f"{damage.offset}..{damage.segment_end - 1}: no voter holds them yet to hand over to")
        if g.storage.snapshot().index < holds <= g.sm.applied_index and not g.snapshot_in_progress:
            # Followers that need the damaged range skip it with this snapshot (retried after a failure).
            if self._snapshot_for != holds:
                self._snapshot_for = holds
                logger.warning("group %s: taking a snapshot at %d so that followers skip the damaged offsets "
                               "%d..%d", g.name, g.sm.applied_index, damage.offset, holds)
            g.request_snapshot()
