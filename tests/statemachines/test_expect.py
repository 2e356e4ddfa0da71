"""Propose once: the leader hands its applier the events it decoded before proposing (`Applier.expect`).

Taking them changes nothing the views hold: outcomes and digest equal those of an applier that decodes
every record; a record whose key is not the one the leader checked with that value is refused as
before; the memo stays bounded. Real RocksDB views; entries built as the Raft log holds them.
"""

from __future__ import annotations

from typing import Any

from eventlog.errors import INVALID_ARGUMENT
from statemachines import apply
from statemachines import events as ev
from tests.statemachines.test_poison import LogBuilder


def _events() -> list[ev.Event]:
    opened = ev.ClientSessionOpened(group="kv", client="expect-test")
    out: list[ev.Event] = [opened]
    for seq in range(1, 41):
        out.append(ev.KvPut(name=f"k/{seq % 7}", value=bytes([seq]) * 30, session_id=1, seq=seq,
                            answered_below=max(1, seq - 5), v=ev.KvPut.VERSION))
    out.append(ev.KvPut(name="k/1", value=b"cas", expected_version=1, session_id=1, seq=41, answered_below=41,
                        v=ev.KvPut.VERSION))   # rejected: k/1 is at a later version
    out.append(ev.KvDeleted(name="k/2", session_id=1, seq=42, answered_below=41, v=ev.KvDeleted.VERSION))
    out.append(ev.Txn(ops=(ev.KvPut(name="t/a", value=b"1"), ev.KvDeleted(name="k/3")), actor="t",
                      request_id="expect-txn"))
    return out


def test_expected_records_apply_exactly_as_decoded_ones(views_dir: Any) -> None:
    checked = [ev.checked_record(e) for e in _events()]
    log = LogBuilder()
    for i in range(0, len(checked), 8):
        log.add(*[(k, v) for k, v, _ in checked[i:i + 8]])
    decoding, expecting = views_dir("decoding"), views_dir("expecting")
    expecting.expect(checked)
    assert expecting.applier._expected
    got = [expecting.apply([e]) for e in log.entries]
    want = [decoding.apply([e]) for e in log.entries]
    assert got == want
    assert [o.code for r in want for o in r.values() if not o.ok] == ["version_mismatch"]
    assert expecting.digest == decoding.digest and expecting.applied_index == decoding.applied_index
    assert not expecting.applier._expected and expecting.applier._expected_bytes == 0   # each taken once


def test_an_expected_value_under_another_key_is_refused_as_before(views_dir: Any) -> None:
    key, value, event = ev.checked_record(ev.KvPut(name="a", value=b"x"))
    log = LogBuilder()
    log.add((b"kv/forged", value))
    log.add((key, value))
    decoding, expecting = views_dir("decoding"), views_dir("expecting")
    expecting.expect([(key, value, event)])
    got = expecting.apply(log.entries)
    assert got == decoding.apply(log.entries)
    assert not got[0].ok and got[0].code == INVALID_ARGUMENT and "is not the event's key" in got[0].message
    assert got[1].ok
    assert expecting.digest == decoding.digest


def test_the_memo_is_bounded_and_what_it_dropped_is_decoded(views_dir: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(apply, "EXPECTED_BYTES", 1000)
    checked = [ev.checked_record(ev.KvPut(name=f"m/{i}", value=bytes(100))) for i in range(30)]
    expecting, decoding = views_dir("expecting"), views_dir("decoding")
    expecting.expect(checked)
    assert expecting.applier._expected_bytes <= 1000 + 2 * 150
    assert len(expecting.applier._expected) < len(checked)
    log = LogBuilder()
    log.add(*[(k, v) for k, v, _ in checked])
    assert expecting.apply(log.entries) == decoding.apply(log.entries)
    assert expecting.digest == decoding.digest


def test_overlay_reads_of_the_store_are_remembered_and_pending_writes_still_win(views_dir: Any) -> None:
    """The applier's overlays remember what they read from the store (a session's row is read for every
    request of it); a write or delete pending over a remembered read is what a later read sees."""
    sm = views_dir("overlay")
    store = sm.store
    wb = store.new_batch()
    store.put(wb, "kv", b"kv/a", b"stored")
    store.write(wb)
    root = apply.Overlay(store)
    child = apply.Overlay(store, root)
    assert child.get("kv", b"kv/a") == b"stored" and child.get("kv", b"kv/b") is None
    assert root.reads["kv"] == {b"kv/a": b"stored", b"kv/b": None}   # remembered, misses too, in the root
    child.put("kv", b"kv/b", b"new")
    child.delete("kv", b"kv/a")
    assert child.get("kv", b"kv/b") == b"new" and child.get("kv", b"kv/a") is None
    child.commit_to_parent()
    assert root.get("kv", b"kv/b") == b"new" and root.get("kv", b"kv/a") is None
    assert apply.Overlay(store, root).get("kv", b"kv/a") is None
