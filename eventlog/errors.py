"""The one error hierarchy of Epochlog.

Every error Epochlog raises on purpose derives from `EpochlogError`. Higher layers (raft, views,
the node) add their own subclasses next to their code but always under this root, so a caller can
catch one type. `retriable` says whether the same request may succeed if simply tried again later;
`code` is the stable name used on the wire (the node maps codes to errors through one table).

A broken internal invariant is an `AssertionError`, never one of these: it must not be caught and
hidden as if it were bad input.
"""

from __future__ import annotations

from typing import ClassVar


class EpochlogError(Exception):
    """Root of every error Epochlog raises on purpose."""

    code: ClassVar[str] = "internal"
    retriable: ClassVar[bool] = False


class ConfigError(EpochlogError):
    """A configuration key or value is wrong; the message names the key and the value."""

    code = "config"

    def __init__(self, key: str, value: object, problem: str) -> None:
        self.key = key
        self.value = value
        self.problem = problem
        # No value (a whole file is wrong: not found, invalid TOML): the key is the file, and no "= None".
        super().__init__(f"config {key}: {problem}" if value is None else f"config {key} = {value!r}: {problem}")


class LogError(EpochlogError):
    """Base of errors raised by the segmented event log."""

    code = "log"


class InvalidBatchError(LogError):
    """Bytes that are not a well-formed Kafka RecordBatch v2 (bad CRC, magic, length, varint...)."""

    code = "invalid_batch"


class UnsupportedCompressionError(InvalidBatchError):
    """A batch uses a compression codec Epochlog does not decode."""

    code = "unsupported_compression"


class BatchTooLargeError(LogError):
    """A batch is larger than `max_batch_bytes` (or than a segment): split it."""

    code = "batch_too_large"


class OffsetOutOfRangeError(LogError):
    """An offset outside [log start, log end] was asked for."""

    code = "offset_out_of_range"

    def __init__(self, offset: int, start_offset: int, end_offset: int) -> None:
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset
        super().__init__(f"offset {offset} is outside the log [{start_offset}, {end_offset})")


class StaleEpochError(LogError):
    """An append carried a leader epoch lower than one already in the log."""

    code = "stale_epoch"

    def __init__(self, epoch: int, latest_epoch: int) -> None:
        self.epoch = epoch
        self.latest_epoch = latest_epoch
        super().__init__(f"epoch {epoch} is older than the log's latest epoch {latest_epoch}")


class OffsetMismatchError(LogError):
    """A replicated batch does not start at the log end offset."""

    code = "offset_mismatch"


class LogCorruptionError(LogError):
    """Stored data is damaged where it cannot be a torn tail; names the file and byte position.

    Raised on open instead of dropping data in the middle of the log. Open with `repair=True` to
    cut the log at `position` explicitly (everything after it is lost).
    """

    code = "log_corruption"

    def __init__(self, path: str, position: int, reason: str) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        super().__init__(f"{path}: corrupt data at byte {position}: {reason}")


class CorruptBatchError(LogCorruptionError):
    """A batch of this node's log failed its checks (CRC, length, magic, offsets, epoch) when it was read or
    scrubbed: the node never serves it, nor anything after it in its segment (`eventlog.damage`).

    Retriable: another member holds a good copy, and this one drops the damaged part of its log and
    fetches it again from the leader (eventlog/raft/runtime/repair.py)."""

    code = "corrupt_batch"
    retriable = True

    def __init__(self, path: str, position: int, offset: int, reason: str) -> None:
        self.offset = offset
        super().__init__(path, position, f"damaged batch at offset {offset}: {reason}")


class LogClosedError(LogError):
    """The log was closed."""

    code = "log_closed"


class LogFailedError(LogError):
    """A write or fsync failed; the log refuses all further writes until it is reopened.

    A failed fsync is never retried as if it had succeeded: after one, the kernel may have dropped
    the dirty pages, so nothing written since the last good sync can be trusted to be on disk.
    """

    code = "log_failed"


class DiskFullError(LogError):
    """The disk is full: the write was refused before touching the log, which stays consistent.

    Retriable once space is freed: the node retries by itself and resumes. (Appends into a
    preallocated segment cannot hit a full disk; this surfaces when the next segment cannot be
    prepared, or the data directory has less free space than `[compaction] min_free_disk_bytes`.)
    """

    code = "disk_full"
    retriable = True
