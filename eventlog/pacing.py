"""Pacing of background IO that runs next to the node's event loop (key compaction, the scrub).

A background pass reads and checks many bytes; unthrottled it takes disk bandwidth and, in a thread of
the node's process, the interpreter lock from the loop that keeps Raft alive. `Pacer` bounds both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

YIELD_INTERVAL_S = 0.002   # in a thread: give the GIL to other threads at least this often
YIELD_SLEEP_S = 0.0001


class Pacer:
    """Throttles a pass's IO to `bytes_per_second` (0: no limit; Kafka's Throttler) and, when it runs
    in a thread of the node's process (`yield_gil`), gives the interpreter lock up every
    `YIELD_INTERVAL_S` of work. Not thread-safe (one pass at a time)."""

    def __init__(self, bytes_per_second: int, *, yield_gil: bool = True, window_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.bytes_per_second = bytes_per_second
        self.yield_gil = yield_gil
        self.window_s = window_s
        self._clock = clock
        self._sleep = sleep
        self._window_start = clock()
        self._window_bytes = 0
        self._last_yield = clock()
        self.slept_s = 0.0

    def consumed(self, nbytes: int) -> None:
        now = self._clock()
        if self.bytes_per_second > 0:
            self._window_bytes += nbytes
            elapsed = now - self._window_start
            due = self._window_bytes / self.bytes_per_second
            if due > elapsed and (due - elapsed >= 0.001 or elapsed >= self.window_s):
                self._pause(due - elapsed)
                now = self._clock()
            if elapsed >= self.window_s:
                self._window_start, self._window_bytes = now, 0
        if self.yield_gil and now - self._last_yield >= YIELD_INTERVAL_S:
            self._pause(YIELD_SLEEP_S)

    def _pause(self, seconds: float) -> None:
        self._sleep(seconds)
        self.slept_s += seconds
        self._last_yield = self._clock()
