"""Key compaction: what a pass keeps and drops, the batches it rebuilds, and how the log lives with
cleaned segments (reads, epochs, truncation, retention, reset, recovery, offline tools, Raft storage,
the background thread, concurrent appends)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch

import eventlog.log as log_module
from compaction.cleaner import (
    CleanerAbortedError,
    LogCleaner,
    OffsetMap,
    Pacer,
    clean_log,
    group_segments,
)
from compaction.config import CleanerConfig, cleaner_config
from eventlog.cleaned import CHECKPOINT_NAME, CleanerCheckpoint
from eventlog.config import LogConfig
from eventlog.epoch_cache import CHECKPOINT_NAME as EPOCH_CHECKPOINT
from eventlog.errors import ConfigError, LogCorruptionError, OffsetMismatchError
from eventlog.log import Log
from eventlog.offline import Verdict, dump_log_dir, read_committed, verify_log_dir
from eventlog.raft.errors import CompactedError
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import ConfState
from eventlog.records import Record, RecordBatch, encode_batch, encode_records, read_header, retain_records
from tests.compaction.logs import Written, expected, gzip_batch, records, triples, write_random

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy="fsync", preallocate_next_segment=False)
KEEP_DELETES = CleanerConfig(delete_retention_ms=10**15, worker_process=False)   # passes in this thread
REPO = Path(__file__).resolve().parents[2]


def put(log: Log, key: str, value: bytes | None, ts: int = 1_000, epoch: int = 1) -> int:
    return log.append(encode_batch([(key.encode(), value)], timestamp_ms=ts), epoch=epoch).base_offset


def fill(log: Log, keys: int, rounds: int, ts: int = 1_000, size: int = 60) -> None:
    for r in range(rounds):
        for k in range(keys):
            put(log, f"k{k}", f"{r}:".encode().ljust(size, b"."), ts + r)


@pytest.fixture
def log(tmp_path):
    lg = Log.open(tmp_path / "log", CFG)
    yield lg
    lg.close()


# --- the rebuilt batch --------------------------------------------------------------------------

def test_retained_batch_keeps_offsets_epoch_sequence_and_kafka_reads_it():
    entries = [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"c", None), (b"b", b"5")]
    raw = bytearray(encode_batch(entries, timestamp_ms=5_000, producer_id=7, producer_epoch=2, base_sequence=40))
    raw[0:8] = (100).to_bytes(8, "big")          # as the log stamps offset and epoch
    raw[12:16] = (9).to_bytes(4, "big")
    header = read_header(raw)
    recs = list(RecordBatch.parse(raw).records())
    kept = [recs[2], recs[3]]                      # offsets 102, 103
    out = retain_records(header, kept)
    h = read_header(out)
    assert (h.base_offset, h.last_offset_delta, h.leader_epoch, h.base_sequence, h.producer_id, h.producer_epoch,
            h.base_timestamp, h.max_timestamp, h.records_count) == (100, 4, 9, 40, 7, 2, 5_000, 5_000, 2)
    assert [(r.offset, r.key, r.value) for r in RecordBatch.parse(out).records()] == [(102, b"a", b"3"), (103, b"c", None)]
    theirs = DefaultRecordBatch(bytearray(out))
    assert theirs.validate_crc()
    assert [(r.offset, r.key, r.value) for r in theirs] == [(102, b"a", b"3"), (103, b"c", None)]
    assert (theirs.base_offset, theirs.last_offset, theirs.leader_epoch) == (100, 104, 9)


def test_retained_gzip_batch_is_compressed_again():
    raw = gzip_batch([(b"a", b"x" * 200), (b"b", b"y" * 200), (b"a", b"z" * 200)], 1_000)
    header = read_header(raw)
    recs = list(RecordBatch.parse(raw).records())
    out = retain_records(header, recs[1:])
    assert read_header(out).compression == 1 and len(out) < 300
    assert [r.value for r in RecordBatch.parse(out).records()] == [b"y" * 200, b"z" * 200]


# --- what a pass keeps -------------------------------------------------------------------------

def test_keeps_latest_per_key_below_the_horizon_only(log):
    fill(log, keys=5, rounds=30)
    bases = log.segment_bases()
    horizon = bases[3] + 1                 # inside the 4th segment: the first 3 are cleanable
    above = records(log, bases[3])
    result = clean_log(log, horizon, KEEP_DELETES)
    assert (result.segments_before, result.cleaned_through, result.dirty_offset) == (3, bases[3], bases[3])
    kept = records(log)
    below = [t for t in kept if t[0] < bases[3]]
    assert sorted(t[1] for t in below) == sorted({t[1] for t in below}), "one record per key below"
    assert records(log, bases[3]) == above, "the horizon's segment and everything after untouched"
    # Records at or above the horizon do not supersede: k0..k4 still have their latest below it.
    assert len(below) == 5
    assert log.cleaned_segments == [(bases[0], bases[1]), (bases[1], bases[2]), (bases[2], bases[3])]
    assert log.clean_end_offset == bases[3]
    assert result.bytes_after < result.bytes_before and result.records_dropped > 0


def test_fully_kept_batches_are_copied_byte_for_byte(log):
    for i in range(200):
        put(log, f"unique-{i}", b"v" * 50)
    before = [bytes(b.raw) for b in log.batches()]
    bases = log.segment_bases()
    result = clean_log(log, bases[-1], KEEP_DELETES, force=True)
    assert result.records_dropped == 0 and result.segments_before >= 2
    assert [bytes(b.raw) for b in log.batches()] == before


def test_tombstones_are_kept_for_delete_retention_then_dropped(log):
    retention = 10_000
    config = CleanerConfig(delete_retention_ms=retention, worker_process=False)
    put(log, "gone", b"v", ts=1_000)
    tomb = put(log, "gone", None, ts=2_000)
    fill(log, keys=3, rounds=40, ts=2_000)                   # first segments: ts <= 2_039
    first = clean_log(log, log.segment_bases()[-1], config, force=True)
    assert (tomb, b"gone", None) in records(log) and first.tombstones_dropped == 0
    assert (0, b"gone", b"v") not in records(log), "the put the delete superseded goes at once"
    fill(log, keys=3, rounds=40, ts=2_000 + retention - 100)  # the clean section now reaches 2_039 only
    second = clean_log(log, log.segment_bases()[-1], config, force=True)
    assert second.tombstones_dropped == 0 and (tomb, b"gone", None) in records(log)
    fill(log, keys=3, rounds=40, ts=2_000 + retention + 100)
    third = clean_log(log, log.segment_bases()[-1], config, force=True)
    assert third.tombstones_dropped == 0, "the newest cleaned data is still within retention of the delete"
    fill(log, keys=3, rounds=40, ts=2_000 + 3 * retention)
    fourth = clean_log(log, log.segment_bases()[-1], config, force=True)
    assert fourth.tombstones_dropped == 1 and (tomb, b"gone", None) not in records(log)


def test_dirty_ratio_gates_a_pass_unless_forced(log):
    for i in range(400):
        put(log, f"unique/{i}", b"v" * 60)               # survives cleaning: a big clean section
    clean_log(log, log.segment_bases()[-1], KEEP_DELETES)
    horizon = log.end_offset
    while log.segment_bases()[-1] <= horizon:            # one more segment of dirty data
        put(log, "pad", b"x" * 100)
    horizon = log.segment_bases()[-1]
    skipped = clean_log(log, horizon, KEEP_DELETES)
    assert skipped.skipped and "dirty ratio" in skipped.skipped
    forced = clean_log(log, horizon, KEEP_DELETES, force=True)
    assert forced.skipped is None and forced.segments_before >= 1
    again = clean_log(log, horizon, KEEP_DELETES, force=True)
    assert again.skipped is not None and "already cleaned" in again.skipped


def test_a_full_offset_map_continues_in_later_passes_to_the_same_result(tmp_path):
    path = tmp_path / "log"
    import random
    rng = random.Random(7)
    with Log.open(path, CFG) as lg:
        written = write_random(lg, rng, 300, key_space=60)
        horizon = lg.segment_bases()[-1]
        small = CleanerConfig(offset_map_max_keys=10, delete_retention_ms=10**15, worker_process=False)
        results = []
        for _ in range(200):
            r = clean_log(lg, horizon, small, force=True)
            results.append(r)
            if r.skipped:
                break
        assert results[0].offset_map_full and results[0].offset_map_keys <= 10
        assert results[-1].skipped and "already cleaned" in results[-1].skipped
        assert records(lg) == triples(expected(written, horizon))


def test_grouping_merges_small_cleaned_segments(log):
    fill(log, keys=3, rounds=150)
    horizon = log.segment_bases()[-1]
    first = clean_log(log, horizon, KEEP_DELETES, force=True)
    assert first.segments_before == first.segments_after > 3, "full segments are cleaned one by one"
    fill(log, keys=3, rounds=10)
    while log.segment_bases()[-1] <= horizon:
        put(log, "pad", b"x")
    second = clean_log(log, log.segment_bases()[-1], KEEP_DELETES, force=True)
    assert second.segments_after < second.segments_before, "the small cleaned segments merge"
    assert len(log.cleaned_segments) <= 2


def test_group_segments_respects_size_and_offset_span():
    from eventlog.log import SealedSegment
    segs = [SealedSegment(i * 10, i * 10 + 10, size, True) for i, size in enumerate([10, 10, 30, 5, 5])]
    assert [[s.base_offset for s in g] for g in group_segments(segs, 25)] == [[0, 10], [20], [30, 40]]
    wide = [SealedSegment(0, 2**31, 1, True), SealedSegment(2**31, 2**31 + 5, 1, True)]
    assert len(group_segments(wide, 100)) == 2


def test_offset_map_bounds_and_hashes_long_keys():
    m = OffsetMap(2)
    assert m.put(b"short", 1) and m.put(b"x" * 60, 2)
    assert not m.put(b"third", 3), "full: a new key is refused"
    assert m.put(b"short", 9) and m.get(b"short") == 9, "an existing key is still updated"
    assert m.get(b"x" * 60) == 2 and m.get(b"x" * 61) is None
    assert len(OffsetMap.slot(b"y" * 1000)) == 16 and OffsetMap.slot(b"abc") == b"abc"
    assert OffsetMap.slot(b"z" * 48) == b"z" * 48 and len(OffsetMap.slot(b"z" * 49)) == 16


def test_pacer_throttles_to_the_rate():
    now = [0.0]
    slept = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s
    pacer = Pacer(1_000_000, yield_gil=False, clock=lambda: now[0], sleep=sleep)
    for _ in range(100):
        pacer.consumed(50_000)          # 5 MB at 1 MB/s: about 5 s of sleeping
    assert 4.5 <= sum(slept) <= 5.5


# --- the log around cleaned segments -----------------------------------------------------------

def test_reads_timestamps_epochs_and_reopen_over_cleaned_segments(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        for r in range(40):
            for k in range(4):
                put(lg, f"k{k}", f"{r}".encode().ljust(60, b"."), ts=1_000 + r * 10 + k, epoch=1 + r // 10)
        horizon = lg.segment_bases()[-1]
        epochs = {e: lg.end_offset_for_epoch(e) for e in range(6)}
        clean_log(lg, horizon, KEEP_DELETES, force=True)
        kept = records(lg)
        times = [(r.offset, r.timestamp) for b in lg.batches() for r in b.records()]
        for ts in range(990, 1_420, 7):
            want = next((o for o, t in times if t >= ts), None)
            assert lg.offset_for_timestamp(ts) == want, ts
        assert {e: lg.end_offset_for_epoch(e) for e in range(6)} == epochs
        gap = next(o for o in range(horizon) if o not in {t[0] for t in kept})
        assert lg.read(gap).start_offset > gap or any(t[0] > gap for t in records(lg, gap))
    with Log.open(path, CFG) as lg:
        assert records(lg) == kept
        assert lg.recovery is not None and lg.recovery.bytes_truncated == 0
    report = verify_log_dir(path)
    assert report.verdict is Verdict.CLEAN and any(s.cleaned for s in report.segments)
    rows = list(dump_log_dir(path))
    assert any(r.cleaned for r in rows) and not all(r.cleaned for r in rows)


def test_read_in_a_gap_at_a_cleaned_segments_end_moves_to_the_next_segment(log):
    put(log, "kept", b"1")
    fill(log, keys=1, rounds=160)
    bases = log.segment_bases()
    clean_log(log, bases[2], KEEP_DELETES, force=True)
    last_kept = max(t[0] for t in records(log) if t[0] < bases[1])
    assert last_kept == 0 and bases[1] > 2
    chunk = log.read(last_kept + 1)
    assert chunk.start_offset >= bases[1] and chunk.next_offset > chunk.start_offset
    assert log.read(last_kept + 1, max_offset=bases[1]).data.nbytes == 0


def test_appends_continue_while_a_swap_holds_the_files_lock(log, monkeypatch):
    fill(log, keys=3, rounds=60)
    horizon = log.segment_bases()[-1]
    entered, release = threading.Event(), threading.Event()
    real = log_module.rename_state

    def slow_rename(*args):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(10)
        return real(*args)
    monkeypatch.setattr(log_module, "rename_state", slow_rename)
    done: list[object] = []
    cleaner = threading.Thread(target=lambda: done.append(clean_log(log, horizon, KEEP_DELETES, force=True)))
    cleaner.start()
    assert entered.wait(10), "the swap never started"
    offsets = [put(log, "during-swap", f"{i}".encode()) for i in range(50)]   # would hang if appends waited
    assert records(log, offsets[0])[:1] == [(offsets[0], b"during-swap", b"0")]
    release.set()
    cleaner.join(10)
    assert done and records(log, offsets[0])[-1] == (offsets[-1], b"during-swap", b"49")


def test_concurrent_appends_and_cleaning_lose_nothing(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, LogConfig(segment_bytes=8192, index_interval_bytes=256, flush_policy="group")) as lg:
        stop = threading.Event()
        written: list[Written] = []

        def writer() -> None:
            i = 0
            while not stop.is_set():
                key, value = f"w/{i % 7}".encode(), f"w{i}".encode()
                offset = lg.append(encode_batch([(key, value)], timestamp_ms=1_000), epoch=1).base_offset
                written.append(Written(offset, key, value, 1_000, 1))
                i += 1
        t = threading.Thread(target=writer)
        t.start()
        mapped_end = 0
        try:
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                r = clean_log(lg, lg.end_offset, KEEP_DELETES, force=True)
                if r.skipped is None:
                    mapped_end = max(mapped_end, r.dirty_offset)
        finally:
            stop.set()
            t.join()
        assert mapped_end > 0, "no pass ran"
        assert records(lg) == triples(expected(written, mapped_end))


def test_truncation_into_and_at_cleaned_segments(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=2, rounds=100)
        bases = lg.segment_bases()
        clean_log(lg, bases[3], KEEP_DELETES, force=True)
        kept = [t for t in records(lg) if t[0] < bases[1]]
        with pytest.raises(OffsetMismatchError):
            lg.truncate_suffix(bases[1] + 1)
        lg.truncate_suffix(bases[2])                     # the base of a cleaned segment: it goes whole
        assert lg.end_offset == bases[2] and lg.cleaned_segments == [(bases[0], bases[1]), (bases[1], bases[2])]
        put(lg, "after", b"1")
        assert records(lg, bases[2]) == [(bases[2], b"after", b"1")]
        assert [t for t in records(lg) if t[0] < bases[1]] == kept
    assert CleanerCheckpoint.load(path).segments == ((bases[0], bases[1]), (bases[1], bases[2]))
    with Log.open(path, CFG) as lg:
        assert [t for t in records(lg) if t[0] < bases[1]] == kept and lg.end_offset == bases[2] + 1
        lg.truncate_suffix(bases[0])
        assert lg.end_offset == bases[0] and lg.cleaned_segments == []
    assert CleanerCheckpoint.load(path).segments == ()
    assert verify_log_dir(path).verdict is Verdict.CLEAN


def test_retention_and_reset_forget_cleaned_segments(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=2, rounds=100)
        bases = lg.segment_bases()
        clean_log(lg, bases[4], KEEP_DELETES, force=True)
        assert lg.delete_segments_below(bases[2]) == 2
        assert lg.cleaned_segments == [(bases[2], bases[3]), (bases[3], bases[4])]
        assert CleanerCheckpoint.load(path).segments == ((bases[2], bases[3]), (bases[3], bases[4]))
        lg.reset(bases[3])                               # the base of a cleaned segment now reused
        assert CleanerCheckpoint.load(path) == CleanerCheckpoint()
        fill(lg, keys=2, rounds=100)
        assert lg.cleaned_segments == [] and lg.clean_end_offset == bases[3]
    with Log.open(path, CFG) as lg:
        assert lg.cleaned_segments == []
    assert verify_log_dir(path).verdict is Verdict.CLEAN


def test_a_swap_after_a_truncation_is_refused(log):
    fill(log, keys=2, rounds=60)
    state = log.cleanable_segments(log.segment_bases()[-1])
    seg = state.segments[0]
    writer = log.cleaned_writer(seg.base_offset, seg.next_offset)
    data = (log.directory / f"{seg.base_offset:020d}.log").read_bytes()
    pos = 0
    while pos < seg.size:
        h = read_header(data, pos)
        writer.append(data[pos:pos + h.size], h)
        pos += h.size
    cleaned = writer.finish()
    log.truncate_suffix(log.end_offset - 1)              # a Raft truncation: the generation changes
    assert not log.swap_cleaned(cleaned, generation=state.generation, dirty_offset=seg.next_offset)
    assert not list(log.directory.glob("*.cleaned")) and not list(log.directory.glob("*.swap"))
    assert log.cleaned_segments == []


def test_only_named_segments_get_the_relaxed_rule(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=2, rounds=100)
        bases = lg.segment_bases()
        clean_log(lg, bases[1], KEEP_DELETES, force=True)
    # A damaged baseOffset in an uncleaned segment (outside the CRC) is still corruption.
    seg = path / f"{bases[2]:020d}.log"
    data = bytearray(seg.read_bytes())
    second = read_header(data).size
    data[second:second + 8] = (read_header(data, second).base_offset + 3).to_bytes(8, "big")
    seg.write_bytes(data)
    report = verify_log_dir(path)
    assert report.verdict is Verdict.CORRUPT and any(str(bases[2]) in p for p in report.problems)
    assert not any(str(bases[0]).zfill(20) in p for p in report.problems)


def test_a_lost_or_damaged_checkpoint_is_refused(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=2, rounds=100)
        clean_log(lg, lg.segment_bases()[2], KEEP_DELETES, force=True)
    (path / CHECKPOINT_NAME).write_bytes(b"0\nsegment x\n")
    with pytest.raises(LogCorruptionError, match="cleaner checkpoint"):
        Log.open(path, CFG)
    (path / CHECKPOINT_NAME).unlink()
    (path / EPOCH_CHECKPOINT).unlink()                  # forces a scan of every segment
    with pytest.raises(LogCorruptionError):
        Log.open(path, CFG)
    assert verify_log_dir(path).verdict is Verdict.CORRUPT


def test_raft_storage_serves_nothing_below_the_cleaned_range(tmp_path):
    storage = LogStorage.open(tmp_path / "group", CFG, ConfState(voters=(1,)))
    try:
        lg = storage.log
        for i in range(300):
            lg.append(encode_batch([(f"k{i % 3}".encode(), b"v" * 40)], timestamp_ms=1), epoch=1)
        assert storage.first_index() == 0
        horizon = lg.segment_bases()[2]
        clean_log(lg, horizon, KEEP_DELETES, force=True)
        assert storage.first_index() == horizon
        with pytest.raises(CompactedError):
            storage.entries(horizon - 1, horizon + 1, 1 << 20)
        assert storage.entries(horizon, horizon + 2, 1 << 20)[0].index == horizon
        assert storage.term(horizon - 1) == 1
        # With a snapshot past the cleaned range, the raw entries between them are still served (a
        # follower lagging behind the snapshot catches up from the log and keeps its compacted prefix);
        # the term of the offset before them comes from the leader epoch cache.
        storage.create_snapshot(289, ConfState(voters=(1,)), lambda p: p.write_bytes(b"s"))
        assert storage.first_index() == horizon and storage.term(horizon - 1) == 1
        assert [e.index for e in storage.entries(horizon, 290, 1 << 20)] == list(range(horizon, 290))
    finally:
        storage.close()


def test_offline_export_reads_across_cleaned_segments(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=3, rounds=80)
        clean_log(lg, lg.segment_bases()[-1], KEEP_DELETES, force=True)
        want = records(lg)
        end = lg.end_offset
    got = [(r.offset, r.key.encode(), r.value) for chunk in read_committed(path, 0, end) for r in chunk]
    assert got == want


# --- the background thread and the config -------------------------------------------------------

def test_log_cleaner_thread_cleans_on_request_and_stops_mid_pass(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=3, rounds=200)
        cleaner = LogCleaner(CleanerConfig(delete_retention_ms=10**15))   # a worker process per pass
        try:
            result = cleaner.submit(lg, lg.segment_bases()[3], force=True).result(30)
            assert result.segments_before == 3 and cleaner.last_result == result
        finally:
            cleaner.close(10)
        with pytest.raises(CleanerAbortedError):
            cleaner.submit(lg, 10)
        slow = LogCleaner(CleanerConfig(max_io_bytes_per_second=20_000, delete_retention_ms=10**15))
        assert slow.config.worker_process
        future = slow.submit(lg, lg.segment_bases()[-1], force=True)
        time.sleep(0.3)
        slow.close(10)
        with pytest.raises(CleanerAbortedError):
            future.result(10)
        assert not list(path.glob("*.cleaned")) and not list(path.glob("*.swap"))
    assert verify_log_dir(path).verdict is Verdict.CLEAN


def test_cleaner_config_is_checked():
    assert cleaner_config({"delete_retention_ms": 5}).delete_retention_ms == 5
    with pytest.raises(ConfigError, match="min_cleanable_dirty_ratio"):
        cleaner_config({"min_cleanable_dirty_ratio": 1.5})
    with pytest.raises(ConfigError, match="unknown key"):
        cleaner_config({"dedupe_buffer": 1})
    with pytest.raises(ConfigError, match="offset_map_max_keys"):
        CleanerConfig(offset_map_max_keys=0).validate()


# --- the command ------------------------------------------------------------------------------

def epochlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO)


def test_log_clean_command(tmp_path):
    path = tmp_path / "log"
    with Log.open(path, LogConfig(segment_bytes=4096, index_interval_bytes=256)) as lg:
        fill(lg, keys=3, rounds=100)
        horizon = lg.segment_bases()[-1]
        before = records(lg)
        with_lock = epochlog("log", "clean", str(path), "--below", str(horizon))
        assert with_lock.returncode == 3 and "in use" in with_lock.stderr
    result = epochlog("log", "clean", str(path), "--below", str(horizon), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[0])
    assert report["records_dropped"] > 0 and report["cleaned_through"] == horizon
    verify = epochlog("log", "verify", str(path), "--json")
    assert verify.returncode == 0 and any(s["cleaned"] for s in json.loads(verify.stdout)["segments"])
    dump = epochlog("log", "dump", str(path), "--json")
    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert rows[0]["cleaned"] is True
    with Log.open(path, CFG) as lg:
        after = records(lg)
    below = [t for t in before if t[0] < horizon]
    latest = {k: o for o, k, _ in below}
    assert after == [t for t in before if t[0] >= horizon or latest[t[1]] == t[0]]
    usage = epochlog("log", "clean", str(path))
    assert usage.returncode == 64


def test_empty_batches_below_the_horizon_are_dropped_control_batches_compacted_by_key(log):
    from eventlog.records import _finish
    from eventlog.raft.runtime.entries import NOOP_KEY

    empty = _finish(b"", 0, 0, 0, 2, 1_000, 1_000, -1, -1, -1, 0)   # 3 offsets, no record
    gone = log.append(empty, epoch=1).base_offset
    noops = [log.append(encode_records([Record(0, -1, NOOP_KEY, b"")], control=True), epoch=1).base_offset
             for _ in range(3)]
    fill(log, keys=2, rounds=80)
    horizon = log.segment_bases()[-1]
    clean_log(log, horizon, KEEP_DELETES, force=True)
    bases = [b.header.base_offset for b in log.batches()]
    assert gone not in bases
    assert [o for o in noops if o in bases] == [noops[-1]], "the latest control record of its key stays"
    assert all(b.header.is_control for b in log.batches() if b.header.base_offset == noops[-1])


def test_a_worker_process_writes_exactly_what_the_thread_writes(tmp_path):
    import random
    import shutil

    rng = random.Random(11)
    base = tmp_path / "base"
    with Log.open(base, CFG) as lg:
        write_random(lg, rng, 300, key_space=25)
        horizon = lg.segment_bases()[-1]
    shutil.copytree(base, tmp_path / "thread")
    shutil.copytree(base, tmp_path / "worker")
    results = {}
    for mode in ("thread", "worker"):
        with Log.open(tmp_path / mode, CFG) as lg:
            results[mode] = clean_log(lg, horizon, CleanerConfig(worker_process=mode == "worker",
                                                                 delete_retention_ms=10**15), force=True)
    assert results["worker"].records_dropped == results["thread"].records_dropped > 0
    for path in sorted((tmp_path / "thread").iterdir()):
        if path.suffix in (".log", ".index", ".timeindex") or path.name == CHECKPOINT_NAME:
            assert path.read_bytes() == (tmp_path / "worker" / path.name).read_bytes(), path.name
    assert results["worker"].pass_rss_anon_kib > 0


def test_a_second_pass_on_the_same_log_is_refused_while_one_runs(tmp_path):
    import fcntl
    import os

    from compaction.rewrite import CLEANER_LOCK_NAME
    path = tmp_path / "log"
    with Log.open(path, CFG) as lg:
        fill(lg, keys=2, rounds=80)
        fd = os.open(path / CLEANER_LOCK_NAME, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)     # as a worker left running by a node that died would
        try:
            busy = clean_log(lg, lg.segment_bases()[-1], CleanerConfig(), force=True)
            assert busy.aborted and "cleaning pass holds" in busy.aborted and busy.segments_before == 0
        finally:
            os.close(fd)
        assert clean_log(lg, lg.segment_bases()[-1], CleanerConfig(), force=True).segments_before > 0
