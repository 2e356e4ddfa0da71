"""Heartbeat clocks of the brokers, kept in memory by the controller (heartbeats are never logged).

Each registered broker has a `Clock`: the broker epoch it belongs to, the deadline by which the
next heartbeat must arrive, the replicated offset the last heartbeat reported, and whether the
registry has it fenced. A heartbeat only moves the deadline and the offset (one dict lookup and two
attribute writes: the controller absorbs tens of thousands per second); the scan finds the clocks
past their deadline through a heap holding about one entry per broker (an entry whose clock moved
on is pushed again at the new deadline when it surfaces, not at every heartbeat).

Grace. A controller that just took over cannot know when its predecessor last heard from each
broker, so every clock starts full (`track(..., now)` gives `now + timeout`): a controller failover
never fences a broker that keeps heartbeating, at the price of detecting a broker that died just
before the failover up to one timeout later.

Time is the caller's monotonic clock in seconds. Not thread-safe; no IO.
"""

from __future__ import annotations

import heapq

RETRY_FRACTION = 0.5   # an expiry not acted upon (its fence was rejected, leadership moved) is offered again


class Clock:
    __slots__ = ("epoch", "deadline", "offset", "fenced", "last_beat", "queued_at")

    def __init__(self, epoch: int, deadline: float, fenced: bool) -> None:
        self.epoch = epoch
        self.deadline = deadline
        self.offset = -1           # unknown until the first heartbeat this controller hears
        self.fenced = fenced
        self.last_beat = -1.0      # when this controller last heard it (-1: not yet)
        self.queued_at = -1.0      # the time of this clock's one live heap entry (-1: none)


class Liveness:
    """The clocks of every broker, by broker key."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.clocks: dict[str, Clock] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self.clocks)

    def track(self, key: str, epoch: int, fenced: bool, now: float) -> Clock:
        """Start (or restart) a broker's clock in full: a new registration, or a new controller."""
        clock = Clock(epoch, now + self.timeout_s, fenced)
        self.clocks[key] = clock
        self._queue(key, clock, clock.deadline)
        return clock

    def _queue(self, key: str, clock: Clock, at: float) -> None:
        clock.queued_at = at
        heapq.heappush(self._heap, (at, key))

    def forget(self, key: str) -> None:
        self.clocks.pop(key, None)

    def beat(self, clock: Clock, offset: int, now: float) -> None:
        """A valid heartbeat: the clock runs full again."""
        clock.deadline = now + self.timeout_s
        clock.last_beat = now
        if offset >= 0:
            clock.offset = offset

    def set_fenced(self, key: str, fenced: bool, now: float) -> None:
        """The registry says the broker is (un)fenced: an unfenced broker's clock is watched again."""
        clock = self.clocks.get(key)
        if clock is None or clock.fenced == fenced:
            return
        clock.fenced = fenced
        if not fenced:
            clock.deadline = max(clock.deadline, now + self.timeout_s)
            self._queue(key, clock, clock.deadline)

    def alive(self, key: str, now: float) -> bool:
        clock = self.clocks.get(key)
        return clock is not None and not clock.fenced and clock.deadline > now

    def offset(self, key: str) -> int:
        clock = self.clocks.get(key)
        return -1 if clock is None else clock.offset

    def expired(self, now: float) -> list[tuple[str, int]]:
        """(broker key, epoch) of unfenced brokers past their deadline. Each is offered again after
        half a timeout until it is fenced or heard from (an expiry may fail to commit)."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            clock = self.clocks.get(key)
            if clock is None or clock.queued_at != at:
                continue                      # gone, or a superseded entry
            clock.queued_at = -1.0
            if clock.fenced:
                continue                      # watched again once unfenced (set_fenced)
            if clock.deadline > now:
                self._queue(key, clock, clock.deadline)   # heard from since: watch the new deadline
                continue
            out.append((key, clock.epoch))
            self._queue(key, clock, now + self.timeout_s * RETRY_FRACTION)
        return out
