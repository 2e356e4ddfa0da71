"""Benchmark of the segmented log (eventlog.log.Log) on this machine's disk.

    python -m bench.log_bench [--quick] [--dir DIR] [--seconds S] [--records N] [--quiet-wait S]
                              [--no-results]

What is measured (every figure comes from this run; nothing is copied from elsewhere):

1. disk     fdatasync latency of 4 KiB overwrites in a preallocated, synced file (the
            `prealloc+fdatasync` pattern of the etcd anchor's fsync_probe.py); one fdatasync of
            64 MiB of dirty data; the time `prepare_file` takes for a 64 MiB segment; and fdatasync
            after 220-byte appends written with pwrite (what `Segment.write` does) vs through a
            writable shared mapping (what it did first, and why it no longer does).
2. append   throughput and latency per flush policy, on pre-encoded batches and with `encode_batch`
            inside the timed region (a Raft leader encodes every proposal):
              fsync     latency of `append` (durable on return), 1 appender
              group     latency of `append` + `wait_durable(last offset)` (durable acks only),
                        1, 4 and 16 appender threads (and 64 with 100-record batches)
              interval  latency of `append` only (NOT durable on return), 1 appender
            each with batches of 1 record and of 100 records (proposer-side batching).
3. read     sequential `Log.read` over the whole log: zero-copy views, batch headers, and fully
            decoded records.
4. recover  `Log.open` after deleting `log-offsets-checkpoint`, so every segment is scanned from
            offset 0 with a CRC check of every batch; page cache warm and cold.
5. codec    `encode_batch` against kafka-python's `DefaultRecordBatchBuilder` building the same
            100-record batches (the bytes are compared), CRC checking and decoding.
6. roll     the latency of the appends that rolled a segment against the median append, with the
            time the roll waited for the background preallocation and how long each background
            `prepare_file` took (timed by wrapping it; behaviour is unchanged).

Records: every record is a 16-byte random key plus a 134-byte random value (150 bytes of payload),
no headers, one timestamp per batch. Encoded, a 1-record batch is 220 bytes and a 100-record batch
15,997 bytes (160 bytes per record with the batch header): MB/s columns count those log bytes
(1 MB = 10^6 bytes).

Segments are 64 MiB (the default `LogConfig`); each measurement runs on a fresh log in a scratch
directory created under DIR (default bench/out/, git-ignored, on the repository's disk) and removed
at the end. Each append cell runs three windows of S/3 seconds; throughput and latency percentiles
cover all three (so segment rolls count at their natural rate), and the slowest and fastest window
are shown as the spread. Recovery and reads report the median of three runs. The machine is shared:
the run first waits (bounded) for other processes to go quiet, and reports the CPU they used.
The result goes to stdout and to the `log` section of bench/RESULTS.md (bench.results.write_section)
unless --no-results.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.results import write_section
from eventlog.config import LogConfig
from eventlog.log import OFFSETS_CHECKPOINT_NAME, Log
from eventlog.records import RecordBatch, check_batch, encode_batch

KEY_BYTES = 16
VALUE_BYTES = 134
EPOCH = 1
GROUP_TARGET = 500_000        # durable records/s under the group policy (the target)
RECOVERY_TARGET = 5_000_000   # records/s of the open-time scan with 100-record batches
BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"


# --- small helpers ---------------------------------------------------------------------------------

def pct(sorted_ns: Sequence[int], q: float) -> float:
    """Percentile q (0..1) of sorted nanosecond samples, in microseconds (nearest rank)."""
    if not sorted_ns:
        return float("nan")
    i = min(len(sorted_ns) - 1, max(0, int(q * len(sorted_ns) + 0.5) - 1))
    return sorted_ns[i] / 1e3


def fmt_rate(x: float) -> str:
    if x != x:  # NaN
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def fmt_us(us: float) -> str:
    if us != us:
        return "-"
    if us >= 10_000:
        return f"{us / 1e3:.1f} ms"
    if us >= 1_000:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.0f} us" if us >= 10 else f"{us:.1f} us"


def make_entries(n: int, rng_seed: int) -> list[tuple[bytes, bytes]]:
    """n (key, value) pairs of random bytes (deterministic for a seed)."""
    rng = random.Random(rng_seed)
    return [(rng.randbytes(KEY_BYTES), rng.randbytes(VALUE_BYTES)) for _ in range(n)]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def cpu_user_sys() -> tuple[float, float]:
    t = os.times()
    return t.user, t.system


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (user+nice+system+irq+softirq, /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / _CLK_TCK


class CpuMeter:
    """This process's CPU and everybody else's, in cores, over an interval (the machine is shared)."""

    def __init__(self) -> None:
        self.wall0 = time.perf_counter()
        self.user0, self.sys0 = cpu_user_sys()
        self.busy0 = machine_busy_seconds()

    def read_all(self) -> tuple[float, float, float]:
        """(own user cores, own system cores, other processes' cores)."""
        wall = time.perf_counter() - self.wall0
        user, system = cpu_user_sys()
        user -= self.user0
        system -= self.sys0
        other = machine_busy_seconds() - self.busy0 - user - system
        return user / wall, system / wall, max(0.0, other / wall)

    def read(self) -> tuple[float, float]:
        """(own cores, other processes' cores)."""
        user, system, other = self.read_all()
        return user + system, other


def wait_quiet(max_wait: float, progress: Callable[[str], None]) -> float:
    """Wait (bounded) until other processes use < 0.25 cores over 1 s; returns their last load."""
    deadline = time.monotonic() + max_wait
    while True:
        meter = CpuMeter()
        time.sleep(1.0)
        _, other = meter.read()
        if other < 0.25 or time.monotonic() >= deadline:
            return other
        progress(f"  machine busy ({other:.2f} cores used by other processes); waiting ...")


def wait_preallocated(log: Log, timeout: float = 10.0) -> None:
    """Wait until the background preallocation of the next segment has finished.

    A fresh log prepares its second segment in the background right after opening; letting that
    finish keeps it from competing with the first second of a measurement. This peeks at private
    state (read-only) and silently does nothing if that state is not there.
    """
    pre = getattr(log, "_preallocator", None)
    if pre is None or not hasattr(pre, "_busy"):
        return
    deadline = time.monotonic() + timeout
    while getattr(pre, "_busy", False) and time.monotonic() < deadline:
        time.sleep(0.005)


class Scratch:
    """Fresh log directories inside one scratch directory that is removed at the end."""

    def __init__(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="log-bench-", dir=parent))
        self._n = 0

    def fresh(self, name: str) -> Path:
        self._n += 1
        return self.root / f"{self._n:02d}-{name}"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def drop_cache(path: Path) -> None:
    """Evict a directory's files from the page cache (POSIX_FADV_DONTNEED; the files are synced)."""
    for p in path.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --- 1. disk ---------------------------------------------------------------------------------------

@dataclass
class SyncPattern:
    name: str
    p50_us: float
    p99_us: float


@dataclass
class DiskResult:
    count: int
    p50_us: float
    p99_us: float
    max_us: float
    syncs_per_s: float
    bulk_mb: int
    bulk_seconds: float
    patterns: list[SyncPattern] = field(default_factory=list)
    prepare_ms: float = float("nan")


def bench_disk(root: Path, count: int) -> DiskResult:
    bs = 4096
    buf = os.urandom(bs)
    path = root / "fsync-probe.tmp"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, count * bs)
        os.pwrite(fd, bytes(count * bs), 0)  # written extents, not unwritten ones
        os.fsync(fd)
        lat: list[int] = []
        t_start = time.perf_counter()
        for i in range(count):
            os.pwrite(fd, buf, i * bs)
            t0 = time.perf_counter_ns()
            os.fdatasync(fd)
            lat.append(time.perf_counter_ns() - t0)
        wall = time.perf_counter() - t_start
        # Bulk write-back: what a roll under the interval policy pays for a dirty 64 MiB segment.
        bulk = 64 << 20
        chunk = os.urandom(1 << 20)
        os.posix_fallocate(fd, 0, bulk)
        os.pwrite(fd, bytes(bulk), 0)
        os.fsync(fd)
        for off in range(0, bulk, len(chunk)):
            os.pwrite(fd, chunk, off)
        t0b = time.perf_counter()
        os.fdatasync(fd)
        bulk_s = time.perf_counter() - t0b
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    lat.sort()
    result = DiskResult(count, pct(lat, .5), pct(lat, .99), lat[-1] / 1e3, count / wall, 64, bulk_s)
    result.patterns, result.prepare_ms = _segment_sync_patterns(root, count)
    return result


def _segment_sync_patterns(root: Path, count: int) -> tuple[list[SyncPattern], float]:
    """fdatasync after small appends to a file made by the log's own `prepare_file`, written
    with pwrite (what `Segment.write` does) or through a writable shared mapping."""
    import mmap

    from eventlog.segment import prepare_file

    patterns = []
    prepare_ms = float("nan")
    record = os.urandom(220)  # one 1-record batch
    for how in ("pwrite", "mmap"):
        path = root / f"segment-probe-{how}.tmp"
        t0 = time.perf_counter()
        fd, readonly = prepare_file(path, 64 << 20)
        if how == "pwrite":
            prepare_ms = (time.perf_counter() - t0) * 1e3
        readonly.close()
        mm = mmap.mmap(fd, 64 << 20)  # writable, as a write-through-the-map design would use
        view = memoryview(mm)
        lat: list[int] = []
        try:
            for i in range(count):
                pos = i * len(record)
                t0n = time.perf_counter_ns()
                if how == "pwrite":
                    os.pwrite(fd, record, pos)
                else:
                    view[pos:pos + len(record)] = record
                os.fdatasync(fd)
                lat.append(time.perf_counter_ns() - t0n)
        finally:
            view.release()
            mm.close()
            os.close(fd)
            path.unlink(missing_ok=True)
        lat.sort()
        label = ("220 B appended with pwrite + fdatasync (as Segment.write)" if how == "pwrite"
                 else "220 B appended through a writable shared mmap + fdatasync")
        patterns.append(SyncPattern(label, pct(lat, .5), pct(lat, .99)))
    return patterns, prepare_ms


# --- 2. appends ------------------------------------------------------------------------------------

@dataclass
class AppendCell:
    policy: str
    batch: int
    threads: int
    encode: bool
    durable: bool
    rates: list[float] = field(default_factory=list)      # records/s per window
    records: int = 0                                      # over all windows
    bytes: int = 0
    seconds: float = 0.0
    lat_ns: list[int] = field(default_factory=list)
    user_cpu: float = 0.0                                 # this process, CPU s / wall s
    sys_cpu: float = 0.0
    other_cpu: float = 0.0                                # other processes' CPU s / wall s
    syncs: int = 0                                        # durability notifications (~ syncs)
    segments: int = 0
    error: str | None = None

    @property
    def rate(self) -> float:
        """Records/s over all windows: segment rolls count at the rate they really happen."""
        return self.records / self.seconds if self.seconds else float("nan")

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else float("nan")

    @property
    def spread(self) -> str:
        """Slowest and fastest window."""
        if not self.rates:
            return "-"
        return f"{fmt_rate(min(self.rates))}-{fmt_rate(max(self.rates))}"

    @property
    def cpu(self) -> float:
        return self.user_cpu + self.sys_cpu

    @property
    def per_sync(self) -> str:
        return f"{self.records / self.syncs:,.0f}" if self.syncs else "-"

    def label(self) -> str:
        return (f"{self.policy:<8} batch {self.batch:>3}  threads {self.threads:>2}  "
                f"{'encode' if self.encode else 'pre-encoded'}")


class BatchSource:
    """Batches to append: pre-encoded (a pool cycled through) or encoded per append."""

    def __init__(self, batch: int, pool: int = 16) -> None:
        self.batch = batch
        self.entries = [make_entries(batch, seed) for seed in range(pool)]
        ts = now_ms()
        self.encoded = [encode_batch(e, timestamp_ms=ts) for e in self.entries]
        self.size = len(self.encoded[0])


def run_append_cell(scratch: Scratch, cell: AppendCell, source: BatchSource, seconds: float,
                    windows: int = 3) -> None:
    config = LogConfig(flush_policy=cell.policy)  # type: ignore[arg-type]
    directory = scratch.fresh(f"{cell.policy}-b{cell.batch}-t{cell.threads}")
    log = Log.open(directory, config)
    notifications = [0]
    try:
        wait_preallocated(log)
        # Durability advances once per sync (per append under `fsync`, per flusher sync otherwise).
        log.add_durability_listener(lambda _offset: notifications.__setitem__(0, notifications[0] + 1))
        window = seconds / windows
        meter = CpuMeter()
        for _ in range(windows):
            records, nbytes, lat, elapsed, error = _append_window(log, cell, source, window)
            if error:
                cell.error = error
                break
            cell.rates.append(records / elapsed)
            cell.records += records
            cell.bytes += nbytes
            cell.seconds += elapsed
            cell.lat_ns.extend(lat)
        cell.user_cpu, cell.sys_cpu, cell.other_cpu = meter.read_all()
        cell.syncs = notifications[0]
        cell.segments = len(log.segment_bases())
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    cell.lat_ns.sort()


def _append_window(log: Log, cell: AppendCell, source: BatchSource,
                   seconds: float) -> tuple[int, int, list[int], float, str | None]:
    n = cell.threads
    per_thread: list[tuple[int, int, list[int]]] = [(0, 0, [])] * n
    errors: list[str] = []
    start = threading.Barrier(n + 1)
    deadline = [0.0]
    durable = cell.durable
    encode = cell.encode

    def worker(i: int) -> None:
        lat: list[int] = []
        records = nbytes = 0
        pool = source.encoded
        entries = source.entries
        k = len(pool)
        j = i
        perf = time.perf_counter
        perf_ns = time.perf_counter_ns
        append = log.append
        wait = log.wait_durable
        start.wait()
        end = deadline[0]
        try:
            while perf() < end:
                t0 = perf_ns()
                if encode:
                    batch = encode_batch(entries[j % k], timestamp_ms=now_ms())
                else:
                    batch = pool[j % k]
                info = append(batch, epoch=EPOCH)
                if durable:
                    wait(info.last_offset)
                lat.append(perf_ns() - t0)
                records += info.last_offset - info.base_offset + 1
                nbytes += info.size
                j += 1
        except Exception as exc:  # report, don't hang the benchmark
            errors.append(f"{type(exc).__name__}: {exc}")
        per_thread[i] = (records, nbytes, lat)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    gc.collect()
    gc.disable()  # latency lists grow to millions of ints: keep the cyclic GC out of the timings
    try:
        deadline[0] = time.perf_counter() + seconds
        t_start = time.perf_counter()
        start.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t_start
    finally:
        gc.enable()
    records = sum(r for r, _, _ in per_thread)
    nbytes = sum(b for _, b, _ in per_thread)
    lat = [x for _, _, lt in per_thread for x in lt]
    return records, nbytes, lat, elapsed, (errors[0] if errors else None)


def bench_appends(scratch: Scratch, seconds: float, sources: dict[int, BatchSource],
                  progress: Callable[[str], None]) -> list[AppendCell]:
    cells: list[AppendCell] = []
    for encode in (False, True):
        for batch in (1, 100):
            cells.append(AppendCell("fsync", batch, 1, encode, durable=False))
            for threads in (1, 4, 16) if batch == 1 else (1, 4, 16, 64):
                cells.append(AppendCell("group", batch, threads, encode, durable=True))
            cells.append(AppendCell("interval", batch, 1, encode, durable=False))
    for cell in cells:
        run_append_cell(scratch, cell, sources[cell.batch], seconds)
        progress(_append_row_text(cell))
    return cells


def _append_row_text(c: AppendCell) -> str:
    lat = c.lat_ns
    err = f"  ERROR {c.error}" if c.error else ""
    return (f"  {c.label():<48} {fmt_rate(c.rate):>8} rec/s ({c.spread:>13}) {c.mb_s:6.1f} MB/s  "
            f"p50 {fmt_us(pct(lat, .5)):>9}  p99 {fmt_us(pct(lat, .99)):>9}  "
            f"max {fmt_us(lat[-1] / 1e3 if lat else float('nan')):>9}  rec/sync {c.per_sync:>6}  "
            f"cpu {c.user_cpu:.2f}u+{c.sys_cpu:.2f}s other {c.other_cpu:.2f}{err}")


# --- 3/4. bulk log, recovery and reads --------------------------------------------------------------

@dataclass
class BulkLog:
    directory: Path
    records: int
    bytes: int
    segments: int
    load_seconds: float


def build_bulk_log(scratch: Scratch, records: int, source: BatchSource) -> BulkLog:
    """Fill a log with `records` records in 100-record batches (group policy, no waiting)."""
    directory = scratch.fresh("bulk")
    log = Log.open(directory, LogConfig(flush_policy="group"))
    try:
        wait_preallocated(log)
        pool = source.encoded
        batches = records // source.batch
        t0 = time.perf_counter()
        for i in range(batches):
            log.append(pool[i % len(pool)], epoch=EPOCH)
        log.flush()
        load = time.perf_counter() - t0
        end = log.end_offset
        segments = len(log.segment_bases())
    finally:
        log.close()
    # The active segment is preallocated: count only its data (batches are all the same size).
    return BulkLog(directory, end, end // source.batch * source.size, segments, load)


@dataclass
class RecoveryRun:
    cache: str
    wall: float
    scan_seconds: float
    records: int
    bytes: int
    segments_scanned: int


def bench_recovery(bulk: BulkLog, warm_runs: int) -> tuple[list[RecoveryRun], float]:
    runs: list[RecoveryRun] = []
    checkpoint = bulk.directory / OFFSETS_CHECKPOINT_NAME
    for cache in ["warm"] * warm_runs + ["cold"]:
        checkpoint.unlink(missing_ok=True)
        if cache == "cold":
            drop_cache(bulk.directory)
        t0 = time.perf_counter()
        log = Log.open(bulk.directory)
        wall = time.perf_counter() - t0
        rep = log.recovery
        log.close()
        assert rep is not None
        if rep.records_scanned != bulk.records:
            raise SystemExit(f"recovery scanned {rep.records_scanned} records, expected {bulk.records}")
        runs.append(RecoveryRun(cache, wall, rep.seconds, rep.records_scanned, rep.bytes_scanned,
                                rep.segments_scanned))
    # For contrast: a normal open (checkpoint present: only the active segment is scanned).
    t0 = time.perf_counter()
    log = Log.open(bulk.directory)
    normal = time.perf_counter() - t0
    log.close()
    return runs, normal


@dataclass
class ReadResult:
    mode: str
    records: int
    bytes: int
    seconds: float
    complete: bool

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / 1e6


def bench_reads(bulk: BulkLog, seconds: float) -> list[ReadResult]:
    results: list[ReadResult] = []
    log = Log.open(bulk.directory)
    try:
        wait_preallocated(log)
        start, end = log.start_offset, log.end_offset
        for mode in ("views", "batches", "records"):
            per_run: list[ReadResult] = []
            for _ in range(3 if mode != "records" else 1):
                per_run.append(_read_pass(log, start, end, mode, seconds))
            per_run.sort(key=lambda r: r.rate)
            results.append(per_run[len(per_run) // 2])
    finally:
        log.close()
    return results


def _read_pass(log: Log, start: int, end: int, mode: str, seconds: float) -> ReadResult:
    offset = start
    records = nbytes = 0
    read = log.read
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while offset < end:
        chunk = read(offset, 1 << 20)
        if mode == "views":
            records += chunk.next_offset - chunk.start_offset
        elif mode == "batches":
            for b in chunk.batches():
                records += b.header.records_count
        else:
            for b in chunk.batches():
                for _r in b.records():
                    records += 1
            if time.perf_counter() > deadline:
                nbytes += len(chunk.data)
                offset = chunk.next_offset
                break
        nbytes += len(chunk.data)
        offset = chunk.next_offset
    return ReadResult(mode, records, nbytes, time.perf_counter() - t0, offset >= end)


# --- 5. codec --------------------------------------------------------------------------------------

@dataclass
class CodecResult:
    name: str
    records_per_s: float
    mb_s: float | None = None
    note: str = ""


def _rate(fn: Callable[[], object], seconds: float, per_call: int) -> float:
    """Records/s of fn() (per_call records each): median of three windows."""
    rates = []
    for _ in range(3):
        n = 0
        t0 = time.perf_counter()
        end = t0 + seconds / 3
        while True:
            for _ in range(20):
                fn()
            n += 20
            now = time.perf_counter()
            if now >= end:
                break
        rates.append(n * per_call / (now - t0))
    return statistics.median(rates)


def bench_codec(seconds: float, source: BatchSource) -> tuple[list[CodecResult], bool]:
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    entries = source.entries[0]
    ts = now_ms()

    def ours() -> bytes:
        return encode_batch(entries, timestamp_ms=ts)

    def kafka() -> bytes:
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i, (k, v) in enumerate(entries):
            b.append(i, timestamp=ts, key=k, value=v, headers=[])
        return bytes(b.build())

    identical = ours() == kafka()
    batch = ours()
    n = len(entries)
    share = seconds / 6
    r_ours = _rate(ours, share, n)
    r_kafka = _rate(kafka, share, n)
    r_crc = _rate(lambda: check_batch(batch, 0, len(batch)), share, n)
    r_kcrc = _rate(lambda: DefaultRecordBatch(batch).validate_crc(), share, n)
    r_dec = _rate(lambda: list(RecordBatch.parse(batch).records()), share, n)
    r_kdec = _rate(lambda: list(DefaultRecordBatch(batch)), share, n)
    per_rec = len(batch) / n / 1e6
    return [
        CodecResult("encode_batch (ours)", r_ours, r_ours * per_rec),
        CodecResult("kafka-python DefaultRecordBatchBuilder", r_kafka, r_kafka * per_rec),
        CodecResult("check_batch: header + CRC32C (ours)", r_crc, r_crc * per_rec),
        CodecResult("kafka-python DefaultRecordBatch.validate_crc", r_kcrc, r_kcrc * per_rec),
        CodecResult("decode records (ours, CRC checked)", r_dec, r_dec * per_rec),
        CodecResult("kafka-python DefaultRecordBatch iteration", r_kdec, r_kdec * per_rec),
    ], identical


# --- 6. roll stalls --------------------------------------------------------------------------------

@dataclass
class RollResult:
    policy: str
    appends: int
    rolls: int
    median_us: float
    p99_us: float
    max_other_us: float
    roll_us: list[float]
    prealloc_wait_us: list[float]
    prepare_us: list[float]
    seconds: float


def bench_roll(scratch: Scratch, policy: str, source: BatchSource, rolls_wanted: int,
               max_seconds: float) -> RollResult:
    import eventlog.preallocate as preallocate

    directory = scratch.fresh(f"roll-{policy}")
    # Diagnostic only (behaviour unchanged): time each background preparation of a segment file.
    prepares: list[float] = []
    original_prepare = preallocate.prepare_file

    def timed_prepare(path: Path, size: int) -> object:
        t0 = time.perf_counter_ns()
        try:
            return original_prepare(path, size)
        finally:
            prepares.append((time.perf_counter_ns() - t0) / 1e3)

    preallocate.prepare_file = timed_prepare  # type: ignore[assignment]
    try:
        log = Log.open(directory, LogConfig(flush_policy=policy))  # type: ignore[arg-type]
    except BaseException:
        preallocate.prepare_file = original_prepare
        raise
    waits: list[float] = []
    pre = getattr(log, "_preallocator", None)
    if pre is not None and hasattr(pre, "take"):
        # Diagnostic only: time how long a roll waits for the background preallocation.
        original = pre.take

        def timed_take() -> object:
            t0 = time.perf_counter_ns()
            try:
                return original()
            finally:
                waits.append((time.perf_counter_ns() - t0) / 1e3)

        pre.take = timed_take
    lat: list[int] = []
    roll_lat: list[float] = []
    try:
        wait_preallocated(log)
        pool = source.encoded
        k = len(pool)
        i = 0
        perf_ns = time.perf_counter_ns
        gc.collect()
        gc.disable()
        t_start = time.perf_counter()
        deadline = t_start + max_seconds
        while len(roll_lat) < rolls_wanted and time.perf_counter() < deadline:
            t0 = perf_ns()
            info = log.append(pool[i % k], epoch=EPOCH)
            dt = perf_ns() - t0
            i += 1
            if info.position == 0 and info.base_offset > 0:
                roll_lat.append(dt / 1e3)
            else:
                lat.append(dt)
        elapsed = time.perf_counter() - t_start
        gc.enable()
    finally:
        gc.enable()
        log.close()
        preallocate.prepare_file = original_prepare
        shutil.rmtree(directory, ignore_errors=True)
    all_sorted = sorted(lat + [int(r * 1e3) for r in roll_lat])
    lat.sort()
    # The first preparation ran before the measurement (wait_preallocated) and the one started by
    # the last roll partly after it: keep those that ran entirely while appending.
    during = prepares[1:len(roll_lat)]
    return RollResult(policy, len(all_sorted), len(roll_lat), pct(all_sorted, .5), pct(lat, .99),
                      lat[-1] / 1e3 if lat else float("nan"), roll_lat, waits, during, elapsed)


# --- report ----------------------------------------------------------------------------------------

@dataclass
class Results:
    args: argparse.Namespace
    disk: DiskResult
    cells: list[AppendCell]
    bulk: BulkLog
    recovery: list[RecoveryRun]
    normal_open: float
    reads: list[ReadResult]
    codec: list[CodecResult]
    identical: bool
    rolls: list[RollResult]
    sizes: dict[int, int]
    wall: float
    load_before: tuple[float, float, float]
    other_cpu: float = 0.0   # other processes' cores over the whole run
    section_other: dict[str, float] = field(default_factory=dict)  # ... per section

    def other(self, section: str) -> str:
        value = self.section_other.get(section)
        return "" if value is None else f" Other processes used {value:.2f} cores meanwhile."


def best_group(cells: list[AppendCell], encode: bool) -> AppendCell | None:
    group = [c for c in cells if c.policy == "group" and c.encode == encode and not c.error]
    return max(group, key=lambda c: c.rate) if group else None


def render_markdown(r: Results) -> str:
    out: list[str] = []
    a = out.append
    s100, s1 = r.sizes[100], r.sizes[1]
    a(f"Records: 16-byte random key + 134-byte random value (150 B payload), no headers. Encoded batch "
      f"sizes: 1 record = {s1} B, 100 records = {s100:,} B ({s100 / 100:.0f} B/record). MB/s = 10^6 "
      f"bytes of encoded batches. Segments 64 MiB (default `LogConfig`), scratch directory on the "
      f"repository's disk (`{r.args.dir}`), removed afterwards. Each append cell: 3 windows of "
      f"{r.args.seconds / 3:.2f} s on a fresh log; records/s and latency percentiles over all three "
      f"windows (segment rolls included at their natural rate), \"windows\" = slowest-fastest window. "
      f"Load average before the run: "
      f"{' / '.join(f'{x:.2f}' for x in r.load_before)}; whole run {r.wall:.0f} s, during which other "
      f"processes used {r.other_cpu:.2f} cores on average (of 2).")
    a("")
    # Targets first.
    g_pre, g_enc = best_group(r.cells, False), best_group(r.cells, True)
    warm = [x for x in r.recovery if x.cache == "warm"]
    rec_rate = statistics.median(x.records / x.scan_seconds for x in warm)
    a("### Targets")
    a("")
    a("| target | measured | met? |")
    a("|---|---|---|")
    for label, g, encode in (("pre-encoded", g_pre, False), ("encode_batch per append", g_enc, True)):
        if g is None:
            continue
        met = "**met**" if g.rate >= GROUP_TARGET else "**not met**"
        if 0.8 * GROUP_TARGET <= g.rate < 1.25 * GROUP_TARGET:
            met += " (borderline: within run-to-run variation)"
        meeting = [c for c in r.cells if c.policy == "group" and c.encode == encode and not c.error
                   and c.rate >= GROUP_TARGET]
        where = ("; met by " + ", ".join(f"batch {c.batch} x {c.threads} threads ({c.rate:,.0f})"
                                        for c in meeting)) if meeting else ""
        a(f"| group-commit durable appends >= 500,000 records/s ({label}) | best {g.rate:,.0f} records/s "
          f"(batch {g.batch}, {g.threads} threads, p50 {fmt_us(pct(g.lat_ns, .5))}, "
          f"p99 {fmt_us(pct(g.lat_ns, .99))}){where} | {met} |")
    met = "**met**" if rec_rate >= RECOVERY_TARGET else "**not met**"
    a(f"| recovery scan >= 5M records/s (100-record batches) | {rec_rate:,.0f} records/s "
      f"(page cache warm, median of {len(warm)}) | {met} |")
    a("")
    a("### 1. Disk")
    a("")
    d = r.disk
    a(f"fdatasync after a 4 KiB overwrite of a preallocated, synced file ({d.count} syncs, the "
      f"`prealloc+fdatasync` pattern of the etcd anchor's fsync_probe.py): "
      f"p50 {d.p50_us / 1e3:.3f} ms, p99 {d.p99_us / 1e3:.3f} ms, max {d.max_us / 1e3:.3f} ms "
      f"({d.syncs_per_s:,.0f} write+sync/s). One fdatasync of 64 MiB of dirty data: "
      f"{d.bulk_seconds * 1e3:.0f} ms ({d.bulk_mb * 1.048576 / d.bulk_seconds:,.0f} MB/s). "
      f"Preparing one 64 MiB segment file (`eventlog.segment.prepare_file`, idle process): "
      f"{d.prepare_ms:.0f} ms.{r.other('disk')}")
    a("")
    a(f"Same disk, a 64 MiB file made by `prepare_file`, {d.count} appends of 220 B (a 1-record batch), "
      f"one fdatasync each (latency of write + sync):")
    a("")
    a("| pattern | p50 | p99 |")
    a("|---|---|---|")
    for sp in d.patterns:
        a(f"| {sp.name} | {fmt_us(sp.p50_us)} | {fmt_us(sp.p99_us)} |")
    a("")
    a("### 2. Appends")
    a("")
    a("Latency: `fsync` = `append` (durable on return); `group` = `append` + `wait_durable` "
      "(durable acks); `interval` = `append` only (**not durable**: up to 500 ms of appends can be "
      "lost on power failure). records/sync = records per durability notification (one per fdatasync "
      "of the active segment; `interval` syncs every 500 ms and at rolls). CPU = this process's user + "
      "system CPU seconds per wall second; other CPU = the rest of the machine's busy CPU in the same "
      "interval (2 cores in all).")
    a("")
    a("| policy | batch | threads | encoding | records/s | windows | MB/s | p50 | p99 | max | records/sync | "
      "CPU user+sys | other CPU | segments |")
    a("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in r.cells:
        lat = c.lat_ns
        rate = f"{c.rate:,.0f}" + (f" (error: {c.error})" if c.error else "")
        a(f"| {c.policy} | {c.batch} | {c.threads} | {'encode_batch' if c.encode else 'pre-encoded'} | "
          f"{rate} | {c.spread} | {c.mb_s:.1f} | {fmt_us(pct(lat, .5))} | {fmt_us(pct(lat, .99))} | "
          f"{fmt_us(lat[-1] / 1e3 if lat else float('nan'))} | {c.per_sync} | "
          f"{c.user_cpu:.2f}+{c.sys_cpu:.2f} | {c.other_cpu:.2f} | {c.segments} |")
    a("")
    a("### 3. Reads")
    a("")
    a(f"Sequential `Log.read(offset, 1 MiB)` from the start of the {r.bulk.records:,}-record log "
      f"({r.bulk.segments} segments), page cache warm; median of 3 passes (decoding: one pass, time-bounded)."
      f"{r.other('read')}")
    a("")
    a("| read | records/s | MB/s | records read |")
    a("|---|---|---|---|")
    names = {"views": "zero-copy views (`LogRead.data`)",
             "batches": "views + batch headers (`LogRead.batches()`)",
             "records": "fully decoded records (`RecordBatch.records()`)"}
    for x in r.reads:
        a(f"| {names[x.mode]} | {x.rate:,.0f} | {x.mb_s:,.0f} | {x.records:,}"
          f"{'' if x.complete else ' (time-bounded)'} |")
    a("")
    a("### 4. Recovery")
    a("")
    a(f"Log of {r.bulk.records:,} records in 100-record batches, {r.bulk.bytes / 1e6:,.0f} MB, "
      f"{r.bulk.segments} segments (built at {r.bulk.records / r.bulk.load_seconds:,.0f} records/s, "
      f"group policy, no waiting). `log-offsets-checkpoint` deleted before each open, so every "
      f"segment is scanned and every batch CRC-checked. Scan = `log.recovery.seconds`; "
      f"open = wall time of `Log.open`. Cold = files evicted with POSIX_FADV_DONTNEED first."
      f"{r.other('recovery')}")
    a("")
    a("| page cache | segments scanned | scan s | records/s | MB/s | Log.open s |")
    a("|---|---|---|---|---|---|")
    for x in r.recovery:
        a(f"| {x.cache} | {x.segments_scanned} | {x.scan_seconds:.3f} | {x.records / x.scan_seconds:,.0f} | "
          f"{x.bytes / x.scan_seconds / 1e6:,.0f} | {x.wall:.3f} |")
    a(f"| (normal open, checkpoint present) | 1 | | | | {r.normal_open:.3f} |")
    a("")
    a(f"The normal open scans only the active segment and still takes {r.normal_open * 1e3:.0f} ms: part of "
      f"every open's time does not depend on the log's size, so smaller logs recover at fewer records/s.")
    a("")
    a("### 5. Codec (100-record batches)")
    a("")
    ours = r.codec[0].records_per_s
    kafka = r.codec[1].records_per_s
    a(f"Our `encode_batch` output is {'byte-identical' if r.identical else '**NOT** byte-identical'} "
      f"to kafka-python 3.0.12's builder; ours is **{ours / kafka:.1f}x** faster "
      f"(LIBRARY-FACTS expected ~3x).{r.other('codec')}")
    a("")
    a("| operation | records/s | MB/s |")
    a("|---|---|---|")
    for c in r.codec:
        a(f"| {c.name} | {c.records_per_s:,.0f} | {c.mb_s:,.0f} |")
    a("")
    a("### 6. Segment roll stalls")
    a("")
    a("One appender, pre-encoded 100-record batches, append latency only. A roll syncs and seals the "
      "full segment, renames in the preallocated next one and rewrites the offsets checkpoint, all "
      "under the log lock. \"prealloc wait\" = time the roll waited for the background preallocation."
      + r.other("roll"))
    a("")
    a("| policy | appends | rolls | median append | p99 (no roll) | max (no roll) | roll latencies | "
      "max roll / median | prealloc wait per roll | background prepare_file durations |")
    a("|---|---|---|---|---|---|---|---|---|---|")
    for x in r.rolls:
        rl = ", ".join(fmt_us(v) for v in x.roll_us) or "-"
        ratio = max(x.roll_us) / x.median_us if x.roll_us else float("nan")
        pw = ", ".join(fmt_us(v) for v in x.prealloc_wait_us) or "-"
        pd = ", ".join(fmt_us(v) for v in x.prepare_us) or "-"
        a(f"| {x.policy} | {x.appends:,} | {x.rolls} | {fmt_us(x.median_us)} | {fmt_us(x.p99_us)} | "
          f"{fmt_us(x.max_other_us)} | {rl} | {ratio:,.0f}x | {pw} | {pd} |")
    a("")
    a(f"(For contrast, `prepare_file` on an idle process: {r.disk.prepare_ms:.0f} ms.)")
    a("")
    a("### What this means")
    a("")
    a(what_it_means(r, g_pre, g_enc, rec_rate))
    return "\n".join(out) + "\n"


def what_it_means(r: Results, g_pre: AppendCell | None, g_enc: AppendCell | None, rec_rate: float) -> str:
    def cell(policy: str, batch: int, threads: int, encode: bool) -> AppendCell | None:
        for c in r.cells:
            if (c.policy, c.batch, c.threads, c.encode) == (policy, batch, threads, encode) and not c.error:
                return c
        return None

    parts = []
    f1 = cell("fsync", 1, 1, False)
    pw = next((x for x in r.disk.patterns if "pwrite" in x.name), None)
    mm = next((x for x in r.disk.patterns if "mmap" in x.name), None)
    if f1:
        text = (f"Durability is paid per sync, so records per sync decide the durable rate: `fsync` with "
                f"single-record batches reaches {f1.rate:,.0f} records/s (p50 {fmt_us(pct(f1.lat_ns, .5))}).")
        if pw and mm and mm.p50_us > 1.5 * pw.p50_us:
            text += (f" Writing through a writable shared mapping instead of pwrite would make each sync "
                     f"dearer: {fmt_us(mm.p50_us)} p50 against {fmt_us(pw.p50_us)} after a pwrite of the same "
                     f"bytes ({mm.p50_us / pw.p50_us:.1f}x), which is why `Segment.write` uses pwritev and "
                     f"keeps the mapping for reads.")
        parts.append(text)
    if g_pre:
        verdict = "is met" if g_pre.rate >= GROUP_TARGET else "is not met"
        text = (f"The 500k records/s group-commit target {verdict} with pre-encoded batches: best "
                f"{g_pre.rate:,.0f} records/s ({g_pre.batch}-record batches, {g_pre.threads} threads, p99 "
                f"{fmt_us(pct(g_pre.lat_ns, .99))})")
        if g_enc:
            verdict = "is met" if g_enc.rate >= GROUP_TARGET else "is not met"
            encode_us = 100 / r.codec[0].records_per_s * 1e6 if r.codec else float("nan")
            text += (f"; when the leader encodes every batch (`encode_batch` in the timed path) it "
                     f"{verdict}: "
                     f"best {g_enc.rate:,.0f} records/s ({g_enc.batch}-record batches, {g_enc.threads} "
                     f"threads): encoding adds ~{encode_us:.0f} us of Python CPU per 100-record batch, run "
                     f"under the GIL by the same threads that append.")
        else:
            text += "."
        parts.append(text)
    if g_pre and g_pre.sys_cpu > g_pre.user_cpu:
        parts.append(
            f"In that cell the process spends more system than user CPU ({g_pre.sys_cpu:.2f} vs "
            f"{g_pre.user_cpu:.2f} cores): the kernel side of writing and syncing, not Python, is the "
            f"larger cost.")
    small = [c for c in r.cells if c.policy == "group" and c.batch == 1 and not c.error]
    if small:
        parts.append(
            f"Without proposer-side batching the target is far out of reach (at most "
            f"{max(c.rate for c in small):,.0f} records/s durable with 1-record batches), and one appender "
            f"waiting for each sync cannot fill a sync either: ~100-record batches with several in flight "
            f"are required.")
    iv = cell("interval", 100, 1, False)
    if iv:
        parts.append(
            f"`interval` appends ({iv.rate:,.0f} records/s with 100-record batches) bound the append path "
            f"itself; they are not durable on return.")
    cold = [x for x in r.recovery if x.cache == "cold"]
    cold_text = (f", {cold[0].records / cold[0].scan_seconds:,.0f} records/s with a cold cache"
                 if cold else "")
    parts.append(
        f"Recovery scans {rec_rate:,.0f} records/s with a warm page cache{cold_text} "
        f"({'meets' if rec_rate >= RECOVERY_TARGET else 'misses'} the 5M/s target). Reads hand out "
        f"zero-copy views at {r.reads[0].rate:,.0f} records/s, but decoding every record in Python runs at "
        f"{r.reads[-1].rate:,.0f} records/s: consumers that only forward bytes should not decode.")
    worst = max((x for x in r.rolls if x.roll_us), key=lambda x: max(x.roll_us), default=None)
    if worst:
        text = (f"Segment rolls are the largest latency outliers: up to {fmt_us(max(worst.roll_us))} "
                f"(`{worst.policy}` policy) against a median append of {fmt_us(worst.median_us)}")
        if worst.prealloc_wait_us and max(worst.prealloc_wait_us) > 0.5 * max(worst.roll_us):
            prepare = fmt_us(statistics.median(worst.prepare_us)) if worst.prepare_us else "?"
            text += (f", mostly waiting for the background preallocation "
                     f"({fmt_us(max(worst.prealloc_wait_us))}), which takes {prepare} "
                     f"under load against {r.disk.prepare_ms:.0f} ms idle")
        parts.append(text + ".")
    noisy = [c for c in r.cells if c.other_cpu >= 0.25]
    if r.other_cpu >= 0.15 or noisy:
        parts.append(f"Other processes used {r.other_cpu:.2f} cores on average during this run "
                     f"({len(noisy)} append cells saw >= 0.25 cores of other load): absolute figures are "
                     f"lower than on an idle machine.")
    parts.append("Numbers vary 10-50 % between runs on this shared 2-core machine; compare ratios within "
                 "one run.")
    return " ".join(parts)


def render_text(r: Results) -> str:
    """The stdout report: the markdown tables are readable as text too."""
    return render_markdown(r)


# --- main ------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.log_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="~1 s per measurement and a 1M-record recovery log (about 45 s in all)")
    ap.add_argument("--dir", type=Path, default=OUT_DIR,
                    help="parent of the scratch directory (default: bench/out/, on the repo's disk)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="seconds per append cell and per read/codec measurement (default 3, --quick 1)")
    ap.add_argument("--records", type=int, default=None,
                    help="records in the recovery/read log (default 3,000,000; --quick 1,000,000)")
    ap.add_argument("--no-results", action="store_true", help="print only; do not touch bench/RESULTS.md")
    ap.add_argument("--quiet-wait", type=float, default=None,
                    help="wait up to this many seconds for other processes to go idle first "
                         "(default 20, --quick 3)")
    args = ap.parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 3.0
    if args.records is None:
        args.records = 1_000_000 if args.quick else 3_000_000
    if args.quiet_wait is None:
        args.quiet_wait = 3.0 if args.quick else 20.0
    args.fsync_count = 300 if args.quick else 1000
    args.rolls = 2 if args.quick else 4
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_begin = time.perf_counter()
    load_before = os.getloadavg()

    def progress(msg: str) -> None:
        print(msg, flush=True)

    scratch = Scratch(args.dir)
    progress(f"log bench: scratch {scratch.root}, {args.seconds:g} s per measurement, "
             f"{args.records:,}-record recovery log, Python {platform.python_version()}, "
             f"{os.cpu_count()} cores, load {load_before[0]:.2f}")
    other = wait_quiet(args.quiet_wait, progress)
    if other >= 0.25:
        progress(f"  still busy after {args.quiet_wait:g} s ({other:.2f} cores used by others): "
                 f"running anyway")
    run_meter = CpuMeter()
    try:
        section_other: dict[str, float] = {}
        progress("1. disk: fdatasync latency ...")
        meter = CpuMeter()
        disk = bench_disk(scratch.root, args.fsync_count)
        section_other["disk"] = meter.read()[1]
        progress(f"  fdatasync p50 {disk.p50_us / 1e3:.3f} ms  p99 {disk.p99_us / 1e3:.3f} ms  "
                 f"max {disk.max_us / 1e3:.3f} ms; 64 MiB write-back {disk.bulk_seconds * 1e3:.0f} ms; "
                 f"prepare_file 64 MiB {disk.prepare_ms:.0f} ms")
        for sp in disk.patterns:
            progress(f"  {sp.name:<72} p50 {fmt_us(sp.p50_us):>9}  p99 {fmt_us(sp.p99_us):>9}")
        sources = {1: BatchSource(1), 100: BatchSource(100)}
        sizes = {k: s.size for k, s in sources.items()}
        progress(f"2. appends (batch bytes: 1 record {sizes[1]} B, 100 records {sizes[100]} B) ...")
        cells = bench_appends(scratch, args.seconds, sources, progress)
        progress(f"3/4. building a {args.records:,}-record log, recovery and reads ...")
        bulk = build_bulk_log(scratch, args.records, sources[100])
        meter = CpuMeter()
        recovery, normal = bench_recovery(bulk, warm_runs=3)
        section_other["recovery"] = meter.read()[1]
        for x in recovery:
            progress(f"  recovery ({x.cache}): {x.records / x.scan_seconds:,.0f} records/s, "
                     f"{x.bytes / x.scan_seconds / 1e6:,.0f} MB/s, scan {x.scan_seconds:.3f} s, "
                     f"open {x.wall:.3f} s, {x.segments_scanned} segments")
        meter = CpuMeter()
        reads = bench_reads(bulk, args.seconds)
        section_other["read"] = meter.read()[1]
        for rd in reads:
            progress(f"  read {rd.mode:<8} {rd.rate:,.0f} records/s {rd.mb_s:,.0f} MB/s")
        shutil.rmtree(bulk.directory, ignore_errors=True)
        progress("5. codec ...")
        meter = CpuMeter()
        codec, identical = bench_codec(args.seconds * 2, sources[100])
        section_other["codec"] = meter.read()[1]
        for c in codec:
            progress(f"  {c.name:<46} {c.records_per_s:>12,.0f} records/s")
        progress("6. roll stalls ...")
        meter = CpuMeter()
        rolls = [bench_roll(scratch, policy, sources[100], args.rolls, max_seconds=10 * args.seconds)
                 for policy in ("group", "interval")]
        section_other["roll"] = meter.read()[1]
        for x in rolls:
            progress(f"  {x.policy}: {x.rolls} rolls {[fmt_us(v) for v in x.roll_us]} median append "
                     f"{fmt_us(x.median_us)}; prealloc waits {[fmt_us(v) for v in x.prealloc_wait_us]}; "
                     f"prepare_file {[fmt_us(v) for v in x.prepare_us]}")
    finally:
        scratch.remove()
    results = Results(args, disk, cells, bulk, recovery, normal, reads, codec, identical, rolls, sizes,
                      time.perf_counter() - t_begin, load_before, run_meter.read()[1], section_other)
    md = render_markdown(results)
    print()
    print(render_text(results))
    if not args.no_results:
        command = " ".join(["python -m bench.log_bench", *(sys.argv[1:] if argv is None else argv)])
        write_section("log", md, command=command.strip())
        print(f"wrote section 'log' of {BENCH_DIR / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
