"""A leader prepares applying an entry before it commits (`ViewsStateMachine.speculate`, `Applier.prepare`):
its commit then writes what was prepared; anything else at that index, or another writer of the store
meanwhile, abandons it and the entry applied is applied from scratch. Nobody sees a prepared entry before
its commit (reads, the access caches' change count, lease changes, digest checkpoints), and an entry that
would halt the views or raise their format level is left to its apply.

Real RocksDB views in the test's directory; entries stamped as the log holds them. The property test over
every family of events is in tests/statemachines/test_determinism.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
import pytest

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.query import Query
from statemachines.store import APPLIED, ViewsConfig, cf_for
from statemachines.views import ViewsStateMachine
from tests.statemachines.harness import dump

Open = Callable[..., ViewsStateMachine]


def _entry(index: int, term: int, *records: tuple[bytes, bytes]) -> Entry:
    data = bytearray(encode_batch(list(records), timestamp_ms=1_700_000_000_000 + index))
    stamp(data, index, term)
    return Entry(index, term, len(records), EntryKind.NORMAL, bytes(data))


def _events(index: int, term: int, *events: ev.Event) -> Entry:
    return _entry(index, term, *(ev.event_record(e) for e in events))


def _put(name: str, value: bytes, request_id: str = "") -> ev.KvPut:
    return ev.KvPut(name=name, value=value, actor="t", request_id=request_id)


def test_the_commit_writes_what_was_prepared_and_nothing_shows_before_it(views_dir: Open) -> None:
    """Entries prepared one at a time, each then committed: the outcomes, rows and digest of plain applies;
    until each commit, nothing of it shows (the store, the access caches' change count, the digest
    checkpoints, the lease changes and the leader's lease clock)."""
    sm, plain = views_dir("speculating", ViewsConfig(digest_checkpoint_offsets=2)), views_dir(
        "plain", ViewsConfig(digest_checkpoint_offsets=2))
    assert sm.keepalive(7) is None   # no such lease yet; the leader's lease clock now runs
    entries = [_events(0, 1, _put("a", b"1")),
               _events(1, 1, ev.UserAdded(name="carol", actor="admin"), _put("a", b"2", "r-2")),
               _events(3, 1, ev.LeaseGranted(lease_id=7, ttl_ms=5_000, actor="t"))]
    for i, entry in enumerate(entries):
        access, checkpoints = sm.applier.access_changes, list(sm.applier.digest_checkpoints)
        applied, digest, rows = sm.applied_index, sm.digest, dump(sm.store)
        sm.speculate([entry])
        assert sm.speculations.prepared == i + 1
        # prepared, not applied: the store, the change count the access caches follow, the digest
        # checkpoints the leader compares and the lease changes the leader's clocks take are as they were
        assert (sm.applied_index, sm.digest, dump(sm.store)) == (applied, digest, rows)
        assert sm.applier.access_changes == access and list(sm.applier.digest_checkpoints) == checkpoints
        assert sm.applier.lease_changes == [] and sm.keepalive(7) is None
        got = sm.apply([entry])
        assert got == plain.apply([entry]) and all(o.ok for o in got.values()), got
        assert sm.applier.access_changes == plain.applier.access_changes
        assert sm.applier.lease_changes == plain.applier.lease_changes
        assert list(sm.applier.digest_checkpoints) == list(plain.applier.digest_checkpoints)
    assert sm.speculations.committed == 3 and sm.speculations.abandoned == 0
    assert sm.applier.access_changes == 1 and sm.applier.lease_changes == [(7, 5_000, 3)]
    assert sm.keepalive(7) == 5_000   # the commit granted it on the leader's clock
    assert len(sm.applier.digest_checkpoints) == 2
    assert sm.digest == plain.digest and dump(sm.store) == dump(plain.store)
    assert Query(sm.store).get("kv/a").state.value == b"2"


def test_another_entry_at_the_prepared_index_is_applied_instead(views_dir: Open) -> None:
    """A leader that lost its term before its entry committed: the new leader's entry at that index is
    what the log holds and what is applied; the prepared one leaves nothing behind (a regression test:
    committing the prepared entry by index alone would apply the old leader's put)."""
    sm, plain = views_dir("speculating"), views_dir("plain")
    first = _events(0, 1, _put("a", b"1"))
    assert sm.apply([first]) == plain.apply([first])
    sm.speculate([_events(1, 1, _put("a", b"old leader"), ev.UserAdded(name="mallory", actor="admin"))])
    replaced = _events(1, 2, _put("b", b"new leader"))
    assert sm.apply([replaced]) == plain.apply([replaced])
    assert sm.speculations.abandoned == 1 and sm.speculations.committed == 0
    assert sm.applier.access_changes == 0
    assert Query(sm.store).get("kv/a").state.value == b"1" and Query(sm.store).get("kv/b").state.value == b"new leader"
    assert Query(sm.store).get("user/mallory") is None
    assert sm.digest == plain.digest and dump(sm.store) == dump(plain.store)
    # and the views go on from there like the others
    more = [_events(2, 2, _put("a", b"3")), _events(3, 2, _put("c", b"4"))]
    sm.speculate(more[:1])
    assert sm.apply(more) == plain.apply(more)
    assert sm.speculations.committed == 1
    assert sm.digest == plain.digest and dump(sm.store) == dump(plain.store)


def test_another_writer_of_the_store_abandons_what_was_prepared(views_dir: Open) -> None:
    """What an entry's apply reads is the store as it is at its commit: a compare-and-set prepared against
    a row that a writer beside the applier deleted before the commit is decided again, and fails (a
    regression test: committing what was prepared would set the value)."""
    sm, plain = views_dir("speculating"), views_dir("plain")
    start = [_events(0, 1, _put("b", b"0")), _events(1, 1, _put("a", b"1"))]
    assert sm.apply(start) == plain.apply(start)
    cas = _events(2, 1, ev.KvPut(name="a", value=b"2", expected_version=1, actor="t"))
    sm.speculate([cas])
    for views in (sm, plain):
        batch = views.store.new_batch()
        views.store.delete(batch, cf_for(b"kv/a"), b"kv/a")
        views.store.write(batch)
    got = sm.apply([cas])
    assert got == plain.apply([cas]) and not got[2].ok, got
    assert sm.speculations.abandoned == 1 and sm.speculations.committed == 0
    assert sm.digest == plain.digest and dump(sm.store) == dump(plain.store)
    assert Query(sm.store).get("kv/a") is None


def test_what_cannot_be_prepared_is_left_to_its_apply(views_dir: Open, caplog: pytest.LogCaptureFixture) -> None:
    """An entry that would halt the views (a newer schema) or raise their format level is not held: the
    halt is the apply's (logged there), the level changes when the entry is applied, not before; and only
    an entry right after the applied offset is prepared."""
    sm = views_dir("speculating")
    raise_level = _events(0, 1, ev.ViewsFormatRaised(level=2, v=2, actor="epochlog/leader"))
    sm.speculate([raise_level])
    assert sm.speculations.prepared == 0 and sm.applier.level == 1
    sm.apply([raise_level])
    assert sm.applier.level == 2
    sm.speculate([_events(5, 1, _put("a", b"gap"))])   # not next
    assert sm.speculations.prepared == 0
    newer = msgspec.msgpack.decode(ev.encode_event(_put("a", b"1")))
    newer["v"] = ev.KvPut.VERSION + 1
    poisoned = _entry(1, 1, (b"kv/a", msgspec.msgpack.encode(newer)))
    sm.speculate([poisoned])
    assert sm.speculations.prepared == 0 and sm.halt is None
    with caplog.at_level(logging.CRITICAL, logger="statemachines.views"):
        sm.apply([poisoned])
    assert sm.halt is not None and sm.halt.offset == 1
    assert any("halted at offset 1" in r.getMessage() for r in caplog.records)
    sm.speculate([_events(1, 1, _put("a", b"2"))])   # halted: nothing is prepared
    assert sm.speculations.prepared == 0


def test_a_prepare_that_raises_is_left_to_the_apply(views_dir: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of the store failing while the leader prepares (injected: RocksDB's own errors cannot be
    made on demand) leaves nothing behind: in a handler (which an apply turns into a halt) not even the
    access caches' change count the user event bumped before its read, outside one (the applied offset's
    row) no exception either; the apply of the entry then runs as if nothing had been prepared."""
    sm, plain = views_dir("speculating"), views_dir("plain")
    entry = _events(0, 1, ev.UserAdded(name="dave", actor="admin"), _put("a", b"1"))
    real = sm.store.get
    failing_key = b"user/dave"

    def failing(cf: str, key: bytes) -> bytes | None:
        if key == failing_key:
            raise OSError("injected: the store could not be read")
        return real(cf, key)

    monkeypatch.setattr(sm.store, "get", failing)
    sm.speculate([entry])   # in the handler: the prepare halts, and is abandoned
    assert (sm.speculations.prepared, sm.speculations.failed) == (0, 0)
    assert sm.applier.access_changes == 0 and sm.applier.lease_changes == [] and sm.halt is None
    failing_key = APPLIED
    sm.speculate([entry])   # before any handler: the prepare raises
    assert (sm.speculations.prepared, sm.speculations.failed) == (0, 1)
    assert sm.applier.access_changes == 0 and sm.applier.lease_changes == [] and sm.halt is None
    monkeypatch.setattr(sm.store, "get", real)
    got = sm.apply([entry])
    assert got == plain.apply([entry]) and all(o.ok for o in got.values()), got
    assert sm.applier.access_changes == plain.applier.access_changes == 1
    assert sm.digest == plain.digest and dump(sm.store) == dump(plain.store)
