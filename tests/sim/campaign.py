"""Running many seeds: worker processes, one report line per failure, a summary with seeds/s."""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from tests.sim.swarm import SeedResult, run_seed


@dataclass(slots=True)
class Summary:
    seeds: int = 0
    failures: int = 0
    inconclusive: int = 0
    seconds: float = 0.0
    ops: int = 0
    ticks: int = 0
    failed: list[SeedResult] = field(default_factory=list)

    @property
    def seeds_per_second(self) -> float:
        return self.seeds / self.seconds if self.seconds else 0.0


def replay_hint(seed: int, views: bool = False) -> str:
    return f"python -m tests.sim --start {seed} --seeds 1 -v" + (" --views" if views else "")


def failure_line(r: SeedResult) -> str:
    first = r.detail.splitlines()[0] if r.detail else ""
    hint = replay_hint(r.seed, bool(r.views))
    return f"FAIL seed={r.seed} invariant={r.invariant}: {first}  (replay: {hint})"


def _run(args: tuple[int, bool, bool]) -> SeedResult:
    seed, verbose, views = args
    return run_seed(seed, verbose, views=views)


def results(start: int, count: int, *, jobs: int = 1, verbose: bool = False,
            views: bool = False) -> Iterator[SeedResult]:
    """Results of seeds start .. start+count-1, in completion order."""
    work = [(seed, verbose, views) for seed in range(start, start + count)]
    if jobs <= 1 or count < 2:
        for w in work:
            yield _run(w)
        return
    methods = multiprocessing.get_all_start_methods()
    # Views runs spawn their workers: a process forked after this one used RocksDB (whose background
    # threads may hold locks at the fork) can hang in its first RocksDB call.
    ctx = multiprocessing.get_context("fork" if "fork" in methods and not views else "spawn")
    with ctx.Pool(jobs) as pool:
        yield from pool.imap_unordered(_run, work, chunksize=max(1, min(16, count // (jobs * 8))))


def run_campaign(start: int, count: int, *, jobs: int = 1, verbose: bool = False,
                 out: TextIO | None = sys.stdout, views: bool = False) -> Summary:
    s = Summary()
    began = time.perf_counter()
    for r in results(start, count, jobs=jobs, verbose=verbose, views=views):
        s.seeds += 1
        s.ops += r.ops
        s.ticks += r.ticks
        s.inconclusive += r.inconclusive
        if r.inconclusive and out is not None:
            print(f"NOTE seed={r.seed}: the linearizability search ran out of budget (not a failure)  "
                  f"(replay: {replay_hint(r.seed, views)})", file=out, flush=True)
        if not r.ok:
            s.failures += 1
            s.failed.append(r)
            if out is not None:
                print(failure_line(r), file=out, flush=True)
                if verbose:
                    for line in r.log + r.detail.splitlines()[1:]:
                        print("    " + line, file=out)
    s.seconds = time.perf_counter() - began
    if out is not None:
        print(f"{s.seeds} seeds ({start}..{start + count - 1}), {s.failures} failed, {s.inconclusive} inconclusive "
              f"linearizability searches; {s.ticks} ticks, {s.ops} client ops; {s.seconds:.1f} s, "
              f"{s.seeds_per_second:.1f} seeds/s with {jobs} job(s)", file=out, flush=True)
    return s
