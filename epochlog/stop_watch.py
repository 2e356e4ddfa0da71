"""Where a node's shutdown waits: each step timed, and a stack dump when the whole stop overruns.

A node asked to stop (SIGTERM) that does not exit is killed by whatever supervises it, and then all
that is left is a log that ends at "serving". `StopWatch` makes that case readable: every step of the
stop that takes longer than `slow_step_s` is logged at WARNING with its name and duration, and when the
whole stop runs past `dump_after_s` the stacks are written to stderr twice over:

- every thread's Python stack, from a timer thread of its own, so the dump happens even when the event
  loop is blocked (a join, a lock, a blocking call on the loop). It takes the GIL like any thread
  (`sys._current_frames`), never reading other threads' frames without it as `faulthandler`'s timer
  does, which is not safe while threads come and go;
- every pending asyncio task's stack, from a task on the loop, for a stop that waits on a future
  nobody completes (the loop turns, but the step never ends).

Call from the node's loop; `close()` cancels both dumps once the stop has ended.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
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
        self._dump_timer: threading.Timer | None = None
        self._lock = threading.Lock()   # the two dumps write to one stream

    def start(self) -> None:
        """Arm the dumps: call when the stop begins."""
        self._started = time.monotonic()
        self._dump_timer = threading.Timer(self.dump_after_s, self._dump_threads)
        self._dump_timer.name = "stop-watch"
        self._dump_timer.daemon = True
        self._dump_timer.start()
        self._dump_task = asyncio.get_running_loop().create_task(self._dump_tasks_later(), name="stop-watch")

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
        if self._dump_timer is not None:
            self._dump_timer.cancel()
        if self._dump_task is not None:
            self._dump_task.cancel()

    def _dump_threads(self) -> None:
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        with self._lock:
            print(f"--- {self.what}: still stopping after {self.elapsed_s:.1f} s, at {self._step}; "
                  f"the stacks of its {len(frames) - 1} other threads:", file=self._out)
            for ident, frame in frames.items():
                if ident != threading.get_ident():
                    print(f"--- thread {names.get(ident, ident)}", file=self._out)
                    traceback.print_stack(frame, limit=20, file=self._out)
            self._out.flush()

    async def _dump_tasks_later(self) -> None:
        await asyncio.sleep(self.dump_after_s)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        logger.warning("%s: still stopping after %.1f s, at %s; the stacks of its %d tasks follow on stderr",
                       self.what, self.elapsed_s, self._step, len(tasks))
        with self._lock:
            for task in tasks:
                print(f"--- task {task.get_name()}", file=self._out)
                task.print_stack(limit=12, file=self._out)
            self._out.flush()
