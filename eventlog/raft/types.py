"""Value types of the Raft core: log entries, persistent state, configurations, messages.

All are frozen msgspec structs: immutable, slotted, validated by type, and encodable as they are by
the peer transport (messages form one tagged union, `Message`).

Indexes are log offsets. An `Entry` is one record batch and covers `count` consecutive indexes, all
written in the same term (KRaft style); Raft's rules hold per index, and since a batch is created
once by one leader and copied byte for byte, every node that holds a batch holds it with the same
boundaries. Index 0 is "before the log": the first entry of a fresh log has index 0.
"""

from __future__ import annotations

import enum

import msgspec

MAX_TERM = (1 << 31) - 1
"""The highest term a node holds, campaigns for or accepts from a peer.

The node runtime stores each entry's term as its RecordBatch's int32 partitionLeaderEpoch
(eventlog/raft/runtime/entries.py), so a higher term could never be written. A node whose term
reaches it cannot start another election (`RaftNode.term_exhausted`): about two billion elections,
so in practice only terms a member forged get there; the peer checks (eventlog/raft/peer_check.py)
refuse any term above it."""


class EntryKind(enum.IntEnum):
    NORMAL = 0        # application data (a record batch)
    NOOP = 1          # appended by every new leader: commits the entries of earlier terms (§5.4.2)
    CONF_CHANGE = 2   # data is an encoded ConfChange


class Entry(msgspec.Struct, frozen=True):
    """One log entry (a batch) covering indexes [index, index + count)."""

    index: int
    term: int
    count: int = 1
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""

    @property
    def last_index(self) -> int:
        return self.index + self.count - 1

    @property
    def size(self) -> int:
        """Bytes this entry counts for in flow control."""
        return len(self.data) + 32


class HardState(msgspec.Struct, frozen=True):
    """What must be on disk before a node answers: current term, vote in it, commit index.

    `commit` is -1 when nothing is known to be committed. (`floor_index`, `floor_term`) is the vote
    floor of a node that dropped entries it held (a damaged batch on its disk, `RaftNode.drop_entries`):
    the end of its log before the drop. Until its log is again at least that up to date it grants votes
    only to candidates whose log is, and does not campaign (-1: no floor).
    """

    term: int = 0
    vote: int = 0      # 0 = no vote (node ids are positive)
    commit: int = -1
    floor_index: int = -1
    floor_term: int = 0


class ConfState(msgspec.Struct, frozen=True):
    """A cluster membership: voters and learners (disjoint, sorted tuples of node ids).

    `auto_promote` lists the learners the leader promotes to voters once they have caught up.
    """

    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    auto_promote: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if set(self.voters) & set(self.learners):
            raise ValueError(f"a node cannot be voter and learner: {self}")
        if not set(self.auto_promote) <= set(self.learners):
            raise ValueError(f"only learners can be auto-promoted: {self}")

    def contains(self, node: int) -> bool:
        return node in self.voters or node in self.learners


class ConfChangeKind(enum.IntEnum):
    ADD_VOTER = 0
    ADD_LEARNER = 1   # with auto_promote, the leader promotes it once it has caught up
    PROMOTE = 2
    REMOVE = 3


class ConfChange(msgspec.Struct, frozen=True):
    """A single-server membership change (Raft thesis §4.1): one node at a time."""

    kind: ConfChangeKind
    node: int
    auto_promote: bool = False


class SnapshotMeta(msgspec.Struct, frozen=True):
    """Describes a snapshot: the state after applying every index up to `index` (term `term`)."""

    index: int = -1
    term: int = 0
    conf: ConfState = ConfState()
    size: int = 0        # bytes of the opaque snapshot content


# --- messages ------------------------------------------------------------------------------------

class PreVote(msgspec.Struct, frozen=True, tag="pv"):
    """Would you vote for me in `term` (not yet mine)? Sent before a real election (thesis §9.6)."""

    term: int
    src: int
    dst: int
    last_index: int
    last_term: int


class PreVoteResp(msgspec.Struct, frozen=True, tag="pvr"):
    term: int
    src: int
    dst: int
    granted: bool


class Vote(msgspec.Struct, frozen=True, tag="v"):
    term: int
    src: int
    dst: int
    last_index: int
    last_term: int
    transfer: bool = False   # leadership transfer: grant even within a leader's lease


class VoteResp(msgspec.Struct, frozen=True, tag="vr"):
    term: int
    src: int
    dst: int
    granted: bool


class Append(msgspec.Struct, frozen=True, tag="a"):
    """AppendEntries: entries following (prev_index, prev_term), and the leader's commit index."""

    term: int
    src: int
    dst: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int


class AppendResp(msgspec.Struct, frozen=True, tag="ar"):
    """Accepts through `index`, or rejects the append at `index` with a hint for fast backtracking.

    On reject, (hint_index, hint_term) is the follower's last entry at or below `index` whose term is
    <= the rejected prev_term: the leader skips every index whose term cannot match (thesis §5.3).
    `lost`: the follower dropped entries it had acknowledged (a damaged batch on its disk): its log
    holds nothing past `hint_index`, so the leader lowers its match and sends them again.
    """

    term: int
    src: int
    dst: int
    index: int
    reject: bool = False
    hint_index: int = -1
    hint_term: int = 0
    lost: bool = False


class Heartbeat(msgspec.Struct, frozen=True, tag="hb"):
    term: int
    src: int
    dst: int
    commit: int
    ctx: int = 0        # read-index round being confirmed (0 = none)


class HeartbeatResp(msgspec.Struct, frozen=True, tag="hbr"):
    term: int
    src: int
    dst: int
    ctx: int = 0


class InstallSnapshot(msgspec.Struct, frozen=True, tag="is"):
    """One chunk of a snapshot, at byte `offset` of its content; `done` on the last chunk."""

    term: int
    src: int
    dst: int
    meta: SnapshotMeta
    offset: int
    data: bytes
    done: bool


class InstallSnapshotResp(msgspec.Struct, frozen=True, tag="isr"):
    """Next byte wanted of snapshot `index` (its size once installed), or `reject` to restart."""

    term: int
    src: int
    dst: int
    index: int
    offset: int
    reject: bool = False


class TimeoutNow(msgspec.Struct, frozen=True, tag="tn"):
    """Leadership transfer: start an election now (thesis §3.10)."""

    term: int
    src: int
    dst: int


class ReadIndex(msgspec.Struct, frozen=True, tag="ri"):
    """A follower's read (thesis §6.4): it asks the leader for a read index; `ctx` names the request."""

    term: int
    src: int
    dst: int
    ctx: int


class ReadIndexResp(msgspec.Struct, frozen=True, tag="rir"):
    """The leader's answer to ReadIndex `ctx`, once a heartbeat round confirmed it still led: the read
    sees every write committed before it once the follower applied through `index`."""

    term: int
    src: int
    dst: int
    ctx: int
    index: int


Message = (PreVote | PreVoteResp | Vote | VoteResp | Append | AppendResp | Heartbeat | HeartbeatResp
           | InstallSnapshot | InstallSnapshotResp | TimeoutNow | ReadIndex | ReadIndexResp)
