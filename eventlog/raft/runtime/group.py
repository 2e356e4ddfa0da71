"""One Raft group driven by asyncio: the core, its storage and its state machine.

`RaftGroup` is the group's API on this node and what it does with the state machine; three parts
carry the rest, each owning one thing:

- `ReadyLoop` (ready_loop.py): the task that steps the core and carries out each Ready in the order
  it requires (persist, send, apply, accept; sends held back until the log is durable).
- `Proposals` (proposals.py): proposals from any number of coroutines, coalesced into entries, and
  their callers until the entries commit.
- `Reads` (reads.py): read barriers (ReadIndex, the leader lease) and applied-offset waiters.

A second task ticks the core every `tick_interval_ms`; on the leader it also measures how far
behind each member is (`LagMonitor`: /metrics, and a warning about a member that stays behind).

A membership change (`change_membership`) is one CONF_CHANGE entry: the state machine applies it like
any entry but it carries no records; the storage keeps the configuration (conf-change offsets in
quorum-state, the configuration in every snapshot's meta), so restarts and snapshots preserve it.

Snapshots and truncation never stop the loop for long: every `snapshot_every_entries` applied
offsets or `snapshot_every_bytes` of applied entries, a state machine that offers `snapshot_job`
writes its snapshot in a thread (the views: a RocksDB checkpoint, packed), the loop records it; then
whole log segments below min(snapshot, `retention_floor()`) leave the log, and their files are
unlinked in a thread too.

A full disk stops writes, not the node: when the next log segment cannot be prepared
(`Log.space_error`) or the node's `space_guard` reports too little free space, the leader refuses
proposals with the retriable DiskFullError (and hands leadership to a caught-up voter), a follower
drops the appends that carry new entries (so it never acknowledges them; the leader sends them
again), and the preparation is retried every second until it succeeds. Before it takes entries that need
the next segment, the group checks its file is ready (`Log.room`): while it is still being prepared
the follower drops the append and the leader keeps its proposals queued, so a preparation that fails
late fails no roll under the group, and a slow one never holds the loop. Nothing is half-written:
what is refused never reaches the log, and the views only apply what the log holds. Reads go on.
(Entries the core makes itself, a new leader's NOOP or a membership change, are still appended:
a few dozen bytes, they fit in the active segment unless it is full to its last bytes, and then the
group stops as on any storage failure.)

A damaged batch in the log (eventlog/damage.py) is never served; every tick `LogRepair`
(eventlog/raft/runtime/repair.py) drops it on a follower, which fetches the entries again, after a
leader has handed leadership over. A snapshot installed while the views already applied past it
(fetching a dropped range again) replaces the log only.

Call everything from the loop that runs the group.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import math
import random
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eventlog.cancellation import cancel_and_wait
from eventlog.errors import BatchTooLargeError, DiskFullError, EpochlogError
from eventlog.log import Log
from eventlog.raft.config import RaftConfig
from eventlog.errors import OffsetOutOfRangeError
from eventlog.raft.errors import (
    CompactedError,
    LogRefetchingError,
    NotFoundError,
    NotLeaderError,
    ProposalDroppedError,
    RaftError,
)
from eventlog.raft.node import RaftNode, ReadState, Role
from eventlog.raft.peer_check import PeerCheck
from eventlog.raft.runtime.election_log import ElectionLog
from eventlog.raft.runtime.lag import Behind, LagMonitor
from eventlog.raft.runtime.leader_balance import LeaderBalance, LeaderView
from eventlog.raft.runtime.log_storage import LogStorage, seal_snapshot_data
from eventlog.raft.runtime.peer_drops import PeerDrops
from eventlog.raft.runtime.proposals import Committed as Committed  # re-exported
from eventlog.raft.runtime.proposals import ProducerStamp as ProducerStamp  # re-exported
from eventlog.raft.runtime.proposals import Proposal, Proposals, Told
from eventlog.raft.runtime.reads import Reads
from eventlog.raft.runtime.ready_loop import APPLY_BYTES_PER_TURN, Flush, ReadyLoop, Send
from eventlog.raft.runtime.repair import LogRepair, RepairStatus
from eventlog.raft.types import (
    MAX_TERM,
    ConfChange,
    ConfState,
    Entry,
    EntryKind,
    Message,
    SnapshotMeta,
)

logger = logging.getLogger(__name__)

SNAPSHOT_RETRY_S = 5.0
"""After a failed snapshot (e.g. a full disk) the next one waits this long."""

TERM_LIMIT_REPEAT_S = 60.0
"""While the term is at its limit (types.MAX_TERM), the CRITICAL line saying so repeats this often."""

ApplyAnswering = Callable[[Sequence[Entry], Callable[[Mapping[int, object]], None]], Mapping[int, object] | None]
"""A state machine's optional `apply_answering` (see `StateMachine`)."""

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

    # Optional: `snapshot_job() -> Callable[[Path], int]`: a function the group runs in a thread,
    # while it goes on applying, to write a snapshot of a consistent state to a file; it returns the
    # applied offset that state is at. It may schedule work on the group's loop (the loop keeps
    # running while the group awaits it), and must cope with `restore` and `close` meanwhile (a job
    # whose state a snapshot from the leader replaced may raise: superseded, not counted as failed).
    # Without it the group calls `write_snapshot` on its loop.
    # Optional: `proposed(index, data, records)`: each entry this node proposes as the leader, when it is
    # proposed (eventlog/raft/runtime/proposals.py `OnProposed`).
    # Optional: `speculate(entries)`: on the leader, at the end of a turn that appended or applied, the
    # first entry not committed yet when everything before it is applied (`_leader_turn_ended`); its
    # `apply` must come out as if it had not been called.
    # Optional: `apply_answering(entries, answer)`: `apply`, calling `answer(outcomes)` before it writes
    # when it already knows them (a speculation committed as prepared), so the callers are answered a
    # write sooner; the write follows in the same call, before anything else of the loop runs.


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
    disk_full: str = ""      # why this node refuses writes to the group ("": it does not)
    repair: RepairStatus | None = None   # a damaged batch in its log, or its entries being fetched again


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One committed record seen by a watcher."""

    offset: int
    key: bytes
    value: bytes | None
    timestamp: int
    term: int                  # the term of the leader that appended it (its batch's leader epoch)
    applied: bool | None       # applying it changed the state machine (None: the watch was not told)


ChangedIn = Callable[[int, int], Callable[[bytes | None, int], bool | None]]
"""`changed(lo, hi)`: for the applied records of offsets [lo, hi), a function (record key, offset) ->
whether applying that record changed the state machine (None: unknown). The state machine's own
knowledge (the views' `noops` rows): a committed record may be a rejected write or a retry."""


WrittenKeys = Callable[[bytes, bytes | None], Sequence[bytes]]
"""`written_keys(record key, value)`: the keys a record writes besides its own (the state machine knows:
a transaction's record key names its first operation only)."""


@dataclass(slots=True)
class GroupCounters:
    """What one group did on this node since it started (monotonic; read by metrics)."""

    elections_started: int = 0      # terms in which this node campaigned (voted for itself)
    leader_changes: int = 0         # leaderships (term, leader) this node learned of
    balance_transfers: int = 0      # leaderships this node, as leader, handed over for leader balance
    proposals_committed: int = 0    # `submit` calls answered with their commit offset
    events_applied: int = 0         # records of NORMAL entries applied to the state machine
    clock_stalls: int = 0           # times the tick clock lagged real time and the lease was voided
    appends_dropped: int = 0        # appends from the leader dropped for lack of disk space
    proposals_refused: int = 0      # proposals refused with disk_full


@dataclass(slots=True)
class SnapshotCounters:
    """Snapshots and log truncations of one group on this node since it started (status, metrics)."""

    taken: int = 0
    failed: int = 0
    installed: int = 0              # snapshots received from the leader and installed
    last_offset: int = -1
    last_seconds: float = 0.0       # the last snapshot, from its start to its installation
    last_finished_at: float = 0.0   # time.time() of that (0: none yet)
    last_error: str = ""
    truncations: int = 0            # truncations that deleted segments
    segments_deleted: int = 0
    last_truncation_seconds: float = 0.0   # on the loop (the unlinking runs in a thread)
    last_truncated_at: float = 0.0


class RaftGroup:
    """A Raft group member running on an asyncio loop."""

    def __init__(self, name: str, node_id: int, storage: LogStorage, state_machine: StateMachine,
                 raft_config: RaftConfig, send: Send, *, tick_interval_ms: int, rng: random.Random,
                 snapshot_every_entries: int = 0, snapshot_every_bytes: int = 0,
                 max_batch_bytes: int = 1 << 20, lag: LagMonitor | None = None,
                 peer_check: PeerCheck | None = None, peer_drops: PeerDrops | None = None,
                 balance: LeaderBalance | None = None, flush: Flush | None = None) -> None:
        self.name = name
        self.node_id = node_id
        self.storage = storage
        self.sm = state_machine
        self._speculate: Callable[[list[Entry]], None] | None = getattr(state_machine, "speculate", None)
        self._apply_answering: ApplyAnswering | None = getattr(state_machine, "apply_answering", None)
        self.tick_interval = tick_interval_ms / 1000
        self.snapshot_every_entries = snapshot_every_entries
        self.snapshot_every_bytes = snapshot_every_bytes
        self.max_batch_bytes = max_batch_bytes
        self.node = RaftNode(node_id, storage, raft_config, rng, applied=state_machine.applied_index,
                             max_apply_bytes=APPLY_BYTES_PER_TURN)
        self.loop = asyncio.get_running_loop()
        self.peer_check = peer_check if peer_check is not None else PeerCheck(
            known_peer=lambda _: False, check_snapshot_chunk=storage.snapshot_chunk_refusal)
        self.peer_drops = peer_drops if peer_drops is not None else PeerDrops(node_id)
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._failure: BaseException | None = None
        self._last_snapshot_index = storage.snapshot().index
        # Set by the node: the lowest offset the log must keep whatever the snapshot covers (the
        # retention horizon: policy and export watermarks), None: only the snapshot bounds it.
        self.retention_floor: Callable[[], int | None] | None = None
        # Set by the node: why the disk is too full to take writes (free space below the reserve), or None.
        self.space_guard: Callable[[], str | None] | None = None
        self.counters = GroupCounters()
        self.heard_at: dict[int, float] = {}    # peer -> loop time of its latest message (status: heard_ms)
        self.ticked_at = self.loop.time()   # loop time of the latest tick
        elections = ElectionLog(name, node_id, self.tick_interval, self.heard_at, lambda: self.ticked_at)
        self._ready = ReadyLoop(self, name, self.node, storage, send, loop=self.loop, peer_check=self.peer_check,
                                peer_drops=self.peer_drops, counters=self.counters, elections=elections, flush=flush)
        self._proposals = Proposals(self.loop, self.counters, getattr(state_machine, "proposed", None))
        # Set by the host: whether a ReadIndex may be sent to a node (its hello said so: transport.py).
        self.peer_reads_index: Callable[[int], bool] = lambda _: True
        self._reads = Reads(name, self.node, state_machine, loop=self.loop, wake=self._ready.wake,
                            tick_interval=self.tick_interval, counters=self.counters,
                            peer_reads_index=lambda peer: self.peer_reads_index(peer))
        self.snapshots = SnapshotCounters()
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_work: concurrent.futures.Future[int] | None = None
        self._snapshot_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._snapshot_not_before = 0.0
        self._bytes_since_snapshot = sum(size for _, next_offset, size in storage.log.segment_spans()
                                         if next_offset > self._last_snapshot_index + 1)
        self._disk_full = ""
        self._last_transfer_tick = -math.inf
        self._term_limit_said_at = -math.inf
        # The leader's view of how far behind each member is (logged, and read by metrics).
        self.lag = lag if lag is not None else LagMonitor(warn_after_s=10.0)
        self._lag_term = 0      # the term the monitor watches as leader (0: not leading)
        # Where this group's leadership should be (leader_balance.py); None: balancing is off.
        self.balance = balance
        self.repair = LogRepair(self)
        storage.log.add_durability_listener(self._ready.on_durable_threadsafe)

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        context = contextvars.copy_context()
        context.run(CURRENT_GROUP.set, self)
        self._tasks = [self.loop.create_task(self._ready.run(), name=f"raft-{self.name}", context=context),
                       self.loop.create_task(self._ticker(), name=f"tick-{self.name}", context=context)]

    async def close(self) -> None:
        self._closed = True
        self._ready.stop()
        await cancel_and_wait(self._tasks)
        self._fail_waiters(ProposalDroppedError(f"group {self.name} on node {self.node_id} stopped"))
        await self._wait_snapshot_work()
        if self._failure is None:
            try:
                self._ready.persist_commit(force=True)
            except EpochlogError as exc:
                logger.error("group %s: %s", self.name, exc)
        close = getattr(self.sm, "close", None)
        if close is not None:
            close()
        if self._snapshot_executor is not None:
            self._snapshot_executor.shutdown(wait=False)
        self.storage.close()

    @property
    def failed(self) -> BaseException | None:
        return self._failure

    @property
    def stopped(self) -> bool:
        """Closed, or one of its tasks ended: the group makes no more progress on this node."""
        return self._closed or any(task.done() for task in self._tasks)

    # --- inputs --------------------------------------------------------------------------------

    def deliver(self, peer: int, msg: Message) -> None:
        """A message from `peer` (called by the transport; checked just before the core steps it)."""
        self.heard_at[peer] = self.loop.time()
        self._ready.deliver(peer, msg)

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
        future: asyncio.Future[Committed] = self.loop.create_future()
        self._queue(Proposal(records, future, producer, on_appended))
        return await future

    def submit_told(self, records: list[tuple[bytes | None, bytes | None]],
                    then: Callable[[Committed | BaseException], None]) -> Told:
        """`submit` for a caller told in the turn that applies the entry (`then(committed or the
        error)`), not a loop turn later: the same checks, raised here, and the same outcomes. Cancel the
        returned `Told` when no longer waiting."""
        told = Told(then)
        self._queue(Proposal(records, told))
        return told

    def _queue(self, proposal: Proposal) -> None:
        self._check_open()
        if self.node.role is not Role.LEADER:
            raise NotLeaderError(self.node_id, self.node.leader, self.node.term)
        if proposal.size > self.max_batch_bytes:   # the log would refuse the batch, failing the group
            raise BatchTooLargeError(f"{len(proposal.records)} records of about {proposal.size} bytes exceed "
                                     f"the batch limit of group {self.name} ({self.max_batch_bytes} bytes)")
        if self._check_space():
            self.counters.proposals_refused += 1
            raise self._disk_full_error()
        self._proposals.queue(proposal)
        self._ready.wake()

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
        return await self._reads.barrier(consistency, min_offset, timeout)

    async def commit_barrier(self, timeout: float = 5.0) -> int:
        """Wait until this node, leader or follower, applied every entry committed before the call
        (reads.py); returns its applied offset. NotCaughtUpError past `timeout`."""
        self._check_open()
        return await self._reads.commit_barrier(timeout)

    async def watch(self, prefix: bytes, from_offset: int, *, changed: ChangedIn | None = None,
                    written_keys: WrittenKeys | None = None,
                    chunk_bytes: int = 1 << 20) -> AsyncIterator[WatchEvent]:
        """Committed records whose key starts with `prefix`, or that write a key starting with it (as
        `written_keys` tells: a record may write more keys than its own, e.g. a transaction), from
        `from_offset` on, as they are applied; each record once.

        Reads the log in chunks of at most `chunk_bytes`, as fast as the consumer pulls (that is the
        flow control). A watcher whose offset is no longer in the log record by record (truncated, or
        key-compacted: `full_history_start`) gets CompactedError naming the snapshot to resync from:
        never a silent gap. The check follows each read, so a pass that cleaned the range meanwhile is
        caught too (the cleaned range only grows).

        Each event says whether it changed the state machine (`changed`, asked once per chunk right
        after the check, before the first event of the chunk is yielded: no other task of the loop
        ran since the read, so what it reports is about exactly the records read, all applied).
        """
        offset = max(0, from_offset)
        log = self.storage.log
        while True:
            self._check_open()
            applied = self.sm.applied_index
            if offset > applied:
                await self.wait_applied(offset)
                continue
            self.check_readable(offset)
            try:
                chunk = log.read(offset, chunk_bytes, max_offset=applied + 1)
            except OffsetOutOfRangeError:
                chunk = None
            if chunk is None or offset < full_history_start(log):
                raise CompactedError(f"compacted: offset {offset} is no longer in the log record by record (it "
                                     f"starts at {log.start_offset}, key-compacted below {log.clean_end_offset}); "
                                     f"resync from the snapshot at offset {self.storage.snapshot().index}, then "
                                     f"watch from the offset after it")
            applied_flag = None if changed is None else changed(offset, chunk.next_offset)
            for batch in chunk.batches():
                if batch.header.is_control:
                    continue
                term = batch.header.leader_epoch
                for record in batch.records():
                    if record.offset < offset or record.key is None:
                        continue
                    if record.key.startswith(prefix) or (written_keys is not None and any(
                            k.startswith(prefix) for k in written_keys(record.key, record.value))):
                        yield WatchEvent(record.offset, record.key, record.value, record.timestamp, term,
                                         None if applied_flag is None else applied_flag(record.key, record.offset))
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

    def check_readable(self, offset: int) -> None:
        """LogRefetchingError when this node applied `offset` but its log lacks it: it dropped a damaged
        range and fetches it again (eventlog/raft/runtime/repair.py); another member serves it."""
        log = self.storage.log
        if log.end_offset <= offset <= self.sm.applied_index:
            raise LogRefetchingError(f"node {self.node_id} is fetching offsets {log.end_offset} on of group "
                                     f"{self.name} again (a damaged batch was dropped): another member serves "
                                     f"offset {offset}")

    def request_snapshot(self) -> None:
        """Take a snapshot now (in a thread), whatever the snapshot policy says."""
        self._maybe_snapshot(force=True)

    def hand_over(self, reason: str, *, min_match: int | None = None) -> int:
        """As the leader, hand leadership to the voter that holds the most of the log, if one holds
        through `min_match` (default: the whole log) and no transfer started within an election
        timeout; returns the target (0: none). The transfer catches the target up first."""
        n = self.node
        if n.role is not Role.LEADER:
            return 0
        if n.lead_transferee:
            return n.lead_transferee
        if n.ticks - self._last_transfer_tick < n.cfg.election_timeout_ticks:
            return 0
        need = n.log.last_index() if min_match is None else min_match
        voters = [v for v in n.conf.voters if v != self.node_id and v in n.progress and n.progress[v].match >= need]
        if not voters:
            return 0
        target = max(voters, key=lambda v: n.progress[v].match)
        self._last_transfer_tick = n.ticks
        logger.warning("group %s: %s on the leader: handing leadership to node %s", self.name, reason, target)
        n.transfer_leadership(target)
        self._ready.wake()
        return target

    def discard_held_from(self, index: int) -> None:
        """The storage is about to drop indexes >= `index` (see PersistQueue.discard_from)."""
        self._ready.discard_held_from(index)

    def wake(self) -> None:
        self._ready.wake()

    def snapshot_now(self) -> int:
        """Snapshot the state machine at its applied offset, on the loop, and drop the log below (as far
        as `retention_floor` allows); the snapshot's offset. (Automatic snapshots run in a thread.)"""
        self._check_open()
        applied = self.sm.applied_index
        if applied > self._last_snapshot_index:
            self._snapshot(applied)
        return self._last_snapshot_index

    def truncate_log(self) -> int:
        """Drop the whole log segments below what the group keeps: its latest snapshot and the node's
        `retention_floor`. The segments leave the log here; their files are unlinked in a thread.
        Returns how many segments went."""
        snapshot = self.storage.snapshot().index
        if snapshot < 0 or self._closed or self._failure is not None:
            return 0
        keep = snapshot + 1
        floor = None if self.retention_floor is None else self.retention_floor()
        if floor is not None:
            keep = min(keep, floor)
        log = self.storage.log
        if keep <= log.start_offset or log.failure is not None:
            return 0
        started = time.perf_counter()
        doomed = self.storage.detach_through(keep - 1)
        segments = sum(1 for p in doomed if p.name.endswith(".log.deleted"))
        if doomed:
            self.loop.run_in_executor(None, _unlink_all, doomed)
        if segments:
            c = self.snapshots
            c.truncations += 1
            c.segments_deleted += segments
            c.last_truncation_seconds = time.perf_counter() - started
            c.last_truncated_at = time.time()
        return segments

    @property
    def disk_full(self) -> str:
        """Why this node refuses writes to the group for lack of disk space ("": it does not)."""
        return self._disk_full

    @property
    def snapshot_in_progress(self) -> bool:
        return self._snapshot_task is not None

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to voter `target` (leader only); proposals wait until it is done or times out."""
        self._check_open()
        self.node.transfer_leadership(target)
        self._ready.wake()

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
        future = self._proposals.wait_conf_change(index, self.node.term)
        self._ready.wake()
        try:
            return await asyncio.wait_for(future, max(0.0, deadline - self.loop.time()))
        except TimeoutError:
            raise ProposalDroppedError(f"group {self.name}: membership change at {index} not committed within "
                                       f"{timeout:.1f} s (it may still be)") from None

    async def wait_applied(self, offset: int, timeout: float | None = None) -> None:
        """Until this node's state machine applied `offset` (NotCaughtUpError past `timeout`)."""
        await self._reads.wait_applied(offset, timeout)

    def status(self) -> GroupStatus:
        n = self.node
        repair = self.repair.status()
        return GroupStatus(self.name, self.node_id, n.role.value, n.term, n.leader, n.log.committed,
                           self.sm.applied_index, n.log.last_index(), self.storage.log.start_offset,
                           self.storage.snapshot().index, self._disk_full, repair if repair.active else None)

    # --- the loop ------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        next_tick = self.loop.time() + self.tick_interval
        while not self._closed:
            await asyncio.sleep(max(0.0, next_tick - self.loop.time()))
            next_tick += self.tick_interval
            self._reads.check_clock()
            if self.loop.time() > next_tick + 10 * self.tick_interval:
                next_tick = self.loop.time() + self.tick_interval  # we were stalled: do not burst
            self.ticked_at = self.loop.time()
            self.node.tick()
            self._reads.ticked()
            self._check_term_limit()
            self._observe_lag()
            self._balance_leadership()
            self._state_machine_tick()
            if self._check_space():
                self._while_disk_full()
            self.repair.tick()
            self._ready.wake_if_needed()

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

    def _balance_leadership(self) -> None:
        """On the leader: hand leadership to a more preferred voter once the group is settled and that
        voter is fit (eventlog/raft/runtime/leader_balance.py decides)."""
        if self.balance is None:
            return
        n = self.node
        now = self.loop.time()
        if n.role is not Role.LEADER:
            self.balance.observe(now, None)
            return
        # Heard within two election timeouts: on a loaded machine one is often missed for a moment.
        alive_after = now - 2 * n.cfg.election_timeout_ticks * self.tick_interval
        view = LeaderView(
            me=self.node_id, term=n.term, voters=n.conf.voters, commit=n.log.committed,
            matches={m: p.match for m, p in n.progress.items() if m != self.node_id},
            live=frozenset(m for m, t in self.heard_at.items() if t >= alive_after),
            busy=bool(n.lead_transferee or n.conf_at(n.log.committed) != n.conf or self._disk_full),
            by_transfer=n.won_by_transfer)
        target = self.balance.observe(now, view)
        if target:
            logger.info("group %s: handing leadership to node %s, which the group prefers as its leader "
                        "(leader balance; order %s)", self.name, target, list(self.balance.order(n.conf.voters)))
            n.transfer_leadership(target)
            self.counters.balance_transfers += 1

    def _check_term_limit(self) -> None:
        """Say loudly, and again every TERM_LIMIT_REPEAT_S, that the term reached its limit: this node can
        never start another election, so the group is lost once its last leader is (docs/raft.md)."""
        n = self.node
        if not n.term_exhausted or self.loop.time() - self._term_limit_said_at < TERM_LIMIT_REPEAT_S:
            return
        self._term_limit_said_at = self.loop.time()
        logger.critical("group %s: term %d is at the limit %d (the int32 partitionLeaderEpoch of a record batch): "
                        "node %s can never start another election%s; the data stays readable (epochlog export "
                        "--offline), the group has to be rebuilt in a new cluster (docs/raft.md)", self.name, n.term, MAX_TERM, self.node_id,
                        f" (node {n.leader} leads in this term for now)" if n.leader else "")

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

    def _proposals_queued(self) -> bool:
        return bool(self._proposals.queued)

    def _submit_proposals(self) -> None:
        if not self._proposals.queued:
            return
        if self.node.role is not Role.LEADER:
            self._proposals.refuse_queued(NotLeaderError(self.node_id, self.node.leader, self.node.term))
            return
        if self._check_space() or not self._can_store(self._proposals.queued_bytes_at_most()):
            if self._disk_full:
                self.counters.proposals_refused += self._proposals.refuse_queued(self._disk_full_error())
            return   # else the next segment is still being prepared: the proposals wait for it
        # Entries of up to APPLY_BYTES_PER_TURN (one proposal alone up to max_batch_bytes): an entry is
        # applied whole, so its size bounds how long applying it holds the loop.
        self._proposals.propose_queued(self.node, min(self.max_batch_bytes, APPLY_BYTES_PER_TURN))

    # --- what the Ready loop hands over (eventlog/raft/runtime/ready_loop.py) -------------------

    def _install_snapshot(self, meta: SnapshotMeta) -> None:
        # A snapshot being written in a thread meanwhile: the state machine protects its own files
        # (ViewsStateMachine.restore waits for its flush; the loop must not wait for the whole job).
        path = self.storage.install_snapshot(meta)
        if meta.index > self.sm.applied_index:
            self.sm.restore(path / "data", meta)
        else:
            # Fetching a dropped range again (repair.py): the views already applied past it.
            logger.info("group %s: snapshot %d replaces the log only (the views applied %d)", self.name,
                        meta.index, self.sm.applied_index)
        self._last_snapshot_index = max(self._last_snapshot_index, meta.index)
        self.snapshots.installed += 1
        self._reads.wake_applied()

    def _apply_committed(self, committed: tuple[Entry, ...]) -> None:
        if self._apply_answering is None:
            outcomes = self.sm.apply(committed) or {}
        else:
            # The callers told at once (`Told`) answer before the views write what they already know.
            outcomes = self._apply_answering(committed, functools.partial(self._proposals.resolve, committed,
                                                                          conf_at=self.node.conf_at)) or {}
        self.counters.events_applied += sum(e.count for e in committed if e.kind is EntryKind.NORMAL)
        self._bytes_since_snapshot += sum(e.size for e in committed)
        self._proposals.resolve(committed, outcomes, self.node.conf_at)
        self._maybe_snapshot()
        self._reads.wake_applied()

    def _answer_reads(self, read_states: tuple[ReadState, ...], dropped_reads: tuple[int, ...]) -> None:
        self._reads.resolve(read_states, dropped_reads)

    def _leader_turn_ended(self) -> None:
        """Hand the state machine the first entry not committed yet, when everything before it is applied
        (its optional `speculate(entries)`: prepare applying them before they commit)."""
        speculate = self._speculate
        if speculate is None:
            return
        applied = self.sm.applied_index
        if self.node.log.committed != applied or self.storage.last_index() <= applied:
            return
        try:
            entries = self.storage.entries(applied + 1, applied + 2, APPLY_BYTES_PER_TURN)
        except EpochlogError:   # unreadable (damaged): its apply meets it, not this optional step
            return
        speculate(entries)

    def _loop_failed(self, exc: BaseException) -> None:
        self._failure = exc
        logger.critical("group %s on node %s failed: %r", self.name, self.node_id, exc)
        self._fail_waiters(RaftError(f"group {self.name} failed: {exc}"))

    def _maybe_snapshot(self, *, force: bool = False) -> None:
        if self._snapshot_task is not None:
            return
        since = self.sm.applied_index - self._last_snapshot_index
        every, every_bytes = self.snapshot_every_entries, self.snapshot_every_bytes
        due = force or (every and since >= every) or (every_bytes and self._bytes_since_snapshot >= every_bytes)
        if not due or since <= 0 or self.loop.time() < self._snapshot_not_before:
            return
        job = getattr(self.sm, "snapshot_job", None)
        if job is None:
            try:
                self._snapshot(self.sm.applied_index)   # a small state machine: written on the loop
            except (EpochlogError, OSError) as exc:
                self._snapshot_failed(exc)
            return
        self._bytes_since_snapshot = 0
        self._snapshot_task = self.loop.create_task(self._snapshot_in_thread(job()), name=f"snapshot-{self.name}")

    async def _snapshot_in_thread(self, write: Callable[[Path], int]) -> None:
        """Write a snapshot in a thread while the group goes on; then install it and truncate the log."""
        started = time.monotonic()
        installed = self.snapshots.installed
        tmp: Path | None = None
        try:
            tmp = self.storage.new_snapshot_dir()
            data = tmp / "data"

            def work() -> int:
                index = write(data)
                seal_snapshot_data(data.parent)
                return index

            if self._snapshot_executor is None:
                self._snapshot_executor = concurrent.futures.ThreadPoolExecutor(1, f"snapshot-{self.name}")
            self._snapshot_work = self._snapshot_executor.submit(work)
            index = await asyncio.wrap_future(self._snapshot_work)
            if self._closed or self._failure is not None:
                return
            if index <= self.storage.snapshot().index:   # a newer one was installed from the leader meanwhile
                return
            meta = self.storage.finish_snapshot(tmp, index, self.node.conf_at(index))
            tmp = None
            if meta is not None:
                self._snapshot_done(meta, time.monotonic() - started)
                self.truncate_log()
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - a full disk, RocksDB's own errors: the snapshot waits
            if self.snapshots.installed != installed:
                # The leader's snapshot replaced the state machine's files under the job (the views
                # abandon it): superseded, not failed, so the next one is not held back.
                logger.info("group %s: snapshot superseded by the leader's (%s)", self.name, exc)
            else:
                self._snapshot_failed(exc)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._snapshot_work = None
            self._snapshot_task = None

    async def _wait_snapshot_work(self) -> None:
        """Let a snapshot being written in a thread finish (it reads the state machine's files)."""
        work = self._snapshot_work
        if work is not None:
            try:
                await asyncio.wrap_future(work)
            except BaseException:  # noqa: BLE001 - shutting down; the snapshot is dropped on open
                pass

    def _snapshot(self, applied: int) -> None:
        started = time.monotonic()
        conf = self.node.conf_at(applied)
        meta = self.storage.create_snapshot(applied, conf, self.sm.write_snapshot)
        self._bytes_since_snapshot = 0
        self._snapshot_done(meta, time.monotonic() - started)
        self.truncate_log()

    def _snapshot_failed(self, exc: BaseException) -> None:
        """A snapshot is optional work: the group goes on, and the next one waits SNAPSHOT_RETRY_S."""
        c = self.snapshots
        c.failed += 1
        c.last_error = str(exc)
        self._snapshot_not_before = self.loop.time() + SNAPSHOT_RETRY_S
        logger.warning("group %s: snapshot failed (retried in %.0f s): %s", self.name, SNAPSHOT_RETRY_S, exc)

    def _snapshot_done(self, meta: SnapshotMeta, seconds: float) -> None:
        self._last_snapshot_index = max(self._last_snapshot_index, meta.index)
        c = self.snapshots
        c.taken += 1
        c.last_offset = meta.index
        c.last_seconds = seconds
        c.last_finished_at = time.time()
        c.last_error = ""

    # --- disk space ----------------------------------------------------------------------------

    def _check_space(self) -> bool:
        """Whether writes must be refused for lack of disk space (updates `disk_full`)."""
        error = self.storage.log.space_error
        reason = str(error) if error is not None else ""
        if not reason and self.space_guard is not None:
            reason = self.space_guard() or ""
        if reason != self._disk_full:
            if reason and not self._disk_full:
                logger.error("group %s: disk full, refusing writes until space is freed: %s", self.name, reason)
            elif not reason:
                logger.warning("group %s: disk space is available again: writes resume", self.name)
            self._disk_full = reason
        return bool(reason)

    def _can_store(self, incoming: int) -> bool:
        """Whether `incoming` more bytes can go into the log now, without a roll that waits for the next
        segment's preparation or fails with it (`Log.room`). A failed preparation is a full disk
        (`_check_space` reports it from now on); one still under way means not yet: a follower drops the
        append (the leader sends it again), a leader keeps its proposals queued (each tick retries).
        The loop never waits for the preparation."""
        room = self.storage.log.room(incoming)
        if room is True:
            return True
        if room is not False:
            self._check_space()
        return False

    def _disk_full_error(self) -> DiskFullError:
        return DiskFullError(f"group {self.name} on node {self.node_id} refuses writes: {self._disk_full}; "
                             f"retry once space is freed")

    def _while_disk_full(self) -> None:
        """Every tick while the disk is full: retry preparing the next segment (about once a second) and,
        as the leader, hand leadership to a voter that holds the whole log, so the group stays writable."""
        log = self.storage.log
        if log.space_error is not None and self.node.ticks % max(1, round(1 / self.tick_interval)) == 0:
            log.prepare_next_segment()
        if not self.node.lead_transferee:
            self.hand_over("disk full")

    # --- waiters -------------------------------------------------------------------------------

    def _fail_waiters(self, error: BaseException) -> None:
        self._proposals.fail_all(error)
        self._reads.fail_all(error)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise RaftError(f"group {self.name} failed: {self._failure}")
        if self._closed:
            raise ProposalDroppedError(f"group {self.name} is stopped")


def _unlink_all(paths: Sequence[Path]) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:   # left for the next open, which removes `.deleted` files
            logger.warning("could not remove %s: %s", path, exc)


def full_history_start(log: Log) -> int:
    """The first offset from which `log` holds every committed record as written: past the log start
    and past what key compaction rewrote (`Log.clean_end_offset`, the log start when nothing was
    cleaned). Below it, readers who were promised every event (watch, read_events, exports) are told
    `compacted`; Kafka consumers read the compacted records (each entity's latest)."""
    return max(log.start_offset, log.clean_end_offset)


def initial_conf(members: Sequence[int]) -> ConfState:
    return ConfState(voters=tuple(sorted(members)))
