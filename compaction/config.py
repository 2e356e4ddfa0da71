"""Configuration of compaction: `[compaction]` (retention) and `[compaction.cleaner]` (key
compaction) in the node's TOML file.

What every group keeps is bounded below by its horizon (compaction/policy.py): the policy keeps at
least `retain_*` of recent history, every export table pins what it has not archived yet (but never
more than `export_max_pin_*` behind), and the log keeps what its latest snapshot does not cover.
When to take snapshots is the Raft runtime's `[cluster] snapshot_every_entries / snapshot_every_bytes`.

Each `retain_*` and `export_max_pin_*` knob is off at 0; the horizon honours every knob that is on
(retention keeps the most any of them asks for; a pin is capped by the first cap it exceeds).

`CleanerConfig` is the log cleaner's part (compaction/cleaner.py). Both are loaded from the
`[compaction]` table by `compaction_configs(table)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from eventlog.configuration import doc, from_mapping
from eventlog.errors import ConfigError

SECTION = "compaction.cleaner"

DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """How much history each group keeps, how exports pin it, and how pruning is paced."""

    retain_offsets: int = field(default=100_000, metadata=doc(
        "Keep at least this many offsets below the applied offset: in the log (watch, read_events, follower "
        "catch-up without a snapshot) and in the views' history (as_of, history). 0: no offset floor.", min=0))
    retain_bytes: int = field(default=0, metadata=doc(
        "Keep at least this many bytes of the newest log segments (whole segments). 0: no byte floor.", min=0))
    retain_ms: int = field(default=0, metadata=doc(
        "Keep at least this much history by record timestamp. 0: no time floor.", min=0))
    export_max_pin_offsets: int = field(default=10_000_000, metadata=doc(
        "An export table pins at most this many offsets behind the applied offset; past it the pin is capped "
        "(a warning is logged and `epochlog compaction status` names the table). 0: no offset cap.", min=0))
    export_max_pin_bytes: int = field(default=1 << 30, metadata=doc(
        "An export table pins at most this many bytes of the newest log segments. 0: no byte cap.", min=0))
    export_max_pin_ms: int = field(default=7 * DAY_MS, metadata=doc(
        "An export table pins at most this much history by record timestamp. 0: no time cap.", min=0))
    check_interval_ms: int = field(default=1_000, metadata=doc(
        "How often each group's horizon is computed, its history floor proposed (leader) and its log "
        "truncated.", min=10, max=3_600_000))
    prune_interval_ms: int = field(default=100, metadata=doc(
        "How often each group looks for views history below the floor to delete; while a pass is under way its "
        "chunks follow each other 1 ms apart. 0: never delete (the floor still hides it from reads).",
        min=0, max=3_600_000))
    prune_chunk_rows: int = field(default=2_000, metadata=doc(
        "History rows a pruning chunk examines at most (a chunk also stops after about 0.5 ms: it never holds "
        "the event loop longer).", min=10, max=1_000_000))
    compact_groups: tuple[str, ...] = field(default=("metadata", "kv"), metadata=doc(
        "Groups whose log is key-compacted instead of truncated (Kafka's cleanup.policy=compact): below "
        "the horizon each entity keeps its latest record, so a reader of the whole log (a Kafka consumer "
        "from offset 0, a Faust table's recovery) rebuilds every entity's state. Snapshots are still "
        "taken. The other groups' logs are truncated below the horizon (cleanup.policy=delete). Every "
        "name must be a group of [cluster] groups."))
    min_free_disk_bytes: int = field(default=256 << 20, metadata=doc(
        "Below this much free space on the data directory's file system the node refuses writes with the "
        "retriable `disk_full` (and resumes once space is freed). 0: only a failed segment allocation "
        "does.", min=0))

    def validate(self, section: str = "compaction") -> None:
        """Every field is checked on its own (limits above); no rule spans fields: a capped export pin
        never lowers the horizon below the retention policy, which the horizon honours separately.
        Whether `compact_groups` names existing groups is checked by the node (`check_groups`)."""
        if len(set(self.compact_groups)) != len(self.compact_groups):
            raise ConfigError(f"{section}.compact_groups", list(self.compact_groups), "lists a group twice")

    def check_groups(self, groups: tuple[str, ...] | list[str], section: str = "compaction") -> None:
        """ConfigError when `compact_groups` names a group the cluster does not host."""
        unknown = [g for g in self.compact_groups if g not in groups]
        if unknown:
            raise ConfigError(f"{section}.compact_groups", list(self.compact_groups),
                              f"names {', '.join(unknown)}, not a group of [cluster] groups ({', '.join(groups)})")

    def cleanup_policy(self, group: str) -> str:
        """`compact` (key compaction) or `delete` (truncation below the horizon)."""
        return "compact" if group in self.compact_groups else "delete"


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


def compaction_configs(table: Mapping[str, Any] | None) -> tuple[CompactionConfig, CleanerConfig]:
    """`[compaction]` (retention) and its `[compaction.cleaner]` table from the node's TOML document."""
    rest = dict(table or {})
    cleaner = rest.pop("cleaner", None)
    return from_mapping(CompactionConfig, rest, "compaction"), cleaner_config(cleaner)
