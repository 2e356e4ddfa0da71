"""The `noops` rows (statemachines/noops.py): one per record that changed nothing, alike on replicas
whatever the apply calls, forgotten in bounded chunks, and the `applied` flag they give, including
views written before the rows existed (`noops_from`)."""

from __future__ import annotations

from pathlib import Path

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines import noops
from statemachines.store import NOOPS_FROM
from statemachines.views import ViewsStateMachine


def entry(index: int, events: list[ev.Event | tuple[bytes, bytes]]) -> Entry:
    records = [e if isinstance(e, tuple) else ev.event_record(e) for e in events]
    data = bytearray(encode_batch(records, timestamp_ms=1))
    stamp(data, index, 1)
    return Entry(index, 1, len(records), EntryKind.NORMAL, bytes(data))


EVENTS: list[ev.Event | tuple[bytes, bytes]] = [
    ev.KvPut(name="a", value=b"1", request_id="r1"),           # 0 applied
    ev.KvPut(name="a", value=b"2", expected_version=99),       # 1 version_mismatch
    ev.KvPut(name="a", value=b"3", request_id="r1"),           # 2 a retry: duplicate
    ev.KvDeleted(name="missing"),                             # 3 not_found
    (b"kv/a", b"\x93garbage"),                                # 4 malformed
    ev.Txn(ops=(ev.KvPut(name="b", value=b"1"),)),              # 5 applied
    ev.Txn(conditions=(ev.Condition("kv/b", 0),), ops=(ev.KvPut(name="b", value=b"2"),)),   # 6 condition_failed
    ev.HistoryPruned(floor=0),                                # 7 applied (changes meta only)
]
NOOPS = {1: b"version_mismatch", 2: b"duplicate", 3: b"not_found", 4: b"invalid_argument", 6: b"condition_failed"}


def test_rows_are_the_records_that_changed_nothing_and_replicas_agree(tmp_path: Path) -> None:
    one = ViewsStateMachine(tmp_path / "one")
    apart = ViewsStateMachine(tmp_path / "apart")
    try:
        one.apply([entry(0, EVENTS)])
        for offset, e in enumerate(EVENTS):         # the same records, one entry each, applied separately
            apart.apply([entry(offset, [e])])
        rows = dict(one.store.scan(noops.CF, b""))
        assert {int.from_bytes(k, "big"): v for k, v in rows.items()} == NOOPS
        assert noops.noop_offsets(one.store, 0, 100) == noops.noop_offsets(apart.store, 0, 100) == sorted(NOOPS)
        assert noops.noop_offsets(one.store, 2, 4) == [2, 3] and noops.noop_offsets(one.store, 0, 100, 2) == [1, 2]
        keys = [e[0] if isinstance(e, tuple) else e.key().encode() for e in EVENTS]
        changed = [noops.changed_views(one.store.get, key, o, 0) for o, key in enumerate(keys)]
        assert changed == [o not in NOOPS for o in range(len(EVENTS))]
        for lo, hi in ((0, len(EVENTS)), (2, 4), (5, 6)):     # one scan per range (watch, read_events) agrees
            in_range = noops.changed_views_in(one.store, lo, hi, 0)
            assert [in_range(keys[o], o) for o in range(lo, hi)] == changed[lo:hi], (lo, hi)
    finally:
        one.close()
        apart.close()


def test_rows_are_forgotten_in_chunks_from_a_cursor(tmp_path: Path) -> None:
    sm = ViewsStateMachine(tmp_path / "v")
    try:
        sm.apply([entry(i, [ev.KvDeleted(name=f"missing-{i}")]) for i in range(50)])   # 50 no-ops
        deleted, floor = noops.forget_below(sm.store, 30, 8)
        assert (deleted, floor) == (8, 8)
        deleted, floor = noops.forget_below(sm.store, 30, 100, floor)
        assert (deleted, floor) == (22, 30)
        assert noops.noop_offsets(sm.store, 0, 100) == list(range(30, 50))
        assert noops.forget_below(sm.store, 30, 100, floor) == (0, 30)
    finally:
        sm.close()


def test_views_from_before_the_rows_fall_back_to_the_history(tmp_path: Path) -> None:
    sm = ViewsStateMachine(tmp_path / "v")
    try:
        sm.apply([entry(0, EVENTS[:2])])
        wb = sm.store.new_batch()                 # as an Epochlog without `noops` rows left them
        sm.store.delete(wb, noops.CF, (1).to_bytes(8, "big"))
        sm.store.db.delete(NOOPS_FROM)
        sm.store.write(wb)
    finally:
        sm.close()
    sm = ViewsStateMachine(tmp_path / "v")        # opened by this version: rows from the next offset on
    try:
        assert sm.applier.noops_from == 2
        sm.apply([entry(2, EVENTS[2:4])])
        assert noops.noop_offsets(sm.store, 0, 10) == [2, 3]
        flags = [noops.changed_views(sm.store.get, b"kv/a", o, sm.applier.noops_from) for o in range(3)]
        assert flags == [True, False, False]      # 0, 1 from the history (versions rows); 2 from its row
        in_range = noops.changed_views_in(sm.store, 0, 4, sm.applier.noops_from)   # a range across noops_from
        assert [in_range(b"kv/a", o) for o in range(3)] == flags
    finally:
        sm.close()
