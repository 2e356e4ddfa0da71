"""The Kafka face against the native protocol, on a local 3-node cluster of `epochlog serve` processes.

    python -m bench.kafka_bench [--events 100000] [--no-write]

Produce: the same typed events (KvPut, ~150-byte values, like bench/node_load.py's) appended to
the kv group (a) by kafka-python's KafkaProducer (idempotent, acks=all: every batch waits for the
Raft commit), with its default batching and with larger batches, and (b) by the native SDK
(AsyncClient.commands, 100 events per call, 16 calls in flight). Fetch: the whole kv log read back
(a) by a KafkaConsumer (assign + seek, records decoded by kafka-python), (b) by the native
`read_events` (1000 events per call), and (c) by a raw Fetch v12 loop that only counts bytes: the
zero-copy path from the mapped segments, client parsing excluded. Everything runs on this
machine's 2 cores: client and three nodes share them, so the figures are a floor.

Uses tests/support/nodes.py (NodeCluster with Kafka addresses; free ports, processes killed on exit). Results go to bench/RESULTS.md
(section `kafka`) with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer.fetch import FetchRequest

from bench.results import write_section
from epochlog.client import AsyncClient, ClientError
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.epochlog.kafka.raw import RawKafka

KV = TopicPartition("__kv", 0)


def make_events(n: int, tag: str) -> list[bytes]:
    value = (b"x" * 150)
    return [ev.encode_event(ev.KvPut(name=f"bench-{tag}/{i:07d}", value=value)) for i in range(n)]


def kafka_produce(bootstrap: list[str], values: list[bytes], **config: object) -> float:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **config)
    try:
        producer.send("__kv", value=values[0]).get(30)    # metadata and producer id before the clock starts
        started = time.perf_counter()
        futures = [producer.send("__kv", value=v) for v in values[1:]]
        producer.flush(600)
        elapsed = time.perf_counter() - started
        for f in futures[-10:]:
            f.get(1)
    finally:
        producer.close(10)
    return (len(values) - 1) / elapsed


RETRIES = {"native": 0}


async def native_produce(endpoints: list[str], values: list[bytes], per_call: int = 100,
                         in_flight: int = 16) -> float:
    events = [ev.decode_event(v) for v in values]
    chunks = [events[i:i + per_call] for i in range(0, len(events), per_call)]
    async with AsyncClient(endpoints, timeout=60) as client:
        await client.commands(chunks[0])
        queue = list(reversed(chunks[1:]))
        started = time.perf_counter()

        deadline = time.monotonic() + 600

        async def worker() -> None:
            while queue:
                if time.monotonic() > deadline:
                    raise TimeoutError("native produce did not finish within 600 s")
                chunk = queue.pop()
                try:
                    await client.commands(chunk)   # request ids: a retry after a lost reply applies once
                except ClientError:
                    RETRIES["native"] += 1
                    queue.append(chunk)             # a leader change under load: try again

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
    return sum(len(c) for c in chunks[1:]) / elapsed


def kafka_consume(bootstrap: list[str], end: int) -> tuple[float, int, float]:
    """(records/s, records, value MB/s) of a KafkaConsumer reading the kv log from 0 to `end`."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=8 << 20,
                             max_partition_fetch_bytes=4 << 20, max_poll_records=100_000)
    try:
        consumer.assign([KV])
        consumer.seek(KV, 0)
        consumer.poll(timeout_ms=100, max_records=1)   # connections and metadata before the clock starts
        consumer.seek(KV, 0)
        count = size = 0
        started = time.perf_counter()
        while consumer.position(KV) < end:
            for records in consumer.poll(timeout_ms=1000).values():
                count += len(records)
                size += sum(len(r.value) + len(r.key or b"") for r in records)
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    return count / elapsed, count, size / elapsed / 1e6


async def native_consume(endpoints: list[str], leader_endpoint: str, end: int) -> float:
    async with AsyncClient(endpoints, timeout=60) as client:
        offset = count = 0
        started = time.perf_counter()
        while offset < end:
            page = await client.read_events("kv", offset, max_events=1000, max_bytes=4 << 20)
            count += len(page.events)
            offset = page.next_offset
        elapsed = time.perf_counter() - started
    return count / elapsed


def raw_fetch(address: str, end: int, max_bytes: int = 4 << 20) -> tuple[float, int]:
    """(MB/s, bytes) of Fetch v12 responses from offset 0 to `end`, counted, not parsed."""
    with RawKafka(address, timeout=30) as raw:
        offset = 0
        total = 0
        started = time.perf_counter()
        while offset < end:
            raw.send(FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0,
                                  session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                      topic="__kv", partitions=[FetchRequest.FetchTopic.FetchPartition(
                                          partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                          last_fetched_epoch=-1, log_start_offset=-1,
                                          partition_max_bytes=max_bytes)])],
                                  forgotten_topics_data=[], rack_id=""), 12)
            (size,) = struct.unpack(">i", raw._read(4))
            data = raw._read(size)
            total += size
            offset = _next_offset(data)
        elapsed = time.perf_counter() - started
    return total / elapsed / 1e6, total


def _next_offset(response: bytes) -> int:
    """The offset after the last batch of a one-partition Fetch v12 response (walks batch headers)."""
    from kafka.protocol.consumer.fetch import FetchResponse

    records = FetchResponse.decode(response[5:], version=12).responses[0].partitions[0].records
    pos, last = 0, -1
    while pos + 61 <= len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        last = base + struct.unpack_from(">i", records, pos + 23)[0]
        pos += 12 + length
    return last + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true", help="print only, do not update bench/RESULTS.md")
    args = parser.parse_args()
    n = args.events
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp:
        cluster = NodeCluster(Path(tmp), kafka=True, log={"segment_bytes": 64 << 20})
        try:
            cluster.start()
            leader = cluster.leader("kv")
            cluster.leader("metadata")
            rows = []
            print(f"cluster up; kv leader {leader}; producing {n:,} events", file=sys.stderr)
            default_rate = kafka_produce(cluster.bootstrap, make_events(n, "k1"))
            rows.append(("Produce", "kafka-python KafkaProducer, idempotent, acks=all, defaults "
                                    "(batch_size 16 KiB)", default_rate))
            print(f"kafka-python defaults: {default_rate:,.0f} events/s", file=sys.stderr)
            big_rate = kafka_produce(cluster.bootstrap, make_events(n, "k2"), batch_size=256 << 10, linger_ms=20)
            rows.append(("Produce", "same, batch_size 256 KiB, linger_ms 20", big_rate))
            print(f"kafka-python 256 KiB batches: {big_rate:,.0f} events/s", file=sys.stderr)
            native_rate = asyncio.run(native_produce(cluster.endpoints, make_events(n, "n1")))
            rows.append(("Produce", f"native SDK, AsyncClient.commands: 100 events per call, 16 in flight "
                                    f"({RETRIES['native']} calls retried)", native_rate))
            print(f"native: {native_rate:,.0f} events/s", file=sys.stderr)
            leader = cluster.leader("kv")
            status = cluster.group_status(leader, "kv")
            assert status is not None
            end = status.commit_offset + 1
            consume_rate, consumed, value_mbs = kafka_consume(cluster.bootstrap, end)
            rows.append(("Fetch", f"kafka-python KafkaConsumer, assign + seek 0, {consumed:,} records decoded",
                         consume_rate))
            native_read = asyncio.run(native_consume(cluster.endpoints, cluster.endpoint(leader), end))
            rows.append(("Fetch", "native SDK read_events, 1000 events per call", native_read))
            mbs = [raw_fetch(cluster.nodes[leader].kafka_address, end)[0] for _ in range(3)]
            raw_bytes = raw_fetch(cluster.nodes[leader].kafka_address, end)[1]
        finally:
            cluster.close()
    load_after = os.getloadavg()
    table = ["| path | client | events/s |", "|---|---|---|"]
    table += [f"| {kind} | {what} | {rate:,.0f} |" for kind, what, rate in rows]
    body = "\n".join([
        f"{n:,} KvPut events per producer run (value 150 B, record value ~230 B as msgpack, key ~25 B), "
        f"3 nodes and the client on this machine's 2 cores, group commit, 64 MiB segments. Load average "
        f"before: {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}; after: "
        f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f}.", "", *table, "",
        f"Fetch from segments (zero-copy, raw Fetch v12 with max_bytes 4 MiB, responses counted not parsed): "
        f"{statistics.median(mbs):,.0f} MB/s median of 3 runs over the whole kv log ({raw_bytes / 1e6:,.1f} MB; "
        f"runs {', '.join(f'{m:,.0f}' for m in mbs)} MB/s). KafkaConsumer value+key payload rate: "
        f"{value_mbs:,.1f} MB/s.",
    ])
    print(body)
    if not args.no_write:
        write_section("kafka", body, command=f"python -m bench.kafka_bench --events {n}")


if __name__ == "__main__":
    sys.exit(main())
