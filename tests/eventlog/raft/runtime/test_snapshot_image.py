"""A snapshot sent with the key-compacted log below it (eventlog/raft/runtime/snapshot_image.py), on real
LogStorage directories: a leader whose log was cleaned by the real cleaner, a follower that stages
the image chunk by chunk and installs it.

Checked: the follower's log opens and `verify_log_dir` finds it clean; below the snapshot it holds
the leader's batches byte for byte, as cleaned segments (log start the leader's, clean_end_offset =
snapshot + 1: Raft serves no entry there, readers that need every event are told `compacted`), with
the leader's epochs; it appends after the snapshot and reopens. An image is fixed once a transfer
read from it (the cleaner swapping segments mid-transfer changes nothing sent); a listing the cleaner
made stale before the first read is rebuilt and the transfer starts over; a damaged chunk is refused
before the follower's log changes; a follower that installed a prefix sends it on; a group that
ships no prefix resets its log to start after the snapshot, as before.

Randomized chunk sizes: the seed is printed; EPOCHLOG_IMAGE_SEED=<seed> replays it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from eventlog.config import LogConfig
from eventlog.errors import LogCorruptionError
from eventlog.offline import Verdict, verify_log_dir
from eventlog.raft.errors import CompactedError
from eventlog.raft.runtime.group import full_history_start
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import ConfState, Entry, EntryKind, SnapshotMeta
from eventlog.records import encode_batch

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy="fsync", preallocate_next_segment=False)
CONF = ConfState(voters=(1, 2, 3))
CLEANER = CleanerConfig(delete_retention_ms=10**15, worker_process=False)
KEYS = 7


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_IMAGE_SEED")
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"seed={seed} (EPOCHLOG_IMAGE_SEED={seed})")
    return seed


def entries(start: int, term: int, count: int) -> list[Entry]:
    """`count` entries of two records each, over KEYS keys (so the cleaner has much to drop)."""
    out, index = [], start
    for _ in range(count):
        k = (index // 2) % KEYS
        data = encode_batch([(b"k%d" % k, b"v%d." % index + b"." * 90),
                             (b"k%d" % ((k + 3) % KEYS), b"w%d." % index + b"." * 90)], timestamp_ms=1000 + index)
        out.append(Entry(index, term, 2, EntryKind.NORMAL, data))
        index += 2
    return out


def leader_with_cleaned_log(path: Path, ships: bool = True) -> LogStorage:
    """Offsets 0-599 in terms 1-3, cleaned below 400, a snapshot at 499."""
    st = LogStorage.open(path, CFG, CONF, ships_log_prefix=ships)
    st.append(entries(0, 1, 100) + entries(200, 2, 100) + entries(400, 3, 100))
    result = clean_log(st.log, 400, CLEANER, force=True)
    assert result.records_dropped > 0 and st.log.clean_end_offset > 0
    st.create_snapshot(499, CONF, lambda p: p.write_bytes(b"views@499" * 500))
    return st


def transfer(leader: LogStorage, follower: LogStorage, rng: random.Random, *,
             between: object = None) -> SnapshotMeta:
    """What the core does: the meta, then chunks of random sizes in order; `between()` after the first."""
    meta = leader.snapshot()
    offset = 0
    while offset < meta.size:
        chunk = leader.snapshot_chunk(meta.index, offset, rng.choice([1, 7, 100, 1000, 4096, 1 << 20]))
        follower.stage_snapshot_chunk(meta, offset, chunk)
        if offset == 0 and callable(between):
            between()
        offset += len(chunk)
    return meta


def batches(st: LogStorage, lo: int, hi: int) -> list[bytes]:
    return [bytes(b.raw) for b in st.log.batches(lo, hi)]


def test_install_brings_the_leaders_cleaned_log_below_the_snapshot(tmp_path: Path) -> None:
    rng = random.Random(_seed())
    leader = leader_with_cleaned_log(tmp_path / "leader")
    follower = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
    follower.append(entries(0, 1, 30))                 # an old log of its own, replaced whole
    meta = transfer(leader, follower, rng)
    assert meta.size > leader.latest_snapshot.size, "the image carries more than the views' data"
    path = follower.install_snapshot(meta)
    assert (path / "data").read_bytes() == b"views@499" * 500 and not (path / "prefix").exists()
    log = follower.log
    assert (log.start_offset, log.end_offset, log.clean_end_offset) == (0, 500, 500)
    assert full_history_start(log) == 500, "read_events and watch answer `compacted` below it"
    assert (follower.first_index(), follower.last_index(), follower.term(499)) == (500, 499, 3)
    with pytest.raises(CompactedError):
        follower.entries(100, 200, 1 << 20)             # never served to the core as entries
    assert batches(follower, 0, 500) == batches(leader, 0, 500), "the leader's log below the snapshot"
    assert [(e, s) for e, s in log.epoch_entries] == [(e, s) for e, s in leader.log.epoch_entries if s < 500]
    assert log.cleaner_dirty_offset == min(leader.log.cleaner_dirty_offset, 500)
    follower.append(entries(500, 3, 20))
    follower.close()
    report = verify_log_dir(tmp_path / "follower" / "log")
    assert report.verdict is Verdict.CLEAN, report.problems
    again = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
    assert (again.log.start_offset, again.log.end_offset, again.log.clean_end_offset) == (0, 540, 500)
    assert batches(again, 0, 500) == batches(leader, 0, 500)
    assert [e.index for e in again.entries(500, 540, 1 << 20)] == list(range(500, 540, 2))
    # It sends what it got on: a third member ends with the same log below the snapshot.
    third = LogStorage.open(tmp_path / "third", CFG, CONF, ships_log_prefix=True)
    third.install_snapshot(transfer(again, third, rng))
    assert batches(third, 0, 500) == batches(leader, 0, 500) and third.log.clean_end_offset == 500
    for st in (leader, again, third):
        st.close()
    assert verify_log_dir(tmp_path / "third" / "log").verdict is Verdict.CLEAN


def test_an_image_is_fixed_once_read_and_rebuilt_when_stale_before(tmp_path: Path) -> None:
    rng = random.Random(_seed())
    leader = leader_with_cleaned_log(tmp_path / "leader")
    before = batches(leader, 0, 500)
    leader.append(entries(600, 3, 100))

    # The cleaner swaps segments in the middle of a transfer: what is sent is what was listed.
    follower = LogStorage.open(tmp_path / "f1", CFG, CONF, ships_log_prefix=True)
    generation = leader.log.files_generation

    def clean_more() -> None:
        clean_log(leader.log, 500, CLEANER, force=True)
        assert leader.log.files_generation != generation, "the pass swapped segments"
    follower.install_snapshot(transfer(leader, follower, rng, between=clean_more))
    assert batches(follower, 0, 500) == before != batches(leader, 0, 500)
    assert verify_log_dir(follower.log.directory).verdict is Verdict.CLEAN

    # Listed, then the log changed before any chunk was read: the transfer starts over with a new image.
    leader.create_snapshot(799, CONF, lambda p: p.write_bytes(b"views@799"))
    stale = leader.snapshot()
    clean_log(leader.log, 800, CLEANER, force=True)
    with pytest.raises(CompactedError):
        leader.snapshot_chunk(stale.index, 0, 1 << 20)
    fresh = leader.snapshot()
    assert fresh.index == stale.index and fresh.size != stale.size
    second = LogStorage.open(tmp_path / "f2", CFG, CONF, ships_log_prefix=True)
    second.install_snapshot(transfer(leader, second, rng))
    assert batches(second, 0, 800) == batches(leader, 0, 800) and second.log.clean_end_offset == 800
    for st in (leader, follower, second):
        st.close()


def test_a_damaged_image_is_refused_before_the_log_changes(tmp_path: Path) -> None:
    leader = leader_with_cleaned_log(tmp_path / "leader")
    meta = leader.snapshot()
    image = bytearray(leader.snapshot_chunk(meta.index, 0, meta.size))
    image[-50] ^= 0xFF                                  # inside the last batch of the prefix
    follower = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
    follower.append(entries(0, 1, 30))
    with pytest.raises(LogCorruptionError, match="CRC mismatch"):
        follower.stage_snapshot_chunk(meta, 0, bytes(image))
    assert (follower.log.start_offset, follower.log.end_offset, follower.latest_snapshot.index) == (0, 60, -1)
    follower.close()
    leader.close()
    reopened = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
    assert (reopened.log.end_offset, reopened.latest_snapshot.index) == (60, -1)
    reopened.close()


def test_a_group_that_ships_no_prefix_resets_its_log_after_the_snapshot(tmp_path: Path) -> None:
    leader = leader_with_cleaned_log(tmp_path / "leader", ships=False)
    follower = LogStorage.open(tmp_path / "follower", CFG, CONF)
    follower.install_snapshot(transfer(leader, follower, random.Random(0)))
    assert (follower.log.start_offset, follower.log.end_offset, follower.log.clean_end_offset) == (500, 500, 500)
    assert leader.snapshot().size - leader.latest_snapshot.size < 200, "the data and a small header"
    leader.close()
    follower.close()
