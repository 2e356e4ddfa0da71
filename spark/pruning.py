"""Which files of a table version an audit question must read, from the per-file statistics in the Delta
log (min and max of key, event_type, group, offset and timestamp; pure: no IO).

Every file is kept unless its statistics prove it holds no row the question needs; a file without
statistics is always kept. The audit's SQL still filters every row, so pruning only changes how much
is read, never an answer. How much it saves depends on the layout: export files hold a range of
offsets of one group (offset pruning works, key pruning does not: every file spans the key space);
after `epochlog table optimize` clusters each day's files by key, a file holds a slice of the keys
(key pruning works within each day partition).

String statistics compare as UTF-8 bytes do, i.e. by code point, as Python compares `str`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

_MAX_CHAR = "\U0010ffff"


@dataclass(frozen=True, slots=True)
class FileStats:
    uri: str
    rows: int | None = None
    min_key: str | None = None
    max_key: str | None = None
    min_type: str | None = None
    max_type: str | None = None
    min_group: str | None = None
    max_group: str | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    min_time: datetime | None = None
    max_time: datetime | None = None

    def may_hold_key(self, key: str) -> bool:
        return self.min_key is None or self.max_key is None or self.min_key <= key <= self.max_key

    def may_hold_prefix(self, prefix: str) -> bool:
        """Keys starting with `prefix` lie in [prefix, prefix + U+10FFFF]."""
        if not prefix or self.min_key is None or self.max_key is None:
            return True
        return self.max_key >= prefix and self.min_key <= prefix + _MAX_CHAR

    def may_hold_type(self, *types: str) -> bool:
        if self.min_type is None or self.max_type is None:
            return True
        return any(self.min_type <= t <= self.max_type for t in types)

    def may_hold_offsets(self, group: str, lo: int, hi: int) -> bool:
        """Rows of `group` with an offset in [lo, hi]."""
        if self.min_group is None or self.max_group is None:
            return True
        if not self.min_group <= group <= self.max_group:
            return False
        if self.min_group != self.max_group or self.min_offset is None or self.max_offset is None:
            return True   # offsets of several groups: the bounds mix them
        return self.min_offset <= hi and self.max_offset >= lo

    def may_hold_time_until(self, until: datetime) -> bool:
        return self.min_time is None or self.min_time <= until


def file_stats(actions: Any, uri_of: Any) -> list[FileStats]:
    """FileStats of every file of deltalake's `get_add_actions(flatten=True)` (an Arrow table);
    `uri_of(path)` turns a logged path into the file's URI."""
    rows = actions.to_pylist() if actions.num_rows else []

    def get(row: dict[str, Any], name: str) -> Any:
        return row.get(name)

    return [FileStats(uri_of(r["path"]), get(r, "num_records"), get(r, "min.key"), get(r, "max.key"),
                      get(r, "min.event_type"), get(r, "max.event_type"), get(r, "min.group"), get(r, "max.group"),
                      get(r, "min.offset"), get(r, "max.offset"), get(r, "min.timestamp"), get(r, "max.timestamp"))
            for r in rows]
