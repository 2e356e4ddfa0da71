"""The Raft consensus core: a sans-IO state machine (the etcd raft design).

Theory of operation. A `RaftNode` holds all protocol state of one member of one Raft group and
touches nothing outside itself: no sockets, files, clocks, threads or global randomness. It is
driven by four inputs:

- `tick()`: one unit of logical time passed (the runtime calls it every tick_interval_ms);
- `step(message)`: a message from a peer arrived;
- `propose(...)`, `propose_conf_change(...)`, `transfer_leadership(...)`, `read_index(...)`: local
  requests (raising NotLeaderError with a leader hint on a non-leader); `forward_read_index(...)`,
  a follower's read, which its leader confirms (ReadIndex / ReadIndexResp);
- `advance()`: the application finished handling the last `Ready` (or, pipelined, `accept()` now
  and `persisted(ready)` once its entries are durable: see `accept`).

and produces one output, `ready()`, the `Ready` contract (enforced: a second `ready()` before
`advance()` or `accept()` is an error):

1. send `send_now` at once: appends, heartbeats, snapshot chunks and TimeoutNow of a leader whose
   term and vote are already durable; they promise nothing about this node's disk (thesis §10.2.1:
   the leader writes its own log in parallel with replicating it);
2. persist, in this order: stage `snapshot_chunks`, install `snapshot` (it replaces the whole log),
   append `entries` (replacing any stored suffix from the first one's index; they may follow the
   snapshot just installed), then `hard_state`, with fsync when `must_sync`;
3. only then send `send_after` (votes, vote and append acknowledgements...);
4. apply `committed` entries in order and answer `read_states` once applied through their index;
5. call `advance()`.

`elections` asks for nothing: it reports what happened in elections since the last Ready (who
campaigned and why, a lost campaign, a leader stepping down, a vote for a later term), for the
runtime to log (`CampaignStarted`, `CampaignLost`, `SteppedDown`, `VoteCast`).

A runtime that pipelines persistence does steps 1, 2 (all but waiting for the entries to be durable)
and 4, calls `accept()`, and later, in order, sends each accepted Ready's `send_after` and calls
`persisted(ready)` as its entries become durable; the leader counts its own copy, and a follower
acknowledges, only then.

Roles are swapped step and tick functions (`_step_leader`, `_tick_heartbeat`, ...). Indexes are
log offsets and an entry is a batch covering `count` indexes (see `eventlog.raft.types`).

Safety rules implemented here, with the paper sections they come from: votes and terms are durable
before any vote or acknowledgement leaves (§5.1, via send_after); a vote goes only to a candidate
whose log is at least as up to date (§5.4.1); a leader commits by counting replicas only entries
of its current term (§5.4.2), by majority of durable acknowledgements; pre-vote (thesis §9.6) and
check-quorum with leader stickiness (§4.2.3, §6.2) keep a partitioned node from disrupting a
healthy leader; reads are linearizable through ReadIndex (§6.4), at the leader or asked of it by a
follower, or a leader lease (§6.4.1).

Damaged entries (`drop_entries`). Raft assumes stable storage keeps what it was given; a disk that
rots breaks that. A follower whose runtime finds an entry damaged drops it and every later one, and
the leader, which holds every committed entry (Leader Completeness, §5.4), sends them again. That is
safe only if the dropping node stops counting as a holder of what it dropped: its acknowledgements
never cover the dropped entries (`held_committed`; `persisted` drops acks past the log's end; its
rejections say `lost`, and the leader lowers its match), and, since its copy may have been one of the
majority that committed them, it keeps the *vote floor*, the end of its log before the drop, durable
in its hard state: it votes only for candidates at least that up to date and never campaigns until
its own log is again (so no leader lacking a committed entry can be elected with its help). Its
commit and applied indexes stay where they were: the state machine applied the entries before they
were damaged, and the copies that fill the hole are not applied again. A leader never drops: its
runtime hands leadership over first.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.raft.config import RaftConfig
from eventlog.raft.confchange import apply_conf_change, decode_conf_change, encode_conf_change
from eventlog.raft.errors import CompactedError, ConfChangeError, NotLeaderError, ProposalDroppedError, RaftError
from eventlog.raft.progress import Progress, ProgressState, committed_index, majority, vote_result
from eventlog.raft.raft_log import RaftLog
from eventlog.raft.storage import Storage
from eventlog.raft.types import (
    MAX_TERM,
    Append,
    AppendResp,
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResp,
    InstallSnapshot,
    InstallSnapshotResp,
    Message,
    PreVote,
    PreVoteResp,
    ReadIndex,
    ReadIndexResp,
    SnapshotMeta,
    TimeoutNow,
    Vote,
    VoteResp,
)

if TYPE_CHECKING:
    import random   # only the type of the injected source: the core never draws from the global one


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state worth reporting when it changes (not persisted)."""

    leader: int
    role: Role
    term: int


class CampaignReason(enum.Enum):
    """Why a node campaigns."""

    TIMEOUT = "election timeout"          # it heard from no leader for its randomized election timeout
    TRANSFER = "leadership transfer"      # its leader sent TimeoutNow (thesis §3.10)
    REQUESTED = "requested"               # `RaftNode.campaign()` (tests, tools)


@dataclass(frozen=True, slots=True)
class CampaignStarted:
    """This node started a pre-vote (`pre_vote`: for `term`, its own term unchanged, thesis §9.6) or an
    election in `term`. `leader` is the leader it last heard from (0: none since it started) and
    `silent_ticks` the ticks since then (since it started, without one); `timeout_ticks` the randomized
    timeout that fired (TIMEOUT); `transfer_from` the leader that sent TimeoutNow (TRANSFER); `attempt`
    counts campaigns since it last heard from a leader (1: the first); `pre_vote_granted` the voters that
    granted the pre-vote this election follows (empty: none held)."""

    term: int
    pre_vote: bool
    reason: CampaignReason
    leader: int
    silent_ticks: int
    timeout_ticks: int
    transfer_from: int
    attempt: int
    pre_vote_granted: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CampaignLost:
    """A majority refused this node's pre-vote or election in `term` (refusals from `refused`)."""

    term: int
    pre_vote: bool
    granted: tuple[int, ...]
    refused: tuple[int, ...]


class StepDownReason(enum.Enum):
    CHECK_QUORUM = "check-quorum"     # no word from a majority within an election timeout (§6.2)
    HIGHER_TERM = "higher term"       # a message of a later term arrived
    REMOVED = "removed"               # its own removal committed (thesis §4.2.2)


@dataclass(frozen=True, slots=True)
class SteppedDown:
    """This node stopped leading in `term`. CHECK_QUORUM: only `heard_from` (itself included) of the
    voters answered within `timeout_ticks`; `last_heard` has (voter, ticks since its latest answer, -1:
    none in this term) for the others. HIGHER_TERM: node `src` sent a `message` of `new_term`."""

    term: int
    reason: StepDownReason
    heard_from: tuple[int, ...] = ()
    voters: tuple[int, ...] = ()
    timeout_ticks: int = 0
    src: int = 0
    message: str = ""
    new_term: int = 0
    last_heard: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class VoteCast:
    """This node answered (or ignored: `refusal` says so) node `candidate`'s vote request for `term`,
    a term above its own when the request arrived. `refusal` is empty when granted."""

    term: int
    candidate: int
    granted: bool
    refusal: str = ""


ElectionEvent = CampaignStarted | CampaignLost | SteppedDown | VoteCast
"""What the core reports about elections through `Ready.elections` (the runtime logs them)."""


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read `request` may be answered once the state machine applied `index`."""

    request: int
    index: int


@dataclass(frozen=True, slots=True)
class _FollowerRead:
    """A follower's ReadIndex request `ctx` from `node`, as its leader queues it with its own reads."""

    node: int
    ctx: int


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Bytes [offset, offset + len(data)) of an incoming snapshot: stage them."""

    meta: SnapshotMeta
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """Everything the application must do, in the order of the module docstring."""

    hard_state: HardState | None
    entries: tuple[Entry, ...]
    snapshot_chunks: tuple[SnapshotChunk, ...]
    snapshot: SnapshotMeta | None
    send_now: tuple[Message, ...]
    send_after: tuple[Message, ...]
    committed: tuple[Entry, ...]
    read_states: tuple[ReadState, ...]
    dropped_reads: tuple[int, ...]
    soft_state: SoftState | None
    must_sync: bool
    elections: tuple[ElectionEvent, ...] = ()   # to report (log), nothing to do

    @property
    def empty(self) -> bool:
        return not (self.hard_state or self.entries or self.snapshot_chunks or self.snapshot or self.send_now
                    or self.send_after or self.committed or self.read_states or self.dropped_reads
                    or self.soft_state or self.elections)


_LEADER_MESSAGES = (Append, Heartbeat, InstallSnapshot, TimeoutNow, ReadIndexResp)
MAX_FORWARDED_READS = 4096
"""A follower's reads asked of its leader and not answered yet, at most (a lost ReadIndex is never answered)."""


class RaftNode:
    """One member of one Raft group. Call only from one thread (the group's loop task)."""

    def __init__(self, node_id: int, storage: Storage, config: RaftConfig, rng: random.Random, *,
                 applied: int = -1, max_apply_bytes: int = 64 << 20) -> None:
        if node_id <= 0:
            raise RaftError(f"node ids are positive integers, got {node_id}")
        config.validate()
        self.id = node_id
        self.cfg = config
        self._rng = rng
        self._max_apply_bytes = max_apply_bytes
        hard, snap = storage.initial_state()
        self.log = RaftLog(storage, hard.commit, applied, dropped=hard.floor_index >= 0)
        self._floor = (hard.floor_term, hard.floor_index) if hard.floor_index >= 0 else None   # vote floor
        self.term = hard.term
        self.vote = hard.vote
        if self.log.last_term() > hard.term:
            # A crash kept entries of a Ready and lost its hard state, written after them (a torn write;
            # or the log's pages reached the disk before the term did): the log holds entries of a term
            # this node never recorded. Every node's term is at least its last entry's (its PreVote and
            # Vote say so, and the peer checks drop one that does not), so take that term. No vote in it
            # was cast: a vote is durable before it is sent, and it would have recorded the term.
            # The next Ready persists it (`_prev_hard` is still the stored one).
            self.term, self.vote = self.log.last_term(), 0
        self.leader = 0
        self.role = Role.FOLLOWER
        self.ticks = 0                      # logical clock: ticks since this object was created
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = 0
        self._votes: dict[int, bool] = {}
        self.progress: dict[int, Progress] = {}
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._dropped_reads: list[int] = []
        self._snapshot_chunks: list[SnapshotChunk] = []
        self._incoming: tuple[SnapshotMeta, int] | None = None   # snapshot being received, next offset
        self._needs_broadcast = False
        self.lead_transferee = 0
        # This node leads because the previous leader handed leadership over (TimeoutNow), not by an
        # election after a timeout: a deliberate placement (the runtime's leader balance leaves it).
        self.won_by_transfer = False
        self._transfer_campaign = False
        # What the Readys report about elections (Ready.elections), and the facts they report.
        self._elections: list[ElectionEvent] = []
        self._heard_leader = 0              # the leader this node last heard from (0: none since start)
        self._heard_leader_tick = 0         # ... at this tick
        self._campaigns_unheard = 0         # campaigns since then
        self._campaign_reason = CampaignReason.TIMEOUT   # of the pre-vote under way
        self._campaign_transfer_from = 0
        self._uncommitted: deque[tuple[int, int]] = deque()        # (last index, bytes) not yet committed
        self._uncommitted_bytes = 0
        # heartbeat rounds confirm leadership for ReadIndex and leases
        self._round = 0
        self._round_sent_tick: dict[int, int] = {}
        self._confirmed_round = 0
        self._lease_start_tick: int | None = None
        self._lease_revoked = False         # a TimeoutNow went out in this term: no more lease reads
        # (round, request, index); a request is this node's own (an int) or a follower's
        self._reads_for_round: deque[tuple[int, int | _FollowerRead, int]] = deque()
        self._reads_unassigned: list[int | _FollowerRead] = []
        self._reads_awaiting_commit: list[int | _FollowerRead] = []
        self._reads_forwarded: list[int] = []   # as a follower: requests sent to the leader, unanswered
        # membership: (index it took effect at, configuration), oldest first
        self._confs: list[tuple[int, ConfState]] = [(snap.index, snap.conf)]
        for e in storage.conf_entries():
            self._confs.append((e.index, apply_conf_change(self._confs[-1][1], decode_conf_change(e.data))))
        self._prev_hard = hard
        # Restarted with durable state (a term): it may have acknowledged a leader's heartbeat just
        # before the crash, backing that leader's lease, and cannot know when. Any node that ever
        # acknowledged a leader persisted a term >= 1 first (send_after), so a fresh node is exempt.
        self._restarted = hard.term > 0
        self._prev_soft = SoftState(0, Role.FOLLOWER, self.term)
        self._outstanding: Ready | None = None
        self._handed_off = self.log.stable_last_index()  # last index handed out in an accepted Ready
        self._step = self._step_follower
        self._tick = self._tick_election
        self._become_follower(self.term, 0)
        self._maybe_clear_floor()   # a floor persisted after the log was whole again is stale

    # --- public inputs -------------------------------------------------------------------------

    @property
    def conf(self) -> ConfState:
        """The membership in force: the latest one in the log, committed or not (§4.1)."""
        return self._confs[-1][1]

    def conf_at(self, index: int) -> ConfState:
        """The membership as of `index` (for a snapshot taken there): the last change at or below it."""
        for at, conf in reversed(self._confs):
            if at <= index:
                return conf
        return self._confs[0][1]

    @property
    def term_exhausted(self) -> bool:
        """The term reached MAX_TERM: this node can never start another election (a loud error for
        the runtime to report; a leader in that term leads on until it loses office)."""
        return self.term >= MAX_TERM

    def confs_since(self, index: int) -> tuple[ConfState, ...]:
        """The configuration in force at `index` and every later one in the log, oldest first. From
        the commit index: every configuration a change in flight may still leave in force."""
        return (self.conf_at(index), *(conf for at, conf in self._confs if at > index))

    @property
    def heartbeat_round(self) -> int:
        """The latest heartbeat round this node started as leader (its followers echo it)."""
        return self._round

    def tick(self) -> None:
        self.ticks += 1
        self.log.apply_blocked = False   # try reading the next entry to apply again
        self._tick()

    def step(self, m: Message) -> None:
        """Handle a message from a peer (messages for other nodes are a caller bug).

        The core trusts its peers to follow the protocol: the runtime checks every message from the
        network first (eventlog/raft/peer_check.py). Only the term limit is the core's own rule.
        """
        assert m.dst == self.id, f"message for {m.dst} stepped into node {self.id}"
        if m.term > MAX_TERM:
            return  # a term no node can write (types.MAX_TERM): never adopted, granted or answered
        term_before = self.term
        if m.term > self.term:
            if isinstance(m, Vote | PreVote) and self._in_lease() and not (isinstance(m, Vote) and m.transfer):
                if isinstance(m, Vote):   # pre-votes come every election timeout from a cut-off node: not said
                    self._elections.append(VoteCast(m.term, m.src, False, self._lease_refusal()))
                return  # we heard from a live leader recently: ignore the disruption (§4.2.3)
            if isinstance(m, PreVote) or (isinstance(m, PreVoteResp) and m.granted):
                pass  # pre-votes never change terms
            else:
                leader = m.src if isinstance(m, _LEADER_MESSAGES) and not isinstance(m, TimeoutNow) else 0
                if self.role is Role.LEADER:
                    self._elections.append(SteppedDown(self.term, StepDownReason.HIGHER_TERM, src=m.src,
                                                       message=type(m).__name__, new_term=m.term))
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            if isinstance(m, Append | Heartbeat) and (self.cfg.check_quorum or self.cfg.pre_vote
                                                       or not self._promotable()):
                # A stale leader (healed partition) learns the new term and steps down. Without
                # check-quorum and pre-vote a node with a higher term normally corrects the leader by
                # campaigning, but one that cannot campaign (a learner, a voter whose log does not
                # yet say so) must answer, or neither ever hears from the other.
                self._send(AppendResp(term=self.term, src=self.id, dst=m.src, index=-1, reject=True))
            elif isinstance(m, PreVote):
                self._send(PreVoteResp(term=self.term, src=self.id, dst=m.src, granted=False))
            return
        if isinstance(m, Vote | PreVote):
            self._handle_vote_request(m, raised=isinstance(m, Vote) and m.term > term_before)
            return
        self._step(m)

    def propose(self, data: bytes, count: int = 1) -> int:
        """Append a batch of `count` records (leader only); returns its first index."""
        return self._append_proposal(data, count, EntryKind.NORMAL)

    def propose_conf_change(self, cc: ConfChange) -> int:
        """Propose a single-server membership change; returns its index."""
        self._require_leader()
        if not self._committed_in_term():
            raise ConfChangeError("the leader has not yet committed an entry in its term; retry shortly")
        if self._pending_conf_index() > self.log.committed:
            raise ConfChangeError("another membership change is not yet committed")
        apply_conf_change(self.conf, cc)  # validate before appending anything
        return self._append_proposal(encode_conf_change(cc), 1, EntryKind.CONF_CHANGE)

    def transfer_leadership(self, target: int) -> None:
        """Hand leadership to `target` (thesis §3.10); proposals are refused until done or timed out."""
        self._require_leader()
        if target == self.id:
            return
        if target not in self.conf.voters:
            raise ConfChangeError(f"node {target} is not a voter")
        if self.lead_transferee == target:
            return
        self.lead_transferee = target
        self._election_elapsed = 0  # the transfer times out after one election timeout
        pr = self.progress[target]
        if pr.match == self.log.last_index():
            self._send_timeout_now(target)
        else:
            self._send_append(target)

    def read_index(self, request: int) -> None:
        """Start a linearizable read; `ReadState(request, index)` comes in a later Ready (§6.4)."""
        self._require_leader()
        if self.lead_transferee:
            raise ProposalDroppedError("leadership transfer in progress")
        if not self._committed_in_term():
            self._reads_awaiting_commit.append(request)
        elif self.conf.voters == (self.id,):
            self._read_states.append(ReadState(request, self.log.committed))
        else:
            self._reads_unassigned.append(request)

    def forward_read_index(self, request: int) -> None:
        """Start a read at a follower: the leader it follows does a ReadIndex round for it (§6.4) and
        answers with its read index: `ReadState(request, index)` in a later Ready; `dropped_reads`
        when this node changes term or stops following that leader first (a lost message is never
        answered: the caller's deadline covers that). NotLeaderError when no leader is known (or
        this node leads: use `read_index`)."""
        if self.role is not Role.FOLLOWER or self.leader == 0:
            raise NotLeaderError(self.id, self.leader, self.term)
        if len(self._reads_forwarded) >= MAX_FORWARDED_READS:   # the oldest was lost: its caller's deadline passed
            self._dropped_reads.append(self._reads_forwarded.pop(0))
        self._reads_forwarded.append(request)
        self._send(ReadIndex(term=self.term, src=self.id, dst=self.leader, ctx=request))

    def lease_read_index(self) -> int | None:
        """The commit index if this leader's lease holds (a read at it is linearizable), else None.

        The lease starts when the heartbeat round a majority acknowledged was *sent*, and lasts
        election_timeout_ticks - lease_drift_ticks. Followers refuse to vote for anyone else for an
        election timeout after hearing from the leader, so the lease is safe as long as clocks
        progress at rates within lease_drift_ticks / election_timeout_ticks of each other.
        """
        if (self.role is not Role.LEADER or not self.cfg.check_quorum or self.lead_transferee
                or self._lease_revoked or not self._committed_in_term()):
            return None
        if self.conf.voters == (self.id,):
            return self.log.committed
        start = self._lease_start_tick
        if start is None or self.ticks >= start + self.cfg.election_timeout_ticks - self.cfg.lease_drift_ticks:
            return None
        return self.log.committed

    def campaign(self) -> None:
        """Start an election now (tests and tools; normally elections start on timeout)."""
        self._campaign(CampaignReason.REQUESTED)

    @property
    def hard_state(self) -> HardState:
        """The hard state as it is now (what the next Ready would ask to persist)."""
        return self._hard_state()

    @property
    def vote_floor(self) -> tuple[int, int] | None:
        """(term, index) of the log end this node had before it dropped damaged entries, while its log
        is below it (None: no floor; see the module docstring)."""
        return self._floor

    def drop_entries(self, index: int) -> HardState:
        """Begin dropping the entries from `index` on, which the application found damaged on its disk;
        returns the hard state to persist (durably) before it removes them from its storage, then it
        calls `entries_dropped()`, with no other call in between. Followers only (a leader hands
        leadership over first). The hard state carries the vote floor: the current log end, or an
        older, higher floor."""
        if self.role is not Role.FOLLOWER:
            raise RaftError(f"node {self.id} is {self.role.value}: only a follower drops entries")
        assert self._outstanding is None, "drop_entries between ready() and accept()"
        end = (self.log.last_term(), self.log.last_index())
        if self._floor is None or end > self._floor:
            self._floor = end
        return self._hard_state()

    def entries_dropped(self) -> None:
        """The storage no longer holds the dropped entries (`drop_entries`): forget them, and tell the
        leader (if one is known) so that it sends them again."""
        assert self._floor is not None and self.role is Role.FOLLOWER
        self.log.dropped()
        last = self.log.last_index()
        self._handed_off = min(self._handed_off, last)
        if self._confs[-1][0] > last:
            self._confs = [(i, c) for i, c in self._confs if i <= last] or self._confs[:1]
        if self.leader:
            self._send(AppendResp(term=self.term, src=self.id, dst=self.leader, index=last + 1, reject=True,
                                  hint_index=last, hint_term=self.log.term(last) or 0, lost=True))

    def _meets_floor(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as up to date as the vote floor."""
        return self._floor is None or (last_term, last_index) >= self._floor

    def _maybe_clear_floor(self) -> None:
        """The durable log is again at least as up to date as the floor: the floor says nothing more."""
        if self._floor is None or self.log.pending_snapshot is not None:
            return
        stable = self.log.stable_last_index()
        term = self.log.term(stable)
        if term is not None and (term, stable) >= self._floor:
            self._floor = None

    def clock_jumped(self) -> None:
        """Time passed that this node did not count in ticks (its process was stopped, its loop
        stalled): no lease from before now holds.

        A lease is safe only while this node's clock runs at about the rate of the followers'
        (§6.4.1); a stopped clock is unbounded drift. The followers kept counting and may have
        elected another leader meanwhile, so neither the current lease nor a heartbeat round sent
        before now (acknowledged later) may start one. ReadIndex does not rely on time and keeps
        its rounds. Call it before serving any read after such a gap.
        """
        self._lease_start_tick = None
        self._round_sent_tick.clear()

    # --- Ready / advance -----------------------------------------------------------------------

    def has_ready(self) -> bool:
        """Whether `ready()` has something to do. Election events alone never make a Ready: every one
        comes with a change of role or term, or a message, except a vote request ignored within the
        leader lease, which the next Ready reports (so reporting changes no Ready the runtime sees)."""
        if self._outstanding is not None:
            return False
        return bool(self._msgs or self._unsent_entries() or self._snapshot_chunks or self._read_states
                    or self._dropped_reads or self._needs_broadcast or self._reads_unassigned
                    or self.log.pending_snapshot is not None or self._states_changed()
                    or self.log.applicable())

    def ready(self) -> Ready:
        if self._outstanding is not None:
            raise RaftError("ready() called again before advance(): the Ready contract is broken")
        if self._needs_broadcast and self.role is Role.LEADER:
            self._broadcast_append()
        self._needs_broadcast = False
        if self._reads_unassigned and self.role is Role.LEADER:
            self._broadcast_heartbeat()
        # The states are compared field by field and built only when they changed (most Readys: neither).
        prev_hard, prev_soft = self._prev_hard, self._prev_soft
        durable_changed = self.term != prev_hard.term or self.vote != prev_hard.vote
        floor_term, floor_index = self._floor if self._floor is not None else (0, -1)
        hard = None
        if (durable_changed or self.log.committed != prev_hard.commit or floor_index != prev_hard.floor_index
                or floor_term != prev_hard.floor_term):
            hard = self._hard_state()
        soft = None
        if self.leader != prev_soft.leader or self.role is not prev_soft.role or self.term != prev_soft.term:
            soft = self._soft_state()
        msgs = self._msgs
        send_now: tuple[Message, ...] = ()
        send_after: tuple[Message, ...] = ()
        if msgs:
            if durable_changed or self.role is not Role.LEADER:
                send_after = tuple(msgs)
            else:
                send_now = tuple(m for m in msgs if isinstance(m, _LEADER_MESSAGES))
                if len(send_now) != len(msgs):
                    send_after = tuple(m for m in msgs if not isinstance(m, _LEADER_MESSAGES))
        pending = self.log.pending_snapshot
        entries = self._unsent_entries()
        rd = Ready(
            hard_state=hard,
            entries=entries,
            snapshot_chunks=tuple(self._snapshot_chunks),
            snapshot=pending,
            send_now=send_now,
            send_after=send_after,
            committed=tuple(self.log.next_committed(self._max_apply_bytes)),
            read_states=tuple(self._read_states),
            dropped_reads=tuple(self._dropped_reads),
            soft_state=soft,
            must_sync=durable_changed or bool(entries or self._snapshot_chunks or pending),
            elections=tuple(self._elections) if self._elections else (),
        )
        self._msgs = []
        self._read_states = []
        self._dropped_reads = []
        self._snapshot_chunks = []
        if self._elections:
            self._elections = []
        self._outstanding = rd
        return rd

    def awaits_own_sync(self) -> bool:
        """As leader: whether its own copy of its entries, once durable (`persisted`), lets anything
        proceed: the commit index advance (a majority of voters would then hold more than is
        committed), or committed entries be applied (a node applies only what its own log holds
        durably, `RaftLog.next_committed`, even when its followers committed them). While neither,
        a pipelining runtime may report the leader's durability lazily, at its next turn. False outside
        the leader role: there every held acknowledgement or vote waits for durability (report it at once)."""
        if self.role is not Role.LEADER:
            return False
        log = self.log
        stable = log.stable_last_index()
        if log.committed > stable:
            return True
        last = log.last_index()
        if stable >= last:
            return False
        matches = {node: pr.match for node, pr in self.progress.items()}
        matches[self.id] = last
        return committed_index(self.conf, matches) > log.committed

    def advance(self) -> None:
        """The last Ready was fully handled: persisted, sent and applied. (`accept` + `persisted`.)"""
        self._stable(self.accept())

    def accept(self) -> Ready:
        """Pipelined persistence: the last Ready was handed off, so `ready()` may be called again.

        Before calling it: `send_now` went out; snapshot chunks, the snapshot and (when term or vote
        changed) the hard state are durable; the entries are written in order but need not be durable
        yet; `committed` was applied. Hold back `send_after` until the entries are durable, then send
        what `persisted(ready)` returns, for Readys in the order they were accepted. Meanwhile later
        Readys carry only entries not handed out before (etcd raft's asynchronous storage writes).
        """
        rd = self._outstanding
        if rd is None:
            raise RaftError("accept() or advance() without a Ready")
        self._outstanding = None
        if rd.hard_state is not None:
            self._prev_hard = rd.hard_state
        if rd.soft_state is not None:
            self._prev_soft = rd.soft_state
        if rd.snapshot is not None:
            self.log.snapshot_installed(rd.snapshot.index)
            self._handed_off = max(self._handed_off, rd.snapshot.index)
            self._maybe_clear_floor()
        for e in reversed(rd.entries):
            # Handed off: this Ready's entries that the log still holds. A newer leader may have
            # replaced the ones after them since ready() (_append_entries then lowered _handed_off):
            # the replacements go out in the next Ready.
            if self.log.term(e.last_index) == e.term:
                self._handed_off = max(self._handed_off, e.last_index)
                break
        if rd.committed:
            self.log.applied_to(rd.committed[-1].last_index)
        return rd

    def persisted(self, rd: Ready) -> tuple[Message, ...]:
        """The entries of an accepted Ready are durable: returns which of its `send_after` to send now.

        Acknowledgements made in an older term are dropped: since then a newer leader may have
        replaced the entries they acknowledge, and a stale leader must not count them (nor confirm
        a read with them). So are acknowledgements of entries the log no longer holds (dropped as
        damaged meanwhile). Dropping a message is always safe; later Readys acknowledge afresh.
        """
        self._stable(rd)
        last = self.log.last_index()
        return tuple(m for m in rd.send_after
                     if not (isinstance(m, AppendResp | HeartbeatResp) and m.term < self.term)
                     and not (isinstance(m, AppendResp) and not m.reject and m.index > last))

    def _stable(self, rd: Ready) -> None:
        if not rd.entries:
            return
        last = rd.entries[-1]
        self.log.stable_to(last.last_index, last.term)  # ignored if a later Ready replaced them
        self._maybe_clear_floor()
        if self.role is Role.LEADER and self.id in self.progress:
            self.progress[self.id].maybe_update(self.log.stable_last_index(), self.ticks)
            if self._maybe_commit() and self.role is Role.LEADER and self.cfg.commit_broadcast:
                self._needs_broadcast = True

    def _unsent_entries(self) -> tuple[Entry, ...]:
        """Unstable entries not yet handed out in an accepted Ready."""
        unstable = self.log.unstable
        if not unstable or unstable[-1].last_index <= self._handed_off:
            return ()
        return tuple(e for e in unstable if e.index > self._handed_off)

    # --- roles ---------------------------------------------------------------------------------

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = 0
        self.leader = 0
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = self.cfg.election_timeout_ticks + self._rng.randrange(
            self.cfg.election_timeout_ticks)
        self._votes = {}
        self.progress = {}
        self.lead_transferee = 0
        self._needs_broadcast = False
        self._uncommitted.clear()
        self._uncommitted_bytes = 0
        self._lease_start_tick = None
        self._lease_revoked = False
        self._confirmed_round = 0
        self._round_sent_tick.clear()
        # A follower's read is not answered: its own term change drops it there (or its deadline passes).
        pending = [r for _, r, _ in self._reads_for_round] + self._reads_unassigned + self._reads_awaiting_commit
        self._dropped_reads += [r for r in pending if isinstance(r, int)]
        self._drop_forwarded_reads()
        self._reads_for_round.clear()
        self._reads_unassigned = []
        self._reads_awaiting_commit = []

    def _become_follower(self, term: int, leader: int) -> None:
        if self.role is Role.LEADER:   # its own leadership is the latest it heard of (Ready.elections)
            self._heard_leader, self._heard_leader_tick, self._campaigns_unheard = self.id, self.ticks, 0
        self._reset(term)
        self.leader = leader
        self.role = Role.FOLLOWER
        self._step = self._step_follower
        self._tick = self._tick_election

    def _become_pre_candidate(self) -> None:
        # Like a candidate but without raising the term or voting: nothing to persist (§9.6).
        self._step = self._step_candidate
        self._tick = self._tick_election
        self._votes = {}
        self.leader = 0
        self.role = Role.PRE_CANDIDATE
        self._drop_forwarded_reads()

    def _become_candidate(self) -> None:
        assert self.role is not Role.LEADER
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE
        self._step = self._step_candidate
        self._tick = self._tick_election

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE
        self._reset(self.term)
        self.leader = self.id
        self.role = Role.LEADER
        self.won_by_transfer = self._transfer_campaign
        self._step = self._step_leader
        self._tick = self._tick_heartbeat
        last = self.log.last_index()
        for node in self._members():
            self.progress[node] = Progress(last + 1, self.ticks)
        if self.id in self.progress:
            me = self.progress[self.id]
            me.maybe_update(self.log.stable_last_index(), self.ticks)
            me.become_replicate()
            me.recent_active = True
        # An entry of the new term commits everything before it (§5.4.2, §8).
        self._append_proposal(b"", 1, EntryKind.NOOP)

    def _promotable(self) -> bool:
        if self.log.pending_snapshot is not None or self._floor is not None:
            return False
        if self.id in self.conf.voters:
            return True
        # A voter removed by a configuration entry that is not yet committed may be needed to
        # commit it (thesis §4.2.2, figure 4.6): a leader that appended its own removal and lost
        # leadership holds the longest log, so the remaining old-configuration voters cannot win
        # without it. It keeps starting elections; its own vote does not count (vote_result only
        # counts the latest configuration's voters).
        return (self._pending_conf_index() > self.log.committed and len(self._confs) >= 2
                and self.id in self._confs[-2][1].voters)

    def _members(self) -> tuple[int, ...]:
        return self.conf.voters + self.conf.learners

    # --- elections -----------------------------------------------------------------------------

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._promotable() and self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._campaign(CampaignReason.TIMEOUT)

    def _campaign(self, reason: CampaignReason, *, transfer_from: int = 0, pre_voted: bool = False) -> None:
        """Start an election: a pre-vote first unless `pre_voted` (won) or a transfer (TimeoutNow from
        `transfer_from`).

        Only a transfer marks its Vote requests `transfer`, which makes followers ignore their
        leader lease; an election after a won pre-vote must still respect it.
        """
        if not self._promotable() or self.term_exhausted:
            return
        transfer = reason is CampaignReason.TRANSFER
        timeout = self._randomized_timeout
        granted: tuple[int, ...] = ()
        if pre_voted:
            granted = tuple(sorted(n for n, g in self._votes.items() if g and n != self.id))
        else:
            self._campaigns_unheard += 1
        if self.cfg.pre_vote and not (transfer or pre_voted):
            self._become_pre_candidate()
            self._campaign_reason, self._campaign_transfer_from = reason, transfer_from
            term = self.term + 1
        else:
            self._become_candidate()
            self._transfer_campaign = transfer
            term = self.term
        self._elections.append(CampaignStarted(
            term, self.role is Role.PRE_CANDIDATE, reason, self._heard_leader,
            self.ticks - self._heard_leader_tick, timeout, transfer_from, self._campaigns_unheard, granted))
        self._votes[self.id] = True
        if self._tally():
            return
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for voter in self.conf.voters:
            if voter == self.id:
                continue
            if self.role is Role.PRE_CANDIDATE:
                self._send(PreVote(term=term, src=self.id, dst=voter, last_index=last_index, last_term=last_term))
            else:
                self._send(Vote(term=term, src=self.id, dst=voter, last_index=last_index, last_term=last_term,
                                transfer=transfer))

    def _tally(self) -> bool:
        """Act on the votes so far; True if the election is decided."""
        result = vote_result(self.conf, self._votes)
        if result is None:
            return False
        if not result:
            pre = self.role is Role.PRE_CANDIDATE
            self._elections.append(CampaignLost(
                self.term + 1 if pre else self.term, pre,
                tuple(sorted(n for n, g in self._votes.items() if g and n != self.id)),
                tuple(sorted(n for n, g in self._votes.items() if not g))))
            self._become_follower(self.term, 0)
        elif self.role is Role.PRE_CANDIDATE:
            self._campaign(self._campaign_reason, transfer_from=self._campaign_transfer_from,
                           pre_voted=True)  # the real election
        else:
            self._become_leader()
        return True

    def _in_lease(self) -> bool:
        """Refuse to help elect anyone else: we heard from a leader within an election timeout
        (§4.2.3), or we restarted less than one ago and may have (the leader's lease counts on it,
        §6.4.1, across our crash too)."""
        if not self.cfg.check_quorum:
            return False
        if self.leader != 0 and self._election_elapsed < self.cfg.election_timeout_ticks:
            return True
        return self._restarted and self.ticks < self.cfg.election_timeout_ticks

    def _lease_refusal(self) -> str:
        if self.leader == self.id:
            return f"it leads term {self.term} (check-quorum: a leader ignores vote requests)"
        if self.leader != 0:
            return (f"heard from leader {self.leader} {self._election_elapsed} ticks ago, "
                    f"within the election timeout (leader lease)")
        return "restarted within an election timeout (a leader lease may count on it)"

    def _handle_vote_request(self, m: Vote | PreVote, *, raised: bool = False) -> None:
        """Answer a vote or pre-vote request of our term or a later one. `raised`: a Vote whose term
        this node just took: its answer is reported (Ready.elections; at most once per term)."""
        pre = isinstance(m, PreVote)
        can_vote = (self.vote == m.src or (self.vote == 0 and self.leader == 0)
                    or (pre and m.term > self.term))
        up_to_date = self.log.is_up_to_date(m.last_index, m.last_term)
        floor = self._meets_floor(m.last_index, m.last_term)
        granted = can_vote and up_to_date and floor
        if pre:
            self._send(PreVoteResp(term=m.term if granted else self.term, src=self.id, dst=m.src, granted=granted))
            return
        if granted:
            self.vote = m.src
            self._election_elapsed = 0
        if raised:
            if granted:
                refusal = ""
            elif not can_vote:
                refusal = f"voted for node {self.vote} in this term" if self.vote else f"follows node {self.leader}"
            elif not up_to_date:
                refusal = (f"its log (last {m.last_term}/{m.last_index}) is behind ours "
                           f"({self.log.last_term()}/{self.log.last_index()})")
            else:
                refusal = "its log is behind our vote floor"
            self._elections.append(VoteCast(m.term, m.src, granted, refusal))
        self._send(VoteResp(term=self.term, src=self.id, dst=m.src, granted=granted))

    def _step_candidate(self, m: Message) -> None:
        if isinstance(m, Append | Heartbeat | InstallSnapshot):
            self._become_follower(m.term, m.src)  # a leader of our term exists
            self._step_follower(m)
        elif isinstance(m, PreVoteResp) and self.role is Role.PRE_CANDIDATE:
            if m.granted and m.term != self.term + 1:
                return  # an answer to an older pre-election
            self._votes[m.src] = m.granted
            self._tally()
        elif isinstance(m, VoteResp) and self.role is Role.CANDIDATE:
            self._votes[m.src] = m.granted
            self._tally()

    # --- follower ------------------------------------------------------------------------------

    def _heard_from(self, leader: int) -> None:
        self._election_elapsed = 0
        self.leader = leader
        self._heard_leader, self._heard_leader_tick, self._campaigns_unheard = leader, self.ticks, 0

    def _step_follower(self, m: Message) -> None:
        if isinstance(m, Append):
            self._heard_from(m.src)
            self._handle_append(m)
        elif isinstance(m, Heartbeat):
            self._heard_from(m.src)
            self.log.commit_to(min(m.commit, self.log.last_index()))
            self._send(HeartbeatResp(term=self.term, src=self.id, dst=m.src, ctx=m.ctx))
        elif isinstance(m, InstallSnapshot):
            self._heard_from(m.src)
            self._handle_snapshot_chunk(m)
        elif isinstance(m, TimeoutNow):
            self._campaign(CampaignReason.TRANSFER, transfer_from=m.src)
        elif isinstance(m, ReadIndexResp):
            if m.ctx in self._reads_forwarded:
                self._reads_forwarded.remove(m.ctx)
                self._read_states.append(ReadState(m.ctx, m.index))

    def _handle_append(self, m: Append) -> None:
        log = self.log
        held = log.held_committed()
        if m.prev_index < held:
            # Everything through our commit index (that we hold) matches the leader's log already.
            self._send(AppendResp(term=self.term, src=self.id, dst=m.src, index=held))
            return
        if not log.match_term(m.prev_index, m.prev_term):
            hint = log.last_boundary_at_or_below(m.prev_index, m.prev_term)
            self._send(AppendResp(term=self.term, src=self.id, dst=m.src, index=m.prev_index, reject=True,
                                  hint_index=hint, hint_term=log.term(hint) or 0, lost=self._floor is not None))
            return
        entries = m.entries
        last_new = entries[-1].last_index if entries else m.prev_index
        pos = log.find_conflict(entries)
        if pos is not None:
            self._append_entries(entries[pos:])
        log.commit_to(min(m.commit, last_new))
        self._send(AppendResp(term=self.term, src=self.id, dst=m.src, index=last_new))

    def _handle_snapshot_chunk(self, m: InstallSnapshot) -> None:
        meta = m.meta
        log = self.log
        if meta.index <= log.held_committed() or log.match_term(meta.index, meta.term):
            # We hold everything the snapshot covers (§5.6: keep the entries that follow it).
            log.commit_to(meta.index)
            self._incoming = None
            self._send(InstallSnapshotResp(term=self.term, src=self.id, dst=m.src, index=meta.index,
                                           offset=meta.size))
            return
        if m.offset == 0:
            self._incoming = (meta, 0)
        incoming = self._incoming
        if incoming is None or incoming[0] != meta or m.offset != incoming[1]:
            expected = incoming[1] if incoming is not None and incoming[0] == meta else 0
            self._send(InstallSnapshotResp(term=self.term, src=self.id, dst=m.src, index=meta.index,
                                           offset=expected, reject=expected == 0))
            return
        self._snapshot_chunks.append(SnapshotChunk(meta, m.offset, m.data))
        offset = m.offset + len(m.data)
        self._incoming = (meta, offset)
        if m.done:
            if offset != meta.size:
                raise RaftError(f"snapshot {meta.index} ended at byte {offset}, its size is {meta.size}")
            log.restore(meta)
            self._handed_off = min(self._handed_off, meta.index)
            self._confs = [(meta.index, meta.conf)]
            self._incoming = None
        self._send(InstallSnapshotResp(term=self.term, src=self.id, dst=m.src, index=meta.index, offset=offset))

    # --- leader --------------------------------------------------------------------------------

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self.cfg.election_timeout_ticks:
            self._election_elapsed = 0
            if self.cfg.check_quorum:
                active = [v for v in self.conf.voters if v == self.id
                          or (v in self.progress and self.progress[v].recent_active)]
                if len(active) < majority(self.conf.voters):
                    self._elections.append(SteppedDown(
                        self.term, StepDownReason.CHECK_QUORUM, tuple(active), self.conf.voters,
                        self.cfg.election_timeout_ticks, last_heard=tuple(
                            (v, self.ticks - self.progress[v].active_tick if v in self.progress
                             and self.progress[v].active_tick >= 0 else -1)
                            for v in self.conf.voters if v not in active)))
                    self._become_follower(self.term, 0)  # cut off from a majority (§6.2)
                    return
                for node, pr in self.progress.items():
                    pr.recent_active = node == self.id
            if self.lead_transferee:
                self.lead_transferee = 0  # the transfer timed out: take proposals again
        if self._heartbeat_elapsed >= self.cfg.heartbeat_interval_ticks:
            self._heartbeat_elapsed = 0
            self._broadcast_heartbeat()
        for node, pr in self.progress.items():
            if (pr.state is ProgressState.SNAPSHOT
                    and self.ticks - pr.snapshot_sent_tick >= self.cfg.election_timeout_ticks):
                self._send_snapshot_chunk(node)  # the chunk or its answer was lost
        self._maybe_promote_learner()

    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.src)
        if pr is None:
            return  # not (or no longer) a member
        if isinstance(m, AppendResp | HeartbeatResp | InstallSnapshotResp):
            pr.recent_active = True
            pr.active_tick = self.ticks
        if isinstance(m, AppendResp):
            self._handle_append_resp(m, pr)
        elif isinstance(m, HeartbeatResp):
            pr.probe_sent = False
            if m.ctx > pr.heartbeat_round:
                pr.heartbeat_round = m.ctx
                self._confirm_rounds()
            if pr.match < self.log.last_index():
                if (pr.state is ProgressState.REPLICATE
                        and self.ticks - pr.last_progress_tick > 2 * self.cfg.heartbeat_interval_ticks):
                    pr.become_probe(self.ticks)  # appends in flight were lost: resend from the match
                self._send_append(m.src)
        elif isinstance(m, InstallSnapshotResp):
            self._handle_snapshot_resp(m, pr)
        elif isinstance(m, ReadIndex):
            self._handle_follower_read(_FollowerRead(m.src, m.ctx))

    def _handle_follower_read(self, request: _FollowerRead) -> None:
        """Queue a follower's read with this leader's own (read_index): the same heartbeat round
        confirms both. During a leadership transfer it is not answered (the follower's deadline is)."""
        if self.lead_transferee:
            return
        if not self._committed_in_term():
            self._reads_awaiting_commit.append(request)
        else:
            self._reads_unassigned.append(request)

    def _handle_append_resp(self, m: AppendResp, pr: Progress) -> None:
        if m.reject and m.lost:
            # The follower dropped damaged entries it had acknowledged: it holds nothing past the hint
            # (a prefix of what it acknowledged, so still matching ours). Send the rest again.
            pr.match = min(pr.match, m.hint_index)
            pr.become_probe(self.ticks)
            self._send_append(m.src)
            return
        if m.reject:
            if m.index < 0 or m.index <= pr.match:
                return  # stale
            if pr.state is ProgressState.PROBE and m.index != pr.next - 1:
                return  # answers an older probe
            if pr.state is ProgressState.SNAPSHOT:
                return
            next_index = self.log.last_boundary_at_or_below(m.hint_index, m.hint_term) + 1
            pr.become_probe(self.ticks)
            pr.next = max(next_index, pr.match + 1)
            self._send_append(m.src)
            return
        if pr.maybe_update(m.index, self.ticks):
            if pr.state is ProgressState.PROBE:
                pr.become_replicate()
            if self._maybe_commit():
                # Without commit_broadcast the next append or heartbeat carries the new commit index.
                self._needs_broadcast = self._needs_broadcast or self.cfg.commit_broadcast
                if self.role is not Role.LEADER:
                    return  # the commit included our own removal: we stepped down (thesis §4.2.2)
            if m.src == self.lead_transferee and pr.match == self.log.last_index():
                self._send_timeout_now(m.src)
        while self._send_append(m.src):
            pass

    def _handle_snapshot_resp(self, m: InstallSnapshotResp, pr: Progress) -> None:
        snap = pr.snapshot
        if pr.state is not ProgressState.SNAPSHOT or snap is None or m.index != snap.index:
            return
        if m.reject:
            pr.snapshot_offset = 0
        elif m.offset >= snap.size:
            pr.maybe_update(snap.index, self.ticks)
            pr.become_replicate()
            self._send_append(m.src)
            return
        else:
            pr.snapshot_offset = m.offset
        self._send_snapshot_chunk(m.src)

    def _maybe_commit(self) -> bool:
        """Advance the commit index to what a majority holds durably, if it is of this term (§5.4.2)."""
        index = committed_index(self.conf, {n: p.match for n, p in self.progress.items()})
        if index <= self.log.committed or self.log.term(index) != self.term:
            return False
        self.log.commit_to(index)
        while self._uncommitted and self._uncommitted[0][0] <= index:
            self._uncommitted_bytes -= self._uncommitted.popleft()[1]
        if self._reads_awaiting_commit and self._committed_in_term():
            self._reads_unassigned += self._reads_awaiting_commit
            self._reads_awaiting_commit = []
        if self.id not in self.conf.voters and self._pending_conf_index() <= index:
            # Our own removal is committed: step down (thesis §4.2.2).
            self._elections.append(SteppedDown(self.term, StepDownReason.REMOVED))
            self._become_follower(self.term, 0)
        return True

    def _broadcast_append(self) -> None:
        for node in self._members():
            if node != self.id:
                self._send_append(node, allow_empty=True)

    def _send_append(self, to: int, *, allow_empty: bool = False) -> bool:
        """Send the next entries to `to` if flow control allows; True if entries were sent."""
        pr = self.progress[to]
        if pr.is_paused(self.cfg.max_inflight_appends, self.cfg.max_inflight_bytes):
            return False
        log = self.log
        prev = pr.next - 1
        prev_term = log.term(prev)
        if prev_term is None or pr.next < log.first_index():
            self._start_snapshot(to)
            return False
        entries: list[Entry] = []
        if pr.next <= log.last_index():
            try:
                entries = log.entries(pr.next, log.last_index() + 1, self.cfg.max_append_bytes)
            except CompactedError:
                if log.storage.snapshot().index < 0:
                    # Without any snapshot only an entry the storage cannot read now does this (damaged:
                    # the runtime takes a snapshot past it, repair.py): the follower waits for it.
                    return False
                self._start_snapshot(to)
                return False
        if not entries and not allow_empty and pr.state is ProgressState.REPLICATE:
            return False
        self._send(Append(term=self.term, src=self.id, dst=to, prev_index=prev, prev_term=prev_term,
                          entries=tuple(entries), commit=log.committed))
        if entries:
            pr.sent(entries[-1].last_index, sum(e.size for e in entries))
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return bool(entries)

    def _start_snapshot(self, to: int) -> None:
        meta = self.log.storage.snapshot()
        assert meta.index >= 0, "entries are compacted but there is no snapshot"
        self.progress[to].become_snapshot(meta, self.ticks)
        self._send_snapshot_chunk(to)

    def _send_snapshot_chunk(self, to: int) -> None:
        pr = self.progress[to]
        meta = pr.snapshot
        assert meta is not None
        try:
            data = self.log.storage.snapshot_chunk(meta.index, pr.snapshot_offset, self.cfg.snapshot_chunk_bytes)
        except CompactedError:
            pr.become_probe(self.ticks)  # a newer snapshot replaced it: start over with that one
            self._start_snapshot(to)
            return
        pr.snapshot_sent_tick = self.ticks
        done = pr.snapshot_offset + len(data) >= meta.size
        self._send(InstallSnapshot(term=self.term, src=self.id, dst=to, meta=meta, offset=pr.snapshot_offset,
                                   data=data, done=done))

    def _send_timeout_now(self, to: int) -> None:
        # The target's election bypasses the followers' lease (Vote.transfer), and a TimeoutNow can
        # arrive late, after the transfer timed out and this leader took proposals again: from now
        # on a new leader may be elected while our lease looks valid, so it never serves reads again
        # in this term (ReadIndex still works: it does not rely on time).
        self._lease_revoked = True
        self._send(TimeoutNow(term=self.term, src=self.id, dst=to))

    def _broadcast_heartbeat(self) -> None:
        """A heartbeat round: carries commit, confirms leadership for reads and the lease."""
        self._round += 1
        self._round_sent_tick[self._round] = self.ticks
        for request in self._reads_unassigned:
            self._reads_for_round.append((self._round, request, self.log.committed))
        self._reads_unassigned = []
        for node in self._members():
            if node == self.id:
                continue
            pr = self.progress[node]
            self._send(Heartbeat(term=self.term, src=self.id, dst=node, commit=min(pr.match, self.log.committed),
                                 ctx=self._round))
        if self.id in self.conf.voters and len(self.conf.voters) == 1:
            self.progress[self.id].heartbeat_round = self._round
            self._confirm_rounds()
        elif self.id in self.progress:
            self.progress[self.id].heartbeat_round = self._round

    def _confirm_rounds(self) -> None:
        rounds = {n: p.heartbeat_round for n, p in self.progress.items()}
        confirmed = committed_index(self.conf, rounds)
        if confirmed <= self._confirmed_round:
            return
        self._confirmed_round = confirmed
        sent = self._round_sent_tick.get(confirmed)
        if sent is not None:
            self._lease_start_tick = sent
        for r in [r for r in self._round_sent_tick if r < confirmed]:
            del self._round_sent_tick[r]
        while self._reads_for_round and self._reads_for_round[0][0] <= confirmed:
            _, request, index = self._reads_for_round.popleft()
            if isinstance(request, _FollowerRead):
                if request.node in self.progress:
                    self._send(ReadIndexResp(term=self.term, src=self.id, dst=request.node, ctx=request.ctx,
                                             index=index))
            else:
                self._read_states.append(ReadState(request, index))

    def _drop_forwarded_reads(self) -> None:
        self._dropped_reads += self._reads_forwarded
        self._reads_forwarded = []

    def _maybe_promote_learner(self) -> None:
        if not self.conf.auto_promote or not self._committed_in_term():
            return
        if self._pending_conf_index() > self.log.committed or self.lead_transferee:
            return
        for node in self.conf.auto_promote:
            pr = self.progress.get(node)
            if pr is not None and pr.match >= self.log.committed - self.cfg.learner_catch_up_entries:
                self.propose_conf_change(ConfChange(ConfChangeKind.PROMOTE, node))
                return

    # --- helpers -------------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.id, self.leader, self.term)

    def _committed_in_term(self) -> bool:
        return self.log.term(self.log.committed) == self.term

    def _pending_conf_index(self) -> int:
        return self._confs[-1][0]

    def _append_proposal(self, data: bytes, count: int, kind: EntryKind) -> int:
        self._require_leader()
        if self.lead_transferee and kind is not EntryKind.NOOP:
            raise ProposalDroppedError(f"leadership is being transferred to node {self.lead_transferee}")
        if count < 1:
            raise RaftError(f"an entry covers at least one index, not {count}")
        entry = Entry(index=self.log.last_index() + 1, term=self.term, count=count, kind=kind, data=data)
        if (kind is EntryKind.NORMAL and self._uncommitted_bytes
                and self._uncommitted_bytes + entry.size > self.cfg.max_uncommitted_bytes):
            raise ProposalDroppedError(f"{self._uncommitted_bytes} bytes are waiting to commit; retry later")
        self._append_entries((entry,))
        self._uncommitted.append((entry.last_index, entry.size))
        self._uncommitted_bytes += entry.size
        self._needs_broadcast = True
        return entry.index

    def _append_entries(self, entries: tuple[Entry, ...]) -> None:
        """Append to the log (replacing any suffix) and track the membership changes they carry."""
        first = entries[0].index
        if self._confs[-1][0] >= first:
            self._confs = [(i, c) for i, c in self._confs if i < first]
        self._handed_off = min(self._handed_off, first - 1)  # replaced entries go out again, new ones too
        self.log.append(entries)
        for e in entries:
            if e.kind is EntryKind.CONF_CHANGE:
                self._confs.append((e.index, apply_conf_change(self.conf, decode_conf_change(e.data))))
                if self.role is Role.LEADER:
                    self._track_members()

    def _track_members(self) -> None:
        members = set(self._members())
        for node in list(self.progress):
            if node not in members:
                del self.progress[node]
        for node in members:
            if node not in self.progress:
                self.progress[node] = Progress(self.log.last_index() + 1, self.ticks)

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _states_changed(self) -> bool:
        """`_hard_state() != _prev_hard or _soft_state() != _prev_soft`, field by field: has_ready runs
        a few times per loop turn, and building the two states only to compare them was most of its cost."""
        hard, soft = self._prev_hard, self._prev_soft
        floor_term, floor_index = self._floor if self._floor is not None else (0, -1)
        return (self.term != hard.term or self.vote != hard.vote or self.log.committed != hard.commit
                or floor_index != hard.floor_index or floor_term != hard.floor_term
                or self.leader != soft.leader or self.role is not soft.role or self.term != soft.term)

    def _hard_state(self) -> HardState:
        floor_term, floor_index = self._floor if self._floor is not None else (0, -1)
        return HardState(term=self.term, vote=self.vote, commit=self.log.committed, floor_index=floor_index,
                         floor_term=floor_term)

    def _soft_state(self) -> SoftState:
        return SoftState(self.leader, self.role, self.term)

    def __repr__(self) -> str:
        return (f"RaftNode(id={self.id}, {self.role.value}, term={self.term}, leader={self.leader}, "
                f"commit={self.log.committed}, last={self.log.last_index()})")
