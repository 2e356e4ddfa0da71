"""`epochlog demo` (what `make run` runs): the log surviving a crash, step by step.

1. A writer process appends metadata-like events under group commit from several threads and
   reports every batch it has seen become durable (offset range and CRC).
2. The demo kills it with SIGKILL at a random moment.
3. It simulates a torn write on top: the first part of one more batch lands after the valid data,
   as a power loss in the middle of an append would leave it.
4. `verify` classifies the damage (a torn tail); `Log.open` cuts it and reports what it cut.
5. Every acknowledged batch is checked to be present and intact; the tail is dumped.

The writer is this module run as `python -m epochlog.demo writer DIR`.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.offline import Verdict, dump_log_dir, verify_log_dir
from eventlog.records import encode_batch, read_header

# Small segments so that the demo rolls several of them in a couple of seconds.
DEMO_CONFIG = LogConfig(segment_bytes=4 << 20, flush_policy="group")
WRITER_THREADS = 4
BATCH_RECORDS = 50


def _event(thread: int, seq: int, i: int) -> tuple[bytes, bytes]:
    key = f"broker/demo/b-{thread}-{i % 8}".encode()
    value = (f'{{"type":"BrokerHeartbeatSeen","thread":{thread},"seq":{seq},"i":{i},'
             f'"address":"10.0.{thread}.{i % 250}:10911"}}').encode()
    return key, value.ljust(150, b" ")


def writer(directory: Path) -> None:
    """Append from several threads until killed; print `ack BASE LAST CRC` once durable."""
    log = Log.open(directory, DEMO_CONFIG)
    out_lock = threading.Lock()

    def run(thread: int) -> None:
        seq = 0
        while True:
            batch = encode_batch([_event(thread, seq, i) for i in range(BATCH_RECORDS)],
                                 timestamp_ms=int(time.time() * 1000))
            info = log.append(batch, epoch=1)
            log.wait_durable(info.last_offset)
            crc = read_header(batch).crc
            with out_lock:
                sys.stdout.write(f"ack {info.base_offset} {info.last_offset} {crc}\n")
                sys.stdout.flush()
            seq += 1

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(WRITER_THREADS)]
    print("ready", flush=True)   # before the first ack: the parent reads `ready` first
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_demo(data_dir: Path, *, seconds: float = 2.0, seed: int | None = None) -> int:
    """Run the whole demo; returns the process exit code (0 when every check passed)."""
    console = Console()
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    console.rule("[bold]Epochlog: the segmented log survives a crash")
    console.print(f"data directory [cyan]{data_dir}[/]  seed [cyan]{seed}[/] (replay with --seed {seed})")
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)

    # 1-2. write, then kill -9 at a random moment
    kill_after = seconds * rng.uniform(0.6, 1.0)
    acked: dict[int, tuple[int, int]] = {}
    proc = subprocess.Popen([sys.executable, "-m", "epochlog.demo", "writer", str(data_dir)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            console.print("[red]the writer did not start[/]")
            return 1
        started = time.monotonic()
        timer = threading.Timer(kill_after, lambda: os.kill(proc.pid, signal.SIGKILL))
        timer.start()
        with console.status("appending with group commit...") as status:
            for line in proc.stdout:
                parts = line.split()
                if len(parts) == 4 and parts[0] == "ack":
                    acked[int(parts[1])] = (int(parts[2]), int(parts[3]))
                    if len(acked) % 200 == 0:
                        status.update(f"appending with group commit... {len(acked) * BATCH_RECORDS:,} "
                                      f"records acknowledged")
        proc.wait()
        timer.cancel()
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    acked_records = sum(last - base + 1 for base, (last, _) in acked.items())
    console.print(f"[bold]writer killed with SIGKILL[/] after {elapsed:.2f} s: {len(acked):,} batches "
                  f"({acked_records:,} records) acknowledged as durable "
                  f"({acked_records / elapsed:,.0f} durable records/s)")

    # 3. a torn write on top of whatever the crash left
    torn_bytes = _tear_tail(data_dir, rng)
    console.print(f"simulated a torn write: the first {torn_bytes} bytes of one more batch after the valid data")

    # 4. verify (read-only), then recover
    report = verify_log_dir(data_dir)
    console.print(f"log verify: [yellow]{report.verdict.name.lower().replace('_', ' ')}[/] "
                  f"({'; '.join(report.problems) or 'no problems'})")
    log = Log.open(data_dir, DEMO_CONFIG)
    try:
        rec = log.recovery
        assert rec is not None
        table = Table(title="recovery")
        for col in ("segments", "scanned", "records scanned", "bytes cut", "open took"):
            table.add_column(col, justify="right")
        table.add_row(str(rec.segments), str(rec.segments_scanned), f"{rec.records_scanned:,}",
                      str(rec.bytes_truncated), f"{rec.seconds * 1000:.1f} ms")
        console.print(table)

        # 5. every acknowledged batch present and intact
        found = {b.header.base_offset: (b.header.last_offset, b.header.crc) for b in log.batches()}
        missing = [base for base in acked if found.get(base) != acked[base]]
        if missing:
            console.print(f"[red]LOST OR DAMAGED: {len(missing)} acknowledged batches, e.g. offset {missing[0]}[/]")
            return 1
        console.print(f"[green]all {len(acked):,} acknowledged batches are present and intact[/] "
                      f"(log holds offsets {log.start_offset}..{log.end_offset - 1})")
        after = verify_log_dir(data_dir)
        if after.verdict is not Verdict.CLEAN:
            console.print(f"[red]log verify after recovery: {after.problems}[/]")
            return 1
        console.print("log verify after recovery: [green]clean[/]")
        info = log.append(encode_batch([_event(99, 0, 0)], timestamp_ms=int(time.time() * 1000)), epoch=2)
        log.wait_durable(info.last_offset)
        console.print(f"appending works again: offset {info.base_offset} written in epoch 2")
        end = log.end_offset
    finally:
        log.close()

    rows = [r for r in dump_log_dir(data_dir, start_offset=max(0, end - 3 * BATCH_RECORDS))]
    table = Table(title=f"log dump --from {max(0, end - 3 * BATCH_RECORDS)} (the tail)")
    for col in ("segment", "offsets", "epoch", "records", "bytes", "crc", "first key"):
        table.add_column(col)
    for r in rows:
        first = r.keys[0].decode() if r.keys and r.keys[0] is not None else ""
        table.add_row(r.segment, f"{r.base_offset}..{r.last_offset}", str(r.epoch), str(r.records),
                      str(r.size), "ok" if r.crc_ok else "BAD", first)
    console.print(table)
    console.print(f"try: [cyan]epochlog log verify {data_dir}[/]  and  [cyan]epochlog log dump {data_dir} --limit 5[/]")
    return 0


def _tear_tail(directory: Path, rng: random.Random) -> int:
    """Write the first part of a valid batch right after the last valid batch of the last segment."""
    last = max(p for p in directory.iterdir() if p.suffix == ".log")
    data = bytearray(last.read_bytes())
    pos = 0
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos + 8:pos + 12], "big", signed=True)
        if length <= 0:
            break
        pos += 12 + length
    batch = encode_batch([_event(7, 0, i) for i in range(BATCH_RECORDS)], timestamp_ms=int(time.time() * 1000))
    torn = rng.randrange(20, len(batch) - 1)
    with last.open("r+b") as f:
        f.seek(pos)
        f.write(batch[:torn])
        f.flush()
        os.fsync(f.fileno())
    return torn


def _main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "writer":
        writer(Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m epochlog.demo writer DIR")


if __name__ == "__main__":
    _main()
