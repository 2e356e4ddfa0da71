"""Real-process crash tests of the views: SIGKILL in the middle of apply and of a snapshot restore.

1. `test_sigkill_during_apply_loses_repeats_and_tears_nothing`: a child process
   (`tests/statemachines/crash_child.py`, forked from a forkserver that imported it once:
   tests/support/forked.py) applies a deterministic, seeded stream of events (KV puts and deletes
   with compare-and-set, transactions, leases and sessions, brokers and broker groups, topics,
   offsets, config, retries of request ids, malformed records, leader NOOPs) batch by batch
   into a ViewsStateMachine on a real RocksDB directory, and now and then snapshots its views and
   restores them a few batches later. The parent kills it with SIGKILL at a seeded random moment --
   during start-up and recovery, between and inside batches, in a memtable flush, in a snapshot or
   a restore swap -- then reopens the views and checks:

   - the applied offset is one the child's output allows: the boundary it last reported or the
     next one (the batch whose write landed before its line went out), or, in a restore, the
     offset before it or the snapshot's -- nothing reported is lost, nothing is half-applied;
   - the views are exactly those of a reference run (the same stream applied in the parent, in its
     own directory) at that offset: same digest and the same keys and values in every column family
     (default/meta included) -- nothing lost, nothing repeated;
   - no restore leftovers (`views.restore`, `views.old`) remain.

   The rounds share one directory, so each child recovers from the previous crash and resumes from
   applied + 1; a child that reaches the end of its stream proves the final state is the
   reference's, and the next round starts a new stream in a new directory. At the end the parent
   itself resumes the last directory from its applied offset to the end of the stream and compares.

2. `test_sigkill_at_every_step_of_a_restore_swap`: the child restores a newer snapshot and kills
   itself just before or just after a chosen file-system step of `ViewsStateMachine.restore` (each
   unpacked file, rename, unlink, rmdir, rmtree, directory fsync; all the single steps and the
   first, middle and last of the bulk ones). Reopening must give exactly the old views or exactly
   the new ones, complete; with `views/` itself missing it must be the new ones; the outcome switches
   from old to new once, never back; and the reopened views apply on like the reference.

Replay: EPOCHLOG_VIEWS_CRASH_SEED=<seed printed by the test> (kill moments are real time, so a replay
is likely but not certain to hit the same states). More rounds: EPOCHLOG_VIEWS_CRASH_ROUNDS=<n> (16 by
default) or EPOCHLOG_SOAK=<k> (k times as many).
Faults not modelled: power loss (RocksDB's WAL is not fsynced per write; the Raft log is the
durable record and the group replays it).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from statemachines.store import ALL_CFS
from statemachines.views import ViewsStateMachine
from tests.statemachines import crash_child as child
from tests.support import forked
from tests.support.seeds import soak

# Each round kills the same step (an apply, at a random moment): 24 rounds before the suite's time bound.
ROUNDS = int(os.environ.get("EPOCHLOG_VIEWS_CRASH_ROUNDS") or soak(16))
START_TIMEOUT_S = 20.0

Dump = dict[str, list[tuple[bytes, bytes]]]


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_VIEWS_CRASH_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(32)


def dump(sm: ViewsStateMachine) -> Dump:
    """Every key and value of every column family, the default one (meta) included."""
    out: Dump = {}
    it = sm.store.db.iter()
    it.seek_to_first()
    rows = []
    while it.valid():
        rows.append((bytes(it.key()), bytes(it.value())))
        it.next()
    out["default"] = rows
    for cf in ALL_CFS:
        out[cf] = [(bytes(k), bytes(v)) for k, v in sm.store.scan(cf, b"")]
    return out


def first_difference(got: Dump, want: Dump) -> str:
    for cf in want:
        g, w = dict(got.get(cf, [])), dict(want[cf])
        if g != w:
            extra = sorted(set(g) - set(w))[:3]
            missing = sorted(set(w) - set(g))[:3]
            changed = sorted(k for k in set(g) & set(w) if g[k] != w[k])[:3]
            return f"column family {cf}: extra {extra}, missing {missing}, changed {changed}"
    return "no difference"


class Reference:
    """The stream applied in the parent's own directory: the views the child's must equal."""

    def __init__(self, directory: Path, stream: child.Stream) -> None:
        self.directory = directory
        self.stream = stream
        self.builds = 0
        self.sm = self._fresh()
        self.cache: dict[int, tuple[bytes, Dump]] = {}

    def _fresh(self) -> ViewsStateMachine:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.builds += 1
        return ViewsStateMachine(self.directory, child.CONFIG)

    def at(self, offset: int) -> tuple[bytes, Dump]:
        """(digest, dump) of the views after applying the stream through the boundary `offset`."""
        if offset in self.cache:
            return self.cache[offset]
        if offset < self.sm.applied_index:   # the child went back (a restore): rebuild
            self.sm.close()
            self.sm = self._fresh()
        for batch in self.stream.batches_after(self.sm.applied_index):
            if self.sm.applied_index >= offset:
                break
            self.sm.apply(batch)
        assert self.sm.applied_index == offset, (self.sm.applied_index, offset)
        self.cache[offset] = (self.sm.digest, dump(self.sm))
        return self.cache[offset]

    def close(self) -> None:
        self.sm.close()


def check_equal(sm: ViewsStateMachine, ref: Reference, ctx: str) -> None:
    digest, want = ref.at(sm.applied_index)
    got = dump(sm)
    assert sm.digest == digest, f"{ctx}: digest at {sm.applied_index} differs from the reference"
    assert got == want, f"{ctx}: views at {sm.applied_index} differ: {first_difference(got, want)}"


def no_leftovers(group: Path, ctx: str) -> None:
    left = sorted(p.name for p in group.iterdir() if p.name.startswith("views."))
    assert not left, f"{ctx}: restore leftovers after open: {left}"


# --- the child --------------------------------------------------------------------------------------

@dataclass
class ChildRun:
    lines: list[str]
    stderr: str
    killed: bool      # by the parent (False: it exited by itself)
    returncode: int | None


def run_child(args: list[str], rng: random.Random | None, log: Path, ctx: str) -> ChildRun:
    """Run the child (forked: tests/support/forked.py); with `rng`, SIGKILL it at a random moment
    (early, or some time after READY). Its report lines are read from its stdout file."""
    out = log.with_suffix(".out")
    proc = forked.start(child.main, args, out, log)
    killed = False
    try:
        if rng is not None:
            if rng.random() < 0.15:
                time.sleep(rng.uniform(0.0, 0.5))   # start-up, recovery, the first batches
            else:
                forked.wait_ready(proc, out, START_TIMEOUT_S, poll=0.02)
                time.sleep(rng.uniform(0.0, 0.4))
            if proc.exitcode is None:
                proc.kill()
                proc.join(30)
                # A child that exited between the check and the kill (not yet reaped) was not killed:
                # its own exit status says so.
                killed = proc.exitcode == -signal.SIGKILL
        proc.join(30)
        assert proc.exitcode is not None, f"{ctx}: the child still runs 30 s on"
        return ChildRun(forked.complete_lines(out), log.read_text(errors="replace"), killed, proc.exitcode)
    finally:
        if proc.exitcode is None:
            proc.kill()   # only the process this test started
            proc.join(10)


def allowed_offsets(lines: list[str], before: int, bounds: list[int], ctx: str) -> tuple[set[int], int]:
    """The applied offsets the child's output allows after a kill (`before`: applied at its start),
    and the offset it last reported."""
    nxt = {b: bounds[i + 1] for i, b in enumerate(bounds[:-1])}
    cur = before
    allowed = {before}
    for line in lines:
        kind, *args = line.split()
        if kind == "READY":
            assert int(args[0]) == before, f"{ctx}: child opened at {args[0]}, the parent left {before}"
            allowed = {cur, nxt.get(cur, cur)}
        elif kind == "APPLIED":
            x = int(args[0])
            assert x == nxt.get(cur), f"{ctx}: child applied through {x} after {cur}: not the next batch"
            cur = x
            allowed = {cur, nxt.get(cur, cur)}
        elif kind == "SNAPSHOT":
            assert int(args[0]) == cur, ctx
        elif kind == "RESTORE":
            allowed = {cur, int(args[0])}
        elif kind == "RESTORED":
            cur = int(args[0])
            allowed = {cur, nxt.get(cur, cur)}
        elif kind == "DONE":
            assert int(args[0]) == cur == bounds[-1], f"{ctx}: {line} at {cur}"
            allowed = {cur}
        else:
            raise AssertionError(f"{ctx}: unexpected child output {line!r}")
    return allowed, cur


@dataclass
class Stats:
    kills: int = 0
    before_ready: int = 0
    in_restore: int = 0
    restores: int = 0
    one_ahead: int = 0          # the batch in flight had landed before the kill
    streams_done: int = 0
    offsets: list[int] = field(default_factory=list)


@pytest.mark.slow
@pytest.mark.timeout(120 + 5 * ROUNDS)
def test_sigkill_during_apply_loses_repeats_and_tears_nothing(tmp_path: Path) -> None:
    seed = _seed()
    print(f"\nviews crash test seed={seed} rounds={ROUNDS} "
          f"(replay: EPOCHLOG_VIEWS_CRASH_SEED={seed} EPOCHLOG_VIEWS_CRASH_ROUNDS={ROUNDS})")
    rng = random.Random(seed)
    stats = Stats()
    started = time.monotonic()
    life = 0

    def new_life() -> tuple[int, child.Stream, Path, Reference]:
        stream_seed = rng.getrandbits(32)
        stream = child.build_stream(stream_seed)
        group = tmp_path / f"life{life}" / "group"
        return stream_seed, stream, group, Reference(tmp_path / f"life{life}" / "reference", stream)

    stream_seed, stream, group, ref = new_life()
    bounds = stream.boundaries()
    applied = -1
    try:
        for round_no in range(ROUNDS):
            ctx = f"seed={seed} round={round_no} stream={stream_seed}"
            args = [str(group), str(group.parent / "snaps"), str(stream_seed), str(rng.getrandbits(32))]
            run = run_child(args, rng, tmp_path / f"child{round_no}.stderr", ctx)
            assert run.killed or run.returncode == 0, (
                f"{ctx}: the child died by itself (rc={run.returncode}):\n{run.stderr}")
            assert not run.killed or run.returncode == -signal.SIGKILL, (
                f"{ctx}: rc={run.returncode}\n{run.stderr}")
            allowed, reported = allowed_offsets(run.lines, applied, bounds, ctx)
            stats.kills += run.killed
            stats.before_ready += not any(x.startswith("READY") for x in run.lines)
            stats.restores += sum(x.startswith("RESTORED") for x in run.lines)
            stats.in_restore += bool(run.lines) and run.lines[-1].startswith("RESTORE ")

            sm = ViewsStateMachine(group, child.CONFIG)
            try:
                got = sm.applied_index
                assert got in allowed, (f"{ctx}: the views reopened at offset {got}; the child's output "
                                        f"allows only {sorted(allowed)} (last lines {run.lines[-3:]})")
                assert got in bounds, f"{ctx}: {got} is not a batch boundary"
                stats.one_ahead += got > reported
                no_leftovers(group, ctx)
                check_equal(sm, ref, ctx)
            finally:
                sm.close()
            applied = got
            stats.offsets.append(got)
            if applied == bounds[-1]:     # the stream is done and matched: a new one, in a new directory
                stats.streams_done += 1
                ref.close()
                life += 1
                stream_seed, stream, group, ref = new_life()
                bounds = stream.boundaries()
                applied = -1
        # The parent resumes the last directory from applied + 1 to the end of the stream.
        ctx = f"seed={seed} final resume stream={stream_seed}"
        sm = ViewsStateMachine(group, child.CONFIG)
        try:
            assert sm.applied_index == applied, ctx
            for batch in stream.batches_after(applied):
                sm.apply(batch)
            assert sm.applied_index == bounds[-1], ctx
            check_equal(sm, ref, ctx)
        finally:
            sm.close()
    finally:
        ref.close()
    print(f"views crash test seed={seed}: {stats.kills} kills in {time.monotonic() - started:.1f} s, "
          f"{stats.before_ready} before READY, {stats.in_restore} inside a restore, "
          f"{stats.restores} restores done, "
          f"{stats.one_ahead} kills after a write landed but before its report, {stats.streams_done} streams "
          f"finished; applied offsets after the kills: {stats.offsets}")
    assert stats.kills >= ROUNDS // 2, "most rounds must end in a kill, or the test tests nothing"


# --- a kill at every step of a restore swap ---------------------------------------------------------

def _copytree(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_at_every_step_of_a_restore_swap(tmp_path: Path) -> None:
    seed = _seed()
    print(f"\nviews restore-swap crash test seed={seed} (replay: EPOCHLOG_VIEWS_CRASH_SEED={seed})")
    stream_seed = random.Random(seed).getrandbits(32)
    stream = child.build_stream(stream_seed)
    bounds = stream.boundaries()
    ref = Reference(tmp_path / "reference", stream)
    try:
        old_at, new_at = bounds[60], bounds[140]
        # The old views: a group directory at `old_at`, kept as a pristine copy.
        pristine = tmp_path / "pristine"
        sm = ViewsStateMachine(pristine, child.CONFIG)
        for batch in stream.batches_after(-1)[:60]:
            sm.apply(batch)
        assert sm.applied_index == old_at
        sm.close()
        # The new views: a snapshot taken by another replica (the reference) at `new_at`.
        ref.at(new_at)
        snapshot = tmp_path / "snapshot.tar"
        ref.sm.write_snapshot(snapshot)
        old, new = ref.at(old_at), ref.at(new_at)

        # A dry run lists the steps of the restore (and checks it completes).
        group = tmp_path / "group"
        _copytree(pristine, group)
        dry = run_child(["restore", str(group), str(snapshot), str(new_at), "-1"], None,
                        tmp_path / "dry.stderr", "dry run")
        assert dry.returncode == 0 and dry.lines[-1] == f"RESTORED {new_at}", dry.stderr
        steps = [line.split()[1:] for line in dry.lines if line.startswith("EVENT")]
        kinds = [kind for _, kind, _ in steps]
        assert {"makefile", "rename", "rmtree"} <= set(kinds), kinds
        chosen: list[int] = []
        for kind in sorted(set(kinds)):
            at = [j for j, k in enumerate(kinds) if k == kind]
            chosen += at if kind not in ("makefile", "unlink") else sorted({at[0], at[len(at) // 2], at[-1]})
        points = sorted({p for j in chosen for p in (2 * j, 2 * j + 1)})

        outcomes: list[tuple[int, str, list[str]]] = []
        for point in points:
            j = point // 2
            when = "before" if point % 2 == 0 else "after"
            ctx = f"seed={seed} point={point} ({when} step {j}: {steps[j][1:]})"
            _copytree(pristine, group)
            run = run_child(["restore", str(group), str(snapshot), str(new_at), str(point)], None,
                            tmp_path / f"point{point}.stderr", ctx)
            assert run.returncode == -signal.SIGKILL, f"{ctx}: rc={run.returncode}\n{run.stderr}"
            on_disk = sorted(p.name for p in group.iterdir() if p.name.startswith("views"))
            sm = ViewsStateMachine(group, child.CONFIG)
            try:
                got = sm.applied_index
                assert got in (old_at, new_at), (
                    f"{ctx}: reopened at {got}, neither old {old_at} nor new {new_at}")
                want = old if got == old_at else new
                which = "old" if got == old_at else "new"
                assert sm.digest == want[0], f"{ctx}: digest differs from the {which} views"
                d = dump(sm)
                assert d == want[1], f"{ctx}: views differ: {first_difference(d, want[1])}"
                if "views" not in on_disk:
                    assert got == new_at, f"{ctx}: views/ was gone ({on_disk}) yet the old views came back"
                no_leftovers(group, ctx)
                # The reopened views apply on exactly like the reference.
                for batch in stream.batches_after(got)[:5]:
                    sm.apply(batch)
                check_equal(sm, ref, ctx)
            finally:
                sm.close()
            outcomes.append((point, "old" if got == old_at else "new", on_disk))
        sequence = "".join(o[1][0] for o in outcomes)
        print(f"restore crash points: {len(points)} of {2 * len(steps)}; outcomes "
              + ", ".join(f"{p}:{o}" + ("(" + "+".join(d) + ")" if d != ["views"] else "")
                          for p, o, d in outcomes))
        assert sequence.startswith("o") and sequence.endswith("n"), sequence
        assert "no" not in sequence, (
            f"the restore went back to the old views after a later crash point: {sequence}")
        assert any(d == ["views.old", "views.restore"] for _, _, d in outcomes), (
            "never crashed between the renames")
    finally:
        ref.close()
