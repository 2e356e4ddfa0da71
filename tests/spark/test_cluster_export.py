"""Export from a real `epochlog serve` process: exactly once across a killed run, audit = the live views,
and the export watermark holding back log compaction.

Three nodes (an export spreads its ranges over every member: followers serve committed ranges
too), 64 KiB segments so compaction has whole segments to drop. The workload (seeded, printed) mixes puts, overwrites, deletes, a failed
compare-and-set, a transaction and a lease whose revocation deletes its key: the audit must agree
with `get --as-of N` on all of them.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from epochlog.client import Client, RejectedError
from spark.audit import Audit, Point
from spark.export import WATERMARK_SCOPE, export_once, release_watermark, report_watermark, table_id
from spark.sources import ClusterSource
from spark.table import exported_through, open_table, resolve
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"audit/k{i:02d}" for i in range(30)]


def _workload(client: Client, rng: random.Random, rounds: int) -> None:
    for r in range(rounds):
        ops: list[ev.Event] = []
        for _ in range(20):
            name = rng.choice(KEYS)
            if rng.random() < 0.15:
                ops.append(ev.KvDeleted(name=name))
            else:
                ops.append(ev.KvPut(name=name, value=f"v{r}-{rng.randrange(10**6)}".encode()))
        client.commands(ops)   # deletes of missing keys are rejected: committed, changed nothing
        if r % 5 == 0:
            with pytest.raises(RejectedError):
                client.put(rng.choice(KEYS), b"cas", expected_version=10**9)
            client.txn([ev.KvPut(name=KEYS[0], value=b"txn-a"), ev.KvPut(name=KEYS[1], value=b"txn-b")])
    lease = client.lease_grant(60_000)
    client.put("audit/leased", b"mine", lease=lease.lease_id)
    client.put(KEYS[2], b"after-lease")
    client.lease_revoke(lease.lease_id)
    client.put(KEYS[3], b"last")


def _committed_events(client: Client, group: str, start: int = 0) -> list[int]:
    """Offsets of every event (no control batches) the group's log holds from `start`, through the SDK."""
    offsets: list[int] = []
    offset = start
    end = client.read_events(group, 1 << 62, max_events=1).commit_offset
    while offset <= end:
        got = client.read_events(group, offset, max_events=1000)
        offsets += [e.offset for e in got.events if e.offset <= end]
        if got.next_offset <= offset:
            break
        offset = got.next_offset
    return offsets


@pytest.mark.slow
def test_killed_export_rerun_audit_and_watermark(tmp_path: Path, spark_session: Any) -> None:
    seed = random.SystemRandom().getrandbits(32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    # Retention keeps 1,000 offsets: the history the audit is compared with stays, and the bulk writes
    # of step 4 (1,200 offsets) take the policy past the watermark, which then bounds the log alone.
    # kv truncated (cleanup policy `delete`), as step 4 checks truncation up to the watermark; a key-compacted
    # group's export start is tests/spark/test_offline_export.py's.
    cluster = NodeCluster(tmp_path / "cluster", size=3, seed=seed, log={"segment_bytes": 64 << 10},
                          compaction={"retain_offsets": 1000, "compact_groups": ["metadata"]})
    export: subprocess.Popen[bytes] | None = None
    try:
        cluster.start()
        cluster.leader("kv")
        endpoints = tuple(cluster.endpoints)
        table = tmp_path / "events"
        with Client(list(endpoints), timeout=10) as client:
            _workload(client, rng, 25)

            # 1. `epochlog export` in a real process, SIGKILLed (with its JVM and Python workers: the
            #    whole process group it leads) once its first Parquet file is on disk.
            with open(tmp_path / "export.log", "wb") as log:
                export = subprocess.Popen(
                    [sys.executable, "-m", "epochlog", "export", "--to", str(table), "--endpoints",
                     ",".join(endpoints), "--range-offsets", "10", "--master", "local[2]", "--json"],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "TMPDIR": str(tmp_path)})   # what its kill leaves: here
            wait_until(lambda: next(table.glob("date=*/*.parquet"), None) or export.poll() is not None, 120,
                       "the export's first Parquet file")
            assert export.poll() is None, (tmp_path / "export.log").read_text()
            os.killpg(export.pid, signal.SIGKILL)
            export.wait(10)
            wait_until(lambda: not _group_alive(export.pid), 10, "every process of the export to exit")
            export = None
            assert open_table(table).version() == 0, "the killed run should not have committed"
            orphans = list(table.glob("date=*/*.parquet"))
            assert orphans

            # 2. The re-run exports every committed event exactly once, its ranges read from every node.
            source = ClusterSource(endpoints)
            readers = source.prepared().readers
            assert sorted(readers) == sorted(endpoints)
            kv_end = client.read_events("kv", 1 << 62, max_events=1).commit_offset + 1
            for node in range(3):      # each member (two of them followers) serves the same records
                cluster.wait_applied(node + 1, "kv", kv_end - 1)
                served = [r.offset for chunk in source.prepared().read("kv", 0, kv_end, slot=node) for r in chunk]
                assert served == _committed_events(client, "kv"), f"node {node + 1}"
            run = export_once(spark_session, table, source, range_offsets=200)
            assert run.table_version == 1
            rows = open_table(table).to_pyarrow_table(columns=["group", "offset", "applied"]).to_pylist()
            first_kv = _committed_events(client, "kv")
            for group in ("kv", "metadata"):
                offsets = sorted(r["offset"] for r in rows if r["group"] == group)
                assert offsets == _committed_events(client, group), group   # unique, contiguous but control
            assert run.rows == len(rows)
            assert any(r["applied"] is False for r in rows)      # the failed CAS and rejected deletes

            # 3. audit state --offset N equals the live views' get --as-of N, for every key.
            audit = Audit(spark_session, resolve(table))
            kv_offsets = sorted(r["offset"] for r in rows if r["group"] == "kv")
            points = [kv_offsets[len(kv_offsets) // 3], kv_offsets[2 * len(kv_offsets) // 3], kv_offsets[-1]]
            for n in points:
                got = {r["key"]: (r["offset"], r["value"]) for r in audit.state(Point(group="kv", offset=n), "kv/")}
                want = {}
                for name in [*KEYS, "audit/leased"]:
                    kv = client.get(name, as_of=n)
                    if kv is not None:
                        want["kv/" + name] = (kv.version, kv.value.decode())
                assert got == want, f"offset {n}"

            # 4. The watermark is reported, and compaction keeps every offset above it.
            through = exported_through(open_table(table), ["kv"])["kv"]
            assert report_watermark(endpoints, table, run.exported_through)
            name = table_id(table)
            recorded = client.get_entity(f"config/{WATERMARK_SCOPE}/{name}")
            assert recorded is not None and f'"kv": {through}' in recorded.state.value
            for r in range(30):   # many segments past the watermark
                client.commands([ev.KvPut(name=f"bulk/{r}/{i}", value=b"x" * 200) for i in range(40)])
            client.snapshot("kv")
            probe = client.read_events("kv", 1 << 62, max_events=1)
            assert 0 < probe.log_start <= through + 1, (probe.log_start, through)   # compacted up to it
            second = export_once(spark_session, table, source, range_offsets=2000)
            assert second.table_version == 2 and all(g.skipped == 0 for g in second.plan.groups)
            exported_kv = sorted(r["offset"] for r in open_table(table).to_pyarrow_table(
                columns=["group", "offset"]).to_pylist() if r["group"] == "kv")
            kv_planned_end = next(g.end for g in second.plan.groups if g.group == "kv")
            # (the leader may commit more meanwhile, e.g. a HistoryPruned floor: the run covers its plan)
            assert exported_kv == first_kv + [o for o in _committed_events(client, "kv", through + 1)
                                              if o < kv_planned_end]

            # 5. Released, the floor goes: the next snapshot compacts past the old watermark.
            assert release_watermark(endpoints, table)
            client.put("after-release", b"1")
            client.snapshot("kv")
            assert client.read_events("kv", 1 << 62, max_events=1).log_start > through + 1
    finally:
        if export is not None and export.poll() is None:
            os.killpg(export.pid, signal.SIGKILL)
            export.wait(10)
        cluster.close()
        print(cluster.describe())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
