"""A log prefix installed with a snapshot: the journal that makes `Log.reset(offset, prefix)` crash-safe.

A key-compacted group keeps its log from its start: readers of the Kafka topic rebuild every key from
offset 0. A follower that installs a snapshot at N replaces its whole log, so it takes the leader's
log below N + 1 with it (the *prefix*: the leader's cleaned segments and its as-written ones, the last
cut at N + 1; eventlog/raft/runtime/snapshot_image.py ships them). Its log becomes those segments,
each recorded as cleaned in the cleaner checkpoint (so `clean_end_offset` = N + 1: Raft never serves
them as entries, `read_events` answers `compacted` below), then an empty active segment at N + 1.

`prefix-install` (ASCII, written atomically), present only while an install is under way::

    0                           version
    end <offset>                N + 1: where the active segment starts
    dirty <offset>              the cleaner's dirty offset once installed (the leader's, at most end)
    part <base> <end> <size>    one line per prefix segment, in order, contiguous up to `end`
    epoch <epoch> <start>       the leader epoch cache below `end` (from the parts' batches)

Steps (`Log.reset` with a prefix; the part files wait in a directory of the caller's, named as
segments):

1. hard-link every part's files into the log directory as `<base>.log.prefix` (and its index files,
   derived data, when there are: `<base>.index.prefix`...); fsync the directory;
2. write `prefix-install`: the commit point;
3. delete every segment file of the old log (`.log`, `.index`, `.timeindex`); fsync the directory;
4. rename each part's `.prefix` files to their names, the log file last; fsync the directory;
5. write the cleaner checkpoint (a `segment` line per part, the new dirty offset), the leader epoch
   checkpoint and the offsets checkpoint (log start: the first part's base; recovery point: `end`);
6. create the active segment `<end>.log`; fsync the directory;
7. delete `prefix-install`; fsync the directory.

`Log.open` with `prefix-install` present rolls forward from step 3 (`replace_segments` then steps
5-7). Step 3 runs again only if no part was renamed yet (every `.prefix` file still there): once
one was, every old file was already gone, so a plain segment file of a part is the new one. Without
the journal a `.prefix` file is a leftover of step 1, deleted like a `.cleaned` one.

Not thread-safe: the log calls these under its files lock (or while opening).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from eventlog.errors import LogCorruptionError
from eventlog.fileutil import atomic_write, fsync_dir, io_error
from eventlog.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, parse_segment_name, segment_name

JOURNAL_NAME = "prefix-install"
PREFIX_SUFFIX = ".prefix"


@dataclass(frozen=True, slots=True)
class PrefixPart:
    """One segment of a prefix: bytes [0, size) of its file cover offsets [base, end)."""

    base: int
    end: int
    size: int


@dataclass(frozen=True, slots=True)
class PrefixInstall:
    """What a log holds below `end` once a prefix is installed (the contents of `prefix-install`)."""

    end: int
    dirty_offset: int
    parts: tuple[PrefixPart, ...]
    epochs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        check_parts(self.parts, self.end)
        assert self.parts[0].base <= self.dirty_offset <= self.end, (self.dirty_offset, self.parts[0], self.end)

    @property
    def start(self) -> int:
        return self.parts[0].base

    def encode(self) -> bytes:
        lines = ["0", f"end {self.end}", f"dirty {self.dirty_offset}"]
        lines += [f"part {p.base} {p.end} {p.size}" for p in self.parts]
        lines += [f"epoch {e} {s}" for e, s in self.epochs]
        return ("\n".join(lines) + "\n").encode("ascii")

    def write(self, directory: Path) -> None:
        atomic_write(directory / JOURNAL_NAME, self.encode())

    @classmethod
    def load(cls, directory: Path) -> PrefixInstall | None:
        """The journal in `directory`, None when there is none. Written atomically: a malformed one is
        damage, refused (which files are old and which new is exactly what it says)."""
        path = directory / JOURNAL_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            lines = raw.decode("ascii").splitlines()
            if not lines or lines[0] != "0":
                raise ValueError(f"version line {lines[:1]}")
            end = dirty = None
            parts: list[PrefixPart] = []
            epochs: list[tuple[int, int]] = []
            for line in lines[1:]:
                kind, *values = line.split()
                numbers = [int(v) for v in values]
                if kind == "end" and len(numbers) == 1:
                    end = numbers[0]
                elif kind == "dirty" and len(numbers) == 1:
                    dirty = numbers[0]
                elif kind == "part" and len(numbers) == 3:
                    parts.append(PrefixPart(*numbers))
                elif kind == "epoch" and len(numbers) == 2:
                    epochs.append((numbers[0], numbers[1]))
                else:
                    raise ValueError(f"line {line!r}")
            if end is None or dirty is None or not parts:
                raise ValueError("no end, dirty or part line")
            check_parts(parts, end)
            if not parts[0].base <= dirty <= end:
                raise ValueError(f"dirty offset {dirty} outside [{parts[0].base}, {end}]")
        except (ValueError, UnicodeDecodeError) as exc:
            raise LogCorruptionError(str(path), 0, f"malformed prefix install journal: {exc}") from None
        return cls(end, dirty, tuple(parts), tuple(epochs))

    @staticmethod
    def remove(directory: Path) -> None:
        try:
            os.unlink(directory / JOURNAL_NAME)
            fsync_dir(directory)
        except OSError as exc:
            raise io_error(f"removing {directory / JOURNAL_NAME}", exc) from exc


def check_parts(parts: tuple[PrefixPart, ...] | list[PrefixPart], end: int) -> None:
    """ValueError unless `parts` are non-empty, each non-empty in offsets, contiguous, ending at `end`."""
    if not parts:
        raise ValueError("a prefix has at least one part")
    for i, p in enumerate(parts):
        if not (p.base < p.end and p.size >= 0):
            raise ValueError(f"part {p}")
        if i and parts[i - 1].end != p.base:
            raise ValueError(f"part {p} does not start where the previous one ends ({parts[i - 1].end})")
    if parts[-1].end != end:
        raise ValueError(f"the last part ends at {parts[-1].end}, not {end}")


def prefix_path(directory: Path, base: int, suffix: str = LOG_SUFFIX) -> Path:
    return directory / (segment_name(base, suffix) + PREFIX_SUFFIX)


# Index files first, the log file last (as eventlog.cleaned renames): once a part's log file has its
# final name, so have its indexes. Indexes are derived data: linked and renamed when present.
_SUFFIXES = (INDEX_SUFFIX, TIMEINDEX_SUFFIX, LOG_SUFFIX)


def link_parts(source: Path, directory: Path, parts: tuple[PrefixPart, ...]) -> None:
    """Step 1: hard-link the files of every part (`<source>/<base>.log`, after checking its size, and
    its index files if there) into `directory` as `<name>.prefix`, then fsync `directory`."""
    for p in parts:
        path = source / segment_name(p.base)
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise io_error(f"reading prefix part {path}", exc) from exc
        if size != p.size:
            raise LogCorruptionError(str(path), size, f"prefix part of {size} bytes, expected {p.size}")
        for suffix in _SUFFIXES:
            origin, target = source / segment_name(p.base, suffix), prefix_path(directory, p.base, suffix)
            try:
                if os.path.lexists(target):   # a leftover of an earlier attempt
                    target.unlink()
                os.link(origin, target)
            except FileNotFoundError:
                if suffix == LOG_SUFFIX:
                    raise
            except OSError as exc:
                raise io_error(f"linking {origin} to {target}", exc) from exc
    fsync_dir(directory)


def replace_segments(directory: Path, install: PrefixInstall) -> None:
    """Steps 3 and 4 (also what open does to roll an interrupted install forward, see the module
    docstring): the old segment files go, the parts take their names."""
    renamed = any(not prefix_path(directory, p.base).exists() for p in install.parts)
    try:
        if not renamed:
            for path in list(directory.iterdir()):
                stem, _, suffix = path.name.partition(".")
                if parse_segment_name(stem + LOG_SUFFIX) is not None and "." + suffix in _SUFFIXES:
                    path.unlink()
            fsync_dir(directory)
        for p in install.parts:
            if not prefix_path(directory, p.base).exists():
                if not (directory / segment_name(p.base)).exists():
                    raise LogCorruptionError(str(prefix_path(directory, p.base)), 0, f"prefix part {p.base} is "
                                             f"neither {segment_name(p.base)}{PREFIX_SUFFIX} nor {segment_name(p.base)}")
                continue
            for suffix in _SUFFIXES:
                source = prefix_path(directory, p.base, suffix)
                if suffix == LOG_SUFFIX or source.exists():
                    os.rename(source, directory / segment_name(p.base, suffix))
        fsync_dir(directory)
    except OSError as exc:
        raise io_error(f"installing a log prefix in {directory}", exc) from exc
