"""Records the applier cannot apply: halted before them (newer schema, applier bug) or rejected alike
(no version applies them); a halted group resumes after an upgrade or an operator's skip; the
leader's check (`event_record`) and the applier agree on what can be applied.

Real RocksDB views in temporary directories; entries are built as the Raft log holds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import apply
from statemachines import events as ev
from statemachines.views import ViewsStateMachine
from tests.support.seeds import soak

NEWER = ev.KvPut.VERSION + 1   # a schema version only a newer Epochlog knows


def _raw(event: ev.Event, **changes: object) -> bytes:
    """The record value a writer that does not check (an old node, a newer one) would produce."""
    raw = msgspec.msgpack.decode(ev.encode_event(event))
    raw.update(changes)
    return msgspec.msgpack.encode(raw)


class LogBuilder:
    """Entries of one group's log: one NORMAL entry per call to `add`, offsets contiguous."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.next = 0

    def add(self, *records: tuple[bytes, bytes]) -> Entry:
        data = bytearray(encode_batch(list(records), timestamp_ms=1_700_000_000_000 + self.next))
        stamp(data, self.next, 1)
        entry = Entry(self.next, 1, len(records), EntryKind.NORMAL, bytes(data))
        self.entries.append(entry)
        self.next += len(records)
        return entry

    def put(self, name: str, value: bytes = b"v", **kw: Any) -> Entry:
        return self.add(ev.event_record(ev.KvPut(name=name, value=value, **kw)))

    def noop(self) -> Entry:
        entry = Entry(self.next, 1, 1, EntryKind.NOOP)
        self.entries.append(entry)
        self.next += 1
        return entry


def _poisoned_log() -> tuple[LogBuilder, int]:
    """A log with a KvPut of a newer schema version in the middle of an entry, writes before and after."""
    log = LogBuilder()
    log.put("a", request_id="r-a")
    log.noop()
    ok = ev.event_record(ev.KvPut(name="b", value=b"before, same entry"))
    poison = (b"kv/poison", _raw(ev.KvPut(name="poison", value=b"x"), v=NEWER))
    entry = log.add(ok, poison)
    log.put("c", request_id="r-c")
    log.put("a", value=b"v2")
    return log, entry.index + 1


def test_a_newer_record_halts_before_its_entry_and_a_replay_halts_at_the_same_place(views_dir: Any) -> None:
    log, poison = _poisoned_log()
    sm = views_dir("n1")
    outcomes = sm.apply(log.entries)
    assert sm.halt is not None and sm.halt.offset == poison
    assert f"KvPut version {NEWER} is newer than this Epochlog knows ({NEWER - 1})" in sm.halt.reason
    assert "upgrade this node" in sm.halt.fix
    assert "epochlog group skip --group kv --offset" in sm.halt.describe("kv")
    # The views end before the poisoned entry: the other record of that entry is not applied either.
    assert sm.applied_index == poison - 2
    assert outcomes[0].ok and outcomes[poison - 1].code == apply.HALTED
    assert all(outcomes[o].code == apply.HALTED for o in range(poison - 1, log.next))
    assert sm.store.get("kv", b"kv/b") is None and sm.store.get("kv", b"kv/c") is None
    # More entries handed over while halted are not applied (and do not raise).
    more = LogBuilder()
    more.next = log.next
    later = more.put("d")
    assert sm.apply([later])[later.index].code == apply.HALTED and sm.applied_index == poison - 2
    assert sm.on_tick(True) == [], "a halted group proposes nothing (its lease clocks would be stale)"
    sm.close()
    # A restart replays from the applied offset and halts at the same record: no crash loop.
    again = views_dir("n1")
    assert again.applied_index == poison - 2
    again.apply([e for e in log.entries if e.last_index > again.applied_index])
    assert again.halt is not None and again.halt.offset == poison and again.applied_index == poison - 2


def test_an_upgraded_node_applies_it_and_ends_with_the_digest_of_a_node_that_always_could(
        views_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, poison = _poisoned_log()
    old = views_dir("old")
    old.apply(log.entries)
    assert old.halt is not None
    old.close()
    monkeypatch.setattr(ev.KvPut, "VERSION", NEWER)   # this process now "knows" the newer KvPut: an upgraded node
    upgraded = views_dir("old")
    upgraded.apply([e for e in log.entries if e.last_index > upgraded.applied_index])
    newer = views_dir("newer")
    newer.apply(log.entries)
    assert upgraded.halt is None and newer.halt is None
    assert upgraded.applied_index == newer.applied_index == log.next - 1
    assert upgraded.digest == newer.digest
    assert upgraded.store.get("kv", b"kv/poison") is not None


def test_a_skip_is_a_rejection_alike_on_every_replica_and_survives_a_replay(views_dir: Any) -> None:
    log, poison = _poisoned_log()
    replicas = [views_dir(f"n{i}") for i in range(2)]
    handed_out = log.next - 1
    for sm in replicas:
        sm.apply(log.entries[:2])          # one replica applies in several calls, the other in one
        sm.apply(log.entries[2:])
        with pytest.raises(ev.EventError, match="only the record it halted at"):
            sm.skip(poison - 1)
        sm.skip(poison)
        # While halted, the group kept handing entries over; resume reads them again from the log.
        halt = sm.resume(lambda offset: [e for e in log.entries if e.last_index >= offset][:1], lambda: handed_out)
        while halt is not None and sm.applied_index < handed_out:
            halt = sm.resume(lambda offset: [e for e in log.entries if e.last_index >= offset][:1], lambda: handed_out)
        assert halt is None and sm.halt is None and sm.applied_index == handed_out
    a, b = replicas
    assert a.digest == b.digest
    assert a.store.get("kv", b"kv/b") is not None, "the other record of the poisoned entry is applied"
    assert a.store.get("kv", b"kv/poison") is None
    a.close()
    # A replay from scratch of the same log with the skip remembered gives the same digest.
    replay_dir = views_dir("replay")
    replay_dir.apply(log.entries)
    replay_dir.skip(poison)
    replay_dir.resume(lambda offset: [e for e in log.entries if e.last_index >= offset], lambda: handed_out)
    assert replay_dir.digest == b.digest
    reopened = views_dir("n0")
    assert reopened.applier.skipped == {poison} and reopened.halt is None
    # Its outcome, for whoever asks again: skipped, changing nothing.
    fresh = views_dir("fresh")
    fresh.applier.skipped = frozenset({poison})
    out = fresh.apply(log.entries)
    assert fresh.halt is None and out[poison].code == apply.SKIPPED_CODE and not out[poison].ok
    assert fresh.digest == b.digest


def test_an_unknown_type_or_a_newer_txn_operation_halts_a_malformed_record_is_rejected(views_dir: Any) -> None:
    cases: list[tuple[bytes, str | None]] = [
        (_raw(ev.KvPut(name="x", value=b"1"), type="QuotaChanged"), "unknown event type 'QuotaChanged'"),
        (ev.encode_event(ev.Txn(ops=(ev.KvPut(name="x", value=b"1"), ev.KvDeleted(name="y", v=NEWER)))),
         f"KvDeleted version {NEWER}"),
        (b"\x93not an event", None),
        (_raw(ev.KvPut(name="x", value=b"1"), lease=-4), None),                 # invalid field: rejected
        (_raw(ev.KvPut(name="x", value=b"1"), value="a str, not bin"), None),   # wrong type: rejected
        (b"\x83\xa4type\xa5KvPut\xa4name\xa2\xff\xfe\xa5value\xc4\x01c", None),     # not UTF-8: rejected
        (b"\x83\xa4type\xa5Kv\x8eut\xa4name\xa1x\xa5value\xc4\x01c", None),         # a type tag not UTF-8
    ]
    for i, (value, halts) in enumerate(cases):
        log = LogBuilder()
        log.add((b"kv/x", value))
        log.put("after")
        digests = []
        for replica in ("a", "b"):
            sm = views_dir(f"case{i}{replica}")
            outcomes = sm.apply(log.entries)
            if halts:
                assert sm.halt is not None and halts in sm.halt.reason and sm.applied_index == -1, (i, sm.halt)
            else:
                assert sm.halt is None and sm.applied_index == 1, (i, sm.halt)
                assert not outcomes[0].ok and outcomes[0].code == "invalid_argument" and outcomes[1].ok
            digests.append(sm.digest)
        assert digests[0] == digests[1]


def test_deep_nesting_in_an_unknown_field_halts_instead_of_crashing(views_dir: Any) -> None:
    deep = msgspec.msgpack.encode({"type": "KvPut", "v": 1, "name": "x", "value": b"1"})
    deep = b"\x85" + deep[1:] + b"\xa4deep" + b"\x91" * 100_000 + b"\x00"
    log = LogBuilder()
    log.add((b"kv/x", deep))
    sm = views_dir("deep")
    sm.apply(log.entries)
    assert sm.halt is not None and "nested too deeply" in sm.halt.reason


def test_an_entry_whose_batch_does_not_parse_halts_and_can_be_skipped_whole(views_dir: Any) -> None:
    log = LogBuilder()
    log.put("a")
    broken = Entry(log.next, 1, 2, EntryKind.NORMAL, b"\x00" * 70)    # what a writer's bug could leave
    log.entries.append(broken)
    log.next += 2
    log.put("b")
    sm = views_dir("batch")
    sm.apply(log.entries)
    assert sm.halt is not None and sm.halt.offset == broken.index and "does not parse" in sm.halt.reason
    sm.skip(broken.index)
    assert sm.resume(lambda offset: [e for e in log.entries if e.last_index >= offset], lambda: log.next - 1) is None
    assert sm.applied_index == log.next - 1 and sm.store.get("kv", b"kv/b") is not None


def test_a_handler_bug_halts_and_is_not_hidden_as_a_rejection(views_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setitem(apply._HANDLERS, ev.KvDeleted, broken)
    log = LogBuilder()
    log.put("x")
    log.add(ev.event_record(ev.KvDeleted(name="x")))
    sm = views_dir("bug")
    sm.apply(log.entries)
    assert sm.halt is not None and sm.halt.offset == 1 and "KeyError" in sm.halt.reason and sm.applied_index == 0


# --- the leader's check and the applier agree ------------------------------------------------------

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=12) | st.binary(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
_INTS = st.sampled_from([-2**63, -5, -1, 0, 1, 2, 3, 99, 1024, 1025, 2**31, 2**63 - 1, 2**64 - 1])


def _mutations(event: ev.Event) -> st.SearchStrategy[dict[str, Any]]:
    raw = msgspec.to_builtins(event)
    fields = [k for k in raw if k != "type"]
    edits = st.dictionaries(st.sampled_from(fields), _INTS | _VALUES | st.sampled_from(["", "a/b", "x" * 1025]),
                            max_size=3)
    return edits.map(lambda e: {**raw, **e})


_EXAMPLES: list[ev.Event] = [
    ev.KvPut(name="app/x", value=b"1", lease=0, expected_version=0),
    ev.KvDeleted(name="app/x", expected_version=3),
    ev.LeaseGranted(lease_id=7, ttl_ms=1000),
    ev.LeaseRevoked(lease_id=7),
    ev.SessionOpened(client_id="c", lease=0),
    ev.SessionClosed(client_id="c"),
    ev.Txn(conditions=(ev.Condition("kv/app/x", 0),), ops=(ev.KvPut(name="app/x", value=b"1"),)),
    ev.OffsetCommitted(consumer_group="g", topic="t", queue_id=0, offset=1),
    ev.TopicCreated(name="t"),
    ev.TopicUpdated(name="t", perm=6),
    ev.ConfigChanged(scope="s", name="n", value="v"),
    ev.BrokerRegistered(cluster="c", group="g", name="b", address="h:1", incarnation="i", broker_id=0,
                        broker_epoch=1),
    ev.BrokerFenced(cluster="c", group="g", name="b", broker_epoch=1),
    ev.SyncStateSetChanged(cluster="c", group="g", sync_state_set=(0,), master_epoch=1, sync_state_set_epoch=1),
    ev.MasterElected(cluster="c", group="g", master=0, master_epoch=0),
]


@pytest.fixture(scope="module")
def shared_views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ViewsStateMachine, LogBuilder]]:
    """One views database for every example (opening RocksDB costs more than an example)."""
    sm = ViewsStateMachine(tmp_path_factory.mktemp("property") / "kv")
    yield sm, LogBuilder()
    sm.close()


@settings(max_examples=soak(150), deadline=None,   # 300 before the suite's time bound; EPOCHLOG_SOAK=<k>: k times
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_what_the_leader_accepts_the_applier_applies_or_rejects_never_halts(
        shared_views: tuple[ViewsStateMachine, LogBuilder], data: st.DataObject) -> None:
    """Mutated events (wrong types, out-of-range numbers, bad names, newer versions): whatever
    `event_record` accepts, the applier applies or rejects with a known code, and never halts on."""
    records: list[tuple[bytes, bytes]] = []
    for _ in range(data.draw(st.integers(1, 6))):
        example = data.draw(st.sampled_from(_EXAMPLES))
        fields = data.draw(_mutations(example))
        try:
            event = msgspec.convert(fields, type(example))
        except msgspec.ValidationError:
            continue   # the protocol decoder would refuse it before the node sees it
        try:
            records.append(ev.event_record(event))
        except ev.EventError as exc:
            assert exc.code == "invalid_argument"
    if not records:
        return
    sm, log = shared_views
    entry = log.add(*records)
    outcomes = sm.apply([entry])
    assert sm.halt is None, sm.halt
    assert sm.applied_index == log.next - 1
    known = {"", "invalid_argument", "not_found", "already_exists", "version_mismatch", "stale_epoch",
             "condition_failed"}
    assert all(o.code in known for o in outcomes.values()), outcomes
