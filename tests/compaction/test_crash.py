"""kill -9 at every file-system step of a cleaning pass: the log always reopens whole.

The parent builds a log whose next forced pass rewrites two groups: three small segments cleaned
earlier that merge into one (so a swap replaces several segments), and a dirty segment. A child
(`crash_child.py`; run once as a program to list the steps, then forked for each kill point from a
forkserver that imported it once) runs that pass and SIGKILLs itself just before or just after its j-th file-system
call (every rename, replace, unlink, fsync, fdatasync and pwritev: writing the `.cleaned` file, each
checkpoint write, each rename to `.swap`, to `.deleted` and into place, each directory fsync, each
deletion). For every kill point, on a fresh copy of the log:

- `verify_log_dir` on the crashed directory finds no corruption (at worst an interrupted swap that
  open will finish or undo) and agrees with what open then does;
- `Log.open` succeeds, leaves no `.cleaned`, `.swap` or `.deleted` file, and the directory verifies
  clean;
- the records are those of the original log minus some of what the full pass drops: every record
  the pass keeps is there with its offset, key and value, every record at or above the horizon too;
  each group is either all original or all cleaned (never half), and the outcome only moves
  forward as the kill point moves later;
- cleaning again finishes the job: the result equals the uninterrupted pass's.

Replay: EPOCHLOG_CLEANER_CRASH_SEED=<seed printed>.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from eventlog.cleaned import CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX
from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.offline import Verdict, verify_log_dir
from tests.support import forked
from tests.compaction.logs import expected, records, triples, write_random

ROOT = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 4096
CONFIG = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=256, flush_policy="fsync",
                   preallocate_next_segment=False)
RETAIN = CleanerConfig(delete_retention_ms=10**15, worker_process=False)


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_CLEANER_CRASH_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(32)


def child(directory: Path, below: int, point: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.compaction.crash_child", str(directory), str(SEGMENT_BYTES),
                           str(below), str(point)], cwd=ROOT, capture_output=True, text=True, timeout=60)


def forked_child(directory: Path, below: int, point: int) -> tuple[int | None, str]:
    """`child` forked from a server that imported crash_child once (a fork instead of an interpreter
    start for each of the ~120 kill points; the same code, in a process of its own): (exit code, output)."""
    context = forked.context()   # its forkserver preloads every crash child of the suite
    output = directory.parent / f"{directory.name}.out"
    from tests.compaction import crash_child
    proc = context.Process(target=crash_child.forked,
                           args=([str(directory), str(SEGMENT_BYTES), str(below), str(point)], str(output)))
    proc.start()
    proc.join(60)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
    return proc.exitcode, output.read_text() if output.exists() else ""


def build(path: Path, rng: random.Random) -> tuple[list, list, int, int]:
    """A log whose next pass below the returned horizon cleans two groups: the segments below the
    returned split (three, cleaned before) and the one from the split to the horizon."""
    with Log.open(path, CONFIG) as log:
        written = write_random(log, rng, 120, key_space=6)
        first = clean_log(log, log.segment_bases()[3], RETAIN, force=True)
        assert first.segments_before == 3 and first.segments_after == 3, first
        written += write_random(log, rng, 80, key_space=6, start_ts=written[-1].timestamp + 1)
        bases = log.segment_bases()
        assert len(bases) >= 5, bases
        return written, records(log), bases[3], bases[4]


@pytest.mark.slow
def test_kill_at_every_step_of_a_cleaning_pass(tmp_path):
    seed = _seed()
    print(f"EPOCHLOG_CLEANER_CRASH_SEED={seed}")
    rng = random.Random(seed)
    base_dir = tmp_path / "base"
    written, original, split, below = build(base_dir, rng)

    dry = tmp_path / "dry"
    shutil.copytree(base_dir, dry)
    run = child(dry, below, -1)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    events = [line for line in lines if line.startswith("EVENT ")]
    _, dirty, dropped, before, after = next(line for line in lines if line.startswith("RESULT ")).split()
    assert (int(before), int(after)) == (4, 2), "the pass must merge three segments and clean a fourth"
    cleaned = triples(expected(written, int(dirty)))
    assert len(original) - len(cleaned) == int(dropped) > 0
    with Log.open(dry, CONFIG) as log:
        assert records(log) == cleaned, "the uninterrupted pass gives the model"
    assert any(" rename " in e and e.endswith(".log.swap") for e in events)
    print(f"{len(events)} file-system steps; the pass drops {dropped} of {len(original)} records")

    progress = -1
    outcomes = set()
    for point in range(2 * len(events)):
        work = tmp_path / f"p{point}"
        shutil.copytree(base_dir, work)
        returncode, output = forked_child(work, below, point)
        ctx = f"seed {seed}, kill {'before' if point % 2 == 0 else 'after'} {events[point // 2]}"
        assert returncode == -signal.SIGKILL, f"{ctx}: child exited {returncode}: {output}"
        report = verify_log_dir(work)
        assert report.verdict is not Verdict.CORRUPT, f"{ctx}: {report.problems}"
        pending = report.interrupted_swap is not None
        with Log.open(work, CONFIG) as log:
            got = records(log)
            leftovers = [p.name for p in work.iterdir() if p.name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX))]
            assert not leftovers, f"{ctx}: left {leftovers}"
            assert set(cleaned) <= set(got) <= set(original), f"{ctx}: records lost or invented"
            assert [t for t in got if t[0] >= below] == [t for t in original if t[0] >= below], ctx
            assert got == sorted(got), ctx
            # Whole groups only: [start, split) merges into one segment, [split, below) is cleaned alone.
            state = tuple(_group_state(got, original, cleaned, lo, hi) for lo, hi in ((0, split), (split, below)))
            assert all(s in ("original", "cleaned") for s in state), f"{ctx}: a group is half cleaned: {state}"
            dropped_now = len(original) - len(got)
            assert dropped_now >= progress, f"{ctx}: went back from {progress} to {dropped_now} records dropped"
            progress = dropped_now
            outcomes.add(state)
            if report.verdict is Verdict.TORN_TAIL:
                assert pending, f"{ctx}: {report.problems}"
            again = clean_log(log, below, RETAIN, force=True)
            assert again.aborted is None, ctx
            assert records(log) == cleaned, f"{ctx}: cleaning again does not give the model"
        assert verify_log_dir(work).verdict is Verdict.CLEAN, f"{ctx}: {verify_log_dir(work).problems}"
        shutil.rmtree(work)
    assert outcomes >= {("original", "original"), ("cleaned", "original"), ("cleaned", "cleaned")}, outcomes


def _group_state(got: list, original: list, cleaned: list, lo: int, hi: int) -> str:
    part = [t for t in got if lo <= t[0] < hi]
    if part == [t for t in original if lo <= t[0] < hi]:
        return "original"
    if part == [t for t in cleaned if lo <= t[0] < hi]:
        return "cleaned"
    return "mixed"
