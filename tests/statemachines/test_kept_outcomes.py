"""The applier's mirror of kept session outcomes (statemachines/kept_outcomes.py).

The mirror replaces a RocksDB lookup per request and a scan per forget; it must never change what is
applied or written. Checked two ways: `SeqSet` against a plain set, and whole random session histories
applied by views with the mirror and by views that read every answer from RocksDB (the code before the
mirror): the same outcome for every record and the same digest after every apply call, through
retries, out-of-order requests, forgets one by one and by range, the `max_outcomes` bound, closes,
expiries, evictions, restarts, a mirror that holds fewer sessions than are live, and a halt mid-entry
(whose abandoned writes the mirror had followed). Randomized: each test prints its seed; replay one
with EPOCHLOG_TEST_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.kept_outcomes import KeptOutcomes, SeqSet
from statemachines.views import ViewsStateMachine
from tests.support.seeds import collection_seeds

T0 = 1_700_000_000_000
TIMEOUT_MS = 60_000
NEWER = ev.KvPut.VERSION + 1   # a schema version only a newer Epochlog knows: its record halts the group


def _seeds(test: str, n: int) -> list[int]:
    fixed = os.environ.get("EPOCHLOG_TEST_SEED")
    return [int(fixed)] if fixed else collection_seeds(test, n, bits=30)


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


@pytest.mark.parametrize("seed", _seeds("test_views_with_the_mirror_are_the_views_without_it", 6))
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
