"""The views digest of a fixed history is the same in every Epochlog version.

Members compare digests at equal offsets (epochlog/integrity.py) and raise an alarm when they differ;
in a rolling upgrade old and new members apply the same entries, so a change to how the applier keeps
its pending writes (statemachines/apply.py `Overlay`, `_chain`) must leave the digest of every entry
exactly as it was. DIGEST was computed by main at c9ef101, before the pending writes were kept per
column family (issue 20); the history holds a client session whose outcomes are forgotten by a scan
and one by one, a rejected compare-and-set, deletes, and a request-id write.
"""

from __future__ import annotations

from pathlib import Path

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.store import DIGEST, ViewsConfig
from statemachines.views import ViewsStateMachine

DIGEST_AT_C9EF101 = "a044f9e3092fcee27d4ea9a2beba863b1c35d9821f83caba92b68bcb8bfff987"


def _history() -> list[list[ev.Event]]:
    """Entries of events: a session, batched puts (each forgetting 100 outcomes at once: a scan), single
    puts (forgetting a few, one by one), a compare-and-set that fails, deletes, a write with a request id."""
    opened = ev.ClientSessionOpened(group="kv", client="digest-test")
    entries: list[list[ev.Event]] = [[opened]]
    seq = 1
    for call in range(6):
        batch = []
        for j in range(100):
            batch.append(ev.KvPut(name=f"k/{call}/{j}", value=bytes([call, j]) * 20, session_id=1, seq=seq,
                                  answered_below=max(1, call * 100 - 50), v=ev.KvPut.VERSION))
            seq += 1
        entries.append(batch)
    singles = [ev.KvPut(name=f"k/0/{j}", value=b"again", session_id=1, seq=seq + j, answered_below=seq + j - 3,
                        v=ev.KvPut.VERSION) for j in range(10)]
    seq += 10
    entries.append(singles)
    entries.append([ev.KvPut(name="k/1/1", value=b"cas", expected_version=1, session_id=1, seq=seq,
                             answered_below=seq, v=ev.KvPut.VERSION),
                    ev.KvDeleted(name="k/2/2", session_id=1, seq=seq + 1, answered_below=seq, v=ev.KvDeleted.VERSION),
                    ev.KvPut(name="plain", value=b"x", actor="t", request_id="digest-test-1")])
    return entries


def test_the_digest_of_a_fixed_history_is_the_one_every_version_computes(tmp_path: Path) -> None:
    sm = ViewsStateMachine(tmp_path / "views", ViewsConfig())
    offset = 0
    for i, events in enumerate(_history()):
        data = bytearray(encode_batch([(e.key().encode(), ev.encode_event(e)) for e in events],
                                      timestamp_ms=1_700_000_000_000 + i))
        stamp(data, offset, 1)
        outcomes = sm.apply([Entry(offset, 1, len(events), EntryKind.NORMAL, bytes(data))])
        assert len(outcomes) == len(events)
        offset += len(events)
    rejected = [o for o in outcomes.values() if not o.ok]
    assert [o.code for o in rejected] == ["version_mismatch"], rejected   # the history is what it says
    digest = sm.store.meta(DIGEST)
    sm.close()
    assert digest is not None and digest.hex() == DIGEST_AT_C9EF101

