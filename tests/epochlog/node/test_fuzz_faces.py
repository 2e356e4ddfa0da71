"""Fuzzing the native and gRPC faces of three real `epochlog serve` processes (tests/epochlog/node/fuzz.py).

Bounded: at most FUZZ_NATIVE_CASES native frames and FUZZ_GRPC_CASES gRPC calls, and FUZZ_SECONDS of
fuzzing (EPOCHLOG_SOAK=<k>: k times each). Seeded: the seed is printed; `EPOCHLOG_FUZZ_SEED=<seed>` replays the
same inputs.

Afterwards: every process is up and healthy, no group failed or halted, valid traffic works on
both faces, no entity changed except those of the writes a node accepted, and the replicas hold
equal views (applied offset and digest of every group, read from their RocksDB once stopped).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import grpc

from epochlog.client import Client
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from epochlog.api.routing import entity_key
from tests.epochlog.node.fuzz import GrpcFuzzer, NativeFuzzer, Tally, known_codes
from tests.epochlog.node.raw import http_get
from tests.support.seeds import soak, soak_seconds

SEED_ENV = "EPOCHLOG_FUZZ_SEED"
# The suite's bounds (halved for its time bound: 20 s, 1,500 and 600 before); EPOCHLOG_SOAK=<k> fuzzes k times
# as long and as many (tests/support/seeds.py).
FUZZ_SECONDS = soak_seconds(10.0)
FUZZ_NATIVE_CASES = soak(750)
FUZZ_GRPC_CASES = soak(300)
KINDS = {"metadata": ("broker/", "group/", "topic/", "config/", "member/"), "offsets": ("offset/",),
         "kv": ("", "lease/", "session/")}   # "": every kv entry


def _entities(client: Client) -> dict[str, tuple[int, bytes]]:
    """Every entity of every group: key -> (version, state), read at the leaders."""
    out = {}
    for prefixes in KINDS.values():
        for prefix in prefixes:
            after = None
            while True:
                page = client.list_entities(prefix, limit=1000, after=after)
                for e in page.items:
                    out[entity_key(e.key)] = (e.version, repr(e.state).encode())   # as records name them
                if page.next_after is None:
                    break
                after = page.next_after
    return out


def _commits(client: Client) -> dict[str, int]:
    return {group: client.read_events(group, 1 << 62, max_events=1).commit_offset for group in KINDS}


def _committed_since(client: Client, since: dict[str, int]) -> list[tuple[str, int, ev.Event | None]]:
    """Every record committed in each group after `since[group]`: (group, offset, its event)."""
    out = []
    for group, start in since.items():
        offset = start + 1
        while True:
            batch = client.read_events(group, offset, max_events=1000)
            for r in batch.events:
                try:
                    event: ev.Event | None = ev.decode_event(r.value or b"")
                except (ev.EventError, ev.SchemaVersionError):
                    event = None
                out.append((group, r.offset, event))
            if batch.next_offset <= offset:
                break
            offset = batch.next_offset
    return out


def _keys(event: ev.Event | None) -> set[str]:
    if event is None:
        return set()
    return {op.key() for op in event.ops} if isinstance(event, ev.Txn) else {event.key()}


def test_fuzz_native_and_grpc_faces(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    env = os.environ.get(SEED_ENV)
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    print(f"fuzz seed={seed} (replay with {SEED_ENV}={seed})")
    rng = random.Random(seed)
    cluster = node_cluster_factory(grpc=True, raft={"election_timeout_ticks": 20})
    cluster.start()
    for group in KINDS:
        cluster.leader(group, timeout=30)
    with Client(cluster.endpoints, timeout=30) as client:
        for i in range(5):
            client.put(f"base/{i}", f"v{i}".encode())
        client.command(ev.OffsetCommitted(consumer_group="cg", topic="t", queue_id=0, offset=7))
        client.command(ev.ConfigChanged(scope="s", name="n", value="v"))
        client.command(ev.TopicCreated(name="base-topic"))
    # Read where the fuzz starts once the writer above closed its sessions (their ClientSessionClosed
    # records are its own, not the fuzzer's); a client that only reads opens none.
    with Client(cluster.endpoints, timeout=30) as client:
        baseline = _entities(client)
        before = _commits(client)
    kv_leader = cluster.leader("kv")
    natives = [cluster.endpoint(kv_leader)] * 2 + cluster.endpoints        # writes mostly reach the leader
    tally = Tally()
    native = NativeFuzzer(natives, rng, tally, known_codes())
    grpcs = GrpcFuzzer([cluster.nodes[kv_leader].grpc_address] + [n.grpc_address for n in cluster.nodes.values()],
                       rng, tally)
    deadline = time.monotonic() + FUZZ_SECONDS
    try:
        while time.monotonic() < deadline and (tally.cases < FUZZ_NATIVE_CASES or tally.grpc_calls < FUZZ_GRPC_CASES):
            if tally.cases < FUZZ_NATIVE_CASES and (tally.grpc_calls >= FUZZ_GRPC_CASES or rng.random() < 0.7):
                native.case()
            else:
                grpcs.case()
    finally:
        native.close()
        grpcs.close()
    print(f"fuzz seed={seed}: {tally.cases} native frames ({tally.requests} requests, {tally.replies_ok} results, "
          f"errors {tally.errors}, {tally.closes} closes), {tally.grpc_calls} gRPC calls {tally.statuses}, "
          f"{len(tally.committed)} writes committed, {tally.unknown_writes} of unknown outcome")
    assert not tally.failures, f"seed {seed}: {len(tally.failures)} failures:\n" + "\n".join(tally.failures[:20])
    assert tally.cases >= 200 and tally.grpc_calls >= 80, "too few cases ran to mean anything"
    assert tally.errors.get("invalid_argument", 0) > 20 and tally.statuses.get("INVALID_ARGUMENT", 0) > 20

    # The nodes are up and healthy, nothing failed or halted.
    for i, n in cluster.nodes.items():
        assert n.running, f"node {i} exited: {n.stderr()[-3000:]}"
        assert http_get(n.admin_address, "/healthz") == (200, "ok\n")
        info = cluster.wait_status(i)
        assert all(g.halted is None for g in info.groups), info
    # What was committed meanwhile: the writes answered with their offset, and at most as many others
    # as writes of unknown outcome (a request refused with an error appended nothing). No entity
    # changed but those of these records.
    with Client(cluster.endpoints, timeout=20) as client:
        records = _committed_since(client, before)
        unexplained = [(g, o) for g, o, e in records if (g, o) not in tally.committed
                       and not (e is not None and e.actor == "epochlog/leader")]
        assert len(unexplained) <= tally.unknown_writes, (
            f"seed {seed}: records committed without an answer saying so: {unexplained} "
            f"(writes of unknown outcome: {tally.unknown_writes}): "
            f"{[r for r in records if (r[0], r[1]) in set(unexplained)]}")
        assert tally.committed <= {(g, o) for g, o, _ in records}, "an answered offset is not in the log"
        touched = set().union(*(_keys(e) for _, _, e in records)) if records else set()
        now = _entities(client)
        for key in set(baseline) | set(now):
            if key not in touched:
                assert baseline.get(key) == now.get(key), f"seed {seed}: {key} changed without a committed write"
        # Valid traffic works on both faces.
        done = client.put("after/fuzz", b"ok")
        got = client.get("after/fuzz")
        assert got is not None and got.value == b"ok"
    with grpc.insecure_channel(cluster.nodes[kv_leader].grpc_address) as channel:
        stub = pb_grpc.EpochlogStub(channel)
        assert stub.Put(pb.PutRequest(name="after/grpc", value=b"1"), timeout=10).ok
        assert stub.Get(pb.GetRequest(key="after/grpc"), timeout=10).item.kv.value == b"1"
    assert done.offset >= 0
    for group, views in cluster.stop_converged(KINDS).items():   # every replica applied everything committed
        assert len(set(views.values())) == 1, f"group {group}: replicas differ: {views}"
