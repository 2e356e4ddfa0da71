"""The admin endpoint and logs of a real node: /metrics, /healthz, /readyz over a socket, JSON log lines.

Nodes run in-process (`RunningNode`, the object `epochlog serve` runs) with the config and data
directories of a NodeCluster (tests/support/nodes.py: free 127.0.0.1 ports, certificates), with real
segmented logs, RocksDB views and TCP; clients are the SDK (`AsyncClient`). The JSON log test runs
that cluster's `epochlog serve` process with `--log-format json`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventlog.raft.runtime.config import NodeConfigs, load_node_configs
from epochlog.client import AsyncClient
from epochlog.client.errors import ClientError
from epochlog.logs import ContextFilter
from epochlog.serve import RunningNode
from tests.support.nodes import NodeCluster
from tests.support.wait import eventually, wait_until


GROUPS = ("metadata", "offsets", "kv")
WRITES = 40


def admin_cluster(root: Path, members: int, seed: int, **kwargs: object) -> NodeCluster:
    """The test cluster's members on free ports (peer, client, admin each), their certificates made; the
    in-process tests load its config and run RunningNode on its data directories."""
    cluster = NodeCluster(root, size=members, seed=seed, name="admin-test", groups=GROUPS, tick_interval_ms=20,
                          log={"flush_policy": "group"}, views={"write_buffer_bytes": 1 << 20}, **kwargs)  # type: ignore[arg-type]
    for i in cluster.nodes:
        cluster.provision_tls(i)
    return cluster


def in_process(cluster: NodeCluster) -> tuple[NodeConfigs, dict[int, Path]]:
    """The configs a RunningNode of `cluster` starts with, and each member's data directory."""
    return load_node_configs(cluster.config_path), {i: n.data_dir for i, n in cluster.nodes.items()}


async def http_get(address: str, path: str) -> tuple[int, str]:
    """One HTTP/1.1 GET over a fresh socket: (status, body)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 5)   # the server closes after one response
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(address: str) -> Samples:
    status, body = await http_get(address, "/metrics")
    assert status == 200, body
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; have {sorted(n for n, _ in samples if n.startswith(name))}"
    return samples[key]


def test_metrics_health_and_readiness_of_a_single_node(tmp_path: Path, seed: int) -> None:
    configs, data = in_process(admin_cluster(tmp_path, 1, seed))

    async def main() -> None:
        running = await RunningNode.start(configs, 1, data[1], seed=seed)
        try:
            admin, client = running.addresses["admin"], running.addresses["client"]

            async def ready() -> bool:
                return (await http_get(admin, "/readyz")) == (200, "ready\n")

            await eventually(ready, 10, "/readyz 200 (a leader in every group)")
            async with AsyncClient([client], timeout=10) as c:
                results = [await c.put(f"app/k{i}", b"v%d" % i) for i in range(WRITES)]
                with pytest.raises(ClientError) as error:
                    await c.get("app/k0", consistency="bogus")
                assert error.value.code == "invalid_argument"
                snapshot = await c.snapshot("kv")
            last_write = max(r.offset for r in results)

            m = await scrape(admin)
            assert sample(m, "epochlog_commit_offset", group="kv") >= max(WRITES, last_write)
            assert sample(m, "epochlog_applied_offset", group="kv") >= last_write
            assert sample(m, "epochlog_rpc_seconds_count", op="write") >= WRITES
            assert sample(m, "epochlog_rpc_errors_total", op="get", code="invalid_argument") == 1
            assert sample(m, "epochlog_log_fsync_seconds_count", group="kv") > 0
            assert sample(m, "epochlog_log_append_seconds_count", group="kv") >= 1
            assert sample(m, "epochlog_log_appended_bytes_total", group="kv") > WRITES * 8
            assert sample(m, "epochlog_proposals_committed_total", group="kv") >= WRITES
            assert sample(m, "epochlog_events_applied_total", group="kv") >= WRITES
            assert sample(m, "epochlog_snapshots_total", group="kv") >= 1
            assert sample(m, "epochlog_snapshot_offset", group="kv") == snapshot >= last_write
            assert sample(m, "epochlog_history_floor", group="kv") == 0    # the default keeps 100,000 offsets
            assert sample(m, "epochlog_disk_full", group="kv") == 0
            assert sample(m, "epochlog_peer_messages_dropped_total", reason="not_member") == 0
            assert sample(m, "epochlog_peer_messages_dropped_total", reason="term_limit") == 0
            for g in GROUPS:
                assert sample(m, "epochlog_term_exhausted", group=g) == 0
                assert sample(m, "epochlog_leader_changes_total", group=g) >= 1
                assert sample(m, "epochlog_elections_started_total", group=g) >= 1
                assert sample(m, "epochlog_is_leader", group=g) == 1
                assert sample(m, "epochlog_leader", group=g) == 1
                assert sample(m, "epochlog_term", group=g) >= 1
            assert not [k for k in m if k[0] == "epochlog_follower_lag"]   # no peers

            assert await http_get(admin, "/healthz") == (200, "ok\n")
            assert (await http_get(admin, "/nope"))[0] == 404
            # A group whose task died makes no progress: the node is no longer ready.
            running.node.host.groups["offsets"]._tasks[1].cancel()
            await asyncio.sleep(0.05)
            assert await http_get(admin, "/readyz") == (503, "group offsets is stopped\n")
        finally:
            await running.stop()

    asyncio.run(main())


def test_readiness_needs_a_leader_and_follower_lag_is_per_peer(tmp_path: Path, seed: int) -> None:
    """Three members: node 1 alone has no leader (503 with the reason); with node 2 a leader exists
    (200 on both); on the kv leader, the down peer 3 lags by the whole log, the live follower by 0."""
    configs, data = in_process(admin_cluster(tmp_path, 3, seed))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.addFilter(ContextFilter())
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    old_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)

    async def main() -> None:
        nodes: dict[int, RunningNode] = {}
        try:
            nodes[1] = await RunningNode.start(configs, 1, data[1], seed=seed)
            admin1 = nodes[1].addresses["admin"]
            await asyncio.sleep(1.0)   # > 2 election timeouts (10-20 ticks of 20 ms): a lone node cannot win
            status, body = await http_get(admin1, "/readyz")
            assert status == 503 and "has no leader" in body, (status, body)
            assert await http_get(admin1, "/healthz") == (200, "ok\n")

            nodes[2] = await RunningNode.start(configs, 2, data[2], seed=seed + 1)
            for n in (1, 2):
                address = nodes[n].addresses["admin"]

                async def ready(address: str = address) -> bool:
                    return (await http_get(address, "/readyz"))[0] == 200

                await eventually(ready, 15, f"/readyz 200 on node {n}")

            clients = [nodes[n].addresses["client"] for n in (1, 2)]
            async with AsyncClient(clients, timeout=10) as c:
                await asyncio.gather(*(c.put(f"lag/k{i}", b"x") for i in range(WRITES)))
                await c.put("lag/alone", b"y")   # its apply prepared while the follower stores it
            leader = next(n for n in (1, 2) if nodes[n].node.host.groups["kv"].node.role.value == "leader")
            follower = 3 - leader
            admin = nodes[leader].addresses["admin"]

            async def caught_up() -> Samples | None:
                m = await scrape(admin)
                return m if sample(m, "epochlog_follower_lag", group="kv", peer=str(follower)) == 0 else None

            m = await eventually(caught_up, 10, f"follower {follower} lag 0 on leader {leader}")
            last = sample(m, "epochlog_last_offset", group="kv")
            assert last >= WRITES
            assert sample(m, "epochlog_follower_lag", group="kv", peer="3") == last + 1   # never acknowledged
            fm = await scrape(nodes[follower].addresses["admin"])
            assert not [k for k in fm if k[0] == "epochlog_follower_lag" and ("group", "kv") in k[1]]
            assert sample(fm, "epochlog_leader", group="kv") == leader
            assert sample(fm, "epochlog_leader_changes_total", group="kv") >= 1
            assert sample(fm, "epochlog_events_applied_total", group="kv") >= WRITES
            assert sample(m, "epochlog_applies_prepared_total", group="kv", result="committed") >= 1
            assert sample(fm, "epochlog_applies_prepared_total", group="kv", result="committed") == 0
        finally:
            for running in nodes.values():
                await running.stop()

    try:
        asyncio.run(main())
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(old_level)
    # Two nodes shared this process: each group record names its own node, group and term.
    leads = [r for r in records if r.name == "eventlog.raft.runtime.ready_loop" and "leads in term" in r.getMessage()]
    assert {r.node for r in leads} == {1, 2}, [(r.node, r.getMessage()) for r in leads]  # type: ignore[attr-defined]
    for r in leads:
        assert r.group in GROUPS and r.term >= 1 and f"in term {r.term}" in r.getMessage()  # type: ignore[attr-defined]


def test_serve_writes_json_log_lines(tmp_path: Path, seed: int) -> None:
    cluster = admin_cluster(tmp_path, 1, seed, serve_args=("--log-format", "json"))
    try:
        cluster.start()
        node = cluster.nodes[1]

        def every_group_led() -> bool:
            assert node.running, node.stderr()[-2000:]
            return sum("leads in term" in line for line in node.stderr().splitlines()) >= len(GROUPS)
        wait_until(every_group_led, 15, "a leader of every group")
        assert cluster.stop(1) == 0, node.stderr()
    finally:
        cluster.close()
    err_path = node.err_path
    assert err_path is not None
    lines = [line for line in err_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]   # every line is one JSON object
    assert records
    for r in records:
        assert set(r) >= {"ts", "level", "node", "group", "term", "logger", "msg"}, r
        assert r["node"] == 1, r
        assert r["ts"].endswith("Z") and r["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    leads = [r for r in records if "leads in term" in r["msg"]]
    assert {r["group"] for r in leads} == set(GROUPS)
    assert all(r["term"] >= 1 and r["logger"] == "eventlog.raft.runtime.ready_loop" for r in leads)
    serving = [r for r in records if r["logger"] == "epochlog.serve" and "serving" in r["msg"]]
    assert serving and serving[0]["group"] is None and serving[0]["term"] is None
