"""Checks a message from the network before the Raft core steps it (sans-IO, like the core).

The core trusts its peers: it asserts what no honest member sends (a message for another node, an
append that splits an entry) and takes any term it is shown. So every message from a peer passes
`PeerCheck.check` first, and one that fails is dropped with a reason (the runtime counts and logs
it). The checks, in order:

1. identity: `src` is the peer the transport says sent it (with mutual TLS, the node id of its
   certificate), never this node; `dst` is this node.
2. fields: every term within [0, MAX_TERM] (`term_limit` above it: no node can write such a term),
   indexes and counts in range and consistent within the message: an append's entries follow
   (prev_index, prev_term) contiguously, with non-decreasing terms no higher than the message's, a
   NOOP or configuration entry covers one index, a configuration entry decodes; a snapshot chunk
   lies within its snapshot, only the last one ends at its size, and the snapshot's membership is
   well formed; entry data is what the storage can hold (`check_entry`, given by the runtime).
3. membership, as this node sees the group: the sender is a voter or learner of the configuration
   in force at its commit index or of a later one in its log (changes in flight count both ways: a
   voter being removed may still have to win an election, thesis §4.2.2; a learner may have been
   promoted by entries this node lacks). So a removed server cannot disrupt the group (thesis
   §4.2.3) and a stranger can neither lead it nor raise its term. Requests and a leader's messages
   from a sender in none of them are still taken in two cases where this node's view may lag: the
   sender is in the node's address book (`known_peer`) and no configuration this node holds lists
   it (a member added by entries this node has not received; configurations that list it and no
   longer do are its removal); or this node is in none of its own configurations (a node being
   added that has not received the entry adding it cannot know its leader), for a leader's message.
4. leadership: one leader per term (Election Safety, §5.2), so in this node's term a leader's
   message comes from the leader it knows of; as leader, a response acknowledges no index beyond
   its log or inside one of its entries, and no heartbeat round it has not started.
5. the log, for a leader's message the core will act on: the commit index it sets ends an entry
   (else the entry would be applied past the commit index), an append's prev_index ends an entry of
   this log, entries it already holds have the same boundaries, and its configuration changes apply
   in order from the configuration at prev_index; a snapshot chunk the core will take is one the
   storage can stage (`check_snapshot_chunk`, given by the runtime: its image receiver refuses
   bytes that are no part of a valid image), so the core never takes, nor on the last chunk
   restores, a snapshot its storage cannot hold.

A dropped message is as if the network lost it: Raft tolerates loss (a leader retries, a candidate
times out), so dropping is always safe, and an honest member's message is dropped only when it is
stale (from a removed member, or answering a request of a configuration this node left).

What no check here can tell: a message forged in the name of a member with a plausible content.
Only the transport's authentication (mutual TLS) stops that. Entry data is opaque here: a record
this node's state machine cannot apply is the state machine's concern (statemachines/apply.py
halts the group on it, on every node alike).

Call from the node's thread that owns the core, right before `RaftNode.step`: the state-dependent
checks read the core as it is at that moment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from eventlog.raft.confchange import apply_conf_change, decode_conf_change
from eventlog.raft.errors import ConfChangeError
from eventlog.raft.node import RaftNode, Role
from eventlog.raft.types import (
    MAX_TERM,
    Append,
    AppendResp,
    ConfState,
    Entry,
    EntryKind,
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

MAX_INDEX = (1 << 62) - 1
"""Highest index a peer may name: offsets are int64 on disk, with room for an entry's count."""
MAX_COUNT = (1 << 31) - 1
"""Most indexes one entry may cover: a record batch's lastOffsetDelta is an int32."""

# Why a message was dropped (the `reason` label of the runtime's drop counter; a closed set).
SRC_MISMATCH = "src_mismatch"        # src is not the peer that sent it (or is this node)
WRONG_DST = "wrong_dst"              # dst is not this node
TERM_LIMIT = "term_limit"            # a term above MAX_TERM
MALFORMED = "malformed"              # a field out of range or inconsistent with the others
SNAPSHOT_CHUNK = "snapshot_chunk"    # a snapshot chunk outside its snapshot, or a bad snapshot meta
SNAPSHOT_IMAGE = "snapshot_image"    # a snapshot chunk the storage cannot stage (not a valid image's bytes)
BAD_ENTRY = "bad_entry"              # entries the storage or this log cannot take as they are
NOT_MEMBER = "not_member"            # from a node that is not a member as this node sees the group
NOT_LEADER = "not_leader"            # a leader's message from another node than this term's leader
UNKNOWN_GROUP = "unknown_group"      # (the host's) a message for a group this node does not run
REASONS = (SRC_MISMATCH, WRONG_DST, TERM_LIMIT, MALFORMED, SNAPSHOT_CHUNK, SNAPSHOT_IMAGE, BAD_ENTRY, NOT_MEMBER,
           NOT_LEADER, UNKNOWN_GROUP)

_LEADER_MESSAGES = (Append, Heartbeat, InstallSnapshot, TimeoutNow, ReadIndexResp)
_RESPONSES = (PreVoteResp, VoteResp, AppendResp, HeartbeatResp, InstallSnapshotResp)


@dataclass(frozen=True, slots=True)
class Drop:
    """Why a message was dropped: `reason` is one of REASONS, `detail` says what was wrong."""

    reason: str
    detail: str


def _no_entry_check(entry: Entry) -> str | None:
    return None


def _no_snapshot_chunk_check(meta: SnapshotMeta, offset: int, data: bytes) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class PeerCheck:
    """The checks of one group of a node (see the module docstring); stateless itself, it reads the core.

    `known_peer(id)`: whether the node's address book knows `id` as a current member of the
    cluster (not a removed one). `check_entry(entry)`: why the storage cannot hold this entry's
    data as it is, or None (the core treats data as opaque bytes). `check_snapshot_chunk(meta,
    offset, data)`: why the group's storage cannot stage this chunk (with the chunks it staged so
    far) or, when it ends the snapshot, install it; None also for a chunk that does not continue
    the snapshot being staged (the core answers it itself). Asked only for a chunk the core may
    take: the runtime hands the core the chunks it took (Ready.snapshot_chunks) for staging before
    it steps another InstallSnapshot, so the storage's staged image is the core's.
    """

    known_peer: Callable[[int], bool]
    check_entry: Callable[[Entry], str | None] = _no_entry_check
    check_snapshot_chunk: Callable[[SnapshotMeta, int, bytes], str | None] = _no_snapshot_chunk_check

    def check(self, node: RaftNode, peer: int, m: Message) -> Drop | None:
        """None when `node` may step `m`, which arrived from `peer`; else why it must be dropped."""
        if m.src != peer or m.src == node.id:
            return Drop(SRC_MISMATCH, f"src {m.src} from peer {peer}")
        if m.dst != node.id:
            return Drop(WRONG_DST, f"dst {m.dst}")
        drop = _check_fields(m) or self._check_entries(m)
        if drop is None:
            drop = self._check_membership(node, m)
        if drop is None:
            drop = _check_leadership(node, m)
        if drop is None and isinstance(m, Append | Heartbeat | InstallSnapshot) and m.term >= node.term:
            drop = _check_against_log(node, m)
            if drop is None and isinstance(m, InstallSnapshot):
                drop = self._check_image(node, m)
        return drop

    def _check_entries(self, m: Message) -> Drop | None:
        if isinstance(m, Append):
            for e in m.entries:
                why = self.check_entry(e)
                if why is not None:
                    return Drop(BAD_ENTRY, f"entry {e.index}: {why}")
        return None

    def _check_image(self, node: RaftNode, m: InstallSnapshot) -> Drop | None:
        """A chunk the core takes (it does not hold the snapshot's last entry yet) is one the storage
        can stage: else the core would count it received and, on the last one, restore a snapshot
        its storage never holds (the storage would fail the group)."""
        meta, log = m.meta, node.log
        if meta.index <= log.committed or log.match_term(meta.index, meta.term):
            return None   # the core answers that it holds the snapshot, staging nothing
        why = self.check_snapshot_chunk(meta, m.offset, m.data)
        if why is not None:
            return Drop(SNAPSHOT_IMAGE, f"snapshot {meta.index}, bytes [{m.offset}, {m.offset + len(m.data)}): {why}")
        return None

    def _check_membership(self, node: RaftNode, m: Message) -> Drop | None:
        src = m.src
        committed = node.log.committed
        if node.conf_at(committed).contains(src):   # the usual case, without building the tuple below
            return None
        in_force = node.confs_since(committed)
        if any(c.contains(src) for c in in_force):
            return None
        if isinstance(m, _RESPONSES):
            return Drop(NOT_MEMBER, f"{type(m).__name__} from {src}, not a member")
        if self._unheard_of(node, src):
            return None
        if isinstance(m, _LEADER_MESSAGES) and not any(c.contains(node.id) for c in in_force):
            return None   # not a member itself yet: it cannot know who leads
        return Drop(NOT_MEMBER, f"{type(m).__name__} from {src}, not a member")

    def _unheard_of(self, node: RaftNode, src: int) -> bool:
        """A current member of the cluster that no configuration this node holds lists: one added
        by entries this node has not received yet."""
        return self.known_peer(src) and not any(c.contains(src) for c in node.confs_since(-1))


def _term_drop(what: str, value: int, upper: int = MAX_TERM) -> Drop | None:
    if value > MAX_TERM:
        return Drop(TERM_LIMIT, f"{what} {value} is above the limit {MAX_TERM}")
    if not 0 <= value <= upper:
        return Drop(MALFORMED, f"{what} {value} is outside [0, {upper}]")
    return None


def _index_ok(value: int, low: int = -1) -> bool:
    return low <= value <= MAX_INDEX


def _check_fields(m: Message) -> Drop | None:
    """Ranges and consistency within the message alone."""
    drop = _term_drop("term", m.term)
    if drop is not None:
        return drop
    if isinstance(m, Vote | PreVote):
        if m.term < 1 or not _index_ok(m.last_index):
            return Drop(MALFORMED, f"term {m.term}, last index {m.last_index}")
        drop = _term_drop("last term", m.last_term, m.term - 1)
        if drop is None and (m.last_index == -1) != (m.last_term == 0):
            drop = Drop(MALFORMED, f"last entry {m.last_term}/{m.last_index}")
        return drop
    if isinstance(m, Append):
        return _check_append(m)
    if isinstance(m, AppendResp):
        if not (_index_ok(m.index) and _index_ok(m.hint_index, -2)):
            return Drop(MALFORMED, f"index {m.index}, hint index {m.hint_index}")
        return _term_drop("hint term", m.hint_term)
    if isinstance(m, Heartbeat):
        if not _index_ok(m.commit) or m.ctx < 0:
            return Drop(MALFORMED, f"commit {m.commit}, round {m.ctx}")
    elif isinstance(m, HeartbeatResp | ReadIndex):
        if m.ctx < 0:
            return Drop(MALFORMED, f"round {m.ctx}")
    elif isinstance(m, ReadIndexResp):
        if m.ctx < 0 or not _index_ok(m.index):
            return Drop(MALFORMED, f"read {m.ctx}, index {m.index}")
    elif isinstance(m, InstallSnapshot):
        return _check_snapshot_chunk(m)
    elif isinstance(m, InstallSnapshotResp) and not (_index_ok(m.index) and _index_ok(m.offset, 0)):
        return Drop(MALFORMED, f"snapshot {m.index}, offset {m.offset}")
    return None


def _check_append(m: Append) -> Drop | None:
    if not (_index_ok(m.prev_index) and _index_ok(m.commit)):
        return Drop(MALFORMED, f"prev index {m.prev_index}, commit {m.commit}")
    drop = _term_drop("prev term", m.prev_term, m.term)
    if drop is not None:
        return drop
    if (m.prev_index == -1) != (m.prev_term == 0):
        return Drop(MALFORMED, f"prev {m.prev_term}/{m.prev_index}")
    next_index, min_term = m.prev_index + 1, max(1, m.prev_term)
    for e in m.entries:
        if e.index != next_index or not 1 <= e.count <= MAX_COUNT or e.last_index > MAX_INDEX:
            return Drop(MALFORMED, f"entry {e.index} (count {e.count}) where {next_index} should follow")
        if not min_term <= e.term <= m.term:
            return _term_drop("entry term", e.term) or Drop(
                MALFORMED, f"entry {e.index} of term {e.term} in an append of term {m.term} after term {min_term}")
        if e.kind is not EntryKind.NORMAL and e.count != 1:
            return Drop(MALFORMED, f"{e.kind.name} entry {e.index} covers {e.count} indexes")
        if e.kind is EntryKind.NOOP and e.data:
            return Drop(MALFORMED, f"NOOP entry {e.index} with data")
        if e.kind is EntryKind.CONF_CHANGE:
            try:
                decode_conf_change(e.data)
            except (msgspec.DecodeError, ValueError) as exc:
                return Drop(MALFORMED, f"configuration entry {e.index}: {exc}")
        next_index, min_term = e.last_index + 1, e.term
    return None


def _check_snapshot_chunk(m: InstallSnapshot) -> Drop | None:
    meta = m.meta
    if not _index_ok(meta.index, 0) or not 0 <= meta.size <= MAX_INDEX:
        return Drop(SNAPSHOT_CHUNK, f"snapshot {meta.index} of {meta.size} bytes")
    drop = _term_drop("snapshot term", meta.term, m.term)
    if drop is not None:
        return drop
    if meta.term < 1:
        return Drop(SNAPSHOT_CHUNK, f"snapshot {meta.index} of term {meta.term}")
    end = m.offset + len(m.data)
    if m.offset < 0 or end > meta.size or m.done != (end == meta.size) or (not m.done and not m.data):
        return Drop(SNAPSHOT_CHUNK, f"bytes [{m.offset}, {end}){' (last)' if m.done else ''} of a snapshot "
                                    f"of {meta.size} bytes")
    why = _conf_problem(meta.conf)
    if why is not None:
        return Drop(SNAPSHOT_CHUNK, f"snapshot {meta.index}: {why}")
    return None


def _conf_problem(conf: ConfState) -> str | None:
    """What ConfState's own validation leaves: sorted, distinct, positive ids and at least one voter."""
    for ids in (conf.voters, conf.learners, conf.auto_promote):
        if list(ids) != sorted(set(ids)) or any(i <= 0 for i in ids):
            return f"membership ids {ids} are not sorted, distinct, positive"
    if not conf.voters:
        return "a membership without voters"
    return None


def _check_leadership(node: RaftNode, m: Message) -> Drop | None:
    if m.term != node.term:
        return None   # an older term: the core answers without looking further; a newer: no leader known yet
    if isinstance(m, _LEADER_MESSAGES) and node.leader not in (0, m.src):
        return Drop(NOT_LEADER, f"{type(m).__name__} from {m.src} in term {m.term}, led by {node.leader}")
    if node.role is Role.LEADER:
        log = node.log
        if isinstance(m, AppendResp) and m.index > log.last_index():
            return Drop(MALFORMED, f"answers index {m.index}, beyond the leader's last {log.last_index()}")
        if (isinstance(m, AppendResp) and not m.reject and m.index >= log.first_index()
                and log.entry_bounds(m.index)[1] != m.index):
            # A match inside an entry would become a commit index inside one.
            return Drop(MALFORMED, f"acknowledges index {m.index}, inside an entry")
        if isinstance(m, HeartbeatResp) and m.ctx > node.heartbeat_round:
            return Drop(MALFORMED, f"answers heartbeat round {m.ctx}, the latest is {node.heartbeat_round}")
    return None


def _inside_entry(node: RaftNode, index: int) -> bool:
    """Whether `index`, a new commit index this node's log holds, falls inside an entry (not at its end)."""
    log = node.log
    return log.committed < index and index >= log.first_index() and log.entry_bounds(index)[1] != index


def _check_against_log(node: RaftNode, m: Append | Heartbeat | InstallSnapshot) -> Drop | None:
    """What the core asserts of a leader's message it acts on (a log shape an honest leader never sends):
    the commit index it sets ends an entry, the entries it appends fit the log."""
    log = node.log
    if isinstance(m, Heartbeat):
        commit = min(m.commit, log.last_index())
        if _inside_entry(node, commit):
            return Drop(BAD_ENTRY, f"commit {commit} is inside an entry")
        return None
    if isinstance(m, InstallSnapshot):
        meta = m.meta
        if log.match_term(meta.index, meta.term) and _inside_entry(node, meta.index):
            return Drop(BAD_ENTRY, f"snapshot index {meta.index} is inside an entry held")
        return None
    if m.prev_index < log.committed or not log.match_term(m.prev_index, m.prev_term):
        return None   # the core answers without appending (behind the commit, no match)
    if m.prev_index >= log.first_index() and log.entry_bounds(m.prev_index)[1] != m.prev_index:
        return Drop(BAD_ENTRY, f"prev index {m.prev_index} is inside an entry")
    last_new = m.entries[-1].last_index if m.entries else m.prev_index
    commit = min(m.commit, last_new)
    if (commit <= m.prev_index and _inside_entry(node, commit)) or (
            commit > m.prev_index and all(e.last_index != commit for e in m.entries)):
        return Drop(BAD_ENTRY, f"commit {commit} is inside an entry")
    conf = node.conf_at(m.prev_index)
    holding = True
    for e in m.entries:
        holding = holding and log.match_term(e.index, e.term)
        if holding and log.entry_bounds(e.index) != (e.index, e.last_index):
            return Drop(BAD_ENTRY, f"entry {e.term}/{e.index}..{e.last_index} differs from the one held")
        if e.kind is EntryKind.CONF_CHANGE:
            try:
                conf = apply_conf_change(conf, decode_conf_change(e.data))
            except ConfChangeError as exc:
                return Drop(BAD_ENTRY, f"configuration entry {e.index}: {exc}")
    return None
