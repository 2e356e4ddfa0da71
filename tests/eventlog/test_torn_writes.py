"""Torn writes, zeroed pages, flipped bytes and garbage in segment files: what recovery must do.

Every test works on a *crash image*: the bytes of a log directory copied while the log is still
open, which is what a crash leaves (the checkpoints say what they said at that moment, the active
segment is preallocated and zero past its data). A fault is applied to the image's bytes, the image
is written to a fresh directory and opened. The fault classes and what each may do:

- a torn tail (an append cut short, or unwritten pages at the end): recovery cuts exactly the
  damaged bytes, keeps every batch before them, and the cut region is zero on disk afterwards;
- damage followed by a valid batch, damage in a segment that has a successor, or damage below the
  recovery point: `LogCorruptionError` naming the file and the byte position, unless the log is
  opened with `repair=True`, which cuts there and reports it;
- garbage after the last batch is a torn tail; a preallocated zero region is not damage at all.

Seeded: EPOCHLOG_TORN_SEED=<seed printed by the failing test> replays the random choices.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventlog.config import KIB, LogConfig
from eventlog.errors import LogCorruptionError
from eventlog.log import OFFSETS_CHECKPOINT_NAME, Log
from eventlog.records import encode_batch
from eventlog.segment import segment_name

pytestmark = pytest.mark.timeout(60)

PAGE = 4096
CFG = LogConfig(segment_bytes=64 * KIB, index_interval_bytes=1 * KIB, max_batch_bytes=16 * KIB,
                flush_policy="fsync", preallocate_next_segment=False)
# Files a crash image leaves out: the lock is per process, the preallocated file is a leftover.
_SKIP = {".lock", "preallocated.tmp"}


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_TORN_SEED")
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"\nseed={seed} (replay: EPOCHLOG_TORN_SEED={seed})")
    return seed


@dataclass(frozen=True)
class Placed:
    """Where an appended batch went."""

    segment: str  # file name of its segment
    position: int
    size: int
    base_offset: int
    last_offset: int

    @property
    def end(self) -> int:
        return self.position + self.size


Image = dict[str, bytes]


def payload(i: int, size: int = 120) -> bytes:
    """Varied bytes with zero runs inside, so the non-zero extent of a cut batch is not just its length."""
    body = bytes((i * 37 + j * 11) % 251 for j in range(size))
    return body[: size // 2] + bytes(size // 8) + body[size // 2:]


def make_batch(i: int, records: int = 3, size: int = 120) -> bytes:
    return encode_batch([(f"key-{i}-{r}".encode(), payload(i + r, size)) for r in range(records)],
                        timestamp_ms=1_000_000 + i)


def build(directory: Path, batches: list[bytes], *, epochs: list[int] | None = None,
          crash: bool = True) -> tuple[Image, list[Placed]]:
    """Append `batches`; return the directory's bytes while open (crash) or after a clean close."""
    log = Log.open(directory, CFG)
    placed = []
    try:
        for i, b in enumerate(batches):
            info = log.append(b, epoch=epochs[i] if epochs else 1)
            seg = segment_name(log.segment_bases()[-1])
            placed.append(Placed(seg, info.position, info.size, info.base_offset, info.last_offset))
        if crash:
            image = read_image(directory)
    finally:
        log.close()
    if not crash:
        image = read_image(directory)
    return image, placed


def read_image(directory: Path) -> Image:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.name not in _SKIP}


def write_image(directory: Path, image: Image, **changes: bytes) -> None:
    """Make `directory` hold exactly `image` with the files in `changes` replaced."""
    directory.mkdir(parents=True, exist_ok=True)
    for p in directory.iterdir():
        if p.name not in image and p.name != ".lock":
            p.unlink()
    for name, data in image.items():
        (directory / name).write_bytes(changes.get(name, data))


def extent(data: bytes | bytearray) -> int:
    """One past the last non-zero byte."""
    return len(bytes(data).rstrip(b"\x00"))


def log_bytes(log: Log) -> bytes:
    """Every batch of the log, end to end."""
    return b"".join(bytes(b.raw) for b in log.batches())


def image_bytes(image: Image, placed: list[Placed]) -> bytes:
    return b"".join(image[p.segment][p.position:p.end] for p in placed)


def assert_reappends(log: Log, placed: Placed, image: Image, directory: Path) -> None:
    """Append the cut batch again: it lands where it was, byte for byte (same offset and epoch)."""
    original = image[placed.segment][placed.position:placed.end]
    info = log.append(original, epoch=int.from_bytes(original[12:16], "big"))
    assert (info.base_offset, info.position) == (placed.base_offset, placed.position)
    assert (directory / placed.segment).read_bytes()[placed.position:placed.end] == original


# --- (a) the last batch cut at every byte ------------------------------------------------------


@pytest.mark.parametrize("rolled", [False, True], ids=["first-segment", "after-roll"])
def test_last_batch_cut_at_every_byte(tmp_path: Path, rolled: bool) -> None:
    count = 150 if rolled else 6  # 150 batches of ~450 bytes fill a 64 KiB segment
    batches = [make_batch(i) for i in range(count)] + [make_batch(count, records=2, size=140)]
    image, placed = build(tmp_path / "src", batches)
    last = placed[-1]
    seg = last.segment
    assert 250 <= last.size <= 450, last.size
    if rolled:
        assert placed[0].segment != seg, "the log must have rolled"
    kept = placed[:-1]
    directory = tmp_path / "log"
    for cut in range(last.size):
        data = bytearray(image[seg])
        data[last.position + cut:last.end] = bytes(last.size - cut)
        if data == image[seg]:
            # Only zeros were cut (a batch ends with a zero header count): the batch is complete.
            assert cut >= extent(image[seg][last.position:last.end])
            continue
        torn = extent(data[last.position:last.position + cut])
        write_image(directory, image, **{seg: bytes(data)})
        with Log.open(directory, CFG) as log:
            ctx = f"cut after {cut} of {last.size} bytes"
            rec = log.recovery
            assert rec is not None and not rec.repaired, ctx
            assert rec.bytes_truncated == torn, ctx
            if torn:
                assert rec.truncated_file == str(directory / seg), ctx
                assert rec.truncated_position == last.position, ctx
            assert log.end_offset == last.base_offset, ctx
            assert log_bytes(log) == image_bytes(image, kept), ctx
            on_disk = (directory / seg).read_bytes()
            assert on_disk[:last.position] == image[seg][:last.position], ctx
            assert extent(on_disk) == extent(image[seg][:last.position]), f"{ctx}: the cut is not zero"
            assert_reappends(log, last, image, directory)


# --- (b) random pages of the tail zeroed --------------------------------------------------------


def test_zeroed_tail_pages(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    batches: list[bytes] = []
    while sum(map(len, batches)) < 40 * KIB:  # about ten pages, well within one segment
        batches.append(make_batch(len(batches), records=rng.randint(1, 6), size=rng.randint(20, 400)))
    image, placed = build(tmp_path / "src", batches)
    seg = placed[-1].segment
    assert all(p.segment == seg for p in placed)
    data_end = placed[-1].end
    last_page = (data_end - 1) // PAGE
    pages = list(range(max(0, last_page - 5), last_page + 2))  # the tail, and one page past the data
    directory = tmp_path / "log"
    outcomes = {"clean": 0, "torn": 0, "corrupt": 0}
    for trial in range(60):
        ctx = f"seed={seed} trial={trial}"
        if trial % 3 == 0:
            first = rng.choice(pages[:-1])
            zeroed = list(range(first, last_page + 1))  # a run to the end: always a torn tail
        else:
            zeroed = sorted(rng.sample(pages, rng.randint(1, 3)))
        data = bytearray(image[seg])
        for page in zeroed:
            data[page * PAGE:(page + 1) * PAGE] = bytes(PAGE)
        ctx += f" zeroed pages {zeroed}"
        damaged = [i for i, p in enumerate(placed) if data[p.position:p.end] != image[seg][p.position:p.end]]
        write_image(directory, image, **{seg: bytes(data)})
        if not damaged:
            outcomes["clean"] += 1
            with Log.open(directory, CFG) as log:
                assert log.recovery is not None and log.recovery.bytes_truncated == 0, ctx
                assert log.end_offset == placed[-1].last_offset + 1, ctx
            continue
        first_bad = placed[damaged[0]]
        valid_after = any(i not in damaged for i in range(damaged[0] + 1, len(placed)))
        if valid_after:
            outcomes["corrupt"] += 1
            with pytest.raises(LogCorruptionError) as err:
                Log.open(directory, CFG)
            assert (err.value.path, err.value.position) == (str(directory / seg), first_bad.position), ctx
            assert "valid batch follows" in err.value.reason, ctx
            continue
        outcomes["torn"] += 1
        with Log.open(directory, CFG) as log:
            rec = log.recovery
            assert rec is not None and not rec.repaired, ctx
            assert rec.bytes_truncated == max(0, extent(data) - first_bad.position), ctx
            assert log.end_offset == first_bad.base_offset, ctx
            assert log_bytes(log).endswith(image[seg][:first_bad.position]), ctx
            on_disk = (directory / seg).read_bytes()
            assert extent(on_disk) <= first_bad.position, f"{ctx}: the torn part is not zero"
            assert_reappends(log, first_bad, image, directory)
    assert outcomes["torn"] and outcomes["corrupt"], outcomes


# --- (c) flipped bytes in the middle of the log ------------------------------------------------


def _flip(data: bytes, position: int, rng: random.Random) -> bytes:
    out = bytearray(data)
    out[position] ^= rng.randint(1, 255)
    return bytes(out)


def test_flip_in_active_segment_followed_by_valid_batches(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(30)])
    seg = placed[-1].segment
    directory = tmp_path / "log"
    for trial in range(25):
        k = rng.randrange(len(placed) - 1)
        victim = placed[k]
        # Anywhere the CRC covers (magic, crc, attributes .. records) or the length field.
        at = victim.position + rng.choice([rng.randrange(8, 12), rng.randrange(16, victim.size)])
        ctx = f"seed={seed} trial={trial}: byte {at} of batch {k} at {victim.position}"
        write_image(directory, image, **{seg: _flip(image[seg], at, rng)})
        with pytest.raises(LogCorruptionError) as err:
            Log.open(directory, CFG)
        assert (err.value.path, err.value.position) == (str(directory / seg), victim.position), ctx
        with Log.open(directory, CFG, repair=True) as log:
            rec = log.recovery
            assert rec is not None and rec.repaired, ctx
            assert rec.truncated_file == str(directory / seg), ctx
            assert rec.truncated_position == victim.position, ctx
            assert log.end_offset == victim.base_offset, ctx
            assert log_bytes(log) == image_bytes(image, placed[:k]), ctx
            assert extent((directory / seg).read_bytes()) <= victim.position, ctx
            assert_reappends(log, victim, image, directory)
        with Log.open(directory, CFG) as log:  # repaired for good: a plain open is clean
            rec = log.recovery
            assert rec is not None and rec.bytes_truncated == 0 and not rec.repaired
            assert log.end_offset == victim.last_offset + 1, ctx


@pytest.mark.parametrize("field,position,mask", [
    ("base offset bit 14", 6, 0x40), ("base offset bit 0", 7, 0x01), ("leader epoch bit 22", 14, 0x40),
    ("leader epoch bit 1", 15, 0x02)])
def test_flip_outside_the_crc(tmp_path: Path, field: str, position: int, mask: int) -> None:
    """baseOffset and partitionLeaderEpoch are outside the CRC: the batch's own checks cannot see a
    flip there, only the offset chain and the leader epoch checkpoint can. Either way it is
    corruption at that batch, whether it makes the batch look earlier or later."""
    epochs = [1] * 4 + [2] * 4 + [3] * 4
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(12)], epochs=epochs)
    seg = placed[-1].segment
    directory = tmp_path / "log"
    for k in (0, 3, 4, len(placed) - 2):  # first batch, inside an epoch, an epoch's first batch
        victim = placed[k]
        data = bytearray(image[seg])
        data[victim.position + position] ^= mask
        write_image(directory, image, **{seg: bytes(data)})
        with pytest.raises(LogCorruptionError) as err:
            Log.open(directory, CFG)
        assert (err.value.path, err.value.position) == (str(directory / seg), victim.position), (field, k)
        with Log.open(directory, CFG, repair=True) as log:
            assert log.end_offset == victim.base_offset, (field, k)
            epochs = [(1, 0), (2, 12), (3, 24)]
            assert log.epoch_entries == [(e, s) for e, s in epochs if s < victim.base_offset]


def test_flip_in_sealed_segment_with_successor(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(400)])
    segments = sorted({p.segment for p in placed})
    assert len(segments) >= 3
    # A crash right after a roll, before the checkpoint moved: rp is 0, every segment is scanned.
    image[OFFSETS_CHECKPOINT_NAME] = b"0\n0 0\n"
    directory = tmp_path / "log"
    for seg_index, which in [(0, "last"), (1, "middle"), (0, "first"), (1, "last")]:
        seg = segments[seg_index]
        in_seg = [p for p in placed if p.segment == seg]
        k = {"first": 0, "middle": len(in_seg) // 2, "last": len(in_seg) - 1}[which]
        victim = in_seg[k]
        at = victim.position + rng.randrange(16, victim.size)
        ctx = f"seed={seed}: {which} batch of segment {seg} (byte {at})"
        flipped = _flip(image[seg], at, rng)
        write_image(directory, image, **{seg: flipped})
        with pytest.raises(LogCorruptionError) as err:
            Log.open(directory, CFG)
        assert (err.value.path, err.value.position) == (str(directory / seg), victim.position), ctx
        with Log.open(directory, CFG, repair=True) as log:
            rec = log.recovery
            assert rec is not None and rec.repaired, ctx
            assert rec.truncated_file == str(directory / seg), ctx
            assert rec.truncated_position == victim.position, ctx
            assert rec.bytes_truncated == extent(flipped) - victim.position, ctx
            assert log.segment_bases() == [int(s[:20]) for s in segments[:seg_index + 1]], ctx
            assert log.end_offset == victim.base_offset, ctx
            kept = placed[:placed.index(victim)]
            assert log_bytes(log) == image_bytes(image, kept), ctx
            assert not any((directory / s).exists() for s in segments[seg_index + 1:]), ctx
            assert all(start < log.end_offset for _, start in log.epoch_entries), ctx
            assert_reappends(log, victim, image, directory)
        with Log.open(directory, CFG) as log:
            rec = log.recovery
            assert rec is not None and not rec.repaired and rec.bytes_truncated == 0


def test_damage_below_the_recovery_point_is_corruption_even_at_the_end(tmp_path: Path) -> None:
    """After a clean close the recovery point is the log end: the last batch was flushed, so damage
    to it is corruption, although nothing valid follows it (it would be a torn tail otherwise)."""
    seed = _seed()
    rng = random.Random(seed)
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(10)], crash=False)
    last = placed[-1]
    directory = tmp_path / "log"
    at = last.position + rng.randrange(16, last.size)
    write_image(directory, image, **{last.segment: _flip(image[last.segment], at, rng)})
    with pytest.raises(LogCorruptionError) as err:
        Log.open(directory, CFG)
    assert (err.value.path, err.value.position) == (str(directory / last.segment), last.position)
    assert "recovery point" in err.value.reason
    with Log.open(directory, CFG, repair=True) as log:
        assert log.recovery is not None and log.recovery.repaired
        assert log.end_offset == last.base_offset


def test_damage_in_a_trusted_segment_is_found_when_the_checkpoint_is_lost(tmp_path: Path) -> None:
    """Sealed segments below the recovery point are not scanned on open; a malformed offsets
    checkpoint makes open scan everything, and then damage there is found."""
    seed = _seed()
    rng = random.Random(seed)
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(300)], crash=False)
    first = [p for p in placed if p.segment == placed[0].segment]
    victim = first[len(first) // 2]
    at = victim.position + rng.randrange(16, victim.size)
    directory = tmp_path / "log"
    image[victim.segment] = _flip(image[victim.segment], at, rng)
    write_image(directory, image)
    with Log.open(directory, CFG) as log:  # trusted: not scanned, the open is clean
        assert log.recovery is not None and log.recovery.segments_scanned == 1
    write_image(directory, image, **{OFFSETS_CHECKPOINT_NAME: b"garbage"})
    with pytest.raises(LogCorruptionError) as err:
        Log.open(directory, CFG)
    assert (err.value.path, err.value.position) == (str(directory / victim.segment), victim.position)


def test_crash_after_repair_is_a_torn_tail_again(tmp_path: Path) -> None:
    """A repair cuts the log below the recovery point the checkpoint still holds; a crash soon after
    must still be recovered as a crash (torn tail cut), not refused as corruption."""
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(20)], crash=False)
    victim = placed[5]
    seg = victim.segment
    directory = tmp_path / "log"
    write_image(directory, image, **{seg: _flip(image[seg], victim.position + 40, random.Random(1))})
    log = Log.open(directory, CFG, repair=True)
    try:
        assert log.end_offset == victim.base_offset
        for i in range(3):
            log.append(make_batch(100 + i), epoch=1)
        crash = read_image(directory)
        tail = log.append(make_batch(200), epoch=1)
        crash_with_tail = read_image(directory)
    finally:
        log.close()
    torn = bytearray(crash_with_tail[seg])
    torn[tail.position + tail.size // 2:tail.position + tail.size] = bytes(tail.size - tail.size // 2)
    crash_with_tail[seg] = bytes(torn)
    for name in crash_with_tail:  # the checkpoints as they were before the last append
        if name != seg:
            crash_with_tail[name] = crash.get(name, crash_with_tail[name])
    write_image(tmp_path / "after", crash_with_tail)
    with Log.open(tmp_path / "after", CFG) as log:
        assert log.recovery is not None and not log.recovery.repaired
        assert log.recovery.bytes_truncated == extent(torn[tail.position:tail.position + tail.size])
        assert log.end_offset == tail.base_offset


# --- (d) garbage after the last batch -----------------------------------------------------------


def test_garbage_after_the_last_batch_is_cut(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(20)])
    last = placed[-1]
    seg = last.segment
    directory = tmp_path / "log"
    other = image[seg][placed[3].position:placed[3].end]
    for trial in range(30):
        kind = ("random", "partial batch", "magic bytes")[trial % 3]
        if kind == "random":
            garbage = rng.randbytes(rng.randint(1, 3000))
        elif kind == "partial batch":  # the start of a real batch: a header that promises more
            garbage = other[:rng.randint(1, len(other) - 1)]
        else:  # plausible headers with broken CRCs
            garbage = b"".join(_flip(other, rng.randrange(21, len(other)), rng) for _ in range(3))
        garbage = garbage.rstrip(b"\x00") or b"\x01"
        ctx = f"seed={seed} trial={trial} {kind} ({len(garbage)} bytes)"
        data = bytearray(image[seg])
        data[last.end:last.end + len(garbage)] = garbage
        write_image(directory, image, **{seg: bytes(data)})
        with Log.open(directory, CFG) as log:
            rec = log.recovery
            assert rec is not None and not rec.repaired, ctx
            assert rec.bytes_truncated == len(garbage), ctx
            assert (rec.truncated_file, rec.truncated_position) == (str(directory / seg), last.end), ctx
            assert log.end_offset == last.last_offset + 1, ctx
            assert extent((directory / seg).read_bytes()) == extent(image[seg][:last.end]), ctx


# --- (e) zeros are not damage -------------------------------------------------------------------


def test_preallocated_zero_region_alone_is_clean(tmp_path: Path) -> None:
    image, _ = build(tmp_path / "src", [])
    (name,) = [n for n in image if n.endswith(".log")]
    assert len(image[name]) == CFG.segment_bytes and extent(image[name]) == 0
    write_image(tmp_path / "log", image)
    with Log.open(tmp_path / "log", CFG) as log:
        rec = log.recovery
        assert rec is not None and rec.bytes_truncated == 0 and not rec.repaired and rec.problem is None
        assert (log.start_offset, log.end_offset) == (0, 0)
        log.append(make_batch(0), epoch=1)
    with Log.open(tmp_path / "log", CFG) as log:
        assert log.recovery is not None and log.recovery.bytes_truncated == 0 and log.end_offset == 3


def test_zeros_after_the_data_are_clean_in_active_and_untrimmed_sealed_segments(tmp_path: Path) -> None:
    image, placed = build(tmp_path / "src", [make_batch(i) for i in range(200)])
    segments = sorted({p.segment for p in placed})
    # A crash inside a roll: the old segment not yet trimmed, the checkpoint not yet moved.
    sealed = segments[0]
    image[sealed] = image[sealed] + bytes(CFG.segment_bytes - len(image[sealed]))
    image[OFFSETS_CHECKPOINT_NAME] = b"0\n0 0\n"
    write_image(tmp_path / "log", image)
    with Log.open(tmp_path / "log", CFG) as log:
        rec = log.recovery
        assert rec is not None and rec.bytes_truncated == 0 and not rec.repaired
        assert rec.segments_scanned == len(segments)
        assert log.end_offset == placed[-1].last_offset + 1
        assert log_bytes(log) == image_bytes(image, placed)
    size = max(p.end for p in placed if p.segment == sealed)
    assert (tmp_path / "log" / sealed).stat().st_size == size, "the sealed segment is trimmed on open"
