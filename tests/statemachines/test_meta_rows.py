"""The applier keeps the meta and client-session rows it read and wrote from one apply call to the next
(statemachines/apply.py, `Applier._overlay`): they must stay what the store holds, including after a write by
anything else."""

from __future__ import annotations

import os
import random
from pathlib import Path

from eventlog.errors import REQUEST_EXPIRED, SESSION_EXPIRED
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines import request_ids, sessions
from statemachines.sessions import COMMITTED_MS
from statemachines.store import META, ViewsConfig, decode_offset, encode_offset
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


def test_a_session_row_written_by_another_writer_between_apply_calls_is_read_afresh(tmp_path: Path) -> None:
    """The client sessions' rows are kept from call to call too: a write of the store by anything else
    (here: the session's row deleted, as a snapshot's or an operator's write could change it) drops them."""
    sm = ViewsStateMachine(tmp_path / "views")
    try:
        sm.apply([entry(0, ev.ClientSessionOpened(group="kv", client="c"), timestamp_ms=1_000)])
        first = sm.apply([entry(1, ev.KvPut(name="a", value=b"1", session_id=1, seq=1, v=ev.KvPut.VERSION), timestamp_ms=1_001)])
        assert first[1].ok
        wb = sm.store.new_batch()
        sm.store.delete(wb, sessions.SESSIONS, encode_offset(1))
        sm.store.write(wb)
        second = sm.apply([entry(2, ev.KvPut(name="a", value=b"2", session_id=1, seq=2, v=ev.KvPut.VERSION), timestamp_ms=1_002)])
        assert not second[2].ok and second[2].code == SESSION_EXPIRED   # the row is gone: refused
    finally:
        sm.close()


def _session_history(rng: random.Random, n: int) -> list[tuple[ev.Event, int]]:
    """(event, timestamp ms) of a random history of client sessions: opens (short timeouts, few outcomes
    kept, at most three live), puts of live, expired, closed and unknown sessions, retries, closes; and puts
    outside a session with time-ordered request ids (some retried, some remembered until they expire)."""
    history: list[tuple[ev.Event, int]] = []
    now = 1_000_000
    next_seq: dict[int, int] = {}
    request_id_times: list[str] = []
    for offset in range(n):
        now += rng.choice((0, 1, 5, 300, 999, 1_000, 1_500, 1_000_000))
        roll = rng.random()
        if roll > 0.85:
            made = now - rng.choice((0, 10, request_ids.RETENTION_MS - 1_000))
            rid = rng.choice([*request_id_times, request_ids.uuid7(made)]) if request_id_times else request_ids.uuid7(made)
            request_id_times.append(rid)
            history.append((ev.KvPut(name="r", value=b"", actor="a", request_id=rid), now))
            continue
        if roll < 0.12 or not next_seq:
            history.append((ev.ClientSessionOpened(group="kv", client=f"c{offset}", timeout_ms=1_000,
                                                   max_outcomes=rng.choice((1, 3, 50)), max_sessions=3), now))
            next_seq[offset + 1] = 1
            continue
        sid = rng.choice([*next_seq, 999_999])   # an unknown session now and then
        if roll < 0.17:
            history.append((ev.ClientSessionClosed(group="kv", client="c", session_id=sid, seq=next_seq.get(sid, 1),
                                                   v=ev.ClientSessionClosed.VERSION), now))
            next_seq.pop(sid, None)
            continue
        seq = next_seq.get(sid, 1)
        if rng.random() < 0.15 and seq > 1:
            seq -= rng.randint(1, seq - 1)   # a retry (kept, or forgotten)
        else:
            next_seq[sid] = seq + 1
        below = rng.randint(max(1, seq - 3), seq)
        history.append((ev.KvPut(name=f"k{rng.randrange(5)}", value=str(offset).encode(), session_id=sid, seq=seq,
                                 answered_below=below, v=ev.KvPut.VERSION), now))
    return history


def test_kept_session_rows_give_what_the_store_gives_over_random_session_histories(tmp_path: Path) -> None:
    """A replica applying one entry per call (its session and meta rows kept from call to call, expiries
    skipped while they are known to find nothing: `Applier._expire`) and one whose kept rows are dropped
    before every entry (an empty write by another writer: every row read from the store, every expiry
    looked at) give the same outcomes and digests, over histories with session expiry (at the check
    interval's edges too: steps of 999 and 1,000 ms), eviction by `max_sessions`, closes, retries, unknown
    sessions and time-ordered request ids expiring; a bound of one kept session row makes the kept rows
    drop often, with the same answers."""
    seed = int(os.environ.get("KEPT_ROWS_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (replay: KEPT_ROWS_SEED={seed})")
    rng = random.Random(seed)
    seen: set[str] = set()
    for run in range(4):
        history = _session_history(rng, 150)
        kept = ViewsStateMachine(tmp_path / f"kept-{run}")
        tiny = ViewsStateMachine(tmp_path / f"tiny-{run}", ViewsConfig(client_sessions_max=1))
        fresh = ViewsStateMachine(tmp_path / f"fresh-{run}")
        try:
            for offset, (event, now) in enumerate(history):
                fresh.store.write(fresh.store.new_batch())
                expected = fresh.apply([entry(offset, event, now)])
                assert kept.apply([entry(offset, event, now)]) == expected, (seed, offset, event)
                assert tiny.apply([entry(offset, event, now)]) == expected, (seed, offset, event)
                assert kept.digest == fresh.digest == tiny.digest, (seed, offset)
                outcome = expected[offset]
                seen.add("duplicate" if outcome.duplicate else outcome.code or "ok")
        finally:
            kept.close()
            tiny.close()
            fresh.close()
    assert {"ok", "duplicate", SESSION_EXPIRED, REQUEST_EXPIRED} <= seen, seen
