"""Key compaction of Epochlog's own events: what each event sets (compaction/event_keys.py), and that a
reader rebuilding state from a cleaned log gets the state the views hold.

The property test draws programs of every event family from the views' model-based harness
(tests/statemachines/harness.py: compare-and-sets that succeed and fail, stale epochs, retried request ids,
malformed and invalid records, transactions, leases with attached keys and sessions, brokers fenced
and unfenced, topics updated), applies them to real views (which write the `noops` rows), writes the
same records to a real log of small segments and cleans it below its last segment with the node's
key functions and the no-op offsets the views recorded. Then:

- a log reader (`Reader`: applies each event's effect, no conditions, the way a Kafka consumer
  rebuilding tables does) over the cleaned log up to the cleaned range's end gets exactly the state
  the same reader gets from the original log without its no-ops, and that state is the views' own
  (so the no-op rows are right too);
- no record that changed nothing is left in the cleaned range, every record kept is byte for byte
  the original at its offset, and the log from the cleaned range's end on is as written.

Hypothesis runs a fixed set of examples in CI (`derandomize`); a failure prints the program, which
replays as it is. More: EVENT_COMPACTION_EXAMPLES=300.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from compaction.event_keys import ASPECTS, NEVER, PARTIAL, WHOLE, compaction_key, event_type, is_delete
from compaction.rewrite import CompactionKey
from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.raft.types import EntryKind
from eventlog.records import Record, encode_batch, encode_records
from statemachines import events as ev
from statemachines import noops
from statemachines.state import decode_state
from statemachines.store import ENTITY_CFS
from statemachines.views import ViewsStateMachine
from tests.statemachines.test_events import EXAMPLES
from tests.statemachines.harness import build, entry_cmds
from tests.statemachines.model import Model

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy="fsync", preallocate_next_segment=False)
THREAD = CleanerConfig(delete_retention_ms=10**15, worker_process=False, min_cleanable_dirty_ratio=0.0)
CONTROL_NOOP = encode_records([Record(0, -1, b"__raft/noop", b"")], control=True)


# --- what each event sets ---------------------------------------------------------------------------

def test_every_event_type_has_exactly_one_class() -> None:
    classes = [set(WHOLE), set(ASPECTS), set(PARTIAL), set(NEVER)]
    assert set().union(*classes) == set(ev.EVENT_TYPES)
    assert sum(len(c) for c in classes) == len(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", [*EXAMPLES, ev.HistoryPruned(floor=5), ev.MemberAdded(node_id=2, peer_address="h:1"),
                                   ev.MemberRemoved(node_id=2), ev.ConfigChanged(scope="s", name="n")],
                         ids=lambda e: type(e).__name__)
def test_compaction_key_and_tombstones_of_every_event(event: ev.Event) -> None:
    key, value = ev.event_record(event)
    kind = type(event).__struct_config__.tag
    assert event_type(value) == kind
    found = compaction_key(key, value)
    if kind in WHOLE:
        assert found == CompactionKey(key)
    elif kind in ASPECTS:
        assert found == CompactionKey(key, b"fenced")
    elif kind in PARTIAL:
        assert found == CompactionKey(key, b"")
    else:
        assert found is None
    deletes = (ev.BrokerUnregistered, ev.TopicDeleted, ev.KvDeleted, ev.SessionClosed)
    want_delete = isinstance(event, deletes) or (isinstance(event, ev.ConfigChanged) and event.value is None)
    assert is_delete(Record(0, 0, key, value)) is want_delete


def test_records_that_are_no_event_are_never_compacted() -> None:
    assert compaction_key(None, ev.encode_event(ev.KvPut(name="a", value=b"1"))) is None
    assert compaction_key(b"kv/a", None) is None
    assert compaction_key(b"__raft/noop", b"") == CompactionKey(b"__raft/noop")
    newer = msgspec.msgpack.encode({"type": "KvRenamed", "v": 1, "name": "a"})   # a newer Epochlog's type
    for value in (b"", b"\x93garbage", b"\xa4type", newer, b"\x81\xa4type\xa5KvP", b"\x81\xa4tipe\xa5KvPut"):
        assert compaction_key(b"kv/a", value) is None, value
        assert not is_delete(Record(0, 0, b"kv/a", value))
    long_tag = msgspec.msgpack.encode({"type": "X" * 40})                       # str8 tag
    assert event_type(long_tag) == "X" * 40


# --- a reader rebuilding state from the log ----------------------------------------------------------

class Reader:
    """What a consumer of the log computes: each event's effect, unconditionally (no compare-and-set,
    epochs or request ids: a log reader trusts that every record it sees took effect)."""

    def __init__(self) -> None:
        self.s: dict[str, dict[str, Any]] = {}

    def read(self, value: bytes | None) -> None:
        try:
            event = ev.decode_event(value or b"")
        except (ev.EventError, ev.SchemaVersionError):
            return
        self._apply(event)

    def _apply(self, e: ev.Event) -> None:
        s, k = self.s, e.key()
        match e:
            case ev.Txn():
                for op in e.ops:
                    self._apply(op)
            case ev.KvPut():
                s[k] = {"value": e.value, "lease": e.lease}
            case ev.SessionOpened():
                s[k] = {"node": e.node, "clean": e.clean, "lease": e.lease}
            case ev.KvDeleted() | ev.SessionClosed() | ev.TopicDeleted() | ev.BrokerUnregistered():
                s.pop(k, None)
            case ev.LeaseGranted():
                s[k] = {"ttl_ms": e.ttl_ms}
            case ev.LeaseRevoked() | ev.LeaseExpired():
                # It took effect, so the lease existed (its grant may be compacted away by a later grant
                # of the same id): the entities attached to it go.
                s.pop(k, None)
                for other in [x for x, v in s.items() if v.get("lease") == e.lease_id]:
                    del s[other]
            case ev.OffsetCommitted():
                s[k] = {"offset": e.offset}
            case ev.ConfigChanged():
                if e.value is None:
                    s.pop(k, None)
                else:
                    s[k] = {"value": e.value}
            case ev.TopicCreated():
                s[k] = {"read_queues": e.read_queues, "write_queues": e.write_queues, "perm": e.perm,
                        "broker_groups": tuple(e.broker_groups), "config": dict(e.config)}
            case ev.TopicUpdated():
                if k in s:
                    s[k] = {**s[k], **{f: (tuple(v) if isinstance(v, tuple) else v)
                                       for f in ("read_queues", "write_queues", "perm", "broker_groups", "config")
                                       if (v := getattr(e, f)) is not None}}
            case ev.BrokerRegistered():
                s[k] = {"address": e.address, "incarnation": e.incarnation, "broker_id": e.broker_id,
                        "broker_epoch": e.broker_epoch, "fenced": False}
            case ev.BrokerFenced() | ev.BrokerUnfenced():
                if k in s:
                    s[k] = {**s[k], "fenced": isinstance(e, ev.BrokerFenced)}
            case ev.MasterElected():
                sync = tuple(sorted(set(e.sync_state_set))) if e.sync_state_set else (
                    (e.master,) if e.master >= 0 else ())
                s[k] = {"master": e.master, "sync_state_set": sync}
            case ev.SyncStateSetChanged():
                if k in s:
                    s[k] = {**s[k], "sync_state_set": tuple(sorted(set(e.sync_state_set)))}
            case _:
                raise AssertionError(f"the reader does not know {type(e).__name__}")


def views_state(sm: ViewsStateMachine) -> dict[str, dict[str, Any]]:
    """The views' entities in the reader's terms (its fields only)."""
    out = {}
    fields = {"kv": ("value", "lease"), "session": ("node", "clean", "lease"), "lease": ("ttl_ms",),
              "offset": ("offset",), "config": ("value",),
              "topic": ("read_queues", "write_queues", "perm", "broker_groups", "config"),
              "broker": ("address", "incarnation", "broker_id", "broker_epoch", "fenced"),
              "group": ("master", "sync_state_set")}
    for kind, cf in ENTITY_CFS.items():
        if kind not in fields:
            continue
        for key, raw in sm.store.scan(cf, b""):
            state = msgspec.structs.asdict(decode_state(key, raw))
            if kind == "group" and state["master_epoch"] == 0:
                continue   # a group only brokers registered into, never elected: not the reader's entity
            out[key.decode()] = {f: (tuple(state[f]) if isinstance(state[f], list) else state[f])
                                 for f in fields[kind]}
    return out


def write_log(log: Log, entries: list[Any]) -> None:
    for entry in entries:
        info = log.append(CONTROL_NOOP if entry.kind is not EntryKind.NORMAL else entry.data, epoch=1)
        assert info.base_offset == entry.index


def read_all(log: Log, below: int | None = None) -> list[tuple[int, bytes | None, bytes | None, bool]]:
    return [(r.offset, r.key, r.value, b.header.is_control) for b in log.batches() for r in b.records()
            if below is None or r.offset < below]


programs = st.lists(entry_cmds, min_size=30, max_size=120).map(tuple)


@settings(max_examples=int(os.environ.get("EVENT_COMPACTION_EXAMPLES", "25")), deadline=None,
          derandomize=os.environ.get("EVENT_COMPACTION_RANDOM") != "1",
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs)
def test_a_cleaned_log_rebuilds_exactly_the_applied_state(program: tuple) -> None:
    root = Path(tempfile.mkdtemp(prefix="event-compaction-"))
    try:
        model = Model(6)
        [entries], _expected = build([program], model, [])
        sm = ViewsStateMachine(root / "views", )
        try:
            sm.apply(entries)
            log = Log.open(root / "log", CFG)
            try:
                write_log(log, entries)
                original = read_all(log)
                drop = set(noops.noop_offsets(sm.store, 0, log.end_offset))
                # The reader over the original log without its no-ops is the views' state: the rows are right.
                everything = Reader()
                for offset, _, value, control in original:
                    if not control and offset not in drop:
                        everything.read(value)
                assert everything.s == views_state(sm)

                horizon = log.segment_bases()[-1]
                result = clean_log(log, horizon, THREAD, record_key_of=compaction_key, is_tombstone=is_delete,
                                   drop_offsets=lambda lo, hi: noops.noop_offsets(sm.store, lo, hi))
                end = log.clean_end_offset
                assert result.cleaned_through == end == horizon and result.noops_dropped == len(
                    [o for o in drop if o < end])
                cleaned = read_all(log)
                by_offset = {o: (k, v, c) for o, k, v, c in original}
                for offset, key, value, control in cleaned:
                    assert by_offset[offset] == (key, value, control), offset
                assert not [o for o, *_ in cleaned if o < end and o in drop], "a no-op survived"
                assert [r for r in cleaned if r[0] >= end] == [r for r in original if r[0] >= end]

                below = Reader()
                for offset, _, value, control in cleaned:
                    if offset < end and not control:
                        below.read(value)
                truth = Reader()
                for offset, _, value, control in original:
                    if offset < end and not control and offset not in drop:
                        truth.read(value)
                assert below.s == truth.s, {k: (below.s.get(k), truth.s.get(k)) for k in set(below.s) | set(truth.s) if below.s.get(k) != truth.s.get(k)}
                assert result.records_dropped > 0 or len(cleaned) == len(original)
            finally:
                log.close()
        finally:
            sm.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_deletes_leave_once_delete_retention_passed(tmp_path: Path) -> None:
    """A whole-state delete is kept while it is its entity's latest record, until delete_retention_ms after
    the newest data cleaned before it; a partial record before it goes with the entity."""
    log = Log.open(tmp_path / "log", CFG)
    try:
        def put(event: ev.Event, ts: int) -> int:
            return log.append(encode_batch([ev.event_record(event)], timestamp_ms=ts), epoch=1).base_offset
        put(ev.TopicCreated(name="t"), 1_000)
        put(ev.TopicUpdated(name="t", perm=4), 1_000)
        deleted = put(ev.TopicDeleted(name="t"), 1_000)
        put(ev.ConfigChanged(scope="s", name="n", value="1"), 1_000)
        unset = put(ev.ConfigChanged(scope="s", name="n"), 1_000)
        for i in range(200):
            put(ev.KvPut(name=f"k{i % 5}", value=b"x" * 40), 2_000 + i)
        config = CleanerConfig(delete_retention_ms=500, worker_process=False, min_cleanable_dirty_ratio=0.0)
        horizon = log.segment_bases()[-1]
        clean_log(log, horizon, config, record_key_of=compaction_key, is_tombstone=is_delete)
        first = [r[0] for r in read_all(log, horizon)]
        assert deleted in first and unset in first and 0 not in first and 1 not in first
        for i in range(200):
            put(ev.KvPut(name=f"k{i % 5}", value=b"y" * 40), 5_000 + i)
        clean_log(log, log.segment_bases()[-1], config, record_key_of=compaction_key, is_tombstone=is_delete,
                  force=True)
        second = [r[0] for r in read_all(log, horizon)]
        assert deleted not in second and unset not in second
    finally:
        log.close()


def test_aspects_and_partial_records(tmp_path: Path) -> None:
    """BrokerFenced/Unfenced supersede each other but never the registration; TopicUpdated is kept after
    the topic's creation and goes when a later whole record of the topic comes."""
    log = Log.open(tmp_path / "log", CFG)
    try:
        def put(event: ev.Event) -> int:
            return log.append(encode_batch([ev.event_record(event)], timestamp_ms=1_000), epoch=1).base_offset
        b = {"cluster": "c", "group": "g", "name": "b"}
        registered = put(ev.BrokerRegistered(**b, address="h:1", incarnation="i", broker_id=0, broker_epoch=1))
        put(ev.BrokerFenced(**b, broker_epoch=1))
        unfenced = put(ev.BrokerUnfenced(**b, broker_epoch=1))
        created = put(ev.TopicCreated(name="t"))
        updated = [put(ev.TopicUpdated(name="t", perm=p)) for p in (2, 4)]
        put(ev.TopicCreated(name="u"))
        u_updated = put(ev.TopicUpdated(name="u", perm=2))
        recreated = put(ev.TopicCreated(name="u", perm=6))   # a whole record after the update
        for i in range(200):
            put(ev.KvPut(name=f"k{i % 5}", value=b"x" * 40))
        horizon = log.segment_bases()[-1]
        clean_log(log, horizon, THREAD, record_key_of=compaction_key, is_tombstone=is_delete)
        kept = {r[0] for r in read_all(log, horizon)}
        assert {registered, unfenced, created, *updated, recreated} <= kept
        assert registered + 1 not in kept and u_updated not in kept and recreated - 2 not in kept
    finally:
        log.close()
