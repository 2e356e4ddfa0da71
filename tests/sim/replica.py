"""One simulated server: a real RaftNode core, its fake disk, the KV state machine, and the client
requests waiting on it. This is the application side of the Ready contract (node.py's docstring):

    rd = node.ready()
    send rd.send_now                                  -> network, at once
    persist chunks, snapshot, entries, hard state     -> FakeDisk, takes `latency` ticks
    ... when the write completes:
    send rd.send_after                                -> network
    install the snapshot / apply rd.committed         -> KV state machine, answer clients
    queue rd.read_states, fail rd.dropped_reads
    node.advance()
    maybe take a KV snapshot and compact the log      -> MemoryStorage.create_snapshot

While a write is in flight the node keeps ticking and stepping messages (as a real node does while
its fsync runs); it just gets no new Ready until advance().

Pipelined (`pipelined=True`, as the runtime does it): a Ready whose only durable content is entries
(and a commit-only hard state) is handed off at once -- applied and `accept()`ed while its write is
still in flight. A Ready that changes the term or vote or carries snapshot chunks or a snapshot must
be durable before `accept()`, so it waits for its write as above. Either way the accepted Ready
goes into the runtime's own `PersistQueue` (eventlog/raft/persist_queue.py), which releases it --
`persisted(ready)` says which of its `send_after` to send -- once the disk's durable end (kept by
the segmented log's rules, see disk.py) passes its entries: the very code the runtime runs,
truncations included.

A crash drops the core object and whatever was not durable; a restart builds a new RaftNode over
the durable storage and rebuilds the KV state from the stored snapshot, then re-applies the
committed log as the core hands it out (applied = the snapshot index).

A pause (`pause`, `resume`: SIGSTOP and SIGCONT of a real node) is not a crash: nothing is lost.
While paused the node neither ticks nor steps messages (they wait in `inbox`, as in its socket
buffers) nor completes disk writes (the flusher thread is stopped too), and clients cannot reach
it. On resume its logical clock goes on from where it stopped (its timers are stale), the backlog
is stepped before anything newer, and writes that were in flight complete only afterwards. Time
that passed unseen voids its leader lease (`RaftNode.clock_jumped`, as the runtime does when its
ticker finds it was stalled), or it would serve reads from a lease that other nodes' clocks let
expire long ago.

Every step that changes what the checkers watch calls the cluster's hooks (`Hooks`). Not
thread-safe; owned by one Cluster.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.raft.config import RaftConfig
from eventlog.raft.node import RaftNode, Ready, Role
from eventlog.raft.peer_check import PeerCheck
from eventlog.raft.persist_queue import PersistQueue
from eventlog.raft.storage import MemoryStorage
from eventlog.raft.types import Entry, EntryKind, Message
from tests.sim.disk import FakeDisk
from tests.sim.history import History, Operation
from tests.sim.kv import KVStateMachine, decode_op

if TYPE_CHECKING:
    from tests.sim.checkers import Hooks
    from tests.sim.network import Network
    from tests.sim.views_shadow import ViewsShadow


@dataclass(slots=True)
class Waiter:
    """A client request waiting on this replica; `done` tells the client it is over."""

    op: Operation
    done: Callable[[Operation], None]
    term: int = 0          # proposals: the term the entry was proposed in
    data: bytes = b""      # proposals: the entry data


class Replica:
    def __init__(self, node_id: int, storage: MemoryStorage, cfg: RaftConfig, *, rng: random.Random,
                 net: Network, hooks: Hooks, history: History, max_disk_latency: int, torn: float,
                 snapshot_every: int, snapshot_padding: int, peer_check: PeerCheck, pipelined: bool = False,
                 views: ViewsShadow | None = None) -> None:
        self.id = node_id
        self.peer_check = peer_check
        self.cfg = cfg
        self._rng = rng            # the cluster's source: derives each incarnation's own Random
        self.net = net
        self.hooks = hooks
        self.history = history
        self.disk = FakeDisk(storage, random.Random(rng.getrandbits(64)), max_disk_latency, torn)
        self.snapshot_every = snapshot_every
        self.pipelined = pipelined
        self._sync: Ready | None = None     # the Ready waiting for its write before accept / advance
        self._held = PersistQueue()         # pipelined: accepted Readys waiting for the durable end
        self.paused_at = -1                 # tick the node was paused at (-1: running)
        self.resume_at = -1                 # tick it resumes at
        self.inbox: list[Message] = []      # messages that arrived while paused
        self.outbox: list[Message] = []     # messages it had not flushed to its sockets when paused
        self._last_vote = (0, 0)            # (term, vote) of the last hard state handed to the disk
        self.snapshot_padding = snapshot_padding
        self.node: RaftNode | None = None
        self.kv = KVStateMachine(storage.snapshot().conf)
        self.incarnation = 0
        self.restart_at = -1                       # tick of the scheduled restart while crashed
        self.proposals: dict[int, Waiter] = {}     # first index of the proposed entry -> waiter
        self.index_reads: dict[int, Waiter] = {}   # read_index request id -> waiter
        self.ready_reads: list[tuple[int, Waiter]] = []   # (read index, waiter): serve once applied
        self._seen_leader_term = 0
        self._seen_commit = -1
        self.snapshots_taken = 0
        self.snapshots_installed = 0
        self.views = views                         # real RocksDB views fed the same entries (views_shadow.py)
        self.boot()

    @property
    def alive(self) -> bool:
        return self.node is not None

    @property
    def paused(self) -> bool:
        return self.paused_at >= 0

    @property
    def reachable(self) -> bool:
        """Running and not paused: it takes client requests."""
        return self.node is not None and not self.paused

    # --- life cycle ------------------------------------------------------------------------------

    def boot(self) -> None:
        storage = self.disk.durable
        hard, snap = storage.initial_state()
        self.kv = KVStateMachine.from_snapshot(snap, storage.snapshot_data())
        if self.views is not None:
            self.views.boot(snap)
        self.incarnation += 1
        self.node = RaftNode(self.id, storage, self.cfg, random.Random(self._rng.getrandbits(64)),
                             applied=snap.index)
        self._seen_leader_term = 0
        self._seen_commit = -1
        self._sync = None
        self._held.clear()
        self._last_vote = (hard.term, hard.vote)
        self.hooks.restarted(self, hard)

    def crash(self) -> None:
        assert self.node is not None
        applied = self.kv.applied
        self.disk.crash()
        self.node = None
        self.paused_at = self.resume_at = -1
        self.inbox.clear()
        self.outbox.clear()
        if self.views is not None:
            self.views.crash()
        for w in list(self.proposals.values()) + list(self.index_reads.values()):
            self._unknown(w)
        for _, w in self.ready_reads:
            self._unknown(w)
        self.proposals.clear()
        self.index_reads.clear()
        self.ready_reads.clear()
        self.hooks.crashed(self, applied)

    def pause(self, now: int, until: int, *, mid_turn: bool) -> None:
        """SIGSTOP: the process stops where it is (see the module docstring). `mid_turn`: it stops in
        the middle of a loop turn, after writing its last Readys' entries but before its transport
        flushed the messages of that turn (they leave only when it resumes)."""
        assert self.node is not None and not self.paused
        self.paused_at, self.resume_at = now, until
        if mid_turn:
            self.outbox = self.net.take_sent(self.id, now - 1)

    def resume(self, now: int) -> None:
        """SIGCONT: what it had not flushed goes out, the backlog in `inbox` is stepped first (the
        cluster delivers it), writes in flight complete only from now on, and the lease from before
        the pause is void."""
        assert self.node is not None and self.paused
        self.disk.delay(now - self.paused_at)
        self.paused_at = self.resume_at = -1
        for m in self.outbox:
            self.net.send(m, now)
        self.outbox = []
        self.node.clock_jumped()

    # --- inputs ----------------------------------------------------------------------------------

    def step(self, m: Message) -> None:
        assert self.node is not None
        self.node.step(m)
        self.observe()

    def receive(self, peer: int, m: Message, *, forged: bool = False) -> None:
        """A message off the network, from `peer` (the sender the network authenticates): checked as
        the runtime checks it (eventlog/raft/peer_check.py), then stepped unless dropped. `forged`: a
        nemesis made it (tests/sim/forger.py); the hooks judge whether it had to be dropped."""
        assert self.node is not None
        drop = self.peer_check.check(self.node, peer, m)
        self.hooks.peer_message(self, peer, m, drop, forged)
        if drop is None:
            self.step(m)

    def tick(self) -> None:
        assert self.node is not None
        self.node.tick()
        self.observe()

    def observe(self) -> None:
        """Report a newly elected leader, and how far a leader committed (called after every input to
        the core)."""
        node = self.node
        if node is not None and node.role is Role.LEADER:
            if node.term != self._seen_leader_term:
                self._seen_leader_term = node.term
                self.hooks.became_leader(self, node.term)
            if node.log.committed > self._seen_commit:
                self._seen_commit = node.log.committed
                self.hooks.leader_committed(self, node.term, node.log.committed)

    # --- the Ready loop --------------------------------------------------------------------------

    def pump(self, now: int) -> None:
        """Take Readys while allowed (one at a time unless pipelined); zero-latency writes complete."""
        node = self.node
        while node is not None and self._sync is None and node.has_ready():
            rd = node.ready()
            for m in rd.send_now:
                self.net.send(m, now)
            wait = not self.pipelined or self._must_wait(rd)
            if rd.hard_state is not None:
                self._last_vote = (rd.hard_state.term, rd.hard_state.vote)
            if self.pipelined:   # as the runtime does before it writes (eventlog/raft/runtime/group.py)
                if rd.snapshot is not None:
                    self._held.discard_from(rd.snapshot.index + 1)
                if rd.entries:
                    self._held.discard_from(rd.entries[0].index)
            self.disk.begin(rd, now)
            if not wait:
                self._apply(rd)
                node.accept()
                self._held.push(rd)
                self._release(now)
                self._after_apply()
            else:
                self._sync = rd
            self.complete_writes(now)
            node = self.node

    def _must_wait(self, rd: Ready) -> bool:
        """Must `rd` be durable before accept()? (snapshot content, or a new term or vote)"""
        hs = rd.hard_state
        return bool(rd.snapshot_chunks or rd.snapshot is not None
                    or (hs is not None and (hs.term, hs.vote) != self._last_vote))

    def complete_writes(self, now: int) -> None:
        """Writes due by `now` are durable: send what waited for them, apply, advance."""
        node = self.node
        while node is not None and self.disk.due(now):
            rd = self.disk.complete()
            self.hooks.persisted(self, rd)
            if rd is self._sync:
                self._sync = None
                if self.pipelined:
                    self._apply(rd)
                    node.accept()
                    self._held.push(rd)
                else:
                    out = rd.send_after
                    self._apply(rd)
                    node.advance()
                    for m in out:
                        self.net.send(m, now)
                self._after_apply()
            if self.pipelined:
                self._release(now)
                self.observe()

    def _release(self, now: int) -> None:
        """Pipelined: send what accepted Readys held back, in order, as far as the disk is durable."""
        node = self.node
        assert node is not None
        for rd in self._held.pop_durable(self.disk.durable_end):
            for m in node.persisted(rd):
                self.net.send(m, now)

    def _apply(self, rd: Ready) -> None:
        """Step 4 of the contract: install the snapshot into the KV state, apply, queue reads."""
        if rd.snapshot is not None:
            self.kv = KVStateMachine.from_snapshot(rd.snapshot, self.disk.durable.snapshot_data())
            self.snapshots_installed += 1
            for index in [i for i in self.proposals if i <= rd.snapshot.index]:
                self._unknown(self.proposals.pop(index))   # its outcome was not observed here
            if self.views is not None:
                self.views.install(rd.snapshot)
            self.hooks.snapshot_installed(self, rd.snapshot)
        if self.views is not None and rd.committed:
            self.views.apply(rd.committed)   # one WriteBatch per Ready, as the runtime applies
        for entry in rd.committed:
            output = self.kv.apply(entry)
            self.hooks.applied(self, entry)
            if self.proposals:
                self._resolve_proposals(entry, output)
        for rs in rd.read_states:
            w = self.index_reads.pop(rs.request, None)
            if w is not None:
                self.ready_reads.append((rs.index, w))
        for request in rd.dropped_reads:
            w = self.index_reads.pop(request, None)
            if w is not None:
                self._failed(w)

    def _after_apply(self) -> None:
        self.observe()
        self.serve_reads()
        self._maybe_snapshot()

    def _resolve_proposals(self, entry: Entry, output: int | bool | None) -> None:
        for index in [i for i in self.proposals if i <= entry.last_index]:
            w = self.proposals.pop(index)
            if index == entry.index and w.term == entry.term:
                assert entry.kind is EntryKind.NORMAL and entry.data == w.data, (
                    f"node {self.id}: entry {entry.index} term {entry.term} is not the one proposed")
                assert decode_op(entry.data)[0] == w.op.id
                self.history.ok(w.op, output)
                w.done(w.op)
            else:
                self._failed(w)  # another entry holds its index: it can never commit

    def serve_reads(self) -> None:
        if not self.ready_reads:
            return
        waiting = []
        for index, w in self.ready_reads:
            if self.kv.applied >= index:
                self.history.ok(w.op, self.kv.get(w.op.key))
                w.done(w.op)
            else:
                waiting.append((index, w))
        self.ready_reads = waiting

    def _maybe_snapshot(self) -> None:
        storage = self.disk.durable
        if self.snapshot_every <= 0 or self.kv.applied - storage.snapshot().index < self.snapshot_every:
            return
        if self.views is not None and not self.views.can_snapshot(self.kv.applied):
            return   # restarted with views ahead of the KV state: snapshot once the KV state caught up
        meta = storage.create_snapshot(self.kv.applied, self.kv.conf,
                                       self.kv.snapshot_bytes(self.snapshot_padding))
        if self.views is not None:
            self.views.snapshot(meta)
        self.snapshots_taken += 1

    # --- client requests -------------------------------------------------------------------------

    def forget(self, w: Waiter) -> None:
        """The client stopped waiting."""
        for index, other in list(self.proposals.items()):
            if other is w:
                del self.proposals[index]
        for request, other in list(self.index_reads.items()):
            if other is w:
                del self.index_reads[request]
        self.ready_reads = [(i, other) for i, other in self.ready_reads if other is not w]

    def _failed(self, w: Waiter) -> None:
        self.history.failed(w.op)
        w.done(w.op)

    def _unknown(self, w: Waiter) -> None:
        self.history.unknown(w.op)
        w.done(w.op)
