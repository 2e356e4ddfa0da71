"""The retention horizon (compaction/policy.py), table-driven: one row per situation, with the floors
and the bounds it must give."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from compaction.config import CompactionConfig
from compaction.policy import GroupFacts, SegmentSpan, floor_keeping_bytes, horizon

# Ten segments of 1,000 offsets and 100 KB each: [0, 1000), [1000, 2000), ... [9000, 10000).
SEGMENTS = tuple(SegmentSpan(i * 1000, (i + 1) * 1000, 100_000) for i in range(10))
NOW_MS = 1_000_000


def offset_at_ms(t: int) -> int:
    """Offset o was written at time o * 100 ms: the first offset at or after t."""
    return min(max(0, -(-t // 100)), 10_000)


OFF = dict(retain_offsets=0, retain_bytes=0, retain_ms=0, export_max_pin_offsets=0, export_max_pin_bytes=0,
           export_max_pin_ms=0)


@dataclass(frozen=True)
class Case:
    name: str
    config: dict[str, int]
    applied: int = 9_999
    snapshot: int = 9_999
    exports: dict[str, int] = field(default_factory=dict)
    # expected
    history: tuple[int, str] = (0, "")
    log: tuple[int, str] = (0, "")
    capped: dict[str, str] = field(default_factory=dict)   # table -> the cap that moved its pin


CASES = [
    Case("nothing on: everything applied and snapshotted may go", OFF,
         history=(10_000, "applied"), log=(10_000, "applied")),
    Case("retain_offsets keeps that many offsets", {**OFF, "retain_offsets": 2_500},
         history=(7_500, "policy (retain_offsets)"), log=(7_500, "policy (retain_offsets)")),
    Case("retain_offsets larger than the log keeps everything", {**OFF, "retain_offsets": 50_000},
         history=(0, "policy (retain_offsets)"), log=(0, "policy (retain_offsets)")),
    Case("retain_bytes keeps whole newest segments", {**OFF, "retain_bytes": 250_000},
         history=(7_000, "policy (retain_bytes)"), log=(7_000, "policy (retain_bytes)")),
    Case("retain_ms keeps what was written since now - retain_ms", {**OFF, "retain_ms": 300_000},
         history=(7_000, "policy (retain_ms)"), log=(7_000, "policy (retain_ms)")),
    Case("every policy knob on: the lowest floor wins",
         {**OFF, "retain_offsets": 1_000, "retain_bytes": 350_000, "retain_ms": 100_000},
         history=(6_000, "policy (retain_bytes)"), log=(6_000, "policy (retain_bytes)")),
    Case("the snapshot bounds the log, not the history", {**OFF, "retain_offsets": 1_000}, snapshot=4_999,
         history=(9_000, "policy (retain_offsets)"), log=(5_000, "snapshot")),
    Case("no snapshot yet: the log keeps everything", {**OFF, "retain_offsets": 1_000}, snapshot=-1,
         history=(9_000, "policy (retain_offsets)"), log=(0, "snapshot")),
    Case("an export below the policy pins history and log", {**OFF, "retain_offsets": 1_000},
         exports={"t1": 3_999}, history=(4_000, "export t1"), log=(4_000, "export t1")),
    Case("an export above the policy does not lower it", {**OFF, "retain_offsets": 1_000},
         exports={"t1": 9_500}, history=(9_000, "policy (retain_offsets)"), log=(9_000, "policy (retain_offsets)")),
    Case("the lowest of several exports pins", OFF, exports={"a": 8_000, "b": 2_000, "c": 6_000},
         history=(2_001, "export b"), log=(2_001, "export b")),
    Case("a table that exported nothing yet pins from 0", OFF, exports={"new": -1},
         history=(0, "export new"), log=(0, "export new")),
    Case("an abandoned export is capped by export_max_pin_offsets",
         {**OFF, "retain_offsets": 1_000, "export_max_pin_offsets": 5_000}, exports={"old": 100, "live": 9_000},
         history=(5_000, "export old"), log=(5_000, "export old"), capped={"old": "export_max_pin_offsets"}),
    Case("a capped pin never lowers the policy's floor",
         {**OFF, "retain_offsets": 8_000, "export_max_pin_offsets": 5_000}, exports={"old": 100},
         history=(2_000, "policy (retain_offsets)"), log=(2_000, "policy (retain_offsets)"),
         capped={"old": "export_max_pin_offsets"}),
    Case("export_max_pin_bytes caps at whole segments", {**OFF, "export_max_pin_bytes": 400_000},
         exports={"old": 10}, history=(6_000, "export old"), log=(6_000, "export old"),
         capped={"old": "export_max_pin_bytes"}),
    Case("export_max_pin_ms caps by age", {**OFF, "export_max_pin_ms": 200_000}, exports={"old": 10},
         history=(8_000, "export old"), log=(8_000, "export old"), capped={"old": "export_max_pin_ms"}),
    Case("the strictest cap moves the pin", {**OFF, "export_max_pin_offsets": 5_000, "export_max_pin_ms": 200_000},
         exports={"old": 10}, history=(8_000, "export old"), log=(8_000, "export old"),
         capped={"old": "export_max_pin_ms"}),
    Case("a pin within every cap is not capped", {**OFF, "export_max_pin_offsets": 5_000}, exports={"t": 7_000},
         history=(7_001, "export t"), log=(7_001, "export t")),
    Case("a replica behind the watermark keeps from its applied offset", OFF, applied=4_999, snapshot=4_999,
         exports={"t": 9_000}, history=(5_000, "applied"), log=(5_000, "applied")),
    Case("an empty group", {**OFF, "retain_offsets": 100}, applied=-1, snapshot=-1,
         history=(0, "applied"), log=(0, "applied")),
    Case("the defaults on a small group keep all of it", {}, history=(0, "policy (retain_offsets)"),
         log=(0, "policy (retain_offsets)")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_horizon(case: Case) -> None:
    facts = GroupFacts("g", case.applied, SEGMENTS, case.snapshot, case.exports, NOW_MS, offset_at_ms)
    h = horizon(facts, CompactionConfig(**case.config))
    assert (h.history_floor, h.history_bound) == case.history
    assert (h.log_floor, h.log_bound) == case.log
    assert {p.table: p.capped_by for p in h.capped_pins} == case.capped
    assert h.log_floor <= h.history_floor <= case.applied + 1
    assert h.cleanable_below() == h.log_floor
    for pin in h.pins:
        assert pin.floor >= min(pin.watermark + 1, case.applied + 1)


@pytest.mark.parametrize("nbytes,expected", [(0, 9_000), (1, 9_000), (100_000, 9_000), (100_001, 8_000),
                                              (1_000_000, 0), (10**9, 0)])
def test_floor_keeping_bytes(nbytes: int, expected: int) -> None:
    assert floor_keeping_bytes(SEGMENTS, nbytes) == expected


def test_floor_keeping_bytes_of_no_segments() -> None:
    assert floor_keeping_bytes((), 10) == 0


def test_time_knobs_without_a_clock_keep_everything() -> None:
    """A caller that cannot tell offsets by time (no offset_at_ms) must not lose history."""
    facts = GroupFacts("g", 9_999, SEGMENTS, 9_999, {"t": 10}, NOW_MS, None)
    h = horizon(facts, CompactionConfig(**{**OFF, "retain_ms": 1, "export_max_pin_ms": 1}))
    assert h.history_floor == 0 and h.log_floor == 0


def test_horizon_only_rises_as_the_group_advances() -> None:
    """With fixed exports and config, a group that applies more never gets a lower horizon."""
    config = CompactionConfig(retain_offsets=700, export_max_pin_offsets=3_000)
    previous = None
    for applied in range(0, 10_000, 250):
        facts = GroupFacts("g", applied, SEGMENTS, applied - 100, {"t": 1_000}, NOW_MS, offset_at_ms)
        h = horizon(facts, config)
        if previous is not None:
            assert h.history_floor >= previous.history_floor and h.log_floor >= previous.log_floor
        previous = h
