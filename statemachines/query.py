"""Reads of a group's views: get, list by prefix, range, point-in-time (`as_of`) and history.

Point in time is an MVCC keyspace (etcd-style): every change writes a row `entity key + offset`
to the `versions` column family (at views format level 2, for most kinds, once the state it holds is
superseded: the latest state is then in the entity row alone, statemachines/views_format.py; every read
here takes an entity's history as its `versions` rows plus its entity row, so it answers alike at either
level), so `get(key, as_of=N)` is one seek to the last row at or before N
and `history(key)` a prefix scan; `list(prefix, as_of=N)` scans the versions under the prefix and
keeps, per entity, the last row at or before N (its cost grows with the number of versions under
the prefix, not with the whole store). The chosen cost: one extra row per event, written in the
same WriteBatch (measured in bench/views_bench.py).

Consistency (linearizable, lease, local with min_offset) is established by the caller before
reading (`RaftGroup.read_barrier`); these functions read the views as they are. Pagination: a page
holds at most `limit` items and `next` is the continuation token (the last key returned) when more
may follow.

History floor. Once a committed `HistoryPruned` event set the floor F (meta `history_floor`), the
history starts at F: `as_of` below F is refused as `compacted` (the Delta archive answers it:
`epochlog audit state --offset N`), and `history(key)` starts with the entity's state at F (its
newest row at or below F, unless that row deleted it) followed by every row above F. Rows below
that are deleted a chunk at a time by statemachines/prune.py, on each replica at its own pace; the
reads here never look at them, so every replica answers alike whatever it has deleted so far.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from eventlog.raft.errors import CompactedError
from statemachines import views_format
from statemachines.events import ENTITY_KINDS, EventError
from statemachines.state import decode_state, decode_version
from statemachines.store import ViewStore, cf_for, decode_offset, prefix_upper_bound, version_key

MAX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class Item:
    key: str
    state: msgspec.Struct
    version: int          # offset of the event that last changed it


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Item]
    next: str | None       # pass as `after` to get the next page; None when done


@dataclass(frozen=True, slots=True)
class HistoryRow:
    offset: int
    event: str             # event type
    state: msgspec.Struct | None  # the entity after the event (None: deleted)


def _kind_of(key: str) -> str:
    kind = key.split("/", 1)[0]
    if kind not in ENTITY_KINDS or "/" not in key:
        raise EventError(f"{key!r} is not an entity key: keys start with one of "
                         f"{', '.join(k + '/' for k in ENTITY_KINDS)}")
    return kind


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise EventError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


class HistoryCompactedError(CompactedError):
    """An `as_of` read below the history floor: that history is only in the export archive."""

    def __init__(self, as_of: int, floor: int, group: str = "") -> None:
        self.as_of = as_of
        self.floor = floor
        where = f" of group {group}" if group else ""
        group_arg = f" --group {group}" if group else ""
        super().__init__(f"compacted: as_of {as_of} is below the history floor {floor}{where} (the views keep "
                         f"history from offset {floor} on); older states are in the Delta archive: "
                         f"epochlog audit state --table PATH --offset {as_of}{group_arg}")


class Query:
    """Reads over one group's ViewStore (call from the group's loop). `group` names it in errors."""

    def __init__(self, store: ViewStore, group: str = "") -> None:
        self.store = store
        self.group = group

    def get(self, key: str, *, as_of: int | None = None) -> Item | None:
        _kind_of(key)
        raw_key = key.encode()
        if as_of is None:
            raw = self.store.get(cf_for(raw_key), raw_key)
            if raw is None:
                return None
            state = decode_state(raw_key, raw)
            return Item(key, state, state.version)  # type: ignore[attr-defined]
        if as_of < 0:
            self._check_as_of(as_of)
            return None  # before the first offset; and -1 would pack as the largest offset
        self._check_as_of(as_of)
        current = self._current_state(raw_key)
        if current is not None and current.version <= as_of:  # type: ignore[attr-defined]
            return Item(key, current, current.version)  # type: ignore[attr-defined]
        row = self.store.last_at_or_before("versions", version_key(raw_key, as_of), raw_key + b"\x00")
        if row is None:
            return None
        version = decode_version(row[1])
        if version.state is None:
            return None
        return Item(key, decode_state(raw_key, version.state), decode_offset(row[0][-8:]))

    def list(self, prefix: str, *, limit: int = 100, after: str | None = None, as_of: int | None = None) -> Page:
        """Entities whose key starts with `prefix` (which names an entity kind, e.g. 'kv/app/')."""
        _kind_of(prefix)
        return self._page(prefix.encode(), prefix_upper_bound(prefix.encode()), _limit(limit), after, as_of)

    def range(self, start: str, end: str, *, limit: int = 100, after: str | None = None,
              as_of: int | None = None) -> Page:
        """Entities with keys in [start, end) (both of the same kind)."""
        if _kind_of(start) != _kind_of(end):
            raise EventError("a range stays within one kind of entity")
        return self._page(start.encode(), end.encode(), _limit(limit), after, as_of)

    def history(self, key: str, *, limit: int = 1000, after_offset: int = -1) -> list[HistoryRow]:
        """Every event that changed `key`, oldest first (from `after_offset` on), as far back as the
        history floor goes (`_history_start`): its `versions` rows, then its current state when no row
        holds it (views format level 2: statemachines/views_format.py)."""
        kind = _kind_of(key)
        raw_key = key.encode()
        current = self._current_state(raw_key)
        first = max(after_offset + 1, self._history_start(raw_key, current))
        rows = []
        last = -1
        for k, v in self.store.scan("versions", version_key(raw_key, first), raw_key + b"\x01"):
            version = decode_version(v)
            state = None if version.state is None else decode_state(raw_key, version.state)
            last = decode_offset(k[-8:])
            rows.append(HistoryRow(last, version.event, state))
            if len(rows) >= _limit(limit):
                return rows
        if current is not None:
            offset = current.version  # type: ignore[attr-defined]
            event = views_format.LATEST_IN_ENTITY.get(kind.encode())
            if offset > last and offset >= first and event is not None:
                rows.append(HistoryRow(offset, event, current))
        return rows

    @property
    def history_floor(self) -> int:
        """History before this offset was pruned (0: none was)."""
        return self.store.history_floor

    # --- helpers -------------------------------------------------------------------------------

    def _current_state(self, raw_key: bytes) -> msgspec.Struct | None:
        raw = self.store.get(cf_for(raw_key), raw_key)
        return None if raw is None else decode_state(raw_key, raw)

    def _history_start(self, raw_key: bytes, current: msgspec.Struct | None) -> int:
        """The first offset of `raw_key`'s history that history shows: its newest state at or below the
        floor (the current one, or a `versions` row) when it holds a state, else the floor + 1."""
        floor = self.store.history_floor
        if floor <= 0:
            return 0
        if current is not None and current.version <= floor:  # type: ignore[attr-defined]
            return current.version  # type: ignore[attr-defined, no-any-return]
        base = self.store.last_at_or_before("versions", version_key(raw_key, floor), raw_key + b"\x00")
        if base is not None and decode_version(base[1]).state is not None:
            return decode_offset(base[0][-8:])
        return floor + 1

    def _check_as_of(self, as_of: int) -> None:
        applied = self.store.applied
        if as_of < -1 or as_of > applied:
            raise EventError(f"as_of {as_of} is beyond the applied offset {applied}")
        if as_of >= 0:
            floor = self.store.history_floor
            if as_of < floor:
                raise HistoryCompactedError(as_of, floor, self.group)

    def _page(self, start: bytes, end: bytes | None, limit: int, after: str | None, as_of: int | None) -> Page:
        # The first key past `after`: entity key + b"\0" in an entity's column family; in `versions`
        # (keys are entity key + b"\0" + offset) the rows of `after` itself sort from after + b"\0",
        # so the next entity starts at after + b"\1" (entity keys hold no NUL).
        past = b"\x00" if as_of is None else b"\x01"
        begin = start if after is None else max(start, after.encode() + past)
        items = []
        source = (self._current(begin, end) if as_of is None else self._as_of(begin, end, as_of))
        for item in source:
            if len(items) == limit:
                return Page(items, items[-1].key)
            items.append(item)
        return Page(items, None)

    def _current(self, start: bytes, end: bytes | None) -> Iterator[Item]:
        cf = cf_for(start)
        for k, v in self.store.scan(cf, start, end):
            state = decode_state(k, v)
            yield Item(k.decode(), state, state.version)  # type: ignore[attr-defined]

    def _as_of(self, start: bytes, end: bytes | None, as_of: int) -> Iterator[Item]:
        """Per entity in [start, end): its newest state at or before `as_of`, from its `versions` rows
        and, at views format level 2, its entity row (which alone holds a latest state there)."""
        self._check_as_of(as_of)
        rows = self._newest_rows(start, end, as_of)
        if views_format.decode_level(self.store.meta(views_format.META_KEY)) < 2:
            for entity, offset, state in rows:
                if state is not None:
                    yield Item(entity.decode(), decode_state(entity, state), offset)
            return
        # Merge with the entity rows: an entity row at or before `as_of` is the entity's newest state then.
        currents = self.store.scan(cf_for(start), start, end)
        current = next(currents, None)
        for entity, offset, state in rows:
            while current is not None and current[0] < entity:
                item = _current_item(current, as_of)
                if item is not None:
                    yield item
                current = next(currents, None)
            if current is not None and current[0] == entity:
                item = _current_item(current, as_of)
                current = next(currents, None)
                if item is not None:
                    yield item
                    continue
            if state is not None:
                yield Item(entity.decode(), decode_state(entity, state), offset)
        while current is not None:
            item = _current_item(current, as_of)
            if item is not None:
                yield item
            current = next(currents, None)

    def _newest_rows(self, start: bytes, end: bytes | None, as_of: int
                     ) -> Iterator[tuple[bytes, int, bytes | None]]:
        """(entity, offset, state or None) of the newest `versions` row at or before `as_of` of each
        entity with rows in [start, end) (None as the state: deleted then, or no row that old)."""
        current: bytes | None = None
        best: tuple[int, bytes | None] = (-1, None)
        for k, v in self.store.scan("versions", start, end):
            entity, offset = k[:-9], decode_offset(k[-8:])
            if entity != current:
                if current is not None:
                    yield current, *best
                current, best = entity, (-1, None)
            if offset <= as_of:
                best = (offset, decode_version(v).state)
        if current is not None:
            yield current, *best


def _current_item(row: tuple[bytes, bytes], as_of: int) -> Item | None:
    """An entity row as the answer of an `as_of` read, when its state is at or before `as_of`."""
    state = decode_state(row[0], row[1])
    version: int = state.version  # type: ignore[attr-defined]
    return Item(row[0].decode(), state, version) if version <= as_of else None
