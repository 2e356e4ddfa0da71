"""Configuration of key compaction (`[compaction.cleaner]` in the node's TOML file).

`CleanerConfig` is the log cleaner's part of `[compaction]`; the retention policy (the horizon per
group) has its own table next to it. Loaded with `cleaner_config(table)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from eventlog.configuration import doc, from_mapping
from eventlog.errors import ConfigError

SECTION = "compaction.cleaner"


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """How the log cleaner rewrites sealed segments below a group's horizon (Kafka's log cleaner).

    Memory: the offset map holds one entry per distinct key of the section being mapped, about
    150 bytes each in this Python implementation, in the worker process (bench/RESULTS.md, section
    "cleaner"); a pass that meets more keys than `offset_map_max_keys` maps what fits and leaves the
    rest to the next pass.
    """

    enabled: bool = field(default=True, metadata=doc(
        "Run key compaction of sealed segments below each group's horizon in a background thread."))
    min_cleanable_dirty_ratio: float = field(default=0.5, metadata=doc(
        "Clean only when the segments not yet cleaned are at least this fraction of the bytes below the "
        "horizon (each pass rewrites everything below it).", min=0.0, max=1.0))
    delete_retention_ms: int = field(default=86_400_000, metadata=doc(
        "A tombstone (a delete) is kept this long after the newest data already cleaned before it "
        "(log time: record timestamps), so readers of the cleaned range still see the delete.",
        min=0, max=2**62))
    offset_map_max_keys: int = field(default=1_000_000, metadata=doc(
        "Most distinct keys one pass maps (Kafka's dedupe buffer): bounds the cleaner's memory.",
        min=1, max=2**40))
    max_io_bytes_per_second: int = field(default=0, metadata=doc(
        "Throttle on the bytes a pass reads and writes per second; 0: unthrottled.", min=0, max=2**62))
    worker_process: bool = field(default=True, metadata=doc(
        "Run each pass's CPU work (mapping, filtering, writing) in a worker process, so the node's "
        "interpreter lock is never held by the cleaner; false: in the cleaner thread."))
    worker_nice: int = field(default=10, metadata=doc(
        "CPU priority the worker process lowers itself by (Unix nice increment).", min=0, max=19))

    def validate(self, section: str = SECTION) -> None:
        """Check every field's range (a config built in code skips `from_mapping`'s checks)."""
        for f in fields(self):
            value = getattr(self, f.name)
            low, high = f.metadata.get("min"), f.metadata.get("max")
            if (low is not None and value < low) or (high is not None and value > high):
                raise ConfigError(f"{section}.{f.name}", value, f"must be in [{low}, {high}]")


def cleaner_config(table: Mapping[str, Any] | None, section: str = SECTION) -> CleanerConfig:
    """The cleaner's config from its TOML table (`[compaction.cleaner]`; missing keys take defaults)."""
    return from_mapping(CleanerConfig, table, section)
