"""A watch sees the writes made inside a transaction: a Txn record's key names its first operation only
(`txn/<first op key>`), yet a watch on a prefix delivers every transaction that writes a key under it,
once per record, with `applied` false when its conditions failed, and none that writes no key under it.

Three real `epochlog serve` processes; the watch is served by a follower (its own views give the flags)
and by the leader.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from epochlog.client import AsyncClient, Client, RejectedError, WatchedEvent
from statemachines import events as ev
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import NodeCluster

WAIT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("watch-txn"))


def watched(endpoint: str, prefix: str, first: int, last: int) -> list[WatchedEvent]:
    """The events of a watch of kv `prefix` from `first` through `last`, served by `endpoint`."""
    async def collect() -> list[WatchedEvent]:
        out: list[WatchedEvent] = []
        async with AsyncClient([endpoint], timeout=WAIT_S) as c:
            stream = c.watch(prefix, from_offset=first)
            try:
                async with asyncio.timeout(WAIT_S):
                    async for e in stream:
                        out.append(e)
                        if e.offset >= last:
                            return out
            finally:
                await stream.aclose()
        raise AssertionError("the watch ended")
    return asyncio.run(collect())


def test_a_watch_delivers_every_transaction_that_writes_under_its_prefix(cluster: NodeCluster) -> None:
    mine, other = f"wt-{uuid.uuid4().hex[:8]}/", f"wto-{uuid.uuid4().hex[:8]}/"
    with Client(cluster.endpoints, timeout=WAIT_S) as client:
        first = client.put(mine + "start", b"0").offset
        # First op under the other prefix: its record key is txn/kv/<other>/a.
        across = client.txn([ev.KvPut(name=other + "a", value=b"1"), ev.KvPut(name=mine + "b", value=b"1")]).offset
        # Two ops under this prefix: still one event.
        both = client.txn([ev.KvPut(name=mine + "c", value=b"2"), ev.KvDeleted(name=mine + "start")]).offset
        with pytest.raises(RejectedError) as failed:   # c exists: the condition "must not exist" fails
            client.txn([ev.KvPut(name=mine + "d", value=b"3")], conditions=[(mine + "c", 0)])
        elsewhere = client.txn([ev.KvPut(name=other + "x", value=b"4")]).offset
        last = client.put(mine + "end", b"5").offset
        assert client.get(mine + "d", min_offset=last) is None and client.get(mine + "start") is None

    expected = [(first, True), (across, True), (both, True), (failed.value.offset, False), (last, True)]
    leader = cluster.leader("kv")
    for node in (cluster.followers("kv")[0], leader):
        events = watched(cluster.endpoint(node), mine, first, last)
        assert [(e.offset, e.applied) for e in events] == expected, (node, events)
        assert all(isinstance(e.event, ev.Txn) for e in events[1:4]), events
        assert events[1].key == f"txn/kv/{other}a", events[1]   # the record's own key, as events tail shows it
    # The other prefix sees the transactions writing under it, and not the two that do not.
    theirs = watched(cluster.endpoint(leader), other, across, elsewhere)
    assert [(e.offset, e.applied) for e in theirs] == [(across, True), (elsewhere, True)], theirs
