"""Offline export (segment files of a stopped node) through Spark, then audit and time travel vs a model.

The segment directories are written with eventlog.log.Log (tests/spark/synthetic.py); the model is the list
of events written, replayed in Python. Checks: one row per event, offsets unique and exactly the
events' offsets (control batches hold the others); audit state at offsets and at times, history and
diff equal the model's; table versions and times resolve to the right snapshot; bad input is refused
with a clear message (also through the CLI, exit 3, before any Spark starts).
"""

from __future__ import annotations

import random
import subprocess
import threading
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from spark.audit import Audit, Point
from spark.export import export_once
from spark.sources import OfflineSource
from tests.spark.synthetic import BASE_TIMESTAMP_MS, write_group
from spark.table import open_table, resolve
from statemachines import events as ev

ROOT = Path(__file__).resolve().parents[2]


class Model:
    """Every event written: (group, offset, timestamp ms, event)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int, ev.Event]] = []

    def state(self, group: str, offset: int) -> dict[str, tuple[int, str]]:
        """key -> (offset of the last change, value) at offset `offset` of `group`."""
        return _state(e for e in self.events if e[0] == group and e[1] <= offset)

    def state_at(self, time_ms: int) -> dict[str, tuple[int, str]]:
        return _state(e for e in self.events if e[2] <= time_ms)


def _state(events: Any) -> dict[str, tuple[int, str]]:
    latest: dict[str, tuple[int, ev.Event]] = {}
    for _g, o, _ts, e in sorted(events, key=lambda x: x[1]):
        latest[e.key()] = (o, e)
    return {k: (o, e.value.decode()) for k, (o, e) in latest.items() if isinstance(e, ev.KvPut)}


def test_offline_export_audit_and_time_travel(tmp_path: Path, spark_session: Any) -> None:
    seed = random.SystemRandom().getrandbits(16)
    print(f"seed={seed}")
    data = tmp_path / "node"
    model = Model()

    def record(group: str) -> Any:
        def on_event(offset: int, ts: int, event: ev.Event) -> None:
            model.events.append((group, offset, ts, event))
        return on_event

    write_group(data, "kv", 3000, batch_records=100, keys=150, seed=seed, timestamp_ms=BASE_TIMESTAMP_MS,
                terms=2, segment_bytes=256 << 10, on_event=record("kv"))
    write_group(data, "offsets", 500, batch_records=50, keys=40, seed=seed + 1, timestamp_ms=BASE_TIMESTAMP_MS,
                segment_bytes=256 << 10, key_prefix="o/", on_event=record("offsets"))
    source = OfflineSource.discover(data)

    table = tmp_path / "events"
    first = export_once(spark_session, table, source, range_offsets=700)
    assert first.table_version == 1 and first.rows == 3500
    assert len(first.plan.ranges()) == 6            # kv: 5 ranges of 700 offsets, offsets: 1
    rows = open_table(table).to_pyarrow_table(columns=["group", "offset", "term"]).to_pylist()
    for g in ("kv", "offsets"):
        got = sorted(r["offset"] for r in rows if r["group"] == g)
        assert got == sorted(o for gg, o, _, _ in model.events if gg == g)   # unique, none missing
    assert {r["term"] for r in rows if r["group"] == "kv"} == {1, 2}
    time.sleep(0.05)
    between = datetime.now(UTC)
    time.sleep(0.05)

    # More events, a second run: the table's version 2; version 1 still answers as before.
    before_second = len(model.events)
    later = BASE_TIMESTAMP_MS + 3_600_000
    write_group(data, "kv", 1000, batch_records=100, keys=150, seed=seed + 2, timestamp_ms=later,
                segment_bytes=256 << 10, on_event=record("kv"))
    second = export_once(spark_session, table, source, range_offsets=700)
    assert second.table_version == 2 and second.rows == 1000
    assert export_once(spark_session, table, source).table_version is None   # nothing new: no commit

    v1 = Audit(spark_session, resolve(table, version=1))
    v2 = Audit(spark_session, resolve(table))
    assert resolve(table, as_of=between).version == 1
    kv_end_v1 = max(o for g, o, _, _ in model.events[:before_second] if g == "kv")
    mid = kv_end_v1 // 2
    model_v1 = Model()
    model_v1.events = model.events[:before_second]

    def as_map(rows: list[dict[str, Any]]) -> dict[str, tuple[int, str]]:
        return {r["key"]: (r["offset"], r["value"]) for r in rows}

    # State at offsets: each version answers from what it holds.
    assert as_map(v1.state(Point(group="kv", offset=mid), "kv/k/0000001")) == {
        k: v for k, v in model.state("kv", mid).items() if k.startswith("kv/k/0000001")}
    assert as_map(v1.state(Point(group="kv", offset=10**9), "kv/")) == model_v1.state("kv", 10**9)
    assert as_map(v2.state(Point(group="kv", offset=10**9), "kv/")) == model.state("kv", 10**9)
    # State at a time, across both groups.
    t = BASE_TIMESTAMP_MS + 1234
    when = datetime.fromtimestamp(t / 1000, tz=UTC)
    got_t = as_map(v2.state(Point(time=when)))
    want_t = model.state_at(t)
    assert got_t == want_t
    # History of one key and a diff between two times.
    key = model.events[5][3].key()
    hist = v2.history(key)
    assert [(h["group"], h["offset"]) for h in hist] == sorted((g, o) for g, o, _, e in model.events if e.key() == key)
    t2 = later + 500
    diff = v2.diff(Point(time=when), Point(time=datetime.fromtimestamp(t2 / 1000, tz=UTC)), "kv/")
    after = model.state_at(t2)
    assert {d["key"] for d in diff} == {k for k in want_t.keys() | after.keys() if want_t.get(k) != after.get(k)}
    assert len(v2.actions("bench", limit=10)) == 10


def _epochlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, check=False)


def test_audit_refuses_bad_input_before_starting_spark(tmp_path: Path) -> None:
    from spark.table import open_or_create

    table = tmp_path / "events"
    open_or_create(table)
    cases = [
        (["audit", "state", "--table", str(table), "--table-version", "9", "--offset", "1", "--group", "kv"],
         "table version 9 does not exist"),
        (["audit", "state", "--table", str(table), "--table-as-of", "2001-01-01T00:00:00Z", "--offset", "1",
          "--group", "kv"], "before the table existed"),
        (["audit", "history", "kv/app/x", "--table", str(table)], "kv keys are written without kv/, e.g. 'app/x'"),
        (["audit", "state", "--table", str(tmp_path / "nothing"), "--at", "2026-01-01"], "not a Delta table"),
    ]
    for argv, message in cases:
        started = time.monotonic()
        done = _epochlog(*argv)
        assert done.returncode == 3, (argv, done.stdout, done.stderr)
        assert message in done.stderr, (argv, done.stderr)
        assert time.monotonic() - started < 15   # refused before any JVM started
    usage = _epochlog("audit", "state", "--table", str(table), "--offset", "3")
    assert usage.returncode == 64 and "--group" in usage.stderr
    when = datetime(2026, 1, 1, tzinfo=UTC)
    assert _epochlog("audit", "diff", "--table", str(table), "--from", (when + timedelta(days=1)).isoformat(),
                     "--to", when.isoformat()).returncode == 3


def test_a_key_compacted_range_is_a_gap_for_the_first_export(tmp_path: Path) -> None:
    """An export starts where the log holds every record as written: past the key-compacted range (as the
    node's read_events reports it online), so a first run reports that range as skipped (a gap), as it
    does for a truncated one, instead of exporting each entity's latest record as if it were history."""
    from compaction.cleaner import clean_log
    from compaction.config import CleanerConfig
    from compaction.event_keys import compaction_key, is_delete
    from eventlog.config import LogConfig
    from eventlog.log import Log
    from eventlog.records import encode_batch
    from spark.plan import ExportPlan

    log = Log.open(tmp_path / "node" / "groups" / "kv" / "log",
                   LogConfig(segment_bytes=4096, flush_policy="fsync", preallocate_next_segment=False))
    try:
        for i in range(300):
            event = ev.KvPut(name=f"k{i % 7}", value=b"v" * 40)
            log.append(encode_batch([ev.event_record(event)], timestamp_ms=BASE_TIMESTAMP_MS + i), epoch=1)
        clean_log(log, log.segment_bases()[-1], CleanerConfig(worker_process=False), record_key_of=compaction_key,
                  is_tombstone=is_delete)
        end = log.clean_end_offset
    finally:
        log.close()
    assert end > 0
    bounds = OfflineSource.discover(tmp_path / "node").bounds()
    assert bounds["kv"][0] == end
    plan = ExportPlan.make({}, {"kv": (bounds["kv"][0], 299)})
    (kv,) = plan.groups
    assert (kv.start, kv.skipped) == (end, end)



def test_export_from_a_thread_other_than_the_sessions(tmp_path: Path, spark_session: Any) -> None:
    """Spark finds a Python data source's writer through the calling thread's active session: an export
    from another thread (the tour's asyncio.to_thread) failed with DATA_SOURCE_NOT_FOUND."""
    data = tmp_path / "node"
    write_group(data, "kv", 200, batch_records=50, keys=20, seed=1, timestamp_ms=BASE_TIMESTAMP_MS,
                segment_bytes=256 << 10)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(export_once(spark_session, tmp_path / "events", OfflineSource.discover(data)))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=300)
    assert not worker.is_alive(), "the export did not end within 300 s"
    [result] = outcome
    assert not isinstance(result, Exception), result
    assert result.table_version == 1 and result.rows == 200
