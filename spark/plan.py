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
             range_offsets: int = 250_000, max_offsets: int | None = None,
             until: dict[str, int] | None = None) -> ExportPlan:
        """`exported`: group -> app transaction version (-1 none); `bounds`: group -> (log start,
        commit offset) as the source reports them; `until`: group -> an end (exclusive) below the
        commit offset to stop at; `max_offsets`: the most offsets the run reads over all groups
        (a bounded run: `cap`)."""
        if range_offsets < 1:
            raise ValueError("range_offsets must be positive")
        starts, ends = {}, {}
        for group in sorted(bounds):
            log_start, commit = bounds[group]
            starts[group] = max(exported.get(group, -1) + 1, log_start)
            end = commit + 1 if until is None or group not in until else min(commit + 1, until[group])
            ends[group] = max(starts[group], end)
        if max_offsets is not None:
            ends = cap(starts, ends, max_offsets)
        plans = [GroupPlan(g, exported.get(g, -1), starts[g], ends[g], bounds[g][0]) for g in sorted(bounds)]
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


def cap(starts: dict[str, int], ends: dict[str, int], max_offsets: int) -> dict[str, int]:
    """`ends` lowered so that at most `max_offsets` offsets lie between `starts` and them in all, shared
    fairly: every group gets an equal share, and what a group does not need goes to the others (a
    backlog in one group does not starve the others, a quiet group does not waste the budget)."""
    if max_offsets < 1:
        raise ValueError("max_offsets must be positive")
    want = {g: max(0, ends[g] - starts[g]) for g in ends}
    grant = dict.fromkeys(want, 0)
    budget = max_offsets
    open_groups = sorted(g for g in want if want[g] > 0)
    while budget > 0 and open_groups:
        share = max(1, budget // len(open_groups))
        for g in list(open_groups):
            take = min(share, want[g] - grant[g], budget)
            grant[g] += take
            budget -= take
            if grant[g] == want[g]:
                open_groups.remove(g)
            if budget == 0:
                break
    return {g: starts[g] + grant[g] if want[g] else ends[g] for g in ends}


EARLIEST, LATEST = -2, -1


def parse_offsets(text: str | None, bounds: dict[str, tuple[int, int]], *, default: str) -> dict[str, int]:
    """Offsets per group from a reader option: `earliest` (each group's log start), `latest` (one past its
    commit offset) or JSON {"group": offset} (offset -2: earliest, -1: latest; a group left out takes
    `default`). Unknown groups are an error."""
    raw = (text or default).strip()

    def resolve(group: str, value: int) -> int:
        log_start, commit = bounds[group]
        if value == EARLIEST:
            return log_start
        if value == LATEST:
            return commit + 1
        if value < 0:
            raise ValueError(f"offset {value} of group {group}: use an offset >= 0, -2 (earliest) or -1 (latest)")
        return value

    if raw in ("earliest", "latest"):
        return {g: resolve(g, EARLIEST if raw == "earliest" else LATEST) for g in bounds}
    try:
        given = msgspec.json.decode(raw, type=dict[str, int])
    except msgspec.DecodeError:
        raise ValueError(f"offsets {raw!r}: use earliest, latest or JSON such as {{\"kv\": 0}}") from None
    unknown = set(given) - set(bounds)
    if unknown:
        raise ValueError(f"offsets name unknown groups {sorted(unknown)} (groups: {sorted(bounds)})")
    fallback = parse_offsets(default, bounds, default=default) if default in ("earliest", "latest") else {}
    return {g: resolve(g, given[g]) if g in given else fallback[g] for g in bounds}
