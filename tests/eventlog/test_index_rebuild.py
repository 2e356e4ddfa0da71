"""Damaged or missing `.index` / `.timeindex` files: every read still answers right, and rebuilt
indexes are byte-identical to the ones written at append time.

Indexes are derived data written without fsync, so a crash can leave them missing, empty, cut
short or stale, and nothing stops someone from scribbling over them. A sealed segment below the
recovery point is not scanned on open: its indexes are loaded on first use (a read, a timestamp
lookup), validated against the batches, and rebuilt and rewritten when they are wrong. The checks
after each kind of damage:

- `read` at the first, a middle and the last offset of every batch returns that very batch;
- `batches()` returns the whole log byte for byte;
- `offset_for_timestamp` agrees with a brute-force answer for every segment's largest timestamp,
  every time-index entry's timestamp and its neighbours, and a sample of record timestamps
  (timestamps go up and down between batches, so the time index's running maximum matters);
- opening does not touch the index files (lazy); after first use, damaged ones equal the originals.

Seeded: EPOCHLOG_INDEX_SEED=<seed printed by the failing test> replays the damage.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import struct
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import pytest

from eventlog.config import KIB, LogConfig
from eventlog.log import OFFSETS_CHECKPOINT_NAME, Log
from eventlog.records import Record, encode_records
from eventlog.segment import INDEX_SUFFIX, TIMEINDEX_SUFFIX, segment_name

pytestmark = pytest.mark.timeout(60)

CFG = LogConfig(segment_bytes=16 * KIB, index_interval_bytes=512, max_batch_bytes=8 * KIB,
                flush_policy="fsync", preallocate_next_segment=False)
OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_INDEX_SEED")
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"\nseed={seed} (replay: EPOCHLOG_INDEX_SEED={seed})")
    return seed


@dataclass
class Original:
    """A cleanly closed log and everything a reader must get back from it."""

    directory: Path
    batches: list[tuple[int, int, bytes]]       # (base offset, last offset, raw bytes)
    records: list[tuple[int, int]]              # (offset, timestamp) in offset order
    sealed: list[int]                           # base offsets of the sealed segments
    index_files: dict[str, bytes]               # name -> bytes of every .index / .timeindex
    probes: list[int]                           # timestamps to look up

    def first_offset_at(self, timestamp: int) -> int | None:
        """Brute force: the smallest offset whose record timestamp is >= `timestamp`."""
        i = bisect_left(self._running_max, timestamp)
        return self.records[i][0] if i < len(self.records) else None

    def __post_init__(self) -> None:
        self._running_max = list(accumulate((ts for _, ts in self.records), max))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Original:
    rng = random.Random(20240601)  # the data is fixed; the damage is what varies with the seed
    directory = tmp_path_factory.mktemp("index") / "log"
    records: list[tuple[int, int]] = []
    with Log.open(directory, CFG) as log:
        offset = 0
        while len(log.segment_bases()) < 7:
            n = rng.randint(1, 5)
            recs = []
            for i in range(n):
                # Drifting upwards with noise and rare spikes: the running maximum is not the last one.
                ts = 10_000 + offset * 4 + rng.randint(-300, 300) + (5_000 if rng.random() < 0.02 else 0)
                value = rng.randbytes(rng.randint(0, 120))
                recs.append(Record(offset + i, ts, f"k{offset + i}".encode(), value))
            info = log.append(encode_records(recs), epoch=1 + offset // 400)
            assert info.base_offset == offset
            records += [(r.offset, r.timestamp) for r in recs]
            offset += n
        sealed = log.segment_bases()[:-1]
        batches = [(b.header.base_offset, b.header.last_offset, bytes(b.raw)) for b in log.batches()]
    index_files = {p.name: p.read_bytes() for p in directory.iterdir()
                   if p.name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX))}
    assert len(index_files) == 2 * len(sealed)
    probes = {-1, 0, records[-1][1] + 1}
    for base in sealed:
        ts_entries = list(TIME_ENTRY.iter_unpack(index_files[segment_name(base, TIMEINDEX_SUFFIX)]))
        assert len(ts_entries) >= 3 and len(index_files[segment_name(base, INDEX_SUFFIX)]) >= 8 * 10
        for ts, _ in ts_entries:
            probes |= {ts - 1, ts, ts + 1}
    probes |= {ts + d for _, ts in rng.sample(records, 150) for d in (-1, 0, 1)}
    return Original(directory, batches, records, sealed, index_files, sorted(probes))


# --- damage -----------------------------------------------------------------------------------

Damage = Callable[[bytes, random.Random, int], bytes]  # (file bytes, rng, entry size) -> new bytes


def _entries(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def random_bytes(data: bytes, rng: random.Random, size: int) -> bytes:
    return rng.randbytes(rng.choice([len(data), rng.randint(1, 2 * len(data))]))


def swap_entries(data: bytes, rng: random.Random, size: int) -> bytes:
    e = _entries(data, size)
    i = rng.randrange(len(e) - 1)
    e[i], e[i + 1] = e[i + 1], e[i]
    return b"".join(e)


def wrong_position(data: bytes, rng: random.Random, size: int) -> bytes:
    """The second field of an entry (position / relative offset) moved to a neighbour's or off by a bit."""
    e = _entries(data, size)
    i = rng.randrange(len(e))
    fmt = OFFSET_ENTRY if size == OFFSET_ENTRY.size else TIME_ENTRY
    first, second = fmt.unpack(e[i])
    neighbour = fmt.unpack(e[i - 1 if i else i + 1])[1]
    candidates = [neighbour, second ^ (1 << rng.randrange(8)), second + 1]
    e[i] = fmt.pack(first, rng.choice([c for c in candidates if c != second and c >= 0]))
    return b"".join(e)


def wrong_key(data: bytes, rng: random.Random, size: int) -> bytes:
    """The first field of an entry (relative offset / timestamp) changed by a little."""
    e = _entries(data, size)
    i = rng.randrange(len(e))
    fmt = OFFSET_ENTRY if size == OFFSET_ENTRY.size else TIME_ENTRY
    first, second = fmt.unpack(e[i])
    e[i] = fmt.pack(max(0, first + rng.choice([-1, 1])) if first else first + 1, second)
    return b"".join(e)


def truncate_to_zero(data: bytes, rng: random.Random, size: int) -> bytes:
    return b""


def drop_last_entries(data: bytes, rng: random.Random, size: int) -> bytes:
    return data[: len(data) - size * rng.randint(1, min(3, len(data) // size))]


def truncate_mid_entry(data: bytes, rng: random.Random, size: int) -> bytes:
    return data[: rng.randrange(1, len(data)) // size * size + rng.randint(1, size - 1)]


def extra_entry(data: bytes, rng: random.Random, size: int) -> bytes:
    """A stale entry past the end (an index of a longer incarnation of the segment)."""
    last = _entries(data, size)[-1]
    fmt = OFFSET_ENTRY if size == OFFSET_ENTRY.size else TIME_ENTRY
    first, second = fmt.unpack(last)
    return data + fmt.pack(first + 1_000, second + 1_000)


DAMAGES: dict[str, Damage] = {f.__name__: f for f in (
    random_bytes, swap_entries, wrong_position, wrong_key, truncate_to_zero, drop_last_entries,
    truncate_mid_entry, extra_entry)}


# --- checks -----------------------------------------------------------------------------------


def check_timestamps(log: Log, original: Original, ctx: str) -> None:
    for ts in original.probes:
        assert log.offset_for_timestamp(ts) == original.first_offset_at(ts), f"{ctx}: timestamp {ts}"


def check_reads(log: Log, original: Original, ctx: str) -> None:
    for base, last, raw in original.batches:
        for offset in {base, (base + last) // 2, last}:
            read = log.read(offset, 1)
            assert (read.start_offset, read.next_offset) == (base, last + 1), f"{ctx}: read({offset})"
            assert bytes(read.data) == raw, f"{ctx}: read({offset}) bytes"
    assert b"".join(bytes(b.raw) for b in log.batches()) == b"".join(r for _, _, r in original.batches), ctx


def check_everything(directory: Path, original: Original, damaged: dict[str, bytes | None], ctx: str,
                     caplog: pytest.LogCaptureFixture, *, timestamps_first: bool) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eventlog.segment"), Log.open(directory, CFG) as log:
        assert log.recovery is not None and log.recovery.segments_scanned == 1, f"{ctx}: sealed ones are lazy"
        for name, data in damaged.items():  # opening does not look at sealed segments' indexes
            assert _read_or_none(directory / name) == data, f"{ctx}: {name} touched by open"
        if timestamps_first:
            check_timestamps(log, original, ctx)
            check_reads(log, original, ctx)
        else:
            check_reads(log, original, ctx)
            check_timestamps(log, original, ctx)
    for name, data in original.index_files.items():
        assert _read_or_none(directory / name) == data, f"{ctx}: {name} differs from the original after use"
    # Only the damaged segments were rebuilt: good indexes pass validation as they are.
    rebuilt = {Path(r.args[0]).name[:20] for r in caplog.records if r.msg.startswith("rebuilding")}
    assert rebuilt == {name[:20] for name in damaged}, ctx


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def fresh_copy(original: Original, directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(original.directory, directory)
    (directory / ".lock").unlink(missing_ok=True)
    return directory


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["index", "timeindex", "both"])
def test_deleted_index_files_are_rebuilt(tmp_path: Path, original: Original, which: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    directory = fresh_copy(original, tmp_path / "log")
    damaged: dict[str, bytes | None] = {}
    for base in original.sealed:
        for suffix in {"index": [INDEX_SUFFIX], "timeindex": [TIMEINDEX_SUFFIX],
                       "both": [INDEX_SUFFIX, TIMEINDEX_SUFFIX]}[which]:
            (directory / segment_name(base, suffix)).unlink()
            damaged[segment_name(base, suffix)] = None
    check_everything(directory, original, damaged, f"deleted {which}", caplog,
                     timestamps_first=which == "timeindex")


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_scribbled_index_files(tmp_path: Path, original: Original, damage: str,
                               caplog: pytest.LogCaptureFixture) -> None:
    seed = _seed()
    rng = random.Random(f"{seed}:{damage}")
    for trial in range(3):
        directory = fresh_copy(original, tmp_path / "log")
        damaged: dict[str, bytes | None] = {}
        for base in rng.sample(original.sealed, rng.randint(1, 3)):
            for suffix, size in rng.choice([[(INDEX_SUFFIX, 8)], [(TIMEINDEX_SUFFIX, 12)],
                                            [(INDEX_SUFFIX, 8), (TIMEINDEX_SUFFIX, 12)]]):
                name = segment_name(base, suffix)
                data = DAMAGES[damage](original.index_files[name], rng, size)
                assert data != original.index_files[name], (damage, name)
                (directory / name).write_bytes(data)
                damaged[name] = data
        ctx = f"seed={seed} {damage} trial={trial} files={sorted(damaged)}"
        check_everything(directory, original, damaged, ctx, caplog, timestamps_first=bool(trial % 2))


def test_damaged_indexes_of_scanned_segments(tmp_path: Path, original: Original,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """With the recovery point lost, every segment is scanned on open and indexed from the scan: the
    damaged files are not even read. Once closed cleanly, the next open trusts the segments again,
    and their files are validated (and rebuilt) on first use."""
    seed = _seed()
    rng = random.Random(seed)
    directory = fresh_copy(original, tmp_path / "log")
    damaged: dict[str, bytes | None] = {}
    for base in original.sealed:
        name = segment_name(base, rng.choice([INDEX_SUFFIX, TIMEINDEX_SUFFIX]))
        entry_size = 8 if name.endswith(INDEX_SUFFIX) else 12
        data = DAMAGES[rng.choice(sorted(DAMAGES))](original.index_files[name], rng, entry_size)
        (directory / name).write_bytes(data)
        damaged[name] = data
    (directory / OFFSETS_CHECKPOINT_NAME).write_bytes(b"0\n0 0\n")
    with Log.open(directory, CFG) as log:
        assert log.recovery is not None and log.recovery.segments_scanned == len(original.sealed) + 1
        check_reads(log, original, f"seed={seed} scanned")
        check_timestamps(log, original, f"seed={seed} scanned")
    check_everything(directory, original, damaged, f"seed={seed} lazy after scan", caplog,
                     timestamps_first=True)
