"""What `Node.write` promises about a write of many events, seen through the native protocol: every event is
checked before anything is appended (one bad event, wherever it is, and the write appends nothing, refused
with the error of the first bad one), and the results come back in the caller's order with each event's
group and offset, also when the events are in several groups.

One real `epochlog serve` process (a one-member cluster: it leads every group, so one Write may name
several); the raw `Write` is sent with the SDK's `_call_on` (the SDK's `commands` splits by group).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from epochlog.api import messages as p
from epochlog.client import AsyncClient, ClientError
from statemachines import events as ev
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import NodeCluster

WAIT_S = 30.0


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    """One member, so it leads every group and one Write may name several."""
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("write-checks"), size=1)


async def _write(cluster: NodeCluster, events: list[ev.Event]) -> list[p.WriteResult]:
    client = AsyncClient(cluster.endpoints, timeout=WAIT_S)
    try:
        result = await client._call_on(cluster.endpoints[0], p.Write(events))
        assert isinstance(result, p.Written), result
        return result.results
    finally:
        await client.close()


async def _value(cluster: NodeCluster, name: str) -> bytes | None:
    client = AsyncClient(cluster.endpoints, timeout=WAIT_S)
    try:
        kv = await client.get(name)
        return None if kv is None else kv.value
    finally:
        await client.close()


def test_results_of_a_write_across_groups_come_in_the_callers_order(single: NodeCluster) -> None:
    events: list[ev.Event] = [
        ev.KvPut(name="order/a", value=b"1"),
        ev.ConfigChanged(scope="order", name="x", value="on"),
        ev.KvPut(name="order/b", value=b"2"),
        ev.OffsetCommitted(consumer_group="order-g", topic="order-t", queue_id=0, offset=7),
        ev.KvPut(name="order/c", value=b"3"),
    ]
    results = asyncio.run(_write(single, events))
    assert [r.group for r in results] == ["kv", "metadata", "kv", "offsets", "kv"], results
    assert all(r.ok for r in results), results
    kv = [r.offset for r in results if r.group == "kv"]
    assert kv == [kv[0], kv[0] + 1, kv[0] + 2], results   # one group's events commit together, in order
    assert asyncio.run(_value(single, "order/c")) == b"3"


@pytest.mark.parametrize("bad, code, says", [
    (ev.MemberAdded(node_id=9, peer_address="127.0.0.1:1"), "invalid_argument", "member_add and member_remove"),
    (ev.KvPut(name="kv/twice", value=b"x"), "invalid_argument", "kv keys are written without kv/"),
    (ev.KvPut(name="ok", value=b"x", request_id="not-a-uuid7"), "invalid_argument", "no UUIDv7"),
])
def test_one_bad_event_anywhere_and_nothing_is_appended(single: NodeCluster, bad: ev.Event, code: str,
                                                        says: str) -> None:
    name = f"nothing/{says.split()[0]}"
    events: list[ev.Event] = [ev.KvPut(name=f"{name}/{i}", value=b"v") for i in range(150)]
    events.insert(140, bad)   # past the first group's events, in the middle of the write
    with pytest.raises(ClientError) as info:
        asyncio.run(_write(single, events))
    assert info.value.code == code and says in str(info.value), info.value
    assert asyncio.run(_value(single, f"{name}/0")) is None


@pytest.mark.parametrize("bad_at, code", [(50, "invalid_argument"), (200, "batch_too_large"), (270, "batch_too_large")])
def test_the_first_refusal_in_the_callers_order_is_the_one_raised(single: NodeCluster, bad_at: int, code: str) -> None:
    """300 puts of 8 KiB outgrow the kv batch limit (1 MiB) near event 127, and one put is invalid: the write is
    refused for whichever comes first, also when the invalid one is in the first slice the leader checks in
    one call (256 events) or past it, and nothing is appended."""
    name = f"first-refusal/{bad_at}"
    events: list[ev.Event] = [ev.KvPut(name=f"{name}/{i}", value=bytes(8 << 10)) for i in range(300)]
    events[bad_at] = ev.KvPut(name="", value=b"x")
    with pytest.raises(ClientError) as info:
        asyncio.run(_write(single, events))
    assert info.value.code == code, info.value
    assert asyncio.run(_value(single, f"{name}/0")) is None


def test_a_bad_event_past_the_first_slice_refuses_the_write(single: NodeCluster) -> None:
    events: list[ev.Event] = [ev.KvPut(name=f"second-slice/{i}", value=b"v") for i in range(300)]
    events[270] = ev.KvPut(name="second-slice/x", value=b"x", request_id="not-a-uuid7")
    with pytest.raises(ClientError) as info:
        asyncio.run(_write(single, events))
    assert info.value.code == "invalid_argument" and "no UUIDv7" in str(info.value), info.value
    assert asyncio.run(_value(single, "second-slice/0")) is None
