"""Where a benchmark's CPU goes: CPU seconds of this process and every process below it, by role and by
thread, read from /proc (no sampling profiler, nothing added to the measured processes).

A benchmark that starts nodes, a Spark session and helper servers reads one `CpuSnapshot` before and
one after each phase; `CpuSnapshot.delta` says which process (by role) and which kind of thread (by
thread name: the JVM's C1/C2 compiler and GC threads, RocksDB's background threads, ...) used the CPU
of that phase. A process counts its own time and that of the children it reaped (a live child counts
for itself), so nothing is counted twice; a thread that exited while the phase ran shows in its
process's total only (`<exited threads, reaped children>`, which also holds the time of the children it reaped).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK")
_DIGITS = re.compile(r"[-_#:]?\d+$")
EXITED = "<exited threads, reaped children>"


def _stat(path: str) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of a /proc stat file; None if the process or thread is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of one process so far (its reaped children not counted); None if it is gone."""
    got = _stat(f"/proc/{pid}/stat")
    return None if got is None else (int(got[1][11]) + int(got[1][12])) / _TICK


def thread_kind(comm: str) -> str:
    """A thread's name without its number: `C2 CompilerThre`, `GC Thread`, `rocksdb:low`, `python`..."""
    return _DIGITS.sub("", comm.strip()) or comm


@dataclass
class CpuSnapshot:
    """CPU seconds so far: per role (process totals, reaped children included) and per role and thread kind."""

    roles: dict[str, float] = field(default_factory=dict)
    threads: dict[tuple[str, str], float] = field(default_factory=dict)
    pids: dict[str, set[int]] = field(default_factory=dict)

    def delta(self, before: CpuSnapshot) -> CpuSnapshot:
        """What was used between `before` and this snapshot (roles and thread kinds that used nothing dropped),
        and the processes started meanwhile (`pids`: those still alive). A process that exited meanwhile is
        not in this snapshot: its time moves to the process that reaped it (cutime), in that one's role."""
        roles = {r: s - before.roles.get(r, 0.0) for r, s in self.roles.items()}
        threads = {k: s - before.threads.get(k, 0.0) for k, s in self.threads.items()}
        for role, total in roles.items():
            named = sum(s for (r, _), s in threads.items() if r == role)
            threads[(role, EXITED)] = max(0.0, total - named)
        return CpuSnapshot({r: s for r, s in roles.items() if s >= 0.05},
                           {k: s for k, s in threads.items() if s >= 0.05},
                           {r: p - before.pids.get(r, set()) for r, p in self.pids.items()})

    def top(self, role: str, n: int = 4) -> list[tuple[str, float]]:
        """The `n` thread kinds of `role` that used the most CPU."""
        kinds = sorted(((kind, s) for (r, kind), s in self.threads.items() if r == role), key=lambda x: -x[1])
        return kinds[:n]

    def summary(self) -> dict[str, object]:
        """JSON-ready: seconds per role, per role its top thread kinds, and (of a delta) the processes each
        role started."""
        return {"cpu_s": {r: round(s, 2) for r, s in sorted(self.roles.items(), key=lambda x: -x[1])},
                "threads": {r: {k: round(s, 2) for k, s in self.top(r)} for r in self.roles},
                "started": {r: len(p) for r, p in self.pids.items() if p}}


def snapshot(role_of: Callable[[int, str, str | None], str | None]) -> CpuSnapshot:
    """CPU of every process below this one (and this one), each given a role by `role_of(pid, comm,
    parent's role)` (None: its parent's role; this process's default role is `driver`)."""
    parents: dict[int, int] = {}
    comms: dict[int, str] = {}
    totals: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        got = _stat(f"/proc/{entry}/stat")
        if got is None:
            continue
        comm, fields = got
        pid = int(entry)
        parents[pid], comms[pid] = int(fields[1]), comm
        totals[pid] = sum(int(x) for x in fields[11:15]) / _TICK   # utime stime cutime cstime
    me = os.getpid()
    roles: dict[int, str] = {}

    def role(pid: int) -> str | None:
        if pid in roles:
            return roles[pid]
        if pid == me:
            found: str | None = role_of(pid, comms[pid], None) or "driver"
        elif pid <= 1 or pid not in parents:
            found = None
        else:
            above = role(parents[pid])
            found = None if above is None else role_of(pid, comms[pid], above) or above
        if found is not None:
            roles[pid] = found
        return found

    out = CpuSnapshot()
    for pid in totals:
        r = role(pid)
        if r is None:
            continue
        out.roles[r] = out.roles.get(r, 0.0) + totals[pid]
        out.pids.setdefault(r, set()).add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            got = _stat(f"/proc/{pid}/task/{tid}/stat")
            if got is None:
                continue
            comm, fields = got
            key = (r, thread_kind(comm))
            out.threads[key] = out.threads.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out
