"""Child process of the crash test (tests/eventlog/test_crash.py): append until SIGKILLed.

    python -m tests.eventlog.crash_child DIR POLICY SEED

Opens the log in DIR with flush policy POLICY (`fsync` or `group`) and appends batches whose whole
content is a function of their offsets (`expected_records`, `timestamp_for`, `epoch_for`), so the
parent can check every record that survives a crash without knowing what the child did. Each
batch is acknowledged on stdout only once it is durable, one line each, written with a single
`os.write` so the parent never sees half a line:

    READY <start offset> <end offset>   the log is open (recovery is done)
    ACK <base offset> <last offset>     that batch is durable: it must survive any crash
    RETAIN <offset>                     about to call delete_segments_below(offset)

With `EPOCHLOG_CRASH_AT=log.roll:<point>` (eventlog/fault_injection.py) the child kills itself
at that point of its first (or n-th) segment roll instead of waiting for the parent's SIGKILL.

Under `fsync` one thread appends (each append returns durable). Under `group` several threads
append, then each waits with `wait_durable` before acknowledging, so group commits and their
acknowledgements interleave with rolls. Under `interval` one thread acknowledges as soon as
`append` returns, before any sync: SIGKILL does not take the page cache with it, so even those
batches must survive (only a power loss may lose them). Offsets are taken and the batch encoded under one child
lock: a batch's content depends on the offset the log will give it.

The parent kills the child at a random moment. As a backstop the child exits by itself after
`MAX_SECONDS`, so a test that loses track of it cannot leave it running.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path

from eventlog.config import KIB, LogConfig
from eventlog.log import Log
from eventlog.fault_injection import install_crash_point_from_env
from eventlog.records import encode_batch

MAX_SECONDS = 20.0
GROUP_THREADS = 4
BASE_TIMESTAMP_MS = 1_700_000_000_000
# Keep the log small: retention drops segments wholly below `end - RETAIN_OFFSETS`.
RETAIN_OFFSETS = 3_000


def config_for(policy: str) -> LogConfig:
    """The configuration the child and the parent both use (small segments: many rolls)."""
    return LogConfig(segment_bytes=64 * KIB, index_interval_bytes=1 * KIB, max_batch_bytes=16 * KIB,
                     flush_policy=policy, flush_interval_ms=50)  # type: ignore[arg-type]


def epoch_for(base_offset: int) -> int:
    """The leader epoch of the batch starting at `base_offset` (grows with offsets, as in Raft)."""
    return 1 + base_offset // 2_500


def timestamp_for(base_offset: int) -> int:
    return BASE_TIMESTAMP_MS + base_offset * 3


def value_for(offset: int) -> bytes:
    """A value of 0..~600 bytes, different for every offset."""
    seed = f"{offset}:".encode()
    return (seed * (1 + (offset * 7_919) % 97))[: (offset * 31) % 600]


def expected_records(base_offset: int, count: int) -> list[tuple[bytes | None, bytes | None]]:
    return [(f"k{o}".encode(), value_for(o)) for o in range(base_offset, base_offset + count)]


def encode_for(base_offset: int, count: int) -> bytes:
    """The batch the child appends at `base_offset` (encoded at offset 0 / epoch 0, as a leader does)."""
    return encode_batch(expected_records(base_offset, count), timestamp_ms=timestamp_for(base_offset))


class _Child:
    def __init__(self, log: Log, rng: random.Random) -> None:
        self.log = log
        self.rng = rng
        self.lock = threading.Lock()  # offset choice + encode + append are one step

    def say(self, line: str) -> None:
        os.write(1, (line + "\n").encode("ascii"))  # one write: lines never interleave or tear

    def append_one(self, rng: random.Random) -> tuple[int, int]:
        count = rng.choice((1, 1, 2, 3, 5, 8, 13))
        with self.lock:
            base = self.log.end_offset
            if rng.random() < 0.01 and base > RETAIN_OFFSETS:
                self.say(f"RETAIN {base - RETAIN_OFFSETS}")
                self.log.delete_segments_below(base - RETAIN_OFFSETS)
            info = self.log.append(encode_for(base, count), epoch=epoch_for(base))
        assert info.base_offset == base, (info, base)
        return info.base_offset, info.last_offset

    def run_fsync(self) -> None:
        """Also `interval`: acknowledge when append returns (on disk under `fsync`, in the page
        cache under `interval`)."""
        while True:
            base, last = self.append_one(self.rng)
            self.say(f"ACK {base} {last}")

    def run_group(self) -> None:
        def worker(seed: int) -> None:
            rng = random.Random(seed)
            try:
                while True:
                    base, last = self.append_one(rng)
                    if not self.log.wait_durable(last, timeout=10):
                        raise AssertionError(f"offset {last} not durable after 10 s")
                    self.say(f"ACK {base} {last}")
            except BaseException:  # noqa: BLE001 - any failure must stop every thread (below)
                traceback.print_exc()
                os._exit(2)  # a thread that fails must not leave the others acknowledging

        for i in range(GROUP_THREADS):
            threading.Thread(target=worker, args=(self.rng.getrandbits(32) + i,), daemon=True).start()
        time.sleep(MAX_SECONDS)


def main(argv: list[str]) -> int:
    directory, policy, seed = Path(argv[0]), argv[1], int(argv[2])
    # Backstop: never outlive the test by much, whatever happens to the parent.
    threading.Timer(MAX_SECONDS, os._exit, args=(3,)).start()
    install_crash_point_from_env()   # a no-op unless EPOCHLOG_CRASH_AT is set
    log = Log.open(directory, config_for(policy))
    child = _Child(log, random.Random(seed))
    child.say(f"READY {log.start_offset} {log.end_offset}")
    if policy in ("fsync", "interval"):
        child.run_fsync()
    elif policy == "group":
        child.run_group()
    else:
        raise SystemExit(f"unknown policy {policy!r}")
    return 0


if __name__ == "__main__":
    # Errors go to stderr and exit non-zero: the parent reports a child that died on its own.
    sys.exit(main(sys.argv[1:]))
