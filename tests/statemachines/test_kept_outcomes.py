"""The applier's mirror of kept session outcomes (statemachines/kept_outcomes.py).

The mirror replaces a RocksDB lookup per request and a scan per forget; it must never change what is
applied or written. Checked two ways: `SeqSet` against a plain set, and whole random session histories
applied by views with the mirror and by views that read every answer from RocksDB (the code before the
mirror): the same outcome for every record and the same digest after every apply call, through
retries, out-of-order requests, forgets one by one and by range, the `max_outcomes` bound, closes,
expiries, evictions, restarts, a mirror that holds fewer sessions than are live, and a halt mid-entry
(whose abandoned writes the mirror had followed). Randomized: each test prints its seed; replay one
with EPOCHLOG_TEST_SEED=<seed>; EPOCHLOG_SOAK=<k> draws k times as many seeds (tests/support/seeds.py).
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eventlog.raft.types import Entry, EntryKind, SnapshotMeta
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines import sessions, views_format
from statemachines.kept_outcomes import KeptOutcomes, RunSet, SeqSet
from statemachines.state import Outcome
from statemachines.views import ViewsStateMachine
from tests.support.seeds import collection_seeds, soak

T0 = 1_700_000_000_000
TIMEOUT_MS = 60_000
NEWER = ev.KvPut.VERSION + 1   # a schema version only a newer Epochlog knows: its record halts the group
NOTHING = ev.HistoryPruned(floor=0, actor="epochlog/compaction")   # never lowers a floor: changes nothing


def _seeds(test: str, n: int) -> list[int]:
    fixed = os.environ.get("EPOCHLOG_TEST_SEED")
    return [int(fixed)] if fixed else collection_seeds(test, soak(n), bits=30)


class ReadEveryTime(KeptOutcomes):
    """No mirror: every answer read from the views, as before the mirror (the reference)."""

    def held(self, sid: int) -> SeqSet | None:
        return None


@pytest.mark.parametrize("seed", _seeds("test_a_seq_set_is_the_set_it_stands_for", 20))
def test_a_seq_set_is_the_set_it_stands_for(seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    got, model = SeqSet(), set[int]()
    for _ in range(400):
        if rng.random() < 0.7:
            s = rng.randrange(200) if rng.random() < 0.5 else max(model, default=0) + rng.choice((0, 1, 2))
            if s not in model:
                got.add(s)
                model.add(s)
        else:
            lo = rng.randrange(210)
            hi = lo + rng.choice((0, 1, 3, 40, 300))
            assert got.remove_range(lo, hi) == sorted(s for s in model if lo <= s < hi)
            model -= set(range(lo, hi))
        assert list(got) == sorted(model) and len(got) == len(model)
        assert all((s in got) == (s in model) for s in range(-1, 215))
        assert all(e < s for e, s in zip(got.ends, got.starts[1:], strict=False)), "intervals disjoint, not adjacent"


class History:
    """A random log of client-session requests, one entry per `entry`, as clients (buggy ones too) send them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.entries: list[Entry] = []
        self.next = 0
        self.now = T0
        self.sessions: dict[int, list[int]] = {}   # sid -> [next seq, answered below]
        self.poisons = 0
        self.unraised: dict[int, Entry] = {}   # offset of a raise -> an entry changing nothing there

    def _add(self, records: list[tuple[bytes, bytes]], at: int | None = None) -> None:
        self.now = self.now + 1 if at is None else at
        data = bytearray(encode_batch(records, timestamp_ms=self.now))
        stamp(data, self.next, 1)
        self.entries.append(Entry(self.next, 1, len(records), EntryKind.NORMAL, bytes(data)))
        self.next += len(records)

    def _put(self, sid: int, seq: int, below: int, **kw: Any) -> tuple[bytes, bytes]:
        name = f"k{self.rng.randrange(30)}"
        return ev.event_record(ev.KvPut(name=name, value=f"{sid}/{seq}".encode(), session_id=sid, seq=seq,
                                        answered_below=below, v=ev.SESSIONS_SCHEMA, **kw))

    def raise_level(self, level: int) -> None:
        """An entry raising the views format to `level`; `unraised` holds an entry changing nothing in its place."""
        self._add([ev.event_record(ev.ViewsFormatRaised(level=level, v=level, actor="epochlog/leader"))])
        raised = self.entries[-1]
        data = bytearray(encode_batch([ev.event_record(NOTHING)], timestamp_ms=self.now))
        stamp(data, raised.index, 1)
        self.unraised[raised.index] = Entry(raised.index, 1, 1, EntryKind.NORMAL, bytes(data))

    def entry(self) -> None:
        rng = self.rng
        if not self.sessions or rng.random() < 0.06:
            max_outcomes = rng.choice((3, 10, 90, 200))
            opened = ev.ClientSessionOpened(group="kv", client="c", timeout_ms=TIMEOUT_MS, max_outcomes=max_outcomes,
                                            max_sessions=4)
            self._add([ev.event_record(opened)])
            self.sessions[self.next] = [1, 1]   # the session id: its record's offset + 1
            return
        sid = rng.choice(list(self.sessions))
        state = self.sessions[sid]
        records: list[tuple[bytes, bytes]] = []
        poisoned = False
        for _ in range(rng.choice((1, 1, 2, 3))):
            kind = rng.random()
            if kind < 0.55:   # new requests; the client may say many more were answered (a forget by range)
                n = rng.choice((1, 2, 5, 30, 120))
                if rng.random() < 0.5:
                    state[1] = rng.randrange(state[1], state[0] + 1)
                for _ in range(n):
                    records.append(self._put(sid, state[0], state[1]))
                    state[0] += 1
            elif kind < 0.75:   # a retry of an earlier request (kept, forgotten, or never applied)
                seq = rng.randrange(1, state[0] + 2)
                records.append(self._put(sid, seq, min(state[1], seq)))
            elif kind < 0.82:   # a request that is rejected: its outcome is kept too
                records.append(self._put(sid, state[0], state[1], expected_version=999_999))
                state[0] += 1
            elif kind < 0.85:
                closed = ev.ClientSessionClosed(group="kv", client="c", session_id=sid, seq=state[0], answered_below=state[1],
                                                v=ev.SESSIONS_SCHEMA)
                records.append(ev.event_record(closed))
                state[0] += 1
            elif kind < 0.88:
                records.append(self._put(sid + 100_000, 1, 1))   # an unknown session
            elif kind < 0.9 and self.poisons < 2:
                poisoned = True
        if not records or poisoned:
            records.append(self._put(sid, state[0], state[1]))
            state[0] += 1
        if rng.random() < 0.3:
            rng.shuffle(records)   # requests of a session committed out of their order
        if poisoned:   # after the entry's requests: the entry is abandoned, with the writes they made
            raw = msgspec.msgpack.decode(ev.encode_event(ev.KvPut(name="poison", value=b"x")))
            raw["v"] = NEWER
            records.append((b"kv/poison", msgspec.msgpack.encode(raw)))
            self.poisons += 1
        late = rng.random() < 0.03   # past every session's deadline: expiries
        self._add(records, at=self.now + TIMEOUT_MS + 1 if late else None)


def _apply(sm: ViewsStateMachine, entries: list[Entry], log: list[Entry]) -> dict[int, Any]:
    """Apply `entries`; on a halt, skip the poisoned record and resume from the log, as the operator would."""
    outcomes = sm.apply(entries)
    while sm.halt is not None:
        halt = sm.halt
        sm.skip(halt.offset)
        last = entries[-1].last_index
        sm.resume(lambda o: [e for e in log if e.last_index >= o and e.index <= last], lambda: last)
        for e in log:
            if halt.offset <= e.last_index <= last:
                outcomes.update({o: None for o in range(e.index, e.last_index + 1)})   # compared via the digest
    return outcomes


@pytest.mark.parametrize("seed", _seeds("test_views_with_the_mirror_are_the_views_without_it", 2))
def test_views_with_the_mirror_are_the_views_without_it(tmp_path: Path, seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    history = History(rng)
    for _ in range(600):
        history.entry()
    mirrored = ViewsStateMachine(tmp_path / "mirrored" / "kv")
    mirrored.applier.kept_outcomes = KeptOutcomes(max_sessions=2)   # fewer than are live: it lets go and reads again
    reference = ViewsStateMachine(tmp_path / "reference" / "kv")
    reference.applier.kept_outcomes = ReadEveryTime(max_sessions=1)
    done = 0
    duplicates = forgotten = 0
    try:
        while done < len(history.entries):
            n = rng.choice((1, 1, 2, 4, 9))
            call = history.entries[done:done + n]
            seen = history.entries[:done + n]
            got = _apply(mirrored, call, seen)
            want = _apply(reference, call, seen)
            assert got == want, f"outcomes differ in the call of entries {call[0].index}..{call[-1].last_index}"
            assert mirrored.digest == reference.digest, f"digests differ after offset {call[-1].last_index}"
            duplicates += sum(1 for o in got.values() if o is not None and o.duplicate)
            forgotten += sum(1 for o in got.values() if o is not None and o.code == "session_expired")
            done += n
            if rng.random() < 0.05:   # a restart: the mirror starts empty and reads the views again
                mirrored.close()
                mirrored = ViewsStateMachine(tmp_path / "mirrored" / "kv")
                mirrored.applier.kept_outcomes = KeptOutcomes(max_sessions=2)
        assert duplicates and forgotten, "the history exercised retries and refusals"
        assert history.poisons == 0 or mirrored.applier.skipped
    finally:
        mirrored.close()
        reference.close()


@pytest.mark.parametrize("seed", _seeds("test_views_written_without_the_mirror_go_on_with_it", 2))
def test_views_written_without_the_mirror_go_on_with_it(tmp_path: Path, seed: int) -> None:
    """An existing data directory (views whose outcome rows were written by code without the mirror, as
    every Epochlog before it) opened by this code: the mirror reads those rows and the views go on
    exactly as views that never had a mirror."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    history = History(rng)
    for _ in range(400):
        history.entry()
    half = len(history.entries) // 2
    old = ViewsStateMachine(tmp_path / "upgraded" / "kv")
    old.applier.kept_outcomes = ReadEveryTime(max_sessions=1)
    reference = ViewsStateMachine(tmp_path / "reference" / "kv")
    reference.applier.kept_outcomes = ReadEveryTime(max_sessions=1)
    opened = [old, reference]
    try:
        for sm in (old, reference):
            _apply(sm, history.entries[:half], history.entries)
        opened.remove(old)
        old.close()
        upgraded = ViewsStateMachine(tmp_path / "upgraded" / "kv")   # this code: a mirror, empty at start
        opened.append(upgraded)
        assert type(upgraded.applier.kept_outcomes) is KeptOutcomes
        for i in range(half, len(history.entries)):
            call = history.entries[i:i + 1]
            assert (_apply(upgraded, call, history.entries[:i + 1])
                    == _apply(reference, call, history.entries[:i + 1])), f"entry {call[0].index}"
            assert upgraded.digest == reference.digest, f"digests differ after offset {call[-1].last_index}"
    finally:
        for sm in opened:
            sm.close()


# --- views format level 3: a row per run of a session's consecutive ok requests ------------------------------

@pytest.mark.parametrize("seed", _seeds("test_a_run_set_is_the_rows_it_stands_for", 10))
def test_a_run_set_is_the_rows_it_stands_for(seed: int) -> None:
    """`RunSet` against a model: a dict of rows (start -> [count, offset or -1]) changed as sessions.py
    changes the views, every operation's answer the rows to write or delete."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    got, rows = RunSet(), dict[int, list[int]]()
    offset = 0

    def kept() -> set[int]:
        return {s + i for s, (n, _) in rows.items() for i in range(n)}

    for _ in range(400):
        offset += rng.choice((1, 1, 1, 2))
        r = rng.random()
        if r < 0.7:
            seq = max(kept(), default=0) + rng.choice((1, 1, 1, 2)) if rng.random() < 0.7 else rng.randrange(1, 200)
            if seq in kept():
                continue
            if rng.random() < 0.85:
                ending = next((s for s, (n, o) in rows.items() if s + n == seq and o >= 0 and o + n == offset), None)
                want = (seq, offset, 1) if ending is None else (ending, rows[ending][1], rows[ending][0] + 1)
                assert got.add_ok(seq, offset) == want
                rows[want[0]] = [want[2], want[1]]
            else:
                got.add_outcome(seq)
                rows[seq] = [1, -1]
        else:
            if rows and rng.random() < 0.3:   # about the oldest row, as single puts forget (remove_range's fast paths)
                oldest = min(rows)
                lo = oldest - rng.choice((0, 0, 1))
                hi = oldest + rows[oldest][0] + rng.choice((-1, 0, 0, 1, 2))
            else:
                lo = rng.randrange(0, max(kept(), default=0) + 3)
                hi = lo + rng.choice((0, 1, 3, 40, 300))
            deleted, written = got.remove_range(lo, hi)
            want_deleted, want_written, after = [], [], {}
            for s, (n, o) in sorted(rows.items()):
                if s + n <= lo or s >= hi or lo >= hi:
                    after[s] = [n, o]
                    continue
                if s < lo:
                    after[s] = [lo - s, o]
                    want_written.append((s, o, lo - s))
                else:
                    want_deleted.append(s)
                if s + n > hi:
                    after[hi] = [s + n - hi, o + hi - s]
                    want_written.append((hi, o + hi - s, s + n - hi))
            assert (deleted, written) == (want_deleted, want_written), (lo, hi)
            rows = after
        assert got.rows() == [(s, n, o) for s, (n, o) in sorted(rows.items())]
        assert list(got) == sorted(kept()) and len(got) == len(kept())
        assert all((s in got) == (s in kept()) for s in range(-1, 205))
        assert all(got.row_start(s) == max(r for r in rows if r <= s) for s in kept())


def _kept_per_request(sm: ViewsStateMachine) -> dict[tuple[int, int], Outcome]:
    """Every kept outcome by (session, sequence), a run row read as the outcome of each request it holds."""
    kept: dict[tuple[int, int], Outcome] = {}
    for key, value in sm.store.scan(sessions.OUTCOMES, b""):
        sid, start = struct.unpack(">qq", key)
        row = sessions.decode_outcome_row(value)
        for i, outcome in enumerate([Outcome(True, row.offset + i) for i in range(row.count)]
                                    if isinstance(row, sessions.OkRun) else [row]):
            assert (sid, start + i) not in kept, f"session {sid}'s rows overlap at {start + i}"
            kept[(sid, start + i)] = outcome
    return kept


def _unextended_runs(sm: ViewsStateMachine) -> list[bytes]:
    """Run rows that the run just below them should have absorbed: it ends at their first sequence - 1
    and at their first offset - 1 (the request was consecutive, yet started a run of its own)."""
    wrong: list[bytes] = []
    before: tuple[int, int, sessions.OkRun] | None = None
    for key, value in sm.store.scan(sessions.OUTCOMES, b""):
        sid, start = struct.unpack(">qq", key)
        row = sessions.decode_outcome_row(value)
        if not isinstance(row, sessions.OkRun):
            before = None
            continue
        if before is not None and before[0] == sid and before[1] + before[2].count == start \
                and before[2].offset + before[2].count == row.offset:
            wrong.append(key)
        before = (sid, start, row)
    return wrong


@pytest.mark.parametrize("seed", _seeds("test_outcome_runs_keep_what_a_row_per_request_keeps", 2))
def test_outcome_runs_keep_what_a_row_per_request_keeps(tmp_path: Path, seed: int) -> None:
    """One random session history applied by three replicas: `rows` at level 1 (a row per request, every
    answer read from RocksDB: the reference), and at level 3 `runs` with the mirror (holding fewer sessions
    than are live, restarted and restored from a snapshot at random moments) and `reread` reading every
    session's rows from the views at each request (which rows a request extends must be a function of the
    views). The raise comes first (a new cluster) or mid-history (an upgrade: sessions with rows of both
    kinds). After every apply call: the same outcome for every record on all three; `runs` and `reread`
    the same digest; level 3's rows, read request by request, are exactly level 1's rows (the cut of a run
    by a forget included); and no run row that its predecessor should have absorbed."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    history = History(rng)
    raise_at = rng.choice((0, 0, rng.randrange(1, 300)))
    for i in range(500):
        if i == raise_at:
            history.raise_level(views_format.OUTCOME_RUNS)
        history.entry()
    plain = [history.unraised.get(e.index, e) for e in history.entries]
    (raise_offset,) = history.unraised

    def opened(name: str, reread: bool = False) -> ViewsStateMachine:
        sm = ViewsStateMachine(tmp_path / name / "kv")
        sm.applier.kept_outcomes = ReadEveryTime(max_sessions=1) if reread else KeptOutcomes(max_sessions=2)
        return sm

    rows, runs, reread = opened("rows", reread=True), opened("runs"), opened("reread", reread=True)
    replicas = [rows, runs, reread]
    runs_dir = "runs"
    done = 0
    duplicates = cut = restored = n_rows = n_runs = 0
    try:
        while done < len(history.entries):
            n = rng.choice((1, 1, 2, 4, 9))
            want = _apply(rows, plain[done:done + n], plain[:done + n])
            want.pop(raise_offset, None)
            for sm in (runs, reread):
                got = _apply(sm, history.entries[done:done + n], history.entries[:done + n])
                raised = got.pop(raise_offset, None)
                assert raised is None or raised.ok, raised
                assert got == want, f"outcomes differ in the call of entries {done}..{done + n - 1}"
            assert runs.digest == reread.digest, f"digests differ after entry {done + n - 1}"
            kept = _kept_per_request(rows)
            assert _kept_per_request(runs) == kept, f"level 3's rows are not level 1's after entry {done + n - 1}"
            n_rows += sum(1 for _ in rows.store.scan(sessions.OUTCOMES, b""))
            n_runs += sum(1 for _ in runs.store.scan(sessions.OUTCOMES, b""))
            assert not _unextended_runs(runs)
            duplicates += sum(1 for o in want.values() if o is not None and o.duplicate)
            cut += any(isinstance(sessions.decode_outcome_row(v), sessions.OkRun) and
                       struct.unpack(">qq", k)[1] > 1 for k, v in runs.store.scan(sessions.OUTCOMES, b""))
            done += n
            r = rng.random()
            if r < 0.04:   # a restart: the mirror starts empty and reads the views again
                replicas.remove(runs)
                runs.close()
                runs = opened(runs_dir)
                replicas.append(runs)
            elif r < 0.08:   # a snapshot installed: a new applier over the leader's views
                snapshot = tmp_path / f"snap-{restored}.tar"
                runs.write_snapshot(snapshot)
                into = opened(f"restored-{restored}")
                replicas.append(into)
                into.restore(snapshot, SnapshotMeta(runs.applied_index, 1, ()))  # type: ignore[call-arg]
                assert into.digest == runs.digest and into.applier.level == runs.applier.level
                replicas.remove(runs)
                runs.close()
                runs, runs_dir = into, f"restored-{restored}"
                restored += 1
        assert runs.applier.level == views_format.OUTCOME_RUNS and rows.applier.level == 1
        assert duplicates and cut, "the history retried requests and forgot parts of runs"
        print(f"raised at offset {raise_offset}: {n_rows} outcome rows at level 1, {n_runs} at level 3 (summed "
              f"over the apply calls); "
              f"{duplicates} retries answered, {restored} snapshot restores")
        assert n_runs < n_rows
    finally:
        for sm in replicas:
            sm.close()
