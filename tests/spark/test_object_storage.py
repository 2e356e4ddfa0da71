"""The events table on object storage: an S3-compatible server (moto's server mode, tests/spark/s3_server.py)
on 127.0.0.1, written by Spark executors through pyarrow's S3 filesystem and committed by delta-rs with
conditional puts; everything checked with deltalake reading the store directly.

1. Concurrent commits on the store: two runs of different groups both land (the conditional put makes
   the loser retry on the next version), two runs of one group: one wins, the other is refused.
2. Export, incremental export, audit (every answer equal to that of the same runs into a local directory,
   written without Spark by tests/spark/plain_export.py and asked with the in-process engine),
   time travel, optimize, vacuum, and the CLI reading credentials from the AWS_* variables.
3. `epochlog export --to s3://...` SIGKILLed once its first Parquet file is on the store, then run
   again: every event exactly once, and the killed run's files deleted by the rerun.

Replay: EPOCHLOG_S3_SEED=<seed printed>.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark import table
from spark.audit import Audit, Point
from spark.audit_local import LocalAudit
from spark.commit import DayFiles, commit_run
from spark.errors import ExportConflictError
from spark.export import export_once
from spark.maintenance import optimize_table, table_files, vacuum_table
from spark.plan import ExportPlan
from spark.records import to_batch
from spark.sources import OfflineSource
from spark.storage import TableLocation
from tests.spark.plain_export import plain_export
from tests.spark.synthetic import BASE_TIMESTAMP_MS, write_group
from tests.support.wait import wait_until
from tests.spark.s3_server import S3Server
from tests.spark.test_commit import _records

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "lake"


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_S3_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(16)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3") / "server.log").start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


def _location(s3: S3Server, name: str) -> TableLocation:
    return TableLocation.parse(f"s3://{BUCKET}/{name}", environ=s3.env)


def _rows(loc: TableLocation, version: int | None = None) -> list[dict[str, Any]]:
    """Every row, read by deltalake straight from the store, in (group, offset) order."""
    from deltalake import DeltaTable

    dt = DeltaTable(loc.uri, version=version, storage_options=loc.delta_options())
    return sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: (r["group"], r["offset"]))


def _files(loc: TableLocation, group: str, lo: int, hi: int) -> list[Any]:
    out = DayFiles(loc)
    out.write(to_batch(group, _records(lo, hi)))
    return out.close()


def test_concurrent_commits_on_the_store(s3: S3Server) -> None:
    loc = _location(s3, "concurrent")
    table.open_or_create(loc)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(group: str, lo: int, hi: int) -> None:
        try:
            files = _files(loc, group, lo, hi)
            barrier.wait()
            commit_run(loc, files, ExportPlan.make({}, {group: (0, hi - 1)}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(g, 0, 50)) for g in ("kv", "offsets")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    dt = table.open_table(loc)
    assert dt.version() == 2   # one version each: neither commit overwrote the other
    assert (dt.transaction_version("exporter/kv"), dt.transaction_version("exporter/offsets")) == (49, 49)
    assert len(_rows(loc)) == 100

    # Two runs of the same offsets of one group: exactly one lands.
    errors.clear()
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=run, args=("metadata", 0, 30)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 1 and isinstance(errors[0], ExportConflictError), errors
    rows = [r for r in _rows(loc) if r["group"] == "metadata"]
    assert [r["offset"] for r in rows] == list(range(30))


def _write(data: Path, events: int, seed: int, hour: int) -> None:
    write_group(data, "kv", events, batch_records=50, keys=60, seed=seed, segment_bytes=128 << 10,
                timestamp_ms=BASE_TIMESTAMP_MS + hour * 3_600_000, ms_per_event=30_000)


def test_export_audit_time_travel_and_maintenance_on_s3(tmp_path: Path, s3: S3Server, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_S3_SEED={seed}")
    data = tmp_path / "node"
    (data / "groups" / "kv" / "log").mkdir(parents=True)
    source = OfflineSource.discover(data)
    remote, local = _location(s3, f"events-{seed}"), TableLocation.parse(tmp_path / "events")

    _write(data, 1500, seed, 0)
    first = export_once(spark_session, remote, source, range_offsets=400)
    assert first.table_version == 1 and first.rows == 1500
    assert plain_export(local, source) == 1
    _write(data, 700, seed + 1, 20)
    second = export_once(spark_session, remote, source, range_offsets=400)
    assert second.table_version == 2 and second.rows == 700
    assert export_once(spark_session, remote, source).table_version is None   # nothing new: no commit
    assert plain_export(local, source) == 2

    # Exactly once, read from the store by deltalake; the same rows as the local table.
    rows = _rows(remote)
    offsets = [r["offset"] for r in rows]
    assert len(offsets) == 2200 == len(set(offsets))
    assert rows == _rows(local)
    assert all(f.path.startswith("date=") for f in remote.list_files())

    # Audit and time travel: Spark reading the store gives the answers of the local table, version by
    # version (those from the in-process engine, which tests/spark/test_audit_local.py holds to Spark's).
    def answers(loc: TableLocation, version: int | None, engine: Any = None) -> list[Any]:
        snapshot = table.resolve(loc, version=version)
        audit = engine(snapshot) if engine is not None else Audit(spark_session, snapshot)
        return [audit.state(Point(group="kv", offset=o), "kv/") for o in (300, 1200, 10**9)] + [
            audit.history("kv/k/00000007"), audit.actions("bench", limit=20)]

    want_v1, want_v2 = answers(local, 1, LocalAudit), answers(local, 2, LocalAudit)
    assert answers(remote, 1) == want_v1 and answers(remote, 2) == want_v2
    assert want_v1[2] and want_v2[2] != want_v1[2]   # the second run changed the latest state

    # Optimize and vacuum on the store: rows and answers unchanged, the old files gone after vacuum.
    before = table_files(remote)
    result = optimize_table(remote, target_file_bytes=16 << 20)
    after = table_files(remote)
    assert result.table_version == 3 and after.files < before.files and after.watermarks == before.watermarks
    assert _rows(remote) == rows and answers(remote, None) == want_v2
    assert after.unreferenced_files == result.files_removed   # tombstones until vacuum
    vacuumed = vacuum_table(remote, retain_hours=0, force=True)
    assert len(vacuumed.files) == result.files_removed and table_files(remote).unreferenced_files == 0
    assert _rows(remote) == rows

    # The CLI, credentials from the environment.
    env = {**os.environ, **s3.env}
    info = subprocess.run([sys.executable, "-m", "epochlog", "table", "info", "--table", remote.uri, "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["files"] == after.files
    denied = subprocess.run([sys.executable, "-m", "epochlog", "table", "info", "--table", remote.uri,
                             "--storage-option", "AWS_ACCESS_KEY_ID=nobody"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env={k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL"},
                            check=False)
    assert denied.returncode != 0   # no endpoint: not our server


@pytest.mark.slow
def test_killed_export_to_s3_then_rerun_is_exactly_once(tmp_path: Path, s3: S3Server, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_S3_SEED={seed}")
    data = tmp_path / "node"
    (data / "groups" / "kv" / "log").mkdir(parents=True)
    _write(data, 4000, seed, 0)
    loc = _location(s3, f"killed-{seed}")
    with open(tmp_path / "export.log", "wb") as log:
        export = subprocess.Popen(
            [sys.executable, "-m", "epochlog", "export", "--to", loc.uri, "--offline", str(data), "--range-offsets",
             "50", "--master", "local[2]", "--json"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **s3.env, "TMPDIR": str(tmp_path)})   # what its kill leaves: here
    try:
        wait_until(lambda: loc.list_files() or export.poll() is not None, 180, "the export's first Parquet file")
        assert export.poll() is None, (tmp_path / "export.log").read_text()
    finally:
        os.killpg(export.pid, signal.SIGKILL)
        export.wait(10)
    wait_until(lambda: not _group_alive(export.pid), 10, "every process of the export to exit")
    assert table.open_table(loc).version() == 0, "the killed run should not have committed"
    torn = {f.path for f in loc.list_files()}
    assert torn

    run = export_once(spark_session, loc, OfflineSource.discover(data), range_offsets=1000)
    assert run.table_version == 1 and run.rows == 4000
    offsets = [r["offset"] for r in _rows(loc)]
    assert len(offsets) == 4000 == len(set(offsets))
    assert set(run.dead_files_removed) == torn           # the killed run's files: deleted by the rerun
    assert not torn & {f.path for f in loc.list_files()}
    assert table_files(loc).unreferenced_files == 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
