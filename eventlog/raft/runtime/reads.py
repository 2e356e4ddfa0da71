"""What a read of a group's state machine on this node waits for: a read index, the lease, the applied offset.

- `linearizable`: ReadIndex (thesis §6.4). The leader records its commit index as the read's index and
  confirms it still leads with a heartbeat round; the read is served once the state machine applied
  through that index. The request goes to the core (`RaftNode.read_index`) and comes back in a Ready
  (`read_states`, or `dropped_reads` when leadership was lost first).
- `lease`: the leader's lease (`RaftNode.lease_read_index`) answers without a round trip while it
  holds. The lease is counted in ticks, so it is voided whenever the tick clock lagged real time
  (`check_clock`); the read then goes through ReadIndex.
- `local`: whatever this node applied, once it reached a given offset.

`commit_barrier` is a read of the log at any member (native read_events and read_log, the Kafka
face's Metadata): it waits until this node applied every entry committed before the call. The leader
uses its lease or ReadIndex; a follower asks its leader for a read index (`RaftNode.forward_read_index`)
and waits until it applied that far. Followers learn a new commit index from the leader's next append
or heartbeat (at once only with `[raft] commit_broadcast`), so without it a follower's log reads would
miss a write just acknowledged to another client.

Concurrency contract: call only from the group's loop task (its `RaftGroup` owns one `Reads`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from eventlog.raft.errors import NotCaughtUpError, NotLeaderError, ProposalDroppedError, RaftError
from eventlog.raft.node import RaftNode, ReadState, Role

if TYPE_CHECKING:
    from eventlog.raft.runtime.group import GroupCounters


class Applied(Protocol):
    """The state machine, as far as reads care."""

    applied_index: int


class Reads:
    """Read barriers and applied-offset waiters of one group on this node (see the module docstring)."""

    def __init__(self, name: str, node: RaftNode, state_machine: Applied, *, loop: asyncio.AbstractEventLoop,
                 wake: Callable[[], None], tick_interval: float, counters: GroupCounters,
                 peer_reads_index: Callable[[int], bool] = lambda _: True) -> None:
        self.name = name
        self.peer_reads_index = peer_reads_index   # whether a ReadIndex may be sent to that node (transport.py)
        self.node = node
        self.sm = state_machine
        self.loop = loop
        self._wake = wake
        self.tick_interval = tick_interval
        self.counters = counters
        self._reads: dict[int, asyncio.Future[int]] = {}   # read request id -> its read index, once known
        self._read_seq = 0
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._last_tick_at = loop.time()   # when the core last ticked (see check_clock)

    async def barrier(self, consistency: str, min_offset: int, timeout: float) -> int:
        """Wait until reading the state machine gives `consistency`; the applied offset to serve the read at."""
        if consistency == "local":
            target = min_offset
        elif consistency in ("linearizable", "lease"):
            if self.node.role is not Role.LEADER:
                raise NotLeaderError(self.node.id, self.node.leader, self.node.term)
            index = None
            if consistency == "lease":
                self.check_clock()
                index = self.node.lease_read_index()
            if index is None:
                self._read_seq += 1
                future: asyncio.Future[int] = self.loop.create_future()
                self._reads[self._read_seq] = future
                self.node.read_index(self._read_seq)
                self._wake()
                index = await asyncio.wait_for(future, timeout)
            target = max(index, min_offset)
        else:
            raise RaftError(f"unknown consistency {consistency!r} (linearizable, lease or local)")
        await self.wait_applied(target, timeout)
        return self.sm.applied_index

    async def commit_barrier(self, timeout: float) -> int:
        """Wait until this node applied every entry of the group committed before the call (leader or
        follower, see the module docstring); the applied offset. NotCaughtUpError past `timeout`
        (no leader answered, or this node did not apply that far in time)."""
        deadline = self.loop.time() + timeout
        delay = self.tick_interval
        while True:
            remaining = deadline - self.loop.time()
            try:
                if self.node.role is Role.LEADER:
                    index = await self._leader_read_index(remaining)
                else:
                    index = await self._follower_read_index(remaining)
                break
            except (NotLeaderError, ProposalDroppedError):   # an election, a leader change or a transfer: ask again
                if self.loop.time() + delay < deadline:
                    await asyncio.sleep(delay)
                    continue
            except TimeoutError:
                pass
            raise NotCaughtUpError(f"node {self.node.id} could not learn group {self.name}'s commit index "
                                   f"from a leader within {timeout:.1f} s")
        await self.wait_applied(index, max(0.0, deadline - self.loop.time()))
        return self.sm.applied_index

    async def _leader_read_index(self, timeout: float) -> int:
        self.check_clock()
        index = self.node.lease_read_index()
        if index is not None:
            return index
        return await self._read_index(self.node.read_index, timeout)

    async def _follower_read_index(self, timeout: float) -> int:
        leader = self.node.leader
        if leader and not self.peer_reads_index(leader):
            # A leader of an older version (a rolling upgrade) would close the connection on a ReadIndex:
            # serve what this node knows to be committed, as such a version did.
            return self.node.log.committed
        return await self._read_index(self.node.forward_read_index, timeout)

    async def _read_index(self, start: Callable[[int], None], timeout: float) -> int:
        """Start a read with `start(request)` (the core's read_index or forward_read_index) and wait
        for its read index."""
        self._read_seq += 1
        request = self._read_seq
        future: asyncio.Future[int] = self.loop.create_future()
        start(request)   # NotLeaderError before anything is registered
        self._reads[request] = future
        self._wake()
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._reads.pop(request, None)

    async def wait_applied(self, offset: int, timeout: float | None = None) -> None:
        """Until the state machine applied `offset` (NotCaughtUpError past `timeout`)."""
        if self.sm.applied_index >= offset:
            return
        future: asyncio.Future[None] = self.loop.create_future()
        self._applied_waiters.append((offset, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise NotCaughtUpError(f"node {self.node.id} applied {self.sm.applied_index} of group {self.name}, "
                                   f"not yet {offset}") from None

    def wake_applied(self) -> None:
        """The state machine applied more (or was restored): release the waiters it reached."""
        if not self._applied_waiters:
            return
        applied = self.sm.applied_index
        keep = []
        for offset, future in self._applied_waiters:
            if offset <= applied:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((offset, future))
        self._applied_waiters = keep

    def resolve(self, read_states: tuple[ReadState, ...], dropped_reads: tuple[int, ...]) -> None:
        """A Ready's answers to read requests: their read index, or leadership lost first."""
        for rs in read_states:
            future = self._reads.pop(rs.request, None)
            if future is not None and not future.done():
                future.set_result(rs.index)
        for request in dropped_reads:
            future = self._reads.pop(request, None)
            if future is not None and not future.done():
                future.set_exception(NotLeaderError(self.node.id, self.node.leader, self.node.term))

    def ticked(self) -> None:
        """The core just ticked (the clock `check_clock` compares with real time)."""
        self._last_tick_at = self.loop.time()

    def check_clock(self) -> None:
        """Void the leader lease when the core's tick clock lags real time.

        The lease is counted in ticks (`RaftNode.lease_read_index`) and is safe only while this
        clock keeps pace with the followers' (within lease_drift_ticks). A stalled loop or a
        stopped process (SIGSTOP) stops it: after a pause of seconds the node would still count its
        old lease as valid while the others, whose clocks ran, elected a new leader. So when the
        last tick is older than one interval plus the drift allowance (at least half an interval),
        no lease from before now is trusted: the next heartbeat round a majority acknowledges
        starts a new one, and meanwhile lease reads go through ReadIndex. Called by the ticker, and
        by lease reads, which may run before the ticker does after a stall.
        """
        limit = (1 + max(0.5, self.node.cfg.lease_drift_ticks)) * self.tick_interval
        if self.loop.time() - self._last_tick_at > limit:
            self.node.clock_jumped()
            self.counters.clock_stalls += 1

    def fail_all(self, error: BaseException) -> None:
        """Fail every read and applied-offset waiter with `error` (the group stops or failed)."""
        for future in self._reads.values():
            if not future.done():
                future.set_exception(error)
        self._reads.clear()
        for _, applied_future in self._applied_waiters:
            if not applied_future.done():
                applied_future.set_exception(error)
        self._applied_waiters = []
