"""The views are a function of the entries: not of how they were grouped into apply calls, and not
of whether a replica got there by applying them or by installing a snapshot part way.

Compared byte for byte: the digest, and a dump of every column family (the default one, holding
the applied offset and the digest, included). Event sequences are the model test's
(`tests/statemachines/harness.py`), so they hold every family, rejections, retries and bad records.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.raft.types import Entry, EntryKind, SnapshotMeta
from eventlog.records import RecordBatch, encode_batch, stamp
from statemachines.query import Query
from statemachines.state import Outcome
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine
from tests.statemachines.harness import (
    SHRINK_TIMEOUT_S,
    build,
    check_history,
    check_internals,
    check_outcomes,
    check_reads,
    dump,
    programs,
    read_everything,
)
from tests.statemachines.model import Model
from tests.support.seeds import soak

WINDOW = 6
CONFIG = ViewsConfig(dedupe_window_offsets=WINDOW)
# A fixed set of examples (derandomize); EPOCHLOG_SOAK=<k> runs k times as many (tests/support/seeds.py).
SETTINGS = settings(max_examples=soak(15), deadline=None, database=None, derandomize=True, print_blob=True)


class Replica:
    """A ViewsStateMachine in its own temporary directory."""

    def __init__(self, root: Path, name: str) -> None:
        self.dir = root / name
        self.sm = ViewsStateMachine(self.dir, CONFIG)
        self.outcomes: dict[int, Outcome] = {}

    def apply(self, calls: Sequence[Sequence[Entry]]) -> None:
        for call in calls:
            got = self.sm.apply(call)
            assert not got.keys() & self.outcomes.keys()
            self.outcomes.update(got)

    def reopen(self) -> None:
        self.sm.close()
        self.sm = ViewsStateMachine(self.dir, CONFIG)

    @property
    def query(self) -> Query:
        return Query(self.sm.store)


def _entries(program: tuple) -> tuple[list[Entry], Model, dict]:
    model = Model(WINDOW)
    [entries], expected = build([program], model, [])
    return entries, model, expected


def _chunks(entries: list[Entry], cuts: list[bool]) -> list[list[Entry]]:
    """Split after entry i when cuts[i] (cuts is cycled)."""
    out: list[list[Entry]] = [[]]
    for i, entry in enumerate(entries):
        out[-1].append(entry)
        if cuts[i % len(cuts)] and i < len(entries) - 1:
            out.append([])
    return out


def _one_record_per_entry(entries: list[Entry]) -> list[Entry]:
    """The same records (with their timestamps: the committed clock reads them), each in an entry of its
    own (NOOP entries kept)."""
    out = []
    for entry in entries:
        if entry.kind is not EntryKind.NORMAL:
            out.append(entry)
            continue
        for record in RecordBatch.parse(entry.data).records():
            data = bytearray(encode_batch([(record.key, record.value)], timestamp_ms=record.timestamp))
            stamp(data, record.offset, entry.term)
            out.append(Entry(record.offset, entry.term, 1, EntryKind.NORMAL, bytes(data)))
    return out


def _without_digest(tables: dict[str, list[tuple[bytes, bytes]]]) -> dict[str, list[tuple[bytes, bytes]]]:
    return {cf: [(k, v) for k, v in rows if (cf, k) != ("default", b"digest")] for cf, rows in tables.items()}


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
@SETTINGS
@given(program=programs, cuts=st.lists(st.booleans(), min_size=1, max_size=16))
def test_apply_call_grouping_does_not_change_the_views(program: tuple, cuts: list[bool]) -> None:
    entries, model, expected = _entries(program)
    root = Path(tempfile.mkdtemp(prefix="views-determinism-"))
    replicas = {name: Replica(root, name) for name in ("singly", "chunks", "at-once", "records-split")}
    try:
        replicas["singly"].apply([[e] for e in entries])
        replicas["chunks"].apply(_chunks(entries, cuts))
        replicas["at-once"].apply([entries])
        replicas["records-split"].apply([_one_record_per_entry(entries)])
        for r in replicas.values():
            check_outcomes(r.outcomes, expected)
            check_internals(r.sm.store, model)

        reference = replicas["singly"]
        for name in ("chunks", "at-once"):
            assert replicas[name].sm.digest == reference.sm.digest, name
            assert dump(replicas[name].sm.store) == dump(reference.sm.store), name
        assert len(reference.sm.digest) == 32

        # Other entry boundaries chain the digest at other points, but the views themselves are a
        # function of the records: everything else is the same.
        split = replicas["records-split"]
        assert _without_digest(dump(split.sm.store)) == _without_digest(dump(reference.sm.store))
        if any(e.kind is EntryKind.NORMAL and e.count > 1 for e in entries):
            assert split.sm.digest != reference.sm.digest, "the digest chains per entry"
    finally:
        for r in replicas.values():
            r.sm.close()
        shutil.rmtree(root, ignore_errors=True)


def _impostor(entry: Entry, other: Entry) -> Entry:
    """`other`'s records at `entry`'s index, in a later term: what a new leader may put where `entry` was."""
    data = bytearray(other.data)
    stamp(data, entry.index, entry.term + 1)
    return Entry(entry.index, entry.term + 1, other.count, EntryKind.NORMAL, bytes(data))


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
@SETTINGS
@given(program=programs, plan=st.lists(st.sampled_from(["no", "same", "impostor", "written"]), min_size=1,
                                       max_size=16))
def test_preparing_an_apply_before_the_commit_does_not_change_the_views(program: tuple, plan: list[str]) -> None:
    """A leader prepares applying each entry before it commits (`ViewsStateMachine.speculate`): the commit
    writes what was prepared ("same"); another entry prepared at that index ("impostor", a replaced leader's)
    or a write of the store in between ("written") abandons it. Either way: the outcomes, the digest and
    every row of a replica that applied the entries one by one."""
    entries, model, expected = _entries(program)
    root = Path(tempfile.mkdtemp(prefix="views-speculation-"))
    singly, speculating = Replica(root, "singly"), Replica(root, "speculating")
    try:
        singly.apply([[e] for e in entries])
        normal = [e for e in entries if e.kind is EntryKind.NORMAL]
        spec = speculating.sm.speculations
        for i, entry in enumerate(entries):
            step = plan[i % len(plan)]
            prepared, committed, abandoned = spec.prepared, spec.committed, spec.abandoned
            if step == "impostor" and normal:
                speculating.sm.speculate([_impostor(entry, normal[i % len(normal)])])
            elif step != "no":
                speculating.sm.speculate([entry])
            if step == "written":
                speculating.sm.store.write(speculating.sm.store.new_batch())
            held = spec.prepared - prepared
            speculating.apply([[entry]])
            if step in ("impostor", "written"):
                assert (spec.committed, spec.abandoned) == (committed, abandoned + held)
            elif step == "same":
                assert (spec.committed, spec.abandoned) == (committed + held, abandoned)
                if entry.kind is EntryKind.NORMAL and speculating.sm.halt is None:
                    assert held == 1
        spec = speculating.sm.speculations
        assert spec.prepared == spec.committed + spec.abandoned
        check_outcomes(speculating.outcomes, expected)
        assert speculating.outcomes == singly.outcomes
        assert speculating.sm.digest == singly.sm.digest
        assert dump(speculating.sm.store) == dump(singly.sm.store)
    finally:
        singly.sm.close()
        speculating.sm.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
@SETTINGS
@given(program=programs, cut=st.integers(0, 1 << 16), behind=st.integers(0, 1 << 16),
       cuts=st.lists(st.booleans(), min_size=1, max_size=8))
def test_a_restored_snapshot_continues_exactly_like_the_original(program: tuple, cut: int, behind: int,
                                                                   cuts: list[bool]) -> None:
    entries, model, expected = _entries(program)
    n = cut % (len(entries) + 1)            # entries in the snapshot (0: an empty one)
    lag = behind % (n + 1)                  # entries the restoring replica already had
    root = Path(tempfile.mkdtemp(prefix="views-snapshot-"))
    leader, follower = Replica(root, "leader"), Replica(root, "follower")
    try:
        leader.apply(_chunks(entries[:n], cuts))
        follower.apply([entries[:lag]])
        snapshot = root / "snapshot.tar"
        leader.sm.write_snapshot(snapshot)
        at = leader.sm.applied_index
        assert at == (entries[n - 1].last_index if n else -1)
        follower.sm.restore(snapshot, SnapshotMeta(index=at))
        follower.outcomes = {}
        assert follower.sm.applied_index == at
        assert follower.sm.digest == leader.sm.digest
        assert dump(follower.sm.store) == dump(leader.sm.store)

        rest = entries[n:]
        leader.apply([rest])
        follower.apply(_chunks(rest, cuts[::-1]))
        check_outcomes(leader.outcomes, expected)
        assert follower.outcomes == {o: v for o, v in leader.outcomes.items() if o > at}
        follower.reopen()                      # and the restored views persist as they are
        assert follower.sm.digest == leader.sm.digest
        assert dump(follower.sm.store) == dump(leader.sm.store)
        assert read_everything(follower.query, model.applied) == read_everything(leader.query, model.applied)
        check_internals(follower.sm.store, model)
        check_reads(follower.query, model, as_of=None, limit=2)
        check_reads(follower.query, model, as_of=at, limit=1)
        check_history(follower.query, model)
    finally:
        leader.sm.close()
        follower.sm.close()
        shutil.rmtree(root, ignore_errors=True)
