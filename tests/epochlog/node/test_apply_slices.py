"""Applying never starves Raft: sustained batched writes move no leadership (issue 20), on 3 real nodes.

Every group of a node shares one asyncio loop. A group applied everything committed in one Ready (up
to 64 MiB) synchronously in that loop, in entries of up to 1 MiB of coalesced proposals, so under
sustained batched writes a node applying sent no heartbeats for any of its groups for longer than the
election timeout: the followers elected, and the kv term climbed through every batched benchmark run.
Now a group applies at most APPLY_BYTES_PER_TURN per Ready, coalesces proposals into entries of at
most that, and lets the loop run between slices (eventlog/raft/runtime/group.py).

The test writes batches of BATCH puts from WRITERS concurrent clients for WRITE_S seconds (or
WRITES_MAX writes) with the default election timeout (10 ticks of 50 ms: what `epochlog serve` runs
with, and what the benchmark measured), and asserts what the nodes say, not how long anything took:
no group changed its term or leader on any node, and every write succeeded. Checked against the code
before the change: it fails every time (3 of 3 runs, load average 12-14 on 2 cores: the kv term went
from 1 to 5-7 in 25 s, and the idle groups moved with it); after it, it passed at load averages up to
24 in 4 of 5 runs (the failing one moved one idle group once, on a machine running 12 processes per core).
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from epochlog.client.aio import AsyncClient
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow

WRITERS = 16
BATCH = 100
VALUE_BYTES = 150
WRITE_S = 25.0
WRITES_MAX = 2_000


def _terms(cluster: NodeCluster) -> dict[tuple[int, str], tuple[int, int]]:
    """(node, group) -> (term, leader), as each node says."""
    out = {}
    for node in cluster.running():
        for g in cluster.wait_status(node).groups:
            out[(node, g.group)] = (g.term, g.leader)
    return out


def _settled(cluster: NodeCluster) -> dict[tuple[int, str], tuple[int, int]] | None:
    """The terms once every node agrees on a leader for every group, else None."""
    terms = _terms(cluster)
    for group in cluster.groups:
        seen = {terms[(n, group)] for n in cluster.running()}
        if len(seen) != 1 or next(iter(seen))[1] == 0:
            return None
    return terms


async def _write(endpoints: list[str], seed: int, deadline: float) -> tuple[int, list[str]]:
    """Batched writes until the deadline: (events written, failures)."""
    rng = random.Random(seed)
    value = rng.randbytes(VALUE_BYTES)
    written, failures, started = 0, [], 0

    async def writer(client: AsyncClient, w: int) -> None:
        nonlocal written, started
        while time.monotonic() < deadline and started < WRITES_MAX:
            i = started
            started += 1
            events = [ev.KvPut(name=f"slices/{w}/{i}/{j}", value=value) for j in range(BATCH)]
            try:
                results = await client.commands(events)
            except Exception as exc:   # counted: the test fails on any
                failures.append(repr(exc))
                continue
            bad = [r for r in results if not r.ok]
            if bad:
                failures.append(f"{bad[0].code}: {bad[0].message}")
            written += len(results) - len(bad)

    async with AsyncClient(endpoints, timeout=60) as client:
        await asyncio.gather(*(writer(client, w) for w in range(WRITERS)))
    return written, failures


def test_sustained_batched_writes_move_no_leadership(node_cluster_factory, seed: int) -> None:
    cluster: NodeCluster = node_cluster_factory(log={"segment_bytes": 8 << 20})
    cluster.start()
    before = wait_until(lambda: _settled(cluster), timeout=60, what="every group has one leader all nodes know")
    written, failures = asyncio.run(_write(cluster.endpoints, seed, time.monotonic() + WRITE_S))
    assert not failures, f"{len(failures)} writes failed, e.g. {failures[:3]}"
    assert written >= 100 * BATCH, f"only {written} events written: the run proves nothing"
    cluster.wait_converged("kv", timeout=120)   # every write applied everywhere, then the terms
    after = _terms(cluster)
    moved = {k: (before[k], v) for k, v in after.items() if v != before[k]}
    assert not moved, (f"leaderships moved under batched writes ((node, group): (term, leader) before -> after): "
                       f"{moved}; {written} events")
