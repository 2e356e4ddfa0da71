"""The version check of a chaos run: every value sits at exactly one offset, and every read says which.

Theory of operation. Every value a chaos client writes is unique, and a key's version is the offset
of the write that last changed it, so each observation of a value names the offset of its write:

- an acknowledged write: the offset the node answered;
- a read (linearizable, lease or local): the version it returned with the value;
- the kv log as the run's `LogTail` read it: the offset of a record that wrote the value and
  applied (`applied` True; a rejected compare-and-set or a deduplicated retry is not applied).

A value seen at two offsets was applied twice (or a read reported a version that is not its
write's): reported as "applied twice at offsets A and B" with who saw which. A read's version that
falls where the tail holds the log must hold that key and value, applied; a read of a value no
client ever wrote is reported too. A write whose outcome is unknown is held to the same rules: its
value may be read only with the offset where the log applied it.

Pure functions over what the run recorded; no IO.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Read:
    """A read that returned `value` (not absent) with `version`."""

    client: int
    key: str
    value: int
    version: int
    via: str               # linearizable | lease | local


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One kv record of a chaos key as read from the log; `value` None for a record that is not a put."""

    offset: int
    key: str
    value: int | None
    applied: bool | None   # None: the node no longer knows (below its history floor)


@dataclass(frozen=True, slots=True)
class Coverage:
    """The offsets where the log tail holds every record: [start, end) minus the `gaps` it skipped."""

    start: int
    end: int
    gaps: tuple[tuple[int, int], ...] = ()

    def __contains__(self, offset: int) -> bool:
        return self.start <= offset < self.end and not any(lo <= offset < hi for lo, hi in self.gaps)


def check_versions(acked: Iterable[tuple[str, int, int]], reads: Iterable[Read], log: Mapping[int, LogRecord],
                   coverage: Coverage, written: Iterable[int]) -> list[str]:
    """Violations of "one value, one offset": `acked` is (key, value, offset) of acknowledged writes,
    `written` every value a write carried (acknowledged or not)."""
    places: dict[tuple[str, int], dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key, value, offset in acked:
        places[(key, value)][offset].append("acknowledged")
    for record in log.values():
        if record.value is not None and record.applied:
            places[(record.key, record.value)][record.offset].append("in the log")
    reads = list(reads)
    read_places: dict[tuple[str, int, int], list[Read]] = defaultdict(list)
    for r in reads:
        read_places[(r.key, r.value, r.version)].append(r)
    for (key, value, version), rs in read_places.items():
        places[(key, value)][version].append(_readers(rs))

    out: list[str] = []
    for (key, value), at in sorted(places.items()):
        if len(at) > 1:
            offsets = sorted(at)
            times = "twice" if len(offsets) == 2 else f"{len(offsets)} times"
            seen = "; ".join(f"{o}: {', '.join(at[o])}" for o in offsets)
            out.append(f"{key}: value {value} applied {times} at offsets {_and(offsets)} ({seen})")
    known = set(written)
    for (key, value, version), rs in sorted(read_places.items()):
        if value not in known:
            out.append(f"{key}: {_readers(rs)} returned value {value}, which no client wrote")
        elif version in coverage:
            record = log.get(version)
            if record is None or record.key != key or record.value != value or record.applied is False:
                out.append(f"{key}: {_readers(rs)} returned value {value} with version {version}, but the log "
                           f"holds {_describe(record)} at offset {version}")
    return out


def _readers(reads: Sequence[Read]) -> str:
    first = reads[0]
    more = f" and {len(reads) - 1} more" if len(reads) > 1 else ""
    return f"a read by client {first.client} ({first.via}){more}"


def _describe(record: LogRecord | None) -> str:
    if record is None:
        return "no record of a chaos key"
    what = "not a put" if record.value is None else f"value {record.value}"
    applied = {True: "applied", False: "not applied", None: "applied or not"}[record.applied]
    return f"{record.key} {what} ({applied})"


def _and(items: Sequence[int]) -> str:
    return ", ".join(map(str, items[:-1])) + f" and {items[-1]}" if len(items) > 1 else str(items[0])
