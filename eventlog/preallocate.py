"""Background preparation of the next segment file (RocketMQ's AllocateMappedFileService).

Allocating, zero-filling, syncing and mapping a 64 MiB file takes tens of milliseconds; done when a
segment fills up, it would stall every append behind the roll. A `SegmentPreallocator` keeps one
prepared file (`preallocated.tmp`) ready in the log directory; the roll renames it into place.

Thread-safety: `request`, `take` and `close` may be called from any thread; the work runs in a
daemon thread owned by this object.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from eventlog.errors import EpochlogError
from eventlog.segment import prepare_file

PREALLOCATED_NAME = "preallocated.tmp"


@dataclass(slots=True)
class PreparedFile:
    path: Path
    fd: int
    mm: mmap.mmap

    def discard(self) -> None:
        self.mm.close()
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


class SegmentPreallocator:
    """Keeps at most one prepared segment file ready; prepares the next on request."""

    def __init__(self, directory: Path, size: int) -> None:
        self._path = directory / PREALLOCATED_NAME
        self._size = size
        self._cond = threading.Condition()
        self._ready: PreparedFile | None = None
        self._error: EpochlogError | None = None        # raised once, by the next take()
        self._last_error: EpochlogError | None = None   # kept until a preparation succeeds
        self._busy = False
        self._closed = False

    def request(self) -> None:
        """Start preparing a file unless one is ready or being prepared."""
        with self._cond:
            if self._closed or self._busy or self._ready is not None:
                return
            self._busy = True
            self._error = None
        threading.Thread(target=self._prepare, name="segment-preallocator", daemon=True).start()

    def _prepare(self) -> None:
        try:
            fd, mm = prepare_file(self._path, self._size)
        except EpochlogError as exc:
            with self._cond:
                self._busy = False
                self._error = self._last_error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._busy = False
            self._last_error = None
            prepared = PreparedFile(self._path, fd, mm)
            if self._closed:
                prepared.discard()
            else:
                self._ready = prepared
            self._cond.notify_all()

    @property
    def error(self) -> EpochlogError | None:
        """Why the last preparation failed (e.g. DiskFullError), until one succeeds.

        Read without the lock: a leader asks on every proposal and a follower on every append (the
        disk-full check), and one attribute read sees either the old or the new reference (the
        preparing thread sets it under the lock, so `take` and `ready` stay consistent)."""
        return self._last_error

    def ready(self) -> bool | EpochlogError:
        """Without waiting: True if a prepared file is ready, False while one is being prepared (or none
        was asked for: then its preparation starts), the error of the last preparation if it failed."""
        with self._cond:
            if self._ready is not None:
                return True
            if self._busy:
                return False
            if self._last_error is not None:
                return self._last_error
        self.request()
        return False

    def take(self) -> PreparedFile | None:
        """The prepared file, waiting for one in progress; None if none was requested.

        Raises the preparation's error (e.g. DiskFullError) if it failed.
        """
        with self._cond:
            while self._busy:
                self._cond.wait()
            ready, self._ready = self._ready, None
            if ready is None and self._error is not None:
                error, self._error = self._error, None
                raise error
            return ready

    def close(self) -> None:
        """Stop: wait for a preparation in progress and delete the prepared file."""
        with self._cond:
            self._closed = True
            while self._busy:
                self._cond.wait()
            ready, self._ready = self._ready, None
        if ready is not None:
            ready.discard()
