"""How long the node's event loop went without running a timer: the health of the loop Raft lives on.

Every Raft group of a node, its client faces and its admin endpoint share one asyncio loop. A
leader's heartbeats leave from a timer of that loop (one per tick), so anything that holds the loop
(one request doing seconds of work) delays every group's heartbeats; past the election timeout the
followers elect another leader. `LoopMonitor` measures that directly: a task sleeps one interval
(the tick) at a time and records how much later than asked it woke up (the stall). The longest
gap between two heartbeats of a leader is then about one tick plus the longest stall.

A stall has two causes an operator mends differently: the node holding its own loop (work or a
blocking call in one turn, a lock another of its threads holds), or the machine not giving the
runnable process a CPU (other processes, too few cores). Linux counts, per thread, the time it sat
runnable on a run queue (`/proc/thread-self/schedstat`, the second field); that time over the
interval, capped at the stall, is the part of the stall the loop waited for a CPU; the rest is the
node's own.

Each stall is observed into a histogram (`epochlog_loop_stall_seconds`, epochlog/metrics.py), and
its own part into `epochlog_loop_stall_own_seconds`; a stall longer than `[cluster]
loop_stall_warning_ms` is counted and logged at WARNING with its wait for a CPU, at most one line per
`WARNING_EVERY_S` (the line says how many more there were, and the longest). Cost: one timer
wake-up and one short `pread` per tick. Without schedstat (another kernel) the wait is unknown
and the whole stall counts as the node's own.

Call from the node's loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from eventlog.cancellation import cancel_and_wait

logger = logging.getLogger(__name__)

WARNING_EVERY_S = 10.0


class LoopMonitor:
    """Measures the loop's stalls (see the module docstring). `observe(seconds)` is called with every
    stall measured and `observe_own(seconds)` with its own part, the stall less its wait for a CPU
    (the histograms' observe); `interval_s` is how often the loop is probed."""

    def __init__(self, interval_s: float, warning_s: float, observe: Callable[[float], None] | None = None,
                 observe_own: Callable[[float], None] | None = None) -> None:
        assert interval_s > 0 and warning_s > 0
        self.interval_s = interval_s
        self.warning_s = warning_s
        self._observe = observe
        self._observe_own = observe_own
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
            await cancel_and_wait([self._task])
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        queued = RunQueueClock()          # opened here: the loop's thread is the one it reads
        try:
            waited = queued.read()
            while True:
                due = loop.time() + self.interval_s
                await asyncio.sleep(self.interval_s)
                stall = max(0.0, loop.time() - due)
                after = queued.read()
                cpu_wait = None if waited is None or after is None else min(stall, after - waited)
                self.record(stall, loop.time(), cpu_wait)
                waited = after
        finally:
            queued.close()

    def record(self, stall_s: float, now: float, cpu_wait_s: float | None = None) -> None:
        """One measurement: `stall_s` seconds late, at loop time `now`, of which the loop waited
        `cpu_wait_s` for a CPU (None: not known)."""
        if self._observe is not None:
            self._observe(stall_s)
        if self._observe_own is not None:
            self._observe_own(stall_s - (cpu_wait_s or 0.0))
        self.longest_s = max(self.longest_s, stall_s)
        if stall_s <= self.warning_s:
            return
        self.stalls += 1
        self._unreported += 1
        self._unreported_longest = max(self._unreported_longest, stall_s)
        if now - self._warned_at >= WARNING_EVERY_S:
            more = (f" ({self._unreported - 1} more since the last such line, the longest {self._unreported_longest * 1000:.0f} ms)"
                    if self._unreported > 1 else "")
            waited = ("" if cpu_wait_s is None else
                      f"; {cpu_wait_s * 1000:.0f} ms of it the process waited for a CPU, the rest was its own")
            logger.warning("the event loop stalled for %.0f ms (loop_stall_warning_ms = %.0f): every group's "
                           "heartbeats were that late%s%s", stall_s * 1000, self.warning_s * 1000, waited, more)
            self._warned_at = now
            self._unreported = 0
            self._unreported_longest = 0.0


class RunQueueClock:
    """The seconds the calling thread has spent runnable but waiting for a CPU, from the kernel's
    schedstat; `read()` is None where the file is missing or unreadable. Open it on the thread to
    measure (`/proc/thread-self` is that thread's)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> float | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
