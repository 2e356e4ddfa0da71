"""The Kafka request handler: one decoded request in, the buffers of its response out.

Theory of operation. Every Raft group `<g>` of the node is the topic `__<g>` with one partition
(`__metadata`, `__offsets`, `__kv`, ...): its offsets ARE the group's Raft log offsets, its
partition leader is the Raft leader and its leader epoch the Raft term (the batches' own
partitionLeaderEpoch). The log is Kafka RecordBatch v2, so Fetch hands out segment bytes as they
are (memoryviews of the mapped segments), never past the commit offset: the high watermark is the
commit offset + 1. Raft's own NOOP and membership entries are control batches, which Kafka
consumers skip.

Produce to `__<g>` is the native write path with Kafka framing: each record's value must decode as
a typed event (statemachines/events.py) that routes to group `<g>` and validates, its key (if set)
must be the event's entity key; one invalid record refuses the whole batch (INVALID_RECORD, or
CORRUPT_MESSAGE for a bad CRC) and nothing is appended. Accepted records are proposed as they are
(re-encoded canonically, no headers; timestamps are the leader's append time); the offset a
producer gets is the record's offset in the topic. acks=-1 answers once committed (majority, on
disk), acks=1 once in the leader's log, acks=0 not at all. Idempotent producers
(epochlog/kafka/producers.py) get producer ids from InitProducerId (the offset of a committed
event in the metadata group: unique across failovers) and per-partition sequence dedupe, whose state
is in the views (statemachines/producers.py), so a retry is answered with its original offset, or
refused, across leader changes, snapshots and compaction: never appended twice.

Consumer groups are epochlog/kafka/groups.py's.

A follower answers Produce, Fetch, ListOffsets and OffsetForLeaderEpoch with
NOT_LEADER_OR_FOLLOWER; Metadata names the Raft leader, so clients go there.

Work per request is bounded, so that no request holds the loop every group's heartbeats leave from
(docs/kafka.md, "Limits"): a request holding more than `MAX_REQUEST_ENTRIES` entries in its arrays
(topics, partitions, ...) closes the connection like an unparsable one (a Metadata request is
counted from its bytes, before it is decoded); a frame larger than `DECODE_INLINE_BYTES` is decoded
on a worker thread (the loop keeps running meanwhile); a Produce batch
larger than the group's batch limit is refused (MESSAGE_TOO_LARGE) before its CRC is even checked,
a compressed one is inflated at most to that limit (`RecordBatch.records(max_bytes)`), and its
records are checked in slices of `RECORDS_PER_SLICE` with a turn of the loop between two; a Fetch
re-encodes at most `HOSTED_FETCH_BYTES` of the kv log for hosted partitions.

Call everything from the node's loop. Nothing here touches a socket (epochlog/kafka/server.py does).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.data_container import DataContainer
from kafka.protocol.consumer.offsets import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from eventlog.errors import AuthenticationError, EpochlogError, InvalidBatchError, rejection
from eventlog.raft.errors import NotLeaderError
from epochlog.access_control import AccessControl, stamped
from epochlog.kafka.sasl import MECHANISMS, KafkaAccess
from epochlog.group_log import Committed, GroupLog, ProducerStamp
from eventlog.records import NO_PRODUCER_ID, iter_batches
from epochlog.kafka import errors as ke
from epochlog.kafka.counters import KafkaCounters
from epochlog.kafka import hosted
from epochlog.kafka.errors import KafkaError, UnsupportedRequestError, kafka_code
from epochlog.kafka import producers
from epochlog.kafka.wire import Buffer, FetchPartitionOut, encode_fetch_response, metadata_topic_count, response_frame
from epochlog.api.routing import group_of_event
from statemachines.access import Action, Operation, Principal, event_actions
from statemachines import events as ev
from statemachines.state import Outcome

if TYPE_CHECKING:
    from epochlog.node import Node

logger = logging.getLogger(__name__)

TOPIC_PREFIX = "__"
MAX_WAIT_MS = 30_000          # a Fetch long-poll waits at most this long, whatever it asks
MAX_FETCH_BYTES = 64 << 20    # a Fetch response holds at most this much record data, whatever it asks
HOSTED_FETCH_BYTES = 1 << 20  # ... and re-encodes at most this much of the kv log for hosted partitions
PRODUCER_ID_SCOPE = "kafka"   # InitProducerId: ConfigChanged(scope, name) in the metadata group
PRODUCER_ID_NAME = "producer-ids"
FORWARD_TIMEOUT_S = 2.0       # InitProducerId answers COORDINATOR_NOT_AVAILABLE (retriable) past this:
                              # kafka-python treats a timed-out InitProducerId as fatal
DECODE_INLINE_BYTES = 64 << 10   # larger frames are decoded on a worker thread (kafka-python decodes in Python)
MAX_REQUEST_ENTRIES = 1_000      # array entries (topics, partitions, members, ...) in one request, at any depth
RECORDS_PER_SLICE = 256          # a Produce batch's records are checked this many per turn of the loop
METADATA_CACHED_NAMES = 64       # Metadata answers naming more topics than this are not cached
METADATA_CATCH_UP_S = 2.0        # Metadata waits at most this long for the metadata group's commit (_catch_up_topics)

# What this node serves: api key -> (min version, max version). Versions are capped where
# kafka-python's classes or this adapter stop (Fetch v13+ names topics by id, not served).
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (3, 9),     # Produce
    1: (4, 12),    # Fetch
    2: (1, 11),    # ListOffsets
    3: (0, 13),    # Metadata
    18: (0, 4),    # ApiVersions
    22: (0, 4),    # InitProducerId
    23: (0, 4),    # OffsetForLeaderEpoch
    19: (0, 3),    # CreateTopics (hosted topics, epochlog/kafka/hosted.py)
    17: (1, 1),    # SaslHandshake (then SaslAuthenticate frames: epochlog/kafka/sasl.py)
    36: (0, 2),    # SaslAuthenticate
}

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """A topic partition and the group log that holds it."""

    topic: str
    partition: int
    group: GroupLog
    hosted: bool

    @property
    def key(self) -> str:
        """Producer-state key (producers.py): "" for a group's own topic, "topic/partition" if hosted."""
        return f"{self.topic}/{self.partition}" if self.hosted else ""


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


Handler = Callable[[Any, int], Awaitable[Any]]


class KafkaHandler:
    """Serves decoded Kafka requests from `node` (an epochlog.node.Node)."""

    def __init__(self, node: Node, brokers: dict[int, Broker], node_id: int,
                 access: AccessControl | None = None) -> None:
        self.node = node
        self.auth = KafkaAccess(access)   # who the connection is, what it may do (epochlog/kafka/sasl.py)
        self.brokers = brokers
        self.node_id = node_id
        self._producer_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._metadata_cache: dict[tuple[int, tuple[str, ...] | None], tuple[object, bytes]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="kafka-decode")   # one: never a crowd of them
        self.groups_coordinator: Any = None   # set by epochlog.kafka.groups when served
        self.counters = KafkaCounters()       # served on /metrics (epochlog/metrics.py)
        self._apis: dict[int, tuple[type, Handler]] = {
            0: (ProduceRequest, self.produce),
            1: (FetchRequest, self.fetch),
            2: (ListOffsetsRequest, self.list_offsets),
            3: (MetadataRequest, self.metadata),
            18: (ApiVersionsRequest, self.api_versions),
            22: (InitProducerIdRequest, self.init_producer_id),
            23: (OffsetForLeaderEpochRequest, self.offset_for_leader_epoch),
            19: (CreateTopicsRequest, self.create_topics),
            17: (SaslHandshakeRequest, self.sasl_handshake),
            36: (SaslAuthenticateRequest, self.sasl_authenticate),
        }
        self._hosted: dict[str, hosted.HostedTopic] = {}
        self._hosted_index = hosted.HostedIndex()
        self._hosted_at = -2   # metadata applied offset the cache was read at
        self.supported = dict(SUPPORTED)

    def register(self, api_key: int, versions: tuple[int, int], request_class: type, handler: Handler) -> None:
        """Serve another API (consumer groups, CreateTopics)."""
        self._apis[api_key] = (request_class, handler)
        self.supported[api_key] = versions

    # --- dispatch ---------------------------------------------------------------------------------

    async def handle(self, frame: memoryview) -> list[Buffer] | None:
        """One request frame (without its size prefix): the response buffers, None for no response
        (acks=0). Raises UnsupportedRequestError when the connection must be closed."""
        if len(frame) < 8:
            raise UnsupportedRequestError(f"a request of {len(frame)} bytes has no header")
        api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 0)
        entry = self._apis.get(api_key)
        versions = self.supported.get(api_key)
        if entry is None or versions is None:
            raise UnsupportedRequestError(f"API key {api_key} is not served")
        request_class, handler = entry
        self.counters.request(api_key)
        if not self.auth.may_serve(api_key):
            raise UnsupportedRequestError(f"API key {api_key} before the connection authenticated (SASL or a "
                                          f"client certificate)")
        if not versions[0] <= version <= versions[1]:
            if api_key == 18:   # KIP-511: answer with the supported list in v0
                return response_frame(correlation_id, False, [self._api_versions_body(0, ke.UNSUPPORTED_VERSION)])
            raise UnsupportedRequestError(f"API key {api_key} version {version} is not served "
                                     f"(versions {versions[0]}-{versions[1]})")
        try:
            if api_key == 3 and metadata_topic_count(frame, version) > MAX_REQUEST_ENTRIES:
                raise UnsupportedRequestError(f"more than {MAX_REQUEST_ENTRIES} topics named in one request")
            if len(frame) > DECODE_INLINE_BYTES:
                loop = asyncio.get_running_loop()
                request = await loop.run_in_executor(self._decoder, _decode, request_class, frame, version)
            else:
                request = _decode(request_class, frame, version)
        except UnsupportedRequestError as exc:
            raise UnsupportedRequestError(f"API key {api_key} v{version}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any parse failure: a malformed request
            raise UnsupportedRequestError(f"API key {api_key} v{version}: malformed request ({exc})") from None
        response = await handler(request, version)
        if response is None:
            return None
        if isinstance(response, list):      # pre-encoded body buffers (Fetch, cached Metadata)
            body = response
            response_class = request_class   # same flexibility rule for request and response
        else:
            body = [response.encode(version=version)]
            response_class = type(response)
        flexible = api_key != 18 and response_class.flexible_version_q(version)
        return response_frame(correlation_id, flexible, body)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        self._decoder.shutdown(wait=False, cancel_futures=True)

    # --- topics -----------------------------------------------------------------------------------

    def hosted_topics(self) -> dict[str, hosted.HostedTopic]:
        """Topics created with CreateTopics (read again whenever the metadata views moved)."""
        views = self.node.views.get("metadata")
        if views is None or self.node.group_log(hosted.HOST_GROUP) is None:
            return {}
        if views.applied_index != self._hosted_at:
            self._hosted = hosted.hosted_topics(views)
            self._hosted_at = views.applied_index
        return self._hosted

    def topics(self) -> dict[str, int]:
        """Topic name -> partition count: every group's own topic, then the hosted topics."""
        found = {TOPIC_PREFIX + name: 1 for name in self.node.group_logs()}
        found.update({t.name: t.partitions for t in self.hosted_topics().values()})
        return found

    def group_of_topic(self, topic: str) -> GroupLog | None:
        if topic.startswith(TOPIC_PREFIX):
            own = self.node.group_log(topic[len(TOPIC_PREFIX):])
            if own is not None:
                return own
        if topic in self.hosted_topics():
            return self.node.group_log(hosted.HOST_GROUP)
        return None

    def _partition(self, topic: str, partition: int) -> PartitionRef:
        group = self.group_of_topic(topic)
        count = self.topics().get(topic, 0)
        if group is None or not 0 <= partition < count:
            raise KafkaError(ke.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} does not exist")
        own = topic.startswith(TOPIC_PREFIX) and group.name == topic[len(TOPIC_PREFIX):]
        return PartitionRef(topic, partition, group, not own)

    def _leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> PartitionRef:
        ref = self._partition(topic, partition)
        log = ref.group
        if not log.leads:
            raise KafkaError(ke.NOT_LEADER_OR_FOLLOWER, f"node {self.node_id} does not lead {topic} "
                                                        f"(leader: {log.leader or 'unknown'})")
        term = log.term
        if current_leader_epoch >= 0 and current_leader_epoch != term:
            code = ke.FENCED_LEADER_EPOCH if current_leader_epoch < term else ke.UNKNOWN_LEADER_EPOCH
            raise KafkaError(code, f"leader epoch {current_leader_epoch}, this leader's is {term}")
        return ref

    def partition_high_watermark(self, ref: PartitionRef) -> int:
        """Of any partition: a group's own topic's is its commit offset + 1; a hosted one's is its last
        committed record + 1 (hosted.HostedIndex)."""
        log = ref.group
        hw = log.high_watermark
        if not ref.hosted:
            return hw
        self._hosted_index.sync(log, hw)
        return self._hosted_index.high_watermark(ref.key, log.start_offset)

    # --- ApiVersions ------------------------------------------------------------------------------

    def _api_versions_body(self, version: int, error_code: int = 0) -> bytes:
        keys = [ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(self.supported.items())]
        return bytes(ApiVersionsResponse(error_code=error_code, api_keys=keys, throttle_time_ms=0,
                                         version=version).encode(version=version))

    async def sasl_handshake(self, request: Any, version: int) -> Any:
        code = self.auth.handshake(request.mechanism)
        return SaslHandshakeResponse(error_code=code, mechanisms=list(MECHANISMS), version=version)

    async def sasl_authenticate(self, request: Any, version: int) -> Any:
        code, message, server_bytes = self.auth.authenticate(bytes(request.auth_bytes))
        return SaslAuthenticateResponse(error_code=code, error_message=message, auth_bytes=server_bytes,
                                        session_lifetime_ms=0, version=version)

    async def api_versions(self, request: Any, version: int) -> list[Buffer]:
        return [self._api_versions_body(version)]

    # --- Metadata ---------------------------------------------------------------------------------

    def _fingerprint(self) -> object:
        return (tuple((name, g.leader, g.term, g.voters, g.learners) for name, g in self.node.group_logs().items()),
                tuple(sorted(self.topics().items())))

    async def metadata(self, request: Any, version: int) -> list[Buffer]:
        """Encoded once per (version, topics, topics hidden from the caller) until a leader, term or
        membership changes. A caller sees the topics it may read or write (Kafka's Describe): asking for
        every topic lists only those; a topic it names and may not see is answered
        TOPIC_AUTHORIZATION_FAILED (counted and logged), whether it exists or not."""
        names = None if request.topics is None else tuple(t.name for t in request.topics)
        if version == 0 and names == ():
            names = None   # v0: an empty list means every topic
        principal = self.auth.principal("metadata")
        await self._catch_up_topics(names)
        hidden: tuple[str, ...] = ()
        if principal is not None:
            hidden = tuple(n for n in (sorted(self.topics()) if names is None else dict.fromkeys(names))
                           if not self.auth.may_any(principal, "metadata", self.topic_actions(n or ""),
                                                    report=names is not None))
        key = (version, names, hidden)
        fingerprint = self._fingerprint()
        cached = self._metadata_cache.get(key)
        if cached is not None and cached[0] == fingerprint:
            return [cached[1]]
        body = bytes(self._metadata_response(names, version, frozenset(hidden)).encode(version=version))
        if names is None or len(names) <= METADATA_CACHED_NAMES:   # the cache's memory stays small
            if len(self._metadata_cache) > 1024:
                self._metadata_cache.clear()
            self._metadata_cache[key] = (fingerprint, body)
        return [body]

    async def _catch_up_topics(self, names: tuple[str, ...] | None) -> None:
        """Before Metadata lists every topic, or names one this node does not know: wait until this node
        applied the metadata group's commit index (asked of its leader: GroupLog.commit_barrier), so a
        topic CreateTopics acknowledged on any node before the request is listed. Without it a member
        whose metadata views lag the commit (the leader's next append or heartbeat tells a follower, when
        `[raft] commit_broadcast` is off) answered UNKNOWN_TOPIC_OR_PARTITION, and a client caches that
        until its next refresh (aiokafka's consumer: metadata_max_age_ms, 5 minutes). Past
        METADATA_CATCH_UP_S (no metadata leader) it answers from what this node applied."""
        group = self.node.group_log("metadata")
        if group is None or self.node.group_log(hosted.HOST_GROUP) is None:
            return
        if names is not None:
            known = self.topics()
            if all(name in known for name in names):
                return
        try:
            await group.commit_barrier(METADATA_CATCH_UP_S)
        except EpochlogError as exc:
            logger.info("Metadata answered from what node %s applied of the metadata group: %s", self.node_id, exc)

    def topic_actions(self, topic: str) -> tuple[Action, Action]:
        """(read, write) of a topic by its name, whether it exists or not: a group's own topic `__<g>` is
        its log, any other name a hosted topic's (kafka-topic/<name>)."""
        if topic.startswith(TOPIC_PREFIX) and self.node.group_log(topic[len(TOPIC_PREFIX):]) is not None:
            log = f"log/{topic[len(TOPIC_PREFIX):]}"
            return Action(Operation.READ_LOG, log), Action(Operation.APPEND_LOG, log)
        return Action(Operation.READ, f"kafka-topic/{topic}"), Action(Operation.WRITE, f"kafka-topic/{topic}")

    def _metadata_response(self, names: tuple[str, ...] | None, version: int, hidden: frozenset[str]) -> Any:
        brokers = [MetadataResponse.MetadataResponseBroker(node_id=b.node_id, host=b.host, port=b.port, rack=None)
                   for b in self.brokers.values()]
        topics = []
        counts = self.topics()
        for name in (sorted(set(counts) - hidden) if names is None else names):
            group = self.group_of_topic(name or "")
            if name in hidden or group is None:
                code = ke.TOPIC_AUTHORIZATION_FAILED if name in hidden else ke.UNKNOWN_TOPIC_OR_PARTITION
                topics.append(MetadataResponse.MetadataResponseTopic(
                    error_code=code, name=name, topic_id=_ZERO_UUID, is_internal=False, partitions=[]))
                continue
            leader = group.leader if group.leader in self.brokers else -1
            replicas = [*group.voters, *group.learners]
            partitions = [MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                error_code=ke.NONE if leader > 0 else ke.LEADER_NOT_AVAILABLE, partition_index=i,
                leader_id=leader, leader_epoch=group.term, replica_nodes=replicas, isr_nodes=list(group.voters),
                offline_replicas=[]) for i in range(counts[name])]
            topics.append(MetadataResponse.MetadataResponseTopic(
                error_code=ke.NONE, name=name, topic_id=_ZERO_UUID, is_internal=False, partitions=partitions))
        metadata_group = self.node.group_log("metadata")
        controller = metadata_group.leader if metadata_group is not None and metadata_group.leader else -1
        return MetadataResponse(throttle_time_ms=0, brokers=brokers, cluster_id=self.node.cluster,
                                controller_id=controller, topics=topics, error_code=0, version=version)

    # --- ListOffsets ------------------------------------------------------------------------------

    async def list_offsets(self, request: Any, version: int) -> Any:
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                out = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1)
                try:
                    ref = self._leader(t.name, p.partition_index, getattr(p, "current_leader_epoch", -1))
                    self.auth.check("list_offsets", self.topic_actions(ref.topic)[:1])
                    out.offset, out.timestamp, out.leader_epoch = self._offset_for(ref, p.timestamp)
                except Exception as exc:  # noqa: BLE001 - answered as a Kafka error code
                    out.error_code = kafka_code(exc)
                    self.counters.error(2, out.error_code)
                parts.append(out)
            topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics, version=version)

    def _offset_for(self, ref: PartitionRef, timestamp: int) -> tuple[int, int, int]:
        """(offset, timestamp, leader epoch) for ListOffsets: -1 latest, -2 earliest, -3 max timestamp
        (answered as the latest), else the first record at or after `timestamp` (time index)."""
        log = ref.group
        hw = self.partition_high_watermark(ref)
        term = log.term
        if timestamp in (-1, -3):
            return hw, -1, term
        if timestamp == -2:
            start = log.start_offset
            return start, -1, log.epoch_for_offset(start) or term
        if timestamp < 0:
            raise KafkaError(ke.INVALID_REQUEST, f"timestamp {timestamp} is not a timestamp or -1/-2/-3")
        offset = log.offset_for_timestamp(timestamp)
        if offset is None or offset >= hw:
            return -1, -1, -1
        found = self._record_timestamp(log, offset)
        return offset, found, log.epoch_for_offset(offset) or term

    @staticmethod
    def _record_timestamp(log: GroupLog, offset: int) -> int:
        chunk = log.read(offset, 1)
        for batch in chunk.batches():
            for record in batch.records():
                if record.offset == offset:
                    return record.timestamp
        return -1

    # --- OffsetForLeaderEpoch ---------------------------------------------------------------------

    async def offset_for_leader_epoch(self, request: Any, version: int) -> Any:
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                out = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult.EpochEndOffset(
                    error_code=0, partition=p.partition, leader_epoch=-1, end_offset=-1)
                try:
                    ref = self._leader(t.topic, p.partition, getattr(p, "current_leader_epoch", -1))
                    self.auth.check("offset_for_leader_epoch", self.topic_actions(ref.topic)[:1])
                    found = ref.group.end_offset_for_epoch(p.leader_epoch)
                    if found is not None:
                        out.leader_epoch, out.end_offset = found
                except Exception as exc:  # noqa: BLE001
                    out.error_code = kafka_code(exc)
                    self.counters.error(23, out.error_code)
                parts.append(out)
            topics.append(OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
        return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics, version=version)

    # --- Fetch ------------------------------------------------------------------------------------

    async def fetch(self, request: Any, version: int) -> list[Buffer]:
        """Sessionless long-poll: answer at once when `min_bytes` are there, else when a partition's
        commit offset moves past what was asked or `max_wait_ms` passes. Only the leader serves."""
        deadline = time.monotonic() + min(max(request.max_wait_ms, 0), MAX_WAIT_MS) / 1000
        while True:
            total, out, waits = self._fetch_once(request, version)
            remaining = deadline - time.monotonic()
            if total >= max(request.min_bytes, 1) or remaining <= 0 or not waits:
                return encode_fetch_response(version, out)
            await _first_of([g.wait_applied(o) for g, o in waits], remaining)

    def _fetch_once(self, request: Any, version: int) -> tuple[
            int, list[tuple[str, list[FetchPartitionOut]]], list[tuple[GroupLog, int]]]:
        budget = min(request.max_bytes if request.max_bytes > 0 else MAX_FETCH_BYTES, MAX_FETCH_BYTES)
        total = 0
        hosted_left = HOSTED_FETCH_BYTES   # decoding and re-encoding is work on the loop: bounded per request
        out: list[tuple[str, list[FetchPartitionOut]]] = []
        waits: list[tuple[GroupLog, int]] = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                po = FetchPartitionOut(p.partition)
                try:
                    ref = self._leader(t.topic, p.partition, getattr(p, "current_leader_epoch", -1))
                    self.auth.check("fetch", self.topic_actions(ref.topic)[:1])
                    log = ref.group
                    # A partition is read up to its high watermark: for a group's topic the commit
                    # offset + 1; for a hosted one its last committed record + 1, so positions never
                    # pass what ListOffsets calls the end.
                    po.high_watermark = readable = self.partition_high_watermark(ref)
                    po.log_start_offset = log.start_offset
                    offset = p.fetch_offset
                    if offset < log.start_offset or offset > log.end_offset:
                        raise KafkaError(ke.OFFSET_OUT_OF_RANGE, f"offset {offset} is outside "
                                                                 f"[{log.start_offset}, {log.end_offset}]")
                    limit = min(p.partition_max_bytes, budget - total)
                    if offset < readable and (limit > 0 or total == 0):
                        if ref.hosted:
                            scan = min(max(limit, 1), hosted_left)
                            hosted_left -= scan
                            po.records = _read_hosted(ref, offset, readable, scan) if scan > 0 else []
                        else:
                            po.records = _read_committed(log, offset, readable, max(limit, 1))
                        total += po.records_bytes
                    if offset >= readable:   # wake on the group's next commit
                        waits.append((log, max(offset, log.high_watermark)))
                except Exception as exc:  # noqa: BLE001
                    po.error_code = kafka_code(exc)
                    po.records = []
                    self.counters.error(1, po.error_code)
                else:
                    self.counters.fetched(t.topic, po.records)
                parts.append(po)
            out.append((t.topic, parts))
        return total, out, waits

    # --- Produce ----------------------------------------------------------------------------------

    async def produce(self, request: Any, version: int) -> Any:
        if request.transactional_id is not None:
            return self._produce_error(request, version, ke.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                       "transactions are not supported")
        acks = request.acks
        if acks not in (-1, 0, 1):
            return self._produce_error(request, version, ke.INVALID_REQUEST, f"acks={acks} is not -1, 0 or 1")
        timeout = max(request.timeout_ms, 1) / 1000
        try:
            principal = self.auth.principal("produce")   # once per request: its partitions and records check against it
        except AuthenticationError as exc:
            return self._produce_error(request, version, ke.SASL_AUTHENTICATION_FAILED, str(exc))
        jobs = []
        for t in request.topic_data:
            for p in t.partition_data:
                jobs.append((t.name, p.index, self._produce_partition(t.name, p.index, p.records, acks, timeout,
                                                                      principal)))
        results = await asyncio.gather(*(j[2] for j in jobs))
        if acks == 0:
            return None
        by_topic: dict[str, list[Any]] = {}
        for (topic, index, _), (code, base_offset, message, log_start) in zip(jobs, results):
            by_topic.setdefault(topic, []).append(ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                index=index, error_code=code, base_offset=base_offset, log_append_time_ms=-1,
                log_start_offset=log_start, record_errors=[], error_message=message if code else None))
        return ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(name=topic, partition_responses=parts)
                                          for topic, parts in by_topic.items()],
                               throttle_time_ms=0, version=version)

    def _produce_error(self, request: Any, version: int, code: int, message: str) -> Any:
        if request.acks == 0:
            return None
        return ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(
            name=t.name, partition_responses=[ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                index=p.index, error_code=code, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                record_errors=[], error_message=message) for p in t.partition_data]) for t in request.topic_data],
            throttle_time_ms=0, version=version)

    async def _produce_partition(self, topic: str, partition: int, data: bytes | None, acks: int,
                                 timeout: float, principal: Principal | None) -> tuple[int, int, str | None, int]:
        """(error code, base offset, error message, log start offset) for one partition's batch, sent by
        `principal` (None: access is not enforced)."""
        try:
            ref = self._leader(topic, partition)
            self.auth.check("produce", self.topic_actions(ref.topic)[1:], principal=principal)
            header, records = await self._decode_batch(ref, data, principal)
            committed = await self._append(ref, header, records, acks, timeout)
            self.counters.produced(topic, len(records), len(data or b""))
            return ke.NONE, committed, None, ref.group.start_offset
        except Exception as exc:  # noqa: BLE001 - every failure is a Kafka error code
            code = kafka_code(exc)
            self.counters.error(0, code)
            if code == ke.UNKNOWN_SERVER_ERROR:
                logger.exception("produce to %s-%s failed", topic, partition)
            elif code in (ke.OUT_OF_ORDER_SEQUENCE_NUMBER, ke.INVALID_PRODUCER_EPOCH):
                logger.warning("produce to %s-%s refused: %s", topic, partition, exc)
            return code, -1, f"{type(exc).__name__}: {exc}", -1

    async def _decode_batch(self, ref: PartitionRef, data: bytes | None,
                            principal: Principal | None) -> tuple[Any, list[tuple[bytes, bytes]]]:
        """The batch's header and its records as validated (entity key, event) pairs; nothing is
        appended unless every record is a valid event of the partition's group (for a hosted topic:
        every record wraps as a valid kv event, hosted.wrap).

        Bounded work: a batch larger than the group's batch limit is refused before anything else,
        a compressed one inflates at most to that limit (MESSAGE_TOO_LARGE past it), and the records
        are checked `RECORDS_PER_SLICE` at a time, the loop running other work between two slices."""
        group = ref.group.name
        if not data:
            raise KafkaError(ke.INVALID_RECORD, "the produce request carries no record batch")
        limit = ref.group.max_batch_bytes
        if len(data) > limit:
            raise KafkaError(ke.MESSAGE_TOO_LARGE, f"a batch of {len(data)} bytes exceeds the batch limit of "
                                                   f"{TOPIC_PREFIX}{group} ({limit} bytes)")
        try:
            batches = list(iter_batches(data, verify_crc=True))
        except InvalidBatchError as exc:
            raise KafkaError(ke.CORRUPT_MESSAGE, f"record batch: {exc}") from None
        except struct.error as exc:
            raise KafkaError(ke.CORRUPT_MESSAGE, f"record batch: {exc}") from None
        if len(batches) != 1:
            raise KafkaError(ke.INVALID_RECORD, f"a produce request carries exactly one batch per partition, "
                                                f"not {len(batches)}")
        batch = batches[0]
        h = batch.header
        if h.is_control or h.is_transactional:
            raise KafkaError(ke.INVALID_RECORD, "control and transactional batches are not accepted")
        records: list[tuple[bytes, bytes]] = []
        # BatchTooLargeError (MESSAGE_TOO_LARGE) once the records inflate past the limit;
        # UnsupportedCompressionError: snappy, lz4, zstd.
        for i, record in enumerate(batch.records(max_bytes=limit)):
            if i and i % RECORDS_PER_SLICE == 0:
                await asyncio.sleep(0)
            if record.headers:
                raise KafkaError(ke.INVALID_RECORD, f"record {i}: record headers are not stored; send none")
            if ref.hosted:   # signed by its sender, as a group's own events below
                try:
                    wrapped = hosted.wrap(ref.topic, ref.partition, record.key, record.value)
                    if principal is not None:
                        wrapped = stamped([wrapped], principal.name)[0]
                    records.append(ev.event_record(wrapped))
                except EpochlogError as exc:
                    raise KafkaError(ke.INVALID_RECORD, f"record {i}: {exc}") from None
                continue
            if record.value is None:
                raise KafkaError(ke.INVALID_RECORD, f"record {i}: the value must be an event, not null")
            try:
                event = self.node.client_event(ev.decode_event(record.value))
            except (EpochlogError, RecursionError) as exc:   # RecursionError: nested too deeply to decode
                raise KafkaError(ke.INVALID_RECORD, f"record {i}: {exc}") from None
            if principal is not None:   # each record's event on its own, signed by its sender
                self.auth.check("produce", event_actions(event), principal=principal)
                event = stamped([event], principal.name)[0]
            try:
                key, value = ev.event_record(event)
                owner = group_of_event(event)
            except (EpochlogError, RecursionError) as exc:   # RecursionError: nested too deeply to decode
                raise KafkaError(ke.INVALID_RECORD, f"record {i}: {exc}") from None
            if owner != group:
                raise KafkaError(ke.INVALID_RECORD, f"record {i}: a {type(event).__name__} for {key.decode()} "
                                                    f"belongs to topic {TOPIC_PREFIX}{owner}")
            if record.key is not None and record.key != key:
                raise KafkaError(ke.INVALID_RECORD, f"record {i}: key {record.key!r} is not the event's entity "
                                                    f"key {key!r}")
            records.append((key, value))
        if len(records) != h.records_count or not records:
            raise KafkaError(ke.INVALID_RECORD, "the batch holds no record")
        return h, records

    async def _append(self, ref: PartitionRef, h: Any, records: list[tuple[bytes, bytes]], acks: int,
                      timeout: float) -> int:
        """Propose the records; their first offset, once committed (acks=-1) or in the log (acks 0/1)."""
        group = ref.group
        idempotent = h.producer_id != NO_PRODUCER_ID and h.base_sequence >= 0
        if not idempotent:
            return await self._submit(group, records, None, acks, timeout)
        lock = _Held(self._producer_locks.setdefault((group.name, h.producer_id), asyncio.Lock()))
        try:
            await asyncio.wait_for(lock.acquire(), timeout)
            views = self.node.views[group.name]
            duplicate = producers.check(views.store, group, views.applied_index, h.producer_id,
                                        h.producer_epoch, h.base_sequence, len(records), ref.key)
            if duplicate is not None:
                lock.release()
                if acks == -1:
                    await group.wait_applied(duplicate.last_offset, timeout)
                return duplicate.first_offset
            stamp = ProducerStamp(h.producer_id, h.producer_epoch, h.base_sequence)
            return await self._submit(group, records, stamp, acks, timeout, lock)
        finally:
            lock.release()
            if len(self._producer_locks) > 10_000:   # forget idle producers' locks (state lives in the views)
                for key in [k for k, v in self._producer_locks.items() if not v.locked()]:
                    del self._producer_locks[key]

    async def _submit(self, group: GroupLog, records: list[tuple[bytes, bytes]], stamp: ProducerStamp | None,
                      acks: int, timeout: float, lock: _Held | None = None) -> int:
        loop = asyncio.get_running_loop()
        appended: asyncio.Future[int] = loop.create_future()

        def on_appended(offset: int) -> None:
            if lock is not None:
                lock.release()   # the batch is in the log: the producer's next batch may be checked
            if not appended.done():
                appended.set_result(offset)

        submit = asyncio.ensure_future(group.append(list(records), producer=stamp, on_appended=on_appended))
        if acks == -1:
            done: Committed = await asyncio.wait_for(asyncio.shield(submit), timeout)
            first = done.outcomes[0] if done.outcomes else None
            if isinstance(first, Outcome) and stamp is not None:
                if first.duplicate:   # the applier found it in the producer's state: the original offset
                    return first.offset
                if not first.ok and rejection(first.code).kafka_error is not None:
                    raise producers.refused(first.code, first.message)
            return done.offset
        self._watch(submit)
        # acks 0/1: the leader's log has it, or the proposal failed before that (not the leader...).
        await asyncio.wait({appended, submit}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if appended.done():
            return appended.result()
        if submit.done():
            return submit.result().offset   # raises the proposal's error
        raise TimeoutError(f"the batch was not appended within {timeout:.1f} s")

    def _watch(self, submit: asyncio.Future[Any]) -> None:
        """Let a proposal nobody waits for (acks 0/1) finish; its failure is only logged."""
        def done(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is not None:
                logger.info("an acks=0/1 produce did not commit: %s", f.exception())
        submit.add_done_callback(done)

    # --- CreateTopics -----------------------------------------------------------------------------

    async def create_topics(self, request: Any, version: int) -> Any:
        """Declare hosted topics (hosted.py) in the metadata group; replication is the kv group's, so
        the replication factor and replica assignments asked for are not used; topic configs neither."""
        results = []
        for t in request.topics:
            code, message = ke.NONE, None
            try:
                await self._create_topic(t.name, t.num_partitions, getattr(request, "validate_only", False))
            except Exception as exc:  # noqa: BLE001
                code, message = kafka_code(exc), str(exc)
                if code in (ke.NOT_LEADER_OR_FOLLOWER, ke.UNKNOWN_SERVER_ERROR, ke.REQUEST_TIMED_OUT):
                    code = ke.REQUEST_TIMED_OUT if code == ke.REQUEST_TIMED_OUT else ke.NOT_CONTROLLER
            results.append(CreateTopicsResponse.CreatableTopicResult(
                name=t.name, error_code=code, error_message=message))
        return CreateTopicsResponse(throttle_time_ms=0, topics=results, version=version)

    async def _create_topic(self, name: str, partitions: int, validate_only: bool) -> None:
        if not hosted.TOPIC_NAME.match(name or "") or name.startswith(TOPIC_PREFIX):
            raise KafkaError(ke.INVALID_TOPIC_EXCEPTION, f"topic {name!r}: 1-128 letters, digits, '.', '_', '-', "
                                                         f"starting with a letter or digit")
        if partitions == -1:
            partitions = 1
        if not 1 <= partitions <= hosted.MAX_PARTITIONS:
            raise KafkaError(ke.INVALID_PARTITIONS, f"{partitions} partitions (1-{hosted.MAX_PARTITIONS})")
        if self.node.group_log(hosted.HOST_GROUP) is None:
            raise KafkaError(ke.POLICY_VIOLATION, f"no {hosted.HOST_GROUP} group to host topics")
        # Kafka's Create on the topic: admin, or a writer of the topic. The declaration it writes (an
        # event of the metadata group) is signed with the principal's name; changing it later is admin's.
        self.auth.check("create_topics", (Action(Operation.CREATE, f"kafka-topic/{name}"),))
        principal = self.auth.principal("create_topics")
        if name in self.topics():
            raise KafkaError(ke.TOPIC_ALREADY_EXISTS, f"topic {name} exists")
        if validate_only:
            return
        # Created once: the declaration's key must not exist yet (two concurrent creates: one wins).
        declared = hosted.declaration(name, partitions)
        event: ev.Event = ev.Txn(conditions=(ev.Condition(declared.key(), 0),), ops=(declared,), actor="kafka")
        if principal is not None:
            (event,) = stamped([event], principal.name)
        event.validate()
        group = self._metadata()
        if group.leads:
            (result,) = await self.node.write([event])
        else:
            result = await asyncio.wait_for(self._forward(event), FORWARD_TIMEOUT_S)
            await group.wait_applied(result.offset, FORWARD_TIMEOUT_S)   # this node's Metadata lists it at once
        if not result.ok:
            raise KafkaError(ke.TOPIC_ALREADY_EXISTS, f"topic {name} exists ({result.code})")

    # --- InitProducerId ---------------------------------------------------------------------------

    async def init_producer_id(self, request: Any, version: int) -> Any:
        """A new producer id: the offset of a committed event in the metadata group, so ids are unique
        across leader changes and restarts. Written through the metadata leader from any node."""
        response = InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=-1, producer_epoch=-1,
                                          version=version)
        if request.transactional_id is not None:
            response.error_code = ke.TRANSACTIONAL_ID_AUTHORIZATION_FAILED   # transactions: not supported
            return response
        try:   # Kafka: IdempotentWrite on the cluster, which a Write grant on any topic implies
            self.auth.check("init_producer_id", (Action(Operation.IDEMPOTENT_WRITE),), ke.CLUSTER_AUTHORIZATION_FAILED)
        except KafkaError as exc:
            response.error_code = exc.kafka_error
            return response
        producer_id = getattr(request, "producer_id", -1)
        epoch = getattr(request, "producer_epoch", -1)
        if producer_id >= 0 and 0 <= epoch < 32766:
            # KIP-360 epoch bump of an idempotent producer: the id stays its own, the new epoch fences
            # its older batches (producers.py); nothing to store, so a bump never waits for the
            # metadata group (e.g. while it elects a leader after a failover).
            response.producer_id, response.producer_epoch = producer_id, epoch + 1
            logger.info("producer %s bumps its epoch to %s", producer_id, epoch + 1)
            return response
        try:
            response.producer_id = await asyncio.wait_for(self._allocate_producer_id(), FORWARD_TIMEOUT_S)
            response.producer_epoch = 0
        except Exception as exc:  # noqa: BLE001
            response.error_code = ke.COORDINATOR_NOT_AVAILABLE if isinstance(exc, NotLeaderError) else kafka_code(exc)
            if response.error_code in (ke.NOT_LEADER_OR_FOLLOWER, ke.UNKNOWN_SERVER_ERROR, ke.REQUEST_TIMED_OUT):
                response.error_code = ke.COORDINATOR_NOT_AVAILABLE   # retriable for the producer
            logger.info("InitProducerId failed: %s", exc)
        return response

    async def _allocate_producer_id(self) -> int:
        event = ev.ConfigChanged(scope=PRODUCER_ID_SCOPE, name=PRODUCER_ID_NAME, value=str(self.node_id),
                                 actor="kafka")
        if self._metadata().leads:
            (result,) = await self.node.write([event])
            return int(result.offset)
        return await self.forward_write(event)

    def _metadata(self) -> GroupLog:
        group = self.node.group_log("metadata")
        assert group is not None, "every node runs the metadata group (epochlog.api.routing.REQUIRED_GROUPS)"
        return group

    async def forward_write(self, event: ev.Event) -> int:
        """Write `event` through its group's leader on another node (the native protocol); its offset."""
        return int((await self._forward(event)).offset)

    async def _forward(self, event: ev.Event) -> Any:
        from epochlog.client import AsyncClient   # only when this node does not lead the group

        addresses = [a for i, a in self.node.client_addresses.items() if a and i != self.node_id]
        if not addresses:
            raise KafkaError(ke.COORDINATOR_NOT_AVAILABLE, "no other node to write through")
        async with AsyncClient(addresses, timeout=FORWARD_TIMEOUT_S, tls=self.node.internal_tls) as client:
            return (await client.commands([event]))[0]


def _decode(request_class: Any, frame: memoryview, version: int) -> Any:
    """The request of a frame; UnsupportedRequestError when it holds more than MAX_REQUEST_ENTRIES array
    entries, at any depth. Pure: runs on the decoding thread for large frames, and a request refused
    there is freed there too (the error holds no reference to it)."""
    request = request_class.decode(frame, version=version, header=True)
    if _too_many_entries(request):
        del request
        raise UnsupportedRequestError(f"more than {MAX_REQUEST_ENTRIES} entries (topics, partitions, ...) in one request")
    return request


def _too_many_entries(request: Any) -> bool:
    entries = 0
    stack = [request]
    while stack:
        item = stack.pop()
        for name in item.fields:
            value = getattr(item, name, None)
            if isinstance(value, list):
                entries += len(value)
                if entries > MAX_REQUEST_ENTRIES:
                    return True
                stack.extend(v for v in value if isinstance(v, DataContainer))
            elif isinstance(value, DataContainer):
                stack.append(value)
    return False


class _Held:
    """An asyncio.Lock this task holds at most once: `release` is idempotent."""

    __slots__ = ("lock", "held")

    def __init__(self, lock: asyncio.Lock) -> None:
        self.lock = lock
        self.held = False

    async def acquire(self) -> None:
        await self.lock.acquire()
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.lock.release()


def _read_hosted(ref: PartitionRef, offset: int, high_watermark: int, max_bytes: int) -> list[Buffer]:
    """The hosted partition's records from `offset` below its high watermark, re-encoded (hosted.py);
    reads at most about `max_bytes` of the kv log, below the kv commit offset (a kv batch may run past
    the partition's watermark: its records from there on are not served yet). The batches served
    cover the offsets read and no more: a read cut short (by `max_bytes`, at a segment's end) must
    not be taken for a range holding nothing of the partition up to the watermark."""
    log = ref.group
    chunk = log.read(offset, max_bytes, max_offset=log.high_watermark)
    until = min(high_watermark, chunk.next_offset)
    epoch = log.epoch_for_offset(until - 1) or log.term
    return list(hosted.filter_batches(chunk.batches(), hosted.entity_prefix(ref.topic, ref.partition), offset,
                                      until, epoch))


def _read_committed(log: GroupLog, offset: int, high_watermark: int, max_bytes: int) -> list[Buffer]:
    """Zero-copy views of whole batches from `offset` below the high watermark, up to `max_bytes`
    (at least one batch), across segment boundaries."""
    out: list[Buffer] = []
    size = 0
    while offset < high_watermark and (size < max_bytes or not out):
        chunk = log.read(offset, max(max_bytes - size, 1), max_offset=high_watermark)
        if chunk.next_offset <= offset or not len(chunk.data):
            break
        if out and size + len(chunk.data) > max_bytes:
            break
        out.append(chunk.data)
        size += len(chunk.data)
        offset = chunk.next_offset
    return out


async def _first_of(waits: list[Awaitable[None]], timeout: float) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()   # retrieved: a failed wait only ends the long-poll
