"""Client sessions and time-ordered request ids in the applier (statemachines/sessions.py, request_ids.py).

Each test builds a group's log by hand (entries with the leader's timestamps, which drive the
committed clock) and applies it to real views. What they pin down: a request of a live session is
applied once and its retries get the first outcome, whatever the history floor and the dedupe window
do; a request the session can no longer judge is refused with `session_expired` and changes nothing;
expiry and eviction are decided by committed data only, so replicas that applied the same log in other
batches hold the same views; snapshots carry the sessions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventlog.raft.types import Entry, EntryKind, SnapshotMeta, ConfState
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines import request_ids, sessions
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine

T0 = 1_700_000_000_000
HOUR = 3_600_000


class Log:
    """One group's log: a NORMAL entry per `add`, stamped with the committed time `at` (ms)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.next = 0
        self.now = T0

    def add(self, *events: ev.Event, at: int | None = None) -> Entry:
        self.now = self.now + 1 if at is None else at
        data = bytearray(encode_batch([ev.event_record(e) for e in events], timestamp_ms=self.now))
        stamp(data, self.next, 1)
        entry = Entry(self.next, 1, len(events), EntryKind.NORMAL, bytes(data))
        self.entries.append(entry)
        self.next += len(events)
        return entry

    def open(self, client: str = "c", *, timeout_ms: int = HOUR, max_outcomes: int = 100, max_sessions: int = 10,
             at: int | None = None) -> int:
        return self.add(ev.ClientSessionOpened(group="kv", client=client, timeout_ms=timeout_ms,
                                               max_outcomes=max_outcomes, max_sessions=max_sessions), at=at).index + 1


def put(session: int, seq: int, name: str, value: bytes, *, below: int | None = None, **kw: Any) -> ev.KvPut:
    return ev.KvPut(name=name, value=value, session_id=session, seq=seq,
                    answered_below=seq if below is None else below, v=ev.SESSIONS_SCHEMA, **kw)


def value_of(sm: ViewsStateMachine, name: str) -> bytes | None:
    raw = sm.store.get("kv", f"kv/{name}".encode())
    if raw is None:
        return None
    from statemachines.state import decode_state
    return decode_state(f"kv/{name}".encode(), raw).value  # type: ignore[attr-defined, no-any-return]


def test_a_retry_gets_the_first_outcome_whatever_the_history_floor_and_the_dedupe_window(views_dir: Any) -> None:
    """The issue-17 mechanism: a retry arrives after more than the dedupe window and the history floor
    moved past its first application. With a session it is answered, never applied again."""
    sm = views_dir("a", ViewsConfig(dedupe_window_offsets=3))
    log = Log()
    sid = log.open()
    first = log.add(put(sid, 1, "x", b"old", below=1))
    for i in range(2, 12):   # request 1 is still in flight (stuck on a deposed leader): below stays 1
        log.add(put(sid, i, "x", f"v{i}".encode(), below=1))
    log.add(ev.HistoryPruned(floor=log.next - 1))
    retry = log.add(put(sid, 1, "x", b"old", below=1))
    outcomes = sm.apply(log.entries)
    assert outcomes[first.index].ok and not outcomes[first.index].duplicate
    again = outcomes[retry.index]
    assert again.duplicate and again.ok and again.offset == first.index, again
    assert value_of(sm, "x") == b"v11", "the retry changed nothing"


def test_a_request_below_what_the_session_keeps_is_refused_not_applied(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    sid = log.open()
    log.add(put(sid, 1, "x", b"one", below=1))
    log.add(put(sid, 2, "x", b"two", below=2))      # the client saw 1 answered: the node may forget it
    late = log.add(put(sid, 1, "x", b"one", below=1))   # a copy of request 1 arriving late
    outcomes = sm.apply(log.entries)
    refused = outcomes[late.index]
    assert not refused.ok and refused.code == sessions.SESSION_EXPIRED and "answered and forgotten" in refused.message
    assert value_of(sm, "x") == b"two"


def test_an_unknown_session_is_refused(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    sid = log.open()
    stray = log.add(put(sid + 1_000, 1, "x", b"1"))
    outcomes = sm.apply(log.entries)
    assert outcomes[stray.index].code == sessions.SESSION_EXPIRED and value_of(sm, "x") is None


def test_a_session_expires_by_committed_time_and_its_retries_are_refused(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    sid = log.open(timeout_ms=10_000, at=T0)
    applied = log.add(put(sid, 1, "x", b"1"), at=T0 + 1_000)
    log.add(ev.KvPut(name="other", value=b"-"), at=T0 + 12_000)   # time passes (another client's write)
    retry = log.add(put(sid, 1, "x", b"1"), at=T0 + 12_001)
    outcomes = sm.apply(log.entries)
    assert outcomes[applied.index].ok
    assert outcomes[retry.index].code == sessions.SESSION_EXPIRED and not outcomes[retry.index].duplicate
    assert sm.store.get(sessions.SESSIONS, sessions._id(sid)) is None, "the expired session's rows are gone"
    assert list(sm.store.scan(sessions.OUTCOMES, b"")) == []


def test_activity_keeps_a_session_alive(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    sid = log.open(timeout_ms=10_000, at=T0)
    for i in range(1, 8):   # a request every 6 s for 42 s: never 10 s idle
        log.add(put(sid, i, "x", f"{i}".encode()), at=T0 + 6_000 * i)
    retry = log.add(put(sid, 7, "x", b"7"), at=T0 + 6_000 * 7 + 1)
    outcomes = sm.apply(log.entries)
    assert all(outcomes[o].ok for o in range(1, 8))
    assert outcomes[retry.index].duplicate


def test_expired_sessions_are_dropped_by_later_entries_and_the_count_stays_right(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    ids = [log.open(f"c{i}", timeout_ms=5_000, at=T0 + i) for i in range(9)]
    for i, sid in enumerate(ids):
        log.add(put(sid, 1, f"k{i}", b"v"), at=T0 + 100 + i)
    for i in range(5):   # time passes: later entries expire them, a few per entry
        log.add(ev.KvPut(name="tick", value=b"%d" % i), at=T0 + 60_000 + 2_000 * i)
    sm.apply(log.entries)
    assert list(sm.store.scan(sessions.SESSIONS, b"")) == []
    assert list(sm.store.scan(sessions.DEADLINES.cf, b"")) == []
    assert list(sm.store.scan(sessions.OUTCOMES, b"")) == []
    assert sm.store.meta(sessions.DEADLINES.live) == b"\x00" * 8


def test_a_session_keeps_at_most_max_outcomes(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    sid = log.open(max_outcomes=3)
    for seq in range(1, 7):   # nothing answered: the client never raises answered_below
        log.add(put(sid, seq, f"k{seq}", b"v", below=1))
    kept = log.add(put(sid, 5, "k5", b"v", below=1))
    forgotten = log.add(put(sid, 2, "k2", b"again", below=1))
    outcomes = sm.apply(log.entries)
    assert outcomes[kept.index].duplicate
    assert outcomes[forgotten.index].code == sessions.SESSION_EXPIRED
    assert value_of(sm, "k2") == b"v"
    assert len(list(sm.store.scan(sessions.OUTCOMES, b""))) == 3


def test_opening_past_max_sessions_evicts_the_one_closest_to_expiry(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    old = log.open("old", max_sessions=2, at=T0)
    busy = log.open("busy", max_sessions=2, at=T0 + 1)
    log.add(put(busy, 1, "b", b"1"), at=T0 + HOUR // 2)          # pushes busy's deadline on
    log.open("new", max_sessions=2, at=T0 + HOUR // 2 + 1)       # evicts `old`, the closest to expiry
    refused = log.add(put(old, 1, "o", b"1"))
    ok = log.add(put(busy, 2, "b", b"2"))
    outcomes = sm.apply(log.entries)
    assert outcomes[refused.index].code == sessions.SESSION_EXPIRED
    assert outcomes[ok.index].ok
    assert len(list(sm.store.scan(sessions.SESSIONS, b""))) == 2


def test_a_closed_session_forgets_everything_and_refuses_its_retries(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log()
    sid = log.open()
    log.add(put(sid, 1, "x", b"1"))
    log.add(ev.ClientSessionClosed(group="kv", client="c", session_id=sid, seq=2, answered_below=2,
                                   v=ev.SESSIONS_SCHEMA))
    retry = log.add(put(sid, 1, "x", b"1"))
    outcomes = sm.apply(log.entries)
    assert outcomes[retry.index].code == sessions.SESSION_EXPIRED
    assert list(sm.store.scan(sessions.SESSIONS, b"")) == [] and list(sm.store.scan(sessions.OUTCOMES, b"")) == []


def test_sessions_are_equal_on_replicas_whatever_their_batches_and_survive_a_snapshot(views_dir: Any,
                                                                                        tmp_path: Path) -> None:
    log = Log()
    a = log.open("a", timeout_ms=20_000, max_outcomes=4, at=T0)
    b = log.open("b", timeout_ms=20_000, max_outcomes=4, at=T0 + 1)
    for i in range(1, 30):
        sid = a if i % 3 else b
        log.add(put(sid, i, f"k{i % 5}", f"{i}".encode(), below=max(1, i - 2)), at=T0 + 1_000 * i)
    log.add(put(a, 28, "k3", b"28", below=26), at=T0 + 40_000)
    for i in range(3):
        log.add(ev.KvPut(name="late", value=b"%d" % i), at=T0 + 70_000 + 1_500 * i)
    one_call = views_dir("one")
    one_call.apply(log.entries)
    singly = views_dir("singly")
    for e in log.entries:
        singly.apply([e])
    assert one_call.digest == singly.digest
    snap = tmp_path / "snap"
    one_call.write_snapshot(snap)
    restored = views_dir("restored")
    restored.restore(snap, SnapshotMeta(index=one_call.applied_index, term=1, conf=ConfState(voters=(1,))))
    assert restored.digest == one_call.digest
    assert list(restored.store.scan(sessions.SESSIONS, b"")) == list(one_call.store.scan(sessions.SESSIONS, b""))


def test_a_time_ordered_request_id_is_remembered_for_its_window_then_refused(views_dir: Any) -> None:
    """Without a session: a UUIDv7 request id's retry is a duplicate for RETENTION_MS past its time,
    whatever the dedupe window and the history floor; after it, refused, never applied again."""
    sm = views_dir("a", ViewsConfig(dedupe_window_offsets=2))
    log = Log()
    rid = request_ids.uuid7(T0)
    first = log.add(ev.KvPut(name="x", value=b"1", request_id=rid), at=T0)
    for i in range(5):
        log.add(ev.KvPut(name="x", value=b"%d" % (i + 2)), at=T0 + 10 + i)
    log.add(ev.HistoryPruned(floor=log.next - 1), at=T0 + 20)
    dup = log.add(ev.KvPut(name="x", value=b"1", request_id=rid), at=T0 + request_ids.RETENTION_MS)
    late = log.add(ev.KvPut(name="x", value=b"1", request_id=rid), at=T0 + request_ids.RETENTION_MS + 1)
    outcomes = sm.apply(log.entries)
    assert outcomes[first.index].ok
    assert outcomes[dup.index].duplicate and outcomes[dup.index].offset == first.index
    assert outcomes[late.index].code == request_ids.REQUEST_EXPIRED
    assert value_of(sm, "x") == b"6"


def test_client_faces_refuse_request_ids_that_carry_no_time() -> None:
    with pytest.raises(ev.EventError, match="no UUIDv7"):
        request_ids.check_client_request_id(ev.KvPut(name="x", value=b"1", request_id="retry-me"))
    request_ids.check_client_request_id(ev.KvPut(name="x", value=b"1", request_id=request_ids.uuid7(T0)))
    request_ids.check_client_request_id(put(5, 1, "x", b"1", request_id="a label in a session"))
    assert request_ids.time_of(request_ids.uuid7(T0)) == T0


@pytest.mark.parametrize("fields", [dict(session_id=3, seq=0), dict(session_id=3, seq=2, answered_below=3),
                                    dict(seq=1), dict(session_id=3, seq=1, v=1)])
def test_session_fields_are_validated(fields: dict[str, int]) -> None:
    with pytest.raises(ev.EventError):
        ev.KvPut(name="x", value=b"1", **fields).validate()
