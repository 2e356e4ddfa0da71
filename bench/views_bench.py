"""Benchmark of the materialized views (statemachines/): apply, reads, memory and disk on RocksDB.

    python -m bench.views_bench [--quick] [--keys 1000000,10000000] [--seconds S] [--dir DIR]
                                [--version-keys K] [--updates U] [--out FILE] [--no-results]

Everything runs on real RocksDB directories (rocksdict, the default `ViewsConfig`: 64 MiB block
cache with the memtables charged to it through a 32 MiB write buffer manager) in a scratch
directory under DIR (default bench/out/, git-ignored, on the repository's disk), removed at the end.

Events are `KvPut`s of a 100-byte random value under `kv/app/<16 hex digits>` (a multiplicative
hash of the key number, so keys arrive in random order), with an actor and a unique request id
(every event also writes its dedupe rows, as a client's retry-safe write does). They are encoded
into record batches outside the timed region; the timed region is `ViewsStateMachine.apply` alone,
called with committed Raft `Entry` objects as a group's loop calls it: 1000 events per call, as
10 entries of 100 records (a leader coalesces queued proposals into one entry per cycle).

1. size runs   one FRESH subprocess per key count (--keys), so sizes do not share memory:
               load N new keys (progress every few seconds), then memory (VmRSS and the peak
               VmHWM from /proc/self/status, RocksDB's block cache, memtable and table-reader
               figures), flush the memtables and measure the views directory on disk, then reads
               for S seconds each: `Query.get` of random existing keys (current, and `as_of` the
               offset reached halfway through the load, for keys loaded before it), `Query.list`
               first pages (limit 100) under random 3-hex-digit prefixes (current and `as_of`),
               and finally S seconds of a mixed load (half updates of random existing keys, half
               new keys). Memory is read again after the reads and at the end.
2. aux run     another fresh subprocess: apply throughput by batch shape (entries per apply call x
               records per entry, with and without request ids) on small fresh stores; then the
               versions overhead: K keys, a full flush + compaction, bytes per key by column family;
               then U rounds that update every key once (random order), each followed by a flush +
               compaction and a measurement (1, 2, ... U+1 versions per key).

The machine is shared: the run first waits (bounded) for other processes to go quiet, and every
phase reports the CPU other processes used meanwhile. Results go to stdout and to the `views`
section of bench/RESULTS.md (or --out FILE) unless --no-results.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import bench.results as bench_results
from bench.log_bench import CpuMeter, fmt_us, pct, wait_quiet
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.query import Query
from statemachines.store import ALL_CFS, ViewsConfig
from statemachines.views import ViewsStateMachine

BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"
VALUE_BYTES = 100
PER_APPLY = 1000          # events per apply call
PER_ENTRY = 100           # records per Raft entry
RSS_TARGET_MB = 300       # at 10M keys (the target)
GROWTH_TARGET = 2.0       # "far slower than the key count": RSS ratio at most this for 10x the keys
MASK = (1 << 64) - 1
MULT = 0x9E3779B97F4A7C15  # odd: i -> i * MULT mod 2^64 is a bijection, so names never collide
TIMESTAMP_MS = 1_700_000_000_000
DEDUPE_CFS = ("dedupe", "dedupe_expiry")
MB = 1e6


def key_name(i: int) -> str:
    """The user key of key number i (KvPut.name); the entity key is 'kv/' + this."""
    return f"app/{(i * MULT) & MASK:016x}"


# --- memory and disk --------------------------------------------------------------------------------

def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":", 1)
                out[name] = int(value.split()[0]) * 1024
    return out


def memory(sm: ViewsStateMachine | None) -> dict[str, int]:
    """RSS, peak RSS, and what RocksDB says it holds (block cache incl. memtable reservations, ...)."""
    m = proc_status()
    m = {"rss": m["VmRSS"], "hwm": m["VmHWM"]}
    if sm is not None:
        db = sm.store.db
        cfs = [sm.store.db, *sm.store.cfs.values()]
        m["block_cache"] = db.property_int_value("rocksdb.block-cache-usage") or 0
        m["block_cache_pinned"] = db.property_int_value("rocksdb.block-cache-pinned-usage") or 0
        m["memtables"] = sum(cf.property_int_value("rocksdb.size-all-mem-tables") or 0 for cf in cfs)
        m["table_readers"] = sum(cf.property_int_value("rocksdb.estimate-table-readers-mem") or 0 for cf in cfs)
    return m


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def flush_all(sm: ViewsStateMachine) -> None:
    sm.store.db.flush(True)
    for cf in sm.store.cfs.values():
        cf.flush(True)


def compact_all(sm: ViewsStateMachine) -> None:
    for cf in sm.store.cfs.values():
        cf.compact_range(None, None)
    sm.store.db.compact_range(None, None)


def disk(sm: ViewsStateMachine) -> dict[str, Any]:
    """Bytes of the views directory and SST bytes per column family (call after flush_all)."""
    sst = {name: sm.store.cfs[name].property_int_value("rocksdb.total-sst-files-size") or 0 for name in ALL_CFS}
    sst["default"] = sm.store.db.property_int_value("rocksdb.total-sst-files-size") or 0
    return {"dir": dir_bytes(sm.path), "sst": sst}


# --- building committed entries -----------------------------------------------------------------------

class Writer:
    """Builds committed entries of KvPut events at the state machine's next offset and applies them."""

    def __init__(self, sm: ViewsStateMachine, rng: random.Random, *, per_entry: int = PER_ENTRY,
                 request_ids: bool = True) -> None:
        self.sm = sm
        self.rng = rng
        self.per_entry = per_entry
        self.request_ids = request_ids
        self.offset = sm.applied_index + 1
        self.apply_seconds = 0.0
        self.events = 0

    def build(self, numbers: Sequence[int]) -> list[Entry]:
        entries = []
        rand = self.rng.randbytes
        offset = self.offset
        for j in range(0, len(numbers), self.per_entry):
            chunk = numbers[j:j + self.per_entry]
            records = []
            for k, i in enumerate(chunk):
                name = key_name(i)
                event = ev.KvPut(name=name, value=rand(VALUE_BYTES), actor="bench",
                                 request_id=f"bench-{offset + k}" if self.request_ids else "")
                records.append((b"kv/" + name.encode(), ev.encode_event(event)))
            data = bytearray(encode_batch(records, timestamp_ms=TIMESTAMP_MS))
            stamp(data, offset, 1)
            entries.append(Entry(offset, 1, len(chunk), EntryKind.NORMAL, bytes(data)))
            offset += len(chunk)
        return entries

    def apply(self, numbers: Sequence[int]) -> float:
        """Apply one call's worth of events; returns the seconds `apply` took."""
        entries = self.build(numbers)
        t0 = time.perf_counter()
        outcomes = self.sm.apply(entries)
        dt = time.perf_counter() - t0
        bad = [o for o in outcomes.values() if not o.ok]
        if bad or len(outcomes) != len(numbers):
            raise RuntimeError(f"apply rejected events: {bad[:3]} ({len(outcomes)} outcomes)")
        self.offset = entries[-1].last_index + 1
        self.apply_seconds += dt
        self.events += len(numbers)
        return dt


class Progress:
    """A line every `every` seconds during long phases."""

    def __init__(self, label: str, total: int, every: float) -> None:
        self.label, self.total, self.every = label, total, every
        self.t0 = self.last_t = time.perf_counter()
        self.last_n = 0
        self.samples: list[dict[str, float]] = []

    def tick(self, n: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last_t < self.every:
            return
        window = (n - self.last_n) / max(now - self.last_t, 1e-9)
        overall = n / max(now - self.t0, 1e-9)
        rss = proc_status()["VmRSS"]
        eta = (self.total - n) / overall if overall > 0 else float("nan")
        self.samples.append({"n": n, "t": now - self.t0, "rss": rss})
        print(f"  [{self.label}] {n:>12,} / {self.total:,} keys ({100 * n / self.total:3.0f}%)  "
              f"{window:>9,.0f} ev/s (window)  {overall:>9,.0f} ev/s (wall, incl. encoding)  "
              f"RSS {rss / MB:6.1f} MB  ETA {eta:5.0f} s", flush=True)
        self.last_t, self.last_n = now, n


# --- reads ---------------------------------------------------------------------------------------------

def time_ops(op: Callable[[int], int], seconds: float) -> dict[str, float]:
    """Call op(i) for i = 0, 1, ... for `seconds`; op returns the items it produced."""
    lat: list[int] = []
    items = 0
    meter = CpuMeter()
    t_end = time.perf_counter() + seconds
    clock = time.perf_counter_ns
    i = 0
    while True:
        t0 = clock()
        items += op(i)
        lat.append(clock() - t0)
        i += 1
        if (i & 63) == 0 and time.perf_counter() >= t_end:
            break
    wall = seconds + (time.perf_counter() - t_end)
    own, other = meter.read()
    lat.sort()
    return {"ops": i, "rate": i / wall, "items": items, "p50_us": pct(lat, .5), "p99_us": pct(lat, .99),
            "own_cpu": own, "other_cpu": other}


def bench_reads(sm: ViewsStateMachine, n: int, half_keys: int, half_offset: int, seconds: float,
                rng: random.Random) -> dict[str, dict[str, float]]:
    q = Query(sm.store)
    keys = ["kv/" + key_name(rng.randrange(n)) for _ in range(50_000)]
    old_keys = ["kv/" + key_name(rng.randrange(half_keys)) for _ in range(50_000)]
    prefixes = [f"kv/app/{rng.randrange(4096):03x}" for _ in range(5_000)]

    def get(i: int) -> int:
        item = q.get(keys[i % len(keys)])
        assert item is not None
        return 1

    def get_as_of(i: int) -> int:
        item = q.get(old_keys[i % len(old_keys)], as_of=half_offset)
        assert item is not None and item.version <= half_offset
        return 1

    def list_page(i: int) -> int:
        return len(q.list(prefixes[i % len(prefixes)], limit=100).items)

    def list_as_of(i: int) -> int:
        return len(q.list(prefixes[i % len(prefixes)], limit=100, as_of=half_offset).items)

    out = {}
    for name, op in (("get", get), ("get_as_of", get_as_of), ("list", list_page), ("list_as_of", list_as_of)):
        out[name] = r = time_ops(op, seconds)
        print(f"  {name:<11} {r['rate']:>10,.0f} ops/s  p50 {fmt_us(r['p50_us'])}  p99 {fmt_us(r['p99_us'])}"
              f"  ({r['items'] / max(r['ops'], 1):.0f} items per op; other processes {r['other_cpu']:.2f} cores)",
              flush=True)
    return out


# --- child: one key count ------------------------------------------------------------------------------

def child_size(args: argparse.Namespace) -> dict[str, Any]:
    n = args.n
    rng = random.Random(args.seed)
    mem_start = memory(None)
    sm = ViewsStateMachine(args.workdir, ViewsConfig())
    res: dict[str, Any] = {"keys": n, "config": _config_dict(sm.config), "mem_start": mem_start,
                           "mem_open": memory(sm)}
    w = Writer(sm, rng)
    label = f"{n:,} keys"
    progress = Progress(label, n, args.progress)
    deciles: list[tuple[int, float]] = []   # (events, apply seconds) at each tenth of the load
    half_keys = n // 2
    half_offset = -1
    meter = CpuMeter()
    t0 = time.perf_counter()
    done = 0
    while done < n:
        count = min(PER_APPLY, n - done)
        if done < half_keys < done + count:
            count = half_keys - done  # the halfway point on an apply boundary: as_of sees the first half
        w.apply(range(done, done + count))
        done += count
        if done == half_keys:
            half_offset = w.offset - 1
        if done * 10 // n != (done - count) * 10 // n:
            deciles.append((done, w.apply_seconds))
        progress.tick(done)
    progress.tick(done, force=True)
    wall = time.perf_counter() - t0
    own, other = meter.read()
    res["load"] = {"events": n, "apply_seconds": w.apply_seconds, "wall_seconds": wall,
                   "rate": n / w.apply_seconds, "own_cpu": own, "other_cpu": other,
                   "deciles": deciles, "samples": progress.samples, "half_offset": half_offset}
    first = deciles[0]
    last = (deciles[-1][0] - deciles[-2][0], deciles[-1][1] - deciles[-2][1]) if len(deciles) > 1 else first
    res["load"]["rate_first_tenth"] = first[0] / first[1]
    res["load"]["rate_last_tenth"] = last[0] / last[1]
    res["mem_loaded"] = memory(sm)
    print(f"  loaded {n:,} keys: apply {n / w.apply_seconds:,.0f} events/s (first tenth "
          f"{res['load']['rate_first_tenth']:,.0f}, last tenth {res['load']['rate_last_tenth']:,.0f}); "
          f"RSS {res['mem_loaded']['rss'] / MB:.1f} MB, peak {res['mem_loaded']['hwm'] / MB:.1f} MB", flush=True)
    t = time.perf_counter()
    flush_all(sm)
    res["flush_seconds"] = time.perf_counter() - t
    res["disk"] = disk(sm)
    print(f"  on disk after flush: {res['disk']['dir'] / MB:,.1f} MB ({res['disk']['dir'] / n:,.0f} B/key)",
          flush=True)
    res["mem_flushed"] = memory(sm)
    res["reads"] = bench_reads(sm, n, half_keys, half_offset, args.seconds, rng)
    res["mem_reads"] = memory(sm)
    # mixed load: half updates of random existing keys, half new keys
    meter = CpuMeter()
    t_end = time.perf_counter() + args.seconds
    w.apply_seconds, w.events = 0.0, 0
    fresh = n
    while time.perf_counter() < t_end:
        numbers = []
        for _ in range(PER_APPLY // 2):
            numbers.append(rng.randrange(n))
            numbers.append(fresh)
            fresh += 1
        w.apply(numbers)
    own, other = meter.read()
    res["mix"] = {"events": w.events, "rate": w.events / w.apply_seconds, "own_cpu": own, "other_cpu": other}
    print(f"  mixed load (50% updates): {res['mix']['rate']:,.0f} events/s over {w.events:,} events", flush=True)
    res["mem_end"] = memory(sm)
    sm.close()
    return res


def _config_dict(c: ViewsConfig) -> dict[str, int]:
    return {"block_cache_bytes": c.block_cache_bytes, "write_buffer_bytes": c.write_buffer_bytes,
            "dedupe_window_offsets": c.dedupe_window_offsets}


# --- child: batch shapes and versions ----------------------------------------------------------------

SHAPES = ((1000, 1, True), (10, 100, True), (1, 1000, True), (10, 100, False))


def child_aux(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    root = Path(args.workdir)
    res: dict[str, Any] = {"shapes": [], "versions": []}
    for entries, per_entry, request_ids in SHAPES:
        d = root / f"shape-{entries}x{per_entry}-{int(request_ids)}"
        sm = ViewsStateMachine(d)
        w = Writer(sm, rng, per_entry=per_entry, request_ids=request_ids)
        meter = CpuMeter()
        for start in range(0, args.shape_events, PER_APPLY):
            w.apply(range(start, min(start + PER_APPLY, args.shape_events)))
        own, other = meter.read()
        row = {"entries": entries, "per_entry": per_entry, "request_ids": request_ids, "events": w.events,
               "rate": w.events / w.apply_seconds, "other_cpu": other}
        res["shapes"].append(row)
        print(f"  shape {entries:>4} entries x {per_entry:>4} records, request ids {'yes' if request_ids else 'no '}:"
              f" {row['rate']:>9,.0f} events/s  (other processes {other:.2f} cores)", flush=True)
        sm.close()
        shutil.rmtree(d, ignore_errors=True)

    k = args.version_keys
    d = root / "versions"
    sm = ViewsStateMachine(d)
    w = Writer(sm, rng)

    def measure(versions: int, rate: float | None, other: float | None) -> None:
        flush_all(sm)
        compact_all(sm)
        dk = disk(sm)
        row = {"versions": versions, "rate": rate, "other_cpu": other, **dk}
        res["versions"].append(row)
        print(f"  {versions} version(s) per key: {dk['dir'] / k:,.0f} B/key on disk (kv "
              f"{dk['sst']['kv'] / k:,.0f}, versions {dk['sst']['versions'] / k:,.0f}, dedupe "
              f"{sum(dk['sst'][c] for c in DEDUPE_CFS) / k:,.0f})"
              + (f"; updates applied at {rate:,.0f} events/s" if rate else ""), flush=True)

    progress = Progress(f"versions: {k:,} keys", k, args.progress)
    meter = CpuMeter()
    for start in range(0, k, PER_APPLY):
        w.apply(range(start, min(start + PER_APPLY, k)))
        progress.tick(min(start + PER_APPLY, k))
    own, other = meter.read()
    measure(1, k / w.apply_seconds, other)
    for round_no in range(args.updates):
        order = list(range(k))
        rng.shuffle(order)
        w.apply_seconds, w.events = 0.0, 0
        progress = Progress(f"update round {round_no + 1}", k, args.progress)
        meter = CpuMeter()
        for start in range(0, k, PER_APPLY):
            w.apply(order[start:start + PER_APPLY])
            progress.tick(min(start + PER_APPLY, k))
        own, other = meter.read()
        measure(round_no + 2, w.events / w.apply_seconds, other)
    sm.close()
    shutil.rmtree(d, ignore_errors=True)
    return res


# --- parent ----------------------------------------------------------------------------------------------

def run_child(kind: str, args: argparse.Namespace, workdir: Path, extra: list[str]) -> dict[str, Any]:
    out = workdir.with_suffix(".json")
    cmd = [sys.executable, "-m", "bench.views_bench", "--child", kind, "--workdir", str(workdir),
           "--child-out", str(out), "--seconds", str(args.seconds), "--progress", str(args.progress),
           "--seed", str(args.seed), *extra]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=BENCH_DIR.parent)
    if proc.returncode != 0:
        raise SystemExit(f"views bench child {kind} failed with exit code {proc.returncode}")
    data: dict[str, Any] = json.loads(out.read_text())
    data["child_seconds"] = time.perf_counter() - started
    shutil.rmtree(workdir, ignore_errors=True)
    return data


def mb(x: float) -> str:
    return f"{x / MB:,.1f} MB"


def render(args: argparse.Namespace, sizes: list[dict[str, Any]], aux: dict[str, Any], total_s: float,
           load_before: tuple[float, float, float], other_start: float) -> str:
    out: list[str] = []
    a = out.append
    cfg = sizes[0]["config"]
    a(f"Each key count is loaded by a fresh process into an empty RocksDB directory (rocksdict 0.3.29, "
      f"`ViewsConfig` defaults: {cfg['block_cache_bytes'] >> 20} MiB block cache holding data, index and "
      f"filter blocks, memtables charged to it through a {cfg['write_buffer_bytes'] >> 20} MiB write buffer "
      f"manager, dedupe window {cfg['dedupe_window_offsets']:,} offsets). Events: `KvPut` of a "
      f"{VALUE_BYTES}-byte random value under `kv/app/<16 hex digits>` (keys in random order), each with an "
      f"actor and a unique request id, so every event writes 4 rows (the entity, its `versions` row, and "
      f"2 dedupe rows). Apply throughput times `ViewsStateMachine.apply` only (events are encoded outside "
      f"the timed region): {PER_APPLY} events per call as {PER_APPLY // PER_ENTRY} Raft entries of "
      f"{PER_ENTRY} records. Scratch directory on the repository's disk (`{args.dir}`), removed afterwards. "
      f"Reads: {args.seconds:g} s each, single thread, `Query` over the live store. Load average before the "
      f"run: {' / '.join(f'{x:.2f}' for x in load_before)}; other processes used {other_start:.2f} cores "
      f"just before it; whole run {total_s:.0f} s.")
    a("")
    # targets
    big = max(sizes, key=lambda s: s["keys"])
    small = min(sizes, key=lambda s: s["keys"])
    a("### Targets")
    a("")
    a("| target | measured | met? |")
    a("|---|---|---|")
    peak_big = max(big["mem_end"]["hwm"], big["mem_end"]["rss"])
    if big["keys"] >= 10_000_000:
        ok = peak_big < RSS_TARGET_MB * MB
        a(f"| RSS < {RSS_TARGET_MB} MB at 10M keys | RSS {mb(big['mem_loaded']['rss'])} after the load, "
          f"{mb(big['mem_end']['rss'])} after reads and mixed load; peak (VmHWM) {mb(big['mem_end']['hwm'])} "
          f"| {'**met**' if ok else '**not met**'} |")
    else:
        a(f"| RSS < {RSS_TARGET_MB} MB at 10M keys | largest run had {big['keys']:,} keys: peak "
          f"{mb(peak_big)} | not measured (no 10M run) |")
    if big is not small:
        key_ratio = big["keys"] / small["keys"]
        rss_ratio = big["mem_end"]["hwm"] / small["mem_end"]["hwm"]
        a(f"| RSS grows far slower than the key count (peak RSS ratio <= {GROWTH_TARGET:g} for "
          f"{key_ratio:.0f}x the keys) | peak {mb(small['mem_end']['hwm'])} at {small['keys']:,} keys, "
          f"{mb(big['mem_end']['hwm'])} at {big['keys']:,}: **{rss_ratio:.2f}x** for {key_ratio:.0f}x the keys "
          f"| {'**met**' if rss_ratio <= GROWTH_TARGET else '**not met**'} |")
    a("")
    # memory
    a("### Memory (fresh process per key count)")
    a("")
    a("RSS = VmRSS, peak = VmHWM (high-water mark of the whole process so far), from /proc/self/status. "
      "Block cache = `rocksdb.block-cache-usage` (data/index/filter blocks plus the memtable reservations "
      "of the write buffer manager); memtables and table readers = the sums over column families of "
      "`rocksdb.size-all-mem-tables` and `rocksdb.estimate-table-readers-mem`.")
    a("")
    a("| keys | RSS empty store | RSS after load | peak after load | block cache | memtables | table readers "
      "| RSS after reads | RSS at end | peak at end |")
    a("|---|---|---|---|---|---|---|---|---|---|")
    for s in sizes:
        ml, mr, me = s["mem_loaded"], s["mem_reads"], s["mem_end"]
        a(f"| {s['keys']:,} | {mb(s['mem_open']['rss'])} | {mb(ml['rss'])} | {mb(ml['hwm'])} | "
          f"{mb(ml['block_cache'])} | {mb(ml['memtables'])} | {mb(ml['table_readers'])} | {mb(mr['rss'])} | "
          f"{mb(me['rss'])} | {mb(me['hwm'])} |")
    a("")
    for s in sizes:
        pts = s["load"]["samples"]
        if len(pts) >= 3:
            picks = [pts[round(i * (len(pts) - 1) / 4)] for i in range(5)]
            a(f"RSS during the {s['keys']:,}-key load: " + ", ".join(
                f"{mb(p['rss'])} at {int(p['n']):,} keys" for p in picks) + ".")
    a("")
    # apply
    a("### Apply throughput")
    a("")
    a("| keys | load: events/s (apply only) | first tenth | last tenth | load wall s (incl. encoding) "
      "| mixed load (50% updates of existing keys) events/s | other processes (cores) |")
    a("|---|---|---|---|---|---|---|")
    for s in sizes:
        ld = s["load"]
        a(f"| {s['keys']:,} | {ld['rate']:,.0f} | {ld['rate_first_tenth']:,.0f} | {ld['rate_last_tenth']:,.0f} | "
          f"{ld['wall_seconds']:,.0f} | {s['mix']['rate']:,.0f} | {ld['other_cpu']:.2f} / {s['mix']['other_cpu']:.2f} |")
    a("")
    a(f"By batch shape, on a fresh store ({aux['shapes'][0]['events']:,} new keys each, {PER_APPLY} events per "
      f"apply call):")
    a("")
    a("| entries per apply | records per entry | request ids | events/s | other processes (cores) |")
    a("|---|---|---|---|---|")
    for r in aux["shapes"]:
        a(f"| {r['entries']} | {r['per_entry']} | {'yes' if r['request_ids'] else 'no'} | {r['rate']:,.0f} | "
          f"{r['other_cpu']:.2f} |")
    a("")
    # reads
    a("### Reads")
    a("")
    a("Single thread, random existing keys. `as_of` = the offset reached halfway through the load (keys "
      "loaded before it). Lists: the first page (limit 100) under a random `kv/app/<3 hex digits>` prefix "
      "(4,096 prefixes). Latency per call, Python included.")
    a("")
    a("| keys | read | ops/s | items/s | p50 | p99 | other processes (cores) |")
    a("|---|---|---|---|---|---|---|")
    names = {"get": "`get` current", "get_as_of": "`get` as_of", "list": "`list` page current",
             "list_as_of": "`list` page as_of"}
    for s in sizes:
        for key, label in names.items():
            r = s["reads"][key]
            a(f"| {s['keys']:,} | {label} | {r['rate']:,.0f} | {r['rate'] * r['items'] / max(r['ops'], 1):,.0f} | "
              f"{fmt_us(r['p50_us'])} | {fmt_us(r['p99_us'])} | {r['other_cpu']:.2f} |")
    a("")
    # disk
    a("### Disk")
    a("")
    a("Views directory after the load and a flush of every memtable (no manual compaction): files in the "
      "directory (SSTs, WAL, MANIFEST, logs) and SST bytes by column family. The dedupe rows cover the "
      "last `dedupe_window_offsets` events only, so their share per key falls as keys grow.")
    a("")
    a("| keys | directory | bytes/key | kv | versions | dedupe + expiry | other |")
    a("|---|---|---|---|---|---|---|")
    for s in sizes:
        a(_disk_row(f"{s['keys']:,}", s["disk"], s["keys"]))
    a("")
    # versions
    k = args.version_keys
    a("### Versions overhead")
    a("")
    a(f"{k:,} keys, then {args.updates} rounds updating every key once (random order, same batches); after "
      f"each round every column family is flushed and fully compacted (`compact_range`), so the sizes are "
      f"the steady state without obsolete rows. Bytes per key = bytes / {k:,}.")
    a("")
    a("| versions per key | directory | bytes/key | kv | versions | dedupe + expiry | other | apply events/s "
      "(updates after the first row) |")
    a("|---|---|---|---|---|---|---|---|")
    for r in aux["versions"]:
        a(_disk_row(str(r["versions"]), r, k) + f" {r['rate']:,.0f} |")
    v = aux["versions"]
    if len(v) >= 2:
        per_version = (v[-1]["sst"]["versions"] - v[0]["sst"]["versions"]) / k / (v[-1]["versions"] - 1)
        a("")
        a(f"Each extra version costs {per_version:,.0f} bytes per key in `versions` (the entity row in `kv` is "
          f"replaced, not added to); {v[-1]['versions']} versions take {v[-1]['dir'] / v[0]['dir']:.2f}x the "
          f"disk of 1 version.")
    a("")
    a("### Fix made with this benchmark")
    a("")
    a(BEFORE_FIX)
    a("")
    a("### What this means")
    a("")
    a(what_it_means(sizes, aux))
    return "\n".join(out) + "\n"


BEFORE_FIX = (
    "The first runs of this benchmark found apply throughput collapsing past ~650k keys: from ~20,000 to "
    "1,000-3,000 events/s, with the main thread's time in `pread` and XXH3 checksums of large blocks "
    "(py-spy). Every `KvPut` looks up its key and its request id, both absent, so each lookup needs the "
    "bloom filter and index of every SST it may be in; those were one block per file (hundreds of KiB for "
    "a 64 MiB SST), while the 64 MiB LRU cache is split into 64 shards of 1 MiB, each also holding its "
    "share of the write buffer manager's memtable reservations, so the blocks evicted each other and were "
    "re-read from the page cache on every lookup. `statemachines/store.py` now partitions index and "
    "filter blocks (two-level index, `partition_filters`, 4 KiB metadata blocks, pinned top level), which "
    "keeps them inside the same cache budget. Measured during development on this machine (other "
    "processes using 1.2-1.5 of the 2 cores in both runs), 1M keys with the old table options: apply "
    "7,468 events/s overall, 2,853 in the last tenth, mixed load 1,905 events/s; 1.5M keys with the fix: "
    "19,488 overall, 14,608 in the last tenth, mixed load 14,287. RSS was about the same either way "
    "(111 vs 126 MB after the load).")


def _disk_row(label: str, d: dict[str, Any], keys: int) -> str:
    sst = d["sst"]
    dedupe = sum(sst[c] for c in DEDUPE_CFS)
    other = sum(v for c, v in sst.items() if c not in ("kv", "versions", *DEDUPE_CFS))
    return (f"| {label} | {mb(d['dir'])} | {d['dir'] / keys:,.0f} | {sst['kv'] / keys:,.0f} | "
            f"{sst['versions'] / keys:,.0f} | {dedupe / keys:,.0f} | {other / keys:,.0f} |")


def what_it_means(sizes: list[dict[str, Any]], aux: dict[str, Any]) -> str:
    parts = []
    big = max(sizes, key=lambda s: s["keys"])
    small = min(sizes, key=lambda s: s["keys"])
    if big is not small:
        grow = (big["mem_end"]["hwm"] - small["mem_end"]["hwm"]) / (big["keys"] - small["keys"])
        parts.append(
            f"Peak RSS went from {mb(small['mem_end']['hwm'])} at {small['keys']:,} keys to "
            f"{mb(big['mem_end']['hwm'])} at {big['keys']:,} keys "
            f"({big['mem_end']['hwm'] / small['mem_end']['hwm']:.2f}x for {big['keys'] / small['keys']:.0f}x the "
            f"keys, {grow:.1f} bytes of RSS per extra key against {big['disk']['dir'] / big['keys']:,.0f} bytes "
            f"per key on disk)"
            + (": the resident set is bounded by the block cache budget, not by the key count."
               if big["mem_end"]["hwm"] / small["mem_end"]["hwm"] <= GROWTH_TARGET else
               ": the resident set grows with the key count."))
    deltas = [(s["keys"], s["mem_end"]["rss"] - s["mem_loaded"]["rss"]) for s in sizes]
    parts.append(
        "The reads and the mixed load that follow the load added " + ", ".join(
            f"{mb(d)} at {k:,} keys" for k, d in deltas) + " of RSS, about the same at every size: the "
        "benchmark's own lists of keys to read (about 8 MB) and RocksDB's working memory while the block "
        "cache turns over data blocks (not broken down further).")
    bl = big["mem_loaded"]
    parts.append(
        f"At {big['keys']:,} keys RocksDB accounts for {mb(bl['block_cache'])} of block cache (memtables "
        f"included) and {mb(bl['table_readers'])} of table readers; the rest of the {mb(bl['rss'])} is the "
        f"interpreter, the libraries and allocator slack.")
    ld_s, ld_b = small["load"], big["load"]
    parts.append(
        f"Applying costs Python CPU per event (decode, checks, 4 rows, digest): {ld_s['rate']:,.0f} events/s "
        f"loading {small['keys']:,} keys and {ld_b['rate']:,.0f} events/s for {big['keys']:,} keys (last tenth "
        f"{ld_b['rate_last_tenth']:,.0f}); updates of existing keys mixed in run at {big['mix']['rate']:,.0f} "
        f"events/s.")
    shapes = {(r["entries"], r["per_entry"], r["request_ids"]): r["rate"] for r in aux["shapes"]}
    if (1000, 1, True) in shapes and (10, 100, True) in shapes and (10, 100, False) in shapes:
        parts.append(
            f"One record per entry (1000 entries per call) runs at {shapes[(1000, 1, True)]:,.0f} events/s "
            f"against {shapes[(10, 100, True)]:,.0f} with 100-record entries (the digest and dedupe eviction "
            f"run per entry); without request ids (no dedupe rows) {shapes[(10, 100, False)]:,.0f} events/s.")
    g = big["reads"]
    cache = big["config"]["block_cache_bytes"]
    where = ("the data is many times the block cache there, so most reads are served by the OS page cache"
             if big["disk"]["dir"] > 4 * cache else "the data still mostly fits the block cache there")
    parts.append(
        f"Reads at {big['keys']:,} keys: {g['get']['rate']:,.0f} gets/s (p50 {fmt_us(g['get']['p50_us'])}), "
        f"{g['get_as_of']['rate']:,.0f} as_of gets/s (p50 {fmt_us(g['get_as_of']['p50_us'])}), "
        f"{g['list']['rate']:,.0f} list pages/s; {where}.")
    others = [s["load"]["other_cpu"] for s in sizes]
    parts.append(f"Other processes used {min(others):.2f}-{max(others):.2f} cores during the loads (of 2): "
                 f"throughput figures are lower than on an idle machine; memory and disk figures are not "
                 f"affected. Numbers vary 10-30 % between runs on this shared machine.")
    return " ".join(parts)


# --- main ------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.views_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 20,000 and 100,000 keys, 1 s per read, small aux run (about a minute)")
    ap.add_argument("--keys", default=None,
                    help="comma-separated key counts, one fresh process each (default 1000000,10000000)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per read and mixed-load measurement "
                                                                "(default 5, --quick 1)")
    ap.add_argument("--version-keys", type=int, default=None,
                    help="keys in the versions-overhead run (default 200,000; --quick 10,000)")
    ap.add_argument("--updates", type=int, default=None, help="update rounds in that run (default 4, --quick 2)")
    ap.add_argument("--shape-events", type=int, default=None,
                    help="events per batch-shape measurement (default 100,000; --quick 10,000)")
    ap.add_argument("--dir", type=Path, default=OUT_DIR,
                    help="parent of the scratch directory (default: bench/out/, on the repo's disk)")
    ap.add_argument("--out", type=Path, default=None,
                    help="markdown file to write the `views` section into (default bench/RESULTS.md)")
    ap.add_argument("--no-results", action="store_true", help="print only; do not write a results file")
    ap.add_argument("--quiet-wait", type=float, default=None,
                    help="wait up to this many seconds for other processes to go idle (default 20, --quick 3)")
    ap.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    ap.add_argument("--seed", type=int, default=1)
    # internal: a child process measuring one thing
    ap.add_argument("--child", choices=("size", "aux"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    q = args.quick
    if args.keys is None:
        args.keys = "20000,100000" if q else "1000000,10000000"
    args.key_counts = sorted({int(x.replace("_", "")) for x in args.keys.split(",") if x.strip()})
    if not args.key_counts or min(args.key_counts) < 1000:
        ap.error("--keys: each count must be at least 1000")
    if args.seconds is None:
        args.seconds = 1.0 if q else 5.0
    if args.version_keys is None:
        args.version_keys = 10_000 if q else 200_000
    if args.updates is None:
        args.updates = 2 if q else 4
    if args.shape_events is None:
        args.shape_events = 10_000 if q else 100_000
    if args.quiet_wait is None:
        args.quiet_wait = 3.0 if q else 20.0
    if q and args.progress == 5.0:
        args.progress = 2.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        fn = child_size if args.child == "size" else child_aux
        result = fn(args)
        Path(args.child_out).write_text(json.dumps(result))
        return 0
    t_begin = time.perf_counter()
    load_before = os.getloadavg()
    args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="views-bench-", dir=args.dir))
    print(f"views bench: scratch {scratch}, keys {', '.join(f'{n:,}' for n in args.key_counts)}, "
          f"{args.seconds:g} s per read measurement, versions run {args.version_keys:,} keys x "
          f"{args.updates + 1} versions, load {load_before[0]:.2f}", flush=True)
    other = wait_quiet(args.quiet_wait, lambda m: print(m, flush=True))
    if other >= 0.25:
        print(f"  still busy after {args.quiet_wait:g} s ({other:.2f} cores used by others): running anyway",
              flush=True)
    try:
        sizes = []
        for n in args.key_counts:
            print(f"{n:,} keys (fresh process) ...", flush=True)
            sizes.append(run_child("size", args, scratch / f"size-{n}", ["--n", str(n)]))
        print("batch shapes and versions overhead (fresh process) ...", flush=True)
        aux = run_child("aux", args, scratch / "aux",
                        ["--version-keys", str(args.version_keys), "--updates", str(args.updates),
                         "--shape-events", str(args.shape_events)])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    md = render(args, sizes, aux, time.perf_counter() - t_begin, load_before, other)
    print()
    print(md)
    if not args.no_results:
        command = " ".join(["python -m bench.views_bench", *(sys.argv[1:] if argv is None else argv)])
        if args.out is not None:
            bench_results.RESULTS = args.out
        bench_results.write_section("views", md, command=command.strip())
        print(f"wrote section 'views' of {bench_results.RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
