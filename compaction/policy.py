"""The retention horizon of a group: what its log and its views must keep (sans-IO).

Theory of operation. Three things bound what a group may forget, each as the lowest offset it needs:

- the **policy** (`[compaction] retain_*`): at least `retain_offsets` offsets below the applied
  offset, `retain_bytes` of the newest segments, `retain_ms` of history by record timestamp; every
  knob that is on is honoured (the lowest floor wins: "keep at least");
- every **export table** (`config/export/<table>` watermarks, spark/export.py): the offsets above its
  watermark are not archived yet. An abandoned export would pin the log forever, so a pin is capped:
  it never holds more than `export_max_pin_offsets` offsets, `export_max_pin_bytes` bytes or
  `export_max_pin_ms` of history (the first cap it exceeds moves it up, and `capped_by` says which);
- the **snapshot**: the log must keep every entry its latest snapshot does not cover (a restart and
  a follower's catch-up start from the snapshot, then replay the log).

The views' history (MVCC `versions` rows, `as_of` reads) needs the first two only: its floor
(`history_floor`) is what the leader commits as a `HistoryPruned` event, so every replica prunes the
same history at the same offset. The log keeps from `log_floor` = min(history floor, snapshot + 1);
whole segments below it are deleted.

Everything here is a pure function of `GroupFacts`: no clock, no file, no log (the caller measures
the log and passes `offset_at_ms`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from compaction.config import CompactionConfig


@dataclass(frozen=True, slots=True)
class SegmentSpan:
    """One log segment: its offsets [base_offset, next_offset) and the bytes of batches it holds."""

    base_offset: int
    next_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """What the horizon of one group depends on, measured by the caller at one moment."""

    group: str
    applied: int                                  # the views' applied offset (-1: nothing applied)
    segments: Sequence[SegmentSpan]               # oldest first; the last one is active
    snapshot_offset: int                          # the latest durable snapshot's offset (-1: none)
    export_watermarks: Mapping[str, int] = field(default_factory=dict)   # table -> highest exported offset
    now_ms: int = 0
    offset_at_ms: Callable[[int], int] | None = None   # first offset with a timestamp >= t (log end if none)


@dataclass(frozen=True, slots=True)
class ExportPin:
    """One export table's hold on a group: it keeps offsets from `floor` (its watermark + 1, or higher
    when a cap moved it: `capped_by` names the `export_max_pin_*` key)."""

    table: str
    watermark: int
    floor: int
    capped_by: str | None = None

    @property
    def capped(self) -> bool:
        return self.capped_by is not None


@dataclass(frozen=True, slots=True)
class Horizon:
    """What a group keeps. Offsets below `history_floor` may leave the views' history; whole log
    segments below `log_floor` may be deleted. The `*_bound` fields say what set each floor:
    `policy (<key>)`, `export <table>`, `snapshot` or `applied` (nothing holds it back)."""

    group: str
    applied: int
    policy_floor: int
    policy_bound: str
    history_floor: int
    history_bound: str
    log_floor: int
    log_bound: str
    pins: tuple[ExportPin, ...] = ()

    def cleanable_below(self) -> int:
        """The offset below which sealed segments may be rewritten by key compaction (the cleaner):
        the log floor, i.e. history no reader, export or follower needs record by record any more."""
        return self.log_floor

    @property
    def capped_pins(self) -> tuple[ExportPin, ...]:
        return tuple(p for p in self.pins if p.capped)


def floor_keeping_bytes(segments: Sequence[SegmentSpan], nbytes: int) -> int:
    """The base offset of the oldest segment that must stay so that the newest segments hold at least
    `nbytes` (whole segments); the first segment's base when they all together hold less."""
    if not segments:
        return 0
    total = 0
    for seg in reversed(segments):
        total += seg.size_bytes
        if total >= nbytes:
            return seg.base_offset
    return segments[0].base_offset


def _offset_at(facts: GroupFacts, age_ms: int) -> int:
    """The first offset written at or after `now - age_ms` (the whole log when the caller cannot tell)."""
    if facts.offset_at_ms is None:
        return facts.segments[0].base_offset if facts.segments else 0
    return facts.offset_at_ms(facts.now_ms - age_ms)


def _lowest(candidates: Sequence[tuple[int, str]], default: tuple[int, str]) -> tuple[int, str]:
    """The lowest floor and its name; the first listed wins a tie."""
    best = default
    for floor, name in candidates:
        if floor < best[0]:
            best = (floor, name)
    return best


def horizon(facts: GroupFacts, config: CompactionConfig) -> Horizon:
    """The horizon of one group (see the module docstring)."""
    top = facts.applied + 1   # keeping from here keeps nothing of what was applied

    def clamp(offset: int) -> int:
        return max(0, min(offset, top))

    policy = []
    if config.retain_offsets:
        policy.append((clamp(top - config.retain_offsets), "policy (retain_offsets)"))
    if config.retain_bytes:
        policy.append((clamp(floor_keeping_bytes(facts.segments, config.retain_bytes)), "policy (retain_bytes)"))
    if config.retain_ms:
        policy.append((clamp(_offset_at(facts, config.retain_ms)), "policy (retain_ms)"))
    policy_floor, policy_bound = _lowest(policy, (top, "applied"))

    caps = []   # computed only when there is a pin to cap (spares the caller's offset_at_ms look-up)
    if facts.export_watermarks and config.export_max_pin_offsets:
        caps.append((clamp(top - config.export_max_pin_offsets), "export_max_pin_offsets"))
    if facts.export_watermarks and config.export_max_pin_bytes:
        caps.append((clamp(floor_keeping_bytes(facts.segments, config.export_max_pin_bytes)),
                     "export_max_pin_bytes"))
    if facts.export_watermarks and config.export_max_pin_ms:
        caps.append((clamp(_offset_at(facts, config.export_max_pin_ms)), "export_max_pin_ms"))
    pins = []
    for table in sorted(facts.export_watermarks):
        watermark = facts.export_watermarks[table]
        floor, capped_by = clamp(watermark + 1), None
        for cap, name in caps:
            if cap > floor:
                floor, capped_by = cap, name
        pins.append(ExportPin(table, watermark, floor, capped_by))

    history_floor, history_bound = _lowest([(p.floor, f"export {p.table}") for p in pins],
                                           (policy_floor, policy_bound))
    log_floor, log_bound = _lowest([(clamp(facts.snapshot_offset + 1), "snapshot")], (history_floor, history_bound))
    return Horizon(facts.group, facts.applied, policy_floor, policy_bound, history_floor, history_bound,
                   log_floor, log_bound, tuple(pins))
