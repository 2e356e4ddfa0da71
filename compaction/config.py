"""Retention settings of a node (`[compaction]` in the node's TOML file).

What every group keeps is bounded below by its horizon (compaction/policy.py): the policy keeps at
least `retain_*` of recent history, every export table pins what it has not archived yet (but never
more than `export_max_pin_*` behind), and the log keeps what its latest snapshot does not cover.
When to take snapshots is the Raft runtime's `[cluster] snapshot_every_entries / snapshot_every_bytes`.

Each `retain_*` and `export_max_pin_*` knob is off at 0; the horizon honours every knob that is on
(retention keeps the most any of them asks for; a pin is capped by the first cap it exceeds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eventlog.configuration import doc

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
    min_free_disk_bytes: int = field(default=256 << 20, metadata=doc(
        "Below this much free space on the data directory's file system the node refuses writes with the "
        "retriable `disk_full` (and resumes once space is freed). 0: only a failed segment allocation "
        "does.", min=0))

    def validate(self, section: str = "compaction") -> None:
        """Every field is checked on its own (limits above); no rule spans fields: a capped export pin
        never lowers the horizon below the retention policy, which the horizon honours separately."""
