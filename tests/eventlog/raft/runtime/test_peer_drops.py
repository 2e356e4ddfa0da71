"""PeerDrops (eventlog/raft/runtime/peer_drops.py): every dropped peer message is counted, and a flood
of them is logged at a bounded rate."""

from __future__ import annotations

import logging

import pytest

from eventlog.raft.peer_check import NOT_MEMBER, REASONS, TERM_LIMIT, Drop
from eventlog.raft.runtime.peer_drops import PeerDrops
from eventlog.raft.types import Heartbeat


def test_a_flood_is_counted_in_full_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    drops = PeerDrops(1, log_interval_s=10.0, clock=lambda: now[0])
    m = Heartbeat(term=1, src=42, dst=1, commit=0)
    caplog.set_level(logging.WARNING, logger="eventlog.raft.runtime.peer_drops")
    for i in range(10_000):       # 10,000 drops over 25 s
        now[0] = i * 0.0025
        drops.dropped("kv", 42, Drop(NOT_MEMBER, "Heartbeat from 42, not a member"), m)
    drops.dropped("kv", 42, Drop(TERM_LIMIT, "term 10**12"), m)
    assert drops.counts[NOT_MEMBER] == 10_000 and drops.counts[TERM_LIMIT] == 1 and drops.total == 10_001
    assert set(drops.counts) == set(REASONS)
    lines = [r.getMessage() for r in caplog.records]
    member = [line for line in lines if NOT_MEMBER in line]
    assert len(member) == 3, member   # at 0 s, 10 s and 20 s
    assert "from peer 42" in member[0] and "Heartbeat of group 'kv'" in member[0]
    assert "(4000 dropped for this reason since the last such line)" in member[1]
    assert sum(TERM_LIMIT in line for line in lines) == 1, "each reason has its own budget"


def test_an_attacker_chosen_group_name_is_cut_short_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    drops = PeerDrops(1, clock=lambda: 0.0)
    caplog.set_level(logging.WARNING, logger="eventlog.raft.runtime.peer_drops")
    drops.dropped("g" * 100_000, 42, Drop("unknown_group", "x" * 100_000))
    assert len(caplog.records[0].getMessage()) < 600
