"""One Raft group driven by asyncio: the core, its storage and its state machine.

One task (`run`) owns the `RaftNode`: it steps arriving messages, turns queued proposals into one
entry, and carries out each `Ready` with pipelined persistence (see `RaftNode.accept`): send
`send_now`; stage snapshot chunks, install a snapshot; write the entries (group commit: the
segmented log's flusher thread syncs them while this task goes on); persist term and vote when
they changed; apply committed entries and answer waiters; `accept()`, and take the next Ready at
once. Accepted Readys wait in order (`PersistQueue`) until the log's durable offset passes their
entries, or what is left of them once a later Ready replaced a suffix; then their `send_after`
goes out through `persisted()` (the leader counts its own copy only then). A second task ticks the
core every `tick_interval_ms`; on the leader it also measures how far behind each member is
(`LagMonitor`: /metrics, and a warning about a member that stays behind).

Proposals from any number of coroutines are coalesced: everything queued while the previous Ready
was being handled becomes one record batch, one entry (`propose`).

A membership change (`change_membership`) is one CONF_CHANGE entry: the state machine applies it like
any entry but it carries no records; the storage keeps the configuration (conf-change offsets in
quorum-state, the configuration in every snapshot's meta), so restarts and snapshots preserve it.

The commit index is persisted lazily (it is a hint for restarts: the state machine knows what it
applied); term and vote are persisted before any message that depends on them leaves.

Call everything from the loop that runs the group.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eventlog.errors import BatchTooLargeError, EpochlogError
from eventlog.raft.config import RaftConfig
from eventlog.errors import OffsetOutOfRangeError
from eventlog.raft.errors import (
    CompactedError,
    NotCaughtUpError,
    NotFoundError,
    NotLeaderError,
    ProposalDroppedError,
    RaftError,
)
from eventlog.raft.node import RaftNode, Ready, Role, SoftState
from eventlog.raft.persist_queue import PersistQueue
from eventlog.raft.runtime.lag import Behind, LagMonitor
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import ConfChange, ConfState, Entry, EntryKind, HardState, Message, SnapshotMeta
from eventlog.records import encode_batch

logger = logging.getLogger(__name__)

Send = Callable[[int, str, Message], None]

CURRENT_GROUP: contextvars.ContextVar[RaftGroup | None] = contextvars.ContextVar("raft_group", default=None)
"""The group whose task (or a task it spawned) is running: lets log records name group and term."""


class StateMachine(Protocol):
    """What a group applies committed entries to."""

    applied_index: int

    def apply(self, entries: Sequence[Entry]) -> Mapping[int, object] | None:
        """Apply committed entries in order (NORMAL, NOOP and CONF_CHANGE alike); optionally the
        outcome of each record by offset (handed to whoever proposed it)."""
        ...

    def write_snapshot(self, path: Path) -> None:
        """Write the state as of `applied_index` to the file `path`."""
        ...

    def restore(self, path: Path, meta: SnapshotMeta) -> None:
        """Replace the state with the snapshot in file `path` (taken at `meta.index`)."""
        ...


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group: str
    node: int
    role: str
    term: int
    leader: int
    commit: int
    applied: int
    last_index: int
    log_start: int
    snapshot_index: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One committed record seen by a watcher."""

    offset: int
    key: bytes
    value: bytes | None
    timestamp: int


@dataclass(slots=True)
class GroupCounters:
    """What one group did on this node since it started (monotonic; read by metrics)."""

    elections_started: int = 0      # terms in which this node campaigned (voted for itself)
    leader_changes: int = 0         # leaderships (term, leader) this node learned of
    proposals_committed: int = 0    # `submit` calls answered with their commit offset
    events_applied: int = 0         # records of NORMAL entries applied to the state machine
    clock_stalls: int = 0           # times the tick clock lagged real time and the lease was voided


@dataclass(frozen=True, slots=True)
class Committed:
    """Where proposed records were committed, and what applying each one did (None: no outcome)."""

    offset: int
    outcomes: tuple[object | None, ...]


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    """A Kafka idempotent producer's (id, epoch, base sequence): its records become one entry whose
    batch header carries them, so producer state can be rebuilt from the log (epochlog/kafka)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int


class _Proposal:
    __slots__ = ("records", "future", "size", "producer", "on_appended")

    def __init__(self, records: list[tuple[bytes | None, bytes | None]],
                 future: asyncio.Future[Committed], producer: ProducerStamp | None = None,
                 on_appended: Callable[[int], None] | None = None) -> None:
        self.records = records
        self.future = future
        self.producer = producer
        self.on_appended = on_appended
        # An upper bound of the records' encoded size (RecordBatch v2 spends under 16 bytes of framing
        # per record), so a batch of proposals within max_batch_bytes is one the log accepts.
        self.size = sum(len(k or b"") + len(v or b"") + 16 for k, v in records)


class RaftGroup:
    """A Raft group member running on an asyncio loop."""

    def __init__(self, name: str, node_id: int, storage: LogStorage, state_machine: StateMachine,
                 raft_config: RaftConfig, send: Send, *, tick_interval_ms: int, rng: random.Random,
                 snapshot_every_entries: int = 0, max_batch_bytes: int = 1 << 20,
                 lag: LagMonitor | None = None) -> None:
        self.name = name
        self.node_id = node_id
        self.storage = storage
        self.sm = state_machine
        self._send = send
        self.tick_interval = tick_interval_ms / 1000
        self.snapshot_every_entries = snapshot_every_entries
        self.max_batch_bytes = max_batch_bytes
        self.node = RaftNode(node_id, storage, raft_config, rng, applied=state_machine.applied_index)
        self.loop = asyncio.get_running_loop()
        self._inbox: list[Message] = []
        self._proposals: list[_Proposal] = []
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._read_seq = 0
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._waiters: dict[int, tuple[int, list[tuple[asyncio.Future[Committed], int, int]]]] = {}
        self._conf_waiters: dict[int, tuple[int, asyncio.Future[ConfState]]] = {}  # index -> (term, future)
        self._wake = asyncio.Event()
        self._held = PersistQueue()   # accepted Readys whose send_after waits for their entries' fsync
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._failure: BaseException | None = None
        self._persisted_commit = self.node.log.committed
        self._last_snapshot_index = storage.snapshot().index
        # Set by the node: the highest offset the log may be compacted through whatever the
        # snapshot covers (the lowest export watermark, so unexported events stay), None: no floor.
        self.compaction_floor: Callable[[], int | None] | None = None
        self.counters = GroupCounters()
        self._seen_term = self.node.term
        self._seen_leadership = (self.node.term, self.node.leader)
        self._last_tick_at = self.loop.time()   # when the core last ticked (see _check_clock)
        # The leader's view of how far behind each member is (logged, and read by metrics).
        self.lag = lag if lag is not None else LagMonitor(warn_after_s=10.0)
        self._lag_term = 0      # the term the monitor watches as leader (0: not leading)
        storage.log.add_durability_listener(self._on_durable_threadsafe)

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        context = contextvars.copy_context()
        context.run(CURRENT_GROUP.set, self)
        self._tasks = [self.loop.create_task(self._run(), name=f"raft-{self.name}", context=context),
                       self.loop.create_task(self._ticker(), name=f"tick-{self.name}", context=context)]

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        self._fail_waiters(ProposalDroppedError(f"group {self.name} on node {self.node_id} stopped"))
        if self._failure is None:
            try:
                self._persist_commit(force=True)
            except EpochlogError as exc:
                logger.error("group %s: %s", self.name, exc)
        close = getattr(self.sm, "close", None)
        if close is not None:
            close()
        self.storage.close()

    @property
    def failed(self) -> BaseException | None:
        return self._failure

    @property
    def stopped(self) -> bool:
        """Closed, or one of its tasks ended: the group makes no more progress on this node."""
        return self._closed or any(task.done() for task in self._tasks)

    # --- inputs --------------------------------------------------------------------------------

    def deliver(self, msg: Message) -> None:
        """A message from a peer (called by the transport)."""
        self._inbox.append(msg)
        self._wake.set()

    async def propose(self, records: list[tuple[bytes | None, bytes | None]]) -> int:
        """Replicate `records` (key, value pairs); the offset of the first once committed and applied."""
        return (await self.submit(records)).offset

    async def submit(self, records: list[tuple[bytes | None, bytes | None]], *,
                     producer: ProducerStamp | None = None,
                     on_appended: Callable[[int], None] | None = None) -> Committed:
        """Replicate `records`; once committed and applied, their offsets and apply outcomes.

        Raises NotLeaderError (with a leader hint) on a follower, BatchTooLargeError when the records
        cannot fit in one batch (`max_batch_bytes`). Concurrent calls are coalesced into one batch,
        except those with a `producer` stamp: each is an entry of its own, whose batch header carries
        the stamp. `on_appended(first offset)` is called once the records are in the leader's log
        (before they commit). If leadership changes before the batch commits, the future fails with
        ProposalDroppedError: the records may or may not have been committed.
        """
        self._check_open()
        if self.node.role is not Role.LEADER:
            raise NotLeaderError(self.node_id, self.node.leader, self.node.term)
        future: asyncio.Future[Committed] = self.loop.create_future()
        proposal = _Proposal(records, future, producer, on_appended)
        if proposal.size > self.max_batch_bytes:   # the log would refuse the batch, failing the group
            raise BatchTooLargeError(f"{len(records)} records of about {proposal.size} bytes exceed the "
                                     f"batch limit of group {self.name} ({self.max_batch_bytes} bytes)")
        self._proposals.append(proposal)
        self._wake.set()
        return await future

    async def read_barrier(self, consistency: str = "linearizable", min_offset: int = -1,
                           timeout: float = 5.0) -> int:
        """Wait until reading this node's state machine gives the requested consistency; returns the
        applied offset the read may be served at.

        - `linearizable`: ReadIndex (thesis §6.4) on the leader: no write committed before the call
          is missed. Raises NotLeaderError on a follower.
        - `lease`: the leader's lease (no round trip) when it holds, else as `linearizable`.
        - `local`: whatever this node applied, once it reached `min_offset` (a write's offset gives
          read-your-writes on any replica).
        """
        self._check_open()
        if consistency == "local":
            target = min_offset
        elif consistency in ("linearizable", "lease"):
            if self.node.role is not Role.LEADER:
                raise NotLeaderError(self.node_id, self.node.leader, self.node.term)
            index = None
            if consistency == "lease":
                self._check_clock()
                index = self.node.lease_read_index()
            if index is None:
                self._read_seq += 1
                future: asyncio.Future[int] = self.loop.create_future()
                self._reads[self._read_seq] = future
                self.node.read_index(self._read_seq)
                self._wake.set()
                index = await asyncio.wait_for(future, timeout)
            target = max(index, min_offset)
        else:
            raise RaftError(f"unknown consistency {consistency!r} (linearizable, lease or local)")
        await self.wait_applied(target, timeout)
        return self.sm.applied_index

    async def watch(self, prefix: bytes, from_offset: int, *,
                    chunk_bytes: int = 1 << 20) -> AsyncIterator[WatchEvent]:
        """Committed records whose key starts with `prefix`, from `from_offset` on, as they are applied.

        Reads the log in chunks of at most `chunk_bytes`, as fast as the consumer pulls (that is the
        flow control). A watcher whose offset is no longer in the log gets CompactedError naming the
        snapshot to resync from: never a silent gap.
        """
        offset = max(0, from_offset)
        log = self.storage.log
        while True:
            self._check_open()
            applied = self.sm.applied_index
            if offset > applied:
                await self.wait_applied(offset)
                continue
            try:
                chunk = log.read(offset, chunk_bytes, max_offset=applied + 1)
            except OffsetOutOfRangeError:
                chunk = None
            if chunk is None or offset < log.start_offset:
                raise CompactedError(f"compacted: offset {offset} is no longer in the log (it starts at "
                                     f"{log.start_offset}); resync from the snapshot at offset "
                                     f"{self.storage.snapshot().index}, then watch from the offset after it")
            for batch in chunk.batches():
                if batch.header.is_control:
                    continue
                for record in batch.records():
                    if record.offset >= offset and record.key is not None and record.key.startswith(prefix):
                        yield WatchEvent(record.offset, record.key, record.value, record.timestamp)
            offset = max(offset, chunk.next_offset)
            if chunk.next_offset == chunk.start_offset:
                await self.wait_applied(offset)

    def keepalive(self, lease_id: int) -> int:
        """Restart a lease's clock on the leader (not logged); returns its TTL in ms."""
        self._check_open()
        if self.node.role is not Role.LEADER:
            raise NotLeaderError(self.node_id, self.node.leader, self.node.term)
        keepalive = getattr(self.sm, "keepalive", None)
        ttl = keepalive(lease_id) if keepalive is not None else None
        if ttl is None:
            raise NotFoundError(f"lease {lease_id} does not exist in group {self.name} (expired or revoked?)")
        return int(ttl)

    def snapshot_now(self) -> int:
        """Snapshot the state machine at its applied offset and drop the log below; the snapshot's offset."""
        self._check_open()
        applied = self.sm.applied_index
        if applied > self._last_snapshot_index:
            self._snapshot(applied)
        return self._last_snapshot_index

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to voter `target` (leader only); proposals wait until it is done or times out."""
        self._check_open()
        self.node.transfer_leadership(target)
        self._wake.set()

    async def change_membership(self, cc: ConfChange, timeout: float = 10.0) -> ConfState:
        """Propose a single-server membership change (leader only); the configuration after it, once
        its entry is committed and applied here.

        Waits first (within `timeout`) while the core would refuse any change for the moment: the
        leader has not committed an entry of its term yet, or another change (e.g. an automatic
        promotion) is not committed yet. Then the core's verdict stands: ConfChangeError when `cc`
        does not apply (already a member, the last voter...), NotLeaderError on a follower,
        ProposalDroppedError if leadership changed before the entry committed (it may or may not
        have been). The entry reaches the state machine as a CONF_CHANGE entry, never as records.
        """
        self._check_open()
        deadline = self.loop.time() + timeout
        while True:
            n = self.node
            if n.role is not Role.LEADER:
                raise NotLeaderError(self.node_id, n.leader, n.term)
            committed = n.log.committed
            if n.log.term(committed) == n.term and n.conf_at(committed) == n.conf and not n.lead_transferee:
                break
            if self.loop.time() >= deadline:
                raise ProposalDroppedError(f"group {self.name}: the leader could not take a membership change "
                                           f"within {timeout:.1f} s (no commit in its term, or a change pending)")
            await asyncio.sleep(self.tick_interval)
        index = self.node.propose_conf_change(cc)
        future: asyncio.Future[ConfState] = self.loop.create_future()
        self._conf_waiters[index] = (self.node.term, future)
        self._wake.set()
        try:
            return await asyncio.wait_for(future, max(0.0, deadline - self.loop.time()))
        except TimeoutError:
            raise ProposalDroppedError(f"group {self.name}: membership change at {index} not committed within "
                                       f"{timeout:.1f} s (it may still be)") from None

    async def wait_applied(self, offset: int, timeout: float | None = None) -> None:
        """Until this node's state machine applied `offset` (TimeoutError past `timeout`)."""
        if self.sm.applied_index >= offset:
            return
        future: asyncio.Future[None] = self.loop.create_future()
        self._applied_waiters.append((offset, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise NotCaughtUpError(f"node {self.node_id} applied {self.sm.applied_index} of group {self.name}, "
                                   f"not yet {offset}") from None

    def status(self) -> GroupStatus:
        n = self.node
        return GroupStatus(self.name, self.node_id, n.role.value, n.term, n.leader, n.log.committed,
                           self.sm.applied_index, n.log.last_index(), self.storage.log.start_offset,
                           self.storage.snapshot().index)

    # --- the loop ------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        next_tick = self.loop.time() + self.tick_interval
        while not self._closed:
            await asyncio.sleep(max(0.0, next_tick - self.loop.time()))
            next_tick += self.tick_interval
            self._check_clock()
            if self.loop.time() > next_tick + 10 * self.tick_interval:
                next_tick = self.loop.time() + self.tick_interval  # we were stalled: do not burst
            self.node.tick()
            self._last_tick_at = self.loop.time()
            self._observe_lag()
            self._wake.set()
            self._state_machine_tick()

    def _observe_lag(self) -> None:
        """On the leader: measure each member's lag; warn about a member that stays behind."""
        n = self.node
        if n.role is not Role.LEADER:
            if self._lag_term:
                self.lag.reset()
                self._lag_term = 0
            return
        if self._lag_term != n.term:
            self.lag.reset()
            self._lag_term = n.term
        matches = {m: p.match for m, p in n.progress.items() if m != self.node_id}
        for event in self.lag.observe(self.loop.time(), n.log.committed, matches):
            if isinstance(event, Behind):
                lag = event.lag
                logger.warning("group %s: member %s is %d offsets behind the commit offset %d (its match %d) "
                               "and has lacked committed offsets for %.1f s", self.name, lag.member, lag.offsets,
                               lag.commit, lag.match, lag.seconds)
            else:
                logger.info("group %s: member %s caught up (%d offsets behind) after %.1f s behind", self.name,
                            event.member, event.offsets, event.late_for + self.lag.warn_after)

    def _check_clock(self) -> None:
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

    def _state_machine_tick(self) -> None:
        """Let the state machine propose what time decides (e.g. lease expiries) on the leader."""
        hook = getattr(self.sm, "on_tick", None)
        if hook is None:
            return
        for record in hook(self.node.role is Role.LEADER and not self._proposals_blocked()):
            self.loop.create_task(self._propose_quietly([record]))

    def _proposals_blocked(self) -> bool:
        return self.node.lead_transferee != 0

    async def _propose_quietly(self, records: list[tuple[bytes | None, bytes | None]]) -> None:
        try:
            await self.submit(records)
        except EpochlogError as exc:  # retried by the state machine's own schedule
            logger.info("group %s: proposal from the state machine failed: %s", self.name, exc)

    async def _run(self) -> None:
        try:
            while not self._closed:
                await self._wake.wait()
                self._wake.clear()
                self._release_persisted()
                while True:
                    self._step_inbox()
                    self._submit_proposals()
                    if not self.node.has_ready():
                        break
                    self._handle(self.node.ready())
                    self.node.accept()
                    self._release_persisted()
                self._persist_commit(force=False)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a failed fsync or a broken invariant: this node must stop
            self._failure = exc
            logger.critical("group %s on node %s failed: %r", self.name, self.node_id, exc)
            self._fail_waiters(RaftError(f"group {self.name} failed: {exc}"))
            raise

    def _step_inbox(self) -> None:
        msgs, self._inbox = self._inbox, []
        for m in msgs:
            self.node.step(m)

    def _submit_proposals(self) -> None:
        if not self._proposals:
            return
        pending, self._proposals = self._proposals, []
        if self.node.role is not Role.LEADER:
            error = NotLeaderError(self.node_id, self.node.leader, self.node.term)
            for p in pending:
                if not p.future.done():
                    p.future.set_exception(error)
            return
        start, n = 0, len(pending)
        while start < n:
            end, size = start, 0
            stamp = pending[start].producer
            while end < n and (end == start or (stamp is None and pending[end].producer is None
                                                and size + pending[end].size <= self.max_batch_bytes)):
                size += pending[end].size
                end += 1
            batch = pending[start:end]
            records = [r for p in batch for r in p.records]
            if stamp is None:
                data = encode_batch(records, timestamp_ms=int(time.time() * 1000))
            else:
                data = encode_batch(records, timestamp_ms=int(time.time() * 1000), producer_id=stamp.producer_id,
                                    producer_epoch=stamp.producer_epoch, base_sequence=stamp.base_sequence)
            try:
                index = self.node.propose(data, count=len(records))
            except RaftError as exc:
                for p in pending[start:]:
                    if not p.future.done():
                        p.future.set_exception(exc)
                return
            start = end
            waiters = []
            offset = index
            for p in batch:
                waiters.append((p.future, offset, len(p.records)))
                if p.on_appended is not None:   # runs after this turn wrote the entry to the log (_handle)
                    self.loop.call_soon(p.on_appended, offset)
                offset += len(p.records)
            self._waiters[index] = (self.node.term, waiters)

    def _handle(self, rd: Ready) -> None:
        if rd.soft_state is not None:
            self._count_soft_state(rd.soft_state)
        for m in rd.send_now:
            self._send(m.dst, self.name, m)
        storage = self.storage
        for chunk in rd.snapshot_chunks:
            storage.stage_snapshot_chunk(chunk.meta, chunk.offset, chunk.data)
        if rd.snapshot is not None:
            self._held.discard_from(rd.snapshot.index + 1)   # the log is reset behind the snapshot
            path = storage.install_snapshot(rd.snapshot)
            self.sm.restore(path / "data", rd.snapshot)
            self._last_snapshot_index = rd.snapshot.index
            self._wake_applied()
        if rd.entries:
            # Entries from here on replace any stored suffix: earlier Readys no longer wait for the
            # replaced ones (they will never be durable; see eventlog/raft/persist_queue.py).
            self._held.discard_from(rd.entries[0].index)
            storage.append(rd.entries)
        if rd.hard_state is not None:
            prev = storage.initial_state()[0]
            if (rd.hard_state.term, rd.hard_state.vote) != (prev.term, prev.vote):
                storage.set_hard_state(rd.hard_state)  # before any vote or ack leaves (§5.1)
                self._persisted_commit = rd.hard_state.commit
        self._held.push(rd)
        if rd.committed:
            outcomes = self.sm.apply(rd.committed) or {}
            self.counters.events_applied += sum(e.count for e in rd.committed if e.kind is EntryKind.NORMAL)
            self._resolve(rd.committed, outcomes)
            self._maybe_snapshot()
            self._wake_applied()
        for rs in rd.read_states:
            future = self._reads.pop(rs.request, None)
            if future is not None and not future.done():
                future.set_result(rs.index)
        for request in rd.dropped_reads:
            future = self._reads.pop(request, None)
            if future is not None and not future.done():
                future.set_exception(NotLeaderError(self.node_id, self.node.leader, self.node.term))

    def _resolve(self, committed: tuple[Entry, ...], outcomes: Mapping[int, object]) -> None:
        if self._conf_waiters:
            self._resolve_conf(committed)
        for e in committed:
            waiting = self._waiters.pop(e.index, None)
            if waiting is None:
                continue
            term, futures = waiting
            for future, offset, count in futures:
                if future.done():
                    continue
                if e.term == term and e.kind is EntryKind.NORMAL:
                    future.set_result(Committed(offset, tuple(outcomes.get(o) for o in range(offset, offset + count))))
                    self.counters.proposals_committed += 1
                else:
                    future.set_exception(ProposalDroppedError(
                        f"leadership changed: offset {offset} was committed by another leader"))
        if committed:
            last = committed[-1].last_index
            for index in [i for i in self._waiters if i <= last]:
                for future, _, _ in self._waiters.pop(index)[1]:
                    if not future.done():
                        future.set_exception(ProposalDroppedError("the proposal was overwritten"))

    def _count_soft_state(self, soft: SoftState) -> None:
        """Count elections and leader changes. A Ready reports the state at its making, so changes
        between two Readys (one loop turn) fold into one: two campaigns in one turn count once."""
        counters = self.counters
        if soft.term > self._seen_term and self.node.vote == self.node_id:
            counters.elections_started += 1
        self._seen_term = soft.term
        if soft.leader != 0 and (soft.term, soft.leader) != self._seen_leadership:
            counters.leader_changes += 1
            self._seen_leadership = (soft.term, soft.leader)
            logger.info("group %s: node %s leads in term %s%s", self.name, soft.leader, soft.term,
                        " (this node)" if soft.leader == self.node_id else "")

    def _resolve_conf(self, committed: tuple[Entry, ...]) -> None:
        for e in committed:
            waiting = self._conf_waiters.pop(e.index, None)
            if waiting is None or waiting[1].done():
                continue
            if e.term == waiting[0] and e.kind is EntryKind.CONF_CHANGE:
                waiting[1].set_result(self.node.conf_at(e.index))
            else:
                waiting[1].set_exception(ProposalDroppedError(
                    f"leadership changed: index {e.index} was committed by another leader"))
        last = committed[-1].last_index
        for index in [i for i in self._conf_waiters if i <= last]:
            future = self._conf_waiters.pop(index)[1]
            if not future.done():
                future.set_exception(ProposalDroppedError("the membership change was overwritten"))

    def _wake_applied(self) -> None:
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

    def _maybe_snapshot(self) -> None:
        every = self.snapshot_every_entries
        applied = self.sm.applied_index
        if not every or applied - self._last_snapshot_index < every:
            return
        self._snapshot(applied)

    def _snapshot(self, applied: int) -> None:
        conf = self.node.conf_at(applied)
        meta = self.storage.create_snapshot(applied, conf, self.sm.write_snapshot)
        floor = None if self.compaction_floor is None else self.compaction_floor()
        self.storage.compact(meta.index if floor is None else min(meta.index, floor))
        self._last_snapshot_index = meta.index

    def _persist_commit(self, *, force: bool) -> None:
        committed = self.node.log.committed
        if committed == self._persisted_commit:
            return
        if force or committed - self._persisted_commit >= 10_000:
            hs = HardState(term=self.node.term, vote=self.node.vote, commit=committed)
            self.storage.set_hard_state(hs)
            self._persisted_commit = committed

    # --- durability ----------------------------------------------------------------------------

    def _release_persisted(self) -> None:
        """Send what accepted Readys held back, in order, as far as the log is durable."""
        log = self.storage.log
        if log.failure is not None:
            raise log.failure  # a failed fsync is fatal: never wait for, or pretend, durability
        for rd in self._held.pop_durable(log.durable_offset):
            for m in self.node.persisted(rd):
                self._send(m.dst, self.name, m)

    def _on_durable_threadsafe(self, durable_offset: int) -> None:
        """Durability listener (the log's flusher thread): wake the group's task."""
        try:
            self.loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:
            pass  # the loop is closed: shutting down

    def _fail_waiters(self, error: BaseException) -> None:
        for p in self._proposals:
            if not p.future.done():
                p.future.set_exception(error)
        self._proposals = []
        for _, futures in self._waiters.values():
            for future, _, _ in futures:
                if not future.done():
                    future.set_exception(error)
        self._waiters.clear()
        for _, conf_future in self._conf_waiters.values():
            if not conf_future.done():
                conf_future.set_exception(error)
        self._conf_waiters.clear()
        for future in self._reads.values():
            if not future.done():
                future.set_exception(error)
        self._reads.clear()
        for _, applied_future in self._applied_waiters:
            if not applied_future.done():
                applied_future.set_exception(error)
        self._applied_waiters = []

    def _check_open(self) -> None:
        if self._failure is not None:
            raise RaftError(f"group {self.name} failed: {self._failure}")
        if self._closed:
            raise ProposalDroppedError(f"group {self.name} is stopped")


def initial_conf(members: Sequence[int]) -> ConfState:
    return ConfState(voters=tuple(sorted(members)))
