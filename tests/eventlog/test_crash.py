"""Real-process crash test: SIGKILL a child appending to the log, reopen, check every acknowledgement.

The child (`tests/eventlog/crash_child.py`, forked from a forkserver that imported it once:
tests/support/forked.py) appends batches whose content is a function of their
offsets and prints each batch's offset range once it is durable. The parent kills it with SIGKILL at
a seeded random moment (during start-up and recovery, between appends, in the middle of a roll or a
retention deletion), then reopens the log and checks:

- opening succeeds without repair: a process crash never corrupts the log (the page cache keeps
  every byte written to the mapping; only an append in flight can be torn, and that is a torn tail);
- every acknowledged batch is present with exactly the offsets, epoch, timestamp, keys and values
  it was written with; batches not acknowledged may or may not be there, but whatever is there is
  intact and the offsets are contiguous from the log start to the log end;
- the log start moved only as far as a retention the child announced before starting it;
- the epoch cache agrees with the batches; timestamp lookups find the batches;
- appending works again (the parent appends a batch, closes, and the next child continues the log).

The rounds run on one directory, so each child recovers from the previous crash. Faults this does
not model: power loss (unsynced pages are lost), which needs the fake disk of the torn-write tests.

Replay: EPOCHLOG_CRASH_SEED=<seed printed by the failing test> (the kill moments are real time, so a
replay is likely but not certain to hit the same state). More rounds: EPOCHLOG_CRASH_ROUNDS=<n> (20 by
default) or EPOCHLOG_SOAK=<k> (k times as many).

A roll is a short window that random kills rarely hit, so `test_sigkill_inside_a_roll` kills the child
deterministically at every point of one (a crash point, `EPOCHLOG_CRASH_AT=log.roll:<point>`), both
for a roll at the recovery point (the segment was full when the log was last closed) and for one after
appends, and runs the same checks.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eventlog.errors import LogCorruptionError
from eventlog.log import Log
from eventlog.records import check_batch
from tests.eventlog import crash_child as child
from tests.support import forked
from tests.support.seeds import soak

# Each round kills the same step (an append, at a random moment): 32 rounds before the suite's time bound.
ROUNDS = int(os.environ.get("EPOCHLOG_CRASH_ROUNDS") or soak(20))
START_TIMEOUT_S = 20.0


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_CRASH_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(32)


@dataclass
class _Model:
    """What the parent knows must be in the log."""

    acked: dict[int, int] = field(default_factory=dict)  # base offset -> last offset, durable
    retain_max: int = 0  # highest offset a retention was announced for (the start may move up to it)
    torn_tails: int = 0
    behind_rolls: int = 0  # reopens that scanned more than the last segment: killed inside a roll
    bytes_cut: int = 0
    kills_before_ready: int = 0


@dataclass
class _ChildRun:
    lines: list[str]
    stderr: str
    returncode: int | None


def _run_and_kill(directory: Path, policy: str, child_seed: int, rng: random.Random, ctx: str) -> _ChildRun:
    """Start the child (forked: tests/support/forked.py), kill it with SIGKILL at a random moment,
    return what it acknowledged (the lines of its stdout file)."""
    err_path = directory.parent / f"{directory.name}.stderr"
    out_path = directory.parent / f"{directory.name}.stdout"
    proc = forked.start(child.main, [str(directory), policy, str(child_seed)], out_path, err_path)
    try:
        if rng.random() < 0.2:
            # Early: during the child's start, the open (recovery) or the first appends.
            time.sleep(rng.uniform(0.0, 0.3))
        else:
            forked.wait_ready(proc, out_path, START_TIMEOUT_S)
            time.sleep(rng.uniform(0.0, 0.35))
        alive = proc.exitcode is None
        if alive:
            proc.kill()
        proc.join(10)
        stderr = err_path.read_text(errors="replace")
        assert alive, f"{ctx}: the child died by itself (rc={proc.exitcode}):\n{stderr}"
        assert proc.exitcode == -signal.SIGKILL, f"{ctx}: rc={proc.exitcode}\n{stderr}"
        return _ChildRun(forked.complete_lines(out_path), stderr, proc.exitcode)
    finally:
        if proc.exitcode is None:
            proc.kill()  # only the process this test started
            proc.join(10)


def _absorb(run: _ChildRun, model: _Model, ctx: str) -> None:
    if not any(line.startswith("READY") for line in run.lines):
        model.kills_before_ready += 1
    for line in run.lines:
        kind, *args = line.split()
        if kind == "ACK":
            base, last = int(args[0]), int(args[1])
            assert model.acked.get(base, last) == last, f"{ctx}: batch {base} acknowledged twice: {line}"
            model.acked[base] = last
        elif kind == "RETAIN":
            model.retain_max = max(model.retain_max, int(args[0]))
        elif kind != "READY":
            raise AssertionError(f"{ctx}: unexpected child output {line!r}")


def _check_clean_reopen(directory: Path, policy: str, model: _Model) -> None:
    """The last state survives a clean reopen too."""
    with Log.open(directory, child.config_for(policy)) as log:
        assert log.recovery is not None and log.recovery.bytes_truncated == 0
        assert all(log.start_offset <= b for b in model.acked)
        assert log.end_offset == max(model.acked.values()) + 1
        assert sum(1 for _ in log.batches()) >= len(model.acked)


def _verify_and_append(directory: Path, policy: str, model: _Model, rng: random.Random, ctx: str) -> None:
    """Reopen after the crash; check everything the model promises; append one batch; close."""
    try:
        log = Log.open(directory, child.config_for(policy))
    except LogCorruptionError as exc:
        raise AssertionError(f"{ctx}: a process crash left a log that does not open: {exc}") from exc
    try:
        rec = log.recovery
        assert rec is not None and not rec.repaired, f"{ctx}: {rec}"
        if rec.segments_scanned > 1:
            model.behind_rolls += 1
        if rec.bytes_truncated:
            model.torn_tails += 1
            model.bytes_cut += rec.bytes_truncated
        start, end = log.start_offset, log.end_offset
        assert start <= model.retain_max, f"{ctx}: log start {start} > announced retention {model.retain_max}"

        # The whole log reads back, contiguous and intact, with content derived from the offsets.
        present: dict[int, int] = {}
        epochs: list[tuple[int, int]] = []
        expected = start
        for batch in log.batches():
            h = batch.header
            where = f"{ctx}: batch at offset {h.base_offset}"
            assert h.base_offset == expected, f"{where}: expected offset {expected}"
            checked = check_batch(batch.raw, 0, len(batch.raw))
            assert not isinstance(checked, str), f"{where}: {checked}"
            assert h.leader_epoch == child.epoch_for(h.base_offset), where
            assert h.base_timestamp == child.timestamp_for(h.base_offset), where
            got = [(r.offset, r.key, r.value) for r in batch.records()]
            want = [(h.base_offset + i, k, v)
                    for i, (k, v) in enumerate(child.expected_records(h.base_offset, h.records_count))]
            assert got == want, f"{where}: records differ"
            if not epochs or epochs[-1][0] != h.leader_epoch:
                epochs.append((h.leader_epoch, h.base_offset))
            present[h.base_offset] = h.last_offset
            expected = h.last_offset + 1
        assert expected == end, f"{ctx}: batches end at {expected}, the log at {end}"

        # Every acknowledged batch at or above the log start is there, whole.
        for base, last in sorted(model.acked.items()):
            if last < start:
                continue
            assert base >= start, f"{ctx}: log start {start} cuts acknowledged batch [{base}, {last}]"
            assert present.get(base) == last, (
                f"{ctx}: acknowledged batch [{base}, {last}] lost (log is [{start}, {end}))")
        model.acked = {b: last for b, last in model.acked.items() if last >= start}

        assert log.epoch_entries == epochs, f"{ctx}: epoch cache {log.epoch_entries} != batches {epochs}"
        for base in rng.sample(sorted(present), min(5, len(present))):
            assert log.epoch_for_offset(base) == child.epoch_for(base), ctx
            assert log.offset_for_timestamp(child.timestamp_for(base)) == base, ctx
            read = log.read(base, 1)
            assert read.start_offset == base and bytes(read.data)[:8] == base.to_bytes(8, "big"), ctx

        # Appending works again; the next child (or the final check) must find this batch.
        count = rng.randint(1, 4)
        info = log.append(child.encode_for(end, count), epoch=child.epoch_for(end))
        assert (info.base_offset, info.last_offset) == (end, end + count - 1), ctx
        assert [r.value for b in log.batches(end) for r in b.records()] == [
            v for _, v in child.expected_records(end, count)], ctx
    finally:
        log.close()
    model.acked[end] = end + count - 1  # closed: durable


@pytest.mark.slow
@pytest.mark.timeout(60 + 3 * ROUNDS)
@pytest.mark.parametrize("policy", ["fsync", "group", "interval"])
def test_sigkill_never_loses_acknowledged_batches(tmp_path: Path, policy: str) -> None:
    seed = _seed()
    print(f"\ncrash test policy={policy} seed={seed} rounds={ROUNDS} "
          f"(replay: EPOCHLOG_CRASH_SEED={seed} EPOCHLOG_CRASH_ROUNDS={ROUNDS})")
    rng = random.Random(f"{seed}:{policy}")
    directory = tmp_path / "log"
    model = _Model()
    started = time.monotonic()
    for round_no in range(ROUNDS):
        ctx = f"seed={seed} policy={policy} round={round_no}"
        run = _run_and_kill(directory, policy, rng.getrandbits(32), rng, ctx)
        _absorb(run, model, ctx)
        _verify_and_append(directory, policy, model, rng, ctx)
    _check_clean_reopen(directory, policy, model)
    print(f"crash test policy={policy} seed={seed}: {ROUNDS} kills in {time.monotonic() - started:.1f} s, "
          f"{len(model.acked)} acknowledged batches kept, {model.kills_before_ready} kills before READY, "
          f"{model.behind_rolls} inside a roll, {model.torn_tails} torn tails cut ({model.bytes_cut} bytes)")


ROLL_POINTS = ["before", *(f"io{k}" for k in range(1, 9)), "after"]  # past the last io is "after"


def _fill_and_close(directory: Path, policy: str, model: _Model, *, full: bool) -> None:
    """Write a few batches, or (`full`) fill the first segment so that no batch the child can write at
    the log end fits, then close: the recovery point is the log end, and with `full` the child's first
    append rolls there."""
    config = child.config_for(policy)
    with Log.open(directory, config) as log:
        for i in range(10**6 if full else 5):
            end = log.end_offset
            batch = child.encode_for(end, 1)   # the smallest batch any child writes at `end`
            if full and log.segment_spans()[-1][2] + len(batch) > config.segment_bytes:
                break
            log.append(batch, epoch=child.epoch_for(end))
            model.acked[end] = end
        assert len(log.segment_bases()) == 1, "the fill rolled"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", ROLL_POINTS)
@pytest.mark.parametrize("full", [True, False], ids=["at-recovery-point", "after-appends"])
def test_sigkill_inside_a_roll(tmp_path: Path, full: bool, point: str) -> None:
    """SIGKILL at `point` of the child's first roll: the log opens, keeps every acknowledged batch and
    reads back whole (a sealed segment below the recovery point is trusted to be trimmed and flushed)."""
    policy = "fsync"
    directory = tmp_path / "log"
    model = _Model()
    _fill_and_close(directory, policy, model, full=full)
    ctx = f"roll killed at {point} ({'full segment' if full else 'after appends'})"
    code, stdout, stderr = forked.run(child.main, [str(directory), policy, "1"], tmp_path / "child.out",
                                      tmp_path / "child.err", START_TIMEOUT_S + child.MAX_SECONDS,
                                      env={"EPOCHLOG_CRASH_AT": f"log.roll:{point}"})
    assert code == -signal.SIGKILL, f"{ctx}: rc={code}\n{stderr}"
    assert "epochlog-crash: SIGKILL at log.roll" in stderr, f"{ctx}: killed elsewhere\n{stderr}"
    lines = stdout.splitlines()
    if full:
        assert not any(line.startswith("ACK") for line in lines), f"{ctx}: the first append did not roll"
    _absorb(_ChildRun(lines, stderr, code), model, ctx)
    _verify_and_append(directory, policy, model, random.Random(point), ctx)
    _check_clean_reopen(directory, policy, model)
