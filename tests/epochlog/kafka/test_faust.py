"""End to end: the Faust app of examples/live_brokers.py over a real cluster's Kafka face.

The worker (a real `python -m examples.live_brokers worker` process, aiokafka underneath) consumes
`__metadata` in a consumer group, creates its changelog topic with CreateTopics (hosted in the kv
group) and keeps its table in RocksDB. The test registers brokers through the controller, shuts one
down, and checks the table in RocksDB once the worker stopped; then a second worker with an empty
data directory rebuilds the same table from the changelog topic alone; then the same over SSL against a
cluster with client TLS and enforcement, the worker presenting the admin certificate it finds, and over
SASL_SSL, the worker a SCRAM user holding only the grants the example names (issue 21).
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from statemachines.brokers import new_incarnation
from epochlog.api import messages as p
from epochlog.client import AsyncClient, Client
from epochlog.client.broker import DEFAULT_CLUSTER, ControllerClient
from epochlog.client.credentials import kafka_python_options, kafka_tls
from examples.live_brokers import APP_ID, CHANGELOG, PASSWORD_ENV, USER_ENV, live_brokers
from statemachines import credentials as cr
from statemachines import events as ev
from tests.epochlog.kafka.test_docs import faust_command
from tests.support.nodes import NodeCluster, ROOT
from tests.support.secured import secured_cluster
from tests.support.wait import wait_until

EXPECTED = {f"{DEFAULT_CLUSTER}/broker-a": ["a-0", "a-2"], f"{DEFAULT_CLUSTER}/broker-b": ["b-0"]}


class Worker:
    def __init__(self, cluster: NodeCluster, datadir: Path, log: Path, env: dict[str, str] | None = None) -> None:
        argv, doc_env = faust_command(cluster.bootstrap, datadir)   # docs/kafka.md's command, run as given
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, **doc_env, **(env or {})),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_until(lambda: "[^Worker]: Ready" in self.text() or self.proc.poll() is not None, 90, "the Faust worker")
        assert self.proc.poll() is None, self.text()[-3000:]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(30) == 0, self.text()[-3000:]
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


async def _brokers(cluster: NodeCluster) -> None:
    async with AsyncClient(cluster.endpoints) as client:
        controller = ControllerClient(client)
        registered = await controller.register([
            p.BrokerIdentity(DEFAULT_CLUSTER, group, name, f"10.0.0.{i}:10911", new_incarnation(time.time_ns()))
            for i, (group, name) in enumerate([("broker-a", "a-0"), ("broker-a", "a-1"), ("broker-a", "a-2"),
                                               ("broker-b", "b-0")], 1)])
        assert all(r.code == "" for r in registered.results), registered
        await controller.shutdown(DEFAULT_CLUSTER, "broker-a", "a-1", registered.results[1].broker_epoch)


def test_a_faust_app_keeps_live_brokers_in_rocksdb_and_recovers_them_from_its_changelog(
        kafka_cluster_factory: Any, tmp_path: Path) -> None:
    # The registered brokers never heartbeat: the controller must not fence them during the test.
    cluster: NodeCluster = kafka_cluster_factory(controller={"heartbeat_timeout_ms": 600_000})
    cluster.start()
    for group in ("metadata", "offsets", "kv"):
        cluster.leader(group)
    _keeps_and_recovers(cluster, tmp_path)


def test_the_faust_app_runs_over_ssl_with_the_admin_certificate_of_the_environment(tmp_path: Path) -> None:
    """A cluster secured as `epochlog up` makes it (client TLS, enforcement, an admin super user): the
    same worker, unchanged, finds the admin certificate (EPOCHLOG_TLS_*) and speaks SSL with it."""
    with secured_cluster(tmp_path / "cluster", "faust-secured", kafka=True,
                         controller={"heartbeat_timeout_ms": 600_000}) as cluster:
        assert kafka_tls(cluster.bootstrap) is not None
        _keeps_and_recovers(cluster, tmp_path)


FAUST_GRANTS = [("auditor", ""), ("writer", f"topic:{APP_ID}-*"), ("reader", f"group:{APP_ID}")]   # the module doc's


def test_the_faust_app_over_sasl_ssl_with_scram_and_only_its_grants(tmp_path: Path) -> None:
    with secured_cluster(tmp_path / "cluster", "faust-sasl", size=1, seed=4, kafka=True,
                         controller={"heartbeat_timeout_ms": 600_000}) as cluster:
        with Client(cluster.endpoints) as admin:
            scram = tuple(cr.scram_credential(m, "faust-pw", os.urandom(32)) for m in sorted(cr.MECHANISMS))
            admin.command(ev.UserAdded(name="faust", scram=scram))
            for role, resource in FAUST_GRANTS:
                admin.command(ev.AclGranted(principal="faust", role=role, resource=resource))
        context = ssl.create_default_context(cafile=str(cluster.root / "ca" / "ca.crt"))
        context.check_hostname = False
        sasl = {"security_protocol": "SASL_SSL", "ssl_context": context, "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_plain_username": "faust", "sasl_plain_password": "faust-pw"}
        _keeps_and_recovers(cluster, tmp_path, {USER_ENV: "faust", PASSWORD_ENV: "faust-pw"}, sasl)
        with Client(cluster.endpoints) as admin:   # it made its own topics, under its name
            declared = admin.get_entity(f"config/kafka-topic/{CHANGELOG}")
            assert declared is not None
            (event,) = admin.read_events("metadata", declared.version, max_events=1).events
            assert ev.decode_event(event.value).ops[0].actor == "faust"


def _keeps_and_recovers(cluster: NodeCluster, tmp_path: Path, env: dict[str, str] | None = None,
                        kafka_options: dict[str, Any] | None = None) -> None:
    """`env`: more of the worker's environment; `kafka_options`: the test's own consumer's security
    (default: what the SDK's credentials give, as the worker finds them)."""
    first = Worker(cluster, tmp_path / "faust-1", tmp_path / "faust-1.log", env)
    try:
        first.wait_ready()
        asyncio.run(_brokers(cluster))
        # The worker has processed the shutdown once its changelog holds it: poll the table's
        # changelog topic through the Kafka face.
        wait_until(lambda: _changelog_has(cluster, EXPECTED, kafka_options), 60, "the changelog to show the live brokers")
    finally:
        first.stop()
    assert live_brokers(tmp_path / "faust-1") == EXPECTED

    second = Worker(cluster, tmp_path / "faust-2", tmp_path / "faust-2.log", env)   # empty data dir
    try:
        second.wait_ready()
        wait_until(lambda: "Recovery]: Worker ready" in second.text(), 60, "the second worker's recovery")
    finally:
        second.stop()
    highwater = re.search(rf"{CHANGELOG} +\| 0 +\| +(-?\d+)", second.text())
    assert highwater is not None and int(highwater.group(1)) >= 0, second.text()[-3000:]   # it had a changelog
    assert live_brokers(tmp_path / "faust-2") == EXPECTED


def _changelog_has(cluster: NodeCluster, expected: dict[str, list[str]], kafka_options: dict[str, Any] | None) -> bool:
    import json

    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(CHANGELOG, 0)
    options = kafka_python_options(cluster.bootstrap) if kafka_options is None else kafka_options
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False, **options)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        state: dict[str, list[str]] = {}
        deadline = time.monotonic() + 10
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    state[json.loads(r.key)] = json.loads(r.value)
        return state == expected
    finally:
        consumer.close()
