"""Reads at a follower right after a write the leader acknowledged (docs/raft.md, "Reads at a follower").

Without the commit broadcast (`[raft] commit_broadcast = false`) a follower learns that an entry is
committed from the leader's next append or heartbeat. Here heartbeats go out once a second (20 ticks of
50 ms), so a follower that served what it had applied would miss each write below for most of a
second: every read is made at once, and must see the write because the follower asks its leader
for the commit index and waits until it applied it, not because a heartbeat happened to arrive.

Real `epochlog serve` processes (3 members, Kafka faces on), real sockets on 127.0.0.1.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from epochlog.client import Client
from epochlog.client.errors import ClientError
from statemachines import events as ev
from tests.epochlog.kafka.raw import RawKafka
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import NodeCluster

ROUNDS = 3
SLOW_HEARTBEATS = {"commit_broadcast": False, "heartbeat_interval_ticks": 20, "election_timeout_ticks": 60}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("follower-reads"), kafka=True,
                                 raft=SLOW_HEARTBEATS)


def _followers(cluster: NodeCluster, group: str) -> list[int]:
    leader = cluster.leader(group)
    return [i for i in cluster.running() if i != leader]


def test_read_events_and_read_log_at_a_follower_see_a_write_acknowledged_just_before(cluster: NodeCluster) -> None:
    tag = uuid.uuid4().hex[:8]
    with Client([cluster.endpoint(cluster.leader("kv"))]) as client:
        for follower in _followers(cluster, "kv"):
            at = cluster.endpoint(follower)
            for i in range(ROUNDS):
                written = client.put(f"follower-reads/{tag}/{follower}/{i}", f"v{i}".encode())
                events = client.read_events("kv", written.offset, max_events=1, endpoint=at).events
                assert [e.offset for e in events] == [written.offset], (follower, i)
                assert isinstance(ev.decode_event(events[0].value), ev.KvPut)
                written = client.put(f"follower-reads/{tag}/{follower}/{i}", b"again")
                batches = client.read_log("kv", written.offset, endpoint=at)
                assert batches.start_offset <= written.offset < batches.next_offset, (follower, i, batches.next_offset)


def test_kafka_metadata_at_any_member_lists_a_topic_created_just_before(cluster: NodeCluster) -> None:
    """CreateTopics at the metadata leader (the controller Metadata names), then Metadata at each other
    member at once: naming the topic, and listing every topic."""
    controller = cluster.leader("metadata")
    others = [i for i in cluster.running() if i != controller]
    with RawKafka(cluster.nodes[controller].kafka_address) as admin:
        for i in range(2 * ROUNDS):
            topic = f"follower-reads-{uuid.uuid4().hex[:8]}-{i}"
            created = admin.call(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
                name=topic, num_partitions=2, replication_factor=3, assignments=[], configs=[])],
                timeout_ms=5000, validate_only=False), CreateTopicsResponse, 3).topics[0]
            assert created.error_code == 0, created
            for node in others:   # one request per member and topic: the first it hears of the topic
                with RawKafka(cluster.nodes[node].kafka_address) as raw:
                    if i % 2 == 0:
                        named = raw.call(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                                         allow_auto_topic_creation=False), MetadataResponse, 9)
                        assert named.topics[0].error_code == 0, (node, named.topics[0])
                        assert [p.partition_index for p in named.topics[0].partitions] == [0, 1]
                    else:
                        listed = raw.call(MetadataRequest(topics=None, allow_auto_topic_creation=False),
                                          MetadataResponse, 9)
                        assert topic in {t.name for t in listed.topics}, node


def test_a_follower_whose_leader_is_gone_does_not_answer_a_log_read_from_a_stale_commit(cluster: NodeCluster) -> None:
    """The leader is paused right after acknowledging a write: a follower that has not heard of the
    commit cannot learn it, so a read there either holds the write (a heartbeat came first) or fails,
    retriable, at its deadline; it never answers without it. Once the leader runs again, it holds it."""
    leader = cluster.leader("kv")
    follower = next(i for i in cluster.running() if i != leader)
    at = cluster.endpoint(follower)
    with Client([cluster.endpoint(leader)]) as client:   # open until the leader runs again: its close writes
        written = client.put(f"follower-reads/{uuid.uuid4().hex[:8]}/paused", b"v")
        cluster.pause(leader)
        try:
            with Client([at], timeout=2.0) as reader:
                try:
                    events = reader.read_events("kv", written.offset, max_events=1, endpoint=at).events
                except ClientError as exc:
                    assert exc.retriable, exc
                else:
                    assert [e.offset for e in events] == [written.offset]
        finally:
            cluster.resume(leader)
    with Client([at], timeout=30.0) as reader:
        events = reader.read_events("kv", written.offset, max_events=1, endpoint=at).events
    assert [e.offset for e in events] == [written.offset]
