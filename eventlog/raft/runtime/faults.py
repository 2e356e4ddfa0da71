"""Disk-fault injection for real-process tests: make a node's disk fail on purpose.

Theory of operation. Nothing here runs unless the environment variable `EPOCHLOG_FAULTS` is set
(tests set it for the one node process they want to break; a production node never has it).
`install_from_env()` is called once by `eventlog.raft.runtime.process` before the node starts, and
replaces functions of the `os` module for the whole process, so the product code stays unaware of
it: every `os.fdatasync(...)` / `os.posix_fallocate(...)` call anywhere (log flusher thread, segment
roll, segment preparation) goes through the wrappers below.

`EPOCHLOG_FAULTS` is a comma-separated list of `name=N` items:

- `fdatasync-eio-after=N`: the first N calls of `os.fdatasync` in the process succeed; every later
  call raises `OSError(EIO)` without syncing. This is a disk that stopped persisting writes: after a
  failed fdatasync the kernel may have dropped the dirty pages, so the node must stop, never retry
  the sync and acknowledge what it covered (see `eventlog.errors.LogFailedError`).
- `disk-full-after-segments=N`: the first N calls of `os.posix_fallocate` succeed; every later call
  raises `OSError(ENOSPC)`. The log reserves the space of a segment file with posix_fallocate when it
  prepares one (`eventlog.segment.prepare_file`: the first segment of a new log, the background
  preallocation of the next one, a roll) and when it reactivates the last segment on open, so this
  is a disk that fills up after N segment files: appends into the active segment still succeed, the
  next roll fails with `DiskFullError`.

A fault, once triggered, stays (a broken or full disk does not heal by itself); restarting the node
without the variable is the "repaired disk". The first injected failure of each kind is reported on
stderr as `epochlog-faults: ... at monotonic=<seconds>`, so a test sees where and when it fired.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

ENV_VAR = "EPOCHLOG_FAULTS"

P = ParamSpec("P")
R = TypeVar("R")

_KNOWN = ("fdatasync-eio-after", "disk-full-after-segments")


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Parsed `EPOCHLOG_FAULTS`: None means the fault is off."""

    fdatasync_eio_after: int | None = None
    disk_full_after_segments: int | None = None


def parse(text: str) -> FaultSpec:
    """Parse `name=N,name=N`; raises ValueError naming the bad item."""
    values: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or name not in _KNOWN or not value.isdigit():
            raise ValueError(f"{ENV_VAR}: bad item {item!r} (known: {', '.join(n + '=N' for n in _KNOWN)})")
        values[name.replace("-", "_")] = int(value)
    return FaultSpec(**values)


def _fail_after(func: Callable[P, R], allowed: int, code: int, what: str) -> Callable[P, R]:
    """`func`, except that every call after the first `allowed` raises OSError(code) instead."""
    lock = threading.Lock()   # called from the loop, the flusher and the preallocator threads
    calls = 0

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        nonlocal calls
        with lock:
            calls += 1
            n = calls
        if n <= allowed:
            return func(*args, **kwargs)
        if n == allowed + 1:  # CLOCK_MONOTONIC is system-wide: a test can compare it with its own clock
            print(f"epochlog-faults: {what} call #{n} fails with {errno.errorcode[code]} (injected) "
                  f"at monotonic={time.monotonic():.6f}", file=sys.stderr, flush=True)
        raise OSError(code, os.strerror(code))

    return wrapper


def install(spec: FaultSpec) -> list[str]:
    """Replace the `os` functions `spec` breaks; returns a description of what was installed."""
    installed = []
    if spec.fdatasync_eio_after is not None:
        os.fdatasync = _fail_after(os.fdatasync, spec.fdatasync_eio_after, errno.EIO, "fdatasync")
        installed.append(f"fdatasync-eio-after={spec.fdatasync_eio_after}")
    if spec.disk_full_after_segments is not None:
        os.posix_fallocate = _fail_after(os.posix_fallocate, spec.disk_full_after_segments, errno.ENOSPC,
                                         "posix_fallocate")
        installed.append(f"disk-full-after-segments={spec.disk_full_after_segments}")
    return installed


def install_from_env() -> None:
    """Install the faults `EPOCHLOG_FAULTS` asks for (nothing when it is unset or empty)."""
    text = os.environ.get(ENV_VAR, "")
    if not text.strip():
        return
    installed = install(parse(text))
    print(f"epochlog-faults: installed {', '.join(installed)}", file=sys.stderr, flush=True)
