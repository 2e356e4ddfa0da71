"""The order in which `make test`'s two xdist workers get the test files: slowest first.

xdist's `--dist loadfile` hands out whole files in the order of their number of tests, most first, so
the files of one or two slow tests (a Spark export, the tour, the crash steps: a minute each) came
last and one worker ran them alone for a minute while the other had stopped. Handed out slowest
first (longest processing time first, from `tests/durations.txt`, each file's summed test time in a
suite run), the last units are the short ones and the workers finish close together.

tests/spark is one unit: its files share the session's SparkSession (tests/spark/conftest.py), so
one worker starts the one JVM instead of both starting one. While the machine has no Spark CDS
archive yet (tests/support/spark_cds.py: made once per machine beside the first tests), the units
that start JVMs go after the first few others, so their JVMs map the archive instead of loading
Spark's classes again. The order is decided by the controller alone; the workers' collections stay
the same. Refresh the list after a suite run with `--junit-xml=FILE`:
`python -m tests.support.schedule FILE`.
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadFileScheduling

DURATIONS = Path(__file__).resolve().parents[1] / "durations.txt"
ONE_UNIT = ("tests/spark/",)
"""Folders whose files run as one unit (on one worker)."""
STARTS_JVMS = ("tests/spark/", "tests/epochlog/test_tour.py", "tests/epochlog/test_doc_snippets.py")
JVMS_AFTER = 4
"""Without an archive, the JVM units go after this many others (a few minutes of work: the archive
took 2 minutes to make on the loaded 2-core machine)."""


def unit_of(path: str) -> str:
    """The scheduling unit of a test file (a path relative to the repository)."""
    return next((folder for folder in ONE_UNIT if path.startswith(folder)), path)


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file (`<seconds> <path>` lines; `#` starts a comment)."""
    out: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                seconds, name = line.split(None, 1)
                out[name] = float(seconds)
    return out


def order_units(units: Iterable[str], durations: dict[str, float], *, archive_ready: bool = True) -> list[str]:
    """`units` slowest first (a unit's time is that of its files; a file not listed counts 0, keeping
    its place among those); JVM units after the first JVMS_AFTER others unless `archive_ready`."""
    units = list(units)

    def seconds(unit: str) -> float:
        return sum(s for name, s in durations.items() if unit_of(name) == unit)

    ordered = sorted(units, key=lambda u: -seconds(u))   # stable: unlisted files keep collection order
    if archive_ready:
        return ordered
    jvms = [u for u in ordered if u.startswith(STARTS_JVMS)]
    others = [u for u in ordered if u not in jvms]
    return others[:JVMS_AFTER] + jvms + others[JVMS_AFTER:]


class SlowestFirst(LoadFileScheduling):
    """`--dist loadfile`, its units handed out in `order_units`' order, each when a worker is about to
    need it: xdist gives a worker its next unit once at most 2 of its tests are left, which for a
    file of two one-minute tests is when it starts, binding the next unit to a worker busy for two
    minutes while the other may run out of work. Here a worker gets it at its last test (which a
    worker only starts once it knows the next one, or that there is none).

    It also ends a run in which a worker died, which xdist 3.8's `loadfile` may not (pytest-xdist
    issues 1323 and 1327, fixed after that release): its `remove_node` put back every unit the dead
    worker had ever run, and a unit of finished tests, handed out again, is a run command with no
    test, after which nothing asks for more; and a replacement given one unit of one test waits for
    a second before it runs the first. Here only what the dead worker had not run goes back (the
    test it died in is reported failed by xdist, not run again), and a worker is always given units
    until it has two tests to run or there is no more work (then it is told to stop)."""

    def __init__(self, config: Any, log: Any = None, *, archive_ready: bool = True) -> None:
        super().__init__(config, log)
        self.archive_ready = archive_ready
        self._order: list[str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid.split("::", 1)[0])

    def _assign_work_unit(self, node: Any) -> None:
        if self._order is None:
            self._order = order_units(self.workqueue, read_durations(), archive_ready=self.archive_ready)
        unit = next(u for u in self._order if u in self.workqueue)
        self.workqueue.move_to_end(unit, last=False)   # the one xdist pops next
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        while self._pending_of(self.assigned_work[node]) <= 1:
            if not self.workqueue:
                node.shutdown()
                return
            self._assign_work_unit(node)

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


def durations_from_junit(report: Path) -> dict[str, float]:
    """Summed test time per file from a pytest `--junit-xml` report."""
    files: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        module = max((i for i, part in enumerate(parts) if part.startswith("test_")), default=len(parts) - 1)
        files["/".join(parts[:module + 1]) + ".py"] += float(case.get("time") or 0)
    return dict(files)


def main(argv: list[str]) -> None:
    files = durations_from_junit(Path(argv[0]))
    lines = [f"{seconds:.1f} {name}" for name, seconds in sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))
             if seconds >= 1.0]
    header = ("# Seconds per test file in a suite run, summed over its tests (tests/support/schedule.py orders\n"
              "# xdist's units by it; files under 1 s left out), from the run's --junit-xml report:\n"
              "# python -m tests.support.schedule REPORT.xml\n")
    DURATIONS.write_text(header + "\n".join(lines) + "\n")
    print(f"{len(lines)} files written to {DURATIONS}")


if __name__ == "__main__":
    main(sys.argv[1:])
