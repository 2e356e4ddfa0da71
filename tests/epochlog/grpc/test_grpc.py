"""The gRPC face against a real 3-node cluster (`epochlog serve` processes, uvloop, RunningNode).

Calls go through the generated stubs, as any gRPC client's would: kv reads and writes, transactions,
commands in their three forms, batches, leases, watch streams, cluster calls, the Session stream
with many calls per message, and the mapping of errors to statuses and metadata.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import grpc
import msgspec
import pytest

from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from epochlog.api import messages as p
from epochlog.client import Client
from statemachines import events as ev
from tests.epochlog.grpc.conftest import GrpcNodes
from tests.support.wait import wait_until

T = 10.0  # per-call deadline (seconds)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def rpc_error(call, *args, **kwargs) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value  # type: ignore[return-value]


def metadata(error: grpc.RpcError) -> dict[str, str]:
    return {m.key: m.value for m in error.trailing_metadata()}  # type: ignore[attr-defined]


# --- kv -------------------------------------------------------------------------------------------

def test_put_get_list_history_delete(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    d = unique("dir")
    offsets = [s.Put(pb.PutRequest(name=f"{d}/k{i:02d}", value=b"v%d" % i), timeout=T).offset
               for i in range(12)]
    assert offsets == sorted(offsets) and len(set(offsets)) == 12

    got = s.Get(pb.GetRequest(key=f"{d}/k03", json=True), timeout=T)
    assert got.item.kv.value == b"v3" and got.item.version == offsets[3] and got.applied >= offsets[-1]
    assert json.loads(got.item.state_json)["name"] == f"{d}/k03"
    assert not s.Get(pb.GetRequest(key=f"{d}/missing"), timeout=T).HasField("item")

    # Pages of 5 with the continuation token, then a range.
    names, after = [], None
    while True:
        req = pb.ListRequest(prefix=f"{d}/", limit=5)
        if after is not None:
            req.after = after
        page = s.List(req, timeout=T)
        names += [i.kv.name for i in page.items]
        if not page.HasField("next_after"):
            break
        after = page.next_after
    assert names == [f"{d}/k{i:02d}" for i in range(12)]
    ranged = s.List(pb.ListRequest(start=f"{d}/k02", end=f"{d}/k05"), timeout=T)
    assert [i.kv.name for i in ranged.items] == [f"{d}/k02", f"{d}/k03", f"{d}/k04"]

    second = s.Put(pb.PutRequest(name=f"{d}/k00", value=b"again"), timeout=T)
    deleted = s.Delete(pb.DeleteRequest(name=f"{d}/k00"), timeout=T)
    history = s.History(pb.HistoryRequest(key=f"{d}/k00"), timeout=T)
    assert [(r.offset, r.event, r.deleted) for r in history.rows] == [
        (offsets[0], "KvPut", False), (second.offset, "KvPut", False), (deleted.offset, "KvDeleted", True)]
    assert history.rows[1].kv.value == b"again"

    # MVCC and read-your-writes on a follower.
    old = s.Get(pb.GetRequest(key=f"{d}/k00", as_of=offsets[0]), timeout=T)
    assert old.item.kv.value == b"v0"
    follower = cluster3.stub(cluster3.follower("kv"))
    mine = follower.Get(pb.GetRequest(key=f"{d}/k11", consistency=pb.LOCAL, min_offset=offsets[-1]),
                        timeout=T)
    assert mine.item.kv.value == b"v11"


def test_compare_and_set_and_txn(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    name = unique("cas")
    first = s.Put(pb.PutRequest(name=name, value=b"1", expected_version=0), timeout=T)
    stale = pb.PutRequest(name=name, value=b"2", expected_version=first.offset + 1000)
    err = rpc_error(s.Put, stale, timeout=T)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    md = metadata(err)
    assert md["epochlog-code"] == "rejected" and md["epochlog-reason"] == "version_mismatch"
    assert int(md["epochlog-offset"]) > first.offset            # committed, changed nothing
    assert f"at version {first.offset}" in err.details()
    assert s.Get(pb.GetRequest(key=f"{name}"), timeout=T).item.kv.value == b"1"

    other = unique("cas")
    ok = s.Txn(pb.TxnRequest(
        conditions=[pb.Condition(key=f"{name}", version=first.offset),
                    pb.Condition(key=f"{other}", version=0)],
        ops=[pb.TxnOp(put=pb.PutRequest(name=name, value=b"t")),
             pb.TxnOp(put=pb.PutRequest(name=other, value=b"o"))]),
        timeout=T)
    assert ok.ok and ok.group == "kv"
    failed = rpc_error(s.Txn, pb.TxnRequest(
        conditions=[pb.Condition(key=f"{name}", version=first.offset)],
        ops=[pb.TxnOp(delete=pb.DeleteRequest(name=other))]), timeout=T)
    assert failed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert metadata(failed)["epochlog-reason"] == "condition_failed"
    assert s.Get(pb.GetRequest(key=f"{other}"), timeout=T).item.kv.value == b"o"   # all or nothing


def test_invalid_arguments(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    cases = [
        (s.Get, pb.GetRequest(key="kv/x")),
        (s.Get, pb.GetRequest(key="x", consistency=7)),
        (s.Put, pb.PutRequest(name="", value=b"x")),
        (s.Put, pb.PutRequest(name="x" * 2000, value=b"x")),
        (s.List, pb.ListRequest(prefix="app/", limit=20000)),
        (s.Txn, pb.TxnRequest(ops=[pb.TxnOp()])),
        (s.Batch, pb.BatchRequest()),
        (s.Command, pb.CommandRequest()),
        (s.Command, pb.CommandRequest(event_json='{"type": "NoSuchEvent"}')),
        (s.Command, pb.CommandRequest(type="TopicDeleted", topic_created=pb.TopicCreated(name="t"))),
        (s.Command, pb.CommandRequest(topic_created=pb.TopicCreated(name="bad name!"))),
        (s.ReadEvents, pb.ReadEventsRequest(group="nosuchgroup")),
    ]
    for method, request in cases:
        err = rpc_error(method, request, timeout=T)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, err)
        assert metadata(err)["epochlog-code"] == "invalid_argument" and err.details()
    err = rpc_error(s.Get, pb.GetRequest(key="kv/x"), timeout=T)
    assert "kv keys are written without kv/, e.g. 'x'" in err.details()


def test_follower_write_names_the_leader(cluster3: GrpcNodes) -> None:
    leader = cluster3.leader("kv")
    follower = cluster3.follower("kv")
    err = rpc_error(cluster3.stub(follower).Put, pb.PutRequest(name=unique("f"), value=b"x"), timeout=T)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    md = metadata(err)
    assert md["epochlog-leader"] == cluster3.grpc[leader] and md["epochlog-leader-id"] == str(leader)
    assert md["epochlog-retriable"] == "true"
    assert cluster3.grpc[leader] in err.details()
    # A linearizable read on a follower says the same; a local one is served there.
    err = rpc_error(cluster3.stub(follower).Get, pb.GetRequest(key="x"), timeout=T)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert metadata(err)["epochlog-leader"] == cluster3.grpc[leader]


def test_deadline_exceeded(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    far = 1 << 40     # an offset the group will not reach
    started = time.monotonic()
    err = rpc_error(s.Get, pb.GetRequest(key="x", consistency=pb.LOCAL, min_offset=far), timeout=0.3)
    elapsed = time.monotonic() - started
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.25 <= elapsed < 2.0, elapsed

    # The server honours the deadline itself too: a Session call with timeout_ms gets the status.
    async def session() -> pb.SessionReply:
        async with grpc.aio.insecure_channel(cluster3.grpc[cluster3.leader("kv")]) as channel:
            stream = pb_grpc.EpochlogStub(channel).Session(timeout=T)
            await stream.write(pb.SessionRequest(calls=[pb.SessionCall(
                id=7, timeout_ms=200, get=pb.GetRequest(key="x", consistency=pb.LOCAL, min_offset=far))]))
            response = await stream.read()
            await stream.done_writing()
            return response.replies[0]

    started = time.monotonic()
    reply = asyncio.run(session())
    assert reply.id == 7 and reply.error.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert reply.error.code == "deadline_exceeded" and f"not yet {far}" in reply.error.message
    assert time.monotonic() - started < 3.0


def test_message_size_limit(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    err = rpc_error(s.Put, pb.PutRequest(name=unique("big"), value=b"x" * (17 << 20)), timeout=T)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    err = rpc_error(s.Put, pb.PutRequest(name=unique("big"), value=b"x" * (2 << 20)), timeout=T)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds" in err.details()   # the event's limit


# --- commands, batches, leases --------------------------------------------------------------------

def test_commands_in_three_forms(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("metadata"))
    topic = unique("orders")
    created = s.Command(pb.CommandRequest(type="TopicCreated", topic_created=pb.TopicCreated(
        name=topic, read_queues=4, broker_groups=["broker-a"], config={"retention": "7d"})), timeout=T)
    assert created.group == "metadata"
    state = json.loads(s.Get(pb.GetRequest(key=f"topic/{topic}", json=True), timeout=T).item.state_json)
    assert (state["read_queues"], state["write_queues"], state["broker_groups"], state["config"]) == (
        4, 8, ["broker-a"], {"retention": "7d"})
    again = rpc_error(s.Command, pb.CommandRequest(topic_created=pb.TopicCreated(name=topic)), timeout=T)
    assert again.code() == grpc.StatusCode.ALREADY_EXISTS
    assert metadata(again)["epochlog-reason"] == "already_exists"

    # Absent optional fields keep their values; set_config replaces the map (here: empties it).
    update = pb.TopicUpdated(name=topic, perm=4, set_config=True)
    s.Command(pb.CommandRequest(topic_updated=update), timeout=T)
    item = s.Get(pb.GetRequest(key=f"topic/{topic}"), timeout=T).item
    state = msgspec.msgpack.decode(item.state_msgpack)
    assert (state["perm"], state["read_queues"], state["broker_groups"], state["config"]) == (
        4, 4, ["broker-a"], {})

    broker = unique("b")
    s.Command(pb.CommandRequest(event_json=json.dumps({
        "type": "BrokerRegistered", "cluster": "c1", "group": "broker-a", "name": broker,
        "address": "10.0.0.1:10911", "incarnation": "i1", "broker_id": 0, "broker_epoch": 1})), timeout=T)
    fenced = s.Command(pb.CommandRequest(event_msgpack=ev.encode_event(ev.BrokerFenced(
        cluster="c1", group="broker-a", name=broker, broker_epoch=1, reason="test"))), timeout=T)
    stale = rpc_error(s.Command, pb.CommandRequest(broker_unfenced=pb.BrokerUnfenced(
        cluster="c1", group="broker-a", name=broker, broker_epoch=9)), timeout=T)
    assert stale.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert metadata(stale)["epochlog-reason"] == "stale_epoch"
    got = s.Get(pb.GetRequest(key=f"broker/c1/broker-a/{broker}", json=True), timeout=T)
    assert json.loads(got.item.state_json)["fenced"] is True and got.item.version == fenced.offset


def test_batch(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    d = unique("batch")
    response = s.Batch(pb.BatchRequest(ops=[
        pb.BatchOp(put=pb.PutRequest(name=f"{d}/a", value=b"1")),
        pb.BatchOp(put=pb.PutRequest(name=f"{d}/b", value=b"2", expected_version=5)),   # not at 5: rejected
        pb.BatchOp(get=pb.GetRequest(key=f"{d}/a")),
        pb.BatchOp(txn=pb.TxnRequest(ops=[pb.TxnOp(put=pb.PutRequest(name=f"{d}/c", value=b"3"))])),
        pb.BatchOp(get=pb.GetRequest(key=f"{d}/b")),
    ]), timeout=T)
    r = response.results
    assert [x.WhichOneof("result") for x in r] == ["write", "write", "get", "write", "get"]
    assert r[0].write.ok and not r[1].write.ok and r[1].write.code == "version_mismatch" and r[3].write.ok
    assert r[0].write.offset < r[1].write.offset < r[3].write.offset
    assert r[2].get.item.kv.value == b"1"          # the reads see the batch's writes
    assert not r[4].get.HasField("item")


def test_leases(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("kv"))
    lease = s.LeaseGrant(pb.LeaseGrantRequest(ttl_ms=60_000), timeout=T)
    assert lease.lease_id > 0 and lease.ttl_ms == 60_000 and lease.offset >= 0
    name = unique("leased")
    s.Put(pb.PutRequest(name=name, value=b"x", lease=lease.lease_id), timeout=T)
    assert s.Get(pb.GetRequest(key=f"{name}"), timeout=T).item.kv.lease == lease.lease_id
    kept = s.LeaseKeepAlive(pb.LeaseKeepAliveRequest(lease_id=lease.lease_id), timeout=T)
    assert kept.ttl_ms == 60_000 and kept.offset == -1
    s.LeaseRevoke(pb.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=T)
    assert not s.Get(pb.GetRequest(key=f"{name}"), timeout=T).HasField("item")   # deleted with its lease
    gone = rpc_error(s.LeaseKeepAlive, pb.LeaseKeepAliveRequest(lease_id=lease.lease_id), timeout=T)
    assert gone.code() == grpc.StatusCode.NOT_FOUND and metadata(gone)["epochlog-code"] == "not_found"
    again = rpc_error(s.LeaseRevoke, pb.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=T)
    assert again.code() == grpc.StatusCode.NOT_FOUND and metadata(again)["epochlog-reason"] == "not_found"


# --- streams and events ---------------------------------------------------------------------------

def test_watch_stream(cluster3: GrpcNodes) -> None:
    leader = cluster3.leader("kv")
    s = cluster3.stub(leader)
    d = unique("watch")
    first = s.Put(pb.PutRequest(name=f"{d}/0", value=b"0"), timeout=T)
    s.Put(pb.PutRequest(name=unique("elsewhere"), value=b"-"), timeout=T)
    # Watch on a follower from the first write's offset: history first, then live events.
    stream = cluster3.stub(cluster3.follower("kv")).Watch(
        pb.WatchRequest(prefix=f"{d}/", from_offset=first.offset, json=True), timeout=30)
    head = next(stream)
    assert head.started.group == "kv" and head.started.from_offset == first.offset
    for i in range(1, 50):
        s.Put(pb.PutRequest(name=f"{d}/{i}", value=b"%d" % i), timeout=T)
    s.Delete(pb.DeleteRequest(name=f"{d}/0"), timeout=T)
    seen: list[pb.Event] = []
    messages = 0
    while len(seen) < 51:
        response = next(stream)
        messages += 1
        seen += response.events.events
    stream.cancel()
    assert [e.key for e in seen[:50]] == [f"{d}/{i}" for i in range(50)]
    assert [e.type for e in seen] == ["KvPut"] * 50 + ["KvDeleted"]
    offsets = [e.offset for e in seen]
    assert offsets == sorted(offsets) and offsets[0] == first.offset
    decoded = ev.decode_event(seen[7].event_msgpack)
    assert isinstance(decoded, ev.KvPut) and decoded.value == b"7"
    assert json.loads(seen[7].event_json)["name"] == f"{d}/7" and seen[7].timestamp > 0


def test_read_events_and_compaction(cluster3: GrpcNodes) -> None:
    s = cluster3.stub(cluster3.leader("offsets"))
    group = unique("cg")
    for b in range(6):      # ~400 KiB of events: the group's log rolls past its first 256 KiB segment
        commits = [pb.OffsetCommitted(consumer_group=group, topic="t", queue_id=i % 4, offset=b * 500 + i)
                   for i in range(500)]
        ops = [pb.BatchOp(command=pb.CommandRequest(offset_committed=c)) for c in commits]
        s.Batch(pb.BatchRequest(ops=ops), timeout=T)
    page = s.ReadEvents(pb.ReadEventsRequest(group="offsets", from_offset=0, max_events=7), timeout=T)
    assert len(page.events) == 7 and page.next_offset == page.events[-1].offset + 1
    assert {e.type for e in page.events} - {"ViewsFormatRaised"} == {"OffsetCommitted"}   # the group's raise aside
    assert page.commit_offset >= 2999

    snapshot = s.Snapshot(pb.SnapshotRequest(group="offsets"), timeout=T)
    assert snapshot.offset >= 2999
    status = s.Status(pb.StatusRequest(), timeout=T)
    log_start = next(g.log_start for g in status.groups if g.group == "offsets")
    assert log_start > 0, "the snapshot did not cut the log"
    err = rpc_error(s.ReadEvents, pb.ReadEventsRequest(group="offsets", from_offset=0), timeout=T)
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE and "resync from the snapshot" in err.details()
    stream = s.Watch(pb.WatchRequest(prefix="offset/", from_offset=0), timeout=T)
    err = rpc_error(next, stream)
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE and metadata(err)["epochlog-code"] == "compacted"
    after = s.ReadEvents(pb.ReadEventsRequest(group="offsets", from_offset=log_start, max_events=3),
                         timeout=T)
    assert after.log_start == log_start and after.events[0].offset >= log_start


def test_status_members_and_admin_calls(cluster3: GrpcNodes) -> None:
    for i in range(1, 4):
        status = cluster3.stub(i).Status(pb.StatusRequest(), timeout=T)
        assert status.cluster == "grpc-test" and status.node == i
        assert sorted(g.group for g in status.groups) == ["kv", "metadata", "offsets"]
        assert {m.id: m.grpc_address for m in status.members} == cluster3.grpc
    leader = cluster3.leader("metadata")
    members = cluster3.stub(leader).MemberList(pb.MemberListRequest(), timeout=T)
    assert sorted(members.voters) == [1, 2, 3] and not members.learners
    err = rpc_error(cluster3.stub(cluster3.follower("metadata")).TransferLeader,
                    pb.TransferLeaderRequest(group="metadata"), timeout=T)
    assert err.code() == grpc.StatusCode.UNAVAILABLE


def test_compaction_status_matches_the_native_call(cluster3: GrpcNodes) -> None:
    def stable(status: p.CompactionInfo) -> list[tuple[object, ...]]:
        # The fields compared: the background (snapshots, the pruner raising a history floor after the
        # module's earlier writes, the cleaner) may move any of them between two calls.
        return [(g.group, g.role, g.log_start, g.snapshot_offset, g.history_floor, g.horizon_bound,
                 g.clean_end_offset, g.clean_below, g.last_clean is not None) for g in status.groups]

    for i in range(1, 4):
        with Client([cluster3.client[i]], timeout=T) as client:
            def both_calls_agree() -> tuple[p.CompactionInfo, pb.CompactionStatusResponse] | None:
                """A gRPC status between two native ones that did not move: then it must equal them."""
                before = client.compaction_status(endpoint=cluster3.client[i])
                got = cluster3.stub(i).CompactionStatus(pb.CompactionStatusRequest(), timeout=T)
                after = client.compaction_status(endpoint=cluster3.client[i])
                if stable(before) != stable(after):
                    return None   # something moved meanwhile: ask again
                grpc_fields = [(g.group, g.role, g.log_start, g.snapshot_offset, g.history_floor, g.horizon_bound,
                                g.clean_end_offset, g.clean_below, g.HasField("last_clean")) for g in got.groups]
                assert grpc_fields == stable(after), i
                return after, got

            native, got = wait_until(both_calls_agree, 30.0, f"node {i}'s compaction status to hold still")
        assert got.node == i == native.node
        assert {g.group: g.cleanup_policy for g in got.groups} == {
            "metadata": "compact", "offsets": "delete", "kv": "compact"}


# --- the Session stream ---------------------------------------------------------------------------

def test_session_many_calls_per_message(cluster3: GrpcNodes) -> None:
    address = cluster3.grpc[cluster3.leader("kv")]
    d = unique("session")
    n, per_message = 2000, 500

    async def run() -> tuple[dict[int, pb.SessionReply], int, float]:
        async with grpc.aio.insecure_channel(address) as channel:
            stream = pb_grpc.EpochlogStub(channel).Session(timeout=30)
            started = time.perf_counter()
            for base in range(0, n, per_message):
                await stream.write(pb.SessionRequest(calls=[
                    pb.SessionCall(id=i, put=pb.PutRequest(name=f"{d}/{i:05d}", value=b"%d" % i))
                    for i in range(base, base + per_message)]))
            # Reads, an invalid call and a status in one message, after the writes were sent.
            await stream.write(pb.SessionRequest(calls=[
                pb.SessionCall(id=n, get=pb.GetRequest(key=f"{d}/00042", min_offset=0)),
                pb.SessionCall(id=n + 1, get=pb.GetRequest(key="kv/nokind")),
                pb.SessionCall(id=n + 2, status=pb.StatusRequest()),
                pb.SessionCall(id=n + 3, list=pb.ListRequest(prefix=f"{d}/", limit=3)),
                pb.SessionCall(id=n + 4),
            ]))
            await stream.done_writing()
            replies: dict[int, pb.SessionReply] = {}
            messages = 0
            async for response in stream:
                messages += 1
                for reply in response.replies:
                    assert reply.id not in replies
                    replies[reply.id] = reply
            return replies, messages, time.perf_counter() - started

    replies, messages, elapsed = asyncio.run(run())
    print(f"session: {n} puts + 5 calls in {elapsed:.2f}s ({n / elapsed:.0f} calls/s), "
          f"{messages} response messages")
    assert set(replies) == set(range(n + 5))
    puts = [replies[i].write for i in range(n)]
    assert all(w.ok for w in puts) and len({w.offset for w in puts}) == n
    assert messages < n / 2          # replies were coalesced
    get = replies[n].get
    assert get.item.kv.value == b"42" or not get.HasField("item")   # sent before its put may have applied
    assert replies[n + 1].error.status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies[n + 1].error.code == "invalid_argument"
    assert replies[n + 2].status.node == cluster3.leader("kv")
    assert len(replies[n + 3].list.items) == 3
    assert replies[n + 4].error.code == "invalid_argument"


def test_session_errors_name_the_leader(cluster3: GrpcNodes) -> None:
    leader = cluster3.leader("kv")
    address = cluster3.grpc[cluster3.follower("kv")]

    async def run() -> list[pb.SessionReply]:
        async with grpc.aio.insecure_channel(address) as channel:
            stream = pb_grpc.EpochlogStub(channel).Session(timeout=T)
            await stream.write(pb.SessionRequest(calls=[
                pb.SessionCall(id=1, put=pb.PutRequest(name=unique("s"), value=b"x")),
                pb.SessionCall(id=2, get=pb.GetRequest(key="x", consistency=pb.LOCAL))]))
            await stream.done_writing()
            return [r async for m in stream for r in m.replies]

    replies = {r.id: r for r in asyncio.run(run())}
    error = replies[1].error
    assert error.status == grpc.StatusCode.UNAVAILABLE.value[0]
    assert error.code == "not_leader" and error.retriable
    assert error.leader == leader and error.leader_address == cluster3.grpc[leader]
    assert replies[2].WhichOneof("result") == "get"
