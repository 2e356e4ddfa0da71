"""The `log-offsets-checkpoint` file: the log start offset and the recovery point of a log directory.

Byte layout (ASCII)::

    0\\n                              version
    <log start offset> <recovery point>\\n

Written atomically (temp file, fsync, rename, directory fsync), so a reader sees the old or the new
content, never a mix.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eventlog.fileutil import atomic_write

logger = logging.getLogger(__name__)

OFFSETS_CHECKPOINT_NAME = "log-offsets-checkpoint"


def read_offsets_checkpoint(directory: Path) -> tuple[int, int]:
    """(log start offset, recovery point) from `log-offsets-checkpoint`; (0, 0) when absent.

    The file is written atomically, so a malformed one is damage, not a torn write: it is then
    ignored (logged) and the whole log is scanned.
    """
    path = directory / OFFSETS_CHECKPOINT_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0, 0
    try:
        version, values = raw.decode("ascii").split("\n", 1)
        start_s, rp_s = values.split()
        if int(version) != 0:
            raise ValueError(f"version {version}")
        return int(start_s), int(rp_s)
    except (ValueError, UnicodeDecodeError) as exc:
        logger.warning("%s is malformed (%s); scanning the whole log", path, exc)
        return 0, 0


def write_offsets_checkpoint(directory: Path, log_start: int, recovery_point: int) -> None:
    """Durably replace the checkpoint of `directory` (raises LogError on an I/O failure)."""
    atomic_write(directory / OFFSETS_CHECKPOINT_NAME, f"0\n{log_start} {recovery_point}\n".encode("ascii"))
