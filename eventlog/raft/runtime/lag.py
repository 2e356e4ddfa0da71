"""How far behind the commit offset each member of a group is, seen from its leader (sans-IO).

A member is *late* when it has not acknowledged (its `match` on the leader) an offset that was
committed `warn_after_s` ago or earlier, and is at least `min_offsets` behind the commit offset:
it is stuck, cut off, or catching up slowly. Measuring the age of the oldest commit a member lacks,
rather than offsets alone, keeps a busy but healthy follower (always a few batches behind the
newest commit, never for long) quiet, and catches a stuck one in a quiet group.

`LagMonitor.observe(now, commit, matches)` is called periodically on the leader (every tick) and
returns what to log: `Behind` when a member becomes late and again every `repeat_s` while it stays
late (a bounded rate), `CaughtUp` once it is no longer late. `snapshot()` gives every member's lag
in offsets and seconds for metrics. The commit history it needs is a few samples: at most one per
100 ms, kept for `warn_after_s` (a minute at least) plus one older anchor. A new leader (or a
monitor just reset) knows no history yet: nobody is late before `warn_after_s` have passed.

Time is whatever clock the caller passes (seconds); not thread-safe: owned by one group's task.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

_HISTORY_S = 60.0   # `seconds` is exact up to this age (beyond, a lower bound)


@dataclass(frozen=True, slots=True)
class MemberLag:
    member: int
    match: int           # the member's acknowledged offset on the leader (-1: none yet)
    commit: int          # the leader's commit offset
    offsets: int         # commit - match (0 when the member holds the commit)
    seconds: float       # age of the oldest committed offset the member lacks (0 when none)
    late_for: float      # how long it has been late (0 when not late)


@dataclass(frozen=True, slots=True)
class Behind:
    """`lag.member` has been late for `lag.late_for` seconds (logged as a warning)."""

    lag: MemberLag


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """`member` is no longer late, after `late_for` seconds (logged as information)."""

    member: int
    late_for: float
    offsets: int


class LagMonitor:
    """Lag of every member on one leader; reset it when leadership ends."""

    def __init__(self, *, warn_after_s: float, min_offsets: int = 1, repeat_s: float = 30.0) -> None:
        self.warn_after = warn_after_s     # 0: never warn (the lag is still measured)
        self.min_offsets = max(1, min_offsets)
        self.repeat = repeat_s
        self._samples: deque[tuple[float, int]] = deque()   # (time, commit) when the commit changed
        self._late_since: dict[int, float] = {}             # member -> when it became late
        self._warned_at: dict[int, float | None] = {}       # member -> when it was last reported late
        self._lags: dict[int, MemberLag] = {}

    def reset(self) -> None:
        """Leadership ended (or moved): forget everything, report nothing."""
        self._samples.clear()
        self._late_since.clear()
        self._warned_at.clear()
        self._lags.clear()

    def snapshot(self) -> dict[int, MemberLag]:
        """Every member's lag at the last `observe` (empty when not leading)."""
        return dict(self._lags)

    def observe(self, now: float, commit: int, matches: dict[int, int]) -> list[Behind | CaughtUp]:
        """The leader's commit offset and each member's match now; returns what to report."""
        self._record(now, commit)
        horizon = now - self.warn_after
        events: list[Behind | CaughtUp] = []
        lags: dict[int, MemberLag] = {}
        for member, match in sorted(matches.items()):
            offsets = max(0, commit - match)
            seconds = now - self._first_commit_above(match, now) if offsets else 0.0
            then = self._commit_at(horizon)
            late = self.warn_after > 0 and offsets >= self.min_offsets and then is not None and match < then
            if late:
                since = self._late_since.setdefault(member, now)
                # The samples go back only so far; it lacked a commit at least warn_after old then.
                seconds = max(seconds, now - since + self.warn_after)
                lag = MemberLag(member, match, commit, offsets, seconds, now - since)
                last = self._warned_at.get(member)
                if last is None or now - last >= self.repeat:
                    self._warned_at[member] = now
                    events.append(Behind(lag))
            else:
                lag = MemberLag(member, match, commit, offsets, seconds, 0.0)
                if member in self._late_since:
                    since = self._late_since.pop(member)
                    if self._warned_at.pop(member, None) is not None:
                        events.append(CaughtUp(member, now - since, offsets))
            lags[member] = lag
        for gone in set(self._late_since) - set(matches):   # removed from the group
            del self._late_since[gone]
            self._warned_at.pop(gone, None)
        self._lags = lags
        return events

    def _record(self, now: float, commit: int) -> None:
        samples = self._samples
        # At most one sample per 100 ms: a commit offset recorded late only makes members look less
        # late, never more.
        if not samples or (commit > samples[-1][1] and now - samples[-1][0] >= 0.1):
            samples.append((now, commit))
        # Keep what covers the last warn_after seconds (a minute at least, for `seconds`), plus the
        # newest older sample (the commit offset as of the horizon).
        keep_from = now - max(self.warn_after, _HISTORY_S)
        while len(samples) >= 2 and samples[1][0] <= keep_from:
            samples.popleft()

    def _commit_at(self, t: float) -> int | None:
        """The commit offset at time `t` (None before the first sample: unknown)."""
        i = bisect_right(self._samples, t, key=lambda s: s[0])
        return self._samples[i - 1][1] if i else None

    def _first_commit_above(self, match: int, now: float) -> float:
        """When the commit offset was first seen past `match` (as far back as the samples go)."""
        i = bisect_right(self._samples, match, key=lambda s: s[1])
        return self._samples[i][0] if i < len(self._samples) else now
