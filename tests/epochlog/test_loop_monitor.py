"""The loop monitor measures how long the event loop held its timers, on a real asyncio loop; and the
rate-limited WARNING (epochlog.logs.Throttled) used for refusals that input from outside can repeat.

A coroutine that blocks the loop (time.sleep inside it, what a request doing seconds of work does)
must show up as a stall of at least that long, counted and logged at WARNING once past the bound.
The WARNING is rate-limited: a burst of stalls gives one line. (A loaded machine may add stalls of
its own: the counts are lower bounds.)
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from epochlog import loop_monitor
from epochlog.loop_monitor import LoopMonitor

INTERVAL_S = 0.02
WARNING_S = 0.15


async def _run(blocks_s: list[float], observed: list[float]) -> LoopMonitor:
    monitor = LoopMonitor(INTERVAL_S, WARNING_S, observed.append)
    monitor.start()
    try:
        for block in blocks_s:
            await asyncio.sleep(3 * INTERVAL_S)    # the monitor is asleep in its interval meanwhile
            time.sleep(block)                      # holds the loop, as a request doing work in one turn would
        await asyncio.sleep(3 * INTERVAL_S)
    finally:
        await monitor.close()
    return monitor


def test_a_blocked_loop_is_measured_counted_and_logged_once_per_burst(caplog: pytest.LogCaptureFixture) -> None:
    observed: list[float] = []
    with caplog.at_level(logging.WARNING, logger=loop_monitor.__name__):
        monitor = asyncio.run(_run([0.01, 0.3, 0.25], observed))
    # The two long blocks are stalls of at least their length (less the part of the interval left).
    assert monitor.stalls >= 2, observed
    assert 0.3 - INTERVAL_S <= monitor.longest_s < 5.0, observed
    assert len([s for s in observed if s > WARNING_S]) == monitor.stalls   # the histogram saw each one
    assert len(observed) >= 6                      # one measurement per interval
    lines = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]   # the second stall falls in the quiet period
    assert "event loop stalled" in lines[0].getMessage() and "loop_stall_warning_ms = 150" in lines[0].getMessage()



def test_a_throttled_warning_is_logged_once_per_period_and_then_counts_what_it_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    from epochlog.logs import Throttled

    log = logging.getLogger("tests.throttled")
    throttled = Throttled(log, every_s=0.3)
    with caplog.at_level(logging.WARNING, logger="tests.throttled"):
        for i in range(50):
            throttled.warning("refused %d", i)
        time.sleep(0.35)
        throttled.warning("refused %d", 50)
    lines = [r.getMessage() for r in caplog.records if r.name == "tests.throttled"]
    assert lines[0] == "refused 0" and len(lines) == 2, lines
    assert lines[1].startswith("refused 50 (49 more such lines left out"), lines
