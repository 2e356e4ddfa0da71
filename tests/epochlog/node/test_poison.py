"""Issue 11, the poison event, against real `epochlog serve` processes.

1. The reproduction: one native-protocol `write` of a KvPut with `"v": 2` sent to the kv leader. It
   used to be committed and then kill every node (exit 2, again on every restart); now the leader
   refuses it with `invalid_argument` and appends nothing.
2. A poison record that got past the check (written by a node without it, tests/support/builds.py
   `unchecked`): every node halts the kv group at that offset and nothing else. No process exits;
   the other groups serve; status, /readyz and /metrics say where and why; a restart halts again
   (no crash loop); `epochlog group skip` on every member resumes them with equal views.
3. A mixed-version cluster: a newer node (`kvput-newer`) writes a record the older ones cannot read.
   They halt (no exit) while the newer leader goes on committing; a halted node does not keep the
   leadership; an upgraded node applies the record after a restart and ends with the same digest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from epochlog.api import messages as p
from epochlog.client import Client, ClientError
from statemachines import events as ev
from statemachines.request_ids import uuid7
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until
from tests.epochlog.node.raw import RawConnection, http_get

NEWER = ev.KvPut.VERSION + 1   # a schema version only a newer Epochlog knows
POISON = {"type": "KvPut", "v": NEWER, "actor": "qa", "request_id": uuid7(), "name": "poison", "value": b"x"}


def _put_raw(address: str, event: dict[str, Any], rid: int = 1) -> list[Any]:
    conn = RawConnection(address)
    try:
        conn.hello()
        return conn.call(rid, {"type": "write", "events": [event]})
    finally:
        conn.close()


def _halt(cluster: NodeCluster, node: int, group: str = "kv") -> p.HaltInfo | None:
    g = cluster.group_status(node, group)
    return None if g is None else g.halted


def _wait_halted(cluster: NodeCluster, nodes: list[int], offset: int | None = None) -> int:
    def check() -> int | None:
        halts = [_halt(cluster, n) for n in nodes]
        if any(h is None for h in halts):
            return None
        offsets = {h.offset for h in halts if h is not None}
        return offsets.pop() if len(offsets) == 1 and (offset is None or offset in offsets) else None
    return wait_until(check, 20, f"kv halted on nodes {nodes}")


def _cli(cluster: NodeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args, "--endpoints", ",".join(cluster.endpoints),
                           "--json", "--timeout", "20"], capture_output=True, text=True, cwd=ROOT, timeout=60)


def _all_running(cluster: NodeCluster) -> None:
    for i, n in cluster.nodes.items():
        assert n.running, f"node {i} exited with {n.proc.returncode if n.proc else None}:\n{n.stderr()[-3000:]}"


def test_a_write_of_a_newer_schema_version_is_refused_by_the_leader_and_appends_nothing(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory()
    cluster.start()
    cluster.wait_views_format()   # the leaders' own raise is in the log before `before` is taken
    leader = cluster.leader("kv")
    with Client(cluster.endpoints, timeout=15) as client:
        client.put("app/before", b"1")
    before = cluster.wait_group_status(leader, "kv")

    reply = _put_raw(cluster.endpoint(leader), POISON)             # exactly what QA sent
    assert reply[1] is None and reply[2][0] == "invalid_argument", reply
    assert f"KvPut version {NEWER} is newer than this Epochlog knows ({NEWER - 1})" in reply[2][1] and not reply[2][2]
    # The same inside a transaction, and an event type no version has: refused alike.
    txn = {"type": "Txn", "ops": [{"type": "KvDeleted", "v": 7, "name": "x"}]}
    assert _put_raw(cluster.endpoint(leader), txn)[2][0] == "invalid_argument"
    unknown = {"type": "QuotaChanged", "name": "x"}
    refused = _put_raw(cluster.endpoint(leader), unknown)
    assert refused[2][0] == "invalid_argument" and "unknown type 'QuotaChanged'" in refused[2][1], refused

    time.sleep(1.0)
    _all_running(cluster)
    after = cluster.wait_group_status(leader, "kv")
    assert after.last_offset == before.last_offset, "nothing was appended"
    assert all(cluster.wait_group_status(n, "kv").halted is None for n in cluster.nodes)
    with Client(cluster.endpoints, timeout=15) as client:
        assert client.put("app/after", b"2").ok
        assert client.get("poison") is None


def test_a_poison_record_halts_only_that_group_never_kills_a_node_and_skip_recovers(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory()
    cluster.nodes[1].build = "unchecked"        # a node from before the leader's check
    cluster.start()
    with Client(cluster.endpoints, timeout=15) as client:
        base = client.put("app/before", b"1").offset
    cluster.move_leader("kv", 1)

    reply = _put_raw(cluster.endpoint(1), POISON)
    # Node 1 proposed it, it committed, and node 1 cannot apply it either: the outcome is not its to give.
    assert reply[2][0] == "group_halted" and reply[2][2], reply
    poison = _wait_halted(cluster, [1, 2, 3])
    assert poison > base
    time.sleep(1.5)                             # the old code exited within milliseconds
    _all_running(cluster)
    halt = _halt(cluster, 2)
    assert halt is not None and f"KvPut version {NEWER} is newer than this Epochlog knows ({NEWER - 1})" in halt.reason
    assert "upgrade this node" in halt.fix

    # The node goes on: its other groups serve; kv answers group_halted (retriable) on every node.
    with Client(cluster.endpoints, timeout=15) as client:
        assert client.command(ev.OffsetCommitted(consumer_group="cg", topic="t", queue_id=0, offset=5)).ok
        assert client.command(ev.ConfigChanged(scope="s", name="n", value="v")).ok
    with Client(cluster.endpoints, timeout=2) as client, pytest.raises(ClientError) as error:
        client.put("app/during", b"x")
    assert error.value.code == "group_halted" and f"offset {poison}" in str(error.value)
    for node in (2, 3):
        conn = RawConnection(cluster.endpoint(node))
        conn.hello()
        got = conn.call(1, {"type": "get", "key": "kv/app/before", "consistency": "local"})
        assert got[2][0] == "group_halted" and f"offset {poison}" in got[2][1], got
        conn.close()
    admin = cluster.nodes[2].admin_address
    status, body = http_get(admin, "/readyz")
    assert status == 503 and f"group kv halted at offset {poison}" in body and f"KvPut version {NEWER}" in body, body
    assert http_get(admin, "/healthz") == (200, "ok\n"), "halted is not dead: a liveness restart would not help"
    metrics = http_get(admin, "/metrics")[1]
    assert 'epochlog_apply_halted{group="kv"} 1.0' in metrics
    assert 'epochlog_apply_halted{group="offsets"} 0.0' in metrics
    assert f"group kv halted at offset {poison}" in cluster.nodes[2].stderr()   # the CRITICAL line

    # A restart replays up to the record and halts there again: no crash loop. Node 1 comes back as
    # this tree's build.
    cluster.restart(2)
    cluster.nodes[1].build = None
    cluster.restart(1)
    assert _wait_halted(cluster, [1, 2, 3]) == poison
    time.sleep(1.0)
    _all_running(cluster)

    # Recovery: only the offset every member halted at can be skipped; then they apply on, alike.
    wrong = _cli(cluster, "group", "skip", "--group", "kv", "--offset", str(poison + 1))
    assert wrong.returncode == 3 and f"is halted at offset {poison}" in wrong.stderr, wrong
    done = _cli(cluster, "group", "skip", "--group", "kv", "--offset", str(poison))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["skipped_on"] == [1, 2, 3]
    with Client(cluster.endpoints, timeout=20) as client:
        after = client.put("app/after", b"2")
        assert client.get("poison") is None and client.get("app/before") is not None
        assert client.history("poison") == [], "a skipped record changes nothing, its key's history included"
    for node in cluster.nodes:
        g = cluster.wait_applied(node, "kv", after.offset)
        assert g.halted is None and g.skipped == [poison]
    again = _cli(cluster, "group", "skip", "--group", "kv", "--offset", str(poison))
    assert again.returncode == 0 and json.loads(again.stdout)["skipped_on"] == [], again
    views = cluster.stop_converged(["kv"])["kv"]
    assert len(set(views.values())) == 1, f"applied offsets and digests differ: {views}"


def test_a_mixed_version_cluster_halts_the_older_nodes_the_newer_leader_goes_on_and_an_upgrade_resumes(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory()
    cluster.nodes[1].build = "kvput-newer"         # a newer Epochlog; nodes 2 and 3 are this tree's
    cluster.start()
    cluster.move_leader("kv", 1)
    reply = _put_raw(cluster.endpoint(1), POISON)
    assert reply[2] is None and reply[1]["results"][0][2], reply     # the newer node applies it: ok
    newer = reply[1]["results"][0][0]
    assert _wait_halted(cluster, [2, 3]) == newer
    assert _halt(cluster, 1) is None

    # The newer leader keeps committing: the older nodes replicate what they cannot apply yet.
    with Client(cluster.endpoints, timeout=15) as client:
        later = client.put("app/later", b"1").offset
        assert later > newer
    g1 = cluster.wait_group_status(1, "kv")
    assert g1.commit_offset >= later and g1.role == "leader"

    # Upgrade node 2: a restart of the newer build applies the record and catches up.
    cluster.nodes[2].build = "kvput-newer"
    cluster.restart(2)
    assert cluster.wait_applied(2, "kv", later).halted is None

    # A halted node handed the leadership hands it over again (it could serve nothing).
    with Client(cluster.endpoints, timeout=15) as client:
        try:
            client.transfer_leader("kv", 3)
        except ClientError:
            pass
        wait_until(lambda: "is halted on this node: handing leadership over" in cluster.nodes[3].stderr(), 15,
                   "node 3 to hand the leadership over")
        wait_until(lambda: cluster.leader("kv") in (1, 2), 15, "node 1 or 2 to lead kv again")
        assert client.put("app/after-transfer", b"1").ok

    # The newer leader dies: node 3 (halted) may win an election but does not keep the leadership.
    cluster.kill9(1)
    with Client([cluster.endpoint(2), cluster.endpoint(3)], timeout=20) as client:
        after = client.put("app/after-failover", b"1").offset
    assert cluster.leader("kv") == 2
    time.sleep(2.0)
    assert cluster.wait_group_status(3, "kv").role != "leader"
    assert _halt(cluster, 3) is not None and cluster.nodes[3].running

    # Upgrade the rest: everyone applies everything, with equal views.
    cluster.nodes[3].build = "kvput-newer"
    cluster.restart(3)
    cluster.start([1])
    for node in cluster.nodes:
        assert cluster.wait_applied(node, "kv", after).halted is None
    views = cluster.stop_converged(["kv"])["kv"]
    assert len(set(views.values())) == 1, f"applied offsets and digests differ: {views}"
