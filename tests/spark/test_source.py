"""The `epochlog` Spark source as users call it, bounded runs, and `--follow` as a checkpointed stream.

1. `spark.read.format("epochlog")` with endpoints or offline, groups, startingOffsets and endingOffsets
   (JSON per group, earliest, latest): exactly the events of those offsets; a start below the log
   start is refused (compacted events) unless failOnDataLoss=false.
2. `--max-offsets-per-run`: a backlog larger than it becomes several commits of at most that many
   offsets; `epochlog export` SIGKILLed after its first commits keeps them, and the rerun resumes
   after them: every event exactly once.
3. `epochlog export --follow` against a running node while a writer keeps writing: micro-batches of at
   most maxOffsetsPerTrigger offsets, SIGKILLed, restarted from its checkpoint (batch ids go on), and
   the table ends with every committed event exactly once. The restart is `spark.export.follow` (what
   `--follow` runs) in this process's session: one JVM start fewer than a second `epochlog export`.

Replay: EPOCHLOG_SOURCE_SEED=<seed printed>.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spark.errors import ExportError
from spark.export import export_backlog
from spark.sources import OfflineSource
from tests.spark.synthetic import BASE_TIMESTAMP_MS, write_group
from spark.table import exported_through, open_table
from statemachines import events as ev
from tests.spark.test_cluster_export import _committed_events
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
# The --follow test: its writer puts 10 events every WRITE_PAUSE_S (at most 4,000), fewer a second than a
# micro-batch of at most FOLLOW_CAP offsets exports, so once a JVM runs the stream keeps up; the backlog a
# JVM's start leaves fills its first micro-batches to the cap. The time after the writes is the catching
# up of what is left, FOLLOW_CAP at a time: with 150 it was 26 micro-batches after a loaded machine's slow
# JVM start let the writer finish first (66 s of a 289 s test at load 18-25).
WRITE_PAUSE_S = 0.1
FOLLOW_CAP = 400


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_SOURCE_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(16)


def _events(data: Path, group: str, n: int, seed: int, **kw: Any) -> list[int]:
    """Write `n` events to `group` offline; the offsets of the events written."""
    offsets: list[int] = []
    write_group(data, group, n, batch_records=50, keys=40, seed=seed, segment_bytes=128 << 10,
                timestamp_ms=BASE_TIMESTAMP_MS, on_event=lambda o, _ts, _e: offsets.append(o), **kw)
    return offsets


def _table_offsets(table: Path, group: str) -> list[int]:
    rows = open_table(table).to_pyarrow_table(columns=["group", "offset"]).to_pylist()
    return sorted(r["offset"] for r in rows if r["group"] == group)


def test_reader_options_read_exactly_the_offsets_asked(tmp_path: Path, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_SOURCE_SEED={seed}")
    data = tmp_path / "node"
    kv = _events(data, "kv", 1200, seed)
    offsets = _events(data, "offsets", 300, seed + 1, key_prefix="o/")

    def read(**options: str) -> list[tuple[str, int]]:
        df = spark_session.read.format("epochlog").option("offline", str(data)).options(**options).load()
        return sorted((r["group"], r["offset"]) for r in df.select("group", "offset").collect())

    assert read(groups="kv", startingOffsets='{"kv": 100}', endingOffsets='{"kv": 400}', rangeOffsets="70") == [
        ("kv", o) for o in kv if 100 <= o < 400]
    assert read() == sorted([("kv", o) for o in kv] + [("offsets", o) for o in offsets])
    assert read(startingOffsets="latest") == []
    assert read(startingOffsets='{"offsets": -1}') == [("kv", o) for o in kv]   # kv from earliest
    df = spark_session.read.format("epochlog").option("offline", str(data)).option("groups", "kv").load()
    assert df.columns[:6] == ["offset", "group", "term", "timestamp", "event_type", "key"]
    first = df.orderBy("offset").first()
    assert first["event_type"] in ("KvPut", "KvDeleted") and first["key"].startswith("kv/")
    with pytest.raises(Exception, match="endpoints .* or offline"):
        spark_session.read.format("epochlog").load().collect()
    with pytest.raises(Exception, match="unknown groups"):
        spark_session.read.format("epochlog").option("offline", str(data)).option(
            "startingOffsets", '{"nope": 1}').load().collect()


def test_a_start_below_the_log_start_is_data_loss(tmp_path: Path) -> None:
    from spark.datasource import _check_loss

    with pytest.raises(ExportError, match="compacted before they were read: kv from 3"):
        _check_loss({}, {"kv": 3}, {"kv": (10, 20)})
    _check_loss({"failOnDataLoss": "false"}, {"kv": 3}, {"kv": (10, 20)})
    _check_loss({}, {"kv": 10}, {"kv": (10, 20)})


def test_bounded_runs_commit_in_steps_and_resume_after_a_kill(tmp_path: Path, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_SOURCE_SEED={seed}")
    data, table = tmp_path / "node", tmp_path / "events"
    kv = _events(data, "kv", 2500, seed)
    meta = _events(data, "metadata", 400, seed + 1, key_prefix="m/")
    source = OfflineSource.discover(data)

    # In process: 2,900 events (plus control offsets) in runs of at most 1,000 offsets.
    runs = export_backlog(spark_session, table, source, max_offsets=1000, range_offsets=300)
    assert len(runs) == 3 and [r.table_version for r in runs] == [1, 2, 3]
    assert all(r.plan.offsets <= 1000 for r in runs)
    assert runs[0].plan.active()[0].group == "kv" and len(runs[0].plan.active()) == 2   # shared fairly
    assert _table_offsets(table, "kv") == kv and _table_offsets(table, "metadata") == meta

    # A process SIGKILLed between its bounded commits: the commits it made stay, the rerun resumes.
    more = _events(data, "kv", 3000, seed + 2)
    killed = tmp_path / "killed"
    with open(tmp_path / "export.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "epochlog", "export", "--to", str(killed), "--offline", str(data),
             "--max-offsets-per-run", "900", "--range-offsets", "300", "--master", "local[1]", "--json",
             "--driver-memory", "600m", "--conf", "spark.sql.shuffle.partitions=3"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TMPDIR": str(tmp_path)})   # what its kill leaves: here
    try:
        wait_until(lambda: (killed / "_delta_log" / f"{2:020d}.json").exists() or proc.poll() is not None, 240,
                   "the second bounded commit")
        assert proc.poll() is None, (tmp_path / "export.log").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    kept = open_table(killed).version()
    through = exported_through(open_table(killed), ["kv"])["kv"]
    assert 2 <= kept and 0 <= through < kv[-1] + len(more), (kept, through)
    lines = [json.loads(line) for line in (tmp_path / "export.log").read_text().splitlines() if line.startswith("{")]
    assert all(sum(g["to"] - g["from"] + 1 for g in doc["groups"] if g["to"] is not None) <= 900 for doc in lines)
    # The Spark settings reached the session: the driver JVM's heap and the SQL setting as Spark took them.
    facts = lines[0]["spark"]
    assert facts["conf"]["spark.sql.shuffle.partitions"] == "3" and facts["conf"]["spark.driver.memory"] == "600m"
    assert 400 << 20 < facts["driver_max_heap_bytes"] <= 600 << 20
    rerun = export_backlog(spark_session, killed, source, max_offsets=5000, range_offsets=1000)
    first = rerun[0].plan.active()
    assert next(g.start for g in first if g.group == "kv") == through + 1
    assert _table_offsets(killed, "kv") == kv + more and _table_offsets(killed, "metadata") == meta


def test_progress_names_the_member_serving_each_range() -> None:
    from spark.export import serving_members
    from spark.plan import ExportPlan
    from spark.sources import ClusterSource

    source = ClusterSource(("a:1",), readers=("n1:1", "n2:1", "n3:1"))
    plan = ExportPlan.make({}, {"kv": (0, 449), "metadata": (0, 99)}, range_offsets=100)
    members = serving_members(source, plan)
    assert [(r.group, r.lo) for r in plan.ranges()] == [("kv", 0), ("kv", 100), ("kv", 200), ("kv", 300),
                                                        ("kv", 400), ("metadata", 0)]
    assert members == ["n1:1", "n2:1", "n3:1", "n1:1", "n2:1", "n3:1"]   # range i from member i mod n
    assert serving_members(OfflineSource(), plan) == [""] * 6


@pytest.mark.slow
@pytest.mark.timeout(600)   # a JVM start: minutes at load 20+
def test_follow_restarts_from_its_checkpoint_exactly_once(tmp_path: Path, spark_session: Any) -> None:
    from epochlog.client import Client
    from spark.export import BatchReport, follow
    from spark.session import activate
    from spark.sources import ClusterSource

    seed = _seed()
    print(f"EPOCHLOG_SOURCE_SEED={seed}")
    rng = random.Random(seed)
    cluster = NodeCluster(tmp_path / "cluster", size=1, seed=seed)
    table, checkpoint = tmp_path / "events", tmp_path / "checkpoint"
    first: subprocess.Popen[bytes] | None = None
    stop, halt = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    resumed: list[BatchReport] = []
    second: threading.Thread | None = None
    try:
        cluster.start()
        cluster.leader("kv")
        endpoints = ",".join(cluster.endpoints)

        def write() -> None:
            try:
                with Client(list(cluster.endpoints), timeout=10) as client:
                    for r in range(400):   # bounded: at most 400 rounds of 10 events
                        if stop.is_set():
                            return
                        client.commands([ev.KvPut(name=f"s/{rng.randrange(50)}", value=b"v%d" % r) for _ in range(10)])
                        time.sleep(WRITE_PAUSE_S)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()

        def batches() -> list[dict[str, Any]]:
            text = (tmp_path / "follow-1.log").read_text(errors="replace")
            return [json.loads(line) for line in text.splitlines() if line.startswith('{"table"')]

        # 1. `epochlog export --follow` in a process of its own, SIGKILLed (with its JVM: the whole
        #    process group) after three micro-batches.
        with open(tmp_path / "follow-1.log", "wb") as log:
            first = subprocess.Popen(
                [sys.executable, "-m", "epochlog", "export", "--to", str(table), "--endpoints", endpoints,
                 "--follow", "--interval", "1", "--checkpoint", str(checkpoint), "--max-offsets-per-run",
                 str(FOLLOW_CAP), "--range-offsets", "150", "--master", "local[1]", "--json"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "TMPDIR": str(tmp_path)})   # what its kill leaves: here
        wait_until(lambda: len(batches()) >= 3 or first.poll() is not None, 240, "three micro-batches")
        assert first.poll() is None, (tmp_path / "follow-1.log").read_text()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        done_before = max(b["batch"] for b in batches())
        assert all(b["rows"] <= FOLLOW_CAP for b in batches())

        # 2. The same query restarted from that checkpoint (here, in this process's session).
        def restart() -> None:
            try:
                activate(spark_session)
                follow(spark_session, table, ClusterSource(tuple(cluster.endpoints)), checkpoint=str(checkpoint),
                       interval_s=1.0, max_offsets=FOLLOW_CAP, range_offsets=150, on_batch=resumed.append,
                       stop=halt)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

        second = threading.Thread(target=restart, daemon=True)
        second.start()
        wait_until(lambda: resumed or not second.is_alive(), 240, "a micro-batch after the restart")
        assert second.is_alive(), failures
        stop.set()
        writer.join(60)
        assert not failures, failures
        with Client(list(cluster.endpoints), timeout=10) as client:
            want = {g: _committed_events(client, g) for g in ("kv", "metadata")}

        def caught_up() -> bool:
            assert second.is_alive(), failures
            return all(set(want[g]) <= set(_table_offsets(table, g)) for g in want)

        stopped = time.monotonic()
        wait_until(caught_up, 240, "the stream to export every committed event", interval=0.5)
        print(f"{sum(len(v) for v in want.values())} events committed; {len(batches())} micro-batches before the "
              f"kill, {len(resumed)} after it; caught up {time.monotonic() - stopped:.1f} s after the writes")
        halt.set()
        second.join(60)
        assert not second.is_alive() and not failures, failures
        for g, offsets in want.items():
            got = _table_offsets(table, g)
            assert len(got) == len(set(got)), f"{g}: duplicates"
            assert got[:len(offsets)] == offsets, g
        batch_ids = [b.batch_id for b in resumed]
        assert min(batch_ids) >= done_before, (done_before, batch_ids)   # from the checkpoint, not batch 0
        assert all(b.rows <= FOLLOW_CAP for b in resumed)
        assert (checkpoint / "commits").is_dir()
    finally:
        stop.set()
        halt.set()
        if first is not None and first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        if second is not None:
            second.join(60)
        cluster.close()
