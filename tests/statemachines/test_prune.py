"""History pruning below the committed floor (statemachines/prune.py, query.py, apply.py).

Two replicas apply the same seeded stream (tests/statemachines/crash_child.build_stream with HistoryPruned
events, every family of events, rejections and retries): `pruned` runs prune steps of random sizes at
random moments between apply calls, `kept` never deletes a row. At sampled apply boundaries both
must hold the same digest (pruning is outside it) and give the same answer to every read: get and
list at the head and `as_of` from the floor to the applied offset, `compacted` naming the floor and
the Delta archive below it, and the history of every entity (which starts at the floor). Once a pass
completes, no row the floor hides is left, and rows were deleted. A reopened pruned replica answers
the same again.

Seeds are printed; replay with EPOCHLOG_PRUNE_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from eventlog.raft.errors import CompactedError
from statemachines.query import MAX_LIMIT, Query
from statemachines.state import decode_version
from statemachines.store import decode_offset
from statemachines.views import ViewsStateMachine
from tests.statemachines.crash_child import CONFIG, build_stream
from tests.support.seeds import collection_seeds


def _seeds() -> list[int]:
    env = os.environ.get("EPOCHLOG_PRUNE_SEED")
    return [int(env)] if env else collection_seeds("test_pruned_and_unpruned_replicas_answer_alike", 2)


def _answer(call):  # type: ignore[no-untyped-def]
    try:
        return ("ok", call())
    except CompactedError as exc:
        return ("compacted", str(exc))


def _entities(sm: ViewsStateMachine) -> list[str]:
    return sorted({k[:-9].decode() for k, _ in sm.store.scan("versions", b"")})


def _reads(q: Query, entities: list[str], offsets: list[int]) -> list[object]:
    out: list[object] = [q.history_floor]
    prefixes = sorted({e.split("/", 1)[0] + "/" for e in entities})
    for as_of in (None, *offsets):
        out += [_answer(lambda k=k: q.get(k, as_of=as_of)) for k in entities]
        out += [_answer(lambda p=p: q.list(p, limit=MAX_LIMIT, as_of=as_of)) for p in prefixes]
    out += [q.history(k, limit=MAX_LIMIT) for k in entities]
    return out


def _offsets(rng: random.Random, floor: int, applied: int) -> list[int]:
    picks = {floor - 1, floor, floor + 1, applied, -1}
    picks |= {rng.randint(max(0, floor - 50), max(0, applied)) for _ in range(5)}
    return sorted(o for o in picks if -1 <= o <= applied)


def _hidden_rows(sm: ViewsStateMachine, floor: int) -> list[bytes]:
    """Rows the floor hides that are still there: per entity, any row at or below the floor but its
    newest one, and that one too if it is a deletion below the floor."""
    hidden: list[bytes] = []
    rows: dict[bytes, list[tuple[int, bytes, bool]]] = {}
    for k, v in sm.store.scan("versions", b""):
        offset = decode_offset(k[-8:])
        if offset <= floor:
            rows.setdefault(k[:-9], []).append((offset, k, decode_version(v).state is None))
    for below in rows.values():
        hidden += [k for _, k, _ in below[:-1]]
        if below[-1][2] and below[-1][0] < floor:
            hidden.append(below[-1][1])
    return hidden


@pytest.mark.parametrize("seed", _seeds())
def test_pruned_and_unpruned_replicas_answer_alike(tmp_path: Path, seed: int) -> None:
    print(f"seed={seed} (EPOCHLOG_PRUNE_SEED={seed} replays)")
    rng = random.Random(seed)
    stream = build_stream(seed, 700, history_floors=True)
    pruned = ViewsStateMachine(tmp_path / "pruned", CONFIG)
    kept = ViewsStateMachine(tmp_path / "kept", CONFIG)
    deleted = passes = compared = 0
    try:
        for i, batch in enumerate(stream.batches_after(-1)):
            assert pruned.apply(batch) == kept.apply(batch)
            while rng.random() < 0.5:
                step = pruned.prune_step(rng.choice((1, 3, 10, 50, 400)), eager=rng.random() < 0.5)
                deleted += step.deleted
                if step.pass_done:
                    passes += 1
                    assert not _hidden_rows(pruned, pruned.pruner.counters.pruned_floor)
            if rng.random() < 0.06 or i == len(stream.batches) - 1:
                applied = kept.applied_index
                assert pruned.applied_index == applied and pruned.digest == kept.digest
                floor = kept.store.history_floor
                entities = _entities(kept)
                offsets = _offsets(rng, floor, applied)
                assert _reads(Query(pruned.store, "g"), entities, offsets) == _reads(Query(kept.store, "g"),
                                                                                      entities, offsets)
                compared += 1
        floor = kept.store.history_floor
        assert floor > 0, "the stream raised the floor"
        while pruned.pruner.busy or pruned.pruner.counters.pruned_floor < floor:
            pruned.prune_step(100, eager=True)
        assert not _hidden_rows(pruned, floor)
        assert _hidden_rows(kept, floor), "the unpruned replica keeps rows the floor hides"
        pruned.close()
        pruned = ViewsStateMachine(tmp_path / "pruned", CONFIG)
        entities = _entities(kept)
        offsets = _offsets(rng, floor, kept.applied_index)
        assert _reads(Query(pruned.store), entities, offsets) == _reads(Query(kept.store), entities, offsets)
        print(f"floor {floor}, applied {kept.applied_index}: {deleted} rows deleted in {passes} passes; "
              f"reads compared at {compared} boundaries")
        assert deleted > 0
    finally:
        pruned.close()
        kept.close()


def test_as_of_below_the_floor_names_the_floor_and_the_archive(tmp_path: Path) -> None:
    stream = build_stream(7, 400, history_floors=True)
    sm = ViewsStateMachine(tmp_path / "v", CONFIG)
    try:
        for batch in stream.batches_after(-1):
            sm.apply(batch)
        floor = sm.store.history_floor
        assert floor > 0
        entity = _entities(sm)[0]
        with pytest.raises(CompactedError) as info:
            Query(sm.store, "kv").get(entity, as_of=floor - 1)
        message = str(info.value)
        assert info.value.code == "compacted"
        assert f"below the history floor {floor} of group kv" in message
        assert f"epochlog audit state --table PATH --offset {floor - 1} --group kv" in message
        Query(sm.store).get(entity, as_of=floor)   # at the floor: answered
        assert Query(sm.store).get(entity, as_of=-1) is None   # before anything: nothing, never an error
    finally:
        sm.close()


def test_a_floor_is_never_lowered_nor_beyond_its_offset(tmp_path: Path) -> None:
    from eventlog.raft.types import Entry, EntryKind
    from eventlog.records import encode_batch, stamp
    from statemachines import events as ev

    def entry(index: int, floor: int) -> Entry:
        data = bytearray(encode_batch([ev.event_record(ev.HistoryPruned(floor=floor))], timestamp_ms=1))
        stamp(data, index, 1)
        return Entry(index, 1, 1, EntryKind.NORMAL, bytes(data))

    sm = ViewsStateMachine(tmp_path / "v", CONFIG)
    try:
        outcomes = sm.apply([entry(0, 0), entry(1, 1), entry(2, 0), entry(3, 9)])
        assert [o.ok for o in outcomes.values()] == [True, True, True, False]
        assert outcomes[3].code == "invalid_argument"
        assert sm.store.history_floor == 1
    finally:
        sm.close()


def test_floors_apply_alike_whatever_the_apply_calls(tmp_path: Path) -> None:
    """Floors evict request ids inside apply, a bounded number per entry: replicas that group the
    same entries into other apply calls hold identical views (every column family) and digest."""
    from tests.statemachines.harness import dump

    stream = build_stream(11, 900, history_floors=True)
    singly = ViewsStateMachine(tmp_path / "singly", CONFIG)
    at_once = ViewsStateMachine(tmp_path / "at-once", CONFIG)
    try:
        for batch in stream.batches_after(-1):
            for entry in batch:
                singly.apply([entry])
        at_once.apply(stream.entries)
        assert singly.digest == at_once.digest and singly.store.history_floor > 0
        assert dump(singly.store) == dump(at_once.store)
    finally:
        singly.close()
        at_once.close()


def test_request_ids_below_the_floor_are_forgotten_in_bounded_steps(tmp_path: Path) -> None:
    from eventlog.raft.types import Entry, EntryKind
    from eventlog.records import encode_batch, stamp
    from statemachines import events as ev
    from statemachines.apply import EVICT_PER_ENTRY
    from statemachines.store import ViewsConfig

    def entry(index: int, event: ev.Event) -> Entry:
        data = bytearray(encode_batch([ev.event_record(event)], timestamp_ms=1))
        stamp(data, index, 1)
        return Entry(index, 1, 1, EntryKind.NORMAL, bytes(data))

    sm = ViewsStateMachine(tmp_path / "v", ViewsConfig(dedupe_window_offsets=1_000_000))
    try:
        n = 2 * EVICT_PER_ENTRY + 500
        sm.apply([entry(i, ev.KvPut(name=f"k{i % 7}", value=b"v", actor="a", request_id=f"r{i}")) for i in range(n)])
        assert sum(1 for _ in sm.store.scan("dedupe", b"")) == n
        # The floor jumps past every request id; a retry of one below it is applied afresh.
        out = sm.apply([entry(n, ev.HistoryPruned(floor=n)),
                        entry(n + 1, ev.KvPut(name="k0", value=b"again", actor="a", request_id="r3"))])
        assert out[n + 1].ok and not out[n + 1].duplicate and out[n + 1].offset == n + 1
        left = sum(1 for _ in sm.store.scan("dedupe_expiry", b""))
        assert left >= n - 2 * (EVICT_PER_ENTRY + 1), "at most EVICT_PER_ENTRY (+ its records) per entry"
        # A retry above the floor is still answered with its first outcome.
        out = sm.apply([entry(n + 2, ev.KvPut(name="k0", value=b"again", actor="a", request_id="r3"))])
        assert out[n + 2].duplicate and out[n + 2].offset == n + 1
        for i in range(n + 3, n + 6):
            sm.apply([entry(i, ev.KvPut(name="x", value=b"v"))])
        expiry = [decode_offset(k[:8]) for k, _ in sm.store.scan("dedupe_expiry", b"")]
        assert expiry and min(expiry) >= n, expiry[:5]
    finally:
        sm.close()
