"""LeaderBalance (eventlog/raft/runtime/leader_balance.py): which group moves where, and when it must not."""

from __future__ import annotations

import random

import pytest

from eventlog.raft.node import Role
from eventlog.raft.runtime.leader_balance import LeaderBalance, LeaderView, preference_order
from eventlog.raft.types import TimeoutNow, VoteResp
from tests.eventlog.raft.paper import ack, drain, elect, node, storage

VOTERS = (1, 2, 3)


def view(me: int, *, term: int = 5, commit: int = 100, matches: dict[int, int] | None = None,
         live: tuple[int, ...] | None = None, busy: bool = False, voters: tuple[int, ...] = VOTERS) -> LeaderView:
    others = [v for v in voters if v != me]
    return LeaderView(me, term, voters, commit, {v: commit for v in others} if matches is None else matches,
                      frozenset(others if live is None else live), busy)


def run(balance: LeaderBalance, seconds: float, make: object, *, start: float = 0.0, step: float = 0.25,
        transfers_fail: bool = False) -> list[tuple[float, int]]:
    """Observe every `step` s for `seconds` (`make(t)` gives the view, or None); the (time, target) of
    the handover decided (it stops there), or with `transfers_fail` of every one: each transfer keeps
    the leader busy for 0.5 s (an election timeout), then times out and it leads on."""
    out: list[tuple[float, int]] = []
    t = start
    while t < start + seconds - 1e-9:
        v = make(t)  # type: ignore[operator]
        if v is not None and out and t - out[-1][0] < 0.5:
            v = LeaderView(v.me, v.term, v.voters, v.commit, v.matches, v.live, True)
        target = balance.observe(t, v)
        if target:
            out.append((round(t, 2), target))
            if not transfers_fail:
                break
        t += step   # multiples of 1/4: exact in binary
    return out


def test_each_group_prefers_another_voter_first() -> None:
    firsts = [preference_order(VOTERS, rank)[0] for rank in range(3)]
    assert firsts == [1, 2, 3]
    assert preference_order(VOTERS, 1) == (2, 3, 1)
    assert preference_order((5, 1, 3), 4) == (3, 5, 1), "sorted by id, rotated by rank modulo the voters"
    assert preference_order(VOTERS, 0, preferred=3) == (3, 1, 2)
    assert preference_order(VOTERS, 2, preferred=9) == (3, 1, 2), "a preferred node that is no voter is ignored"
    assert preference_order((), 1) == ()


def test_a_settled_leader_hands_over_to_the_group_s_first_choice_once() -> None:
    b = LeaderBalance(2, settle_s=2.0)          # the kv group of three prefers node 3
    assert run(b, 1.75, lambda t: view(1)) == []
    assert run(b, 1.0, lambda t: view(1), start=1.75) == [(2.0, 3)], "after leading 2 s, the target fit 2 s"


def test_only_the_first_choice_is_a_target_and_it_never_moves() -> None:
    assert run(LeaderBalance(2, settle_s=1.0), 10.0, lambda t: view(3)) == []
    # Leader 2 of kv (order 3, 1, 2) while node 3 is away: node 1 ranks higher and is fit, but a move
    # there would only add a leader change; node 3 gets it once it is back and fit.
    b = LeaderBalance(2, settle_s=1.0)
    assert run(b, 3.0, lambda t: view(2, live=(1,))) == []
    assert run(b, 3.0, lambda t: view(2), start=3.0) == [(4.0, 3)]


def test_a_target_that_lags_is_not_moved_to_until_it_kept_up_for_the_settle_time() -> None:
    b = LeaderBalance(2, settle_s=2.0)

    def lagging_until_3(t: float) -> LeaderView:
        commit = 100 + int(t * 100)
        return view(1, commit=commit, matches={2: commit, 3: commit - 50 if t < 3.0 else commit})

    assert run(b, 6.0, lagging_until_3) == [(5.0, 3)], "caught up at 3 s, fit for 2 s"


def test_one_lagging_sample_restarts_the_clock_hysteresis() -> None:
    b = LeaderBalance(2, settle_s=2.0)

    def blip(t: float) -> LeaderView:
        behind = t in (1.5, 3.0)
        return view(1, matches={2: 100, 3: 99 if behind else 100})

    assert run(b, 6.0, blip) == [(5.25, 3)], "fit again from 3.25 s"


def test_a_target_not_heard_from_is_not_fit() -> None:
    b = LeaderBalance(2, settle_s=1.0)
    assert run(b, 5.0, lambda t: view(1, live=(2,))) == [], "its old match holds the commit, but it is silent"


def test_no_move_while_busy_or_right_after_an_election() -> None:
    b = LeaderBalance(2, settle_s=2.0)
    assert run(b, 4.0, lambda t: view(1, busy=True)) == []
    # A new term (an election) restarts the settle time, wherever the old one stood.
    b = LeaderBalance(2, settle_s=2.0)
    assert run(b, 1.75, lambda t: view(1, term=5)) == []
    assert run(b, 2.5, lambda t: view(1, term=6), start=1.75) == [(3.75, 3)]
    # Not leading in between forgets the fitness seen before.
    b = LeaderBalance(2, settle_s=2.0)
    assert run(b, 1.75, lambda t: view(1, term=5)) == []
    assert run(b, 0.25, lambda t: None, start=1.75) == []
    assert run(b, 2.5, lambda t: view(1, term=7), start=2.0) == [(4.0, 3)]


def test_a_leadership_handed_over_on_purpose_is_left_where_it_is() -> None:
    """An operator's `leader transfer`, a halted or full node stepping aside, the balancer's own move:
    the leader that got it by TimeoutNow keeps it until the next election."""
    assert run(LeaderBalance(2, settle_s=1.0), 10.0,
               lambda t: LeaderView(1, 5, VOTERS, 100, {2: 100, 3: 100}, frozenset({2, 3}), by_transfer=True)) == []


def test_the_core_tells_a_leadership_handed_over_from_one_won_in_an_election() -> None:
    elected = node(1)
    ack(elected, elect(elected), [2, 3])
    assert elected.role is Role.LEADER and not elected.won_by_transfer
    target = node(3, storage(term=1))
    target.step(TimeoutNow(term=1, src=1, dst=3))
    drain(target)
    target.step(VoteResp(term=2, src=2, dst=3, granted=True))
    assert target.role is Role.LEADER and target.won_by_transfer
    # The next leadership of the same node, won in an election, is not a handed-over one.
    target.step(VoteResp(term=3, src=2, dst=3, granted=False))   # a higher term: it follows
    assert target.role is Role.FOLLOWER
    ack(target, elect(target), [1, 2])
    assert target.role is Role.LEADER and not target.won_by_transfer


def test_a_node_being_removed_is_left_to_membership() -> None:
    b = LeaderBalance(0, settle_s=1.0)
    assert run(b, 3.0, lambda t: view(4, voters=(1, 2, 3), matches={1: 100, 2: 100, 3: 100}, live=(1, 2, 3))) == []


def test_repeated_attempts_back_off_exponentially_up_to_the_cap() -> None:
    """A target that keeps losing leadership again (or a transfer that times out): this node tries
    again only after 2, 4, 8... settle times, capped, never once per settle time."""
    b = LeaderBalance(2, settle_s=1.0, max_backoff_s=8.0)
    moves = run(b, 40.0, lambda t: view(1), transfers_fail=True)   # the transfer never takes
    times = [t for t, _ in moves]
    assert times[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    gaps = [round(b2 - a, 2) for a, b2 in zip(times, times[1:])]
    assert max(gaps) == 8.0 and gaps[-1] == 8.0, gaps


def test_after_a_quiet_window_the_backoff_starts_over() -> None:
    b = LeaderBalance(2, settle_s=1.0, retry_window_s=5.0)
    assert run(b, 1.5, lambda t: view(1, term=5)) == [(1.0, 3)]
    assert run(b, 10.0, lambda t: None, start=1.5) == []                 # node 3 led for 10 s
    assert run(b, 2.5, lambda t: view(1, term=7), start=11.5) == [(12.5, 3)]
    assert run(b, 1.5, lambda t: view(1, term=7), start=13.0) == [(13.5, 3)], "the backoff is back at 1 s"


@pytest.mark.parametrize("seed", range(20))
def test_three_groups_on_three_nodes_spread_and_stay_spread(seed: int) -> None:
    """A small model of a cluster: each group's leader runs its own LeaderBalance, transfers take effect
    at once and elections put leaders at random; members go down and come back. Once every member is up
    and the groups settled, the leaders are on three different nodes and no group moves again."""
    rng = random.Random(seed)
    print(f"seed={seed}")
    groups = {rank: rng.choice(VOTERS) for rank in range(3)}        # rank -> leader
    terms = {rank: 1 for rank in range(3)}
    balancers = {(rank, node): LeaderBalance(rank, settle_s=1.0) for rank in range(3) for node in VOTERS}
    up = set(VOTERS)
    moves_after_settle = 0
    t = 0.0
    while t < 60.0:
        if t < 30.0 and rng.random() < 0.01:                          # faults only in the first half
            node = rng.choice(VOTERS)
            if node in up and len(up) > 2:
                up.discard(node)
            else:
                up.add(node)
        if t >= 30.0:
            up = set(VOTERS)
        for rank in range(3):
            if groups[rank] not in up:                                # an election among those up
                groups[rank] = rng.choice(sorted(up))
                terms[rank] += 1
            for node in VOTERS:
                leading = groups[rank] == node
                target = balancers[rank, node].observe(t, view(node, term=terms[rank], live=tuple(up - {node}))
                                                       if leading else None)
                if target:
                    assert target in up and leading
                    groups[rank] = target
                    terms[rank] += 1
                    moves_after_settle += t >= 40.0
        t = round(t + 0.05, 2)
    assert sorted(groups.values()) == [1, 2, 3], groups
    assert moves_after_settle == 0
