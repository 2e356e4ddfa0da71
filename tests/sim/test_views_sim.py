"""The simulator with the views shadow (views_shadow.py): real RocksDB views on every replica.

- the swarm campaign with views: EPOCHLOG_SIM_VIEWS_SEEDS seeds (default 20) from
  EPOCHLOG_SIM_VIEWS_START (default 0) on EPOCHLOG_SIM_VIEWS_JOBS (default 2) worker processes;
  every invariant of the simulator holds, and views-digest too: replicas at the same offset hold
  the same views digest whatever batches they applied, through crashes, torn writes, partitions,
  membership changes, leader changes and snapshot installs, and the same column families at the
  end. Replay one seed: `python -m tests.sim --start SEED --seeds 1 -v --views`;
- the shadow does not change a seed's run (same fingerprint with and without views);
- mutation tests: the views-digest checker catches deliberately broken views.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import pytest

from statemachines.apply import Applier
from tests.sim.campaign import failure_line, results
from tests.sim.swarm import SimParams, run_seed
from tests.sim.views_shadow import ViewsShadow


def test_views_swarm_campaign() -> None:
    seeds = int(os.environ.get("EPOCHLOG_SIM_VIEWS_SEEDS", "20"))
    start = int(os.environ.get("EPOCHLOG_SIM_VIEWS_START", "0"))
    jobs = int(os.environ.get("EPOCHLOG_SIM_VIEWS_JOBS", "2"))
    rs = list(results(start, seeds, jobs=jobs, views=True))
    failed = sorted((r for r in rs if not r.ok), key=lambda r: r.seed)
    checks = sum(r.views.get("checks", 0) for r in rs)
    installs = sum(r.faults.get("snapshots_installed", 0) for r in rs)
    offsets = sum(r.views.get("offsets", 0) for r in rs)
    print(f"\nsimulator with views: {len(rs)} seeds ({start}..{start + seeds - 1}), {checks} digest "
          f"checks at {offsets} offsets, {installs} snapshot installs, "
          f"{sum(r.views.get('checkpoints', 0) for r in rs)} views checkpoints, "
          f"{sum(r.views.get('restored_on_boot', 0) for r in rs)} views restored on boot, "
          f"{sum(r.faults.get('crash', 0) for r in rs)} crashes, "
          f"{sum(r.seconds for r in rs):.1f} s of simulation")
    assert len(rs) == seeds
    assert not failed, "\n".join(failure_line(r) for r in failed)
    assert checks > 0 and (seeds < 20 or installs > 0), "the views shadow checked nothing"


@pytest.mark.parametrize("seed", [15, 29])
def test_the_views_shadow_does_not_change_the_run(seed: int) -> None:
    plain, views = run_seed(seed), run_seed(seed, views=True)
    assert views.ok, views.detail
    assert views.views["checks"] > 0
    assert (plain.fingerprint, plain.ticks, plain.messages, plain.faults) == (
        views.fingerprint, views.ticks, views.messages, views.faults)


# --- mutation tests: broken views must be caught -----------------------------------------------------

def _busy(p: SimParams) -> SimParams:
    """Three or more nodes, crashes, frequent snapshots, lots of client traffic (with retries)."""
    return dataclasses.replace(
        p, nodes=max(3, p.nodes), snapshot_every=8,
        faults=dataclasses.replace(p.faults, crash_prob=max(p.faults.crash_prob, 0.01), max_down=1,
                                   restart_max_ticks=20),
        workload=dataclasses.replace(p.workload, clients=3, issue_prob=0.5, max_count=3,
                                     weights=(4, 2, 1, 1, 1)))


_real_evict = Applier._evict_dedupe


def _evict_by_batch_start(self: Applier, ov: object, last_offset: int, limit: int) -> None:
    """Dedupe eviction measured from the start of the apply() batch instead of each entry: the
    views then depend on how a replica's entries were batched."""
    _real_evict(self, ov, self.store.applied + 1, limit)  # type: ignore[arg-type]


def _install_nothing(self: ViewsShadow, meta: object) -> None:
    """A snapshot install that leaves the views as they were (the log moved on without them)."""


@pytest.mark.parametrize(("name", "target", "attr", "mutant", "expected"), [
    ("dedupe eviction depends on batching", Applier, "_evict_dedupe", _evict_by_batch_start,
     {"views-digest"}),
    ("views not restored from an installed snapshot", ViewsShadow, "install", _install_nothing,
     {"views-digest", "core-assertion", "exception"}),
])
def test_views_digest_catches_broken_views(monkeypatch: pytest.MonkeyPatch, name: str, target: type,
                                           attr: str, mutant: Callable[..., object],
                                           expected: set[str]) -> None:
    monkeypatch.setattr(target, attr, mutant)
    for seed in range(60):
        r = run_seed(seed, tweak=_busy, views=True)
        if not r.ok:
            print(f"{name}: caught by seed {seed}: {r.invariant}: {r.detail.splitlines()[0]}")
            assert r.invariant in expected, f"{name}: seed {seed} failed on {r.invariant}: {r.detail}"
            return
    raise AssertionError(f"{name}: no seed out of 60 caught it")
