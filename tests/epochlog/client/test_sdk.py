"""The Python SDK (blocking and asyncio) against three real `epochlog serve` processes.

These tests share one cluster (tests/epochlog/conftest.py: `shared_cluster`) and never stop a node;
each uses keys under a prefix of its own. Failover lives in test_failover.py.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from epochlog.client import AsyncClient, Client, NotFoundError, RejectedError, WatchedEvent
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.support.wait import eventually, wait_until

WAIT_S = 10.0


class WatchReader:
    """Reads `n` events of a blocking watch on a daemon thread, so the test can wait with a timeout;
    the thread closes the watch itself after the n-th event."""

    def __init__(self, events: Iterator[WatchedEvent], n: int) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()

        def run() -> None:
            try:
                for i, event in enumerate(events, 1):
                    self.queue.put(event)
                    if i == n:
                        break
            except BaseException as exc:
                self.queue.put(exc)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def take(self, timeout: float = WAIT_S) -> WatchedEvent:
        item = self.queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item


@pytest.fixture
def client(shared_cluster: NodeCluster) -> Iterator[Client]:
    with Client(shared_cluster.endpoints, timeout=WAIT_S) as c:
        yield c


def test_writes_and_reads_at_every_consistency_level(client: Client, shared_cluster: NodeCluster) -> None:
    offsets = [client.put(f"levels/k{i}", b"v%d" % i).offset for i in range(5)]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5, offsets
    for consistency in ("linearizable", "lease", "local"):
        for i, offset in enumerate(offsets):
            kv = client.get(f"levels/k{i}", consistency=consistency, min_offset=offsets[-1])
            assert kv is not None, (consistency, i)
            assert (kv.name, kv.value, kv.version, kv.created) == (f"levels/k{i}", b"v%d" % i, offset, offset)
    page = client.list("levels/", limit=3)
    assert [kv.name for kv in page.items] == ["levels/k0", "levels/k1", "levels/k2"]
    assert page.next_after == "levels/k2" and page.applied >= offsets[-1]
    rest = client.list("levels/", limit=3, after=page.next_after)
    assert [kv.name for kv in rest.items] == ["levels/k3", "levels/k4"] and rest.next_after is None
    assert client.get("levels/missing") is None
    written = client.delete("levels/k0")
    assert written.ok and written.offset > offsets[-1]
    assert client.get("levels/k0") is None


def test_local_reads_on_a_follower_see_the_write_they_wait_for(client: Client, shared_cluster: NodeCluster) -> None:
    followers = shared_cluster.followers("kv")
    with Client([shared_cluster.endpoint(followers[0])], timeout=WAIT_S) as on_follower:
        for i in range(30):
            offset = client.put("ryw/counter", str(i).encode()).offset
            kv = on_follower.get("ryw/counter", consistency="local", min_offset=offset)
            assert kv is not None and kv.value == str(i).encode() and kv.version == offset, (i, kv)


def test_as_of_and_history(client: Client) -> None:
    o1 = client.put("asof/k", b"one").offset
    o2 = client.put("asof/k", b"two").offset
    o3 = client.delete("asof/k").offset
    assert o1 < o2 < o3
    got = [client.get("asof/k", as_of=o) for o in (o1, o2, o3)]
    assert [None if kv is None else (kv.value, kv.version) for kv in got] == [(b"one", o1), (b"two", o2), None]
    assert client.get("asof/k", as_of=o1 - 1) is None
    assert [kv.name for kv in client.list("asof/", as_of=o2).items] == ["asof/k"]
    assert client.list("asof/").items == []
    history = client.history("asof/k")
    assert [(c.offset, c.event) for c in history] == [(o1, "KvPut"), (o2, "KvPut"), (o3, "KvDeleted")]
    assert [None if c.state is None else c.state.value for c in history] == [b"one", b"two", None]  # type: ignore[attr-defined]
    assert [c.offset for c in client.history("asof/k", after_offset=o1)] == [o2, o3]


def test_compare_and_set_rejections_change_nothing(client: Client) -> None:
    o1 = client.put("cas/k", b"1", expected_version=0).offset
    with pytest.raises(RejectedError) as exists:
        client.put("cas/k", b"again", expected_version=0)
    o2 = client.put("cas/k", b"2", expected_version=o1).offset
    with pytest.raises(RejectedError) as stale:
        client.put("cas/k", b"3", expected_version=o1)
    with pytest.raises(RejectedError) as stale_delete:
        client.delete("cas/k", expected_version=o1)
    assert stale.value.reason == "version_mismatch", stale.value
    assert stale_delete.value.reason == "version_mismatch", stale_delete.value
    assert exists.value.reason in ("already_exists", "version_mismatch"), exists.value
    assert o1 < exists.value.offset < o2 < stale.value.offset < stale_delete.value.offset
    kv = client.get("cas/k")
    assert kv is not None and (kv.value, kv.version) == (b"2", o2)
    assert [c.offset for c in client.history("cas/k")] == [o1, o2]
    assert client.delete("cas/k", expected_version=o2).ok


def test_watch_from_an_offset_then_live_writes(client: Client) -> None:
    first = client.put("watch/a", b"1")
    reader = WatchReader(client.watch("watch/", from_offset=first.offset), 3)
    replayed = reader.take()
    assert (replayed.offset, replayed.key) == (first.offset, "watch/a")
    assert isinstance(replayed.event, ev.KvPut) and replayed.event.value == b"1"
    client.put("elsewhere/x", b"not watched")
    second = client.put("watch/b", b"2")
    third = client.delete("watch/a")
    live = [reader.take(), reader.take()]
    assert [(e.offset, e.key) for e in live] == [(second.offset, "watch/b"), (third.offset, "watch/a")]
    assert isinstance(live[0].event, ev.KvPut) and live[0].event.value == b"2"
    assert isinstance(live[1].event, ev.KvDeleted)
    reader.thread.join(WAIT_S)
    assert not reader.thread.is_alive()


def test_a_lease_keeps_its_keys_while_kept_alive_and_expiry_deletes_them(client: Client) -> None:
    lease = client.lease_grant(600)
    put = client.put("leased/k", b"v", lease=lease.lease_id)
    kv = client.get("leased/k")
    assert kv is not None and kv.lease == lease.lease_id
    until = time.monotonic() + 1.5          # 2.5 TTLs, kept alive
    while True:
        last_sent = time.monotonic()
        assert client.lease_keepalive(lease.lease_id) == 600
        if last_sent > until:
            break
        time.sleep(0.15)
    assert client.get("leased/k") is not None
    wait_until(lambda: client.get("leased/k") is None, WAIT_S, "the leased key to expire")
    took = time.monotonic() - last_sent
    print(f"leased key gone {took:.2f}s after the last keepalive was sent (TTL 0.6s)")
    # The leader restarts the clock when the keepalive arrives, after we sent it (same monotonic clock).
    assert took >= 0.6, "the key went away before its lease could have expired"
    history = client.history("leased/k")
    assert history[0].offset == put.offset and history[-1].state is None
    with pytest.raises(NotFoundError):
        client.lease_keepalive(lease.lease_id)


def test_a_client_knowing_only_a_follower_writes_and_reads_through_the_leader(shared_cluster: NodeCluster) -> None:
    leader = shared_cluster.leader("kv")
    follower = next(i for i in shared_cluster.running() if i != leader)
    with Client([shared_cluster.endpoint(follower)], timeout=WAIT_S) as c:
        written = c.put("redirect/k", b"v")
        assert written.ok
        for consistency in ("linearizable", "lease"):
            kv = c.get("redirect/k", consistency=consistency)
            assert kv is not None and kv.version == written.offset
        assert c.history("redirect/k")[0].offset == written.offset
        # It got there by following the not_leader reply's leader address.
        assert c.aio._leaders.get("kv") == shared_cluster.endpoint(leader)


def test_asyncio_client_concurrent_writes_scan_and_watch(shared_cluster: NodeCluster) -> None:
    async def main() -> None:
        async with AsyncClient(shared_cluster.endpoints, timeout=WAIT_S) as c:
            results = await asyncio.gather(*(c.put(f"aio/{i:03d}", b"%d" % i) for i in range(200)))
            offsets = [r.offset for r in results]
            assert len(set(offsets)) == 200 and all(r.ok and r.group == "kv" for r in results)
            names = [kv.name async for kv in c.scan("aio/", page_size=64)]
            assert names == [f"aio/{i:03d}" for i in range(200)]
            got = await c.get_many([f"aio/{i:03d}" for i in (0, 199)], consistency="lease")
            assert [e.version for e in got if e is not None] == [offsets[0], offsets[199]]

            seen: list[tuple[int, str]] = []
            stream = c.watch("aio/", from_offset=min(offsets))

            async def consume() -> None:
                async for event in stream:
                    seen.append((event.offset, event.key))
                    if len(seen) == 201:
                        return
            consumer = asyncio.ensure_future(consume())
            try:
                await eventually(lambda: len(seen) == 200, WAIT_S, "the replay of 200 events", interval=0.01)
                late = await c.put("aio/late", b"x")   # delivered after the replay, live
                await asyncio.wait_for(consumer, WAIT_S)
            finally:
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
                await stream.aclose()
            expected = sorted(zip(offsets, (f"aio/{i:03d}" for i in range(200)))) + [(late.offset, "aio/late")]
            assert seen == expected
    asyncio.run(asyncio.wait_for(main(), 60))

