"""Delta maintenance of an exported table (spark/maintenance.py): optimize and vacuum, on real tables.

1. Many small export runs (tests/spark/plain_export.py: the Spark writer's files and commit, without a
   Spark job each), then optimize: the file count drops; ONE commit (OPTIMIZE, every add/remove with
   dataChange=false); every row identical (the full table, sorted) and the audit answers identical
   (Spark's after the optimize, the in-process engine's before it); the export watermarks unchanged;
   time travel to a version before the optimize still reads exactly what it read; the next export
   (through Spark) continues without gap or duplicate; the CLI (`epochlog table info|optimize`)
   reports the same.
2. Vacuum: refuses a retention below the table's minimum unless forced; removes the files of a
   killed run (never committed) once older than the retention and keeps a run still writing, every
   referenced file, and the files an optimize removed within the retention (time travel still works);
   a dry run deletes nothing.
3. A SIGKILL at random moments of an optimize (a child process; four moments, EPOCHLOG_SOAK=<k> k times as
   many): the table stays readable with the same rows and watermarks, at its old or its new version;
   optimizing again works; vacuum removes what the killed run left.

Replay: EPOCHLOG_MAINTENANCE_SEED=<seed printed>.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark.audit import Audit, Point
from spark.audit_local import LocalAudit
from spark.commit import DayFiles
from spark.errors import MaintenanceError
from spark.export import export_once
from spark.maintenance import optimize_table, table_files, vacuum_table
from spark.records import to_batch
from spark.sources import OfflineSource
from tests.spark.plain_export import plain_export
from tests.spark.synthetic import BASE_TIMESTAMP_MS, write_group
from tests.support.seeds import soak
from spark.table import resolve

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_MAINTENANCE_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(16)


def rows(root: Path, version: int | None = None) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    dt = DeltaTable(str(root), version=version) if version is not None else DeltaTable(str(root))
    table = dt.to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: (r["group"], r["offset"]))


def epochlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, check=False)


def audits(spark: Any, table: Path, version: int | None = None) -> list[Any]:
    """The same questions at a few points; `spark` None: asked of the in-process engine."""
    snapshot = resolve(table, version=version)
    audit = Audit(spark, snapshot) if spark is not None else LocalAudit(snapshot)
    return [audit.state(Point(group="kv", offset=o), "kv/") for o in (150, 700, 10**9)] + [audit.history("kv/k/00000003")]


def test_optimize_keeps_rows_audits_watermarks_and_time_travel(tmp_path: Path, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_MAINTENANCE_SEED={seed}")
    data, table = tmp_path / "node", tmp_path / "events"
    (data / "groups" / "kv" / "log").mkdir(parents=True)
    source = OfflineSource.discover(data)
    for run in range(6):   # six small runs, each spanning two days: two files per run
        write_group(data, "kv", 200, batch_records=20, keys=40, seed=seed + run, segment_bytes=64 << 10,
                    timestamp_ms=BASE_TIMESTAMP_MS + run * 3_600_000, ms_per_event=DAY_MS / 100)
        assert plain_export(table, source) == run + 1
    before = table_files(table)
    assert before.version == 6 and before.files >= 12 and before.small_files == before.files
    v3_rows, all_rows = rows(table, 3), rows(table)
    # The answers before: the in-process engine's (tests/spark/test_audit_local.py holds it to Spark's),
    # those after the optimize: Spark's, reading the rewritten files.
    v3_audits, all_audits = audits(None, table, 3), audits(None, table)

    result = optimize_table(table, target_file_bytes=16 << 20)
    after = table_files(table)
    assert (result.table_version_before, result.table_version) == (6, 7)
    singles = sum(1 for n in before.partitions.values() if n == 1)   # a lone file is left as it is
    assert result.files_removed == before.files - singles and after.files == len(after.partitions) < before.files
    assert after.watermarks == before.watermarks == {"kv": before.watermarks["kv"]}
    commit = [json.loads(line) for line in (table / "_delta_log" / f"{7:020d}.json").read_text().splitlines()]
    assert [a["commitInfo"]["operation"] for a in commit if "commitInfo" in a] == ["OPTIMIZE"]
    changes = [a.get("add") or a.get("remove") for a in commit if "add" in a or "remove" in a]
    assert len(changes) == result.files_added + result.files_removed and not any(c["dataChange"] for c in changes)
    assert rows(table) == all_rows, "the rows changed"
    assert audits(spark_session, table) == all_audits, "the audit answers changed"
    assert rows(table, 3) == v3_rows and audits(spark_session, table, 3) == v3_audits, "time travel changed"
    assert optimize_table(table, target_file_bytes=16 << 20).table_version == 7, "nothing left to compact"

    # The next export continues exactly after the watermark: no gap, no duplicate.
    last = write_group(data, "kv", 250, batch_records=25, keys=40, seed=seed + 99, segment_bytes=64 << 10,
                       timestamp_ms=BASE_TIMESTAMP_MS + 2 * DAY_MS)
    assert export_once(spark_session, table, source, range_offsets=10**9).table_version == 8
    offsets = [r["offset"] for r in rows(table) if r["group"] == "kv"]
    assert len(offsets) == len(set(offsets)) and offsets == sorted(offsets)
    assert set(offsets) >= set(range(before.watermarks["kv"] + 1, last + 1)) - _control_offsets(data)
    assert table_files(table).watermarks == {"kv": last}

    info = epochlog("table", "info", "--table", str(table), "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["files"] == table_files(table).files
    cli = epochlog("table", "optimize", "--table", str(table), "--target-file-mb", "16", "--json")
    assert cli.returncode == 0, cli.stderr
    final = table_files(table)
    assert json.loads(cli.stdout)["table_version"] == 9 and final.files == len(final.partitions)
    assert rows(table)[:len(all_rows)] == all_rows


def _control_offsets(data: Path) -> set[int]:
    from eventlog.log import Log

    with Log.open(data / "groups" / "kv" / "log") as log:
        return {b.header.base_offset for b in log.batches() if b.header.is_control}


def test_vacuum_removes_killed_runs_files_keeps_what_versions_need(tmp_path: Path) -> None:
    seed = _seed()
    data, table = tmp_path / "node", tmp_path / "events"
    (data / "groups" / "kv" / "log").mkdir(parents=True)
    source = OfflineSource.discover(data)
    for run in range(4):
        write_group(data, "kv", 150, batch_records=15, keys=30, seed=seed + run, segment_bytes=64 << 10,
                    timestamp_ms=BASE_TIMESTAMP_MS + run * 1000)
        plain_export(table, source)
    # Files of an export killed before its commit two days ago, and of one still writing now.
    batch = to_batch("kv", [next(iter(source.read("kv", 5, 6)))[0]])
    old, fresh = DayFiles(table), DayFiles(table)
    old.write(batch)
    fresh.write(batch)
    old_files, fresh_files = old.close(), fresh.close()
    two_days_ago = time.time() - 2 * DAY_MS / 1000
    for f in old_files:
        os.utime(table / f.path, (two_days_ago, two_days_ago))
    referenced = set(resolve(table).files)
    all_rows = rows(table)
    assert table_files(table).unreferenced_files == 2

    with pytest.raises(MaintenanceError, match="below the table's minimum"):
        vacuum_table(table, retain_hours=24)
    refused = epochlog("table", "vacuum", "--table", str(table), "--retain-hours", "24")
    assert refused.returncode == 3 and "--force" in refused.stderr
    dry = vacuum_table(table, retain_hours=24, force=True, dry_run=True)
    assert dry.files == [old_files[0].path] and (table / old_files[0].path).exists()
    done = vacuum_table(table, retain_hours=24, force=True)
    assert done.files == [old_files[0].path] and not (table / old_files[0].path).exists()
    assert (table / fresh_files[0].path).exists(), "a run still writing keeps its files"
    assert all(Path(u.removeprefix("file://")).exists() for u in referenced) and rows(table) == all_rows

    pre = table_files(table).version
    optimize_table(table, target_file_bytes=16 << 20)
    assert vacuum_table(table, retain_hours=24, force=True).files == []
    assert rows(table, pre) == all_rows, "time travel within the retention still reads"
    everything = vacuum_table(table, retain_hours=0, force=True)
    assert fresh_files[0].path in everything.files and len(everything.files) >= len(referenced)
    assert rows(table) == all_rows and table_files(table).unreferenced_files == 0


CHILD = """
import sys
from spark.maintenance import optimize_table
print("READY", flush=True)
optimize_table(sys.argv[1], target_file_bytes=16 << 20, max_concurrent_tasks=1)
print("DONE", flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_optimize_leaves_the_table_consistent(tmp_path: Path) -> None:
    import shutil

    seed = _seed()
    print(f"EPOCHLOG_MAINTENANCE_SEED={seed}")
    rng = random.Random(seed)
    data, base = tmp_path / "node", tmp_path / "base"
    (data / "groups" / "kv" / "log").mkdir(parents=True)
    source = OfflineSource.discover(data)
    for run in range(30):
        write_group(data, "kv", 60, batch_records=10, keys=30, seed=seed + run, segment_bytes=64 << 10,
                    timestamp_ms=BASE_TIMESTAMP_MS + run * 40_000_000, ms_per_event=300_000)
        plain_export(base, source)
    want, marks = rows(base), table_files(base).watermarks
    version = table_files(base).version

    def run_child(root: Path, kill_after: float | None) -> int:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        if kill_after is not None:
            time.sleep(kill_after)
            proc.send_signal(signal.SIGKILL)
        proc.wait(120)
        return proc.returncode

    timing = tmp_path / "timing"
    shutil.copytree(base, timing)
    started = time.perf_counter()
    assert run_child(timing, None) == 0
    duration = time.perf_counter() - started
    outcomes = set()
    for trial in range(soak(4)):   # each a child process (deltalake's import) and a copy: 6 before the suite's bound
        work = tmp_path / f"t{trial}"
        shutil.copytree(base, work)
        delay = rng.uniform(0, duration * 1.1)
        code = run_child(work, delay)
        info = table_files(work)
        ctx = f"seed {seed}, trial {trial}, killed after {delay:.3f} s of {duration:.3f} (exit {code})"
        assert info.version in (version, version + 1), ctx
        assert rows(work) == want and info.watermarks == marks, ctx
        outcomes.add(info.version)
        optimize_table(work, target_file_bytes=16 << 20)
        assert table_files(work).files == len(info.partitions), ctx
        vacuum_table(work, retain_hours=0, force=True)
        assert table_files(work).unreferenced_files == 0 and rows(work) == want, ctx
    print(f"versions after the kills: {sorted(outcomes)}; optimize took {duration:.2f} s")
