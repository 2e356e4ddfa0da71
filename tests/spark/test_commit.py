"""The Delta side without Spark: plans, the one commit per run, conflicts, abort, time travel errors."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark import table
from spark.commit import DayFiles, commit_run, delete_unreferenced
from spark.errors import AuditError, ExportConflictError
from spark.plan import ExportPlan
from spark.records import MALFORMED, SourceRecord, to_batch
from statemachines import events as ev


def _records(lo: int, hi: int, ts_ms: int = 1_767_225_600_000) -> list[SourceRecord]:
    return [SourceRecord(o, f"kv/k{o % 7}", ev.encode_event(ev.KvPut(name=f"k{o % 7}", value=b"v%d" % o, actor="t")),
                         ts_ms + o * 3_600_000, 2, True) for o in range(lo, hi)]


def _files(root: Path, group: str, lo: int, hi: int) -> list:
    out = DayFiles(root)
    out.write(to_batch(group, _records(lo, hi)))
    return out.close()


def test_plan_cuts_ranges_and_starts_after_the_export() -> None:
    plan = ExportPlan.make({"kv": 9, "offsets": -1}, {"kv": (0, 29), "offsets": (5, 6), "metadata": (0, -1)},
                           range_offsets=8)
    assert [(r.group, r.lo, r.hi) for r in plan.ranges()] == [
        ("kv", 10, 18), ("kv", 18, 26), ("kv", 26, 30), ("offsets", 5, 7)]
    kv = next(g for g in plan.groups if g.group == "kv")
    offsets = next(g for g in plan.groups if g.group == "offsets")
    assert (kv.skipped, offsets.skipped, plan.offsets) == (0, 5, 22)
    assert ExportPlan.from_json(plan.to_json()) == plan
    assert ExportPlan.make({"kv": 29}, {"kv": (0, 29)}).empty


def test_one_commit_per_run_then_a_second_run_of_the_same_range_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "events"
    table.open_or_create(root)
    plan = ExportPlan.make({}, {"kv": (0, 99)})
    first = _files(root, "kv", 0, 100)
    assert commit_run(root, first, plan) == 1
    dt = table.open_table(root)
    assert dt.transaction_version("exporter/kv") == 99
    assert dt.to_pyarrow_table().num_rows == 100
    assert dt.metadata().configuration["delta.appendOnly"] == "true"

    again = _files(root, "kv", 0, 100)       # a run planned before the first one committed
    with pytest.raises(ExportConflictError):
        commit_run(root, again, plan)
    # Spark's abort after the refusal: only the refused run's files go.
    assert sorted(delete_unreferenced(root, again)) == sorted(f.path for f in again)
    # abort after a successful Delta commit (Spark calls it when something fails later): nothing goes.
    assert delete_unreferenced(root, first) == []
    assert all((root / f.path).exists() for f in first)
    assert table.open_table(root).to_pyarrow_table().num_rows == 100


def test_concurrent_commits_of_different_groups_both_land(tmp_path: Path) -> None:
    root = tmp_path / "events"
    table.open_or_create(root)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(group: str) -> None:
        try:
            files = _files(root, group, 0, 50)
            barrier.wait()
            commit_run(root, files, ExportPlan.make({}, {group: (0, 49)}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(g,)) for g in ("kv", "offsets")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    dt = table.open_table(root)
    assert dt.version() == 2
    assert (dt.transaction_version("exporter/kv"), dt.transaction_version("exporter/offsets")) == (49, 49)
    assert dt.to_pyarrow_table().num_rows == 100


def test_rows_carry_the_event_and_malformed_values_become_rows() -> None:
    good = _records(0, 1)[0]
    bad = SourceRecord(1, "kv/x", b"\x93not an event", 1_767_225_600_000, 3, False)
    batch = to_batch("kv", [good, bad]).to_pylist()
    assert batch[0]["event_type"] == "KvPut" and batch[0]["actor"] == "t" and batch[0]["term"] == 2
    assert batch[0]["date"] == "2026-01-01" and '"name":"k0"' in batch[0]["payload"]
    assert batch[1]["event_type"] == MALFORMED and batch[1]["applied"] is False
    with pytest.raises(ev.SchemaVersionError):
        newer = ev.encode_event(ev.KvPut(name="a", value=b"", v=99))
        to_batch("kv", [SourceRecord(2, "kv/a", newer, 0, 1, None)])


def test_time_travel_resolves_versions_and_refuses_what_delta_rs_would_not(tmp_path: Path) -> None:
    root = tmp_path / "events"
    with pytest.raises(AuditError, match="not a Delta table"):
        table.resolve(root)
    table.open_or_create(root)
    created = table.resolve(root)
    time.sleep(0.05)
    commit_run(root, _files(root, "kv", 0, 10), ExportPlan.make({}, {"kv": (0, 9)}))
    time.sleep(0.05)
    between = datetime.now(UTC)
    time.sleep(0.05)
    commit_run(root, _files(root, "kv", 10, 30), ExportPlan.make({"kv": 9}, {"kv": (0, 29)}))
    assert table.resolve(root).version == 2
    assert table.resolve(root, version=1).version == 1
    assert len(table.resolve(root, version=0).files) == 0
    assert table.resolve(root, as_of=between).version == 1
    assert table.resolve(root, as_of=between.isoformat()).version == 1
    with pytest.raises(AuditError, match="version 7 does not exist"):
        table.resolve(root, version=7)
    with pytest.raises(AuditError, match="before the table existed"):
        table.resolve(root, as_of=datetime.fromtimestamp(created.committed_ms / 1000 - 60, tz=UTC))
    with pytest.raises(AuditError, match="is not a time"):
        table.resolve(root, as_of="yesterday")
