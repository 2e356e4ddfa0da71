"""The chaos run in the test suite: a short bounded run, and the pieces it relies on.

The seed is random (printed) unless EPOCHLOG_CHAOS_SEED is set; replay a failure with
`python -m tests.chaos --seconds 20 --seed S` (add `--compaction` for the compaction run).
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

from tests.chaos.run import ChaosParams, ChaosRun, cas_expected
from tests.sim.history import History
from tests.sim.linearizability import check_history

SECONDS = 20.0


def test_a_short_chaos_run_finds_no_violation(tmp_path: Path) -> None:
    seed = int(os.environ.get("EPOCHLOG_CHAOS_SEED") or random.SystemRandom().getrandbits(32))
    out = io.StringIO()
    outcome = ChaosRun(ChaosParams(seconds=SECONDS, seed=seed), tmp_path / "chaos", out).run()
    print(out.getvalue())
    assert outcome.exit_code != 1, f"seed {seed}: {outcome.violations}"
    assert sum(outcome.faults.values()) >= 3, "the nemesis did (almost) nothing"
    assert outcome.acked_writes >= 100 and outcome.converged_s >= 0
    done = {k: v for k, v in outcome.ops.items() if k.endswith(" ok")}
    assert {"put ok", "cas ok", "get/linearizable ok", "get/lease ok"} <= set(done), outcome.ops


def test_a_short_chaos_run_with_compaction_finds_no_violation(tmp_path: Path) -> None:
    # Snapshots every 200 offsets, 64 KiB segments and 300 offsets retained: kills and pauses land on
    # snapshots, truncation, key compaction and pruning; restarted members catch up by log or snapshot.
    seed = int(os.environ.get("EPOCHLOG_CHAOS_SEED") or random.SystemRandom().getrandbits(32))
    out = io.StringIO()
    outcome = ChaosRun(ChaosParams(seconds=SECONDS, seed=seed, compaction=True), tmp_path / "chaos", out).run()
    print(out.getvalue())
    assert outcome.exit_code != 1, f"seed {seed}: {outcome.violations}"
    assert sum(outcome.faults.values()) >= 3, "the nemesis did (almost) nothing"
    assert outcome.acked_writes >= 100 and outcome.converged_s >= 0
    assert outcome.digests_equal == 3, "the views were not compared"
    assert outcome.checked_from > 0, "nothing was truncated or key-compacted: the run did not exercise compaction"


def test_cas_expectations_and_their_check() -> None:
    rng = random.Random(1)
    assert cas_expected([], rng) == (None, 0), "nothing seen: the key must not exist"
    seen = [(1, 10), (2, 12)]
    picks = {cas_expected(seen, rng) for _ in range(50)}
    assert picks == {(1, 10), (2, 12)}
    # A CAS on version 12 is a register CAS on the value written at 12 (values are unique): a read
    # after it succeeded that still returns the old value is caught.
    h = History()
    ops = [h.invoke(1, "put", "k", 2, None, via="log", node=0)]
    h.ok(ops[0], None)
    ops.append(h.invoke(1, "cas", "k", 2, 3, via="log", node=0))
    h.ok(ops[1], True)
    ops.append(h.invoke(2, "get", "k", None, None, via="lease", node=0))
    h.ok(ops[2], 2)
    h.close()
    assert not check_history(h.checked_ops()).ok
