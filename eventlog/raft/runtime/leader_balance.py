"""Where a group's leadership should be, seen from its leader (sans-IO): the leader balancer's decision.

Every node hosts every group, and elections put the leaders wherever the first timeout fires: after a
cold start usually all on one node, which then does all the leader work (client writes, replication to
every peer) while the others idle. Balancing spreads them by *preference*, as Kafka's preferred
replicas do: group number `rank` (its place in `[cluster] groups`) prefers the voters in the order
`preference_order` gives (the voters sorted by id, rotated by `rank`; `[cluster] preferred_leaders`
puts one node first), so with as many voters as groups each voter is the first choice of one group
(with more groups than voters, each voter is the first choice of as many groups as the others, give
or take one).

The decision is made by each group's leader for that group alone (the leader holds the facts: who is
caught up, who answers), so no two nodes ever decide about the same group, and it only ever moves
leadership to the group's first choice. A move is a leadership transfer (TimeoutNow, thesis §3.10);
once done, the leader is the first choice, which never moves it, so balancing alone can never move a
group back and forth. While the first choice is away the group stays where the election put it (a
move among the others would only add a leader change: the first choice takes it back when it
returns). What keeps it from acting at the wrong time:

- it only moves what an election placed: a leader that got the leadership handed over (TimeoutNow:
  an operator's `leader transfer`, a halted or full node stepping aside, a membership change, or
  the balancer itself) keeps it until the next election; so balancing never undoes a deliberate move;

- the group is settled: this node has led it, in the same term, for `settle_s` (never during or right
  after an election), no transfer and no membership change is under way (`LeaderView.busy`);
- the target is fit: a voter heard from lately (`live`: the runtime says within two election timeouts) whose log holds the whole
  commit offset, continuously for `settle_s` (a member that just came back, or lags under load, waits
  until it has kept up that long: Redpanda mutes a restarted node the same way);
- it does not repeat itself: each attempt of this node for this group within `retry_window_s` of its
  previous one doubles the wait before the next (from `settle_s` up to `max_backoff_s`), so a target
  that keeps losing the leadership again (a flaky node, a node whose disk is full or whose group is
  halted hands it straight back) costs at most one move per backoff, never a flap per second.

Time is whatever clock the caller passes (seconds); not thread-safe: owned by one group's task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MAX_BACKOFF_S = 300.0


def preference_order(voters: Sequence[int], rank: int, preferred: int = 0) -> tuple[int, ...]:
    """The voters in the order group number `rank` prefers them as leader: sorted by id and rotated by
    `rank` (group 0 prefers the lowest id, group 1 the next...), with `preferred` first if it is a voter."""
    ordered = sorted(voters)
    if not ordered:
        return ()
    k = rank % len(ordered)
    order = ordered[k:] + ordered[:k]
    if preferred in order:
        order.remove(preferred)
        order.insert(0, preferred)
    return tuple(order)


@dataclass(frozen=True, slots=True)
class LeaderView:
    """What the leader knows of its group at one moment."""

    me: int
    term: int
    voters: tuple[int, ...]
    commit: int                      # the leader's commit offset
    matches: Mapping[int, int]       # follower -> its acknowledged (durable) offset on the leader
    live: frozenset[int]             # followers heard from lately
    busy: bool = False               # a transfer or membership change under way, or writes refused
    by_transfer: bool = False        # this node leads because the previous leader handed it over


class LeaderBalance:
    """One group's balancing decision on one node: `observe` every tick, on the leader with a
    `LeaderView`, elsewhere with None; it returns the voter to hand leadership to now, or 0."""

    def __init__(self, rank: int, *, settle_s: float, preferred: int = 0,
                 retry_window_s: float | None = None, max_backoff_s: float = DEFAULT_MAX_BACKOFF_S) -> None:
        assert settle_s > 0 and rank >= 0
        self.rank = rank
        self.preferred = preferred
        self.settle = settle_s
        self.retry_window = 10 * settle_s if retry_window_s is None else retry_window_s
        self.max_backoff = max(max_backoff_s, settle_s)
        self._term = 0                                # the term this node leads in (0: not leading)
        self._leading_since = 0.0
        self._fit_since: dict[int, float] = {}        # follower -> since when it is live and caught up
        self._attempted_at: float | None = None       # this node's latest handover of the group
        self._backoff = settle_s
        self._not_before = 0.0
        self.moves = 0                                # handovers decided (metrics, tests)

    def order(self, voters: Sequence[int]) -> tuple[int, ...]:
        return preference_order(voters, self.rank, self.preferred)

    def observe(self, now: float, view: LeaderView | None) -> int:
        if view is None:
            self._term = 0
            self._fit_since.clear()
            return 0
        if view.term != self._term:
            self._term = view.term
            self._leading_since = now
            self._fit_since.clear()
        for member in view.voters:
            if member == view.me:
                continue
            if member in view.live and view.matches.get(member, -1) >= view.commit:
                self._fit_since.setdefault(member, now)
            else:
                self._fit_since.pop(member, None)
        if view.by_transfer or view.busy or now - self._leading_since < self.settle or now < self._not_before:
            return 0
        if view.me not in view.voters:
            return 0   # being removed: membership hands leadership over, not the balancer
        first = self.order(view.voters)[0]
        since = self._fit_since.get(first)
        if first != view.me and since is not None and now - since >= self.settle:
            return self._attempt(now, first)
        return 0

    def _attempt(self, now: float, target: int) -> int:
        recent = self._attempted_at is not None and now - self._attempted_at < self.retry_window
        self._backoff = min(self._backoff * 2, self.max_backoff) if recent else self.settle
        self._attempted_at = now
        self._not_before = now + self._backoff
        self.moves += 1
        return target
