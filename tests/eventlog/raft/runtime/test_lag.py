"""LagMonitor (eventlog/raft/runtime/lag.py): when a leader warns about a member that stays behind."""

from __future__ import annotations

from eventlog.raft.runtime.lag import Behind, CaughtUp, LagMonitor


def _run(mon: LagMonitor, seconds: float, commit_rate: int, matches: dict[int, object], *, start: float = 0.0,
         commit0: int = 0, step: float = 0.05) -> list[tuple[float, Behind | CaughtUp]]:
    """Observe every `step` s for `seconds`, the commit offset growing by `commit_rate`/s; a member's
    match is a number, or "commit-N" to follow the commit offset N behind."""
    out = []
    t = start
    while t < start + seconds - 1e-9:
        commit = commit0 + int((t - start) * commit_rate)
        m = {k: (commit - int(v[7:]) if isinstance(v, str) else int(v)) for k, v in matches.items()}
        out += [(round(t, 2), e) for e in mon.observe(t, commit, m)]
        t += step
    return out


def test_a_busy_healthy_follower_stays_quiet() -> None:
    mon = LagMonitor(warn_after_s=2.0)
    events = _run(mon, 10, commit_rate=1000, matches={2: "commit-40", 3: "commit-0"})
    assert events == []
    lags = mon.snapshot()
    assert lags[2].offsets == 40 and 0 <= lags[2].seconds < 0.3 and lags[3].offsets == 0 and lags[3].seconds == 0


def test_a_stuck_member_is_reported_at_a_bounded_rate_then_caught_up() -> None:
    mon = LagMonitor(warn_after_s=2.0, repeat_s=3.0)
    events = _run(mon, 10, commit_rate=100, matches={2: -1, 3: "commit-0"})
    behind = [(t, e) for t, e in events if isinstance(e, Behind)]
    assert [round(t) for t, _ in behind] == [2, 5, 8], "first after 2 s, then every 3 s"
    first = behind[0][1].lag
    assert (first.member, first.match) == (2, -1) and first.offsets == first.commit + 1 and first.seconds >= 2.0
    assert behind[-1][1].lag.seconds >= 8.0 and behind[-1][1].lag.late_for >= 5.9
    assert mon.snapshot()[2].seconds >= 9.9
    recovered = _run(mon, 1, commit_rate=100, matches={2: "commit-0", 3: "commit-0"}, start=10.0, commit0=1000)
    assert len(recovered) == 1 and isinstance(recovered[0][1], CaughtUp) and recovered[0][1].member == 2
    assert recovered[0][1].late_for >= 7.9


def test_a_stuck_member_of_a_quiet_group_is_reported_too() -> None:
    mon = LagMonitor(warn_after_s=1.0)
    events = _run(mon, 3, commit_rate=0, commit0=7, matches={2: 5, 3: 7})
    assert [(e.lag.member, e.lag.offsets) for _, e in events if isinstance(e, Behind)] == [(2, 2)]


def test_min_offsets_and_disabled_warnings() -> None:
    events = _run(LagMonitor(warn_after_s=1.0, min_offsets=10), 3, commit_rate=0, commit0=7, matches={2: 5})
    assert events == [], "2 offsets behind is below the threshold"
    mon = LagMonitor(warn_after_s=0)
    assert _run(mon, 3, commit_rate=10, matches={2: -1}) == []
    assert mon.snapshot()[2].seconds > 2.5, "measured even when warnings are off"


def test_reset_and_removed_members_forget() -> None:
    mon = LagMonitor(warn_after_s=1.0, repeat_s=100)
    assert len(_run(mon, 2, commit_rate=10, matches={2: -1})) == 1
    mon.reset()
    assert mon.snapshot() == {}
    assert _run(mon, 0.5, commit_rate=10, matches={2: -1}, start=2.0) == [], "a new leadership starts afresh"
    mon.reset()
    assert len(_run(mon, 1.5, commit_rate=10, matches={2: -1, 3: -1}, start=2.0)) == 2
    assert mon.observe(3.5, 50, {3: -1}) == [], "member 2 removed: nothing to report"
    assert set(mon.snapshot()) == {3}
