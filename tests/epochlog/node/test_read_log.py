"""read_log, the export's read (issue 23): committed batches as the log stores them, decoded by the reader.

Three real `epochlog serve` processes (64 KiB segments, the scrub off so that a damaged batch is found
by the read under test, kv's log truncated rather than key-compacted), shared by the module in this
order: every member, followers included, serves the same records read_events does (the `applied`
flags of a rejected compare-and-set and of a retried request too), and a reply changed on the way is
refused by the decoder; a leader whose followers are stopped holds an uncommitted tail that read_log
never returns; a follower's damaged batch is refused (not served) and the export source gets the range
from the leader, every record as written; a range the log no longer holds record by record answers
`compacted`, and the export source refuses it. Who may call it is in test_access_faces.py and
tests/epochlog/test_permissions.py (the same rule as read_events).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from epochlog.client import Client, ClientError, CompactedError
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from eventlog.errors import LogError
from eventlog.offline import CommittedRecord, decode_batches
from spark.errors import ExportError
from spark.sources import ClusterSource
from statemachines import events as ev
from statemachines.request_ids import uuid7
from tests.epochlog.kafka.test_corruption import _damage, _sealed_middle_segment
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("read-log"),
                                 grpc=True, log={"segment_bytes": 64 << 10, "scrub_bytes_per_second": 0},
                                 raft={"election_timeout_ticks": 20},
                                 compaction={"retain_offsets": 0, "compact_groups": ["metadata"]})


def _fill(cluster: NodeCluster, prefix: str, count: int) -> dict[int, tuple[str, bytes]]:
    """`count` puts of 500-byte values in calls of 10; offset -> (name, value)."""
    written: dict[int, tuple[str, bytes]] = {}
    with Client(cluster.endpoints, timeout=WAIT_S, sessions=False) as client:
        for start in range(0, count, 10):
            events = [ev.KvPut(name=f"{prefix}/{i:05d}", value=f"{prefix}:{i}:".encode().ljust(500, b"#"))
                      for i in range(start, min(count, start + 10))]
            for event, result in zip(events, client.commands(events)):
                assert result.ok, result
                written[result.offset] = (event.name, event.value)
    return written


def _put(record: CommittedRecord) -> tuple[str, bytes]:
    """(name, value) of a kv put's record."""
    event = ev.decode_event(record.value or b"")
    assert isinstance(event, ev.KvPut) and record.key == f"kv/{event.name}", record
    return event.name, event.value


def _read_log(client: Client, endpoint: str, lo: int, hi: int, max_bytes: int = 4 << 20) -> list[CommittedRecord]:
    """Offsets [lo, hi) through read_log from `endpoint` only, decoded as the export decodes them."""
    out: list[CommittedRecord] = []
    offset = lo
    while offset < hi:
        got = client.read_log("kv", offset, max_bytes=max_bytes, endpoint=endpoint)
        assert got.start_offset <= offset and got.next_offset > offset, (offset, got.start_offset, got.next_offset)
        records, _ = decode_batches(got.data, offset, hi, applied=frozenset(got.noops))
        assert not got.unknown
        out += records
        offset = got.next_offset
    return out


def _read_events(client: Client, endpoint: str, lo: int, hi: int) -> list[CommittedRecord]:
    out: list[CommittedRecord] = []
    offset = lo
    while offset < hi:
        got = client.read_events("kv", offset, max_events=700, endpoint=endpoint)
        out += [CommittedRecord(e.offset, e.key, e.value, e.timestamp, e.term, e.applied)
                for e in got.events if e.offset < hi]
        assert got.next_offset > offset
        offset = got.next_offset
    return out


def test_every_member_serves_what_read_events_serves(cluster: NodeCluster) -> None:
    written = _fill(cluster, "same", 300)
    with Client(cluster.endpoints, timeout=WAIT_S, sessions=False) as client:
        stale = client.commands([ev.KvPut(name="same/00000", value=b"x", expected_version=10**9)])[0]
        assert not stale.ok   # a failed compare-and-set: committed, changed nothing
        retry = ev.KvPut(name="same/retried", value=b"r", request_id=uuid7())
        client.commands([retry])
        client.commands([retry])   # the same request id again: a record that changes nothing
        end = client.read_events("kv", 1 << 62, max_events=1).commit_offset + 1
        for node in cluster.nodes:
            cluster.wait_applied(node, "kv", end - 1, timeout=WAIT_S)
            endpoint = cluster.endpoint(node)
            raw = _read_log(client, endpoint, 0, end, max_bytes=20_000)   # many calls, batches cut across them
            assert raw == _read_events(client, endpoint, 0, end), f"node {node}"
            by_offset = {r.offset: r for r in raw}
            assert {o: _put(by_offset[o]) for o in written} == written, f"node {node}"
            assert by_offset[stale.offset].applied is False
            assert [r.applied for r in raw if r.key == "kv/same/retried"] == [True, False]
            assert sum(r.applied is False for r in raw) == 2 and all(r.term > 0 for r in raw)

        # gRPC's ReadLog is the same reply.
        native = client.read_log("kv", 0, max_bytes=30_000, endpoint=cluster.endpoint(2))
        with grpc.insecure_channel(cluster.nodes[2].grpc_address) as channel:
            twin = pb_grpc.EpochlogStub(channel).ReadLog(pb.ReadLogRequest(group="kv", from_offset=0, max_bytes=30_000),
                                                         timeout=WAIT_S)
        assert (twin.batches, twin.start_offset, twin.next_offset, twin.log_start, list(twin.noops)) == \
            (native.data, native.start_offset, native.next_offset, native.log_start, native.noops)

        # A reply is checked where it is decoded: a flipped byte, or a batch missing at its start.
        got = client.read_log("kv", min(written), endpoint=cluster.endpoint(1))
        decoded, end_of = decode_batches(got.data, min(written), got.next_offset)
        assert end_of == got.next_offset and len(decoded) >= 10
        flipped = bytearray(got.data)
        flipped[len(flipped) // 2] ^= 0xFF
        with pytest.raises(LogError, match="damaged"):
            decode_batches(bytes(flipped), min(written), got.next_offset)
        first_size = int.from_bytes(got.data[8:12], "big") + 12
        with pytest.raises(LogError, match="missing"):
            decode_batches(got.data[first_size:], got.start_offset, got.next_offset)


def test_a_leader_never_serves_its_uncommitted_tail(cluster: NodeCluster) -> None:
    _fill(cluster, "tail", 20)
    leader = cluster.leader("kv", timeout=WAIT_S)
    followers = [n for n in cluster.nodes if n != leader]
    for f in followers:
        cluster.pause(f)
    try:
        def write() -> None:   # cannot commit: no follower answers
            try:
                with Client([cluster.endpoint(leader)], timeout=3.0, sessions=False) as c:
                    c.commands([ev.KvPut(name=f"tail/uncommitted/{i}", value=b"u") for i in range(50)])
            except (ClientError, TimeoutError):
                pass
        writer = threading.Thread(target=write)
        writer.start()
        status = wait_until(lambda: (g := cluster.group_status(leader, "kv")) is not None
                            and g.last_offset > g.commit_offset and g, WAIT_S,
                            "the leader to append records it cannot commit")
        with Client([cluster.endpoint(leader)], timeout=WAIT_S, sessions=False) as client:
            offset, seen = 0, []
            while True:
                got = client.read_log("kv", offset, endpoint=cluster.endpoint(leader))
                seen += decode_batches(got.data, offset, 1 << 62)[0]
                if got.next_offset == offset:
                    break
                offset = got.next_offset
            after = cluster.wait_group_status(leader, "kv")
            assert after.commit_offset == status.commit_offset, "committed meanwhile"
            assert offset == status.applied_offset + 1 <= status.commit_offset + 1
            assert max(r.offset for r in seen) <= status.commit_offset < after.last_offset
            assert not [r for r in seen if r.key.startswith("kv/tail/uncommitted/")]
            assert got.data == b"" and got.commit_offset == status.commit_offset
        writer.join()
    finally:
        for f in followers:
            cluster.resume(f)
    cluster.leader("kv", timeout=WAIT_S)


def test_a_damaged_batch_is_refused_and_the_export_reads_the_range_from_the_leader(cluster: NodeCluster) -> None:
    written = _fill(cluster, "rot", 400)
    leader = cluster.leader("kv", timeout=WAIT_S)
    follower = next(n for n in cluster.nodes if n != leader)
    with Client(cluster.endpoints, timeout=WAIT_S, sessions=False) as client:
        end = client.read_events("kv", 1 << 62, max_events=1).commit_offset + 1
    cluster.wait_applied(follower, "kv", end - 1, timeout=WAIT_S)
    cluster.stop(follower)
    first, _ = _damage(_sealed_middle_segment(cluster, follower, set(written)))
    cluster.start([follower])
    cluster.wait_applied(follower, "kv", end - 1, timeout=WAIT_S)
    with Client(cluster.endpoints, timeout=WAIT_S, sessions=False) as client:
        with pytest.raises(ClientError) as refused:
            client.read_log("kv", first, endpoint=cluster.endpoint(follower))
        assert refused.value.code in ("corrupt_batch", "log_refetching"), refused.value

    source = ClusterSource(tuple(cluster.endpoints), WAIT_S, ("kv",)).prepared()
    slot = sorted(cluster.nodes).index(follower)
    assert source.readers[slot] == cluster.endpoint(follower)
    lo, hi = min(written), max(written) + 1
    records = [r for chunk in source.read("kv", lo, hi, slot) for r in chunk]
    assert {r.offset: _put(r) for r in records if r.offset in written} == written
    with Client(cluster.endpoints, timeout=WAIT_S, sessions=False) as client:
        assert records == _read_events(client, cluster.endpoint(leader), lo, hi)


def test_a_compacted_range_is_refused_and_the_export_says_so(cluster: NodeCluster) -> None:
    _fill(cluster, "cut", 300)
    leader = cluster.leader("kv", timeout=WAIT_S)
    with Client(cluster.endpoints, timeout=WAIT_S, sessions=False) as client:
        for node in cluster.nodes:   # every member: any of them may serve the source's reads
            client.snapshot("kv", endpoint=cluster.endpoint(node))
        starts = {node: wait_until(lambda n=node: (g := cluster.group_status(n, "kv")) is not None
                                   and g.log_start > 0 and g.log_start, WAIT_S, f"a snapshot to cut node {node}'s log")
                  for node in cluster.nodes}
        start = starts[leader]
        with pytest.raises(CompactedError, match="resync from the snapshot"):
            client.read_log("kv", start - 1, endpoint=cluster.endpoint(leader))
        got = client.read_log("kv", start, endpoint=cluster.endpoint(leader))
        assert got.log_start == start and got.start_offset == start and got.next_offset > start
    source = ClusterSource(tuple(cluster.endpoints), WAIT_S, ("kv",)).prepared()
    with pytest.raises(ExportError, match="compacted before they were exported"):
        for _ in source.read("kv", min(starts.values()) - 1, max(starts.values()) + 1):
            pass
