"""`python -m compaction.worker`: run one cleaning pass in this process (spawned by the cleaner).

Reads a pickled `compaction.rewrite.CleaningJob` on stdin, lowers its own CPU priority
(`worker_nice`), runs the pass (`run_pass`: reads the segment files, writes the cleaned files) and
writes a pickled `("ok", PassOutput)`, `("gone", message)` (a segment disappeared: the log changed)
or `("error", message)` on stdout. It never swaps anything into the log: the node's cleaner thread
does, so a worker killed at any moment leaves only `.cleaned` files, which nothing refers to.

Why a process: the pass is CPU-bound Python; in a thread of the node it would hold the node's
interpreter lock (see compaction/cleaner.py).
"""

from __future__ import annotations

import os
import pickle
import sys


def main() -> int:
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else None
    _die_with_parent(parent)
    if os.environ.get("EPOCHLOG_CRASH_AT"):   # tests: a crash point in the worker takes its node down too
        from eventlog.fault_injection import WORKER_STEPS, install_crash_point_from_env

        install_crash_point_from_env(kill_first=parent, steps=WORKER_STEPS)
    from compaction.rewrite import Pacer, PassAbandonedError, run_pass

    job = pickle.load(sys.stdin.buffer)
    try:
        os.nice(job.config.worker_nice)
    except OSError:
        pass   # not allowed: run at the inherited priority
    try:
        result: tuple[str, object] = ("ok", run_pass(job, Pacer(job.config.max_io_bytes_per_second, yield_gil=False)))
    except PassAbandonedError as exc:
        result = ("gone", str(exc))
    except Exception as exc:  # noqa: BLE001 - reported to the node, which raises CleanerFailedError
        result = ("error", f"{type(exc).__name__}: {exc}")
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()
    return 0


def _die_with_parent(parent: int | None) -> None:
    """Linux: SIGKILL this worker when the node that spawned it dies (PR_SET_PDEATHSIG), so no pass
    outlives its node; elsewhere the cleaner lock (`.cleaner.lock`) still keeps passes apart."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(3)   # the parent died before the prctl took effect


if __name__ == "__main__":
    sys.exit(main())
