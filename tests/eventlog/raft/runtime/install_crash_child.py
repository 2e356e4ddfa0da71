"""Child process of the snapshot-install crash test (tests/eventlog/raft/runtime/test_install_crash.py): install, and die on cue.

    python -m tests.eventlog.raft.runtime.install_crash_child GROUP_DIR IMAGE_FILE META_FILE POINT

Opens the group's LogStorage in GROUP_DIR, stages the snapshot image IMAGE_FILE (its SnapshotMeta in
META_FILE, JSON) in chunks, then installs it with every file-system call counted: each os.rename,
os.replace, os.unlink, os.link, os.rmdir, os.mkdir, os.fsync and os.fdatasync is an event j. With
POINT = 2j the child SIGKILLs itself just before event j, with 2j + 1 just after it. With POINT -1 it
does not crash: it prints `EVENT <j> <call> <argument>` for each event, then `DONE`.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import msgspec

from eventlog.config import LogConfig
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.types import ConfState, SnapshotMeta

WRAPPED = ("rename", "replace", "unlink", "link", "rmdir", "mkdir", "fsync", "fdatasync")
CONFIG = LogConfig(segment_bytes=16 << 10, index_interval_bytes=256, flush_policy="fsync",
                   preallocate_next_segment=False)
CONF = ConfState(voters=(1, 2, 3))


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: list[str]) -> int:
    directory, image, meta_file, point = Path(argv[0]), Path(argv[1]), Path(argv[2]), int(argv[3])
    meta = msgspec.json.decode(meta_file.read_bytes(), type=SnapshotMeta)
    data = image.read_bytes()
    storage = LogStorage.open(directory, CONFIG, CONF, ships_log_prefix=True)
    for offset in range(0, len(data), 3000):
        storage.stage_snapshot_chunk(meta, offset, data[offset:offset + 3000])
    events = 0
    originals = {name: getattr(os, name) for name in WRAPPED}

    def wrap(name: str):  # type: ignore[no-untyped-def]
        fn = originals[name]

        def step(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal events
            j = events
            events += 1
            if point < 0:
                where = args[0] if name in ("rename", "replace", "unlink", "link", "rmdir", "mkdir") else ""
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
    storage.install_snapshot(meta)
    for name, fn in originals.items():
        setattr(os, name, fn)
    say("DONE")
    storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
