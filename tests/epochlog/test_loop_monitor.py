"""The loop monitor measures how long the event loop held its timers, on a real asyncio loop; and the
rate-limited WARNING (epochlog.logs.Throttled) used for refusals that input from outside can repeat.

A coroutine that blocks the loop (time.sleep inside it, what a request doing seconds of work does)
must show up as a stall of at least that long, counted and logged at WARNING once past the bound.
The WARNING is rate-limited: a burst of stalls gives one line. (A loaded machine may add stalls of
its own: the counts are lower bounds.) A stall splits into the node's own part and the time the
loop's thread waited for a CPU: a loop that blocks itself has no wait, one starved of CPU by other
processes (run here, in a child pinned to one core at the lowest priority beside two busy
processes) has most of its stalls as waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time

import pytest

from epochlog import loop_monitor
from epochlog.loop_monitor import LoopMonitor, RunQueueClock

INTERVAL_S = 0.02
WARNING_S = 0.15


async def _run(blocks_s: list[float], observed: list[float], own: list[float] | None = None) -> LoopMonitor:
    monitor = LoopMonitor(INTERVAL_S, WARNING_S, observed.append, None if own is None else own.append)
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


def test_a_loop_that_blocks_itself_counts_the_stall_as_its_own() -> None:
    if RunQueueClock().read() is None:
        pytest.skip("no /proc/thread-self/schedstat on this kernel: the wait for a CPU is not known")
    observed: list[float] = []
    own: list[float] = []
    asyncio.run(_run([0.3], observed, own))
    assert len(own) == len(observed)
    longest = max(range(len(observed)), key=observed.__getitem__)
    assert observed[longest] >= 0.3 - INTERVAL_S, observed
    # time.sleep is not runnable: none of it is a wait for a CPU (a loaded machine may add a little).
    assert own[longest] >= 0.8 * observed[longest], (observed[longest], own[longest])


_STARVED = r"""
import asyncio, json, os, sys, time
from epochlog.loop_monitor import LoopMonitor
os.sched_setaffinity(0, {int(sys.argv[1])})
os.nice(19)
stalls, own = [], []
async def main():
    monitor = LoopMonitor(0.02, 10.0, stalls.append, own.append)
    monitor.start()
    await asyncio.sleep(float(sys.argv[2]))
    await monitor.close()
asyncio.run(main())
print(json.dumps([stalls, own]))
"""

_BURN = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.monotonic() + float(sys.argv[2])\nwhile time.monotonic() < end: pass\n"


def test_a_loop_starved_of_cpu_by_other_processes_counts_the_stall_as_waiting() -> None:
    if RunQueueClock().read() is None:
        pytest.skip("no /proc/thread-self/schedstat on this kernel: the wait for a CPU is not known")
    cpu = min(os.sched_getaffinity(0))
    burners = [subprocess.Popen([sys.executable, "-c", _BURN, str(cpu), "6"]) for _ in range(2)]
    try:
        time.sleep(0.2)                   # the burners are running before the loop starts
        out = subprocess.run([sys.executable, "-c", _STARVED, str(cpu), "2"], capture_output=True, text=True,
                             timeout=60, check=True)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    stalls, own = json.loads(out.stdout)
    assert len(stalls) == len(own) and stalls
    long_ones = [(s, o) for s, o in zip(stalls, own) if s >= 0.01]
    # At nice 19 beside two busy processes on its one core, the loop gets a few per cent of it: its
    # timers run late, and most of each long stall is the wait for a CPU, not the loop's own.
    assert long_ones, stalls
    assert sum(o for _, o in long_ones) < 0.5 * sum(s for s, _ in long_ones), long_ones



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
