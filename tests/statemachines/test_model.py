"""Model-based test of the views: random event sequences against a dict-based model.

Each step appends 1-4 entries (NOOPs, or batches of 1-4 events of every family, some retried,
some malformed or invalid) in one `ViewsStateMachine.apply` call on a real RocksDB directory, and
the same records to `tests/statemachines/model.py`. Then every outcome must match (accepted, or the
rejection code; duplicates with the first outcome's offset), and after every step every read
matches: `get` of each pooled key, `list` of each prefix and `range` page by page with a small
limit, `history`, and the internal column families (lease attachments, remembered request ids and
their expiry index). Other steps read at a random past offset (`as_of`), replay entries already
applied (which must change nothing), or close and reopen the store (once).

The dedupe window is 6 offsets, so request ids are both remembered and forgotten in one run.
Commands often aim at live entities (a granted lease, a registered broker, the current version),
so cascades, re-leases, fencing and compare-and-set succeed as well as fail.

Two bugs this test found in `statemachines/query.py` keep a plain regression test each at the end.

CI runs a fixed set of examples (`derandomize`); a failure prints the steps, which replay as they
are, and a blob for `@reproduce_failure`. Explore more with VIEWS_MODEL_EXAMPLES=500 or EPOCHLOG_SOAK=<k>
(k times the suite's 25 examples), and VIEWS_MODEL_RANDOM=1 for fresh random examples on every run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from eventlog.raft.types import Entry
from statemachines.events import EventError
from statemachines.noops import noop_offsets
from statemachines.query import Query
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine
from tests.statemachines.harness import (
    SHRINK_TIMEOUT_S,
    Cmd,
    Record,
    apply_calls,
    build,
    check_history,
    check_internals,
    check_outcomes,
    check_reads,
)
from tests.statemachines.model import Model
from tests.support.seeds import soak

WINDOW = 6
EXAMPLES = int(os.environ.get("VIEWS_MODEL_EXAMPLES") or soak(25))


class ViewsVersusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="views-model-")
        self.config = ViewsConfig(dedupe_window_offsets=WINDOW)
        self.sm = ViewsStateMachine(self.dir, self.config)
        self.model = Model(WINDOW)
        self.sent: list[Record] = []
        self.entries: list[Entry] = []
        self.checks = 0
        self.reopened = False
        self.noops: set[int] = set()

    @property
    def query(self) -> Query:
        return Query(self.sm.store)

    @rule(calls=apply_calls)
    def apply(self, calls: tuple) -> None:
        [entries], expected = build([calls], self.model, self.sent)
        outcomes = self.sm.apply(entries)
        check_outcomes(outcomes, expected)
        self.entries += entries
        assert self.sm.applied_index == self.model.applied
        # Every record that changed nothing (rejected or a retry) has its `noops` row, and no other.
        self.noops |= {o for o, want in expected.items() if not want.ok or want.duplicate}
        assert set(noop_offsets(self.sm.store, 0, self.model.applied + 1)) == self.noops

    @precondition(lambda self: self.entries)
    @rule(pick=st.integers(0, 1 << 16), limit=st.integers(1, 3))
    def read_the_past(self, pick: int, limit: int) -> None:
        as_of = pick % (self.model.applied + 2) - 1          # -1 (before anything) .. applied
        check_reads(self.query, self.model, as_of=as_of, limit=limit, after_pick=pick)
        with pytest.raises(EventError, match="beyond the applied offset"):
            self.query.get("kv/a", as_of=self.model.applied + 1)

    @precondition(lambda self: self.entries)
    @rule(back=st.integers(1, 4))
    def replay_applied_entries(self, back: int) -> None:
        """A restart replays from the persisted commit: entries already in the views are skipped."""
        digest = self.sm.digest
        assert self.sm.apply(self.entries[-back:]) == {}
        assert (self.sm.digest, self.sm.applied_index) == (digest, self.model.applied)

    @precondition(lambda self: not self.reopened)
    @rule()
    def reopen(self) -> None:
        """Once per run (opening RocksDB costs ~50 ms): the views persist as they were."""
        self.reopened = True
        digest = self.sm.digest
        self.sm.close()
        self.sm = ViewsStateMachine(self.dir, self.config)
        assert (self.sm.digest, self.sm.applied_index) == (digest, self.model.applied)

    @invariant()
    def views_match_the_model(self) -> None:
        self.checks += 1
        q = self.query
        check_reads(q, self.model, as_of=None, limit=self.checks % 3 + 1, after_pick=self.checks)
        check_history(q, self.model, after_pick=self.checks)
        check_internals(self.sm.store, self.model)

    def teardown(self) -> None:
        self.sm.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
def test_views_match_the_model() -> None:
    run_state_machine_as_test(ViewsVersusModel, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=30, deadline=None, database=None, print_blob=True,
        derandomize=not os.environ.get("VIEWS_MODEL_RANDOM"), suppress_health_check=[HealthCheck.too_slow]))


def _three_keys(path: Path) -> ViewsStateMachine:
    """kv/a, kv/b and kv/ab put at offsets 0, 1 and 2."""
    sm = ViewsStateMachine(path, ViewsConfig(dedupe_window_offsets=WINDOW))
    [entries], _ = build([[(c,) for c in (Cmd("kv_put", target=0), Cmd("kv_put", target=4),
                                          Cmd("kv_put", target=3))]], Model(WINDOW), [])
    sm.apply(entries)
    return sm


def test_list_as_of_pages_do_not_repeat_the_continuation_key(tmp_path: Path) -> None:
    """`after` skipped only `after + b"\\0"` in the versions keyspace, where the token's own rows
    sort after that: each page started with the last item of the page before (limit=1: forever)."""
    sm = _three_keys(tmp_path)
    q = Query(sm.store)
    first = q.list("kv/", limit=2, as_of=2)
    assert [i.key for i in first.items] == ["kv/a", "kv/ab"] and first.next == "kv/ab"
    assert [i.key for i in q.list("kv/", limit=2, after=first.next, as_of=2).items] == ["kv/b"]
    sm.close()


def test_get_as_of_minus_one_is_before_everything(tmp_path: Path) -> None:
    """as_of=-1 is allowed (before offset 0) but packed as the largest offset, so `get` answered
    with the latest state while `list` at -1 was empty."""
    sm = _three_keys(tmp_path)
    q = Query(sm.store)
    assert q.get("kv/a", as_of=-1) is None and q.list("kv/", as_of=-1).items == []
    at_zero = q.get("kv/a", as_of=0)
    assert at_zero is not None and at_zero.version == 0
    sm.close()
