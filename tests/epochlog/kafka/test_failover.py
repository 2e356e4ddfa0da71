"""kill -9 of the partition leader in the middle of a Kafka produce stream (real processes, real
kafka-python clients): no acknowledged record is lost, none is written twice (the new leader
rebuilds the producers' sequences from its log), and a consumer tailing the topic and a group
consumer carry on across the new leader epoch."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from epochlog.client import Client
from statemachines import events as ev
from tests.support.nodes import NodeCluster

KV = TopicPartition("__kv", 0)
EVENTS = 4000


class Tail(threading.Thread):
    """A consumer reading __kv from offset 0 until told to stop; keeps every record of `prefix`."""

    def __init__(self, cluster: NodeCluster, prefix: bytes, group: str | None = None) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.prefix = prefix
        self.group = group
        self.records: list[Any] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.group is None:
                consumer = KafkaConsumer(bootstrap_servers=self.cluster.bootstrap, enable_auto_commit=False)
                consumer.assign([KV])
                consumer.seek(KV, 0)
            else:
                consumer = KafkaConsumer("__kv", bootstrap_servers=self.cluster.bootstrap, group_id=self.group,
                                         auto_offset_reset="earliest", auto_commit_interval_ms=200,
                                         session_timeout_ms=6000, heartbeat_interval_ms=500)
            try:
                while not self.stop.is_set():
                    # Long polls: kafka-python 3.0.12 loses the assignment of a group leader whose poll
                    # times out while its SyncGroup is in flight (it then never heartbeats again).
                    for records in consumer.poll(timeout_ms=1000).values():
                        self.records.extend(r for r in records if r.key.startswith(self.prefix))
            finally:
                consumer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_leader_kill9_mid_stream_loses_nothing_acknowledged_and_writes_nothing_twice(
        kafka_cluster_factory: Any) -> None:
    cluster: NodeCluster = kafka_cluster_factory()
    cluster.start()
    leader = cluster.leader("kv")
    cluster.leader("offsets")
    tag = uuid.uuid4().hex[:8]
    prefix = f"kv/fo-{tag}/".encode()
    tail = Tail(cluster, prefix)
    grouped = Tail(cluster, prefix, group=f"fo-{tag}")
    tail.start()
    grouped.start()
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5,
                             request_timeout_ms=5000, retry_backoff_ms=100)
    futures = []
    killed_at = None
    try:
        for i in range(EVENTS):
            futures.append(producer.send("__kv", value=ev.encode_event(ev.KvPut(name=f"fo-{tag}/{i:05d}",
                                                                               value=str(i).encode()))))
            if i == EVENTS // 3:
                producer.flush(30)
                killed_at = cluster.kill9(leader)
            if i % 200 == 0:
                time.sleep(0.02)   # a stream, not one burst: the kill lands between batches in flight
        producer.flush(60)
    finally:
        producer.close(10)
    assert killed_at is not None
    acked = {}
    for i, f in enumerate(futures):
        acked[f"fo-{tag}/{i:05d}"] = f.get(timeout=1).offset   # every send was acknowledged
    new_leader = cluster.leader("kv")
    assert new_leader != leader
    print(f"killed node {leader}; node {new_leader} leads kv; {len(acked)} acknowledged")

    deadline = time.monotonic() + 60
    while len({r.offset for r in tail.records}) < EVENTS or len({r.offset for r in grouped.records}) < EVENTS:
        assert tail.error is None and grouped.error is None, (tail.error, grouped.error)
        assert time.monotonic() < deadline, (len(tail.records), len(grouped.records))
        time.sleep(0.2)
    tail.stop.set()
    grouped.stop.set()
    tail.join(10)
    grouped.join(10)

    names = [ev.decode_event(r.value).name for r in tail.records]
    assert len(names) == EVENTS and len(set(names)) == EVENTS                    # no duplicate in the topic
    assert {r.offset: ev.decode_event(r.value).name for r in tail.records} == {o: n for n, o in acked.items()}
    assert len({r.leader_epoch for r in tail.records}) >= 2                     # read across the term change
    assert [r.offset for r in tail.records] == sorted(r.offset for r in tail.records)
    assert {r.offset for r in grouped.records} == set(acked.values())           # the group consumer too
    with Client([cluster.endpoint(i) for i in cluster.running()]) as client:
        for name in (f"fo-{tag}/{0:05d}", f"fo-{tag}/{EVENTS // 3:05d}", f"fo-{tag}/{EVENTS - 1:05d}"):
            assert [row.offset for row in client.history(name)] == [acked[name]]
