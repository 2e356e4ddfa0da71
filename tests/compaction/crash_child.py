"""Child process of the cleaner crash test (tests/compaction/test_crash.py): clean, and die on cue.

    python -m tests.compaction.crash_child LOG_DIR SEGMENT_BYTES CLEAN_BELOW POINT

Opens the log in LOG_DIR, then runs one forced cleaning pass below CLEAN_BELOW with every file-system
step counted: each os.rename, os.replace, os.unlink, os.fsync, os.fdatasync and os.pwritev the pass
makes is an event j (fsync of a directory included). With POINT = 2j the child SIGKILLs itself just
before event j, with 2j + 1 just after it. With POINT -1 it does not crash: it prints
`EVENT <j> <call> <argument>` for each event, then `RESULT <dirty offset> <records dropped>`.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from eventlog.config import LogConfig
from eventlog.log import Log

WRAPPED = ("rename", "replace", "unlink", "fsync", "fdatasync", "pwritev")


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: list[str]) -> int:
    directory, segment_bytes, below, point = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=256, flush_policy="fsync",
                       preallocate_next_segment=False)
    log = Log.open(directory, config)
    events = 0
    originals = {name: getattr(os, name) for name in WRAPPED}

    def wrap(name: str):  # type: ignore[no-untyped-def]
        fn = originals[name]

        def step(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal events
            j = events
            events += 1
            if point < 0:
                where = args[0] if name in ("rename", "replace", "unlink") else ""
                say(f"EVENT {j} {name} {where}")
            if point == 2 * j:
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                return fn(*args, **kwargs)
            finally:   # an unlink of a missing file raises: still a step
                if point == 2 * j + 1:
                    os.kill(os.getpid(), signal.SIGKILL)
        return step

    for name in WRAPPED:
        setattr(os, name, wrap(name))
    # In this process (worker_process false): every step of the pass is counted here.
    result = clean_log(log, below, CleanerConfig(delete_retention_ms=10**15, worker_process=False), force=True)
    for name, fn in originals.items():
        setattr(os, name, fn)
    say(f"RESULT {result.dirty_offset} {result.records_dropped} {result.segments_before} {result.segments_after}")
    log.close()
    return 0


def forked(argv: list[str], output: str) -> None:
    """`main(argv)` in a process forked from a server that imported this module once (the test's 124
    kill points each cost a fork, not an interpreter start): stdout and stderr go to `output`."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os._exit(main(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
