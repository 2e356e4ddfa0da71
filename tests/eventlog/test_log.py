"""Behaviour of the Log API: appends, reads, epochs, truncation, retention, flush policies, errors."""

from __future__ import annotations

import os
import random
import threading

import pytest

from eventlog.config import LogConfig
from eventlog.errors import (
    BatchTooLargeError,
    InvalidBatchError,
    LogClosedError,
    LogError,
    LogFailedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    StaleEpochError,
)
from eventlog.log import Log
from eventlog.records import Record, RecordBatch, encode_batch, encode_records

SMALL = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512, flush_policy="fsync",
                  max_batch_bytes=8 * 1024)
TINY = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy="fsync")


def batch(n: int = 3, tag: str = "x", ts: int = 1_000, size: int = 40) -> bytes:
    return encode_batch([(f"{tag}-{i}".encode(), f"{tag}:{i}".encode().ljust(size, b".")) for i in range(n)],
                        timestamp_ms=ts)


def values(log: Log, start: int | None = None) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for b in log.batches(start) for r in b.records()]


@pytest.fixture
def log(tmp_path):
    lg = Log.open(tmp_path / "log", SMALL)
    yield lg
    lg.close()


def test_append_assigns_offsets_and_stamps_epoch(log):
    a = log.append(batch(3, "a"), epoch=1)
    b = log.append(batch(2, "b"), epoch=1)
    assert (a.base_offset, a.last_offset, b.base_offset, b.last_offset) == (0, 2, 3, 4)
    assert log.end_offset == 5
    got = list(log.batches())
    assert [(x.header.base_offset, x.header.leader_epoch) for x in got] == [(0, 1), (3, 1)]
    assert [r.offset for x in got for r in x.records()] == [0, 1, 2, 3, 4]


def test_reads_span_rolled_segments_and_survive_reopen(tmp_path):
    path = tmp_path / "log"
    expected = []
    with Log.open(path, SMALL) as lg:
        for i in range(200):
            info = lg.append(batch(2, f"r{i}"), epoch=1 + i // 50)
            expected += [(info.base_offset, f"r{i}:0".encode()), (info.base_offset + 1, f"r{i}:1".encode())]
        assert len(lg.segment_bases()) >= 3, "small segments must have rolled"
        assert [(o, v[:len(e)]) for (o, v), (_, e) in zip(values(lg), expected)] == expected
    with Log.open(path, SMALL) as lg:
        assert lg.recovery.bytes_truncated == 0
        assert lg.recovery.segments_scanned == 1, "a clean close must let open skip sealed segments"
        assert [(o, v[:len(e)]) for (o, v), (_, e) in zip(values(lg), expected)] == expected
        assert lg.epoch_entries == [(1, 0), (2, 100), (3, 200), (4, 300)]


def test_read_limits(log):
    for i in range(10):
        log.append(batch(4, f"b{i}"), epoch=1)
    one = log.read(5, max_bytes=1)
    assert (one.start_offset, one.next_offset) == (4, 8), "at least the batch holding the offset"
    bounded = log.read(0, max_bytes=10_000, max_offset=12)
    assert bounded.next_offset == 12, "no batch reaching max_offset"
    assert log.read(0, max_offset=3).next_offset == 0, "a batch straddling max_offset is not returned"
    assert len(log.read(log.end_offset).data) == 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.end_offset + 1)


def test_stale_epoch_is_rejected_and_writes_nothing(log):
    log.append(batch(), epoch=5)
    with pytest.raises(StaleEpochError):
        log.append(batch(), epoch=4)
    assert log.end_offset == 3 and log.latest_epoch == 5


def test_invalid_batches_write_nothing(log):
    good = bytearray(batch())
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    with pytest.raises(InvalidBatchError):
        log.append(bytes(bad), epoch=1)
    with pytest.raises(InvalidBatchError):
        log.append(bytes(good) + bytes(good), epoch=1)
    with pytest.raises(BatchTooLargeError):
        log.append(batch(1, size=SMALL.max_batch_bytes + 1), epoch=1)
    assert log.end_offset == 0
    log.append(bytes(good), epoch=1)
    assert log.end_offset == 3


def test_append_replica_keeps_offsets_and_is_all_or_nothing(tmp_path, log):
    for i in range(5):
        log.append(batch(2, f"L{i}"), epoch=1 + i // 3)
    data = bytes(log.read(0, max_bytes=1 << 20).data)
    with Log.open(tmp_path / "follower", SMALL) as follower:
        # a damaged last batch: nothing of the chunk is written
        damaged = bytearray(data)
        damaged[-1] ^= 1
        with pytest.raises(InvalidBatchError):
            follower.append_replica(bytes(damaged))
        assert follower.end_offset == 0
        with pytest.raises(OffsetMismatchError):
            follower.append_replica(bytes(log.read(4).data))  # does not start at the follower's end
        info = follower.append_replica(data)
        assert (info.base_offset, info.last_offset) == (0, 9)
        assert bytes(follower.read(0, max_bytes=1 << 20).data) == data
        assert follower.epoch_entries == log.epoch_entries == [(1, 0), (2, 6)]


def test_epoch_queries(log):
    log.append(batch(3), epoch=1)      # 0..2
    log.append(batch(3), epoch=3)      # 3..5
    log.append(batch(3), epoch=3)      # 6..8
    log.append(batch(3), epoch=7)      # 9..11
    assert [log.epoch_for_offset(o) for o in (0, 2, 3, 8, 9, 11)] == [1, 1, 3, 3, 7, 7]
    assert log.epoch_for_offset(12) is None
    # OffsetsForLeaderEpoch: largest epoch <= asked, and where the next epoch starts (or the end)
    assert log.end_offset_for_epoch(0) is None
    assert log.end_offset_for_epoch(1) == (1, 3)
    assert log.end_offset_for_epoch(2) == (1, 3)
    assert log.end_offset_for_epoch(5) == (3, 9)
    assert log.end_offset_for_epoch(9) == (7, 12)


def test_truncate_suffix_is_durable_and_reactivates_sealed_segment(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, TINY) as lg:
        infos = [lg.append(batch(2, f"t{i}"), epoch=1 + i // 40) for i in range(120)]
        bases = lg.segment_bases()
        assert len(bases) >= 4
        cut = infos[50].base_offset     # inside an older, sealed segment, in epoch 2
        with pytest.raises(OffsetMismatchError):
            lg.truncate_suffix(cut + 1)  # not a batch boundary
        lg.truncate_suffix(cut)
        assert lg.end_offset == cut
        assert lg.epoch_entries == [(1, 0), (2, 80)]
        assert all(b <= cut for b in lg.segment_bases())
        # appending continues at the cut, in a new epoch
        again = lg.append(batch(2, "new"), epoch=9)
        assert again.base_offset == cut
    with Log.open(path, TINY) as lg:
        assert lg.end_offset == cut + 2
        vals = values(lg)
        assert [o for o, _ in vals] == list(range(cut + 2))
        assert vals[-1][1].startswith(b"new:1")
        assert lg.epoch_entries == [(1, 0), (2, 80), (9, cut)]


def test_truncate_to_start_empties_the_log(log):
    for i in range(30):
        log.append(batch(2), epoch=2)
    log.truncate_suffix(0)
    assert (log.start_offset, log.end_offset, log.epoch_entries) == (0, 0, [])
    assert log.append(batch(), epoch=1).base_offset == 0


def test_delete_segments_below(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, TINY) as lg:
        for i in range(150):
            lg.append(batch(2, f"d{i}"), epoch=1 + i // 50)
        bases = lg.segment_bases()
        target = bases[3] + 1
        assert lg.delete_segments_below(target) == 3
        assert lg.start_offset == bases[3]
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(bases[3] - 1)
        assert lg.epoch_for_offset(bases[3]) == lg.epoch_entries[0][0]
        assert lg.epoch_entries[0][1] == bases[3]
        # never the active segment, even when everything is below the offset
        assert lg.delete_segments_below(10**9) == len(bases) - 4
        assert lg.segment_bases() == [bases[-1]]
        end = lg.end_offset
    with Log.open(path, TINY) as lg:
        assert (lg.start_offset, lg.end_offset) == (bases[-1], end)
        assert sorted(p.name for p in path.glob("*.log")) == [f"{bases[-1]:020d}.log"]


def test_detached_segments_leave_the_log_at_once_and_a_crash_before_the_unlink_is_finished_on_open(tmp_path):
    """Retention detaches segments (renamed `.deleted`, the log start moved durably) and unlinks them off
    the event loop; files left when the process dies before the unlink are removed by the next open."""
    path = tmp_path / "log"
    with Log.open(path, TINY) as lg:
        for i in range(150):
            lg.append(batch(2, f"d{i}"), epoch=1)
        bases = lg.segment_bases()
        doomed = lg.detach_segments_below(bases[3])
        assert sorted(p.name for p in doomed if p.suffixes[-2:] == [".log", ".deleted"]) == [
            f"{b:020d}.log.deleted" for b in bases[:3]]
        assert all(p.exists() for p in doomed) and lg.start_offset == bases[3]
        assert lg.detach_segments_below(bases[3]) == []
        end = lg.end_offset
    # "Killed" before the unlink: the renamed files are still there.
    with Log.open(path, TINY) as lg:
        assert (lg.start_offset, lg.end_offset) == (bases[3], end)
        assert not list(path.glob("*.deleted"))
        assert [b.header.base_offset for b in lg.batches()][0] == bases[3]


def test_reset_starts_empty_at_offset(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, SMALL) as lg:
        for _ in range(20):
            lg.append(batch(), epoch=1)
        lg.reset(1000)
        assert (lg.start_offset, lg.end_offset, lg.epoch_entries) == (1000, 1000, [])
        assert lg.append(batch(), epoch=4).base_offset == 1000
    with Log.open(path, SMALL) as lg:
        assert (lg.start_offset, lg.end_offset) == (1000, 1003)
        assert lg.epoch_entries == [(4, 1000)]


def test_offset_for_timestamp_matches_brute_force(tmp_path):
    seed = int(os.environ.get("EPOCHLOG_TEST_SEED", random.randrange(2**32)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    path = tmp_path / "log"
    all_records = []
    with Log.open(path, SMALL) as lg:
        offset = 0
        for _ in range(150):
            n = rng.randint(1, 4)
            recs = [Record(offset + i, rng.randint(0, 5_000), b"k", b"v" * 30) for i in range(n)]
            info = lg.append(encode_records(recs), epoch=1)
            all_records += [(info.base_offset + i, r.timestamp) for i, r in enumerate(recs)]
            offset += n
    with Log.open(path, SMALL) as lg:  # sealed segments load (and validate) their time indexes
        for target in [rng.randint(-10, 5_100) for _ in range(200)]:
            expected = next((o for o, ts in all_records if ts >= target), None)
            assert lg.offset_for_timestamp(target) == expected, f"seed={seed} target={target}"


@pytest.mark.parametrize("policy", ["fsync", "group", "interval"])
def test_flush_policies_reach_durability(tmp_path, policy):
    cfg = LogConfig(segment_bytes=64 * 1024, flush_policy=policy, flush_interval_ms=20)
    with Log.open(tmp_path / policy, cfg) as lg:
        seen: list[int] = []
        lg.add_durability_listener(seen.append)
        info = lg.append(batch(), epoch=1)
        if policy == "fsync":
            assert lg.durable_offset == info.next_offset, "fsync: durable when append returns"
        assert lg.wait_durable(info.last_offset, timeout=5)
        assert lg.durable_offset >= info.next_offset
        assert seen and max(seen) >= info.next_offset


def test_group_commit_covers_concurrent_appenders(tmp_path):
    cfg = LogConfig(segment_bytes=256 * 1024, flush_policy="group")
    syncs = []
    with Log.open(tmp_path / "g", cfg) as lg:
        lg.add_durability_listener(syncs.append)
        errors = []

        def appender(tag: int) -> None:
            try:
                for i in range(50):
                    info = lg.append(batch(2, f"{tag}-{i}"), epoch=1)
                    assert lg.wait_durable(info.last_offset, timeout=10)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=appender, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert lg.durable_offset == lg.end_offset == 800
    # 400 appends acknowledged by far fewer syncs: one sync covered several appends
    assert len(syncs) < 400


def test_interval_policy_does_not_wait(tmp_path):
    cfg = LogConfig(flush_policy="interval", flush_interval_ms=60_000, segment_bytes=64 * 1024)
    with Log.open(tmp_path / "i", cfg) as lg:
        info = lg.append(batch(), epoch=1)
        assert lg.durable_offset <= info.base_offset
        assert not lg.wait_durable(info.last_offset, timeout=0.05)
        lg.flush()
        assert lg.durable_offset == info.next_offset


def test_second_open_of_same_directory_is_refused(log):
    with pytest.raises(LogError, match="in use"):
        Log.open(log.directory, SMALL)


def test_closed_log_refuses_writes(tmp_path):
    lg = Log.open(tmp_path / "c", SMALL)
    lg.close()
    with pytest.raises(LogClosedError):
        lg.append(batch(), epoch=1)
    lg.close()  # idempotent


def _redirect_segment_fd(lg: Log, path: str) -> None:
    """Point the active segment's descriptor at another file, to make a syscall on it fail."""
    fd = os.open(path, os.O_WRONLY)
    os.dup2(fd, lg._segments[-1].fd)
    os.close(fd)


def test_failed_fsync_is_fatal(tmp_path):
    """After a failed fdatasync the log refuses every write: it is never retried as if it worked."""
    lg = Log.open(tmp_path / "f", SMALL)
    try:
        lg.append(batch(), epoch=1)
        # /dev/null takes the write, then fdatasync fails (EINVAL) as a dying disk's would (EIO)
        _redirect_segment_fd(lg, "/dev/null")
        with pytest.raises(LogFailedError):
            lg.append(batch(), epoch=1)
        assert lg.durable_offset == 3
        with pytest.raises(LogFailedError):
            lg.wait_durable(lg.end_offset - 1, timeout=1)   # that write was never made durable
        with pytest.raises(LogFailedError):
            lg.append(batch(), epoch=1)
        with pytest.raises(LogFailedError):
            lg.flush()
    finally:
        lg.close()
    with Log.open(tmp_path / "f", SMALL) as again:
        # the acknowledged batch is there, the lost one is not; the log works after reopening
        assert again.end_offset == 3
        assert again.append(batch(), epoch=1).base_offset == 3


@pytest.mark.parametrize("policy", ["fsync", "group"])
def test_failed_write_is_fatal(tmp_path, policy):
    cfg = LogConfig(segment_bytes=16 * 1024, flush_policy=policy)
    lg = Log.open(tmp_path / "w", cfg)
    try:
        info = lg.append(batch(), epoch=1)
        assert lg.wait_durable(info.last_offset, timeout=5)
        r, w = os.pipe()          # pwritev on a pipe fails (ESPIPE), like a write error would
        os.dup2(r, lg._segments[-1].fd)
        os.close(r)
        os.close(w)
        with pytest.raises(LogFailedError, match="writing"):
            lg.append(batch(), epoch=1)
        with pytest.raises(LogFailedError):
            lg.append(batch(), epoch=1)
        assert lg.end_offset == 3, "a failed write does not advance the log"
    finally:
        lg.close()
    with Log.open(tmp_path / "w", cfg) as again:
        assert again.end_offset == 3


def test_zero_copy_read_is_a_view_of_the_segment(log):
    log.append(batch(5), epoch=1)
    chunk = log.read(0)
    assert isinstance(chunk.data, memoryview)
    parsed = RecordBatch.parse(chunk.data)
    assert parsed.header.records_count == 5


def test_segment_reactivated_by_truncation_keeps_exact_indexes(tmp_path):
    """Re-sealing a segment that a truncation made active again writes the same indexes a rebuild would."""
    from eventlog.scan import scan_segment

    with Log.open(tmp_path / "r", TINY) as lg:
        while len(lg.segment_bases()) < 2:
            lg.append(batch(2, "a", ts=lg.end_offset), epoch=1)
        for _ in range(3):
            lg.append(batch(2, "a", ts=lg.end_offset), epoch=1)
        lg.append(batch(1, "big", ts=lg.end_offset, size=3500), epoch=1)  # does not fit: segment 1 seals with room
        bases = lg.segment_bases()
        assert len(bases) == 3
    with Log.open(tmp_path / "r", TINY) as lg:  # segment 1's indexes now come from its files
        lg.truncate_suffix(bases[2])   # a segment boundary: segment 1 becomes active again
        while len(lg.segment_bases()) < 3:
            lg.append(batch(1, "b", ts=lg.end_offset), epoch=2)
        seg = lg._segments[1]
        assert seg.sealed and seg.base_offset == bases[1]
    written_index = (tmp_path / "r" / f"{bases[1]:020d}.index").read_bytes()
    written_time = (tmp_path / "r" / f"{bases[1]:020d}.timeindex").read_bytes()
    data = (tmp_path / "r" / f"{bases[1]:020d}.log").read_bytes()
    scan = scan_segment(data, bases[1], index_interval_bytes=TINY.index_interval_bytes)
    scan.builder.seal()
    assert written_index == scan.builder.index.to_bytes()
    assert written_time == scan.builder.time_index.to_bytes()


def _fds_into(directory, suffix: str = "") -> list[str]:
    """What this process's open file descriptors point at inside `directory` (deleted files included),
    only paths ending in `suffix` (before any " (deleted)") when given."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue   # closed meanwhile (the listing's own fd)
        if target.startswith(str(directory)) and target.removesuffix(" (deleted)").endswith(suffix):
            out.append(target)
    return out


def test_the_flusher_holds_one_copy_of_the_active_segment_fd_and_closes_it(tmp_path):
    """The group-commit flusher duplicates the active segment's fd once per segment, not per sync (a
    segment may be sealed or deleted while it syncs): across rolls it holds at most one copy, never
    one of a segment it no longer syncs, and none once the log is closed."""
    cfg = LogConfig(segment_bytes=8 * 1024, index_interval_bytes=512, flush_policy="group")
    directory = tmp_path / "g"
    lg = Log.open(directory, cfg)
    try:
        # Segment files only: the preallocator thread opens and closes the next segment's file
        # (preallocated.tmp) on its own schedule, so counting it made the bound race with it.
        baseline = len(_fds_into(directory, ".log"))
        for i in range(100):   # several segments
            info = lg.append(batch(3, f"r{i}", size=100), epoch=1)
            assert lg.wait_durable(info.last_offset, timeout=10)
            segments = len(lg.segment_spans())
            held = _fds_into(directory, ".log")
            assert len(held) <= baseline + segments + 1, held
        assert len(lg.segment_spans()) > 3
        lg.delete_segments_below(lg.segment_spans()[-1][0])   # every sealed segment goes
        info = lg.append(batch(3, "last", size=100), epoch=1)
        assert lg.wait_durable(info.last_offset, timeout=10)
        assert not [t for t in _fds_into(directory) if t.endswith("(deleted)")]
    finally:
        lg.close()
    assert not _fds_into(directory)
