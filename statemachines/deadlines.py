"""Things that expire by committed time (client sessions, Kafka producers, request ids): one index.

`Deadlines` keeps, in a column family, one row per live item keyed by its deadline (8-byte ms) and
its key, so the items due first are found by one bounded scan, and the number of live items in a meta
key (a bound like "at most N sessions" evicts the one closest to its deadline). `due` is what an
applier calls once per entry: it looks at most once per `check_ms` of committed time and returns at
most `per_entry` items, and looks again at the next entry while some are left, so a burst of
expiries drains over several entries instead of stalling one apply. Everything is a function of
committed data, so every replica expires the same items at the same offset.

Pure functions over the applier's pending writes (statemachines/apply.py `Overlay`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from statemachines.store_keys import META, decode_offset, encode_offset

if TYPE_CHECKING:
    from statemachines.apply import Overlay


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The deadline index of one kind of item: `cf` rows, `live` and `checked` meta keys."""

    cf: str
    live: bytes | None        # meta key of the live count (None: not counted)
    checked: bytes            # meta key: the committed time `due` last found nothing more due
    per_entry: int
    check_ms: int = 1_000

    def add(self, ov: Overlay, deadline_ms: int, key: bytes) -> None:
        ov.put(self.cf, encode_offset(deadline_ms) + key, b"")
        if self.live is not None:
            ov.put(META, self.live, encode_offset(self.count(ov) + 1))

    def remove(self, ov: Overlay, deadline_ms: int, key: bytes) -> None:
        ov.delete(self.cf, encode_offset(deadline_ms) + key)
        if self.live is not None:
            ov.put(META, self.live, encode_offset(max(0, self.count(ov) - 1)))

    def move(self, ov: Overlay, old_ms: int, new_ms: int, key: bytes) -> None:
        ov.delete(self.cf, encode_offset(old_ms) + key)
        ov.put(self.cf, encode_offset(new_ms) + key, b"")

    def count(self, ov: Overlay) -> int:
        raw = ov.get(META, self.live) if self.live is not None else None
        return decode_offset(raw) if raw is not None else 0

    def first(self, ov: Overlay) -> tuple[int, bytes] | None:
        """(deadline, key) of the item closest to its deadline, or None."""
        rows = ov.scan(self.cf, b"", None, 1)
        return (decode_offset(rows[0][0][:8]), rows[0][0][8:]) if rows else None

    def due(self, ov: Overlay, now_ms: int) -> list[tuple[int, bytes]]:
        """(deadline, key) of items whose deadline passed, at most `per_entry` (see the module docstring).
        The caller removes them (`remove`), with whatever else they own."""
        raw = ov.get(META, self.checked)
        if raw is not None and now_ms - decode_offset(raw) < self.check_ms:
            return []
        if self.live is not None and self.count(ov) == 0:
            return []
        rows = ov.scan(self.cf, b"", encode_offset(now_ms + 1), self.per_entry)
        if len(rows) < self.per_entry:
            ov.put(META, self.checked, encode_offset(now_ms))
        return [(decode_offset(k[:8]), k[8:]) for k, _ in rows]
