"""Records that changed nothing: which offsets they are, durably, for key compaction and `applied` flags.

A committed record can leave the views unchanged: a rejected event (a failed compare-and-set, a stale
epoch, a missing entity, an invalid event), a retry of a request id answered with the first outcome,
or a record the operator skipped. The applier (statemachines/apply.py) writes one `noops` row per
such record, keyed by its offset, in the same WriteBatch as the rest of the apply: every replica
writes the same rows at the same offsets (the outcome is deterministic), and they are part of the
digest, so replicas that disagree about what took effect are told apart.

Why durably and not from the `versions` history: history rows are pruned below the history floor,
which is exactly the range key compaction rewrites. The log cleaner needs to know, for every record
below its horizon, whether it took effect: a no-op that stayed as the latest record of its key in a
compacted log would show a reader rebuilding state from the log (a Kafka consumer, Faust) a value that
never took effect, with the record that did gone. The node hands the cleaner the no-op offsets of the
range it cleans (compaction/service.py), and forgets the rows once the log no longer holds those
records (below the cleaner's dirty offset, or the log start): per node, outside the digest, like
history pruning.

`noops_from` (meta) is where the rows start: views created by an Epochlog that did not write them
(before this module existed) know no-ops only from the offset they were first opened at by one that
does; below it, `changed_views` falls back to the `versions` history.

Call from the group's loop (the store's one user).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from statemachines.store import (
    HISTORY_FLOOR,
    NOOPS_FROM,
    ViewStore,
    decode_offset,
    encode_offset,
    version_key,
)

CF = "noops"


def ensure_noops_from(store: ViewStore) -> int:
    """`noops_from` of the store, set to the offset after its applied one when missing (views opened
    for the first time by a version that writes `noops` rows); 0 for new views."""
    raw = store.meta(NOOPS_FROM)
    if raw is not None:
        return decode_offset(raw)
    start = store.applied + 1
    wb = store.new_batch()
    store.put_meta(wb, NOOPS_FROM, encode_offset(start))
    store.write(wb)
    return start


def noops_from_meta(raw: bytes | None) -> int:
    """`noops_from` from its meta value; views that never had one know no no-op by its row (every
    offset falls back to the history)."""
    return 1 << 62 if raw is None else decode_offset(raw)


def noop_offsets(store: ViewStore, lo: int, hi: int, limit: int | None = None) -> list[int]:
    """Offsets in [lo, hi) of records that changed nothing (at most `limit`, the lowest first)."""
    out = []
    for key, _ in store.scan(CF, encode_offset(max(lo, 0)), encode_offset(max(hi, 0))):
        out.append(decode_offset(key))
        if limit is not None and len(out) >= limit:
            break
    return out


def forget_below(store: ViewStore, offset: int, max_rows: int, start: int = 0) -> tuple[int, int]:
    """Delete at most `max_rows` rows in [start, offset) (records the log no longer holds as written);
    (rows deleted, the offset below which none is left). Per node and outside the digest: no read asks
    about those offsets any more. `start`: where the caller's previous call left off (deleted rows
    stay as tombstones until RocksDB compacts, and a scan from 0 would step over all of them)."""
    doomed = [k for k, _ in itertools.islice(store.scan(CF, encode_offset(max(start, 0)),
                                                        encode_offset(max(offset, 0))), max_rows)]
    done_to = offset if len(doomed) < max_rows else decode_offset(doomed[-1]) + 1
    if doomed:
        wb = store.new_batch()
        for key in doomed:
            store.delete(wb, CF, key)
        store.write(wb)
    return len(doomed), done_to


def changed_views(get: Callable[[str, bytes], bytes | None], record_key: bytes | memoryview | None, offset: int,
                  start: int) -> bool | None:
    """Whether applying the (applied) record at `offset` changed the views: from the `noops` rows at
    and above `start` (`noops_from`); below it from the history, where every applied event wrote a row
    for its entity key (a Txn: for its first op's key, its record key after `txn/`) at its own offset,
    and None (unknown) below the history floor, where that row may be pruned. `get(cf, key)` reads
    the views (cf "" is the meta family)."""
    if offset >= start:
        return get(CF, encode_offset(offset)) is None
    raw_floor = get("", HISTORY_FLOOR)
    if raw_floor is not None and offset < decode_offset(raw_floor):
        return None
    if not record_key:
        return False
    entity = bytes(record_key)
    entity = entity[4:] if entity.startswith(b"txn/") else entity
    return get("versions", version_key(entity, offset)) is not None


ChangedViews = Callable[[bytes | memoryview | None, int], bool | None]
"""(record key, offset) -> whether applying the record changed the views (None: unknown)."""


def changed_views_in(store: ViewStore, lo: int, hi: int, start: int) -> ChangedViews:
    """`changed_views` for the applied records of offsets [lo, hi) (ask about no other), from one scan
    of their `noops` rows (readers of a log chunk: watch, read_events) instead of one lookup per record.
    Use it before the rows can change: on the loop, with no await between reading the chunk and this
    call (rows of records still in the log are never forgotten)."""
    noops = frozenset(noop_offsets(store, max(lo, start), hi))
    if lo >= start:   # every record of the range has its row or changed something: watch's hot loop

        def changed(record_key: bytes | memoryview | None, offset: int) -> bool | None:
            return offset not in noops
        return changed

    def changed_or_from_history(record_key: bytes | memoryview | None, offset: int) -> bool | None:
        if offset >= start:
            return offset not in noops
        return changed_views(store.get, record_key, offset, start)
    return changed_or_from_history


def unchanged_in(store: ViewStore, lo: int, hi: int, start: int,
                 records: Callable[[], Iterable[tuple[bytes | memoryview | None, int]]]) -> tuple[list[int], list[int]]:
    """(offsets whose records changed nothing, offsets not known) among the applied records of [lo, hi):
    what a reader of raw batches (read_log) needs to set `applied` itself. From one scan of the `noops`
    rows at and above `start`; below it (views older than the rows) from the history, record by record,
    which is why `records()` ((record key, offset) of each data record of the range) is only called
    then. Same contract as `changed_views_in`."""
    noops = noop_offsets(store, max(lo, start), hi)
    unknown: list[int] = []
    if lo < start:
        below = []
        for key, offset in records():
            if lo <= offset < min(hi, start):
                changed = changed_views(store.get, key, offset, start)
                if changed is None:
                    unknown.append(offset)
                elif not changed:
                    below.append(offset)
        noops = below + noops
    return noops, unknown

