"""A group's log as a face produces to it and fetches from it: the node operations the Kafka face uses.

Kafka's Produce, Fetch, ListOffsets and OffsetForLeaderEpoch speak of a partition's log directly
(offsets, batches, leader epochs, the high watermark), which the native and gRPC faces never do. So
that the face still goes through the node and never through the Raft group or its storage,
`Node.group_log(name)` hands out a `GroupLog`: what those requests need of one group, and nothing
else. How a group stores its log (eventlog/log.py) or proposes records (RaftGroup.submit) can then
change behind it without touching a face.

A `GroupLog` holds no state of its own: it reads the group's as it is at each call. Call from the
node's loop.
"""

from __future__ import annotations

from collections.abc import Callable

from eventlog.log import LogRead
from eventlog.raft.node import Role
from eventlog.raft.runtime.group import Committed, ProducerStamp, RaftGroup

__all__ = ["Committed", "GroupLog", "ProducerStamp"]


class GroupLog:
    """One Raft group's log, for a face: leadership, committed offsets, reads and appends."""

    __slots__ = ("_group",)

    def __init__(self, group: RaftGroup) -> None:
        self._group = group

    @property
    def name(self) -> str:
        return self._group.name

    # --- leadership -----------------------------------------------------------------------------

    @property
    def leads(self) -> bool:
        """Whether this node leads the group now (only the leader serves Kafka's reads and appends)."""
        return self._group.node.role is Role.LEADER

    @property
    def leader(self) -> int:
        """The leader this node knows of (0: none known)."""
        return self._group.node.leader

    @property
    def term(self) -> int:
        """The current Raft term: Kafka's leader epoch."""
        return self._group.node.term

    @property
    def voters(self) -> tuple[int, ...]:
        return tuple(self._group.node.conf.voters)

    @property
    def learners(self) -> tuple[int, ...]:
        return tuple(self._group.node.conf.learners)

    # --- offsets and reads --------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """The commit offset + 1: nothing at or past it is served."""
        return self._group.node.log.committed + 1

    @property
    def start_offset(self) -> int:
        return self._group.storage.log.start_offset

    @property
    def end_offset(self) -> int:
        return self._group.storage.log.end_offset

    def read(self, offset: int, max_bytes: int = 1 << 20, *, max_offset: int | None = None) -> LogRead:
        """Whole batches from `offset`, about `max_bytes` of them, below `max_offset` (eventlog Log.read)."""
        return self._group.storage.log.read(offset, max_bytes, max_offset=max_offset)

    def epoch_for_offset(self, offset: int) -> int | None:
        return self._group.storage.log.epoch_for_offset(offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        return self._group.storage.log.offset_for_timestamp(timestamp_ms)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int] | None:
        return self._group.storage.log.end_offset_for_epoch(epoch)

    async def read_barrier(self, consistency: str = "linearizable", timeout: float = 5.0) -> int:
        """Until reading this node's views gives `consistency` (linearizable: no write committed before
        the call is missed; NotLeaderError on a follower); the applied offset a read may be served at."""
        return await self._group.read_barrier(consistency, timeout=timeout)

    async def commit_barrier(self, timeout: float = 5.0) -> int:
        """Until this node, leader or follower, applied every entry committed before the call (a follower
        asks its leader how far that is); its applied offset. NotCaughtUpError past `timeout`."""
        return await self._group.commit_barrier(timeout)

    async def wait_applied(self, offset: int, timeout: float | None = None) -> None:
        """Until this node applied `offset` (TimeoutError past `timeout`)."""
        await self._group.wait_applied(offset, timeout)

    # --- appends ------------------------------------------------------------------------------

    @property
    def max_batch_bytes(self) -> int:
        """The largest batch the group takes."""
        return self._group.max_batch_bytes

    async def append(self, records: list[tuple[bytes | None, bytes | None]], *, producer: ProducerStamp | None = None,
                     on_appended: Callable[[int], None] | None = None) -> Committed:
        """Propose `records` as one entry (`producer`: a Kafka idempotent producer's stamp on it); once
        committed and applied, its offset and what applying each record did. `on_appended(offset)`
        once the leader's log has it (Kafka's acks 0/1)."""
        return await self._group.submit(records, producer=producer, on_appended=on_appended)
