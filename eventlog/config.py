"""Configuration of one segmented log (`[log]` in the node's TOML file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eventlog.configuration import doc, from_mapping, load_toml

FlushPolicy = Literal["fsync", "group", "interval"]

KIB = 1024
MIB = 1024 * KIB

# Positions in the sparse offset index are unsigned 32-bit integers.
MAX_SEGMENT_BYTES = 2**31 - 1


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How a segmented log lays out, indexes, flushes and scrubs its data.

    Flush policies, and exactly what each guarantees:

    - ``fsync``: `append` returns only after the batch is on disk (fdatasync). Survives power loss.
      One sync per append: the slowest policy.
    - ``group``: group commit. `append` returns once the bytes are in the mapped file (they survive
      a process crash, not a power loss); a flusher thread runs fdatasync continuously, and one sync
      covers every append that arrived while the previous sync ran. A caller that needs durability
      waits for it (`Log.wait_durable`, or a durability listener) before acknowledging.
    - ``interval``: RocketMQ-style asynchronous flush every `flush_interval_ms`. `append` never waits;
      a power loss may lose up to the last interval of appends (a process crash loses nothing that
      `append` returned for, because the data is in the kernel's page cache).
    """

    segment_bytes: int = field(
        default=64 * MIB,
        metadata=doc("Size each segment file is preallocated to; a segment rolls when full.",
                     min=4 * KIB, max=MAX_SEGMENT_BYTES),
    )
    index_interval_bytes: int = field(
        default=4 * KIB,
        metadata=doc("Bytes of batches between two entries of the sparse .index and .timeindex.",
                     min=1, max=MAX_SEGMENT_BYTES),
    )
    max_batch_bytes: int = field(
        default=1 * MIB,
        metadata=doc("Largest record batch accepted by append (capped at segment_bytes).",
                     min=64, max=MAX_SEGMENT_BYTES),
    )
    flush_policy: FlushPolicy = field(
        default="group",
        metadata=doc("When appended data is forced to disk: 'fsync', 'group' or 'interval'."),
    )
    flush_interval_ms: int = field(
        default=500,
        metadata=doc("Period of the background flush under the 'interval' policy.", min=1, max=3_600_000),
    )
    preallocate_next_segment: bool = field(
        default=True,
        metadata=doc("Prepare (allocate, zero, sync, map) the next segment in the background so a roll "
                     "never waits for it."),
    )
    scrub_bytes_per_second: int = field(
        default=4 * MIB,
        metadata=doc("Rate at which a node's background scrub reads and checks the sealed segments of all its "
                     "logs (eventlog/scrub.py): a pass over N bytes takes about N / rate seconds, the longest a "
                     "damaged batch goes unnoticed when nothing reads it. 0: no scrub (reads still check every "
                     "batch).", min=0, max=1 << 40),
    )

    @property
    def batch_limit_bytes(self) -> int:
        """The largest batch append accepts: `max_batch_bytes`, but never more than a segment holds."""
        return min(self.max_batch_bytes, self.segment_bytes)

    @classmethod
    def from_toml(cls, path: str | Path, section: str = "log") -> LogConfig:
        """Load the `[log]` table of a TOML file (missing keys take their defaults)."""
        return from_mapping(cls, load_toml(path).get(section), section)
