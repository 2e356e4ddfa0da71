"""The views format level (statemachines/views_format.py): raised by a committed event, kept by restarts
and snapshots, refused (halted on) when this code does not know it, and levels 2 and 3 answering every
read as level 1 does.

Two replicas apply the same seeded stream (tests/statemachines/crash_child.build_stream: every family of
events, rejections, retries, history floors, client sessions' batched requests), except for one entry:
`raised` raises its format to 2 or 3 there (`ViewsFormatRaised`), `level1` applies a record that changes
nothing in its place. Both are pruned at random moments. At sampled apply boundaries they must give the
same outcomes, keep the same session outcomes (at level 3 a run row read request by request), and give the
same answer to every read: get and list at the head and `as_of` from the floor to the applied offset, and
the history of every entity; after a full pruning pass, and after a restart and a snapshot restore of
`raised`, too.

Seeds are printed; replay with EPOCHLOG_VIEWS_FORMAT_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from eventlog.raft.types import Entry, EntryKind, SnapshotMeta
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines import views_format
from statemachines.query import Query
from statemachines.state import decode_version
from statemachines.store import DIGEST, cf_for, decode_offset
from statemachines.views import ViewsStateMachine
from tests.statemachines.crash_child import CONFIG, build_stream
from tests.statemachines.test_kept_outcomes import _kept_per_request
from tests.statemachines.test_prune import _entities, _offsets, _reads
from tests.support.seeds import collection_seeds


def _seeds() -> list[int]:
    env = os.environ.get("EPOCHLOG_VIEWS_FORMAT_SEED")
    return [int(env)] if env else collection_seeds("test_a_raised_level_answers_every_read_as_level_1", 2)


def _entry(index: int, term: int, *events: ev.Event, timestamp_ms: int = 0) -> Entry:
    """An entry of `events` at `index`; timestamp 0 leaves the committed clock where it is."""
    data = bytearray(encode_batch([ev.event_record(e) for e in events], timestamp_ms=timestamp_ms))
    stamp(data, index, term)
    return Entry(index, term, len(events), EntryKind.NORMAL, bytes(data))


RAISE = ev.ViewsFormatRaised(level=2, v=2, actor="epochlog/leader")


def _raise(level: int) -> ev.ViewsFormatRaised:
    return ev.ViewsFormatRaised(level=level, v=level, actor="epochlog/leader")
NOTHING = ev.HistoryPruned(floor=0, actor="epochlog/compaction")   # never lowers a floor: changes no read


def _hidden_at_level_2(sm: ViewsStateMachine, floor: int) -> list[bytes]:
    """Rows a complete pass must have deleted: per entity, every row at or below the floor but its newest
    state there, which is the entity row itself when that one is at or below the floor."""
    rows: dict[bytes, list[tuple[int, bytes, bool]]] = {}
    for k, v in sm.store.scan("versions", b""):
        offset = decode_offset(k[-8:])
        if offset <= floor:
            rows.setdefault(k[:-9], []).append((offset, k, decode_version(v).state is None))
    hidden: list[bytes] = []
    for entity, below in rows.items():
        hidden += [k for _, k, _ in below[:-1]]
        offset, key, deleted = below[-1]
        current = Query(sm.store)._current_state(entity)
        newer = current is not None and offset < current.version <= floor  # type: ignore[attr-defined]
        if (deleted and offset < floor) or newer:
            hidden.append(key)
    return hidden


@pytest.mark.parametrize("level", [2, views_format.OUTCOME_RUNS])
@pytest.mark.parametrize("seed", _seeds())
def test_a_raised_level_answers_every_read_as_level_1(tmp_path: Path, seed: int, level: int) -> None:
    print(f"seed={seed} (EPOCHLOG_VIEWS_FORMAT_SEED={seed} replays)")
    rng = random.Random(seed)
    stream = build_stream(seed, 700, history_floors=True, client_sessions=True)
    noops = [i for i, e in enumerate(stream.entries) if e.kind is EntryKind.NOOP]
    at = rng.choice(noops[:1] + noops)   # the first leader's noop (a new cluster) or a later one (an upgrade)
    where = stream.entries[at]
    entries1 = list(stream.entries)
    entries2 = list(stream.entries)
    entries1[at] = _entry(where.index, where.term, NOTHING)
    entries2[at] = _entry(where.index, where.term, _raise(level))
    level1 = ViewsStateMachine(tmp_path / "level1", CONFIG)
    raised = ViewsStateMachine(tmp_path / "raised", CONFIG)
    compared = 0
    try:
        for i, (lo, hi) in enumerate(stream.batches):
            got1, got2 = level1.apply(entries1[lo:hi]), raised.apply(entries2[lo:hi])
            got1.pop(where.index, None)
            raise_outcome = got2.pop(where.index, None)
            assert raise_outcome is None or raise_outcome.ok, raise_outcome
            assert got1 == got2
            assert _kept_per_request(raised) == _kept_per_request(level1)
            for sm in (level1, raised):
                while rng.random() < 0.4:
                    sm.prune_step(rng.choice((1, 3, 10, 50, 400)), eager=rng.random() < 0.5)
            if rng.random() < 0.06 or i == len(stream.batches) - 1:
                applied = level1.applied_index
                assert raised.applied_index == applied
                floor = level1.store.history_floor
                entities = _entities(level1)
                offsets = _offsets(rng, floor, applied)
                assert _reads(Query(raised.store, "g"), entities, offsets) == _reads(Query(level1.store, "g"),
                                                                                      entities, offsets)
                compared += 1
        assert raised.applier.level == level and level1.applier.level == 1
        floor = level1.store.history_floor
        assert floor > 0, "the stream raised the floor"
        for sm in (level1, raised):
            while sm.pruner.busy or sm.pruner.counters.pruned_floor < floor:
                sm.prune_step(100, eager=True)
        assert not _hidden_at_level_2(raised, floor)
        rows1 = sum(1 for _ in level1.store.scan("versions", b""))
        rows2 = sum(1 for _ in raised.store.scan("versions", b""))
        entities = _entities(level1)
        offsets = _offsets(rng, floor, level1.applied_index)
        want = _reads(Query(level1.store), entities, offsets)
        assert _reads(Query(raised.store), entities, offsets) == want

        # A restart and a snapshot keep the level and the answers.
        raised.close()
        raised = ViewsStateMachine(tmp_path / "raised", CONFIG)
        assert raised.applier.level == level
        assert _reads(Query(raised.store), entities, offsets) == want
        snapshot = tmp_path / "snap.tar"
        raised.write_snapshot(snapshot)
        restored = ViewsStateMachine(tmp_path / "restored", CONFIG)
        try:
            restored.restore(snapshot, SnapshotMeta(raised.applied_index, 1, ()))  # type: ignore[call-arg]
            assert restored.applier.level == level and restored.digest == raised.digest
            assert _reads(Query(restored.store), entities, offsets) == want
        finally:
            restored.close()
        print(f"raised at offset {where.index}, floor {floor}, applied {level1.applied_index}: versions rows "
              f"{rows1} at level 1, {rows2} at level {level} (pruned to the floor); reads compared at {compared} "
              f"boundaries")
        assert rows2 < rows1
    finally:
        level1.close()
        raised.close()


def test_a_raise_is_kept_once_chained_into_the_digest_and_never_lowered(tmp_path: Path) -> None:
    sm = ViewsStateMachine(tmp_path / "v", CONFIG)
    other = ViewsStateMachine(tmp_path / "other", CONFIG)
    try:
        put = ev.KvPut(name="a", value=b"1")
        assert sm.apply([_entry(0, 1, put)]) == other.apply([_entry(0, 1, put)])
        assert sm.store.meta(views_format.META_KEY) is None and sm.applier.level == 1   # no key: level 1
        outcomes = sm.apply([_entry(1, 1, RAISE, RAISE)])
        other.apply([_entry(1, 1, NOTHING, NOTHING)])
        assert [o.ok for o in outcomes.values()] == [True, False]
        assert outcomes[2].code == "condition_failed" and "at level 2 already" in outcomes[2].message
        assert views_format.decode_level(sm.store.meta(views_format.META_KEY)) == 2
        assert sm.store.meta(DIGEST) != other.store.meta(DIGEST)
        # The second put of `a` moves its first state to `versions`; a first put of `b` writes no row.
        sm.apply([_entry(3, 1, ev.KvPut(name="a", value=b"2"), ev.KvPut(name="b", value=b"1"))])
        keys = [k for k, _ in sm.store.scan("versions", b"")]
        assert keys == [b"kv/a\x00" + (0).to_bytes(8, "big")]
        assert [r.offset for r in Query(sm.store).history("kv/a")] == [0, 3]
        assert [(r.offset, r.event) for r in Query(sm.store).history("kv/b")] == [(4, "KvPut")]
        with pytest.raises(ev.EventError):
            ev.event_record(ev.ViewsFormatRaised(level=2))   # v must equal the level
        with pytest.raises(ev.EventError):
            ev.event_record(ev.ViewsFormatRaised(level=1, v=1))
    finally:
        sm.close()
        other.close()


def test_a_level_this_code_does_not_know_halts_the_group_before_it(tmp_path: Path) -> None:
    """A newer Epochlog's raise (schema version = its level) stops this node before the entry: it never
    applies that entry's records at the wrong level; the level stays where it was."""
    newer = ev.encode_event(ev.ViewsFormatRaised(level=views_format.LATEST + 1, v=views_format.LATEST + 1))
    sm = ViewsStateMachine(tmp_path / "v", CONFIG)
    try:
        sm.apply([_entry(0, 1, RAISE)])
        data = bytearray(encode_batch([(b"views/format", newer), ev.event_record(ev.KvPut(name="x", value=b"1"))],
                                      timestamp_ms=0))
        stamp(data, 1, 1)
        outcomes = sm.apply([Entry(1, 1, 2, EntryKind.NORMAL, bytes(data))])
        assert sm.halt is not None and sm.halt.offset == 1
        assert "newer than this Epochlog knows" in sm.halt.reason
        assert {o.code for o in outcomes.values()} == {"group_halted"}
        assert sm.applied_index == 0 and sm.applier.level == 2
        assert sm.store.get(cf_for(b"kv/x"), b"kv/x") is None
    finally:
        sm.close()


def test_level_to_propose_waits_for_every_member_and_only_raises() -> None:
    assert views_format.level_to_propose(1, [2, 2, 2]) == 2
    assert views_format.level_to_propose(1, [2, None, 2]) is None     # a member not heard yet
    assert views_format.level_to_propose(1, [2, 1, 2]) is None        # an older member: stay
    assert views_format.level_to_propose(2, [2, 2, 2]) is None        # there already
    assert views_format.level_to_propose(1, [9, 9]) == views_format.LATEST   # never past what this code knows
    assert views_format.level_to_propose(1, []) is None
