"""How long the node's event loop went without running a timer: the health of the loop Raft lives on.

Every Raft group of a node, its client faces and its admin endpoint share one asyncio loop. A
leader's heartbeats leave from a timer of that loop (one per tick), so anything that holds the loop
(one request doing seconds of work) delays every group's heartbeats; past the election timeout the
followers elect another leader. `LoopMonitor` measures that directly: a task sleeps one interval
(the tick) at a time and records how much later than asked it woke up (the stall). The longest
gap between two heartbeats of a leader is then about one tick plus the longest stall.

Each stall is observed into a histogram (`epochlog_loop_stall_seconds`, epochlog/metrics.py); a
stall longer than `[cluster] loop_stall_warning_ms` is counted and logged at WARNING, at most one
line per `WARNING_EVERY_S` (the line says how many more there were, and the longest). Cost: one
timer wake-up per tick.

Call from the node's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

WARNING_EVERY_S = 10.0


class LoopMonitor:
    """Measures the loop's stalls (see the module docstring). `observe(seconds)` is called with every
    stall measured (the histogram's observe); `interval_s` is how often the loop is probed."""

    def __init__(self, interval_s: float, warning_s: float, observe: Callable[[float], None] | None = None) -> None:
        assert interval_s > 0 and warning_s > 0
        self.interval_s = interval_s
        self.warning_s = warning_s
        self._observe = observe
        self.longest_s = 0.0           # the longest stall since start
        self.stalls = 0                # stalls longer than warning_s since start
        self._task: asyncio.Task[None] | None = None
        self._warned_at = -WARNING_EVERY_S
        self._unreported = 0           # stalls over warning_s since the last WARNING line
        self._unreported_longest = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-monitor")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.record(max(0.0, loop.time() - due), loop.time())

    def record(self, stall_s: float, now: float) -> None:
        """One measurement: `stall_s` seconds late, at loop time `now`."""
        if self._observe is not None:
            self._observe(stall_s)
        self.longest_s = max(self.longest_s, stall_s)
        if stall_s <= self.warning_s:
            return
        self.stalls += 1
        self._unreported += 1
        self._unreported_longest = max(self._unreported_longest, stall_s)
        if now - self._warned_at >= WARNING_EVERY_S:
            more = (f" ({self._unreported - 1} more since the last such line, the longest {self._unreported_longest * 1000:.0f} ms)"
                    if self._unreported > 1 else "")
            logger.warning("the event loop stalled for %.0f ms (loop_stall_warning_ms = %.0f): every group's "
                           "heartbeats were that late%s", stall_s * 1000, self.warning_s * 1000, more)
            self._warned_at = now
            self._unreported = 0
            self._unreported_longest = 0.0
