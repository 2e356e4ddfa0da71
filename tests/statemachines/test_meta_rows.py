"""The applier keeps the meta rows it read and wrote from one apply call to the next (statemachines/apply.py,
`Applier._overlay`): they must stay what the store holds, including after a write by anything else."""

from __future__ import annotations

from pathlib import Path

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.sessions import COMMITTED_MS
from statemachines.store import META, decode_offset, encode_offset
from statemachines.views import ViewsStateMachine


def entry(index: int, event: ev.Event, timestamp_ms: int) -> Entry:
    data = bytearray(encode_batch([ev.event_record(event)], timestamp_ms=timestamp_ms))
    stamp(data, index, 1)
    return Entry(index, 1, 1, EntryKind.NORMAL, bytes(data))


def test_a_meta_row_written_by_another_writer_between_apply_calls_is_read_afresh(tmp_path: Path) -> None:
    sm = ViewsStateMachine(tmp_path / "views")
    try:
        sm.apply([entry(0, ev.KvPut(name="a", value=b"1"), timestamp_ms=1_000)])
        assert decode_offset(sm.store.get(META, COMMITTED_MS)) == 1_000
        # Another writer of the store (as the pruner or an operator's skip write theirs): the committed
        # clock moves ahead of the next entry's timestamp, so applying that entry must leave it alone.
        wb = sm.store.new_batch()
        sm.store.put_meta(wb, COMMITTED_MS, encode_offset(5_000))
        sm.store.write(wb)
        sm.apply([entry(1, ev.KvPut(name="a", value=b"2"), timestamp_ms=2_000)])
        assert decode_offset(sm.store.get(META, COMMITTED_MS)) == 5_000
        sm.apply([entry(2, ev.KvPut(name="a", value=b"3"), timestamp_ms=6_000)])
        assert decode_offset(sm.store.get(META, COMMITTED_MS)) == 6_000
    finally:
        sm.close()


def test_a_replica_applying_entry_by_entry_agrees_with_one_applying_from_the_store(tmp_path: Path) -> None:
    """The kept rows follow the applier's own writes: a replica applying one entry per call (reading its
    meta rows from what it kept) and, after each entry, a new replica applying them all in one call
    (reading them from the store) have the same digest (a chain over every write) and committed clock."""
    kept = ViewsStateMachine(tmp_path / "kept")
    events = [ev.KvPut(name=f"k{i % 3}", value=str(i).encode()) for i in range(8)]
    try:
        for i, e in enumerate(events):
            kept.apply([entry(i, e, timestamp_ms=1_000 + 7 * i)])
            fresh = ViewsStateMachine(tmp_path / f"fresh-{i}")
            try:
                fresh.apply([entry(j, events[j], timestamp_ms=1_000 + 7 * j) for j in range(i + 1)])
                assert fresh.applied_index == kept.applied_index == i
                assert fresh.digest == kept.digest
                assert fresh.store.get(META, COMMITTED_MS) == kept.store.get(META, COMMITTED_MS)
            finally:
                fresh.close()
    finally:
        kept.close()
