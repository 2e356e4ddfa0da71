"""Scripted interaction tests for the Raft core (in the spirit of etcd-io/raft's rafttest).

Theory of operation. A script under `testdata/` is a sequence of commands, each followed by a line
`----` and the output the command is expected to print; a blank line ends the output. Lines
starting with `#` between commands are comments. A fresh `Env` runs each script: it owns a set of
`RaftNode`s, each with its own `MemoryStorage` (its disk) and a `random.Random` seeded with the
node id, and a fake network holding, per destination, the messages sent and not yet delivered.
Nothing happens unless a command says so: no message moves and no clock ticks on its own, so the
output is the same on every run and every machine.

The application side is played by `Env.process_ready`, in the order of the Ready contract: send
`send_now`, persist snapshot chunks / snapshot / entries / hard state, send `send_after`, apply
`committed` entries to a toy state machine (the list of applied data), then `advance()`.

A node added with `pipelined=true` plays the node runtime's pipelined persistence instead
(eventlog/raft/runtime/group.py): its entries are written at once but become durable only on
`sync` (its disk's durable end, kept by the segmented log's rules: a truncation lowers it); it
`accept()`s each Ready at once and holds its `send_after` in the runtime's own `PersistQueue`
until the durable end passes its entries, then sends what `persisted()` returns.

A script may start with `# xfail: <reason>`: its expected output then describes the correct
behaviour that the core does not show yet, and `--rewrite` leaves it alone.

Notation in outputs: `T/I` is (term T, index I); `T/I..J` an entry (a batch) of term T covering
indexes I through J; `a->b` a message from node a to node b. The commands are documented in
`testdata/README.md`.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from eventlog.errors import EpochlogError
from eventlog.raft import (
    CampaignLost,
    CampaignReason,
    CampaignStarted,
    ConfChange,
    ConfChangeKind,
    ConfState,
    ElectionEvent,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    RaftConfig,
    RaftNode,
    Ready,
    SnapshotMeta,
    StepDownReason,
    SteppedDown,
)
from eventlog.raft.confchange import apply_conf_change, decode_conf_change
from eventlog.raft.persist_queue import PersistQueue
from eventlog.raft.progress import ProgressState
from eventlog.raft.types import (
    Append,
    AppendResp,
    Heartbeat,
    HeartbeatResp,
    InstallSnapshot,
    InstallSnapshotResp,
    Message,
    PreVote,
    PreVoteResp,
    ReadIndex,
    ReadIndexResp,
    TimeoutNow,
    Vote,
    VoteResp,
)

# --- formatting ----------------------------------------------------------------------------------

_CC_NAMES = {ConfChangeKind.ADD_VOTER: "add-voter", ConfChangeKind.ADD_LEARNER: "add-learner",
             ConfChangeKind.PROMOTE: "promote", ConfChangeKind.REMOVE: "remove"}
_CC_KINDS = {v: k for k, v in _CC_NAMES.items()}


def fmt_ids(ids: Iterable[int]) -> str:
    return "(" + ",".join(str(i) for i in ids) + ")"


def fmt_conf(conf: ConfState) -> str:
    out = f"voters={fmt_ids(conf.voters)}"
    if conf.learners:
        out += f" learners={fmt_ids(conf.learners)}"
    if conf.auto_promote:
        out += f" auto-promote={fmt_ids(conf.auto_promote)}"
    return out


def fmt_cc(cc: ConfChange) -> str:
    return f"{_CC_NAMES[cc.kind]} {cc.node}" + (" auto-promote" if cc.auto_promote else "")


def fmt_entry(e: Entry) -> str:
    where = f"{e.term}/{e.index}" if e.count == 1 else f"{e.term}/{e.index}..{e.last_index}"
    if e.kind is EntryKind.NOOP:
        return f"{where} noop"
    if e.kind is EntryKind.CONF_CHANGE:
        return f"{where} conf({fmt_cc(decode_conf_change(e.data))})"
    return f"{where} {e.data.decode()!r}".replace("'", '"')


def fmt_entries(entries: Iterable[Entry]) -> str:
    return "[" + ", ".join(fmt_entry(e) for e in entries) + "]"


def fmt_snap(meta: SnapshotMeta) -> str:
    return f"{meta.term}/{meta.index} {fmt_conf(meta.conf)} size={meta.size}"


def fmt_hard(hs: HardState) -> str:
    floor = f" floor={hs.floor_term}/{hs.floor_index}" if hs.floor_index >= 0 else ""
    return f"term={hs.term} vote={hs.vote} commit={hs.commit}{floor}"


def fmt_election(e: ElectionEvent) -> str:
    """An election event (Ready.elections), every field that is set."""
    if isinstance(e, CampaignStarted):
        out = f"{'pre-vote' if e.pre_vote else 'campaign'} term={e.term} reason={e.reason.name.lower()}"
        if e.reason is CampaignReason.TRANSFER:
            out += f" from={e.transfer_from}"
        elif e.reason is CampaignReason.TIMEOUT:
            out += f" leader={e.leader} silent={e.silent_ticks} timeout={e.timeout_ticks}"
        out += f" attempt={e.attempt}"
        return out + (f" pre-vote-granted={fmt_ids(e.pre_vote_granted)}" if e.pre_vote_granted else "")
    if isinstance(e, CampaignLost):
        return (f"lost {'pre-vote' if e.pre_vote else 'campaign'} term={e.term} granted={fmt_ids(e.granted)} "
                f"refused={fmt_ids(e.refused)}")
    if isinstance(e, SteppedDown):
        out = f"stepped-down term={e.term} reason={e.reason.name.lower()}"
        if e.reason is StepDownReason.CHECK_QUORUM:
            out += f" heard={fmt_ids(e.heard_from)} voters={fmt_ids(e.voters)} last-heard=" + ",".join(
                f"{v}:{ticks}" for v, ticks in e.last_heard)
        elif e.reason is StepDownReason.HIGHER_TERM:
            out += f" {e.message} term={e.new_term} from={e.src}"
        return out
    return (f"vote term={e.term} candidate={e.candidate} "
            + ("granted" if e.granted else f"refused ({e.refusal})"))


def fmt_msg(m: Message) -> str:
    head = f"{m.src}->{m.dst} {type(m).__name__} term={m.term}"
    if isinstance(m, Append):
        return f"{head} prev={m.prev_term}/{m.prev_index} commit={m.commit} {fmt_entries(m.entries)}"
    if isinstance(m, AppendResp):
        if m.reject:
            return f"{head} reject index={m.index} hint={m.hint_term}/{m.hint_index}" + (" lost" if m.lost else "")
        return f"{head} index={m.index}"
    if isinstance(m, Heartbeat):
        return f"{head} commit={m.commit} round={m.ctx}"
    if isinstance(m, HeartbeatResp):
        return f"{head} round={m.ctx}"
    if isinstance(m, PreVote | Vote):
        tail = " transfer" if isinstance(m, Vote) and m.transfer else ""
        return f"{head} last={m.last_term}/{m.last_index}{tail}"
    if isinstance(m, PreVoteResp | VoteResp):
        return f"{head} {'granted' if m.granted else 'rejected'}"
    if isinstance(m, InstallSnapshot):
        done = " done" if m.done else ""
        return (f"{head} snap={m.meta.term}/{m.meta.index} size={m.meta.size} "
                f"offset={m.offset} len={len(m.data)}{done}")
    if isinstance(m, InstallSnapshotResp):
        return f"{head} snap={m.index} offset={m.offset}" + (" reject" if m.reject else "")
    if isinstance(m, TimeoutNow):
        return head
    if isinstance(m, ReadIndex):
        return f"{head} read={m.ctx}"
    if isinstance(m, ReadIndexResp):
        return f"{head} read={m.ctx} index={m.index}"
    raise AssertionError(f"unknown message {m!r}")


# --- the environment -----------------------------------------------------------------------------

DEFAULTS = {
    # Short timeouts keep scripts readable; the scripts' message flows were written with the commit
    # broadcast (an empty append per new commit index); everything else is RaftConfig's default.
    "election": 6, "heartbeat": 2, "pre-vote": True, "check-quorum": True, "commit-broadcast": True,
}
_CONFIG_KEYS: dict[str, str] = {
    "election": "election_timeout_ticks",
    "heartbeat": "heartbeat_interval_ticks",
    "pre-vote": "pre_vote",
    "check-quorum": "check_quorum",
    "max-inflight": "max_inflight_appends",
    "max-inflight-bytes": "max_inflight_bytes",
    "max-append-bytes": "max_append_bytes",
    "max-uncommitted-bytes": "max_uncommitted_bytes",
    "snapshot-chunk-bytes": "snapshot_chunk_bytes",
    "lease-drift": "lease_drift_ticks",
    "learner-catch-up": "learner_catch_up_entries",
    "commit-broadcast": "commit_broadcast",
}


@dataclass
class Peer:
    """One simulated server: its disk (storage), its Raft core (None while crashed) and its app.
    Owned by one Env; single-threaded."""

    id: int
    storage: MemoryStorage
    cfg: RaftConfig
    raft: RaftNode | None = None
    applied: list[str] = field(default_factory=list)   # the toy state machine: applied data, in order
    applied_index: int = -1
    conf: ConfState = field(default_factory=ConfState)  # configuration as of applied_index
    pipelined: bool = False                             # accept() at once, acks wait for `sync`
    held: PersistQueue = field(default_factory=PersistQueue)
    written_end: int = 0                                # pipelined: the log end, written or not
    durable_end: int = 0                                # pipelined: every index below it is durable

    def start(self) -> None:
        snap = self.storage.snapshot()
        self.raft = RaftNode(self.id, self.storage, self.cfg, random.Random(self.id), applied=snap.index)
        self.load_snapshot(snap, self.storage.snapshot_data())
        self.held.clear()
        self.written_end = self.durable_end = self.storage.last_index() + 1

    def load_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.applied = [d for d in data.decode().split(";") if d] if data else []
        self.applied_index = meta.index
        self.conf = meta.conf


class ScriptError(Exception):
    """A malformed command (a bug in the script, not in the core)."""


class Env:
    """A cluster of `Peer`s joined by a fake, fully scripted network. Single-threaded."""

    def __init__(self) -> None:
        self.peers: dict[int, Peer] = {}
        self.queues: dict[int, list[Message]] = {}       # undelivered messages by destination
        self.groups: list[set[int]] | None = None        # partition: messages cross no group boundary
        self.cuts: set[frozenset[int]] = set()           # single links cut both ways
        self.sent_counts: dict[str, int] = {}
        self.out: list[str] = []
        # State Machine Safety (§5.4.3, Figure 3): whatever any node applied at an index, every
        # node applies the same entry there. Checked on every apply, in every script.
        self.applied_anywhere: dict[int, Entry] = {}

    # --- output --------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        self.out.append(line)

    # --- mechanics -----------------------------------------------------------------------------

    def node(self, nid: int) -> RaftNode:
        peer = self.peers.get(nid)
        if peer is None:
            raise ScriptError(f"no node {nid}")
        if peer.raft is None:
            raise ScriptError(f"node {nid} is down")
        return peer.raft

    def alive(self) -> list[int]:
        return sorted(n for n, p in self.peers.items() if p.raft is not None)

    def link_down(self, a: int, b: int) -> str | None:
        """Why the network drops messages between a and b, or None when it carries them."""
        if frozenset((a, b)) in self.cuts:
            return "cut"
        if self.groups is not None and not any(a in g and b in g for g in self.groups):
            return "partition"
        return None

    def send(self, m: Message) -> str:
        """Put `m` on the wire; returns a note when the network or a crash drops it."""
        name = type(m).__name__
        self.sent_counts[name] = self.sent_counts.get(name, 0) + 1
        if m.dst not in self.peers:
            return "  [dropped: no such node]"
        if (why := self.link_down(m.src, m.dst)) is not None:
            return f"  [dropped: {why}]"
        if self.peers[m.dst].raft is None:
            return f"  [dropped: {m.dst} is down]"
        self.queues.setdefault(m.dst, []).append(m)
        return ""

    def process_ready(self, nid: int) -> bool:
        """Handle one Ready of node `nid` as the application must; False if it had none."""
        peer = self.peers[nid]
        node = peer.raft
        assert node is not None
        if not node.has_ready():
            return False
        rd = node.ready()
        self.say(f"> {nid} handling Ready")
        self.print_ready(rd)
        if peer.pipelined:
            self._process_ready_pipelined(peer, node, rd)
            return True
        # 1. leader messages that promise nothing about our disk
        notes_now = [self.send(m) for m in rd.send_now]
        # 2. persist
        st = peer.storage
        for chunk in rd.snapshot_chunks:
            st.stage_snapshot_chunk(chunk.meta, chunk.offset, chunk.data)
        if rd.snapshot is not None:
            st.install_snapshot(rd.snapshot)
            peer.load_snapshot(rd.snapshot, st.snapshot_data())
        if rd.entries:
            st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        # 3. messages that may only leave once that is durable
        notes_after = [self.send(m) for m in rd.send_after]
        # 4. apply
        self._apply(peer, rd)
        node.advance()
        self._print_sent("send-now", rd.send_now, notes_now)
        self._print_sent("send-after", rd.send_after, notes_after)
        self._print_applied(rd)
        return True

    def _process_ready_pipelined(self, peer: Peer, node: RaftNode, rd: Ready) -> None:
        """As the runtime: send now, write (entries not durable yet), apply, accept, hold send_after."""
        notes_now = [self.send(m) for m in rd.send_now]
        st = peer.storage
        for chunk in rd.snapshot_chunks:
            st.stage_snapshot_chunk(chunk.meta, chunk.offset, chunk.data)
        if rd.snapshot is not None:
            peer.held.discard_from(rd.snapshot.index + 1)
            st.install_snapshot(rd.snapshot)
            peer.load_snapshot(rd.snapshot, st.snapshot_data())
            peer.written_end = peer.durable_end = rd.snapshot.index + 1   # installed durably
        if rd.entries:
            first = rd.entries[0].index
            peer.held.discard_from(first)
            if first < peer.written_end:
                peer.durable_end = min(peer.durable_end, first)   # a truncation is durable at once
            st.append(rd.entries)
            peer.written_end = rd.entries[-1].last_index + 1
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        self._apply(peer, rd)
        node.accept()
        peer.held.push(rd)
        self._print_sent("send-now", rd.send_now, notes_now)
        if not self.release(peer, current=rd) and rd.send_after:
            wait = rd.entries[-1].last_index if rd.entries else -1
            earlier = len(peer.held) - 1
            behind = f" (behind {earlier} earlier Ready(s), the oldest waiting for index " \
                     f"{peer.held.oldest_wait()})" if earlier else ""
            self.say(f"  send-after held until index {wait} is durable{behind}:")
            for m in rd.send_after:
                self.say(f"    {fmt_msg(m)}")
        self._print_applied(rd)

    def release(self, peer: Peer, current: Ready | None = None) -> bool:
        """Pipelined: send what accepted Readys held, in order, as far as the disk is durable. True if
        `current` (the Ready being handled) went too; it prints as plain `send-after`."""
        node = peer.raft
        assert node is not None
        released = False
        for rd in peer.held.pop_durable(peer.durable_end):
            released |= rd is current
            sent = node.persisted(rd)
            if not rd.send_after:
                if rd is not current:
                    self.say(f"  released (durable end {peer.durable_end}): a Ready with nothing to send")
                continue
            self.say("  send-after:" if rd is current else f"  released (durable end {peer.durable_end}):")
            for m in rd.send_after:
                dropped = ("  [dropped: acknowledges an older term]" if m.term < node.term
                           else "  [dropped: acknowledges entries the log no longer holds]")
                note = self.send(m) if any(m is x for x in sent) else dropped
                self.say(f"    {fmt_msg(m)}{note}")
        return released

    def sync(self, nid: int) -> None:
        """Pipelined: the disk catches up (an fsync completes) and held acknowledgements go out."""
        peer = self.peers[nid]
        if not peer.pipelined:
            raise ScriptError(f"node {nid} is not pipelined")
        peer.durable_end = peer.written_end
        self.say(f"> {nid} durable through {peer.durable_end - 1}")
        self.release(peer)
        waiting = peer.held.oldest_wait()
        if waiting is not None:
            self.say(f"  still held: {len(peer.held)} Ready(s), the oldest waiting for index {waiting}")

    def _apply(self, peer: Peer, rd: Ready) -> None:
        for e in rd.committed:
            assert e.index == peer.applied_index + 1, (peer.id, e, peer.applied_index)
            first = self.applied_anywhere.setdefault(e.index, e)
            assert first == e, f"State Machine Safety violated at {e.index}: node {peer.id} applies {e}, another {first}"
            if e.kind is EntryKind.NORMAL:
                peer.applied.append(e.data.decode())
            elif e.kind is EntryKind.CONF_CHANGE:
                peer.conf = apply_conf_change(peer.conf, decode_conf_change(e.data))
            peer.applied_index = e.last_index

    def _print_applied(self, rd: Ready) -> None:
        if rd.committed:
            self.say("  committed:")
            for e in rd.committed:
                self.say(f"    {fmt_entry(e)}")
        if rd.read_states:
            self.say("  read-states: " + ", ".join(f"req={r.request} index={r.index}" for r in rd.read_states))
        if rd.dropped_reads:
            self.say(f"  dropped-reads: {fmt_ids(rd.dropped_reads)}")

    def print_ready(self, rd: Ready) -> None:
        self.say(f"  Ready must_sync={str(rd.must_sync).lower()}:")
        if rd.soft_state is not None:
            s = rd.soft_state
            self.say(f"  soft-state: {s.role.value} term={s.term} leader={s.leader}")
        if rd.hard_state is not None:
            self.say(f"  hard-state: {fmt_hard(rd.hard_state)}")
        for e in rd.elections:
            self.say(f"  election: {fmt_election(e)}")
        if rd.entries:
            self.say("  entries:")
            for e in rd.entries:
                self.say(f"    {fmt_entry(e)}")
        for c in rd.snapshot_chunks:
            self.say(f"  snapshot-chunk: snap={c.meta.term}/{c.meta.index} offset={c.offset} len={len(c.data)}")
        if rd.snapshot is not None:
            self.say(f"  install-snapshot: {fmt_snap(rd.snapshot)}")

    def _print_sent(self, title: str, msgs: tuple[Message, ...], notes: list[str]) -> None:
        if msgs:
            self.say(f"  {title}:")
            for m, note in zip(msgs, notes, strict=True):
                self.say(f"    {fmt_msg(m)}{note}")

    def deliver(self, nid: int, *, from_: set[int] | None = None, types: set[str] | None = None) -> int:
        """Step the queued messages for `nid` (optionally only some senders/types) into it."""
        queue = self.queues.get(nid, [])
        take = [m for m in queue if (from_ is None or m.src in from_)
                and (types is None or type(m).__name__ in types)]
        if not take:
            return 0
        self.queues[nid] = [m for m in queue if not any(m is t for t in take)]
        self.say(f"> {nid} receiving messages")
        node = self.node(nid)
        for m in take:
            self.say(f"  {fmt_msg(m)}")
            before = (node.role, node.term)
            node.step(m)
            after = (node.role, node.term)
            if before != after:
                self.say(f"    -> {node.role.value} term={node.term}")
        return len(take)

    def stabilize(self, ids: list[int]) -> None:
        for _ in range(1000):
            busy = False
            for nid in ids:
                if self.peers[nid].raft is not None and self.process_ready(nid):
                    busy = True
            for nid in ids:   # pipelined disks keep up
                peer = self.peers[nid]
                if peer.raft is not None and peer.pipelined and peer.durable_end < peer.written_end:
                    self.sync(nid)
                    busy = True
            for nid in ids:
                if self.peers[nid].raft is not None and self.deliver(nid):
                    busy = True
            if not busy:
                return
        raise AssertionError("stabilize did not converge in 1000 rounds")

    # --- commands ------------------------------------------------------------------------------

    def run(self, line: str) -> list[str]:
        self.out = []
        words = line.split()
        cmd, args = words[0], [w for w in words[1:] if w != "silent=true"]
        handler = _COMMANDS.get(cmd)
        if handler is None:
            raise ScriptError(f"unknown command {cmd!r}")
        handler(self, Args(args))
        if len(args) != len(words) - 1:
            self.out = []  # `silent=true`: run it, print nothing (set-up steps shown elsewhere)
        for out_line in self.out:
            assert out_line.strip(), "outputs never contain blank lines (they end a block)"
        return self.out


class Args:
    """Positional words and key=value pairs of one command; `(1,2)` parses as a tuple of ints."""

    def __init__(self, words: list[str]) -> None:
        self.pos: list[str] = []
        self.kv: dict[str, str] = {}
        for w in words:
            if "=" in w:
                k, v = w.split("=", 1)
                self.kv[k] = v
            else:
                self.pos.append(w)
        self.used: set[str] = set()

    def ids(self) -> list[int]:
        try:
            return [int(w) for w in self.pos]
        except ValueError as exc:
            raise ScriptError(f"expected node ids, got {self.pos}") from exc

    def one_id(self) -> int:
        ids = self.ids()
        if len(ids) != 1:
            raise ScriptError(f"expected one node id, got {self.pos}")
        return ids[0]

    def get(self, key: str, default: str | None = None) -> str | None:
        self.used.add(key)
        return self.kv.get(key, default)

    def num(self, key: str, default: int | None = None) -> int:
        v = self.get(key)
        if v is None:
            if default is None:
                raise ScriptError(f"missing {key}=")
            return default
        return int(v)

    def id_set(self, key: str) -> set[int] | None:
        v = self.get(key)
        return None if v is None else set(parse_ids(v))


def parse_ids(text: str) -> tuple[int, ...]:
    m = re.fullmatch(r"\(([0-9,\s]*)\)", text)
    if m is None:
        raise ScriptError(f"expected (id,id,...), got {text!r}")
    return tuple(int(x) for x in m.group(1).split(",") if x.strip())


def _config(args: Args) -> RaftConfig:
    values: dict[str, object] = {}
    for key, attr in _CONFIG_KEYS.items():
        raw = args.get(key)
        if raw is None and key in DEFAULTS:
            values[attr] = DEFAULTS[key]
        elif raw is not None:
            values[attr] = raw == "true" if raw in ("true", "false") else int(raw)
    return RaftConfig(**values)  # type: ignore[arg-type]


def cmd_add_nodes(env: Env, a: Args) -> None:
    """add-nodes N [voters=(..)] [learners=(..)] [term=T] [config...]: N new nodes with an empty log; the
    configuration (if given) is their initial snapshot's. Without it a node is blank: it learns the
    membership from the leader's log or snapshot. `term=T`: their disk holds term T already (as if
    they had lived through T terms without writing an entry)."""
    count = int(a.pos[0])
    voters = parse_ids(a.get("voters") or "()")
    learners = parse_ids(a.get("learners") or "()")
    term = a.num("term", 0)
    cfg = _config(a)
    pipelined = a.get("pipelined") == "true"
    conf = ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners)))
    first = max(env.peers, default=0) + 1
    for nid in range(first, first + count):
        storage = MemoryStorage(conf)
        storage.set_hard_state(HardState(term=term))
        peer = Peer(nid, storage, cfg, pipelined=pipelined)
        env.peers[nid] = peer
        peer.start()
        env.say(f"{nid}: follower term={term} {fmt_conf(conf)}" + (" pipelined" if pipelined else ""))
    env.say(f"config: election={cfg.election_timeout_ticks} heartbeat={cfg.heartbeat_interval_ticks} "
            f"pre-vote={str(cfg.pre_vote).lower()} check-quorum={str(cfg.check_quorum).lower()} "
            f"max-inflight={cfg.max_inflight_appends} max-append-bytes={cfg.max_append_bytes} "
            f"snapshot-chunk-bytes={cfg.snapshot_chunk_bytes}")


def _role_line(node: RaftNode) -> str:
    return f"{node.id}: {node.role.value} term={node.term} vote={node.vote} leader={node.leader}"


def cmd_campaign(env: Env, a: Args) -> None:
    """campaign N: start an election now (a pre-vote first if enabled)."""
    node = env.node(a.one_id())
    node.campaign()
    env.say(_role_line(node))


def cmd_stabilize(env: Env, a: Args) -> None:
    """stabilize [ids]: handle Readys and deliver messages until nothing moves."""
    ids = a.ids() or sorted(env.peers)
    env.stabilize(ids)


def cmd_process_ready(env: Env, a: Args) -> None:
    """process-ready ids: handle one Ready of each node."""
    for nid in a.ids():
        env.node(nid)
        if not env.process_ready(nid):
            env.say(f"> {nid} has no Ready")


def cmd_sync(env: Env, a: Args) -> None:
    """sync ids: a pipelined node's disk catches up (fsync); its held acknowledgements go out."""
    for nid in a.ids():
        env.node(nid)
        env.sync(nid)


def cmd_deliver_msgs(env: Env, a: Args) -> None:
    """deliver-msgs [ids] [from=(..)] [type=Name,Name] [drop=(..)]: step queued messages into the
    nodes (all nodes if none given), optionally only from some senders or of some types; drop=
    first discards every queued message addressed to those nodes."""
    drop = a.id_set("drop")
    if drop:
        for nid in sorted(drop):
            for m in env.queues.pop(nid, []):
                env.say(f"dropped: {fmt_msg(m)}")
    from_ = a.id_set("from")
    types_raw = a.get("type")
    types = set(types_raw.split(",")) if types_raw else None
    ids = a.ids() or ([] if drop and not from_ and not types else sorted(env.peers))
    moved = 0
    for nid in ids:
        if env.peers[nid].raft is not None:
            moved += env.deliver(nid, from_=from_, types=types)
    if not moved and not drop:
        env.say("no messages")


def cmd_msgs(env: Env, a: Args) -> None:
    """msgs [ids]: show the undelivered messages (to the given nodes), without delivering them."""
    ids = a.ids() or sorted(env.queues)
    shown = False
    for nid in ids:
        for m in env.queues.get(nid, []):
            env.say(fmt_msg(m))
            shown = True
    if not shown:
        env.say("no messages")


def cmd_msg_counts(env: Env, a: Args) -> None:
    """msg-counts: messages put on the wire, by type, since the previous msg-counts."""
    total = sum(env.sent_counts.values())
    env.say(f"total={total} " + " ".join(f"{k}={v}" for k, v in sorted(env.sent_counts.items())))
    env.sent_counts = {}


def _tick(env: Env, nid: int, count: int, stop: Callable[[RaftNode], bool] | None = None) -> int:
    node = env.node(nid)
    for i in range(1, count + 1):
        node.tick()
        if stop is not None and stop(node):
            return i
    return count


def cmd_tick(env: Env, a: Args) -> None:
    """tick ids [count=K]: tick each node K times (default 1)."""
    count = a.num("count", 1)
    for nid in a.ids():
        _tick(env, nid, count)
        env.say(_role_line(env.node(nid)))


def cmd_tick_heartbeat(env: Env, a: Args) -> None:
    """tick-heartbeat ids: tick each node heartbeat_interval_ticks times."""
    for nid in a.ids():
        node = env.node(nid)
        _tick(env, nid, node.cfg.heartbeat_interval_ticks)
        env.say(_role_line(node))


def cmd_tick_election(env: Env, a: Args) -> None:
    """tick-election ids: a leader ticks election_timeout_ticks times (one check-quorum period);
    any other node ticks until it starts an election, at most 2 * election_timeout_ticks times
    (randomized timeouts lie in [E, 2E))."""
    for nid in a.ids():
        node = env.node(nid)
        e = node.cfg.election_timeout_ticks
        if node.role.value == "leader":
            n = _tick(env, nid, e)
        else:
            # Stop when it starts an election: its role changes, or (a pre-candidate starting over)
            # it suddenly has messages to send.
            start, had_ready = node.role, node.has_ready()

            def campaigned(nd: RaftNode, start: object = start, had_ready: bool = had_ready) -> bool:
                return nd.role is not start or (not had_ready and nd.has_ready())
            n = _tick(env, nid, 2 * e, campaigned)
        env.say(f"ticked {n}: " + _role_line(node))


def _try(env: Env, fn: Callable[[], object]) -> object:
    try:
        return fn()
    except EpochlogError as exc:
        hint = vars(exc).get("leader_hint")   # errors that name a leader set it; others inherit the table's 0
        extra = f" (leader_hint={hint})" if hint is not None else ""
        env.say(f"error: {type(exc).__name__}: {exc}{extra}")
        return None


def cmd_propose(env: Env, a: Args) -> None:
    """propose N [data=X] [count=K]: propose a batch of K records."""
    node = env.node(a.one_id())
    data = (a.get("data") or "").encode()
    count = a.num("count", 1)
    index = _try(env, lambda: node.propose(data, count))
    if isinstance(index, int):
        env.say(f"proposed at {index}" + (f"..{index + count - 1}" if count > 1 else ""))


def cmd_propose_conf_change(env: Env, a: Args) -> None:
    """propose-conf-change N add-voter|add-learner|promote|remove NODE [auto-promote]"""
    nid = int(a.pos[0])
    kind = _CC_KINDS[a.pos[1]]
    cc = ConfChange(kind, int(a.pos[2]), auto_promote="auto-promote" in a.pos[3:])
    node = env.node(nid)
    index = _try(env, lambda: node.propose_conf_change(cc))
    if index is not None:
        env.say(f"proposed {fmt_cc(cc)} at {index}")


def cmd_transfer_leadership(env: Env, a: Args) -> None:
    """transfer-leadership from=A to=B"""
    node = env.node(a.num("from"))
    target = a.num("to")

    def transfer() -> bool:
        node.transfer_leadership(target)
        return True
    if _try(env, transfer) is not None:
        env.say(f"transferring to {target}")


def cmd_read_index(env: Env, a: Args) -> None:
    """read-index N req=R: start a ReadIndex read; its ReadState shows in a later Ready."""
    node = env.node(a.one_id())
    req = a.num("req")

    def read() -> bool:
        node.read_index(req)
        return True
    if _try(env, read) is not None:
        env.say(f"read {req} pending")


def cmd_forward_read_index(env: Env, a: Args) -> None:
    """forward-read-index N req=R: a follower's read; its leader answers with a read index (ReadIndexResp)."""
    node = env.node(a.one_id())
    req = a.num("req")

    def read() -> bool:
        node.forward_read_index(req)
        return True
    if _try(env, read) is not None:
        env.say(f"read {req} asked of {node.leader}")


def cmd_lease_read(env: Env, a: Args) -> None:
    """lease-read N: the index a lease read may be served at, or `no lease`."""
    node = env.node(a.one_id())
    index = node.lease_read_index()
    env.say("no lease" if index is None else f"lease read at index {index}")


def cmd_clock_jumped(env: Env, a: Args) -> None:
    """clock-jumped ids: time passed that the node did not count (a pause): its lease is void."""
    for nid in a.ids():
        env.node(nid).clock_jumped()
        env.say(f"{nid}: no lease from before now")


def cmd_crash(env: Env, a: Args) -> None:
    """crash ids: lose all volatile state; what the app persisted stays; queued messages to it are lost."""
    for nid in a.ids():
        env.node(nid)
        env.peers[nid].raft = None
        lost = env.queues.pop(nid, [])
        env.say(f"{nid} crashed" + (f" ({len(lost)} undelivered messages lost)" if lost else ""))


def cmd_restart(env: Env, a: Args) -> None:
    """restart ids: a new RaftNode over the same storage; the state machine reloads the snapshot."""
    for nid in a.ids():
        peer = env.peers[nid]
        if peer.raft is not None:
            raise ScriptError(f"node {nid} is running")
        peer.start()
        node = env.node(nid)
        env.say(_role_line(node) + f" commit={node.log.committed} last={node.log.last_index()}")


def cmd_partition(env: Env, a: Args) -> None:
    """partition (..) (..) ...: only nodes in the same group can talk; unlisted nodes are alone."""
    groups = [set(parse_ids(w)) for w in a.pos]
    listed = set().union(*groups)
    groups += [{n} for n in env.peers if n not in listed]
    env.groups = groups
    env.say("partition: " + " ".join(fmt_ids(sorted(g)) for g in sorted(groups, key=min)))


def cmd_cut(env: Env, a: Args) -> None:
    """cut A B: the link between A and B drops everything, both ways (other links work)."""
    x, y = a.ids()
    env.cuts.add(frozenset((x, y)))
    env.say(f"cut {x}-{y}")


def cmd_heal(env: Env, a: Args) -> None:
    """heal: remove the partition and every cut link (messages dropped meanwhile stay lost)."""
    env.groups = None
    env.cuts = set()
    env.say("healed")


def cmd_status(env: Env, a: Args) -> None:
    """status ids: role, term, vote, commit, applied, membership; a leader's follower progress."""
    for nid in a.ids() or env.alive():
        node = env.node(nid)
        peer = env.peers[nid]
        floor = f" floor={node.vote_floor[0]}/{node.vote_floor[1]}" if node.vote_floor is not None else ""
        env.say(_role_line(node) + f" commit={node.log.committed} applied={peer.applied_index} "
                f"last={node.log.last_index()} {fmt_conf(node.conf)}{floor}"
                + (" term-exhausted" if node.term_exhausted else ""))
        if node.role.value == "leader":
            for pid, pr in sorted(node.progress.items()):
                paused = pr.is_paused(node.cfg.max_inflight_appends, node.cfg.max_inflight_bytes)
                extra = ""
                if pr.state is ProgressState.REPLICATE:
                    extra = f" inflight={len(pr.inflight)}"
                if pr.state is ProgressState.SNAPSHOT and pr.snapshot is not None:
                    extra = f" snap={pr.snapshot.index} offset={pr.snapshot_offset}"
                env.say(f"  {pid}: {pr.state.value} match={pr.match} next={pr.next}{extra}"
                        + (" paused" if paused and pid != nid else ""))


def cmd_log(env: Env, a: Args) -> None:
    """log N: what node N's disk holds: hard state, snapshot, entries (works while crashed)."""
    nid = a.one_id()
    st = env.peers[nid].storage
    env.say(f"hard-state: {fmt_hard(st.hard_state)}")
    snap = st.snapshot()
    env.say(f"snapshot: {fmt_snap(snap)}" if snap.index >= 0 else "snapshot: none")
    entries = st.entries(st.first_index(), st.last_index() + 1, 1 << 60) if st.last_index() >= st.first_index() else []
    env.say("entries: " + (fmt_entries(entries) if entries else "[]"))
    peer = env.peers[nid]
    if peer.raft is None:
        env.say("applied: (state machine down)")
    else:
        env.say(f"applied: {peer.applied_index} {peer.applied}".replace("'", '"'))


def cmd_raft_log(env: Env, a: Args) -> None:
    """raft-log N: the core's view of its log: bounds, commit/applied, unstable tail, pending snapshot."""
    node = env.node(a.one_id())
    log = node.log
    env.say(f"first={log.first_index()} last={log.last_index()} stable-last={log.stable_last_index()} "
            f"committed={log.committed} applied={log.applied}")
    env.say("unstable: " + (fmt_entries(log.unstable) if log.unstable else "[]"))
    if log.pending_snapshot is not None:
        env.say(f"pending-snapshot: {fmt_snap(log.pending_snapshot)}")


def cmd_drop_entries(env: Env, a: Args) -> None:
    """drop-entries N index=I: the app finds the entries from I on damaged on its disk and drops them as
    the runtime does (eventlog/raft/runtime/repair.py): the hard state with the vote floor is persisted
    first, then the entries leave the storage, then the core is told (and tells the leader)."""
    nid = a.one_id()
    node = env.node(nid)
    peer = env.peers[nid]
    index = a.num("index")
    hs = _try(env, lambda: node.drop_entries(index))
    if not isinstance(hs, HardState):
        return
    peer.storage.set_hard_state(hs)
    env.say(f"hard-state: {fmt_hard(hs)}")
    if peer.pipelined:
        peer.held.discard_from(index)
        peer.written_end = min(peer.written_end, index)
        peer.durable_end = min(peer.durable_end, index)
    peer.storage.truncate_from(index)
    node.entries_dropped()
    env.say(f"{nid}: dropped entries from {index}; commit={node.log.committed} applied={peer.applied_index} "
            f"last={node.log.last_index()}")


def cmd_compact(env: Env, a: Args) -> None:
    """compact N index=I: the app snapshots its state machine at applied index I; the log up to I goes."""
    nid = a.one_id()
    peer = env.peers[nid]
    index = a.num("index")
    if index > peer.applied_index:
        raise ScriptError(f"node {nid} applied only through {peer.applied_index}")
    if index != peer.applied_index:
        raise ScriptError("the toy state machine can only snapshot at its applied index")
    data = ";".join(peer.applied).encode()
    meta = peer.storage.create_snapshot(index, peer.conf, data)
    env.say(f"snapshot {fmt_snap(meta)}; log starts at {peer.storage.first_index()}")


_COMMANDS: dict[str, Callable[[Env, Args], None]] = {
    "add-nodes": cmd_add_nodes,
    "campaign": cmd_campaign,
    "stabilize": cmd_stabilize,
    "process-ready": cmd_process_ready,
    "sync": cmd_sync,
    "deliver-msgs": cmd_deliver_msgs,
    "msgs": cmd_msgs,
    "msg-counts": cmd_msg_counts,
    "tick": cmd_tick,
    "tick-heartbeat": cmd_tick_heartbeat,
    "tick-election": cmd_tick_election,
    "propose": cmd_propose,
    "propose-conf-change": cmd_propose_conf_change,
    "transfer-leadership": cmd_transfer_leadership,
    "read-index": cmd_read_index,
    "forward-read-index": cmd_forward_read_index,
    "lease-read": cmd_lease_read,
    "clock-jumped": cmd_clock_jumped,
    "crash": cmd_crash,
    "restart": cmd_restart,
    "partition": cmd_partition,
    "cut": cmd_cut,
    "heal": cmd_heal,
    "status": cmd_status,
    "log": cmd_log,
    "raft-log": cmd_raft_log,
    "compact": cmd_compact,
    "drop-entries": cmd_drop_entries,
}


# --- scripts -------------------------------------------------------------------------------------

@dataclass
class Block:
    """One command of a script, where it is, and the output written under it."""

    line_no: int
    command: str
    expected: list[str]


@dataclass
class Script:
    path: Path
    items: list[str | Block]     # text lines (comments, blank lines) and command blocks, in file order
    xfail: str | None

    @classmethod
    def parse(cls, path: Path) -> Script:
        lines = path.read_text().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        items: list[str | Block] = []
        xfail = None
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.strip() or line.startswith("#"):
                if line.startswith("# xfail:"):
                    xfail = line[len("# xfail:"):].strip()
                items.append(line)
                i += 1
                continue
            if i + 1 >= len(lines) or lines[i + 1] != "----":
                raise ScriptError(f"{path.name}:{i + 1}: command {line!r} is not followed by ----")
            block = Block(i + 1, line.strip(), [])
            i += 2
            while i < len(lines) and lines[i].strip():
                block.expected.append(lines[i])
                i += 1
            items.append(block)
        return cls(path, items, xfail)

    def blocks(self) -> list[Block]:
        return [b for b in self.items if isinstance(b, Block)]

    def render(self, outputs: dict[int, list[str]]) -> str:
        out: list[str] = []
        for item in self.items:
            if isinstance(item, Block):
                out += [item.command, "----", *outputs.get(item.line_no, item.expected)]
            else:
                out.append(item)
        return "\n".join(out) + "\n"


def run_script(path: Path, rewrite: bool) -> None:
    """Run one script; on a mismatch fail with a diff, or with `rewrite` store the actual output."""
    script = Script.parse(path)
    env = Env()
    outputs: dict[int, list[str]] = {}
    for block in script.blocks():
        try:
            actual = env.run(block.command)
        except ScriptError as exc:
            raise AssertionError(f"{path.name}:{block.line_no}: {block.command!r}: {exc}") from exc
        except Exception as exc:
            raise AssertionError(f"{path.name}:{block.line_no}: {block.command!r} raised "
                                 f"{type(exc).__name__}: {exc}\noutput so far:\n" + "\n".join(env.out)) from exc
        outputs[block.line_no] = actual
        if not rewrite and actual != block.expected:
            diff = "\n".join(difflib.unified_diff(block.expected, actual, "expected", "actual", lineterm=""))
            raise AssertionError(f"{path.name}:{block.line_no}: output of {block.command!r} differs "
                                 f"(run `pytest tests/eventlog/raft --rewrite` if the change is intended):\n{diff}")
    if rewrite:
        text = script.render(outputs)
        if text != path.read_text():
            path.write_text(text)
