"""Leader epoch cache: which epoch (Raft term) wrote which range of offsets.

An entry ``(epoch, start_offset)`` says the first batch of `epoch` starts at `start_offset`; epochs and
start offsets both strictly increase. Raft uses it to find where two logs diverge without reading
the log entry by entry (Kafka's OffsetsForLeaderEpoch, KIP-101/KIP-279).

File `leader-epoch-checkpoint` (Kafka's text format)::

    0                 version
    2                 number of entries
    3 0               epoch start_offset
    5 1200

written atomically (temp file, fsync, rename, fsync directory) on every change. The cache is
reconciled with the log on open: entries past the log end are dropped and the recovered tail is
re-read, so a crash between a log write and a checkpoint write cannot leave them disagreeing.

Not thread-safe: owned by a `Log`, used under its lock.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

from eventlog.errors import LogCorruptionError, StaleEpochError
from eventlog.fileutil import atomic_write

CHECKPOINT_NAME = "leader-epoch-checkpoint"
_VERSION = 0


class LeaderEpochCache:
    """Ordered (epoch, start offset) entries, persisted to a checkpoint file."""

    def __init__(self, path: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries or ():
            self._epochs.append(epoch)
            self._starts.append(start)

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache:
        """Read the checkpoint (an absent file is an empty cache)."""
        try:
            text = path.read_text("ascii")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise LogCorruptionError(str(path), 0, f"unreadable: {exc}") from None
        entries = _parse(path, text)
        return cls(path, entries)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    @property
    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset` if it is new; True when the cache changed.

        Entries starting at or after `start_offset` belong to epochs that never wrote a batch (the
        log ends at `start_offset`): they are replaced.
        """
        if self._epochs:
            latest = self._epochs[-1]
            if epoch == latest:
                return False
            if epoch < latest:
                raise StaleEpochError(epoch, latest)
            self.truncate_from_end(start_offset)
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        return True

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote `offset` (None when the offset precedes every entry)."""
        i = bisect_right(self._starts, offset)
        return self._epochs[i - 1] if i else None

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int] | None:
        """Largest epoch <= `epoch` and the offset where the epoch after it starts (or the log end).

        This is Kafka's OffsetsForLeaderEpoch answer: a follower whose last epoch is `epoch` keeps its
        log below the returned offset and truncates the rest. None when the cache knows no epoch
        <= `epoch` (the follower must then fetch from the log start or a snapshot).
        """
        i = bisect_right(self._epochs, epoch)
        if i == 0:
            return None
        end = self._starts[i] if i < len(self._starts) else log_end_offset
        return self._epochs[i - 1], end

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries starting at or after `end_offset` (the log was cut there)."""
        i = len(self._starts)
        while i and self._starts[i - 1] >= end_offset:
            i -= 1
        if i == len(self._starts):
            return False
        del self._epochs[i:]
        del self._starts[i:]
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at `start_offset`: drop older entries, move the covering one up."""
        i = bisect_right(self._starts, start_offset)
        if i == 0:
            return False
        changed = i > 1 or self._starts[0] != start_offset
        del self._epochs[: i - 1]
        del self._starts[: i - 1]
        self._starts[0] = max(self._starts[0], start_offset)
        return changed

    def clear(self) -> None:
        self._epochs.clear()
        self._starts.clear()

    def write(self) -> None:
        """Persist atomically; raises LogFailedError / DiskFullError on IO failure."""
        lines = [str(_VERSION), str(len(self._epochs))]
        lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
        atomic_write(self.path, ("\n".join(lines) + "\n").encode("ascii"))


def _parse(path: Path, text: str) -> list[tuple[int, int]]:
    lines = text.splitlines()
    try:
        version = int(lines[0])
        count = int(lines[1])
        if version != _VERSION:
            raise ValueError(f"version {version}, expected {_VERSION}")
        if len(lines) != count + 2:
            raise ValueError(f"{len(lines) - 2} entries, header says {count}")
        entries = []
        for line in lines[2:]:
            epoch_s, start_s = line.split()
            entries.append((int(epoch_s), int(start_s)))
    except (ValueError, IndexError) as exc:
        raise LogCorruptionError(str(path), 0, f"malformed checkpoint: {exc}") from None
    for (e1, s1), (e2, s2) in zip(entries, entries[1:]):
        if e2 <= e1 or s2 <= s1:
            raise LogCorruptionError(str(path), 0, f"entries ({e1}, {s1}) and ({e2}, {s2}) do not increase")
    return entries
