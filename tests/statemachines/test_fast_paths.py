"""The applier's fast paths apply every log exactly as the paths they shortcut.

A follower parses each committed batch with `records.record_rows` (one pass over the common record shape,
`decode_records` for anything else) and checks a KvPut's fields with `KvPut.plainly_valid` before the
checks one by one. Random entries of valid puts, puts with a field at or past a bound, values that are no
event, records whose key is not their event's, other event types, transactions, records with headers or
long deltas (which the fast parse hands over), and client sessions' writes are applied with the fast paths
and with both turned off: the outcomes, every row of every column family and the digest are the same.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from eventlog import records as rec
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import Record, encode_records
from statemachines import apply
from statemachines import events as ev
from statemachines import views_format
from statemachines.store import ALL_CFS
from statemachines.views import ViewsStateMachine
from tests.statemachines.test_events import _random_put

SESSION = 1   # the session the log opens first (its id: the offset of the open plus one)


def _record(rng: random.Random, offset: int, seq: list[int]) -> tuple[bytes | None, bytes | None]:
    roll = rng.random()
    if roll < 0.45:   # a request of the client session, as the SDK writes them: the common case
        seq[0] += 1
        put = ev.KvPut(name=f"k{rng.randint(0, 30)}", value=b"v%d" % offset, session_id=SESSION, seq=seq[0],
                       answered_below=max(1, seq[0] - 3), v=ev.SESSIONS_SCHEMA)
        return put.key().encode(), ev.encode_event(put)
    if roll < 0.75:   # a put with a field at or past a bound (or none), written as is
        put = _random_put(rng)
        put = ev.KvPut(**{f: getattr(put, f) for f in put.__struct_fields__ if f != "value"},
                       value=put.value[:300])   # values past the bound are test_events' part
        fields = {f: getattr(put, f) for f in put.__struct_fields__}
        if put.session_id == SESSION:   # not a request of the log's session (its sequence is the log's)
            fields["session_id"] = 9
        fields["v"] = min(put.v, ev.KvPut.VERSION)   # a newer schema halts: test_poison's part
        put = ev.KvPut(**fields)
        return put.key().encode(), ev.encode_event(put)
    if roll < 0.80:
        return rng.choice((b"kv/x", b"kv/k1", None)), rng.choice((b"", b"\x81", b"\xc1", bytes(rng.randrange(256) for _ in range(8))))
    if roll < 0.85:   # an event under another record key
        put = ev.KvPut(name="k1", value=b"w")
        return b"kv/k2", ev.encode_event(put)
    event: ev.Event = rng.choice((
        ev.KvDeleted(name=f"k{rng.randint(0, 30)}"),
        ev.KvDeleted(name="k1", expected_version=rng.randint(0, 40)),
        ev.LeaseGranted(lease_id=rng.randint(1, 3), ttl_ms=10_000),
        ev.LeaseRevoked(lease_id=rng.randint(1, 3)),
        ev.KvPut(name=f"k{rng.randint(0, 30)}", value=b"l", lease=rng.randint(1, 3)),
        ev.KvPut(name="k2", value=b"c", expected_version=rng.choice((0, offset - 1, offset - 2))),
        ev.KvPut(name="k3", value=b"r", actor="alice", request_id=f"r{rng.randint(0, 5)}"),
        ev.Txn(ops=(ev.KvPut(name=f"k{rng.randint(0, 30)}", value=b"t"), ev.KvDeleted(name="k4"))),
        ev.ConfigChanged(scope="cluster", name="x", value=str(offset)),
    ))
    return event.key().encode(), ev.encode_event(event)


def _log(rng: random.Random) -> list[Entry]:
    opened = ev.ClientSessionOpened(group="kv", client="c")
    raised = ev.ViewsFormatRaised(level=views_format.LATEST, v=views_format.LATEST)
    entries = []
    offset = 0
    seq = [0]
    for i in range(120):
        if i == 0:
            pairs = [(opened.key().encode(), ev.encode_event(opened)), (raised.key().encode(), ev.encode_event(raised))]
        else:
            pairs = [_record(rng, offset + j, seq) for j in range(rng.randint(1, 40))]
        # A batch as the leader encodes it, or (now and then) one the fast parse hands to decode_records:
        # a record with headers, a timestamp delta past one byte
        odd = rng.random() < 0.15
        records = [Record(offset + j, 1_700_000_000_000 + i * 10 + (rng.choice((0, 100_000)) if odd else 0), k, v,
                          (("h", b"x"),) if odd and rng.random() < 0.5 else ())
                   for j, (k, v) in enumerate(pairs)]
        data = encode_records(records, leader_epoch=1)
        entries.append(Entry(offset, 1, len(records), EntryKind.NORMAL, data))
        offset += len(records)
    return entries


def _state(sm: ViewsStateMachine) -> dict[str, list[tuple[bytes, bytes]]]:
    return {cf: list(sm.store.scan(cf, b"")) for cf in ALL_CFS if cf != "default"} | {
        "meta": [(k, sm.store.meta(k) or b"") for k in (b"applied", b"digest", b"committed_ms")]}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_fast_paths_apply_every_log_as_the_paths_they_shortcut(seed: int, views_dir: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    print(f"seed {seed}")
    entries = _log(random.Random(seed))
    fast_sm = views_dir("fast")
    fast: dict[int, Any] = {}
    for i in range(0, len(entries), 3):
        fast.update(fast_sm.apply(entries[i:i + 3]))
    print(f"outcomes: {Counter(o.code or 'ok' for o in fast.values())}")
    assert sum(o.ok for o in fast.values()) > 500 and sum(not o.ok for o in fast.values()) > 300
    assert fast_sm.halt is None, fast_sm.halt

    def rows_one_by_one(h: rec.BatchHeader, payload: bytes | memoryview) -> list[rec.Row]:
        return [(o, k, v) for o, _, k, v, _ in rec.decode_records(h, payload, lambda *f: f)]  # type: ignore[misc]

    monkeypatch.setattr(apply, "record_rows", rows_one_by_one)
    monkeypatch.setattr(ev.KvPut, "plainly_valid", lambda self: False)
    slow_sm = views_dir("slow")
    slow: dict[int, Any] = {}
    for i in range(0, len(entries), 3):
        slow.update(slow_sm.apply(entries[i:i + 3]))
    assert fast == slow
    assert fast_sm.digest == slow_sm.digest
    assert _state(fast_sm) == _state(slow_sm)
