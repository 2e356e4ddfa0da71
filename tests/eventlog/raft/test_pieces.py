"""Unit tests of the core's smaller pieces: RaftLog, Progress and quorum arithmetic, confchange."""

from __future__ import annotations

import random

import pytest

from eventlog.raft import CompactedError, ConfChange, ConfChangeError, ConfChangeKind, ConfState, Entry
from eventlog.raft.confchange import apply_conf_change, decode_conf_change, encode_conf_change
from eventlog.raft.node import RaftNode, Ready
from eventlog.raft.persist_queue import PersistQueue
from eventlog.raft.progress import Progress, ProgressState, committed_index, majority, vote_result
from eventlog.raft.raft_log import RaftLog
from eventlog.raft.types import Append, AppendResp, HardState, Heartbeat, SnapshotMeta, Vote, VoteResp
from tests.eventlog.raft.paper import ack, config, drain, elect, handle, log_of, node, of, storage

# --- RaftLog -------------------------------------------------------------------------------------


def _log(spec: list[int | tuple[int, int]], unstable: list[int | tuple[int, int]] | None = None,
         commit: int = -1) -> RaftLog:
    """A RaftLog whose storage holds `spec` (durable) followed by `unstable` entries."""
    unstable = unstable or []
    entries = log_of([*spec, *unstable])
    n_stable = len(spec)
    log = RaftLog(storage(entries=entries[:n_stable]), committed=commit, applied=-1)
    log.append(entries[n_stable:])
    return log


def test_raft_log_terms_and_bounds_across_stable_and_unstable() -> None:
    log = _log([1, (1, 3)], unstable=[(2, 2), 3])
    assert (log.first_index(), log.last_index(), log.stable_last_index()) == (0, 6, 3)
    assert [log.term(i) for i in range(-1, 8)] == [0, 1, 1, 1, 1, 2, 2, 3, None]
    assert log.entry_bounds(2) == (1, 3) and log.entry_bounds(5) == (4, 5)
    assert [e.index for e in log.entries(1, 7, 1 << 20)] == [1, 4, 6]
    assert [e.index for e in log.entries(0, 7, 1)] == [0], "max_bytes still returns one entry"


def test_raft_log_is_up_to_date() -> None:
    log = _log([1, 2, 2])
    assert log.is_up_to_date(2, 2) and log.is_up_to_date(9, 2) and log.is_up_to_date(0, 3)
    assert not log.is_up_to_date(1, 2) and not log.is_up_to_date(99, 1)


def test_raft_log_find_conflict() -> None:
    log = _log([1, (1, 2), 2])
    assert log.find_conflict(log_of([1, (1, 2), 2])) is None
    assert log.find_conflict([Entry(index=3, term=3), Entry(index=4, term=3)]) == 0
    assert log.find_conflict([Entry(index=3, term=2), Entry(index=4, term=2)]) == 1   # new entry
    with pytest.raises(AssertionError):
        log.find_conflict([Entry(index=1, term=1)])   # same term, other batch bounds: impossible


def test_raft_log_append_replaces_suffix_in_unstable_and_stable_parts() -> None:
    log = _log([1, 1, 1], unstable=[1, 1])
    log.append([Entry(index=4, term=2)])
    assert [(e.index, e.term) for e in log.unstable] == [(3, 1), (4, 2)]
    log.append([Entry(index=1, term=3)])            # reaches into the durable part
    assert log.unstable_offset == 1 and [(e.index, e.term) for e in log.unstable] == [(1, 3)]
    assert log.last_index() == 1 and log.term(0) == 1
    with pytest.raises(AssertionError):
        log.append([Entry(index=5, term=3)])         # a gap


def test_raft_log_never_truncates_committed_entries() -> None:
    log = _log([1, 1, 1], commit=1)
    with pytest.raises(AssertionError):
        log.append([Entry(index=1, term=2)])


def test_raft_log_stable_to_ignores_replaced_entries() -> None:
    log = _log([1], unstable=[1, 1])
    log.append([Entry(index=2, term=2)])             # the Ready that carried 1/2 is now stale
    log.stable_to(2, 1)
    assert log.unstable_offset == 1
    log.stable_to(2, 2)
    assert log.unstable_offset == 3 and log.unstable == []


def test_raft_log_next_committed_only_durable_entries() -> None:
    log = _log([1, 1], unstable=[1])
    log.commit_to(2)
    assert [e.index for e in log.next_committed(1 << 20)] == [0, 1]
    log.applied_to(1)
    assert log.next_committed(1 << 20) == []
    log.storage.append(log.unstable)  # type: ignore[attr-defined]  # the app persists the Ready...
    log.stable_to(2, 1)               # ...and advance() says so
    assert [e.index for e in log.next_committed(1 << 20)] == [2]


def test_raft_log_commit_never_goes_back_or_beyond_last() -> None:
    log = _log([1, 1, 1])
    log.commit_to(2)
    log.commit_to(1)
    assert log.committed == 2
    with pytest.raises(AssertionError):
        log.commit_to(5)


@pytest.mark.parametrize(("spec", "index", "max_term", "want"), [
    ([1, 1, 2, 2, 3], 4, 3, 4),
    ([1, 1, 2, 2, 3], 4, 2, 3),
    ([1, 1, 2, 2, 3], 9, 1, 1),
    ([1, (2, 3), 3], 3, 9, 3),          # 3 ends the batch 2/1..3
    ([1, (2, 3), 3], 2, 9, 0),          # 2 is inside a batch: the boundary below it
    ([5, 5], 1, 4, -1),                 # nothing: "before the log"
])
def test_raft_log_last_boundary_at_or_below(spec: list[int | tuple[int, int]], index: int, max_term: int,
                                            want: int) -> None:
    """Fast backtracking (§5.3): the largest entry end <= index whose term is <= max_term."""
    log = _log(spec)
    assert log.last_boundary_at_or_below(index, max_term) == want


def test_raft_log_last_boundary_below_snapshot_asks_for_snapshot() -> None:
    st = storage(entries=log_of([1, 1, 2, 2]))
    st.create_snapshot(1, ConfState(voters=(1,)), b"s")
    log = RaftLog(st, committed=3, applied=1)
    assert log.last_boundary_at_or_below(3, 1) == 1
    assert log.last_boundary_at_or_below(3, 0) == 0, "snapshot index - 1: only a snapshot will do"
    with pytest.raises(CompactedError):
        log.entries(1, 3, 1 << 20)


def test_raft_log_restore_snapshot() -> None:
    log = _log([1, 1], unstable=[1])
    meta = SnapshotMeta(index=9, term=3, conf=ConfState(voters=(1,)), size=0)
    log.restore(meta)
    assert (log.first_index(), log.last_index(), log.committed, log.term(9), log.term(5)) == (10, 9, 9, 3, None)
    assert log.next_committed(1 << 20) == []
    log.snapshot_installed(9)
    assert log.applied == 9


# --- Progress and quorums ------------------------------------------------------------------------


def test_progress_probe_sends_one_at_a_time() -> None:
    pr = Progress(next_index=5, tick=0)
    assert pr.state is ProgressState.PROBE and not pr.is_paused(4, 1 << 20)
    pr.sent(7, 100)
    assert pr.is_paused(4, 1 << 20) and pr.next == 5, "a probe does not move next"
    assert pr.maybe_update(7, tick=3) and pr.match == 7 and pr.next == 8 and not pr.is_paused(4, 1 << 20)


def test_progress_replicate_window_by_count_and_bytes() -> None:
    pr = Progress(next_index=1, tick=0)
    pr.maybe_update(0, tick=0)
    pr.become_replicate()
    for last in (1, 2):
        pr.sent(last, 10)
    assert pr.next == 3 and pr.is_paused(2, 1 << 20) and not pr.is_paused(3, 1 << 20)
    assert pr.is_paused(9, 20) and not pr.is_paused(9, 21)
    pr.maybe_update(1, tick=1)
    assert len(pr.inflight) == 1 and pr.inflight_bytes == 10 and not pr.is_paused(2, 1 << 20)
    pr.maybe_update(2, tick=2)
    assert len(pr.inflight) == 0 and pr.inflight_bytes == 0


def test_progress_snapshot_pauses_and_probe_resets() -> None:
    pr = Progress(next_index=1, tick=0)
    pr.become_snapshot(SnapshotMeta(index=9, term=2), tick=4)
    assert pr.state is ProgressState.SNAPSHOT and pr.is_paused(100, 1 << 30)
    pr.become_probe(tick=8)
    assert (pr.state, pr.next, pr.snapshot, pr.last_progress_tick) == (ProgressState.PROBE, 0, None, 8)


def test_progress_stale_ack_is_no_news() -> None:
    pr = Progress(next_index=1, tick=0)
    assert pr.maybe_update(5, tick=1)
    assert not pr.maybe_update(3, tick=2) and pr.match == 5 and pr.last_progress_tick == 1


@pytest.mark.parametrize(("voters", "need"), [((1,), 1), ((1, 2), 2), ((1, 2, 3), 2), ((1, 2, 3, 4), 3),
                                               ((1, 2, 3, 4, 5), 3)])
def test_majority(voters: tuple[int, ...], need: int) -> None:
    assert majority(voters) == need


def test_committed_index_counts_voters_only() -> None:
    conf = ConfState(voters=(1, 2, 3), learners=(4,))
    assert committed_index(conf, {1: 9, 2: 5, 3: 1, 4: 100}) == 5
    assert committed_index(conf, {1: 9, 4: 100}) == -1
    assert committed_index(ConfState(voters=(1, 2, 3, 4)), {1: 9, 2: 8, 3: 2, 4: 1}) == 2
    assert committed_index(ConfState(), {1: 3}) == -1


def test_vote_result() -> None:
    conf = ConfState(voters=(1, 2, 3, 4, 5), learners=(6,))
    assert vote_result(conf, {1: True, 2: True}) is None
    assert vote_result(conf, {1: True, 2: True, 6: True}) is None, "a learner's vote does not count"
    assert vote_result(conf, {1: True, 2: True, 3: True}) is True
    assert vote_result(conf, {1: True, 2: False, 3: False}) is None
    assert vote_result(conf, {1: True, 2: False, 3: False, 4: False}) is False


# --- confchange ----------------------------------------------------------------------------------

_BASE = ConfState(voters=(1, 2, 3), learners=(4,), auto_promote=(4,))


@pytest.mark.parametrize(("kind", "node", "auto", "want"), [
    (ConfChangeKind.ADD_VOTER, 5, False, ConfState(voters=(1, 2, 3, 5), learners=(4,), auto_promote=(4,))),
    (ConfChangeKind.ADD_LEARNER, 5, True, ConfState(voters=(1, 2, 3), learners=(4, 5), auto_promote=(4, 5))),
    (ConfChangeKind.ADD_LEARNER, 5, False, ConfState(voters=(1, 2, 3), learners=(4, 5), auto_promote=(4,))),
    (ConfChangeKind.PROMOTE, 4, False, ConfState(voters=(1, 2, 3, 4))),
    (ConfChangeKind.REMOVE, 2, False, ConfState(voters=(1, 3), learners=(4,), auto_promote=(4,))),
    (ConfChangeKind.REMOVE, 4, False, ConfState(voters=(1, 2, 3))),
])
def test_apply_conf_change(kind: ConfChangeKind, node: int, auto: bool, want: ConfState) -> None:
    assert apply_conf_change(_BASE, ConfChange(kind, node, auto_promote=auto)) == want


@pytest.mark.parametrize(("conf", "kind", "node"), [
    (_BASE, ConfChangeKind.ADD_VOTER, 2),
    (_BASE, ConfChangeKind.ADD_VOTER, 4),          # a learner: promote it instead
    (_BASE, ConfChangeKind.ADD_LEARNER, 3),
    (_BASE, ConfChangeKind.PROMOTE, 2),
    (_BASE, ConfChangeKind.REMOVE, 9),
    (ConfState(voters=(1,)), ConfChangeKind.REMOVE, 1),   # the last voter
    (_BASE, ConfChangeKind.ADD_VOTER, 0),
])
def test_apply_conf_change_rejects(conf: ConfState, kind: ConfChangeKind, node: int) -> None:
    with pytest.raises(ConfChangeError):
        apply_conf_change(conf, ConfChange(kind, node))


def test_conf_change_encoding_round_trips() -> None:
    for cc in (ConfChange(ConfChangeKind.ADD_LEARNER, 7, auto_promote=True), ConfChange(ConfChangeKind.REMOVE, 1)):
        assert decode_conf_change(encode_conf_change(cc)) == cc


def test_single_server_changes_keep_majorities_overlapping() -> None:
    """Thesis §4.1: "When adding a single server to a cluster or removing a single server from a
    cluster, any majority of the old cluster overlaps with any majority of the new cluster"."""
    from itertools import combinations
    conf = ConfState(voters=(1, 2, 3, 4))
    for cc in (ConfChange(ConfChangeKind.ADD_VOTER, 5), ConfChange(ConfChangeKind.REMOVE, 4)):
        new = apply_conf_change(conf, cc)
        for old_q in combinations(conf.voters, majority(conf.voters)):
            for new_q in combinations(new.voters, majority(new.voters)):
                assert set(old_q) & set(new_q), (old_q, new_q)


# --- PersistQueue (pipelined acknowledgements) ----------------------------------------------------

def _ready(*entries: Entry, tag: str = "") -> Ready:
    """A Ready that wrote `entries` and holds one acknowledgement (tagged, to tell Readys apart)."""
    ack = AppendResp(term=len(tag) + 1, src=1, dst=2, index=entries[-1].last_index if entries else -1)
    return Ready(hard_state=None, entries=tuple(entries), snapshot_chunks=(), snapshot=None, send_now=(),
                 send_after=(ack,), committed=(), read_states=(), dropped_reads=(), soft_state=None,
                 must_sync=bool(entries))


def test_persist_queue_releases_in_order_as_the_durable_end_passes() -> None:
    q = PersistQueue()
    a, b, c = _ready(Entry(index=0, term=1)), _ready(), _ready(Entry(index=1, term=1, count=3))
    for rd in (a, b, c):
        q.push(rd)
    assert q.pop_durable(0) == [] and q.oldest_wait() == 0
    assert q.pop_durable(1) == [a, b], "a Ready without entries goes with the one before it"
    assert q.pop_durable(3) == [] and q.oldest_wait() == 3
    assert q.pop_durable(4) == [c] and len(q) == 0 and q.oldest_wait() is None


def test_persist_queue_after_a_truncation_waits_only_for_what_is_left() -> None:
    """Issue 11: a stale leader wrote 2..4, a new leader's entry at 2 replaced them. The log's durable
    end falls back to 2 and reaches 3 once the new entry is synced: the old Ready must not wait for 4
    (the log might never get there: nothing else is acknowledged meanwhile)."""
    q = PersistQueue()
    old = _ready(Entry(index=2, term=1, count=3), tag="old")
    q.push(old)
    q.discard_from(2)                         # the next Ready's entries start at 2
    new = _ready(Entry(index=2, term=2))
    q.push(new)
    assert q.oldest_wait() == 1
    assert q.pop_durable(2) == [old], "indexes 0..1 were durable before the truncation"
    assert q.pop_durable(2) == [] and q.pop_durable(3) == [new]


def test_persist_queue_discard_leaves_lower_waits_and_later_pushes_alone() -> None:
    q = PersistQueue()
    low, high = _ready(Entry(index=0, term=1)), _ready(Entry(index=5, term=1, count=2))
    q.push(low)
    q.push(high)
    q.discard_from(9)                         # nothing held waits for 9 or more: no change
    assert q.oldest_wait() == 0
    q.discard_from(6)                         # a snapshot installed at 5, or a truncation at 6
    q.push(_ready(Entry(index=6, term=2)))
    assert q.pop_durable(1) == [low] and q.oldest_wait() == 5
    q.discard_from(3)
    assert q.oldest_wait() == 2 and [len(q.pop_durable(3)), len(q)] == [2, 0]


def test_a_node_restarted_with_a_hole_and_a_vote_floor() -> None:
    """Killed after dropping damaged entries (RaftNode.drop_entries) and before they came back: its
    storage holds 0..4, its state machine applied 9, its hard state keeps the floor. It starts (the hole
    is allowed only with a floor), keeps its commit, refuses to campaign and to vote for a candidate
    below the floor, acknowledges only what it holds, and the floor goes once the entries are back."""
    entries = log_of([1] * 10)
    st = storage(entries=entries[:5])
    st.set_hard_state(HardState(term=1, vote=1, commit=9, floor_index=9, floor_term=1))
    n = RaftNode(2, st, config(check_quorum=False), random.Random(2), applied=9)
    assert (n.log.committed, n.log.applied, n.log.last_index(), n.log.held_committed()) == (9, 9, 4, 4)
    assert n.vote_floor == (1, 9)
    n.campaign()
    assert n.role.value == "follower", "below its floor it never campaigns"
    n.step(Vote(term=2, src=3, dst=2, last_index=6, last_term=1))   # more up to date than its log, not its floor
    rd = handle(n)
    assert rd is not None and [m.granted for m in rd.send_after if isinstance(m, VoteResp)] == [False]
    n.step(Vote(term=3, src=1, dst=2, last_index=9, last_term=1))
    rd = handle(n)
    assert rd is not None and [m.granted for m in rd.send_after if isinstance(m, VoteResp)] == [True]
    n.step(Append(term=3, src=1, dst=2, prev_index=2, prev_term=1, entries=(), commit=9))
    rd = handle(n)
    assert rd is not None and [m.index for m in rd.send_after if isinstance(m, AppendResp)] == [4]
    n.step(Append(term=3, src=1, dst=2, prev_index=4, prev_term=1, entries=tuple(entries[5:]), commit=9))
    rd = handle(n)
    assert rd is not None and not rd.committed, "the entries that fill the hole are not applied again"
    assert n.vote_floor is None and n.log.last_index() == 9


@pytest.mark.parametrize("broadcast", [True, False])
def test_without_commit_broadcast_the_next_append_or_heartbeat_carries_the_commit(broadcast: bool) -> None:
    """commit_broadcast = false: the acknowledgement that commits an entry sends no empty append of its own;
    followers learn the commit index with the next append, or at the latest with the next heartbeat."""
    n = node(1, commit_broadcast=broadcast)
    ack(n, elect(n), [2, 3])                             # the leader's no-op commits
    n.propose(b"x")
    sent = drain(n)
    index = n.log.last_index()
    after_commit = ack(n, sent, [2])
    assert n.log.committed == index
    commits = [(m.dst, m.commit) for m in of(after_commit, Append)]
    if broadcast:
        assert commits == [(2, index), (3, index)]
    else:
        assert commits == [], "no append only to say the commit index"
        n.propose(b"y")
        assert [(m.dst, m.commit) for m in of(drain(n), Append)] == [(2, index), (3, index)]
        for _ in range(n.cfg.heartbeat_interval_ticks):
            n.tick()
        beats = [(m.dst, m.commit) for m in of(drain(n), Heartbeat)]
        assert beats == [(2, index), (3, index - 1)], "a heartbeat carries what each follower holds of the commit"
