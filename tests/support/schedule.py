"""`make test`'s scheduler: xdist's `--dist loadfile`, except that a run in which a worker dies ends.

xdist 3.8's `loadfile` may hang once a worker dies (pytest-xdist issues 1323 and 1327, fixed after that
release; a suite run here did, at 98 %): its `remove_node` puts back every file the dead worker had ever
run, and a file of finished tests handed out again is a run command with no test, after which nothing
asks for more; and a replacement given one file of one test waits for a second before it runs the
first (a worker runs a test once it knows the next one, or that there is none). Here only what the dead
worker had not run goes back (the test it died in is reported failed by xdist, not run again), and a
worker is given files until it has two tests to run or there are no more (then it is told to stop).
A worker may die between its last report and xdist's receiver thread marking it down; work sent to it
then meets a broken pipe: that unit stays assigned to it, and `remove_node`, which follows, puts back
what it had not run (the first unfinished test in the order given is the one it died in).
The order and the moment files are handed out are otherwise loadfile's.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling


class EndsAfterACrash(LoadFileScheduling):
    """`--dist loadfile` that ends a run in which a worker died (see the module)."""

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        pending = self._pending_of
        try:
            if self.workqueue and pending(self.assigned_work[node]) <= 2:   # loadfile's moment
                self._assign_work_unit(node)
            while self.workqueue and pending(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)
        except OSError:   # the worker died and xdist has not marked it down yet: remove_node takes its work back
            return
        if not self.workqueue:
            node.shutdown()

    def remove_node(self, node: Any) -> str | None:
        workload = self.assigned_work.pop(node)
        unfinished = {unit: tests for unit, tests in workload.items() if not all(tests.values())}
        if not unfinished:
            return None
        crashed = next(nodeid for tests in unfinished.values() for nodeid, done in tests.items() if not done)
        for unit, tests in unfinished.items():
            tests = {nodeid: done or nodeid == crashed for nodeid, done in tests.items()}
            if not all(tests.values()):
                self.workqueue[unit] = tests
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed
