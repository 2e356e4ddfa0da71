"""Retention on real `epochlog serve` nodes, through the SDK and the CLI (compaction/, docs/compaction.md).

1. The history floor: three nodes with 300 offsets of retention, a snapshot every 200 offsets and an
   export table that stopped at offset 5 (its pin capped at 1,000 offsets). After a few thousand
   writes every node reports the same committed history floor, bound by the capped export, and a log
   that starts past 0; `get --as-of` below the floor answers `compacted` naming the floor and
   `epochlog audit state`, at or above it every node gives the acknowledged value; `history` starts
   at the floor (and the CLI says so); a watch from offset 0 is told it was compacted; `epochlog
   compaction status --json` names the capped pin, and the log says so.
2. A full disk (EPOCHLOG_FAULTS=statvfs-free-bytes=0, below `min_free_disk_bytes`): the node refuses
   writes with `disk_full` (the SDK retries, then raises DiskFullError), serves reads, reports it in
   `compaction status`, and takes writes again once space is freed (the heal file).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from epochlog.client import Client, CompactedError, DiskFullError
from eventlog.fault_injection import ENV_VAR as FAULTS_ENV
from eventlog.fault_injection import HEAL_ENV_VAR
from statemachines import events as ev
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(240)

KEYS = [f"ret/{i}" for i in range(10)]


def cli(cluster: NodeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args, "--endpoints", ",".join(cluster.endpoints)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def _kv(info: Any) -> Any:
    return next(g for g in info.groups if g.group == "kv")


def test_history_floor_as_of_history_watch_and_status(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    # Every group truncated (cleanup policy `delete`): key compaction has its own tests (tests/epochlog/kafka/test_compaction.py).
    cluster = node_cluster_factory(size=3, snapshot_every_entries=200, log={"segment_bytes": 32 << 10},
                                   compaction={"retain_offsets": 300, "check_interval_ms": 100,
                                               "prune_interval_ms": 20, "export_max_pin_offsets": 1000,
                                               "compact_groups": []})
    cluster.start()
    cluster.leader("kv")
    acked: list[tuple[str, int, bytes]] = []
    with Client(cluster.endpoints, timeout=20.0) as client:
        client.command(ev.ConfigChanged(scope="export", name="table-abandoned", value=json.dumps({"kv": 5})))
        for i in range(60):
            values = [(KEYS[(i * 50 + j) % len(KEYS)], f"v{i}-{j}".encode()) for j in range(50)]
            results = client.commands([ev.KvPut(name=k, value=v) for k, v in values])
            acked += [(k, r.offset, v) for (k, v), r in zip(values, results)]
        last = acked[-1][1]

        def settled() -> list[Any] | None:
            infos = [client.compaction_status(cluster.endpoint(n)) for n in cluster.nodes]
            kv = [_kv(i) for i in infos]
            floors = {g.history_floor for g in kv}
            return kv if len(floors) == 1 and min(floors) > last - 1100 and all(g.log_start > 0 for g in kv) else None
        kv = wait_until(settled, 30.0, "every node to prune and truncate kv")
        floor = kv[0].history_floor
        print(f"history floor {floor} (last write {last}); logs start at {[g.log_start for g in kv]}")
        for g in kv:
            assert g.horizon_bound == "export table-abandoned" and g.snapshots_taken > 0, g
            (pin,) = g.pins
            assert (pin.table, pin.watermark, pin.capped_by) == ("table-abandoned", 5, "export_max_pin_offsets"), pin

        below = next(a for a in acked if a[1] < floor)
        with pytest.raises(CompactedError) as info:
            client.get(below[0], as_of=below[1])
        assert f"history floor {floor}" in str(info.value) and "epochlog audit state" in str(info.value)
        retained = [a for a in acked if a[1] >= floor]
        assert len(retained) > 500
        for n in cluster.nodes:
            with Client([cluster.endpoint(n)], timeout=20.0) as own:
                for key, offset, value in retained[::25]:
                    got = own.get(key, as_of=offset, consistency="local", min_offset=last)
                    assert got is not None and got.value == value, (n, key, offset)
        history = client.history(KEYS[0])
        assert history.floor == floor
        assert history[0].offset <= floor < history[1].offset and history[-1].offset > floor
        with pytest.raises(CompactedError):
            for _ in client.watch("ret/", from_offset=0):
                pass

    result = cli(cluster, "get", below[0], "--as-of", str(below[1]))
    assert result.returncode == 3 and "epochlog audit state" in result.stderr, result
    result = cli(cluster, "history", KEYS[0])
    assert result.returncode == 0 and f"history floor {floor}" in result.stderr, result
    result = cli(cluster, "compaction", "status", "--json")
    assert result.returncode == 0, result
    document = json.loads(result.stdout)
    rows = [g for g in document["groups"] if g["group"] == "kv"]
    assert sorted(g["node"] for g in rows) == [1, 2, 3] and all(n["reachable"] for n in document["nodes"])
    assert all(g["pins"][0]["capped_by"] == "export_max_pin_offsets" and g["history_floor"] >= floor for g in rows)
    table = cli(cluster, "compaction", "status")
    assert table.returncode == 0 and "capped by export_max_pin_offsets" in table.stdout, table
    print(table.stdout)
    assert any("table-abandoned" in n.stderr() and "pins more than export_max_pin_offsets" in n.stderr()
               for n in cluster.nodes.values())


def test_full_disk_refuses_writes_serves_reads_and_resumes(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=1, compaction={"check_interval_ms": 100})
    heal = cluster.root / "heal"
    cluster.env = {FAULTS_ENV: "statvfs-free-bytes=0", HEAL_ENV_VAR: str(heal)}
    cluster.start()
    with Client(cluster.endpoints, timeout=2.0) as client:
        started = time.monotonic()
        with pytest.raises(DiskFullError) as info:
            client.put("full/a", b"1")
        print(f"refused after {time.monotonic() - started:.1f}s of retries: {info.value}")
        assert info.value.code == "disk_full" and info.value.retriable and "min_free_disk_bytes" in str(info.value)
        assert client.get("full/a") is None                       # reads go on
        status = _kv(client.compaction_status())
        assert status.disk_full and status.role == "leader", status
        result = cli(cluster, "compaction", "status")
        assert "refusing writes" in result.stdout, result
        heal.touch()                                             # space is freed
    with Client(cluster.endpoints, timeout=10.0) as client:
        written = client.put("full/a", b"2")                      # within the SDK's retries
        assert client.get("full/a").value == b"2" and written.offset >= 0   # type: ignore[union-attr]
        assert not _kv(client.compaction_status()).disk_full
    assert cluster.stop_all() == {1: 0}
