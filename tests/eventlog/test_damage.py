"""Damage in sealed segments (eventlog.damage): found by reads and by the scrub, never handed out, cut away.

Each case writes a log with small segments, closes it (so every sealed segment lies below the recovery
point and is trusted on open, as after a clean restart), changes bytes in the middle of a sealed
segment, opens it again and checks that: reads before the damage return exactly what was written,
a read reaching it stops before it, a read at or past it in its segment raises CorruptBatchError
naming the file and the offset, the scrub finds it without any read, the log reports it once (CRITICAL
line, listeners) and `truncate_suffix(damage.drop_offset)` removes it, after which the log takes
appends again and verifies clean offline.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.damage import Damage
from eventlog.errors import CorruptBatchError
from eventlog.log import Log
from eventlog.offline import Verdict, verify_log_dir
from eventlog.records import ATTRIBUTES_OFFSET, EPOCH_OFFSET, HEADER_SIZE, LENGTH_OFFSET, encode_batch, read_header
from eventlog.segment import segment_name

CONFIG = LogConfig(segment_bytes=8 * 1024, index_interval_bytes=512, flush_policy="fsync", max_batch_bytes=4096)


def _batch(i: int) -> bytes:
    return encode_batch([(f"k{i}-{j}".encode(), f"value {i}/{j}".encode().ljust(60, b".")) for j in range(3)],
                        timestamp_ms=1_000 + i)


def _write(path: Path, batches: int = 120) -> dict[int, bytes]:
    """A closed log of `batches` batches (epochs 1, 2, 3 by thirds); offset -> value written."""
    written = {}
    with Log.open(path, CONFIG) as log:
        for i in range(batches):
            info = log.append(_batch(i), epoch=1 + 3 * i // batches)
            for j in range(3):
                written[info.base_offset + j] = f"value {i}/{j}".encode().ljust(60, b".")
        assert len(log.segment_bases()) >= 4
    return written


def _batch_positions(path: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, size) of every batch of a segment file."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        h = read_header(data, pos)
        out.append((pos, h.base_offset, h.size))
        pos += h.size
    return out


def _damage(log_dir: Path, segment_index: int, field_offset: int | None = None, *,
            value: bytes | None = None) -> tuple[Path, int, int]:
    """Change bytes of a batch in the middle of the `segment_index`-th segment: (file, batch position,
    batch offset). `field_offset` within the batch (default: a byte of its records), `value` the new
    bytes (default: the old ones inverted)."""
    bases = sorted(int(p.name[:20]) for p in log_dir.glob("*.log"))
    path = log_dir / segment_name(bases[segment_index])
    batches = _batch_positions(path)
    pos, offset, size = batches[len(batches) // 2]
    at = pos + (field_offset if field_offset is not None else HEADER_SIZE + size // 3)
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, len(value) if value else 1, at)
        os.pwrite(fd, value if value is not None else bytes(b ^ 0xFF for b in old), at)
    finally:
        os.close(fd)
    return path, pos, offset


def _values(log: Log, lo: int, hi: int) -> dict[int, bytes | None]:
    out = {}
    offset = lo
    while offset < hi:
        chunk = log.read(offset, 1 << 20, max_offset=hi)
        if chunk.next_offset == chunk.start_offset:
            break
        for b in chunk.batches():
            out.update((r.offset, r.value) for r in b.records() if r.offset >= lo)
        offset = chunk.next_offset
    return out


@pytest.mark.parametrize("where", ["records", "length", "base offset", "epoch", "crc"])
def test_damage_in_a_trusted_sealed_segment_is_never_read(tmp_path: Path, where: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "log"
    written = _write(path)
    fields = {"records": (None, None), "length": (LENGTH_OFFSET, struct.pack(">i", 9_999)),
              "base offset": (0, struct.pack(">q", 7)), "epoch": (EPOCH_OFFSET, struct.pack(">i", 77)),
              "crc": (ATTRIBUTES_OFFSET - 4, b"\x00\x01\x02\x03")}
    field, value = fields[where]
    file, position, bad = _damage(path, 1, field, value=value)
    found: list[Damage] = []
    with caplog.at_level(logging.CRITICAL, logger="eventlog.log"), Log.open(path, CONFIG) as log:
        assert log.recovery is not None and log.recovery.segments_scanned == 1, "sealed segments are trusted on open"
        log.add_damage_listener(found.append)
        start = log.start_offset
        assert _values(log, start, bad) == {o: v for o, v in written.items() if o < bad}, "everything before it reads"
        reaching = log.read(start + 1, 1 << 20)
        assert reaching.next_offset <= bad
        with pytest.raises(CorruptBatchError) as info:
            log.read(bad)
        assert (info.value.path, info.value.offset, info.value.position) == (str(file), bad, position)
        assert info.value.retriable
        with pytest.raises(CorruptBatchError):
            log.read(bad + 1)   # past the damage in the same segment: where it starts is not known
        assert log.damage is not None and (log.damage.offset, log.damage.position) == (bad, position)
        assert len(found) == 1 and found[0] == log.damage
        critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert len(critical) == 1 and str(file) in critical[0].getMessage() and f"offset {bad}" in critical[0].getMessage()
        # the segments after the damaged one read as written
        nxt = log.damage.segment_end
        assert _values(log, nxt, log.end_offset) == {o: v for o, v in written.items() if o >= nxt}


def test_the_scrub_finds_damage_no_read_touched(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _write(path)
    file, position, bad = _damage(path, 2)
    with Log.open(path, CONFIG) as log:
        sealed = log.sealed_segments()
        scanned: list[int] = []
        found = [d for seg in sealed if (d := log.scrub_segment(seg, scanned.append)) is not None]
        assert len(found) == 1 and (found[0].path, found[0].position, found[0].offset) == (str(file), position, bad)
        assert log.damage == found[0]
        assert sum(scanned) < sum(s.size for s in sealed), "pacing sees the bytes of the valid batches"
        assert found[0].segment_base not in [s.base_offset for s in log.sealed_segments()], \
            "a damaged segment is not scrubbed again"
        with pytest.raises(CorruptBatchError):
            log.read(bad)


def test_a_whole_log_scrubs_clean(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _write(path)
    with Log.open(path, CONFIG) as log:
        assert [log.scrub_segment(s) for s in log.sealed_segments()] == [None] * len(log.sealed_segments())
        assert log.damage is None


def test_cutting_the_log_at_the_damage_removes_it(tmp_path: Path) -> None:
    path = tmp_path / "log"
    written = _write(path)
    _, _, bad = _damage(path, 1)
    with Log.open(path, CONFIG) as log:
        with pytest.raises(CorruptBatchError):
            log.read(bad)
        damage = log.damage
        assert damage is not None and damage.drop_offset == bad
        log.truncate_suffix(damage.drop_offset)
        assert log.damage is None and log.end_offset == bad
        info = log.append(_batch(999), epoch=3)
        assert info.base_offset == bad
        assert _values(log, log.start_offset, bad) == {o: v for o, v in written.items() if o < bad}
    report = verify_log_dir(path)
    assert report.verdict is Verdict.CLEAN, report.problems


def test_damage_in_a_segment_whose_indexes_are_rebuilt(tmp_path: Path) -> None:
    """A lazily opened segment whose index files do not validate is rescanned: the damage is recorded
    (not raised from the index load) and the batches before it stay readable."""
    path = tmp_path / "log"
    written = _write(path)
    file, _, bad = _damage(path, 1, LENGTH_OFFSET, value=struct.pack(">i", 5))
    file.with_suffix(".index").write_bytes(b"\x00" * 8)   # forces the rebuild
    with Log.open(path, CONFIG) as log:
        base = int(file.name[:20])
        assert _values(log, base, bad) == {o: v for o, v in written.items() if base <= o < bad}
        assert log.damage is not None and log.damage.offset == bad
        with pytest.raises(CorruptBatchError):
            log.read(bad)


def test_a_prefix_for_a_follower_never_holds_damage(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _write(path)
    _, _, bad = _damage(path, 1)
    with Log.open(path, CONFIG) as log:
        with pytest.raises(CorruptBatchError):
            log.read(bad)
        assert log.damage is not None
        end = log.segment_bases()[-1]
        _, parts = log.prefix_parts(end)
        assert parts and parts[0].base == log.damage.segment_end and parts[-1].end == end


def test_the_scrubber_thread_finds_damage_at_its_rate(tmp_path: Path) -> None:
    """Damage made while the log is open (the page cache sees the write) is found by the scrub thread
    within about one pass at its rate; the scrub never reads faster than the rate allows."""
    from eventlog.scrub import Scrubber

    path = tmp_path / "log"
    _write(path)
    with Log.open(path, CONFIG) as log:
        from eventlog.scrub import BATCH_COST_BYTES

        sealed = sum(s.size for s in log.sealed_segments())
        batches = len(_batch_positions(path / segment_name(log.segment_bases()[0]))) * len(log.sealed_segments())
        work = sealed + batches * BATCH_COST_BYTES     # each batch counts at least BATCH_COST_BYTES
        rate = 4 * work            # a pass takes about 1/4 s
        scrubber = Scrubber(lambda: {"g": log}, rate, pass_interval_s=0.05)
        scrubber.start()
        try:
            deadline = time.monotonic() + 10
            while scrubber.stats.passes < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert scrubber.stats.passes >= 2 and log.damage is None
            started, checked = time.monotonic(), scrubber.stats.bytes_checked
            _, _, bad = _damage(path, 2)
            while log.damage is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert log.damage is not None and log.damage.offset == bad
            elapsed = time.monotonic() - started
            assert scrubber.stats.damage_found == 1
            assert scrubber.stats.bytes_checked - checked <= (rate * elapsed + 2 * work) * sealed / work, "paced"
        finally:
            scrubber.close()
