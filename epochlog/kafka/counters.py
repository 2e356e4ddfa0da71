"""What the Kafka face served, counted where it happens and read by /metrics when scraped.

Plain counters on the node's loop (no Prometheus here, as `RaftGroup.counters`): epochlog/metrics.py
turns them into `epochlog_kafka_*` families. Records and bytes are counted per topic; a partition's
error per API and Kafka error name, so a client seeing NOT_LEADER or an authorization failure shows
on the node too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kafka.errors import for_code

from eventlog.records import HEADER_SIZE, read_header

API_NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
             10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
             15: "DescribeGroups", 16: "ListGroups", 17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics",
             22: "InitProducerId", 23: "OffsetForLeaderEpoch", 36: "SaslAuthenticate"}


def api_name(api_key: int) -> str:
    return API_NAMES.get(api_key, f"api_{api_key}")


def error_name(code: int) -> str:
    """Kafka's name of an error code (kafka-python's table), e.g. NOT_LEADER_FOR_PARTITION."""
    return str(for_code(code).message)


class KafkaCounters:
    """Counts of one node's Kafka face since it started. Use on the node's loop."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()                 # API name -> requests answered or dropped
        self.produced_records: Counter[str] = Counter()         # topic -> records appended
        self.produced_bytes: Counter[str] = Counter()           # topic -> bytes of their batches
        self.fetched_records: Counter[str] = Counter()          # topic -> records handed to consumers
        self.fetched_bytes: Counter[str] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()       # (API name, error name) -> partitions

    def request(self, api_key: int) -> None:
        self.requests[api_name(api_key)] += 1

    def error(self, api_key: int, code: int) -> None:
        if code:
            self.errors[(api_name(api_key), error_name(code))] += 1

    def produced(self, topic: str, records: int, size: int) -> None:
        self.produced_records[topic] += records
        self.produced_bytes[topic] += size

    def fetched(self, topic: str, buffers: Iterable[bytes | memoryview]) -> None:
        """Count the whole batches in `buffers` (a Fetch answer's records of one partition)."""
        records = size = 0
        for buf in buffers:
            size += len(buf)
            pos = 0
            while len(buf) - pos >= HEADER_SIZE:
                header = read_header(buf, pos)
                if header.size <= HEADER_SIZE:   # not a batch: count its bytes only
                    break
                records += header.records_count
                pos += header.size
        self.fetched_records[topic] += records
        self.fetched_bytes[topic] += size
