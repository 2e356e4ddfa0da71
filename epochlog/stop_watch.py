"""Where a node's shutdown waits: each step timed, and a stack dump when the whole stop overruns.

A node asked to stop (SIGTERM) that does not exit is killed by whatever supervises it, and then all
that is left is a log that ends at "serving". `StopWatch` makes that case readable: every step of the
stop that takes longer than `slow_step_s` is logged at WARNING with its name and duration, and when the
whole stop runs past `dump_after_s` the stacks are written to stderr twice over:

- every thread's Python stack, by `faulthandler` from its own thread, so the dump happens even when
  the event loop itself is blocked (a join, a lock, a blocking call on the loop);
- every pending asyncio task's stack, from a task on the loop, for a stop that waits on a future
  nobody completes (the loop turns, but the step never ends).

Call from the node's loop; `close()` cancels both dumps once the stop has ended.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

logger = logging.getLogger(__name__)

SLOW_STEP_S = 1.0      # a stop step longer than this is logged with its name
DUMP_AFTER_S = 5.0     # a stop longer than this writes every thread's and task's stack to stderr


class StopWatch:
    """Times a node's stop (see the module docstring). `what` names the node in the lines it logs."""

    def __init__(self, what: str, *, slow_step_s: float = SLOW_STEP_S, dump_after_s: float = DUMP_AFTER_S,
                 out: TextIO | None = None) -> None:
        self.what = what
        self.slow_step_s = slow_step_s
        self.dump_after_s = dump_after_s
        self._out = out if out is not None else sys.stderr
        self._started = time.monotonic()
        self._step = "starting to stop"
        self._dump_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Arm the dumps: call when the stop begins."""
        self._started = time.monotonic()
        try:
            faulthandler.dump_traceback_later(self.dump_after_s, repeat=False, file=self._out)
        except (io.UnsupportedOperation, ValueError):   # stderr without a file descriptor (tests' capture)
            pass
        self._dump_task = asyncio.get_running_loop().create_task(self._dump_tasks_later(),
                                                                 name="stop-watch")

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """One step of the stop; logged when it takes longer than `slow_step_s`."""
        self._step = name
        began = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - began
            if took > self.slow_step_s:
                logger.warning("%s: stopping %s took %.1f s", self.what, name, took)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def close(self) -> None:
        """The stop has ended: no dump."""
        faulthandler.cancel_dump_traceback_later()
        if self._dump_task is not None:
            self._dump_task.cancel()

    async def _dump_tasks_later(self) -> None:
        await asyncio.sleep(self.dump_after_s)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        logger.warning("%s: still stopping after %.1f s, at %s; the stacks of its %d tasks follow on stderr",
                       self.what, self.elapsed_s, self._step, len(tasks))
        for task in tasks:
            print(f"--- task {task.get_name()}", file=self._out)
            task.print_stack(limit=12, file=self._out)
        self._out.flush()
