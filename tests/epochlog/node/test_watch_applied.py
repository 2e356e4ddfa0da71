"""Watches say what applied (issue 17): a committed write that changed nothing, a rejected
compare-and-set or a retried request, is streamed with `applied` false on every face (the SDK's native
watch, gRPC Watch, `epochlog watch --all`, `epochlog events tail`); the default `epochlog watch`
leaves it out; and a consumer applying only the applied events of a watch ends with the views' values.

Three real `epochlog serve` processes with gRPC addresses, shared by the module; each test uses
keys of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import msgspec
import pytest

from epochlog.api import messages as p
from epochlog.client import AsyncClient, Client, RejectedError, WatchedEvent
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from statemachines import events as ev
from statemachines.request_ids import uuid7
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import NodeCluster
from tests.epochlog.cli.test_cli import run

WAIT_S = 30.0
SEED_ENV = "EPOCHLOG_NODE_SEED"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("watch-applied"),
                                 grpc=True, raft={"election_timeout_ticks": 20})


@pytest.fixture(scope="module")
def client(cluster: NodeCluster) -> Iterator[Client]:
    with Client(cluster.endpoints, timeout=WAIT_S) as c:
        yield c


def send_twice(client: Client, event: ev.KvPut) -> tuple[p.WriteResult, p.WriteResult]:
    """The same write sent twice, as by a client retrying after a lost reply: the same idempotency key
    (a UUIDv7 request id, which the SDK sends as it is, without its session)."""
    stamped = msgspec.structs.replace(event, request_id=uuid7())
    [first] = client.commands([stamped])
    [second] = client.commands([stamped])
    assert first.ok and second.duplicate and second.offset == first.offset, (first, second)
    return first, second


def rejected_offset(client: Client, name: str, value: bytes, expected_version: int) -> int:
    with pytest.raises(RejectedError) as info:
        client.put(name, value, expected_version=expected_version)
    return info.value.offset


@dataclass(frozen=True)
class Marked:
    """Writes under `prefix`: which offsets changed nothing, and the range to watch."""

    prefix: str             # a kv name prefix, e.g. "wa-1a2b3c4d/"
    first: int
    last: int
    not_applied: frozenset[int]
    retried: int            # offset of the retry's own record


@pytest.fixture(scope="module")
def marked(client: Client) -> Marked:
    """A put, a CAS that must not exist (rejected), a stale CAS (rejected), a retried put (its second
    record a duplicate), a delete of a missing key (rejected), then a last put."""
    prefix = f"wa-{uuid.uuid4().hex[:8]}/"
    first = client.put(prefix + "a", b"1").offset
    exists = rejected_offset(client, prefix + "a", b"must-not-exist", 0)
    stale = rejected_offset(client, prefix + "a", b"stale", first - 1)
    send_twice(client, ev.KvPut(name=prefix + "b", value=b"retried"))
    with pytest.raises(RejectedError) as missing:
        client.delete(prefix + "missing")
    last = client.put(prefix + "c", b"last").offset
    # The retry's own record is known by its value only: its reply names the first one's offset.
    events = _sdk_watch(client, prefix, first, last)
    retried = [e.offset for e in events if isinstance(e.event, ev.KvPut) and e.event.value == b"retried"]
    assert len(retried) == 2, events
    return Marked(prefix, first, last, frozenset({exists, stale, retried[1], missing.value.offset}), retried[1])


def _sdk_watch(client: Client, prefix: str, first: int, last: int,
               endpoint: str | None = None) -> list[WatchedEvent]:
    """The events of a native watch of kv `prefix` from `first` through `last` (bounded wait)."""
    async def collect() -> list[WatchedEvent]:
        out: list[WatchedEvent] = []
        async with AsyncClient([endpoint] if endpoint else client.aio.endpoints, timeout=WAIT_S) as c:
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


def test_sdk_watch_marks_the_rejected_and_the_retried(client: Client, cluster: NodeCluster, marked: Marked) -> None:
    follower = cluster.followers("kv")[0]   # any node serves a watch: its views give the flags
    events = _sdk_watch(client, marked.prefix, marked.first, marked.last, cluster.endpoint(follower))
    assert len(events) == 7 and events[-1].offset == marked.last
    assert {e.offset for e in events if e.applied is False} == marked.not_applied
    assert all(e.applied is True for e in events if e.offset not in marked.not_applied)
    status = cluster.wait_group_status(cluster.leader("kv"), "kv")
    assert all(1 <= e.term <= status.term for e in events), [e.term for e in events]


def test_grpc_watch_marks_them(cluster: NodeCluster, marked: Marked) -> None:
    with grpc.insecure_channel(cluster.nodes[cluster.followers("kv")[-1]].grpc_address) as channel:
        stream = pb_grpc.EpochlogStub(channel).Watch(
            pb.WatchRequest(prefix=marked.prefix, from_offset=marked.first), timeout=WAIT_S)
        assert next(stream).started.from_offset == marked.first
        seen: list[pb.Event] = []
        while not seen or seen[-1].offset < marked.last:
            seen += next(stream).events.events
        stream.cancel()
    assert len(seen) == 7 and all(e.HasField("applied") and e.term > 0 for e in seen)
    assert {e.offset for e in seen if not e.applied} == marked.not_applied


def test_cli_watch_omits_them_and_marks_them_with_all(cluster: NodeCluster, marked: Marked) -> None:
    endpoints = ",".join(cluster.endpoints)
    applied_count = 7 - len(marked.not_applied)
    # --count counts what is printed: the applied events by default, every event with --all.
    default = run("watch", marked.prefix, "--from", str(marked.first), "--count", str(applied_count), "--json",
                  "--endpoints", endpoints)
    assert default.returncode == 0, default.stderr
    shown = [json.loads(line) for line in default.stdout.splitlines()]
    assert [d["applied"] for d in shown] == [True] * applied_count
    assert not {d["offset"] for d in shown} & marked.not_applied and shown[-1]["offset"] == marked.last
    every = run("watch", marked.prefix, "--from", str(marked.first), "--count", "7", "--all", "--json",
                "--endpoints", endpoints)
    assert every.returncode == 0, every.stderr
    documents = [json.loads(line) for line in every.stdout.splitlines()]
    assert {d["offset"] for d in documents if d["applied"] is False} == marked.not_applied
    assert all(d["term"] > 0 for d in documents)
    retry = next(d for d in documents if d["offset"] == marked.retried)
    assert (retry["key"], retry["event"], retry["value"]) == (marked.prefix + "b", "KvPut", "retried")
    human = run("watch", marked.prefix, "--from", str(marked.first), "--count", "7", "--all",
                "--endpoints", endpoints)
    assert human.returncode == 0, human.stderr
    header, *rows = human.stdout.splitlines()
    assert header.split()[:3] == ["OFFSET", "TERM", "APPLIED"]
    assert {int(r.split()[0]) for r in rows if r.split()[2] == "no"} == marked.not_applied
    assert all(r.split()[2] == "yes" for r in rows if int(r.split()[0]) not in marked.not_applied)


def test_events_tail_shows_the_flag(cluster: NodeCluster, marked: Marked) -> None:
    endpoints = ",".join(cluster.endpoints)
    count = marked.last - marked.first + 1    # other tests write meanwhile: read the range, keep the prefix
    tail = run("events", "tail", "--from", str(marked.first), "--max-events", str(count), "--json",
               "--endpoints", endpoints)
    assert tail.returncode == 0, tail.stderr
    ours = [d for d in map(json.loads, tail.stdout.splitlines()) if d["key"].startswith("kv/" + marked.prefix)]
    assert len(ours) == 7 and {d["offset"] for d in ours if d["applied"] is False} == marked.not_applied
    assert all(d["applied"] is True and d["term"] > 0 for d in ours if d["offset"] not in marked.not_applied)
    human = run("events", "tail", "--from", str(marked.retried), "--max-events", "1", "--endpoints", endpoints)
    assert human.returncode == 0, human.stderr
    header, row = human.stdout.splitlines()
    assert header.split()[:4] == ["OFFSET", "TIMESTAMP", "TERM", "APPLIED"]
    assert row.split()[0] == str(marked.retried) and row.split()[3] == "no"


def test_replaying_the_applied_events_of_a_watch_gives_the_views(client: Client) -> None:
    env = os.environ.get(SEED_ENV)
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"seed={seed} (replay with {SEED_ENV}={seed})")
    rng = random.Random(seed)
    prefix = f"replay-{uuid.uuid4().hex[:8]}/"
    names = [f"{prefix}k{i}" for i in range(8)]
    versions: dict[str, int] = {}   # what this test knows of each key's version (for CAS that pass)
    first = client.put(names[0], b"start").offset
    versions[names[0]] = first
    for i in range(150):
        name, value, roll = rng.choice(names), b"v%d" % i, rng.random()
        if roll < 0.35:
            versions[name] = client.put(name, value).offset
        elif roll < 0.55 and name in versions:          # a compare-and-set that passes
            versions[name] = client.put(name, value, expected_version=versions[name]).offset
        elif roll < 0.75:                                # one that fails: a stale version, or "must not exist"
            stale = versions.get(name, first) - 1 if rng.random() < 0.5 else 0
            if stale == 0 and name not in versions:
                stale = first - 1
            rejected_offset(client, name, value, stale)
        elif roll < 0.85:
            result, _ = send_twice(client, ev.KvPut(name=name, value=value))
            versions[name] = result.offset
        else:                                            # a delete, of a key that may not exist (rejected)
            try:
                client.delete(name)
                versions.pop(name, None)
            except RejectedError as exc:
                assert exc.reason == "not_found", exc
    # The last write changes nothing and differs from the key's value: replaying it would show.
    rejected_offset(client, names[0], b"never", 0 if names[0] in versions else first - 1)
    last = client.put(prefix + "end", b"end").offset
    events = _sdk_watch(client, prefix, first, last)
    assert all(e.applied is not None for e in events)
    replayed, naive = _replay(e for e in events if e.applied), _replay(events)
    views = {n: client.get(n, min_offset=last) for n in [*names, prefix + "end"]}
    assert replayed == {n: kv.value for n, kv in views.items() if kv is not None}, seed
    assert naive != replayed, "the workload had no write that changed nothing: the check proved nothing"
    listed = client.list(prefix, limit=100)
    assert {kv.name: kv.value for kv in listed.items} == replayed and listed.next_after is None


def _replay(events: Iterator[WatchedEvent] | list[WatchedEvent]) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    for e in events:
        if isinstance(e.event, ev.KvPut):
            state[e.event.name] = e.event.value
        else:
            assert isinstance(e.event, ev.KvDeleted), e
            state.pop(e.event.name, None)
    return state
