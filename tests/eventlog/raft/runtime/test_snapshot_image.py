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

import msgspec
import pytest

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from eventlog.config import LogConfig
from eventlog.errors import LogCorruptionError
from eventlog.offline import Verdict, verify_log_dir
from eventlog.raft.errors import CompactedError
from eventlog.raft.runtime.group import full_history_start
from eventlog.raft.runtime import log_storage
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.snapshot_image import ImageHeader
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


def _flip_middle_batch(path: Path) -> int:
    """Invert a byte in the records of the middle batch of segment file `path` (the log has it open: its
    mapping sees the change); the offset the damaged batch starts at."""
    from eventlog.records import HEADER_SIZE, read_header

    data = path.read_bytes()
    found, pos = [], 0
    while pos < len(data):
        h = read_header(data, pos)
        found.append((pos, h))
        pos += h.size
    pos, h = found[len(found) // 2]
    at = pos + HEADER_SIZE + 10
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([data[at] ^ 0xFF]), at)
    finally:
        os.close(fd)
    return h.base_offset


def test_an_image_never_ships_a_damaged_batch_of_the_leaders_prefix(tmp_path: Path) -> None:
    """Bytes of a sealed segment below the snapshot rot on the leader, unknown to its log: reading the
    image for a follower finds the damaged batch before any byte of its part is sent, reports it to the
    log and starts over (CompactedError, as the core expects); the image built next leaves the damaged
    segment and everything below it out, and the follower installs a clean log starting after it."""
    rng = random.Random(_seed())
    leader = leader_with_cleaned_log(tmp_path / "leader")
    spans = leader.log.segment_spans()
    damaged_base, damaged_end, _ = next((b, e, n) for b, e, n in spans if 0 < b and e <= 480 and n > 1000)
    offset = _flip_middle_batch(leader.log.directory / f"{damaged_base:020d}.log")
    assert leader.log.damage is None
    follower = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
    with pytest.raises(CompactedError, match="damaged batch"):
        transfer(leader, follower, rng)
    damage = leader.log.damage
    assert damage is not None and damage.segment_base == damaged_base and damage.offset >= offset - 2
    meta = transfer(leader, follower, rng)               # listed again, without the damaged segment
    follower.install_snapshot(meta)
    assert (follower.log.start_offset, follower.log.end_offset) == (damaged_end, 500)
    assert batches(follower, damaged_end, 500) == batches(leader, damaged_end, 500)
    leader.close()
    follower.close()
    assert verify_log_dir(tmp_path / "follower" / "log").verdict is Verdict.CLEAN


def test_dropping_damage_in_the_cleaned_prefix_or_above_the_snapshot(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`LogStorage.drop_from` (eventlog/raft/runtime/repair.py): damage in a cleaned segment below the
    snapshot can only go with the whole log below the snapshot (the log restarts after it); damage
    above the snapshot is cut at the damaged batch, keeping everything before it."""
    from eventlog.errors import CorruptBatchError
    # Only the last entry kept in memory: the damaged ones are read from the log, as after a restart
    # (the latest appended are served as written, log_storage.RECENT_ENTRIES_BYTES).
    monkeypatch.setattr(log_storage, "RECENT_ENTRIES_BYTES", 0)

    st = leader_with_cleaned_log(tmp_path / "a")
    st.append(entries(600, 3, 100))
    cleaned = next((b, e) for b, e in st.log.cleaned_segments if (st.log.directory / f"{b:020d}.log").stat().st_size)
    _flip_middle_batch(st.log.directory / f"{cleaned[0]:020d}.log")
    with pytest.raises(CorruptBatchError):
        list(st.log.batches(cleaned[0], cleaned[1]))
    damage = st.log.damage
    assert damage is not None and damage.cleaned and damage.drop_offset == cleaned[0]
    st.drop_from(damage.drop_offset)
    assert (st.log.start_offset, st.log.end_offset, st.log.damage) == (500, 500, None)
    assert st.last_index() == 499 and st.term(499) == 3
    st.append(entries(500, 3, 10))
    st.close()
    assert verify_log_dir(tmp_path / "a" / "log").verdict is Verdict.CLEAN

    st = leader_with_cleaned_log(tmp_path / "b")
    st.append(entries(600, 3, 100))
    spans = st.log.segment_spans()
    base, end, _ = next((b, e, n) for b, e, n in spans if b >= 600 and e < 800 and n > 1000)
    offset = _flip_middle_batch(st.log.directory / f"{base:020d}.log")
    with pytest.raises(CompactedError, match="damaged batch"):
        st.entries(offset, offset + 2, 1 << 20)      # the core gets CompactedError, never the bytes
    assert st.entries(base, offset + 2, 1 << 20)[-1].last_index == offset - 1, "what precedes it is served"
    st.drop_from(st.log.damage.drop_offset)        # type: ignore[union-attr]
    assert (st.log.start_offset, st.log.end_offset, st.log.damage) == (0, offset, None)
    assert batches(st, 0, 500) != [] and st.log.clean_end_offset > 0, "the prefix below the snapshot stays"
    st.close()
    assert verify_log_dir(tmp_path / "b" / "log").verdict is Verdict.CLEAN


# --- the receiver's word before a chunk is taken ----------------------------------------------------

def _damaged(image: bytes, meta: SnapshotMeta, rng: random.Random) -> tuple[SnapshotMeta, bytes, str]:
    """The image with one random kind of damage (the meta's size follows the bytes), and its name."""
    head_end = 12 + int.from_bytes(image[8:12], "big")
    header = msgspec.json.decode(image[12:head_end], type=ImageHeader)
    kind = rng.choice(["flip", "flip head", "cut", "extend", "header field", "swap epochs"])
    out = bytearray(image)
    if kind == "flip":
        out[rng.randrange(head_end, len(out))] ^= 1 << rng.randrange(8)
    elif kind == "flip head":
        out[rng.randrange(head_end)] ^= 1 << rng.randrange(8)
    elif kind == "cut":
        del out[rng.randrange(1, len(out)):]
    elif kind == "extend":
        out += rng.randbytes(rng.randint(1, 64))
    else:
        fields = msgspec.structs.asdict(header)
        if kind == "swap epochs" and len(header.epochs) > 1:
            fields["epochs"] = tuple(reversed(header.epochs))
        else:
            name = rng.choice(["data_bytes", "dirty_offset", "parts", "epochs"])
            if name == "parts":
                i = rng.randrange(len(header.parts))
                part = list(header.parts[i])
                part[rng.randrange(3)] += rng.choice([-1000, -1, 1, 7])
                fields["parts"] = header.parts[:i] + (tuple(part),) + header.parts[i + 1:]
            elif name == "epochs":
                i = rng.randrange(len(header.epochs))
                fields["epochs"] = header.epochs[:i] + ((header.epochs[i][0] + rng.choice([-3, 1]),
                                                         header.epochs[i][1] + rng.choice([-1, 0, 1])),) \
                    + header.epochs[i + 1:]
            else:
                fields[name] += rng.choice([-10**6, -1, 1])
        out = bytearray(ImageHeader(**fields).encode() + image[head_end:])
    return msgspec.structs.replace(meta, size=len(out)), bytes(out), kind


def test_what_the_receiver_takes_it_stages_and_installs_and_a_refused_chunk_changes_nothing(tmp_path: Path) -> None:
    """`snapshot_chunk_refusal` answers before the core takes a chunk (eventlog/raft/peer_check.py), so
    it must agree with staging: a chunk it takes is staged (and, the last one, installed), one it
    refuses the storage refuses too, leaving the staged image as it was. Over images with random
    damage, sent in random chunks: after each refused chunk the transfer goes on with the good bytes
    at the same offset, or over from 0 with the good image, and ends with the leader's log installed."""
    rng = random.Random(_seed())
    leader = leader_with_cleaned_log(tmp_path / "leader")
    good = leader.snapshot()
    image = leader.snapshot_chunk(good.index, 0, good.size)
    refused = installed = 0
    for run in range(30):
        follower = LogStorage.open(tmp_path / f"f{run}", CFG, CONF, ships_log_prefix=True)
        meta, data, kind = _damaged(image, good, rng)
        offset, fell_back = 0, False
        while offset < meta.size:
            chunk = data[offset:offset + rng.choice([1, 13, 200, 3000, 1 << 20])]
            why = follower.snapshot_chunk_refusal(meta, offset, chunk)
            if why is None:
                follower.stage_snapshot_chunk(meta, offset, chunk)
                offset += len(chunk)
                continue
            refused += 1
            with pytest.raises(LogCorruptionError):
                follower.stage_snapshot_chunk(meta, offset, chunk)
            assert fell_back is False, f"run {run} ({kind}): the good image refused: {why}"
            if meta == good and offset > 0 and data[:offset] == image[:offset]:
                # The staged image is as it was: the leader's bytes at the same offset go on from there.
                data = image
            else:
                meta, data, offset = good, image, 0
            fell_back = True
        path = follower.install_snapshot(meta)
        installed += 1
        if data == image:   # (damage to the views' data, opaque here, or to offsets that stay in order passes)
            assert batches(follower, 0, 500) == batches(leader, 0, 500), f"run {run} ({kind})"
            assert (path / "data").read_bytes() == b"views@499" * 500
        follower.close()
        assert verify_log_dir(tmp_path / f"f{run}" / "log").verdict is Verdict.CLEAN, f"run {run} ({kind})"
    print(f"{refused} chunks refused, {installed} installed")
    assert refused >= 10 and installed == 30
    leader.close()


@pytest.mark.parametrize(("change", "problem"), [
    (lambda h: {"data_bytes": -100, "parts": ((h.parts[0][0], h.parts[0][1], h.parts[0][2] + h.data_bytes + 100),)
                + h.parts[1:]}, "data of -100 bytes"),
    (lambda h: {"epochs": tuple(reversed(h.epochs))}, "epoch"),
    (lambda h: {"epochs": ((h.epochs[0][0], h.parts[0][0] - 1),) + h.epochs[1:]}, "epoch"),
    (lambda h: {"epochs": h.epochs[:1] + ((h.epochs[0][0], h.epochs[1][1]),) + h.epochs[2:]}, "epoch"),
], ids=["negative data", "epochs descending", "an epoch before the prefix", "an epoch twice"])
def test_a_header_the_log_could_not_adopt_is_refused(tmp_path: Path, change: object, problem: str) -> None:
    """Sizes that still add up to the image, but data of a negative size, or epochs that are not the
    ascending cache a leader ships: refused with the header, before any byte of the body is taken."""
    leader = leader_with_cleaned_log(tmp_path / "leader")
    meta = leader.snapshot()
    image = leader.snapshot_chunk(meta.index, 0, meta.size)
    head_end = 12 + int.from_bytes(image[8:12], "big")
    header = msgspec.json.decode(image[12:head_end], type=ImageHeader)
    assert len(header.epochs) == 3, header
    forged = msgspec.structs.replace(header, **change(header))   # type: ignore[operator]
    data = forged.encode() + image[head_end:]
    forged_meta = msgspec.structs.replace(meta, size=len(data))
    follower = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
    why = follower.snapshot_chunk_refusal(forged_meta, 0, data)
    assert why is not None and "bad image header" in why and problem in why, why
    with pytest.raises(LogCorruptionError, match="bad image header"):
        follower.stage_snapshot_chunk(forged_meta, 0, data)
    follower.close()
    leader.close()
