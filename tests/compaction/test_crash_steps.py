"""kill -9 at every step of compaction, on real `epochlog serve` processes.

Three nodes run with retention turned up (a snapshot every 150 offsets, 16 KiB segments, 100 offsets
of history, a check every 100 ms, pruning chunks of 40 rows every 20 ms) while a writer puts and
deletes keys through the SDK. Node 3 is started again and again with a crash point
(`EPOCHLOG_CRASH_AT`, eventlog/fault_injection.py): it SIGKILLs itself as a step starts (or just
before its first file operation, for the steps that usually have nothing to do), just after its
first or second file operation, or just after the step, for each step of the work this package
added: a snapshot's RocksDB checkpoint (on the loop) and its packing (in a thread), sealing it
(fsyncs), installing it (meta, rename, old snapshots removed), truncating the log (log start checkpoint,
segment renames) and unlinking the segments (a thread), and a pruning chunk's WriteBatch.

After every kill the node starts again from what the kill left, and at the end, with the writer
stopped and every node caught up:
- every node answers identically: each key's value, `get --as-of N` for every acknowledged write at
  or above the history floor (the acknowledged value, on every node), `compacted` naming the floor
  below it, and each key's history;
- stopped, the views of the three nodes have the same applied offset, history floor and digest, and
  the logs open (recovery included), are contiguous, and agree byte for byte where they overlap.

The points run by default are a seeded sample, one point of each step (printed; EPOCHLOG_CRASH_SEED=<seed>
replays the same sample); EPOCHLOG_CRASH_POINTS=all runs every point (about 2 minutes).
"""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from epochlog.client import Client, ClientError, CompactedError
from eventlog.config import LogConfig
from eventlog.fault_injection import CRASH_ENV_VAR, CRASH_STEPS
from statemachines.views import ViewsStateMachine
from tests.support.nodes import BackgroundWriter, NodeCluster
from tests.support.wait import wait_until
from tests.support.offline import compare_committed, read_log_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VICTIM = 3
KEYS = [f"crash/{i:02d}" for i in range(24)]
SEGMENT = 16 << 10
# Each step of retention (key compaction's steps are tests/epochlog/kafka/test_compaction.py's): before its first io,
# just after its first and second io, and after it.
STEPS = [step for step in CRASH_STEPS if not step.startswith(("clean.", "log."))]
POINTS = [f"{step}:{point}" for step in STEPS for point in ("before", "io1", "io2", "after")]
SAMPLE = len(STEPS)   # one point of each step (each more cost a node start and a snapshot's wait)


def _points() -> tuple[int, list[str]]:
    env = os.environ.get("EPOCHLOG_CRASH_SEED")
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    if os.environ.get("EPOCHLOG_CRASH_POINTS") == "all":
        return seed, list(POINTS)
    rng = random.Random(seed)
    # Every step once, at a point drawn.
    chosen = [rng.choice([p for p in POINTS if p.startswith(step + ":")]) for step in STEPS]
    return seed, chosen[:SAMPLE]


class Writer(BackgroundWriter):
    """Puts and deletes on KEYS through the SDK until stopped; every acknowledged write is recorded."""

    def __init__(self, endpoints: list[str], seed: int, acked: list[tuple[str, int, bytes | None]]) -> None:
        super().__init__()
        self.endpoints = endpoints
        self.seed = seed
        self.acked = acked   # (key, offset, value or None for a delete)
        self.errors = 0

    def _run(self) -> None:
        rng = random.Random(self.seed)
        with Client(self.endpoints, timeout=20.0) as client:
            i = 0
            while self.running:
                key = rng.choice(KEYS)
                try:
                    if rng.random() < 0.1:
                        result = client.delete(key)
                        self.acked.append((key, result.offset, None))
                    else:
                        value = f"{key}={i}".encode()
                        self.acked.append((key, client.put(key, value).offset, value))
                except ClientError:
                    self.errors += 1   # not_found for a delete, or an outcome the SDK could not learn
                i += 1


def _crash(cluster: NodeCluster, point: str, timeout: float = 60.0) -> float:
    """Start the victim armed with `point` and wait for it to die there; how long that took."""
    started = time.monotonic()
    cluster.env = {CRASH_ENV_VAR: point}
    cluster.start([VICTIM], wait=False)
    node = cluster.nodes[VICTIM]
    wait_until(lambda: not node.running, timeout, f"node {VICTIM} to die at {point}", interval=0.1)
    cluster.env = {}
    stderr = node.stderr()
    assert node.proc is not None and node.proc.returncode == -9, (node.proc and node.proc.returncode, stderr[-3000:])
    assert f"epochlog-crash: SIGKILL at {point}@1" in stderr, stderr[-3000:]
    return time.monotonic() - started


def _answers(client: Client, acked: list[tuple[str, int, bytes | None]], floor: int,
             applied: int) -> list[object]:
    out: list[object] = []
    for key in KEYS:
        kv = client.get(key, consistency="local", min_offset=applied)
        out.append((key, None if kv is None else (kv.value, kv.version)))
        out.append([(h.offset, h.event, h.state) for h in client.history(key, consistency="local",
                                                                        min_offset=applied)])

    def as_of(write: tuple[str, int, bytes | None]) -> tuple[str, int, object]:
        key, offset, _ = write
        try:
            kv = client.get(key, as_of=offset, consistency="local", min_offset=applied)
            return (key, offset, None if kv is None else kv.value)
        except CompactedError as exc:
            assert offset < floor and f"history floor {floor}" in str(exc) and "epochlog audit state" in str(exc)
            return (key, offset, "compacted")

    # Every acknowledged write, asked 16 at a time (the Client is thread-safe; one at a time, the ~2,000
    # round trips of each of the four passes took most of the test); the answers in `acked`'s order.
    with ThreadPoolExecutor(16) as pool:
        out.extend(pool.map(as_of, acked))
    return out


def _quiesced(cluster: NodeCluster, settle_s: float = 1.5, timeout: float = 60.0) -> tuple[int, int]:
    """(kv leader, its commit offset) once the commit offset stopped moving for `settle_s`: after the
    writes stop, the leader still commits the history floor it owes (a HistoryPruned event) and every
    node then prunes to it; answers compared meanwhile could name different floors."""
    deadline = time.monotonic() + timeout
    last: tuple[int, int] | None = None
    while True:
        leader = cluster.leader("kv")
        now = (leader, cluster.wait_group_status(leader, "kv").commit_offset)
        if now == last:
            return now
        assert time.monotonic() < deadline, f"kv kept committing: {last} -> {now}"
        last = now
        time.sleep(settle_s)


def test_kill9_at_every_compaction_step_then_identical_answers(tmp_path: Path) -> None:
    seed, points = _points()
    print(f"seed={seed} (EPOCHLOG_CRASH_SEED={seed}); points: {points}")
    cluster = NodeCluster(tmp_path / "cluster", size=3, seed=seed, snapshot_every_entries=150,
                          log={"segment_bytes": SEGMENT},
                          compaction={"retain_offsets": 100, "check_interval_ms": 100, "prune_interval_ms": 20,
                                      "prune_chunk_rows": 40, "compact_groups": []})
    writer = Writer(cluster.endpoints, seed, [])
    try:
        cluster.start()
        cluster.leader("kv")
        writer.start()
        wait_until(lambda: len(writer.acked) >= 300, 60, "the first writes")
        cluster.stop(VICTIM)
        for point in points:
            took = _crash(cluster, point)
            print(f"killed at {point} after {took:.1f}s ({len(writer.acked)} writes acknowledged)")
        cluster.start([VICTIM])
        done = len(writer.acked)
        wait_until(lambda: len(writer.acked) >= done + 200, 60, "writes after the last restart")
        writer.stop()
        print(f"{len(writer.acked)} writes acknowledged, {writer.errors} errors")

        leader, commit = _quiesced(cluster)
        infos = {n: cluster.wait_applied(n, "kv", commit, timeout=60) for n in cluster.nodes}
        asked = time.monotonic()
        with Client(cluster.endpoints, timeout=20.0) as client:
            floors = {n: client.compaction_status(cluster.endpoint(n)) for n in cluster.nodes}
            floor = {next(g.history_floor for g in f.groups if g.group == "kv") for f in floors.values()}
            assert len(floor) == 1, floors
            (history_floor,) = floor
            assert history_floor > 0 and all(i.log_start > 0 for i in infos.values()), (history_floor, infos)
            # Through the SDK, which picks the node (the same questions three times over asked the same
            # nodes again: once is enough).
            picked = _answers(client, writer.acked, history_floor, commit)
        # Each node on its own as well.
        answers = {}
        for n in cluster.nodes:
            with Client([cluster.endpoint(n)], timeout=20.0) as own:
                answers[n] = _answers(own, writer.acked, history_floor, commit)
        assert answers[1] == answers[2] == answers[3] == picked
        retained = [(k, o, v) for k, o, v in writer.acked if o >= history_floor]
        got = {(a[0], a[1]): a[2] for a in answers[1] if isinstance(a, tuple) and len(a) == 3}
        assert all(got[(k, o)] == v for k, o, v in retained), "an acknowledged write reads back otherwise"
        print(f"history floor {history_floor}: {len(retained)} acknowledged writes read back as of their offset on "
              f"every node, {len(writer.acked) - len(retained)} below it answer compacted "
              f"({time.monotonic() - asked:.1f} s of questions)")

        for n in [*(n for n in cluster.nodes if n != leader), leader]:   # followers first: no new leader's
            assert cluster.stop(n) == 0                                    # entry applied by some only
        views = {}
        for n in cluster.nodes:
            sm = ViewsStateMachine(cluster.nodes[n].data_dir / "groups" / "kv")
            try:
                views[n] = (sm.applied_index, sm.store.history_floor, sm.digest)
            finally:
                sm.close()
        assert len(set(views.values())) == 1, views
        logs = {n: read_log_dir(cluster.nodes[n].data_dir / "groups" / "kv" / "log",
                                LogConfig(segment_bytes=SEGMENT, preallocate_next_segment=False))
                for n in cluster.nodes}
        lo, hi, batches = compare_committed(logs, commit)
        print(f"views alike on the three nodes {views[1][:2]}; logs {[(x.start, x.end) for x in logs.values()]}, "
              f"[{lo}, {hi}] byte-identical where held ({batches} batches)")
    finally:
        writer.stop()
        cluster.close()
        print(cluster.describe())
