"""The applier's fast paths for plain puts apply every log exactly as the generic path does.

`Applier._extend_run` applies the requests of a client session's write that extend its outcome run (the
bulk of batched writes) in one loop. Random logs of such writes, broken every way the fast path hands a
record back (leases on the put or on the row it replaces, compare-and-sets, invalid or undecodable values,
record keys that are not the event's, non-ASCII names, retries, sequence gaps, a raised `answered_below`,
small `max_outcomes`, other sessions and writers between, overwrites), some records handed over by a
leader's memo (`expect`, one of them under another key), are applied side by side by views with the fast
paths and by views with them turned off, in the same random apply calls: after every call the outcomes,
every row of every column family and the digest are the same; the last entries halt both at the same record
(a put of a newer schema ending a run).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import HEADER_SIZE, LOG_OVERHEAD, encode_batch, read_header, record_rows, stamp
from statemachines import apply
from statemachines import events as ev
from statemachines import views_format
from statemachines.store import ALL_CFS
from statemachines.views import ViewsStateMachine
from tests.statemachines.test_sessions import Log, put


def _rows(sm: ViewsStateMachine) -> dict[str, list[tuple[bytes, bytes]]]:
    return {cf: list(sm.store.scan(cf, b"")) for cf in ALL_CFS} | {
        "meta": list(sm.store.db.items())}


def _write(rng: random.Random, sids: list[int], next_seq: dict[int, int], below: dict[int, int],
           leases: list[int]) -> list[ev.Event]:
    """One entry: mostly a session's write of consecutive requests, broken now and then."""
    sid = rng.choice(sids)
    if rng.random() < 0.5:
        below[sid] = max(below[sid], next_seq[sid] - rng.randint(0, 40))
    events: list[ev.Event] = []
    for _ in range(rng.choice((1, 2, 5, 20, 60))):
        roll = rng.random()
        seq = next_seq[sid]
        kw: dict[str, Any] = {}
        name = f"k{rng.randint(0, 80)}"
        if roll < 0.01:
            sid = rng.choice(sids)   # another session's request next
            seq = next_seq[sid]
        elif roll < 0.02:
            events.append(ev.KvPut(name=name, value=b"plain"))   # no session
            continue
        elif roll < 0.03:
            events.append(ev.LeaseGranted(lease_id=rng.choice(leases), ttl_ms=60_000))
            continue
        elif roll < 0.035:
            events.append(ev.LeaseRevoked(lease_id=rng.choice(leases)))
            continue
        elif roll < 0.045:
            kw["lease"] = rng.choice(leases)   # granted or not
        elif roll < 0.055:
            kw["expected_version"] = rng.choice((0, 999_999))
        elif roll < 0.06 and seq > 1:
            seq = rng.randint(max(1, seq - 30), seq - 1)   # a retry: kept, forgotten or refused
        elif roll < 0.065:
            seq += 1   # a gap
            next_seq[sid] += 1
        elif roll < 0.075:
            below[sid] = rng.randint(below[sid], seq)   # answered: older ones forgotten mid-write
        elif roll < 0.08:
            name = "kö" + name   # valid, not plainly (the checks one by one)
        elif roll < 0.085:
            name = ""   # invalid: rejected with its own outcome
        elif roll < 0.09:
            events.append(ev.KvDeleted(name=name, session_id=sid, seq=seq, answered_below=min(below[sid], seq),
                                       v=ev.SESSIONS_SCHEMA))
            next_seq[sid] = max(next_seq[sid], seq + 1)
            continue
        events.append(put(sid, seq, name, b"v%d" % rng.randrange(1000), below=min(below[sid], seq), **kw))
        next_seq[sid] = max(next_seq[sid], seq + 1)
    return events


def _entry(log: Log, rng: random.Random, events: list[ev.Event]) -> None:
    """`Log.add` of the events as they are (invalid ones too), now and then one record under another key or
    with a value that is no event."""
    records = [(e.key().encode(), ev.encode_event(e)) for e in events]
    if rng.random() < 0.1 and records:
        i = rng.randrange(len(records))
        key, value = records[i]
        records[i] = rng.choice(((b"kv/elsewhere", value), (key, b"\x81\xa4type\xa5KvPut"), (key, value[:-3]),
                                 (key, b"\xc1")))
    log.now += 1
    data = bytearray(encode_batch(records, timestamp_ms=log.now))
    stamp(data, log.next, 1)
    log.entries.append(Entry(log.next, 1, len(records), EntryKind.NORMAL, bytes(data)))
    log.next += len(records)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_runs_of_puts_apply_as_the_generic_path_applies_them(seed: int, views_dir: Any) -> None:
    print(f"seed {seed}")
    rng = random.Random(seed)
    log = Log(views_format.LATEST)
    sids = [log.open(f"c{i}", max_outcomes=bound) for i, bound in enumerate((10, 1_000, 10_000))]
    leases = [1, 2, 3]
    log.add(ev.LeaseGranted(lease_id=1, ttl_ms=60_000), ev.LeaseGranted(lease_id=2, ttl_ms=60_000))
    next_seq = dict.fromkeys(sids, 1)
    below = dict.fromkeys(sids, 1)
    for _ in range(200):
        _entry(log, rng, _write(rng, sids, next_seq, below, leases))
    sid = sids[2]   # at last, a run cut by a record of a newer schema: both halt there, the entry unapplied
    seqs = range(next_seq[sid], next_seq[sid] + 12)
    newer = put(sid, seqs[-1], "k1", b"newer", below=below[sid])
    _entry(log, rng, [put(sid, seq, f"k{seq % 7}", b"last", below=below[sid]) for seq in seqs[:-1]]
           + [ev.KvPut(**{f: getattr(newer, f) for f in newer.__struct_fields__ if f != "v"}, v=ev.KvPut.VERSION + 1)])
    halted_at = log.next - 1
    _entry(log, rng, [put(sid, seqs[-1] + 1, "k2", b"after", below=below[sid])])
    fast, slow = views_dir("fast"), views_dir("slow")
    slow.applier._extend_run = lambda ov, run, records, i, outcomes: i   # type: ignore[method-assign]
    taken = 0
    real = apply.Applier._extend_run

    def counted(self: apply.Applier, *args: Any) -> int:
        nonlocal taken
        at = args[3]
        end = real(self, *args)
        taken += end - at
        return end

    fast.applier._extend_run = counted.__get__(fast.applier)   # type: ignore[method-assign]
    codes: Counter[str] = Counter()
    i = 0
    while i < len(log.entries):
        calls = log.entries[i:i + rng.randint(1, 4)]
        i += len(calls)
        for entry in calls:   # as a leader: its memo of some records (one under another key)
            if rng.random() < 0.3:
                fast.expect(_memo(rng, entry))
        got, want = fast.apply(calls), slow.apply(calls)
        assert got == want, f"entries {calls[0].index}-{calls[-1].last_index}"
        assert fast.digest == slow.digest
        assert _rows(fast) == _rows(slow), f"entries {calls[0].index}-{calls[-1].last_index}"
        codes.update(o.code or "ok" for o in got.values())
    print(f"{taken} records by the fast path; outcomes {codes}")
    assert fast.halt is not None and fast.halt == slow.halt and fast.halt.offset == halted_at
    assert taken > 500 and codes["ok"] > 2000 and sum(codes.values()) - codes["ok"] > 100


def _memo(rng: random.Random, entry: Any) -> list[tuple[bytes, bytes, ev.Event]]:
    header = read_header(entry.data)
    memo = []
    for _, _key, value in record_rows(header, entry.data[HEADER_SIZE:header.batch_length + LOG_OVERHEAD]):
        try:
            event = ev.applicable(value)
        except (ev.EventError, ev.SchemaVersionError):   # no event a leader would hand over
            continue
        if rng.random() < 0.7:   # as `events.checked_record` makes it: the event's key
            memo.append((b"kv/other" if rng.random() < 0.05 else event.key().encode(), value, event))
    return memo
