"""The scrub: a background thread that checks every sealed segment of a node's logs at a bounded rate.

Sealed segments below a log's recovery point are trusted when the log opens (eventlog/log.py) and are
read only when someone asks for their offsets: damage that appears in them (bit rot, a bad sector, a
stray write) would wait there until a reader, a follower catching up or a snapshot image reaches it.
The scrub reads each sealed segment of every log in turn and checks every batch as recovery does
(`Log.scrub_segment`: CRC, layout, offsets, epochs), so damage is found within one pass whoever reads
what; it is recorded as a read would record it (eventlog/damage.py), and the group repairs it
(eventlog/raft/runtime/repair.py). The active segment is not scrubbed: it is checked on open from the
recovery point, and by every read.

Cost: `bytes_per_second` bounds the bytes read over all the logs together, each batch counting at
least `BATCH_COST_BYTES` (a `Pacer`, which also gives the interpreter lock up every 2 ms of work, so
the node's event loop never waits long for it). A pass over N bytes of sealed segments takes about N / rate seconds: that is the
scrub period, the longest damage can go unnoticed; the next pass starts `PASS_INTERVAL_S` after one
ends. bench/scrub_bench.py measures what scrubbing costs the put latency (bench/RESULTS.md).

Thread-safety: `start` and `close` from one thread; `stats` may be read from any.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from eventlog.errors import EpochlogError
from eventlog.log import Log
from eventlog.pacing import Pacer

logger = logging.getLogger(__name__)

PASS_INTERVAL_S = 1.0
"""The pause between two passes (also when there is nothing to scrub yet)."""
PACING_WINDOW_S = 0.1
"""The pacer's window: the scrub works in slices of about rate x window bytes, then sleeps (few wake-ups)."""
BATCH_COST_BYTES = 4096
"""Each batch counts at least this much towards the rate: checking a small batch costs about what reading
4 KiB does (its header, the checks, the interpreter), so the scrub's CPU stays bounded however small the
batches are (bench/scrub_bench.py: 1-2 % of a core at 8 MiB/s)."""
PACE_EVERY_BYTES = 64 << 10
"""Bytes accounted between two calls of the pacer (one call per batch would cost more than the checks)."""


@dataclass(slots=True)
class ScrubStats:
    """What the scrub did since the node started (monotonic; read by metrics)."""

    bytes_checked: int = 0
    segments_checked: int = 0
    damage_found: int = 0
    passes: int = 0                     # passes completed over every log
    cpu_seconds: float = 0.0            # CPU time of the scrub thread
    last_pass_seconds: float = 0.0
    last_pass_finished_at: float = 0.0  # time.time() (0: no pass completed yet)


class _Stopped(Exception):
    pass


class Scrubber:
    """Scrubs the logs `logs()` returns (name -> log, asked at the start of every pass) in a daemon thread."""

    def __init__(self, logs: Callable[[], Mapping[str, Log]], bytes_per_second: int, *,
                 pass_interval_s: float = PASS_INTERVAL_S, name: str = "log-scrub") -> None:
        assert bytes_per_second > 0, "a scrub needs a rate (0 in the config means no scrubber at all)"
        self._logs = logs
        self.bytes_per_second = bytes_per_second
        self.pass_interval_s = pass_interval_s
        self.stats = ScrubStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop: a segment being checked is abandoned within one pacing window."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        pacer = Pacer(self.bytes_per_second, window_s=PACING_WINDOW_S)
        owed = 0

        def consumed(nbytes: int) -> None:
            nonlocal owed
            self.stats.bytes_checked += nbytes
            owed += max(nbytes, BATCH_COST_BYTES)
            if owed >= PACE_EVERY_BYTES:
                if self._stop.is_set():
                    raise _Stopped
                pacer.consumed(owed)
                owed = 0
                self.stats.cpu_seconds = time.thread_time()

        try:
            while not self._stop.is_set():
                started = time.monotonic()
                for name, log in list(self._logs().items()):
                    self._scrub_log(name, log, consumed)
                self.stats.passes += 1
                self.stats.last_pass_seconds = time.monotonic() - started
                self.stats.last_pass_finished_at = time.time()
                self._stop.wait(self.pass_interval_s)
        except _Stopped:
            return

    def _scrub_log(self, name: str, log: Log, consumed: Callable[[int], None]) -> None:
        try:
            segments = log.sealed_segments()
        except EpochlogError:
            return   # closed: the node is stopping
        for segment in segments:
            if self._stop.is_set():
                raise _Stopped
            try:
                damage = log.scrub_segment(segment, consumed)
            except (EpochlogError, OSError) as exc:   # the log closing under it, the file going away
                logger.info("scrub of %s, segment %d: %s", name, segment.base_offset, exc)
                continue
            self.stats.segments_checked += 1
            if damage is not None:
                self.stats.damage_found += 1
