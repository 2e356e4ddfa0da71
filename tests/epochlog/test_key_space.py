"""One key space (epochlog/api/routing.py): a kv entry is `app/x` on every surface, another entity is
`<kind>/<name>`, and a key of the wrong space (`kv/app/x`, a kv name starting with an entity kind) is
refused at once with the spelling to use, never read as a key that cannot exist.

The rule itself is checked as a table; then every surface against one real 3-node cluster (processes
with native and gRPC addresses): the SDK, the CLI, gRPC and the native protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import grpc
import pytest

from epochlog.api import messages as p
from epochlog.api.routing import entity_key, entity_prefix, group_of_key, kv_name, user_key
from epochlog.client import AsyncClient, Client, ClientError
from epochlog.client.connection import Connection
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from eventlog.errors import EpochlogError
from statemachines import events as ev
from statemachines.events import EventError
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import ROOT, NodeCluster

T = 10.0
REFUSED_WITHIN_S = 10.0   # a refusal is an answer, not a wait: far below a hung watch


# --- the rule -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("user", "stored"), [
    ("app/x", "kv/app/x"), ("x", "kv/x"), ("kafka/t/0/n", "kv/kafka/t/0/n"), ("kvstore/a", "kv/kvstore/a"),
    ("topic/orders", "topic/orders"), ("broker/c/g/n", "broker/c/g/n"), ("lease/00000000000000000007", "lease/00000000000000000007"),
    ("config/export/t", "config/export/t"), ("client-session/kv/1", "client-session/kv/1"),
])
def test_a_key_names_one_entity_and_comes_back_as_written(user: str, stored: str) -> None:
    assert entity_key(user) == stored
    assert user_key(stored) == user


@pytest.mark.parametrize(("prefix", "stored"), [
    ("", "kv/"), ("app/", "kv/app/"), ("ap", "kv/ap"), ("topic", "kv/topic"), ("broker/", "broker/"),
    ("group/c1/", "group/c1/"),
])
def test_a_prefix_names_one_kind(prefix: str, stored: str) -> None:
    assert entity_prefix(prefix) == stored
    group_of_key(stored)   # and it routes


@pytest.mark.parametrize(("wrong", "hint"), [
    ("kv/app/x", "'app/x'"), ("kv/", "without kv/"),
])
def test_the_storage_form_is_refused_naming_the_user_form(wrong: str, hint: str) -> None:
    for parse in (entity_key, entity_prefix, kv_name):
        with pytest.raises(EventError, match=hint):
            parse(wrong)
    with pytest.raises(EventError, match=hint):
        group_of_key("kv/" + wrong)   # what the native protocol would carry for it


@pytest.mark.parametrize("wrong", ["topic/x", "config/timeout", "broker/a", "lease/1", "group/g"])
def test_a_kv_name_cannot_start_with_an_entity_kind(wrong: str) -> None:
    kind = wrong.split("/")[0]
    with pytest.raises(EventError, match=f"name {kind} entities.*'app/{wrong}'"):
        kv_name(wrong)
    with pytest.raises(EventError, match=f"{kind}/"):
        group_of_key("kv/" + wrong)


def test_a_record_key_routes_as_its_entity_key() -> None:
    """`group_of_record_key` (the leader's route of a record key, kv keys without decoding) answers, or
    refuses with the same words, as `group_of_key` of the decoded key, for keys of every kind and shape."""
    from epochlog.api.routing import GROUP_OF_KIND, RESERVED_KINDS, group_of_record_key
    names = ["", "x", "app/x", "é/x", "/", "x/", "kv", "kv/", "a/b/c"]
    names += [f"{kind}{tail}" for kind in RESERVED_KINDS for tail in ("", "/", "/x", "x/y")]
    keys = [f"{kind}/{name}" for kind in [*GROUP_OF_KIND, "client-session", "txn", "other", ""] for name in names]
    keys += ["kv", "", "/", "client-session/kv/x", "client-session/", "kvx/y"]
    for key in keys:
        try:
            expected: str | Exception = group_of_key(key)
        except EventError as exc:
            expected = exc
        try:
            got: str | Exception = group_of_record_key(key.encode())
        except EventError as exc:
            got = exc
        assert type(got) is type(expected) and str(got) == str(expected), key


def test_a_kind_without_a_name_is_not_a_key() -> None:
    with pytest.raises(EventError, match="names no entity"):
        entity_key("topic/")
    with pytest.raises(EventError, match="not empty"):
        entity_key("")


# --- every surface on real nodes ------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("keys"), grpc=True)


def _mine() -> str:
    return f"ks-{uuid.uuid4().hex[:8]}"


def run_cli(cluster: NodeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EPOCHLOG_ENDPOINTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "epochlog", *args, "--endpoints", ",".join(cluster.endpoints)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)


def test_the_sdk_takes_and_gives_kv_keys_as_app_x(cluster: NodeCluster) -> None:
    d = _mine()
    with Client(cluster.endpoints, timeout=T) as c:
        first = c.put(f"{d}/x", b"1")
        assert c.get(f"{d}/x").value == b"1"
        entity = c.get_entity(f"{d}/x")
        assert entity is not None and entity.key == f"{d}/x" and entity.version == first.offset
        assert [e.key for e in c.list_entities(f"{d}/").items] == [f"{d}/x"]
        assert [e.offset for e in c.entity_history(f"{d}/x")] == [first.offset]
        # A transaction's condition names the key as put and get do.
        second = c.txn([ev.KvPut(name=f"{d}/y", value=b"2")], conditions=[(f"{d}/x", first.offset), (f"{d}/y", 0)])
        assert second.ok and c.get(f"{d}/y").value == b"2"
        for event in c.watch(f"{d}/", from_offset=first.offset):
            assert (event.offset, event.key) == (first.offset, f"{d}/x")
            break
        # Every spelling of another space is refused at once, naming the one to use.
        for wrong in (lambda: c.get(f"kv/{d}/x"), lambda: c.get_entity(f"kv/{d}/x"),
                      lambda: c.put(f"topic/{d}", b"v"), lambda: c.history(f"kv/{d}/x"),
                      lambda: c.txn([ev.KvPut(name=f"{d}/z", value=b"")], conditions=[(f"kv/{d}/x", first.offset)])):
            with pytest.raises(EpochlogError, match=f"'{d}/x'|'app/topic/{d}'"):
                wrong()

    async def watch_wrong() -> None:
        async with AsyncClient(cluster.endpoints, timeout=T) as c:
            async for _ in c.watch(f"kv/{d}/"):
                raise AssertionError("a watch of kv/... delivered an event")
    with pytest.raises(EpochlogError, match=f"'{d}/'"):
        asyncio.run(asyncio.wait_for(watch_wrong(), REFUSED_WITHIN_S))


def test_the_sdk_watches_other_kinds_by_their_kind(cluster: NodeCluster) -> None:
    topic = _mine()
    with Client(cluster.endpoints, timeout=T) as c:
        created = c.command(ev.TopicCreated(name=topic, read_queues=1, write_queues=1))
        assert c.get_entity(f"topic/{topic}").key == f"topic/{topic}"
        for event in c.watch(f"topic/{topic}", from_offset=created.offset):
            assert (event.offset, event.key) == (created.offset, f"topic/{topic}")
            break


def test_the_cli_takes_one_spelling_on_every_command(cluster: NodeCluster) -> None:
    d = _mine()
    put = run_cli(cluster, "put", f"{d}/x", "1", "--json")
    assert put.returncode == 0, put.stderr
    offset = json.loads(put.stdout)["offset"]
    txn = run_cli(cluster, "txn", "--if", f"{d}/x={offset}", "put", f"{d}/y", "2", "--json")
    assert txn.returncode == 0, txn.stderr
    assert run_cli(cluster, "put", f"{d}/z", "3").returncode == 0
    watched = run_cli(cluster, "watch", f"{d}/", "--from", str(offset), "--count", "3", "--json")
    assert watched.returncode == 0, watched.stderr
    # The transaction comes as its record, keyed txn/<its first op's entity key> (docs/views.md).
    assert [json.loads(line)["key"] for line in watched.stdout.splitlines()] == [f"{d}/x", f"txn/kv/{d}/y", f"{d}/z"]
    history = run_cli(cluster, "history", f"{d}/x", "--json")
    assert [h["offset"] for h in json.loads(history.stdout)] == [offset]
    # The storage form and the other kinds' prefixes are refused in one line, exit 3, and never hang.
    for args, hint in ((("watch", f"kv/{d}/"), f"'{d}/'"), (("get", f"kv/{d}/x"), f"'{d}/x'"),
                       (("txn", "--if", f"kv/{d}/x={offset}", "put", f"{d}/z", "3"), f"'{d}/x'"),
                       (("put", "config/timeout", "5"), "'app/config/timeout'"),
                       (("history", f"kv/{d}/x"), f"'{d}/x'")):
        refused = run_cli(cluster, *args)
        assert refused.returncode == 3 and hint in refused.stderr, (args, refused)
        assert refused.stderr.startswith("error: ") and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_grpc_takes_and_gives_the_same_keys(cluster: NodeCluster) -> None:
    d = _mine()
    leader = cluster.leader("kv")
    with grpc.insecure_channel(cluster.nodes[leader].grpc_address) as channel:
        s = pb_grpc.EpochlogStub(channel)
        put = s.Put(pb.PutRequest(name=f"{d}/g", value=b"v"), timeout=T)
        got = s.Get(pb.GetRequest(key=f"{d}/g"), timeout=T)
        assert got.item.key == f"{d}/g" and got.item.kv.value == b"v" and got.item.version == put.offset
        listed = s.List(pb.ListRequest(prefix=f"{d}/"), timeout=T)
        assert [i.key for i in listed.items] == [f"{d}/g"]
        assert [r.offset for r in s.History(pb.HistoryRequest(key=f"{d}/g"), timeout=T).rows] == [put.offset]
        txn = s.Txn(pb.TxnRequest(conditions=[pb.Condition(key=f"{d}/g", version=put.offset)],
                                  ops=[pb.TxnOp(put=pb.PutRequest(name=f"{d}/h", value=b"w"))]), timeout=T)
        assert txn.ok
        stream = s.Watch(pb.WatchRequest(prefix=f"{d}/", from_offset=put.offset), timeout=T)
        assert next(stream).started.from_offset == put.offset
        assert next(stream).events.events[0].key == f"{d}/g"
        stream.cancel()
        for call, request in ((s.Get, pb.GetRequest(key=f"kv/{d}/g")),
                              (s.List, pb.ListRequest(prefix=f"kv/{d}/")),
                              (s.Put, pb.PutRequest(name=f"topic/{d}", value=b"")),
                              (s.Txn, pb.TxnRequest(conditions=[pb.Condition(key=f"kv/{d}/g", version=0)],
                                                    ops=[pb.TxnOp(put=pb.PutRequest(name=f"{d}/i"))]))):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=T)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        with pytest.raises(grpc.RpcError) as info:
            next(s.Watch(pb.WatchRequest(prefix=f"kv/{d}/"), timeout=REFUSED_WITHIN_S))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"'{d}/'" in info.value.details()


def test_the_native_protocol_refuses_a_storage_key_that_cannot_exist(cluster: NodeCluster) -> None:
    """The native wire carries the storage form (`kv/app/x`); `kv/kv/...` (someone prefixed twice) is refused."""
    d = _mine()

    async def main() -> None:
        conn = Connection(cluster.endpoint(cluster.leader("kv")))
        await conn.connect(T)
        try:
            for call in (p.Get(f"kv/kv/{d}/x", "local"), p.List(prefix=f"kv/kv/{d}/", consistency="local")):
                with pytest.raises(ClientError, match=f"'{d}/x'|'{d}/'") as info:
                    await conn.call(call, T)
                assert info.value.code == "invalid_argument"
            _, queue = conn.open_stream(p.Watch(f"kv/kv/{d}/", -1, "", 16))
            reply = await asyncio.wait_for(queue.get(), REFUSED_WITHIN_S)
            assert reply.error is not None and reply.error.code == "invalid_argument" and f"'{d}/'" in reply.error.message
        finally:
            await conn.close()
    asyncio.run(main())
