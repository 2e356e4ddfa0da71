"""One timer that ticks every Raft group of a node, all in the same loop turn.

Each group used to sleep on a timer of its own. Timers of one period drift apart (uvloop caches
its clock per turn and rounds a deadline to the millisecond: three tickers started in one turn
shared a turn in 4 ticks of 40 under load), so a node woke up to once per group and tick period,
and what the groups' ticks send to one peer (heartbeats of the groups it leads) left in separate
writes. Ticking every group in one turn costs one wake-up per tick period, and the transport, which
flushes once per turn, puts what those ticks send to a peer in one frame.

Call everything from the loop the groups run on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

STALL_TICKS = 10
"""A turn this many tick intervals late starts the schedule again from now: after a stall the missed
ticks are not run in a burst (the core would count time that nobody waited for)."""


class Ticker:
    """Calls every added tick function once per `interval_s` of loop time, in order of addition, in one
    turn; the schedule is kept (not `interval_s` after the previous tick's end), so ticks do not drift
    later by the time the ticks themselves take. A tick function must not raise (RaftGroup.tick
    catches and records its own failure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self._ticks: list[Callable[[], None]] = []

    def add(self, tick: Callable[[], None]) -> None:
        self._ticks.append(tick)

    def remove(self, tick: Callable[[], None]) -> None:
        if tick in self._ticks:
            self._ticks.remove(tick)

    async def run(self) -> None:
        """Tick until cancelled."""
        interval = self.interval_s
        next_tick = self.loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_tick - self.loop.time()))
            next_tick += interval
            if self.loop.time() > next_tick + STALL_TICKS * interval:
                next_tick = self.loop.time() + interval   # we were stalled: do not burst
            for tick in tuple(self._ticks):   # a tick may remove a group (it closed)
                tick()
