"""What one export run reads: per group an offset interval, cut into ranges (one Spark partition each).

A run is planned on the driver before any data moves: per group, `start` is the offset after the
highest one the table already holds (its app transaction), or the log start if compaction removed
more than that (`skipped` counts those offsets), and `end` is one past the group's commit offset
*as seen at planning time*. Readers never go past `end`, so a run exports a fixed, committed prefix
whatever the cluster does meanwhile, and the run's commit can record `end - 1` as the group's new
app transaction version. Pure data: serialized as JSON into the Spark data source options.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import msgspec


@dataclass(frozen=True, slots=True)
class GroupPlan:
    group: str
    exported_through: int    # the table's app transaction version before this run (-1: none)
    start: int               # first offset to read
    end: int                 # one past the last offset to read (commit offset + 1 at planning time)
    log_start: int           # the first offset the source still holds

    @property
    def skipped(self) -> int:
        """Offsets compacted away before they were exported (a gap in the table)."""
        return max(0, self.start - (self.exported_through + 1))

    @property
    def offsets(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class Range:
    """One Spark partition: offsets [lo, hi) of one group."""

    group: str
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class ExportPlan:
    groups: tuple[GroupPlan, ...]
    range_offsets: int = 250_000

    @classmethod
    def make(cls, exported: dict[str, int], bounds: dict[str, tuple[int, int]], *,
             range_offsets: int = 250_000) -> ExportPlan:
        """`exported`: group -> app transaction version (-1 none); `bounds`: group -> (log start,
        commit offset) as the source reports them."""
        if range_offsets < 1:
            raise ValueError("range_offsets must be positive")
        plans = []
        for group in sorted(bounds):
            log_start, commit = bounds[group]
            through = exported.get(group, -1)
            start = max(through + 1, log_start)
            plans.append(GroupPlan(group, through, start, max(start, commit + 1), log_start))
        return cls(tuple(plans), range_offsets)

    @property
    def offsets(self) -> int:
        """Offsets to read (an upper bound of the events: control batches occupy offsets too)."""
        return sum(g.offsets for g in self.groups)

    @property
    def empty(self) -> bool:
        return self.offsets == 0

    def active(self) -> list[GroupPlan]:
        return [g for g in self.groups if g.offsets > 0]

    def ranges(self) -> list[Range]:
        out = []
        for g in self.active():
            lo = g.start
            while lo < g.end:
                hi = min(g.end, lo + self.range_offsets)
                out.append(Range(g.group, lo, hi))
                lo = hi
        return out

    def to_json(self) -> str:
        return msgspec.json.encode({"groups": [asdict(g) for g in self.groups],
                                    "range_offsets": self.range_offsets}).decode()

    @classmethod
    def from_json(cls, text: str) -> ExportPlan:
        raw = msgspec.json.decode(text)
        return cls(tuple(GroupPlan(**g) for g in raw["groups"]), int(raw["range_offsets"]))
