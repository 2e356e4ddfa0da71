"""The task that drives a group's `RaftNode`: step what arrives, carry out each Ready, in the order it requires.

Each turn (woken by a message, a proposal, a tick that left the core something to do, or the log's
flusher when something waits for its sync): send what earlier Readys held back, as far as the log is
now durable (written at once: a leader waits for them); step the messages that pass the peer checks
(eventlog/raft/peer_check.py; a snapshot chunk only once the previous one is staged), hand the queued proposals to the core, and while the core has a Ready carry
it out with pipelined persistence (see `RaftNode.accept`): send `send_now` of a Ready with entries (a
leader's appends are written at once, before its own write); stage snapshot chunks, install a
snapshot; write the entries (group commit: the segmented log's flusher thread syncs them while this
task goes on; with nothing else in flight the task syncs them itself: a follower then acknowledges at
once, a leader counts its own copy at once, see `ReadyLoop._syncs_inline`); persist term and vote when they changed; apply committed entries and answer waiters;
queue `send_now` of a Ready without entries (the commit broadcast, heartbeats: the waiters' replies
leave first, in the next turn, then the peer flush); `accept()`, and take the next Ready: at once, or,
after a Ready that applied committed entries (a slice of at most APPLY_BYTES_PER_TURN), once the loop
ran (the callers that apply answered resume before the turn steps anything else). Accepted Readys wait
in order (`PersistQueue`) until the log's durable offset passes their entries, or what is left of them
once a later Ready replaced a suffix; then their `send_after` goes out through `persisted()` (the leader
counts its own copy only then). A leader's turn that appended or applied entries ends by telling the
group (`_leader_turn_ended`: the loop is free until the acknowledgements come; the views prepare applying
the entry in flight, statemachines/views.py `speculate`).

The commit index is persisted lazily (it is a hint for restarts: the state machine knows what it
applied); term and vote are persisted before any message that depends on them leaves.

What the state machine does with a Ready (apply, restore, answer proposals and reads) is the
group's (`ReadyOwner`); this module owns the order and the persistence.

Concurrency contract: `run` is the only task that steps the core; call everything else from the
group's loop, except `on_durable_threadsafe` (any thread).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Protocol

from eventlog.raft.node import RaftNode, Ready, ReadState, Role, SoftState
from eventlog.raft.peer_check import PeerCheck
from eventlog.raft.persist_queue import PersistQueue
from eventlog.raft.runtime.election_log import ElectionLog
from eventlog.raft.runtime.entries import stored_bytes_at_most
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.peer_drops import PeerDrops
from eventlog.raft.types import Append, Entry, InstallSnapshot, Message, SnapshotMeta

logger = logging.getLogger(__name__)

Send = Callable[[int, str, Message], None]
Flush = Callable[[], None]

APPLY_BYTES_PER_TURN = 256 << 10
"""Committed entries a Ready hands out for applying (at least one entry; RaftNode's max_apply_bytes),
and the size up to which a leader coalesces proposals into one entry (an entry is applied whole).
While more committed entries wait after a slice, the loop runs before the next one, and proposals
queued meanwhile wait until the backlog is applied (so they still coalesce). Every group of a node
shares one loop: applying a backlog at once (a follower catching up, a leader whose commit index
jumped), or entries of 1 MiB, held it for up to seconds on a loaded machine, and every group's
heartbeats with it, so followers elected (issue 20). 256 KiB is about 800 of bench/vs_etcd's batched
puts (~330 bytes a record), 5-7 ms of applying on an idle machine (bench/apply_cost.py). At 64 KiB,
two such writes of 100 puts did not fit one entry: every write was an entry of its own, with its own
append, messages, acknowledgements and apply (256 KiB: 11-19 % less server CPU per event, bench/RESULTS.md
issue-20-entry-size)."""

INLINE_SYNC_MAX_BYTES = 64 << 10
"""A node syncs a Ready's entries on the loop only up to this many entry bytes (Entry.size)."""

INLINE_SYNC_MAX_SECONDS = 0.002
"""... and only while the latest sync of its log took at most this long: a slow disk (a sync of tens of
ms on a loaded machine) goes back to the flusher thread, whose next quick sync lets the loop sync again.
An inline sync holds every group of the node, as any work on the loop; epochlog_loop_stall_seconds
sees it."""


class Counters(Protocol):
    """The group counters the loop keeps (GroupCounters)."""

    elections_started: int
    leader_changes: int
    appends_dropped: int


class ReadyOwner(Protocol):
    """What the group does for its Ready loop."""

    def _submit_proposals(self) -> None:
        """Hand the queued proposals to the core (or refuse them)."""
        ...

    def _proposals_queued(self) -> bool:
        """Whether proposals wait for `_submit_proposals`."""
        ...

    def _check_space(self) -> bool:
        """Whether writes must be refused for lack of disk space."""
        ...

    def _can_store(self, incoming: int) -> bool:
        """Whether `incoming` more bytes can go into the log now (else the append waits: it is dropped)."""
        ...

    def _install_snapshot(self, meta: SnapshotMeta) -> None:
        """Install the snapshot a Ready carries (its chunks are staged) and restore the state machine."""
        ...

    def _apply_committed(self, committed: tuple[Entry, ...]) -> None:
        """Apply committed entries and answer whoever waits for them."""
        ...

    def _answer_reads(self, read_states: tuple[ReadState, ...], dropped_reads: tuple[int, ...]) -> None:
        ...

    def _leader_turn_ended(self) -> None:
        """A leader's turn that appended or applied entries ended: the loop is free until the next
        message (with one write in flight, the acknowledgement that commits it)."""
        ...

    def _loop_failed(self, exc: BaseException) -> None:
        """The loop stops for good (a failed fsync, a broken invariant): fail every waiter."""
        ...


class ReadyLoop:
    """The Ready loop of one group on this node (see the module docstring)."""

    def __init__(self, owner: ReadyOwner, name: str, node: RaftNode, storage: LogStorage, send: Send, *,
                 loop: asyncio.AbstractEventLoop, peer_check: PeerCheck, peer_drops: PeerDrops,
                 counters: Counters, elections: ElectionLog, flush: Flush | None = None) -> None:
        self.owner = owner
        self.name = name
        self.node = node
        self.storage = storage
        self._send = send
        self._flush = flush   # writes what `send` queued now (else it leaves at the end of the loop's turn)
        self.loop = loop
        self.peer_check = peer_check
        self.peer_drops = peer_drops
        self.counters = counters
        self.elections = elections
        self._inbox: list[tuple[int, Message]] = []   # (the peer it came from, the message)
        self._wake = asyncio.Event()
        self._held = PersistQueue()   # accepted Readys whose send_after waits for their entries' fsync
        self._stopped = False
        self._persisted_commit = node.log.committed
        self._seen_term = node.term
        self._seen_leadership = (node.term, node.leader)
        self._loop_thread: int | None = None   # the thread `run` runs on (durability reported there)
        self._turning = False   # `run` is in a turn: durability reported on the loop meanwhile needs no wake-up
        # Whether the flusher thread's next report of durability wakes `run` (read from that thread; set at
        # the end of each turn, see _end_turn): on a leader whose own sync cannot commit anything and holds
        # no message back, the report can wait for the next turn (the next acknowledgement, at the latest
        # the next tick), which releases it first thing.
        self._wake_on_durable = True

    def deliver(self, peer: int, msg: Message) -> None:
        self._inbox.append((peer, msg))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def wake_if_needed(self) -> None:
        """Wake `run` if it has something to do (after a tick): a Ready (the core's heartbeats, a campaign,
        entries the tick unblocked), messages, proposals or held Readys. Most ticks of a follower change
        nothing a turn would act on; an empty turn costs a task switch and the turn's checks, ~20 a
        second per group a node follows."""
        if self._inbox or self._held or self.owner._proposals_queued() or self.node.has_ready():
            self._wake.set()

    def stop(self) -> None:
        """End `run` after its current turn."""
        self._stopped = True
        self._wake.set()

    def discard_held_from(self, index: int) -> None:
        """The storage is about to drop indexes >= `index` (see PersistQueue.discard_from)."""
        self._held.discard_from(index)

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        try:
            while not self._stopped:
                await self._wake.wait()
                self._wake.clear()
                self._turning = True
                self._release_persisted()
                backlog = False   # applying committed entries in slices, the loop running between them
                worked = False    # a Ready of this turn appended or applied entries
                while True:
                    self._step_inbox()
                    if not backlog:   # proposals queued meanwhile wait for the backlog: bigger entries
                        self.owner._submit_proposals()
                    if not self.node.has_ready():
                        if self._inbox:
                            continue
                        break
                    rd = self.node.ready()
                    worked = worked or bool(rd.entries or rd.committed)
                    if self._handle(rd):
                        self.node.advance()   # persisted, sent and applied: the synchronous contract
                    else:
                        self.node.accept()
                    self._release_persisted()
                    if rd.committed:
                        # The tasks this apply answered (writes awaited by the gRPC and Kafka faces, reads
                        # waiting for the applied offset; a native write was answered in the apply itself,
                        # RaftGroup.submit_told) run before the turn steps anything else (a second
                        # acknowledgement of the same entry: put-c1 p50, bench/RESULTS.md issue-20-reply-first);
                        # a backlog's next slice waits for the loop likewise (APPLY_BYTES_PER_TURN).
                        backlog = self.node.log.applicable()
                        self._turning = False
                        await asyncio.sleep(0)
                        self._turning = True
                    else:
                        backlog = False
                if worked and self.node.role is Role.LEADER:
                    self.owner._leader_turn_ended()
                self.persist_commit(force=False)
                self._turning = False
                self._end_turn()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a failed fsync or a broken invariant: this node must stop
            self.owner._loop_failed(exc)
            raise

    def _end_turn(self) -> None:
        """Before waiting: decide whether the flusher thread's next report of durability wakes this task.

        It must when that report lets something leave, commit or apply: a held acknowledgement or vote
        (any held Ready with `send_after`, every non-leader), or the leader's own copy completing a
        majority or holding committed entries durably (`RaftNode.awaits_own_sync`). Otherwise (a leader
        whose followers have acknowledged nothing past the commit index yet: one write in flight, its
        sync done before their acks) the report waits for the next turn, whose first step releases it;
        that turn is the acknowledgement it would have waited for anyway. The flag is set before the
        durable offset is read again here, and the thread advances the offset before it reads the flag,
        so a report this turn skipped (made while the flag was still clear) is seen below: never a Ready
        left waiting for a wake-up that does not come.
        """
        node = self.node
        wake = node.role is not Role.LEADER or self._held.holds_messages() or node.awaits_own_sync()
        self._wake_on_durable = wake
        if wake:
            waits = self._held.oldest_wait()
            if waits is not None and waits < self.storage.log.durable_offset:
                self._wake.set()   # durable already, reported while the flag was clear or during the turn

    def _step_inbox(self) -> None:
        if not self._inbox:
            return
        msgs, self._inbox = self._inbox, []
        full = self.owner._check_space()
        node = self.node
        taken = 0   # bytes of the entries stepped so far: this turn writes them together with the next
        for i, (peer, m) in enumerate(msgs):
            drop = self.peer_check.check(node, peer, m)
            if drop is not None:   # as if the network lost it (eventlog/raft/peer_check.py)
                self.peer_drops.dropped(self.name, peer, drop, m)
                continue
            if isinstance(m, Append) and m.entries and m.entries[-1].last_index > node.log.last_index():
                size = stored_bytes_at_most(m.entries)
                if full or not self.owner._can_store(taken + size):
                    # Never acknowledged, so the leader sends it again; by then the disk may have room, or
                    # the next segment be prepared.
                    self.counters.appends_dropped += 1
                    continue
                taken += size
            self.node.step(m)
            if isinstance(m, InstallSnapshot) and i + 1 < len(msgs):
                # The check of the next chunk reads the storage's staged image: stage this one first
                # (the rest waits for this Ready to be handled; PeerCheck.check_snapshot_chunk).
                self._inbox = msgs[i + 1:] + self._inbox
                return

    def _handle(self, rd: Ready) -> bool:
        """Carry out `rd`; True if its entries were synced here and its `send_after` went out (then
        `advance`, else `accept` and hold it until the log is durable)."""
        if rd.elections:
            self.elections.report(rd.elections)
        if rd.soft_state is not None:
            self._count_soft_state(rd.soft_state)
        if rd.entries:
            for m in rd.send_now:
                self._send(m.dst, self.name, m)
            if rd.send_now and self._flush is not None:
                # The leader's appends leave before it writes (and applies) anything itself: a follower's
                # write and fsync, not the leader's, are what a commit waits for (thesis §10.2.1).
                self._flush()
        storage = self.storage
        for chunk in rd.snapshot_chunks:
            storage.stage_snapshot_chunk(chunk.meta, chunk.offset, chunk.data)
        if rd.snapshot is not None:
            self._held.discard_from(rd.snapshot.index + 1)   # the log is reset behind the snapshot
            self.owner._install_snapshot(rd.snapshot)
        synced = False
        if rd.entries:
            # Entries from here on replace any stored suffix: earlier Readys no longer wait for the
            # replaced ones (they will never be durable; see eventlog/raft/persist_queue.py).
            self._held.discard_from(rd.entries[0].index)
            synced = self._syncs_inline(rd)
            storage.append(rd.entries, sync=synced)   # a failed sync raises: this node stops
        if rd.hard_state is not None:
            prev = storage.initial_state()[0]
            hs = rd.hard_state
            if (hs.term, hs.vote, hs.floor_index) != (prev.term, prev.vote, prev.floor_index):
                storage.set_hard_state(hs)  # before any vote or ack leaves (§5.1)
                self._persisted_commit = rd.hard_state.commit
        if synced:
            # Everything is durable: the acknowledgements leave now, before applying (the leader
            # commits on them), and nothing is held (no earlier Ready was: _syncs_inline).
            for m in rd.send_after:
                self._send(m.dst, self.name, m)
            if rd.send_after and self._flush is not None:
                self._flush()
            if rd.send_after and rd.committed and self.node.role is not Role.LEADER:
                # A follower about to apply (at one write in flight: the previous write, whose commit
                # came with this append) yields its core first. The acknowledgement just woke the
                # leader, often onto this core (loopback wakes the reader where the writer runs), and
                # the leader's commit, apply and reply are the write's path; this apply is not. With
                # fewer cores than busy processes it would share the core with that path (put-c1 p50
                # -9 %, issue-20-put-hops in bench/RESULTS.md). Nothing of this node's own work moves:
                # it acknowledges and applies as before, only maybe later; on an idle core at once.
                os.sched_yield()
        else:
            self._held.push(rd)
        if rd.committed:
            self.owner._apply_committed(rd.committed)
        self.owner._answer_reads(rd.read_states, rd.dropped_reads)
        if not rd.entries:
            # Queued after the waiters this Ready answered were woken (their tasks run first in the
            # next turn, so their replies leave before this turn's peer flush): what such a Ready
            # sends (the commit broadcast, heartbeats) is off a client's path, the reply is on it.
            for m in rd.send_now:
                self._send(m.dst, self.name, m)
        return synced

    def _syncs_inline(self, rd: Ready) -> bool:
        """Whether this node syncs `rd`'s entries on the loop rather than through the flusher thread.

        A follower acknowledges an append only once it is durable, and the leader commits on that
        acknowledgement, so the follower's sync is on every write's path. Through the thread, that
        path has two wake-ups: the thread's to start the sync, the loop's when it is done (0.1-0.2 ms
        each on a busy 2-core machine, issue-20-latency in bench/RESULTS.md). When nothing else is in
        flight for the log (no earlier Ready waits for a sync, nothing appended is unsynced: the thread
        is idle), the thread buys no group commit, so the loop syncs itself and the acknowledgement
        leaves in this turn. Appends that arrive meanwhile wait in the socket and are stepped, written
        and synced together in the next turn; while the thread does have a sync in flight, new appends
        go to it as before (group commit).

        A leader's own sync runs beside replication (its appends left before it writes, `_handle`),
        and with one write in flight it usually ends before the first acknowledgement arrives
        (issue-20-latency): there the thread's hand-off (a notify, the thread taking the GIL twice, its
        report) is CPU spent for nothing, so an idle leader syncs on the loop too, and the turn of
        the acknowledgement that commits finds its own copy durable. The price: an acknowledgement
        that arrives during the sync waits for it (two followers' acknowledgements could have
        committed without the leader's copy), which the bound on the last sync's time keeps short.

        Only small writes, and only while syncs are quick (INLINE_SYNC_MAX_*): an inline sync holds
        the loop. Only the `group` policy: `fsync` syncs every append anyway, and `interval`
        promises the thread's period, not a sync per append.
        """
        log = self.storage.log
        return (rd.snapshot is None
                and not self._held
                and log.config.flush_policy == "group"
                and log.durable_offset >= log.end_offset
                and log.last_sync_seconds <= INLINE_SYNC_MAX_SECONDS
                and sum(e.size for e in rd.entries) <= INLINE_SYNC_MAX_BYTES)

    def _count_soft_state(self, soft: SoftState) -> None:
        """Count elections and leader changes. A Ready reports the state at its making, so changes
        between two Readys (one loop turn) fold into one: two campaigns in one turn count once."""
        counters = self.counters
        node_id = self.node.id
        if soft.term > self._seen_term and self.node.vote == node_id:
            counters.elections_started += 1
        self._seen_term = soft.term
        if soft.leader != 0 and (soft.term, soft.leader) != self._seen_leadership:
            counters.leader_changes += 1
            self._seen_leadership = (soft.term, soft.leader)
            logger.info("group %s: node %s leads in term %s%s", self.name, soft.leader, soft.term,
                        " (this node)" if soft.leader == node_id else "")

    def persist_commit(self, *, force: bool) -> None:
        """Persist the commit index: lazily (every 10,000 offsets), or now with `force` (closing)."""
        committed = self.node.log.committed
        if committed == self._persisted_commit:
            return
        if force or committed - self._persisted_commit >= 10_000:
            self.storage.set_hard_state(self.node.hard_state)   # with the vote floor, if any
            self._persisted_commit = committed

    def _release_persisted(self) -> None:
        """Send what accepted Readys held back, in order, as far as the log is durable. The
        acknowledgements of entries leave at once, as a leader waits for them to commit (not after the
        rest of this turn's work); what Readys without entries held back (heartbeat answers: a
        linearizable read's round) leaves with the turn's other messages, in one write per peer."""
        log = self.storage.log
        if log.failure is not None:
            raise log.failure  # a failed fsync is fatal: never wait for, or pretend, durability
        acks = False
        for rd in self._held.pop_durable(log.durable_offset):
            for m in self.node.persisted(rd):
                self._send(m.dst, self.name, m)
                acks = acks or bool(rd.entries)
        if acks and self._flush is not None:
            self._flush()

    def on_durable_threadsafe(self, durable_offset: int) -> None:
        """Durability listener (the log's flusher thread, or the loop's own sync): wake the loop's task
        when something waits for it (see _end_turn). A failed sync always wakes it (it must stop)."""
        if threading.get_ident() == self._loop_thread:
            # A sync on the loop (an inline sync, the fsync policy). In a turn it was the turn's own
            # append: the turn releases what it made durable before it takes the next Ready, and
            # _end_turn checks again, so waking the task would only run an empty turn.
            if not self._turning:
                self._wake.set()   # no self-pipe write
            return
        if not self._wake_on_durable and self.storage.log.failure is None:
            return
        try:
            self.loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:
            pass  # the loop is closed: shutting down
