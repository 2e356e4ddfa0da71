"""The peer checks (eventlog/raft/peer_check.py), table-driven over real cores.

Each case builds a `RaftNode` over a `MemoryStorage` in a known state, hands the checker a message
as it would come off the network, and expects a drop reason (or None: the core may step it). For
the inputs that stopped real nodes (issue 18), `test_the_core_fails_on_what_the_check_drops` shows
the core itself asserts or raises on them: the check is what keeps a node up.

The runtime's entry check (eventlog/raft/runtime/entries.py: the record batch a NORMAL entry must
hold) is tested at the end against real encoded batches.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.errors import LogCorruptionError
from eventlog.raft import ConfChange, ConfChangeKind, ConfState, Entry, EntryKind, RaftError, RaftNode, Role
from eventlog.raft.confchange import encode_conf_change
from eventlog.raft.peer_check import (
    BAD_ENTRY,
    MALFORMED,
    NOT_LEADER,
    NOT_MEMBER,
    SNAPSHOT_CHUNK,
    SNAPSHOT_IMAGE,
    SRC_MISMATCH,
    TERM_LIMIT,
    WRONG_DST,
    PeerCheck,
)
from eventlog.raft.runtime.entries import check_entry
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import (
    MAX_TERM,
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
    SnapshotMeta,
    TimeoutNow,
    Vote,
    VoteResp,
)
from eventlog.records import Record as LogRecord
from eventlog.records import encode_batch, encode_records
from tests.eventlog.raft.paper import ack, config, drain, elect, log_of, node, storage

STRANGER = 42     # never a member, not in the address book
NEWCOMER = 7      # in the address book (added at runtime), in no configuration the node holds yet
CHECK = PeerCheck(known_peer=lambda peer: peer == NEWCOMER)
CONF3 = ConfState(voters=(1, 2, 3))


def follower() -> RaftNode:
    """Node 1, follower of node 2 in term 2, voters (1,2,3); log 1/0, 2/1..3 (a batch), 2/4; commit 0."""
    n = node(1, storage(entries=log_of([1, (2, 3), 2]), term=2, commit=0), check_quorum=True)
    n.step(Heartbeat(term=2, src=2, dst=1, commit=0))
    drain(n)
    assert (n.role, n.leader, n.log.committed) == (Role.FOLLOWER, 2, 0)
    return n


def leader() -> RaftNode:
    """Node 1, leader of term 3 over voters (1,2,3), its no-op at 5 acknowledged by node 2."""
    n = node(1, storage(entries=log_of([1, (2, 3), 2]), term=2, commit=3))
    sent = elect(n)
    ack(n, sent, [2])
    assert n.role is Role.LEADER and n.term == 3
    return n


def append(n: RaftNode, **kw: object) -> Append:
    """An append from node 2 of term 2 after 2/4 (what its leader would send next), fields overridden."""
    fields: dict[str, object] = {"term": 2, "src": 2, "dst": n.id, "prev_index": 4, "prev_term": 2,
                                 "entries": (Entry(index=5, term=2, data=b"x"),), "commit": 4}
    fields.update(kw)
    return Append(**fields)  # type: ignore[arg-type]


def snapshot_chunk(**kw: object) -> InstallSnapshot:
    meta = SnapshotMeta(index=9, term=2, conf=CONF3, size=10)
    fields: dict[str, object] = {"term": 2, "src": 2, "dst": 1, "meta": meta, "offset": 0, "data": b"0123456789",
                                 "done": True}
    fields.update(kw)
    return InstallSnapshot(**fields)  # type: ignore[arg-type]


def conf_entry(index: int, kind: ConfChangeKind, node_id: int, term: int = 2) -> Entry:
    return Entry(index=index, term=term, kind=EntryKind.CONF_CHANGE, data=encode_conf_change(ConfChange(kind, node_id)))


Case = tuple[str, Callable[[], RaftNode], Callable[[RaftNode], Message], str | None]

CASES: list[Case] = [
    # --- what an honest peer sends passes --------------------------------------------------------
    ("append from the leader", follower, lambda n: append(n), None),
    ("heartbeat from the leader", follower, lambda n: Heartbeat(term=2, src=2, dst=1, commit=3), None),
    ("vote request of a voter in a newer term", follower,
     lambda n: Vote(term=3, src=3, dst=1, last_index=4, last_term=2), None),
    ("append of a new leader (newer term)", follower, lambda n: append(n, term=3, src=3), None),
    ("last snapshot chunk", follower, lambda n: snapshot_chunk(), None),
    ("first of two snapshot chunks", follower, lambda n: snapshot_chunk(data=b"01234", done=False), None),
    ("acknowledgement of the leader's last entry", leader, lambda n: AppendResp(term=3, src=3, dst=1, index=5), None),
    ("answer to the latest heartbeat round", leader,
     lambda n: HeartbeatResp(term=3, src=2, dst=1, ctx=n.heartbeat_round), None),
    ("a follower's read asked of the leader", leader, lambda n: ReadIndex(term=3, src=2, dst=1, ctx=7), None),
    ("the leader's answer to a follower's read", follower,
     lambda n: ReadIndexResp(term=2, src=2, dst=1, ctx=7, index=4), None),
    # --- identity --------------------------------------------------------------------------------
    ("src is not the peer", follower, lambda n: append(n, src=3), SRC_MISMATCH),   # sent by peer 2
    ("src is this node", follower, lambda n: Heartbeat(term=2, src=1, dst=1, commit=3), SRC_MISMATCH),
    ("dst is another node (issue 18: AssertionError)", follower,
     lambda n: Heartbeat(term=2, src=2, dst=9, commit=3), WRONG_DST),
    # --- terms -----------------------------------------------------------------------------------
    ("vote with term 10^12 (issue 18: the int32 epoch)", follower,
     lambda n: Vote(term=10**12, src=2, dst=1, last_index=10**12, last_term=10**12 - 1, transfer=True), TERM_LIMIT),
    ("pre-vote one above the limit", follower,
     lambda n: PreVote(term=MAX_TERM + 1, src=2, dst=1, last_index=4, last_term=2), TERM_LIMIT),
    ("entry term above the limit", follower,
     lambda n: append(n, term=MAX_TERM, entries=(Entry(index=5, term=MAX_TERM + 1),)), TERM_LIMIT),
    ("negative term", follower, lambda n: append(n, term=-1), MALFORMED),
    ("vote whose last term is not below its term", follower,
     lambda n: Vote(term=3, src=3, dst=1, last_index=4, last_term=3), MALFORMED),
    # --- fields ----------------------------------------------------------------------------------
    ("heartbeat commit below -1", follower, lambda n: Heartbeat(term=2, src=2, dst=1, commit=-5), MALFORMED),
    ("prev index below -1", follower, lambda n: append(n, prev_index=-2, prev_term=0, entries=()), MALFORMED),
    ("prev term above the append's", follower, lambda n: append(n, prev_term=3), MALFORMED),
    ("no prev entry but a prev term", follower, lambda n: append(n, prev_index=-1, prev_term=1, entries=()),
     MALFORMED),
    ("entries with a gap", follower, lambda n: append(n, entries=(Entry(index=6, term=2),)), MALFORMED),
    ("entry of a term above the append's", follower, lambda n: append(n, entries=(Entry(index=5, term=3),)),
     MALFORMED),
    ("entry terms going down", follower,
     lambda n: append(n, term=3, entries=(Entry(index=5, term=3), Entry(index=6, term=2))), MALFORMED),
    ("entry covering no index", follower, lambda n: append(n, entries=(Entry(index=5, term=2, count=0),)),
     MALFORMED),
    ("no-op covering two indexes", follower,
     lambda n: append(n, entries=(Entry(index=5, term=2, count=2, kind=EntryKind.NOOP),)), MALFORMED),
    ("configuration entry that does not decode", follower,
     lambda n: append(n, entries=(Entry(index=5, term=2, kind=EntryKind.CONF_CHANGE, data=b"\xc1"),)), MALFORMED),
    ("read answered with an index below -1", follower,
     lambda n: ReadIndexResp(term=2, src=2, dst=1, ctx=7, index=-5), MALFORMED),
    ("read request with a negative id", leader, lambda n: ReadIndex(term=3, src=2, dst=1, ctx=-1), MALFORMED),
    ("acknowledgement at a negative offset of a snapshot", leader,
     lambda n: InstallSnapshotResp(term=3, src=2, dst=1, index=9, offset=-1), MALFORMED),
    # --- snapshot chunks (issue 18: RaftError when the last chunk ends before the size) ------------
    ("last chunk ending before the size", follower, lambda n: snapshot_chunk(data=b"01234"), SNAPSHOT_CHUNK),
    ("chunk running past the size", follower, lambda n: snapshot_chunk(data=b"0123456789ab"), SNAPSHOT_CHUNK),
    ("negative offset", follower, lambda n: snapshot_chunk(offset=-3, data=b"0123456789ab"), SNAPSHOT_CHUNK),
    ("chunk reaching the size not marked last", follower, lambda n: snapshot_chunk(done=False), SNAPSHOT_CHUNK),
    ("empty chunk not marked last", follower, lambda n: snapshot_chunk(data=b"", done=False), SNAPSHOT_CHUNK),
    ("snapshot of a later term than the message", follower,
     lambda n: snapshot_chunk(meta=SnapshotMeta(index=9, term=3, conf=CONF3, size=10)), MALFORMED),
    ("snapshot whose membership has no voter", follower,
     lambda n: snapshot_chunk(meta=SnapshotMeta(index=9, term=2, conf=ConfState(), size=10)), SNAPSHOT_CHUNK),
    # --- membership --------------------------------------------------------------------------------
    ("append from a stranger (issue 18: applied)", follower,
     lambda n: append(n, term=3, src=STRANGER), NOT_MEMBER),
    ("heartbeat from a stranger", follower, lambda n: Heartbeat(term=3, src=STRANGER, dst=1, commit=4), NOT_MEMBER),
    ("vote request from a stranger", follower,
     lambda n: Vote(term=3, src=STRANGER, dst=1, last_index=9, last_term=2, transfer=True), NOT_MEMBER),
    ("response from a stranger", leader, lambda n: AppendResp(term=4, src=STRANGER, dst=1, index=-1, reject=True),
     NOT_MEMBER),
    ("vote request from a member added after this log ends", follower,
     lambda n: Vote(term=3, src=NEWCOMER, dst=1, last_index=9, last_term=2), None),
    ("append from a leader added after this log ends", follower, lambda n: append(n, term=3, src=NEWCOMER), None),
    # --- leadership --------------------------------------------------------------------------------
    ("append from another node in the leader's term", follower, lambda n: append(n, src=3), NOT_LEADER),
    ("timeout-now from another node than the leader", follower, lambda n: TimeoutNow(term=2, src=3, dst=1),
     NOT_LEADER),
    ("read answer from another node than the leader", follower,
     lambda n: ReadIndexResp(term=2, src=3, dst=1, ctx=7, index=4), NOT_LEADER),
    ("read request from a stranger", leader, lambda n: ReadIndex(term=3, src=STRANGER, dst=1, ctx=7), NOT_MEMBER),
    ("append to the leader in its own term", leader, lambda n: append(n, term=3, prev_index=5, prev_term=3,
                                                                  entries=()), NOT_LEADER),
    ("acknowledgement beyond the leader's log", leader, lambda n: AppendResp(term=3, src=2, dst=1, index=50),
     MALFORMED),
    ("acknowledgement inside an entry (a commit inside one)", leader,
     lambda n: AppendResp(term=3, src=2, dst=1, index=2), MALFORMED),
    ("answer to a heartbeat round not started", leader,
     lambda n: HeartbeatResp(term=3, src=2, dst=1, ctx=n.heartbeat_round + 5), MALFORMED),
    # --- against the log ---------------------------------------------------------------------------
    ("append after an index inside an entry", follower,
     lambda n: append(n, prev_index=2, prev_term=2, entries=(Entry(index=3, term=2),)), BAD_ENTRY),
    ("entry held with other boundaries (same term)", follower,
     lambda n: append(n, prev_index=0, prev_term=1, entries=(Entry(index=1, term=2, count=2),)), BAD_ENTRY),
    ("removal of a node that is not a member", follower,
     lambda n: append(n, entries=(conf_entry(5, ConfChangeKind.REMOVE, 9),)), BAD_ENTRY),
    ("a second add of the same learner", follower,
     lambda n: append(n, entries=(conf_entry(5, ConfChangeKind.ADD_LEARNER, 4),
                                  conf_entry(6, ConfChangeKind.ADD_LEARNER, 4))), BAD_ENTRY),
    ("heartbeat committing inside an entry", follower, lambda n: Heartbeat(term=2, src=2, dst=1, commit=2),
     BAD_ENTRY),
    ("append committing inside an entry", follower,
     lambda n: append(n, prev_index=0, prev_term=1, entries=(Entry(index=1, term=2, count=3),), commit=2), BAD_ENTRY),
    ("append committing inside an entry it sends", follower,
     lambda n: append(n, entries=(Entry(index=5, term=2, count=3),), commit=6), BAD_ENTRY),
    ("snapshot at an index inside an entry held", follower,
     lambda n: snapshot_chunk(meta=SnapshotMeta(index=2, term=2, conf=CONF3, size=10)), BAD_ENTRY),
    ("an add then a removal, in order", follower,
     lambda n: append(n, entries=(conf_entry(5, ConfChangeKind.ADD_LEARNER, 4),
                                  conf_entry(6, ConfChangeKind.REMOVE, 4))), None),
]


@pytest.mark.parametrize(("make", "message", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check(make: Callable[[], RaftNode], message: Callable[[RaftNode], Message], reason: str | None) -> None:
    n = make()
    m = message(n)
    peer = m.src if reason != SRC_MISMATCH or m.src == n.id else 2
    drop = CHECK.check(n, peer, m)
    assert (drop and drop.reason) == reason, drop
    if drop is None:
        n.step(m)   # what passes, the core takes
        drain(n)


CORE_FAILS = [
    ("dst is another node", lambda n: Heartbeat(term=2, src=2, dst=9, commit=3), AssertionError),
    ("last chunk ending before the size", lambda n: snapshot_chunk(data=b"01234"), RaftError),
    ("append after an index inside an entry",
     lambda n: append(n, prev_index=2, prev_term=2, entries=(Entry(index=3, term=2),)), AssertionError),
    ("entry held with other boundaries", lambda n: append(n, prev_index=0, prev_term=1,
                                                          entries=(Entry(index=1, term=2, count=2),)), AssertionError),
    ("removal of a node that is not a member",
     lambda n: append(n, entries=(conf_entry(5, ConfChangeKind.REMOVE, 9),)), RaftError),
    ("entries with a gap", lambda n: append(n, entries=(Entry(index=6, term=2),)), AssertionError),
    ("heartbeat committing inside an entry", lambda n: Heartbeat(term=2, src=2, dst=1, commit=2), AssertionError),
    ("snapshot at an index inside an entry held",
     lambda n: snapshot_chunk(meta=SnapshotMeta(index=2, term=2, conf=CONF3, size=10)), AssertionError),
]


@pytest.mark.parametrize(("message", "error"), [c[1:] for c in CORE_FAILS], ids=[c[0] for c in CORE_FAILS])
def test_the_core_fails_on_what_the_check_drops(message: Callable[[RaftNode], Message],
                                                 error: type[BaseException]) -> None:
    n = follower()
    m = message(n)
    assert CHECK.check(n, m.src, m) is not None
    with pytest.raises(error):
        n.step(m)
        drain(n)


def test_a_forged_acknowledgement_inside_an_entry_stops_the_leader() -> None:
    """A match inside an entry is a next index inside one (and a commit index inside one): the leader
    asserts. The leader-side check drops it first."""
    n = leader()
    m = AppendResp(term=3, src=3, dst=1, index=2)
    assert CHECK.check(n, 3, m) is not None
    with pytest.raises(AssertionError):
        n.step(m)
        drain(n)


# --- membership changes in flight, removed and joining nodes ---------------------------------------

def test_a_voter_whose_removal_is_in_flight_may_still_campaign() -> None:
    """Thesis §4.2.2: a leader that appended its own removal may have to win again before it commits;
    once the removal is committed here, its vote requests are dropped (§4.2.3: no disruption)."""
    n = follower()
    n.step(append(n, entries=(conf_entry(5, ConfChangeKind.REMOVE, 3),), commit=4))
    drain(n)
    assert n.conf.voters == (1, 2) and n.log.committed == 4
    vote = Vote(term=3, src=3, dst=1, last_index=5, last_term=2)
    assert CHECK.check(n, 3, vote) is None, "the removal is not committed: 3 may be needed to commit it"
    n.step(Heartbeat(term=2, src=2, dst=1, commit=5))
    drain(n)
    for m in (vote, append(n, term=3, src=3, prev_index=5, entries=()), VoteResp(term=2, src=3, dst=1, granted=True)):
        drop = CHECK.check(n, 3, m)
        assert drop is not None and drop.reason == NOT_MEMBER, m


def test_a_learner_may_lead_when_this_node_lags() -> None:
    """A learner here may have been promoted by entries this node has not received, and then elected:
    its vote requests and a leader's messages are taken (the simulator found a follower that dropped
    its new leader's appends for good when they were not)."""
    n = follower()
    n.step(append(n, entries=(conf_entry(5, ConfChangeKind.ADD_LEARNER, 4),), commit=5))
    drain(n)
    assert n.conf.learners == (4,)
    assert CHECK.check(n, 4, PreVote(term=3, src=4, dst=1, last_index=7, last_term=2)) is None
    assert CHECK.check(n, 4, append(n, term=3, src=4, prev_index=5, entries=())) is None
    assert CHECK.check(n, 4, VoteResp(term=2, src=4, dst=1, granted=False)) is None


def test_a_node_not_in_its_own_configuration_takes_any_leader() -> None:
    """A node being added starts from a configuration without itself and cannot know its leader (the
    cluster may have replaced every configured member since): it takes a leader's messages from any
    peer the transport admitted; vote requests still need a member."""
    n = node(4, storage(voters=(1, 2, 3)))
    assert CHECK.check(n, STRANGER, Append(term=5, src=STRANGER, dst=4, prev_index=-1, prev_term=0, entries=(),
                                           commit=-1)) is None
    drop = CHECK.check(n, STRANGER, Vote(term=5, src=STRANGER, dst=4, last_index=-1, last_term=0))
    assert drop is not None and drop.reason == NOT_MEMBER


def test_a_removed_member_is_not_taken_for_a_newcomer() -> None:
    """The address book may still list a removed member for a while: a configuration this node holds
    lists it, so it is not someone this node has not heard of."""
    n = follower()
    n.step(append(n, entries=(conf_entry(5, ConfChangeKind.REMOVE, 3),), commit=5))
    drain(n)
    check = PeerCheck(known_peer=lambda peer: True)
    drop = check.check(n, 3, Vote(term=3, src=3, dst=1, last_index=5, last_term=2))
    assert drop is not None and drop.reason == NOT_MEMBER


def test_entry_data_is_checked_by_the_hook() -> None:
    n = follower()
    check = PeerCheck(known_peer=lambda peer: False, check_entry=lambda e: "no" if e.data == b"bad" else None)
    assert check.check(n, 2, append(n)) is None
    drop = check.check(n, 2, append(n, entries=(Entry(index=5, term=2, data=b"bad"),)))
    assert drop is not None and drop.reason == BAD_ENTRY


# --- the runtime's entry check: the record batch of a NORMAL entry --------------------------------

def _batch(count: int = 2) -> bytes:
    return encode_batch([(b"k%d" % i, b"v") for i in range(count)], timestamp_ms=1)


def test_runtime_entry_check() -> None:
    ok = Entry(index=5, term=2, count=2, data=_batch())
    assert check_entry(ok, 1 << 20) is None
    assert "covers 3 indexes" in (check_entry(Entry(index=5, term=2, count=3, data=_batch()), 1 << 20) or "")
    assert "not a record batch" in (check_entry(Entry(index=5, term=2, data=b"garbage"), 1 << 20) or "")
    flipped = bytearray(_batch())
    flipped[-1] ^= 1
    assert "CRC" in (check_entry(Entry(index=5, term=2, count=2, data=bytes(flipped)), 1 << 20) or "")
    assert "follow" in (check_entry(Entry(index=5, term=2, count=2, data=_batch() + b"x"), 1 << 20) or "")
    assert "exceeds" in (check_entry(ok, 64) or "")
    control = encode_records([LogRecord(0, -1, b"__raft/noop", b"")], control=True)
    assert "control" in (check_entry(Entry(index=5, term=2, data=bytes(control)), 1 << 20) or "")
    assert check_entry(Entry(index=5, term=2, kind=EntryKind.NOOP), 1) is None   # stored from its fields


# --- what passes the check never breaks the core ---------------------------------------------------

def _random_message(rng: random.Random, n: RaftNode, batches: bool = False) -> Message:
    """A message from member 2 or 3 with fields near the node's own state, often inconsistent. With
    `batches`, NORMAL entries hold record batches (as the node runtime stores them)."""
    src = rng.choice((2, 3))
    last = n.log.last_index()

    def term() -> int:
        return max(0, n.term + rng.randint(-1, 2))

    def index() -> int:
        return rng.randint(-3, last + 3)

    def term_at(i: int) -> int:
        """Mostly the term this node's log has at `i` (so the message matches it), else any."""
        held = n.log.term(i) if i >= -1 else None
        return held if held is not None and rng.random() < 0.7 else term()

    kind = rng.randrange(11)
    if kind == 0:
        return Vote(term=term(), src=src, dst=1, last_index=index(), last_term=term(), transfer=rng.random() < 0.3)
    if kind == 1:
        return PreVote(term=term(), src=src, dst=1, last_index=index(), last_term=term())
    if kind == 2:
        return VoteResp(term=term(), src=src, dst=1, granted=rng.random() < 0.5)
    if kind == 3:
        return PreVoteResp(term=term(), src=src, dst=1, granted=rng.random() < 0.5)
    if kind in (4, 5):
        prev = index()
        entries = []
        at, t = prev + 1 + rng.choice((0, 0, 0, 1, -1)), term()
        for _ in range(rng.randrange(4)):
            ek = rng.choice(list(EntryKind))
            data = b""
            if ek is EntryKind.CONF_CHANGE:
                data = encode_conf_change(ConfChange(rng.choice(list(ConfChangeKind)), rng.randint(1, 5)))
            count = rng.choice((1, 1, 2, 3)) if ek is EntryKind.NORMAL else rng.choice((1, 1, 1, 2))
            if ek is EntryKind.NORMAL and batches:
                data = _batch(rng.choice((count, count, count, count + 1)))   # a batch, mostly of `count` records
            entries.append(Entry(index=at, term=t, count=count, kind=ek, data=data))
            at, t = at + count, t + rng.choice((0, 0, 1))
        return Append(term=term(), src=src, dst=1, prev_index=prev, prev_term=term_at(prev), entries=tuple(entries),
                      commit=index())
    if kind == 6:
        return AppendResp(term=term(), src=src, dst=1, index=index(), reject=rng.random() < 0.4,
                          hint_index=index(), hint_term=term())
    if kind == 7:
        return Heartbeat(term=term(), src=src, dst=1, commit=index(), ctx=rng.randint(0, 5))
    if kind == 8:
        return HeartbeatResp(term=term(), src=src, dst=1, ctx=rng.randint(0, n.heartbeat_round + 2))
    if kind == 9:
        size = rng.randint(0, 12)
        offset = rng.choice((0, 0, rng.randint(-1, 12)))
        data = b"s" * rng.randint(0, 12)
        at = index()
        meta = SnapshotMeta(index=at, term=term_at(at), conf=rng.choice((CONF3, ConfState(voters=(1, 2)))), size=size)
        return InstallSnapshot(term=term(), src=src, dst=1, meta=meta, offset=offset, data=data,
                               done=rng.random() < 0.5 or offset + len(data) == size)
    return TimeoutNow(term=term(), src=src, dst=1)


RUNS = int(os.environ.get("EPOCHLOG_PEER_FUZZ_RUNS", "100"))


def candidate() -> RaftNode:
    n = follower()
    for _ in range(40):
        n.tick()
    drain(n)
    assert n.role is not Role.FOLLOWER
    return n


def joining() -> RaftNode:
    """Node 1 being added: a configuration (2,3) without itself, an empty log."""
    return node(1, storage(voters=(2, 3)))


STARTS: dict[str, Callable[[], RaftNode]] = {"follower": follower, "leader": leader, "candidate": candidate,
                                             "joining": joining}


@pytest.mark.parametrize("start", sorted(STARTS))
def test_what_the_check_lets_through_never_stops_the_core(start: str) -> None:
    """Random messages from members, near the node's state and often inconsistent: whatever passes
    the check, the core steps and its Readys are handled without an assertion or an error (a broken
    invariant there would be a peer input that stops a node)."""
    seed = int(os.environ.get("EPOCHLOG_PEER_FUZZ_SEED") or random.SystemRandom().getrandbits(32))
    print(f"seed={seed} (replay with EPOCHLOG_PEER_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    passed = 0
    for run in range(RUNS):
        n = STARTS[start]()
        for step in range(60):
            m = _random_message(rng, n)
            if CHECK.check(n, m.src, m) is not None:
                continue
            passed += 1
            try:
                n.step(m)
                drain(n)
                if step % 7 == 0:
                    n.tick()
                    drain(n)
            except Exception as exc:
                raise AssertionError(f"seed {seed}, run {run}, step {step}: {m!r} broke {n!r}: {exc!r}") from exc
    assert passed > 1000


# --- the same over the runtime's storage: the segmented log, the quorum state, snapshot files --------

def _handle_on_disk(n: RaftNode) -> None:
    """Handle every Ready of `n` as the runtime does, over its LogStorage (no state machine)."""
    st = n.log.storage
    assert isinstance(st, LogStorage)
    while n.has_ready():
        rd = n.ready()
        for c in rd.snapshot_chunks:
            st.stage_snapshot_chunk(c.meta, c.offset, c.data)
        if rd.snapshot is not None:
            st.install_snapshot(rd.snapshot)
        if rd.entries:
            st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        n.advance()


def _on_disk(path: Path, leading: bool) -> RaftNode:
    """Node 1 over a LogStorage in `path`: follower of node 2 in term 2 holding 1/0, 2/1..3, 2/4 (commit
    0), or, `leading`, the leader of term 3 over that log."""
    st = LogStorage.open(path, LogConfig(segment_bytes=4096, flush_policy="fsync"), CONF3)
    n = RaftNode(1, st, config(check_quorum=True), random.Random(1))
    entries = (Entry(0, 1, data=_batch(1)), Entry(1, 2, count=3, data=_batch(3)), Entry(4, 2, data=_batch(1)))
    n.step(Append(term=2, src=2, dst=1, prev_index=-1, prev_term=0, entries=entries, commit=0))
    _handle_on_disk(n)
    if leading:
        for _ in range(40):
            n.tick()
        _handle_on_disk(n)
        n.step(VoteResp(term=n.term, src=2, dst=1, granted=True))
        _handle_on_disk(n)
        assert n.role is Role.LEADER, n
    return n


def _runtime_check(n: RaftNode) -> PeerCheck:
    """The checks the node runtime gives a group (eventlog/raft/runtime/host.py), over `n`'s storage."""
    st = n.log.storage
    assert isinstance(st, LogStorage)
    return PeerCheck(known_peer=lambda peer: False, check_entry=functools.partial(check_entry, max_batch_bytes=1 << 20),
                     check_snapshot_chunk=st.snapshot_chunk_refusal)


STORAGE_FUZZ_REGRESSIONS = [
    2161726479,   # run 17: the leader's last chunk b"ss" of a 2-byte snapshot, no image: the group stopped
    2687708661,   # run 5: the same with b"sssss" (CI, as the leader of a later term)
    3410291864,
]


@pytest.mark.parametrize("fixed_seed", [None, *STORAGE_FUZZ_REGRESSIONS],
                         ids=["random", *(f"seed-{s}" for s in STORAGE_FUZZ_REGRESSIONS)])
@pytest.mark.parametrize("leading", [False, True], ids=["follower", "leader"])
def test_what_the_check_lets_through_never_stops_the_runtime_storage(tmp_path: Path, leading: bool,
                                                                     fixed_seed: int | None) -> None:
    """As above, with the runtime's own checks and storage: a message that passes never makes the
    segmented log, the quorum state or the snapshot files refuse what the core hands them."""
    seed = fixed_seed or int(os.environ.get("EPOCHLOG_PEER_FUZZ_SEED") or random.SystemRandom().getrandbits(32))
    print(f"seed={seed} (replay with EPOCHLOG_PEER_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    passed = 0
    for run in range(max(1, RUNS // 5)):
        n = _on_disk(tmp_path / f"run-{run}", leading)
        check = _runtime_check(n)
        for step in range(60):
            m = _random_message(rng, n, batches=True)
            if check.check(n, m.src, m) is not None:
                continue
            passed += 1
            try:
                n.step(m)
                _handle_on_disk(n)
                if step % 7 == 0:
                    n.tick()
                    _handle_on_disk(n)
            except Exception as exc:
                raise AssertionError(f"seed {seed}, run {run}, step {step}: {m!r} broke {n!r}: {exc!r}") from exc
        n.log.storage.close()   # type: ignore[attr-defined]
    assert passed > 100


def test_a_chunk_the_storage_cannot_stage_is_dropped_before_the_core_takes_it(tmp_path: Path) -> None:
    """Issue 18 (storage fuzz seed 2161726479): the leader's only chunk of a 2-byte snapshot, b"ss", is
    consistent as a message but no snapshot image. The core takes it and restores the snapshot; the
    storage then refuses to stage it, which stopped the group. The check asks the storage first."""
    n = _on_disk(tmp_path / "node", leading=False)
    st = n.log.storage
    assert isinstance(st, LogStorage)
    check = _runtime_check(n)
    meta = SnapshotMeta(index=7, term=3, conf=CONF3, size=2)
    garbage = InstallSnapshot(term=3, src=2, dst=1, meta=meta, offset=0, data=b"ss", done=True)
    assert CHECK.check(n, 2, garbage) is None, "the message alone is consistent"
    drop = check.check(n, 2, garbage)
    assert drop is not None and drop.reason == SNAPSHOT_IMAGE and "2 bytes" in drop.detail, drop
    # Chunks the core answers itself stage nothing, so the storage is not asked: a chunk that does not
    # continue a staged image (the core asks for offset 0) and one of a snapshot the log holds.
    later = InstallSnapshot(term=3, src=2, dst=1, meta=SnapshotMeta(index=7, term=3, conf=CONF3, size=9),
                            offset=4, data=b"ss", done=False)
    assert check.check(n, 2, later) is None
    held = InstallSnapshot(term=3, src=2, dst=1, meta=SnapshotMeta(index=4, term=2, conf=CONF3, size=2),
                           offset=0, data=b"ss", done=True)
    assert check.check(n, 2, held) is None
    for m in (later, held):
        n.step(m)
        _handle_on_disk(n)
    assert n.log.storage.snapshot().index == -1 and n.log.committed == 4
    # Without the storage's word the core takes the garbage, and the storage refuses what it restored.
    n.step(garbage)
    with pytest.raises(LogCorruptionError, match="2 of 2 bytes"):
        _handle_on_disk(n)
    st.close()
