"""A stopped node's group log, read offline, and the checks that replicas hold the same committed log.

`read_log_dir` opens a log directory with `eventlog.log.Log` (recovery included, as a restart would) and
returns its batches: raw bytes, offsets, leader epochs, records. `compare_committed` checks that the
logs of several replicas are contiguous and byte-identical over a committed range; `check_acks`
(tests/support/writes.py) that acknowledged records are where their acknowledgement said.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eventlog.config import LogConfig
from eventlog.log import Log


@dataclass(frozen=True)
class Batch:
    """One batch of a group log read offline."""

    base: int
    last: int
    epoch: int
    raw: bytes
    control: bool
    records: tuple[tuple[bytes | None, bytes | None], ...]   # (key, value) of offsets base..last


@dataclass(frozen=True)
class OfflineLog:
    start: int
    end: int
    batches: tuple[Batch, ...]

    def by_base(self) -> dict[int, Batch]:
        return {b.base: b for b in self.batches}

    def record_at(self, offset: int) -> tuple[bytes | None, bytes | None] | None:
        for b in self.batches:
            if b.base <= offset <= b.last:
                return None if b.control else b.records[offset - b.base]
        return None


def read_log_dir(directory: Path, config: LogConfig) -> OfflineLog:
    """Every batch of the (stopped) log in `directory`, opened with eventlog.log.Log, recovery included."""
    batches = []
    with Log.open(directory, config) as log:
        for b in log.batches():
            h = b.header
            records = () if h.is_control else tuple((r.key, r.value) for r in b.records())
            batches.append(Batch(h.base_offset, h.last_offset, h.leader_epoch, bytes(b.raw), h.is_control,
                                 records))
        return OfflineLog(log.start_offset, log.end_offset, tuple(batches))


def compare_committed(logs: dict[int, OfflineLog], commit: int) -> tuple[int, int, int]:
    """Every log is contiguous from its start through `commit`, and every committed batch is
    byte-identical on all the logs that still hold it (compaction may have dropped it on some).

    Returns (lowest offset held by two logs or more, `commit`, batches compared between two logs or more).
    """
    holders: dict[int, list[tuple[int, Batch]]] = {}
    for node, log in logs.items():
        assert log.end > commit or log.start == commit + 1, (
            f"node {node}'s log [{log.start}, {log.end}) does not reach the commit {commit}")
        expected = log.start
        for b in log.batches:
            assert b.base == expected, f"node {node}: batch at {b.base}, expected {expected}"
            expected = b.last + 1
            if b.base <= commit:
                holders.setdefault(b.base, []).append((node, b))
    compared = 0
    shared = [base for base, held in holders.items() if len(held) > 1]
    for base, held in holders.items():
        ref_node, ref = held[0]
        for node, b in held[1:]:
            assert (b.last, b.epoch) == (ref.last, ref.epoch), (
                f"batch {base}: node {ref_node} has [{base}, {ref.last}] epoch {ref.epoch}, "
                f"node {node} has [{base}, {b.last}] epoch {b.epoch}")
            assert b.raw == ref.raw, f"batch {base} differs between node {ref_node} and node {node}"
        compared += len(held) > 1
    return (min(shared) if shared else commit + 1), commit, compared
