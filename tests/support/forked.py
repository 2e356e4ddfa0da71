"""Crash-test children forked from one forkserver that imported them once.

A crash test starts a child per kill point or per round. As `python -m <child>` each start paid an
interpreter start and the child's imports (0.5-1 s on a loaded 2-core machine: more than the work the
child is killed in). `start` forks the child instead from a multiprocessing forkserver that preloaded
every crash child of the suite (`PRELOAD`): the same code in a process of its own (its own pid and
memory, killed with SIGKILL through its `Process` object, by its pid), stdout and stderr in files. The
forkserver itself only imports (no RocksDB, no threads), so a child starts as clean as a new interpreter.
`env` adds environment variables before the child's `main` runs (e.g. a crash point, `EPOCHLOG_CRASH_AT`,
which eventlog/fault_injection.py reads when it is installed, not at import).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

PRELOAD = ["tests.compaction.crash_child", "tests.eventlog.crash_child", "tests.eventlog.raft.runtime.install_crash_child",
           "tests.statemachines.crash_child"]
"""Imported once by the forkserver (one per test process; whichever test starts it first)."""


def context() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def start(main: Callable[[list[str]], int], argv: list[str], stdout: Path, stderr: Path | None = None,
          env: dict[str, str] | None = None) -> BaseProcess:
    """Fork `main(argv)` (a module-level function of a crash child) with its stdout in `stdout`, its
    stderr in `stderr` (default: `stdout` too) and `env` added to its environment; started, not waited for."""
    for path in {stdout, stderr or stdout}:
        path.write_bytes(b"")   # here, not in the child: one killed before it opened them still has them
    proc = context().Process(target=_run, args=(main, argv, str(stdout), str(stderr or stdout), dict(env or {})),
                             daemon=False)
    proc.start()
    return proc


def run(main: Callable[[list[str]], int], argv: list[str], stdout: Path, stderr: Path,
        timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """`start` and wait up to `timeout` (then SIGKILL it): (exit code, its stdout, its stderr)."""
    proc = start(main, argv, stdout, stderr, env)
    try:
        proc.join(timeout)
    finally:
        if proc.exitcode is None:
            proc.kill()   # only the process this test started
            proc.join(10)
    return proc.exitcode, stdout.read_text(errors="replace"), stderr.read_text(errors="replace")


def complete_lines(path: Path) -> list[str]:
    """The lines of `path` that have their newline (a child writes each line with one `os.write`: a line
    without one is a write not yet read whole, and no report)."""
    return [raw.decode("ascii").strip() for raw in path.read_bytes().split(b"\n")[:-1]]


def wait_ready(proc: BaseProcess, stdout: Path, timeout: float, poll: float = 0.05) -> bool:
    """Wait until the child's `stdout` has its READY line (True), or it exits, or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not any(line.startswith("READY") for line in complete_lines(stdout)):
        proc.join(poll)
        if proc.exitcode is not None or time.monotonic() > deadline:
            return False
    return True


def _run(main: Callable[[list[str]], int], argv: list[str], stdout: str, stderr: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    out = os.open(stdout, os.O_WRONLY | os.O_APPEND)
    err = out if stderr == stdout else os.open(stderr, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os._exit(main(argv))
