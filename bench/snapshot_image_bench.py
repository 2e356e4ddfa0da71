"""Benchmark of sending a snapshot with the log below it (eventlog/raft/runtime/snapshot_image.py): what
the leader's loop spends, and what installing costs the follower.

    python -m bench.snapshot_image_bench [--entries N] [--segments-kib 64,1024] [--dir DIR] [--no-results]

A leader LogStorage (compact group: `ships_log_prefix`) holds N entries of two ~500-byte records in
segments of the given sizes and a 4 MiB snapshot at its last entry. Measured on the calling thread,
which plays the group's loop: `snapshot()` (the listing), the first `snapshot_chunk` (hard links of
every prefix segment, then the read), and each following 1 MiB chunk asked for 2 ms after the
previous one (a follower's round trip: the read-ahead thread has read it meanwhile), against the
same chunk read on the loop (`SnapshotImage.read`, page cache warm). Then a follower stages every
chunk (each batch checked, fsync per chunk) and installs the image: MB/s of staging, install time.

The machine is shared: the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from eventlog.config import LogConfig
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import ConfState, Entry, EntryKind
from eventlog.records import encode_batch

CONF = ConfState(voters=(1, 2, 3))
CHUNK = 1 << 20


def _leader(path: Path, segment_bytes: int, entries: int) -> LogStorage:
    config = LogConfig(segment_bytes=segment_bytes, flush_policy="interval", preallocate_next_segment=False)
    st = LogStorage.open(path, config, CONF, ships_log_prefix=True)
    index, batch = 0, []
    for i in range(entries):
        data = encode_batch([(b"kv/k%d" % (i % 1000), b"x" * 500), (b"kv/y", b"z" * 500)], timestamp_ms=i)
        batch.append(Entry(index, 1, 2, EntryKind.NORMAL, data))
        index += 2
        if len(batch) == 1000:
            st.append(batch)
            batch = []
    if batch:
        st.append(batch)
    st.log.flush()
    st.create_snapshot(index - 1, CONF, lambda p: p.write_bytes(os.urandom(4 << 20)))
    return st


def run(segment_bytes: int, entries: int, root: Path) -> dict[str, float]:
    leader = _leader(root / "leader", segment_bytes, entries)
    started = time.perf_counter()
    meta = leader.snapshot()
    listing = time.perf_counter() - started
    started = time.perf_counter()
    first = leader.snapshot_chunk(meta.index, 0, CHUNK)
    first_s = time.perf_counter() - started
    image = leader._images[meta.index]
    ahead, on_loop, chunks = [], [], [first]
    offset = len(first)
    while offset < meta.size:
        time.sleep(0.002)
        started = time.perf_counter()
        chunk = leader.snapshot_chunk(meta.index, offset, CHUNK)
        ahead.append(time.perf_counter() - started)
        started = time.perf_counter()
        image.read(offset, CHUNK)
        on_loop.append(time.perf_counter() - started)
        chunks.append(chunk)
        offset += len(chunk)
    follower = LogStorage.open(root / "follower", LogConfig(segment_bytes=segment_bytes), CONF, ships_log_prefix=True)
    started = time.perf_counter()
    offset = 0
    for chunk in chunks:
        follower.stage_snapshot_chunk(meta, offset, chunk)
        offset += len(chunk)
    staging = time.perf_counter() - started
    started = time.perf_counter()
    follower.install_snapshot(meta)
    install = time.perf_counter() - started
    assert follower.log.clean_end_offset == meta.index + 1 and follower.log.start_offset == 0
    parts = len(image.parts)
    leader.close()
    follower.close()
    return {"parts": parts, "mb": meta.size / 1e6, "listing_ms": listing * 1e3, "first_ms": first_s * 1e3,
            "ahead_p50_ms": statistics.median(ahead) * 1e3, "ahead_max_ms": max(ahead) * 1e3,
            "loop_p50_ms": statistics.median(on_loop) * 1e3, "loop_max_ms": max(on_loop) * 1e3,
            "stage_mb_s": meta.size / 1e6 / staging, "install_ms": install * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=40_000)
    parser.add_argument("--segments-kib", default="64,1024")
    parser.add_argument("--dir", type=Path, default=Path(__file__).with_name("out"))
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    load = os.getloadavg()
    for kib in (int(k) for k in args.segments_kib.split(",")):
        root = Path(tempfile.mkdtemp(dir=args.dir))
        try:
            r = run(kib << 10, args.entries, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append((kib, r))
        print(kib, r)
    lines = [(f"{args.entries:,} entries of two ~500-byte records, a 4 MiB snapshot at the last one; 1 MiB chunks. "
             f"Load average before: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; after: "
             f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}."), "",
             ("| segments | prefix segments | image | listing (loop) | first chunk: links + read (loop) | "
             "next chunks, read ahead (loop): p50 / max | same chunk read on the loop: p50 / max | "
             "follower staging | follower install |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kib, r in rows:
        lines.append(f"| {kib} KiB | {r['parts']:.0f} | {r['mb']:.1f} MB | {r['listing_ms']:.2f} ms | "
                     f"{r['first_ms']:.2f} ms | {r['ahead_p50_ms']:.3f} / {r['ahead_max_ms']:.3f} ms | "
                     f"{r['loop_p50_ms']:.3f} / {r['loop_max_ms']:.3f} ms | {r['stage_mb_s']:.0f} MB/s | "
                     f"{r['install_ms']:.1f} ms |")
    lines += ["", ("The leader's loop pays the listing when the snapshot is first asked for, the hard links once "
              "per transfer, and about nothing per chunk after the first (read in a thread while the follower "
              "answers). The follower checks every batch's CRC while staging (on its loop, as replication does).")]
    if not args.no_results:
        from bench.results import write_section
        write_section("snapshot-image", "\n".join(lines),
                      command=" ".join(["python -m bench.snapshot_image_bench", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
