"""Small durable-file helpers shared by the log's checkpoint files."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from eventlog.errors import DiskFullError, LogFailedError


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so that creates, renames and unlinks inside it survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` all or nothing: temp file, fsync, rename, fsync the directory.

    A crash leaves either the old content or the new one, never a mix; a leftover `.tmp` file is
    ignored (and removed) by the next open.
    """
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
        fsync_dir(p.parent)
    except OSError as exc:
        raise io_error(f"writing {p}", exc) from exc


def io_error(what: str, exc: OSError) -> LogFailedError | DiskFullError:
    """Map an OSError from a write path to the log's error types (ENOSPC is retriable)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{what}: disk full ({exc.strerror})")
    return LogFailedError(f"{what}: {exc.strerror or exc}")
