"""Client sessions and time-ordered request ids in the applier (statemachines/sessions.py, request_ids.py).

Each test builds a group's log by hand (entries with the leader's timestamps, which drive the
committed clock) and applies it to real views. What they pin down: a request of a live session is
applied once and its retries get the first outcome, whatever the history floor and the dedupe window
do; a request the session can no longer judge is refused with `session_expired` and changes nothing;
expiry and eviction are decided by committed data only, so replicas that applied the same log in other
batches hold the same views; snapshots carry the sessions.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eventlog.raft.types import Entry, EntryKind, SnapshotMeta, ConfState
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines import apply, request_ids, sessions, views_format
from statemachines.state import Outcome
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine

T0 = 1_700_000_000_000
HOUR = 3_600_000


LEVELS = (1, views_format.OUTCOME_RUNS)
"""Views format levels the session tests run at: a row per request, and a row per run of ok requests."""


class Log:
    """One group's log: a NORMAL entry per `add`, stamped with the committed time `at` (ms). At a views
    format `level` above 1 its first entry raises the group to it (as a new cluster's first leader does)."""

    def __init__(self, level: int = 1) -> None:
        self.entries: list[Entry] = []
        self.next = 0
        self.now = T0
        if level > 1:
            self.add(ev.ViewsFormatRaised(level=level, v=level, actor="epochlog/leader"), at=T0 - 1)

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


@pytest.mark.parametrize("level", LEVELS)
def test_a_retry_gets_the_first_outcome_whatever_the_history_floor_and_the_dedupe_window(level: int,
                                                                                       views_dir: Any) -> None:
    """The issue-17 mechanism: a retry arrives after more than the dedupe window and the history floor
    moved past its first application. With a session it is answered, never applied again."""
    sm = views_dir("a", ViewsConfig(dedupe_window_offsets=3))
    log = Log(level)
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


@pytest.mark.parametrize("level", LEVELS)
def test_a_request_below_what_the_session_keeps_is_refused_not_applied(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
    sid = log.open()
    log.add(put(sid, 1, "x", b"one", below=1))
    log.add(put(sid, 2, "x", b"two", below=2))      # the client saw 1 answered: the node may forget it
    late = log.add(put(sid, 1, "x", b"one", below=1))   # a copy of request 1 arriving late
    outcomes = sm.apply(log.entries)
    refused = outcomes[late.index]
    assert not refused.ok and refused.code == sessions.SESSION_EXPIRED and "answered and forgotten" in refused.message
    assert value_of(sm, "x") == b"two"


@pytest.mark.parametrize("level", LEVELS)
def test_an_unknown_session_is_refused(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
    sid = log.open()
    stray = log.add(put(sid + 1_000, 1, "x", b"1"))
    outcomes = sm.apply(log.entries)
    assert outcomes[stray.index].code == sessions.SESSION_EXPIRED and value_of(sm, "x") is None


@pytest.mark.parametrize("level", LEVELS)
def test_a_session_expires_by_committed_time_and_its_retries_are_refused(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
    sid = log.open(timeout_ms=10_000, at=T0)
    applied = log.add(put(sid, 1, "x", b"1"), at=T0 + 1_000)
    log.add(ev.KvPut(name="other", value=b"-"), at=T0 + 12_000)   # time passes (another client's write)
    retry = log.add(put(sid, 1, "x", b"1"), at=T0 + 12_001)
    outcomes = sm.apply(log.entries)
    assert outcomes[applied.index].ok
    assert outcomes[retry.index].code == sessions.SESSION_EXPIRED and not outcomes[retry.index].duplicate
    assert sm.store.get(sessions.SESSIONS, sessions._id(sid)) is None, "the expired session's rows are gone"
    assert list(sm.store.scan(sessions.OUTCOMES, b"")) == []


@pytest.mark.parametrize("level", LEVELS)
def test_activity_keeps_a_session_alive(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
    sid = log.open(timeout_ms=10_000, at=T0)
    for i in range(1, 8):   # a request every 6 s for 42 s: never 10 s idle
        log.add(put(sid, i, "x", f"{i}".encode()), at=T0 + 6_000 * i)
    retry = log.add(put(sid, 7, "x", b"7"), at=T0 + 6_000 * 7 + 1)
    outcomes = sm.apply(log.entries)
    assert all(outcomes[o].ok for o in range(1, 8))
    assert outcomes[retry.index].duplicate


@pytest.mark.parametrize("level", LEVELS)
def test_expired_sessions_are_dropped_by_later_entries_and_the_count_stays_right(level: int,
                                                                                 views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
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


@pytest.mark.parametrize("level", LEVELS)
def test_a_session_keeps_at_most_max_outcomes(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
    sid = log.open(max_outcomes=3)
    for seq in range(1, 7):   # nothing answered: the client never raises answered_below
        log.add(put(sid, seq, f"k{seq}", b"v", below=1))
    kept = log.add(put(sid, 5, "k5", b"v", below=1))
    forgotten = log.add(put(sid, 2, "k2", b"again", below=1))
    outcomes = sm.apply(log.entries)
    assert outcomes[kept.index].duplicate
    assert outcomes[forgotten.index].code == sessions.SESSION_EXPIRED
    assert value_of(sm, "k2") == b"v"
    rows = list(sm.store.scan(sessions.OUTCOMES, b""))
    assert len(rows) == (3 if level == 1 else 1), rows   # at level 3 requests 4-6 are one run (consecutive)


@pytest.mark.parametrize("level", LEVELS)
def test_opening_past_max_sessions_evicts_the_one_closest_to_expiry(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
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


@pytest.mark.parametrize("level", LEVELS)
def test_a_closed_session_forgets_everything_and_refuses_its_retries(level: int, views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(level)
    sid = log.open()
    log.add(put(sid, 1, "x", b"1"))
    log.add(ev.ClientSessionClosed(group="kv", client="c", session_id=sid, seq=2, answered_below=2,
                                   v=ev.SESSIONS_SCHEMA))
    retry = log.add(put(sid, 1, "x", b"1"))
    outcomes = sm.apply(log.entries)
    assert outcomes[retry.index].code == sessions.SESSION_EXPIRED
    assert list(sm.store.scan(sessions.SESSIONS, b"")) == [] and list(sm.store.scan(sessions.OUTCOMES, b"")) == []


@pytest.mark.parametrize("level", LEVELS)
def test_sessions_are_equal_on_replicas_whatever_their_batches_and_survive_a_snapshot(level: int, views_dir: Any,
                                                                                        tmp_path: Path) -> None:
    log = Log(level)
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


@pytest.mark.parametrize("level", LEVELS)
def test_a_time_ordered_request_id_is_remembered_for_its_window_then_refused(level: int, views_dir: Any) -> None:
    """Without a session: a UUIDv7 request id's retry is a duplicate for RETENTION_MS past its time,
    whatever the dedupe window and the history floor; after it, refused, never applied again."""
    sm = views_dir("a", ViewsConfig(dedupe_window_offsets=2))
    log = Log(level)
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


# --- views format level 3: one outcome row per run of a session's consecutive ok requests -------------------

def _rows(sm: ViewsStateMachine) -> list[tuple[int, int, sessions.OkRun | Outcome]]:
    """(session, first sequence, value) of every outcome row, in key order."""
    return [(*struct.unpack(">qq", k), sessions.decode_outcome_row(v)) for k, v in sm.store.scan(sessions.OUTCOMES, b"")]


def test_ok_requests_at_consecutive_offsets_are_one_row_and_a_retry_answers_its_own_offset(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(views_format.OUTCOME_RUNS)
    sid = log.open(max_outcomes=1_000)
    batch = log.add(*[put(sid, seq, f"k{seq}", b"v", below=1) for seq in range(1, 101)])
    sm.apply(log.entries)
    assert _rows(sm) == [(sid, 1, sessions.OkRun(batch.index, 100))], "an entry of 100 puts: one row"
    more = log.add(put(sid, 101, "k101", b"v", below=1), put(sid, 102, "k102", b"v", below=1))
    log.add(ev.KvPut(name="other", value=b"-"))   # another writer's record: the next request is not consecutive
    after = log.add(put(sid, 103, "k103", b"v", below=1))
    retries = log.add(*[put(sid, seq, f"k{seq}", b"again", below=1) for seq in (1, 50, 100, 101, 102, 103)])
    outcomes = sm.apply(log.entries[-4:])
    assert outcomes[more.index].ok and outcomes[more.index + 1].ok
    assert _rows(sm) == [(sid, 1, sessions.OkRun(batch.index, 102)), (sid, 103, sessions.OkRun(after.index, 1))]
    first_offset = {**{seq: batch.index + seq - 1 for seq in range(1, 103)}, 103: after.index}
    for i, seq in enumerate((1, 50, 100, 101, 102, 103)):
        assert outcomes[retries.index + i] == Outcome(True, first_offset[seq], duplicate=True), seq
    assert value_of(sm, "k1") == b"v" and value_of(sm, "k103") == b"v", "no retry was applied"


def test_a_failed_request_keeps_its_own_row_between_runs(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(views_format.OUTCOME_RUNS)
    sid = log.open()
    one = log.add(put(sid, 1, "x", b"1", below=1), put(sid, 2, "x", b"2", below=1))
    failed = log.add(put(sid, 3, "x", b"3", below=1, expected_version=999_999))
    two = log.add(put(sid, 4, "x", b"4", below=1), put(sid, 5, "x", b"5", below=1))
    retry = log.add(put(sid, 3, "x", b"3", below=1, expected_version=999_999))
    outcomes = sm.apply(log.entries)
    rejected = outcomes[failed.index]
    assert not rejected.ok
    assert _rows(sm) == [(sid, 1, sessions.OkRun(one.index, 2)), (sid, 3, rejected),
                         (sid, 4, sessions.OkRun(two.index, 2))]
    assert outcomes[retry.index] == msgspec.structs.replace(rejected, duplicate=True)


def test_requests_committed_out_of_order_extend_the_run_that_ends_just_below_them(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(views_format.OUTCOME_RUNS)
    sid = log.open()
    e = log.add(put(sid, 3, "x", b"3", below=1), put(sid, 1, "x", b"1", below=1), put(sid, 2, "x", b"2", below=1),
                put(sid, 4, "x", b"4", below=1))
    outcomes = sm.apply(log.entries)
    assert [outcomes[e.index + i].offset for i in range(4)] == [e.index + i for i in range(4)]
    # 1 and 2 are a run (offsets e+1, e+2); 3 (offset e) and 4 (e+3) are not consecutive: two rows of their own
    assert _rows(sm) == [(sid, 1, sessions.OkRun(e.index + 1, 2)), (sid, 3, sessions.OkRun(e.index, 1)),
                         (sid, 4, sessions.OkRun(e.index + 3, 1))]


def test_forgetting_answered_requests_deletes_whole_runs_and_rewrites_the_one_it_cuts(views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(views_format.OUTCOME_RUNS)
    sid = log.open()
    run = log.add(*[put(sid, seq, f"k{seq}", b"v", below=1) for seq in range(1, 11)])
    nxt = log.add(put(sid, 11, "k11", b"v", below=4))   # 1-3 answered: the run is cut at 4; 11 extends it
    sm.apply(log.entries)
    assert _rows(sm) == [(sid, 4, sessions.OkRun(run.index + 3, 8))]
    assert nxt.index == run.index + 10
    late = log.add(put(sid, 3, "k3", b"again", below=1))
    kept = log.add(put(sid, 4, "k4", b"again", below=4), put(sid, 10, "k10", b"again", below=4))
    outcomes = sm.apply(log.entries[-2:])
    assert outcomes[late.index].code == sessions.SESSION_EXPIRED
    assert outcomes[kept.index] == Outcome(True, run.index + 3, duplicate=True)
    assert outcomes[kept.index + 1] == Outcome(True, run.index + 9, duplicate=True)
    log.add(ev.KvPut(name="other", value=b"-"))
    new = log.add(put(sid, 12, "k12", b"v", below=12))   # everything below 12 answered: the run goes whole
    sm.apply(log.entries[-2:])
    assert _rows(sm) == [(sid, 12, sessions.OkRun(new.index, 1))]


def test_a_session_whose_outcomes_were_kept_a_row_per_request_goes_on_in_runs_after_the_raise(
        views_dir: Any) -> None:
    sm = views_dir("a")
    log = Log(1)
    sid = log.open()
    old = log.add(put(sid, 1, "x", b"1"), put(sid, 2, "x", b"2", below=1))
    sm.apply(log.entries)
    assert [seq for _, seq, _ in _rows(sm)] == [1, 2]
    log.add(ev.ViewsFormatRaised(level=views_format.OUTCOME_RUNS, v=views_format.OUTCOME_RUNS))
    new = log.add(put(sid, 3, "x", b"3", below=1), put(sid, 4, "x", b"4", below=1))
    retry = log.add(put(sid, 2, "x", b"2", below=1), put(sid, 4, "x", b"4", below=1))
    outcomes = sm.apply(log.entries[-3:])
    assert sm.applier.level == views_format.OUTCOME_RUNS
    assert _rows(sm) == [(sid, 1, Outcome(True, old.index)), (sid, 2, Outcome(True, old.index + 1)),
                         (sid, 3, sessions.OkRun(new.index, 2))]
    assert outcomes[retry.index] == Outcome(True, old.index + 1, duplicate=True)
    assert outcomes[retry.index + 1] == Outcome(True, new.index + 1, duplicate=True)
    cut = log.add(put(sid, 5, "x", b"5", below=4))
    sm.apply(log.entries[-1:])
    assert _rows(sm) == [(sid, 4, sessions.OkRun(new.index + 1, 1)), (sid, 5, sessions.OkRun(cut.index, 1))]


def _entry_of_requests(log: Log, rng: Any, sids: list[int], next_seq: dict[int, int], below: dict[int, int]) -> None:
    """One entry of a session's write of several requests (what `RunExtension` shortcuts), broken the
    ways a log can break it: another session's or writer's records, a rejected put, a retry, a raised
    `answered_below`, a gap in sequences, a lease that does not exist, a delete, the session closed."""
    events: list[ev.Event] = []
    sid = rng.choice(sids)
    if rng.random() < 0.6:   # the client heard answers: most requests below its window's tail
        below[sid] = max(below[sid], next_seq[sid] - rng.randint(0, 15))
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.06:
            sid = rng.choice(sids)
        if roll < 0.03:
            events.append(ev.KvPut(name=f"k{rng.randint(0, 9)}", value=b"plain"))
            continue
        seq = next_seq[sid]
        kw: dict[str, Any] = {}
        if 0.03 <= roll < 0.06 and seq > 1:
            seq = rng.randint(max(1, seq - 8), seq - 1)   # a retry (kept, forgotten or refused)
        elif roll < 0.09:
            kw["expected_version"] = 999_999                 # rejected: an Outcome row of its own
        elif roll < 0.11:
            kw["lease"] = 77                                 # no such lease: rejected
        elif roll < 0.14:
            next_seq[sid] += 1                               # a gap: the next request starts a run
            seq += 1
        elif roll < 0.18:
            below[sid] = rng.randint(below[sid], seq)        # answered: the oldest are forgotten
        answered = min(below[sid], seq)
        if 0.18 <= roll < 0.20:
            events.append(ev.KvDeleted(name=f"k{rng.randint(0, 9)}", session_id=sid, seq=seq,
                                       answered_below=answered, v=ev.SESSIONS_SCHEMA))
        elif 0.20 <= roll < 0.2015:
            events.append(ev.ClientSessionClosed(group="kv", client="c", session_id=sid, seq=seq,
                                                 answered_below=answered, v=ev.SESSIONS_SCHEMA))
        else:
            events.append(put(sid, seq, f"k{rng.randint(0, 9)}", b"v%d" % seq, below=answered, **kw))
        next_seq[sid] = max(next_seq[sid], seq + 1)
    log.add(*events)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_requests_extending_a_run_in_an_entry_apply_as_one_by_one(seed: int, views_dir: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """statemachines/apply.py lets the requests that extend their session's outcome run skip `admit`
    and `record` (sessions.RunExtension): random entries of such writes, broken in every way the log
    can break them, give the same outcomes, rows and digest as applying every request one by one."""
    import collections
    import random
    print(f"seed {seed}")
    rng = random.Random(seed)
    log = Log(views_format.OUTCOME_RUNS)
    sids = [log.open(f"c{i}", max_outcomes=rng.choice((8, 30, 1_000))) for i in range(3)]
    next_seq = dict.fromkeys(sids, 1)
    below = dict.fromkeys(sids, 1)
    for _ in range(150):
        _entry_of_requests(log, rng, sids, next_seq, below)
    extended = views_dir("extended")
    calls = 0
    real_extend = sessions.RunExtension.extend

    def counted(self: sessions.RunExtension) -> None:
        nonlocal calls
        calls += 1
        real_extend(self)

    monkeypatch.setattr(sessions.RunExtension, "extend", counted)
    # the fast path of extending runs (test_put_runs.py holds it to this path) bypasses `extend`
    monkeypatch.setattr(apply.Applier, "_extend_run", lambda self, ov, run, records, i, outcomes: i)
    fast = {}
    for i in range(0, len(log.entries), 7):
        fast.update(extended.apply(log.entries[i:i + 7]))
    print(f"{calls} requests extended a run; outcomes: {collections.Counter(o.code or 'ok' for o in fast.values())}")
    assert calls > 100, "the entries hold requests that extend a run"
    monkeypatch.setattr(sessions.RunExtension, "start", staticmethod(lambda *args: None))
    one_by_one = views_dir("one_by_one")
    slow = one_by_one.apply(log.entries)
    assert fast == slow
    assert extended.digest == one_by_one.digest
    assert _rows(extended) == _rows(one_by_one)
    for cf in (sessions.SESSIONS, "kv", "noops"):
        assert list(extended.store.scan(cf, b"")) == list(one_by_one.store.scan(cf, b"")), cf
