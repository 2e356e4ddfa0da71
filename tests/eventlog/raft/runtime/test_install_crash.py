"""kill -9 at every file-system step of installing a snapshot with its log prefix: old state or new, and
the log always opens.

The parent builds a leader whose log was cleaned (tests/eventlog/raft/runtime/test_snapshot_image.py's) and the image
of its snapshot at 299, and a follower with a log and a snapshot of its own. A child
(`install_crash_child.py`) stages the image and installs it, SIGKILLing itself just before or just
after its j-th file-system call (every rename, replace, unlink, link, rmdir, mkdir, fsync and
fdatasync: the staged directory renamed into place, the parts linked into the log, the journal, the
old segments deleted, the parts renamed, each checkpoint, the active segment, the journal and the
prefix directory removed, the old snapshots dropped). For every kill point, on a fresh copy:

- `verify_log_dir` on the crashed log finds no corruption (at worst an install that open finishes);
- `LogStorage.open` succeeds and leaves either the old state (its own snapshot and log, byte for
  byte) or the new one (snapshot 299; below 300 the leader's batches byte for byte as cleaned
  segments, log start 0, clean_end_offset 300, the active segment empty at 300), never a mix, and the
  new one from the first point where it shows on: no `.prefix` file, journal or `prefix/` directory
  is left, and the log then verifies clean and takes appends after the snapshot.

The suite runs a seeded sample of the points (printed): one side of each event, two of each run of
like calls (EPOCHLOG_INSTALL_CRASH_POINTS=all runs all of them, about 3 minutes).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from compaction.cleaner import clean_log
from eventlog.offline import Verdict, verify_log_dir
from eventlog.prefix import JOURNAL_NAME, PREFIX_SUFFIX
from eventlog.raft.runtime.log_storage import LogStorage
from tests.eventlog.raft.runtime import install_crash_child
from tests.eventlog.raft.runtime.install_crash_child import CONF, CONFIG
from tests.support import forked
from tests.eventlog.raft.runtime.test_snapshot_image import CFG, CLEANER, batches, entries

LEADER_CONFIG = replace(CFG, segment_bytes=12 << 10)   # a few prefix segments: a few dozen kill points


def _points(events: list[list[str]]) -> list[int]:
    """Kill points, in order: all of them with EPOCHLOG_INSTALL_CRASH_POINTS=all; else, drawn from a
    printed seed (EPOCHLOG_INSTALL_CRASH_SEED=<seed> replays), one side of every event, but only two
    events of each run of three or more like calls (a link, a rename per part file...)."""
    if os.environ.get("EPOCHLOG_INSTALL_CRASH_POINTS") == "all":
        return list(range(2 * len(events)))
    env = os.environ.get("EPOCHLOG_INSTALL_CRASH_SEED")
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"seed={seed} (EPOCHLOG_INSTALL_CRASH_SEED={seed}; EPOCHLOG_INSTALL_CRASH_POINTS=all runs every point)")
    rng = random.Random(seed)
    runs: list[list[int]] = []
    for j, event in enumerate(events):
        if runs and events[runs[-1][-1]][2] == event[2]:
            runs[-1].append(j)
        else:
            runs.append([j])
    chosen = []
    for run in runs:
        chosen += run if len(run) < 3 else rng.sample(run, 2)
    return sorted(2 * j + rng.randrange(2) for j in chosen)


def child(group: Path, image: Path, meta: Path, point: int) -> subprocess.CompletedProcess[str]:
    """install_crash_child.py on `group`, forked (tests/support/forked.py): a fork, not an interpreter
    start, per kill point."""
    code, out, err = forked.run(install_crash_child.main, [str(group), str(image), str(meta), str(point)],
                                group.parent / f"{group.name}.out", group.parent / f"{group.name}.err", timeout=60)
    return subprocess.CompletedProcess([], code if code is not None else -9, out, err)


@pytest.mark.slow
def test_kill9_at_every_step_of_a_prefix_install_leaves_the_old_state_or_the_new(tmp_path: Path) -> None:
    leader = LogStorage.open(tmp_path / "leader", LEADER_CONFIG, CONF, ships_log_prefix=True)
    leader.append(entries(0, 1, 60) + entries(120, 2, 90))
    clean_log(leader.log, 240, CLEANER, force=True)
    leader.create_snapshot(299, CONF, lambda p: p.write_bytes(b"views@299" * 100))
    meta = leader.snapshot()
    (tmp_path / "image").write_bytes(leader.snapshot_chunk(meta.index, 0, meta.size))
    (tmp_path / "meta").write_bytes(msgspec.json.encode(meta))
    expected = batches(leader, 0, 300)
    parts = len(leader._images[299].parts)
    leader.close()

    pristine = tmp_path / "pristine"
    own = LogStorage.open(pristine, CONFIG, CONF, ships_log_prefix=True)
    own.append(entries(0, 1, 40))
    own.create_snapshot(49, CONF, lambda p: p.write_bytes(b"own@49"))
    old = batches(own, 0, 80)
    own.close()

    shutil.copytree(pristine, tmp_path / "dry")
    dry = child(tmp_path / "dry", tmp_path / "image", tmp_path / "meta", -1)
    assert dry.returncode == 0 and "DONE" in dry.stdout, dry.stderr[-3000:]
    events = [line.split(maxsplit=3) for line in dry.stdout.splitlines() if line.startswith("EVENT")]
    print(f"{len(events)} file-system events in an install of {parts} prefix segments")
    assert any(e[2] == "link" for e in events) and any(e[2] == "rename" for e in events)

    installed_from = None
    for point in _points(events):
        group = tmp_path / f"p{point}"
        shutil.copytree(pristine, group)
        result = child(group, tmp_path / "image", tmp_path / "meta", point)
        assert result.returncode == -9, (point, result.returncode, result.stderr[-3000:])
        where = f"killed {'before' if point % 2 == 0 else 'after'} event {events[point // 2][1:]}"
        report = verify_log_dir(group / "log")
        assert report.verdict is not Verdict.CORRUPT, (where, report.problems)
        st = LogStorage.open(group, CONFIG, CONF, ships_log_prefix=True)
        log = st.log
        new = st.latest_snapshot.index == 299
        if new:
            installed_from = installed_from if installed_from is not None else point
            assert (log.start_offset, log.end_offset, log.clean_end_offset) == (0, 300, 300), where
            assert batches(st, 0, 300) == expected, where
            assert st.first_index() == 300 and st.term(299) == 2, where
        else:
            assert installed_from is None, f"{where}: the old state after the new one showed at {installed_from}"
            assert st.latest_snapshot.index == 49 and batches(st, 0, 80) == old, where
        leftovers = [p.name for p in (group / "log").iterdir() if p.name.endswith(PREFIX_SUFFIX) or p.name == JOURNAL_NAME]
        leftovers += [str(p) for p in (group / "snapshots").glob("[0-9]*/prefix")]   # incoming.tmp: staged
        assert not leftovers, (where, leftovers)
        st.append(entries(log.end_offset, 3, 3))
        st.close()
        report = verify_log_dir(group / "log")
        assert report.verdict is Verdict.CLEAN, (where, report.problems)
        shutil.rmtree(group)
    assert installed_from is not None, "the last kill points leave the install done"
    print(f"old state up to point {installed_from - 1}, the new one from point {installed_from}")
