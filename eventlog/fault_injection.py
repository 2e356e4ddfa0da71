"""Fault injection a node process honours when its environment asks: a failing or full disk
(`EPOCHLOG_FAULTS`) and a SIGKILL at a chosen step of compaction or of a segment roll (`EPOCHLOG_CRASH_AT`).

This is the product's small hook surface for real-process tests (tests/eventlog/raft/runtime,
tests/epochlog, tests/compaction): tests set the variables for the one process they want to break; a
production node never has them, and then nothing here runs. `install_from_env()` is called once by
`epochlog serve` before the node starts (and, for the crash points of its steps, by the cleaner's
worker process, compaction/worker.py). It sits in the bottom layer so that every layer's processes can
install it (the worker, the node, a test child running only a log); the steps it can crash in are
named by module path and imported only once a crash point names them.

Theory of operation (disk faults). `install_from_env()` replaces functions of the `os` module for
the whole process, so the product code stays unaware of it: every `os.fdatasync(...)` /
`os.posix_fallocate(...)` / `os.statvfs(...)` call anywhere (log flusher thread, segment roll,
segment preparation, the free-space guard) goes through the wrappers below.

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
  next segment cannot be prepared (`DiskFullError`).
- `disk-full-slow-ms=N` (with `disk-full-after-segments`): each failing `posix_fallocate` call takes N ms
  before it raises, a disk slow to find out it is full: the background preparation of the next segment
  is still under way when the active segment fills up, and the roll would wait for it and fail.
- `statvfs-free-bytes=N`: `os.statvfs` reports at most N bytes available (`f_bavail`): a file system
  that is nearly full, for the free-space guard (`[compaction] min_free_disk_bytes`).

A fault, once triggered, stays (a broken or full disk does not heal by itself) unless the variable
`EPOCHLOG_FAULTS_HEAL_FILE` names a file: once that file exists, the disk-space faults heal (space
was freed: `posix_fallocate` and `statvfs` behave normally again; a failed fdatasync never heals).
Restarting the node without the variable is the "repaired disk". The first injected failure of each
kind is reported on stderr as `epochlog-faults: ... at monotonic=<seconds>`, and the first call that
goes through after healing as `epochlog-faults: ... healed at monotonic=<seconds>`, so a test sees
where and when they happened.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

ENV_VAR = "EPOCHLOG_FAULTS"
HEAL_ENV_VAR = "EPOCHLOG_FAULTS_HEAL_FILE"

P = ParamSpec("P")
R = TypeVar("R")

_KNOWN = ("fdatasync-eio-after", "disk-full-after-segments", "disk-full-slow-ms", "statvfs-free-bytes")


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Parsed `EPOCHLOG_FAULTS`: None means the fault is off."""

    fdatasync_eio_after: int | None = None
    disk_full_after_segments: int | None = None
    disk_full_slow_ms: int | None = None
    statvfs_free_bytes: int | None = None


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
    if "disk_full_slow_ms" in values and "disk_full_after_segments" not in values:
        raise ValueError(f"{ENV_VAR}: disk-full-slow-ms=N needs disk-full-after-segments=N")
    return FaultSpec(**values)


def _healed(heal_file: str | None, what: str, state: dict[str, bool]) -> bool:
    """Whether `heal_file` exists (reported once on stderr when it first does)."""
    if heal_file is None or not os.path.exists(heal_file):
        return False
    if not state.get("reported"):
        state["reported"] = True
        print(f"epochlog-faults: {what} healed at monotonic={time.monotonic():.6f}", file=sys.stderr, flush=True)
    return True


def _fail_after(func: Callable[P, R], allowed: int, code: int, what: str,
                heal_file: str | None = None, slow_s: float = 0.0) -> Callable[P, R]:
    """`func`, except that every call after the first `allowed` raises OSError(code) instead, `slow_s`
    seconds after it was made (until `heal_file` exists, if one is given)."""
    lock = threading.Lock()   # called from the loop, the flusher and the preallocator threads
    calls = 0
    healing: dict[str, bool] = {}

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        nonlocal calls
        with lock:
            calls += 1
            n = calls
        if n <= allowed or (n > allowed + 1 and _healed(heal_file, what, healing)):
            return func(*args, **kwargs)
        if n == allowed + 1:  # CLOCK_MONOTONIC is system-wide: a test can compare it with its own clock
            late = f", {slow_s * 1000:.0f} ms after this line" if slow_s else ""
            print(f"epochlog-faults: {what} call #{n} fails with {errno.errorcode[code]} (injected{late}) "
                  f"at monotonic={time.monotonic():.6f}", file=sys.stderr, flush=True)
        if slow_s:
            time.sleep(slow_s)
        raise OSError(code, os.strerror(code))

    return wrapper


def _low_free_space(func: Callable[[str], os.statvfs_result], free_bytes: int,
                    heal_file: str | None) -> Callable[[str], os.statvfs_result]:
    """`os.statvfs`, reporting at most `free_bytes` available (until `heal_file` exists)."""
    healing: dict[str, bool] = {}
    fired = False

    def wrapper(path: str) -> os.statvfs_result:
        nonlocal fired
        st = func(path)
        if _healed(heal_file, "statvfs", healing):
            return st
        if not fired:
            fired = True
            print(f"epochlog-faults: statvfs reports {free_bytes} bytes free (injected) "
                  f"at monotonic={time.monotonic():.6f}", file=sys.stderr, flush=True)
        fields = list(st)
        fields[4] = min(st.f_bavail, free_bytes // max(1, st.f_frsize))   # f_bavail
        return os.statvfs_result(fields)

    return wrapper


def install(spec: FaultSpec, heal_file: str | None = None) -> list[str]:
    """Replace the `os` functions `spec` breaks; returns a description of what was installed. The
    disk-space faults heal once `heal_file` exists."""
    installed = []
    if spec.fdatasync_eio_after is not None:
        os.fdatasync = _fail_after(os.fdatasync, spec.fdatasync_eio_after, errno.EIO, "fdatasync")
        installed.append(f"fdatasync-eio-after={spec.fdatasync_eio_after}")
    if spec.disk_full_after_segments is not None:
        slow_s = (spec.disk_full_slow_ms or 0) / 1000
        os.posix_fallocate = _fail_after(os.posix_fallocate, spec.disk_full_after_segments, errno.ENOSPC,
                                         "posix_fallocate", heal_file, slow_s)
        installed.append(f"disk-full-after-segments={spec.disk_full_after_segments}"
                         + (f" (failing after {spec.disk_full_slow_ms} ms)" if slow_s else ""))
    if spec.statvfs_free_bytes is not None:
        os.statvfs = _low_free_space(os.statvfs, spec.statvfs_free_bytes, heal_file)
        installed.append(f"statvfs-free-bytes={spec.statvfs_free_bytes}")
    if heal_file is not None:
        installed.append(f"healing once {heal_file} exists")
    return installed


def install_from_env() -> None:
    """Install the faults `EPOCHLOG_FAULTS` and the crash point `EPOCHLOG_CRASH_AT` ask for (nothing when
    they are unset or empty)."""
    install_crash_point_from_env()
    text = os.environ.get(ENV_VAR, "")
    if not text.strip():
        return
    installed = install(parse(text), os.environ.get(HEAL_ENV_VAR) or None)
    print(f"epochlog-faults: installed {', '.join(installed)}", file=sys.stderr, flush=True)


# --- crash points: SIGKILL at a chosen step of the compaction work (or of a segment roll) ------------

CRASH_ENV_VAR = "EPOCHLOG_CRASH_AT"

CRASH_STEPS: dict[str, tuple[str, str]] = {
    # step name -> (module, attribute path) of the callable that does it
    "snapshot.checkpoint": ("statemachines.store", "ViewStore.checkpoint"),   # RocksDB checkpoint (the loop)
    "snapshot.pack": ("statemachines.store", "ViewStore.pack_checkpoint"),    # tar, checkpoint removed (a thread)
    "snapshot.seal": ("eventlog.raft.runtime.group", "seal_snapshot_data"),   # fsync data and directory
    "snapshot.finish": ("eventlog.raft.runtime.log_storage", "LogStorage.finish_snapshot"),   # meta, rename
    "truncate.detach": ("eventlog.raft.runtime.log_storage", "LogStorage.detach_through"),    # log start, renames
    "truncate.unlink": ("eventlog.raft.runtime.group", "_unlink_all"),                        # a thread
    "prune.chunk": ("statemachines.prune", "HistoryPruner.step"),
    "clean.swap": ("eventlog.log", "Log.swap_cleaned"),                      # key compaction's swap (a thread)
    "log.roll": ("eventlog.log", "Log._roll"),                               # seal (trim), new file, checkpoint
    # In the cleaner's worker process (compaction/worker.py installs the point too): a crash there
    # kills the node that spawned it first, then the worker.
    "clean.pass": ("compaction.rewrite", "run_pass"),                        # the whole pass, files written
    "clean.write": ("eventlog.cleaned", "CleanedSegmentWriter.finish"),      # a cleaned file fsynced
}
"""The steps a crash point can name. Inside a step, every file-system call (`os.rename`, `os.replace`,
`os.unlink`, `os.rmdir`, `os.mkdir`, `os.fsync`, `os.fdatasync`) of the thread running it is an "io",
and so is a WriteBatch the pruner writes (`ViewStore.write` within `prune.chunk`)."""
WORKER_STEPS = ("clean.pass", "clean.write")
"""Steps that run in the cleaner's worker process, not in the node."""
COUNTED_AT_FIRST_IO = ("truncate.detach", "prune.chunk")
"""Steps called often with nothing to do: only a run that does an io counts (and `before` is just
before that first io). The others count every run, from its start."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """`<step>:<point>[@<n>]`: point `before` or `after` the n-th run of the step (of those that do
    an io, for COUNTED_AT_FIRST_IO), or `io<k>` (just after its k-th io; after the step when it has
    fewer)."""

    step: str
    point: str
    occurrence: int = 1

    @classmethod
    def parse(cls, text: str) -> CrashPoint:
        spec, _, n = text.partition("@")
        step, _, point = spec.partition(":")
        ok = step in CRASH_STEPS and (point in ("before", "after") or (point.startswith("io") and point[2:].isdigit()))
        if not ok or (n and not n.isdigit()):
            raise ValueError(f"{CRASH_ENV_VAR}: bad crash point {text!r} (<step>:before|after|io<k>[@<n>], steps: "
                             f"{', '.join(CRASH_STEPS)})")
        return cls(step, point, int(n) if n else 1)

    def __str__(self) -> str:
        return f"{self.step}:{self.point}@{self.occurrence}"


def _kill(where: str, first: int | None = None) -> None:
    line = f"epochlog-crash: SIGKILL at {where} (monotonic={time.monotonic():.6f})"
    print(line, file=sys.stderr, flush=True)
    if first:
        # The worker's stderr is a pipe its node reads; the node's own stderr (a file in the tests) says
        # where it died instead.
        try:
            with open(f"/proc/{first}/fd/2", "a") as err:
                err.write(f"{line} (in the cleaner's worker process {os.getpid()}: its node first)\n")
        except OSError:
            pass
        os.kill(first, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def install_crash_point(target: CrashPoint, *, kill_first: int | None = None) -> None:
    """Wrap the steps and the file-system calls so the process kills itself at `target` (after
    SIGKILLing process `kill_first`: the cleaner's worker takes its node down with it).

    The wrappers are thread-aware (a step's ios are those of the thread running it), so a snapshot
    written in a thread and the loop's own file operations are told apart."""
    import importlib

    def _die(where: str) -> None:
        _kill(where, kill_first)

    local = threading.local()   # .run: [step, ios so far, its run number once it counts] of this thread's step
    runs: dict[str, int] = {}
    lock = threading.Lock()

    def count(run: list[Any], where: str) -> None:
        with lock:
            runs[target.step] = n = runs.get(target.step, 0) + 1
        run.append(n)
        if n == target.occurrence and target.point == "before":
            _die(f"{target} ({where})")

    def io_event() -> None:
        run = getattr(local, "run", None)
        if run is None or run[0] != target.step:
            return
        if len(run) == 2:   # the first io of a run counted at its first io
            count(run, "before its first io")
        run[1] += 1
        if run[2] == target.occurrence and target.point == f"io{run[1]}":
            run.append("pending")   # die once this io is done

    def after_io() -> None:
        run = getattr(local, "run", None)
        if run is not None and run[-1] == "pending":
            _die(f"{target} (after io {run[1]})")

    def wrap_io(func: Callable[..., R]) -> Callable[..., R]:
        def wrapper(*args: Any, **kwargs: Any) -> R:
            io_event()
            result = func(*args, **kwargs)
            after_io()
            return result
        return wrapper

    for name in ("rename", "replace", "unlink", "rmdir", "mkdir", "fsync", "fdatasync"):
        setattr(os, name, wrap_io(getattr(os, name)))

    def wrap_step(step: str, func: Callable[..., R]) -> Callable[..., R]:
        def wrapper(*args: Any, **kwargs: Any) -> R:
            if step != target.step:
                return func(*args, **kwargs)
            local.run = [step, 0]
            if step not in COUNTED_AT_FIRST_IO:
                count(local.run, "as it starts")
            try:
                result = func(*args, **kwargs)
            finally:
                run, local.run = local.run, None
            if len(run) > 2 and run[2] == target.occurrence and target.point != "before":
                _die(f"{target} (after the step, which did {run[1]} ios)")
            return result
        return wrapper

    module_name, path = CRASH_STEPS[target.step]   # only the target's step (a worker imports little)
    owner: Any = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    setattr(owner, attr, wrap_step(target.step, getattr(owner, attr)))
    if target.step == "prune.chunk":
        store = importlib.import_module("statemachines.store")
        store.ViewStore.write = wrap_io(store.ViewStore.write)   # a pruning chunk's WriteBatch is its io
    print(f"epochlog-crash: armed at {target}", file=sys.stderr, flush=True)


def install_crash_point_from_env(*, kill_first: int | None = None, steps: tuple[str, ...] | None = None) -> None:
    """Install `EPOCHLOG_CRASH_AT` if it names one of `steps` (default: any)."""
    text = os.environ.get(CRASH_ENV_VAR, "")
    if text.strip():
        target = CrashPoint.parse(text.strip())
        if steps is None or target.step in steps:
            install_crash_point(target, kill_first=kill_first)
