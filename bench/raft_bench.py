"""Benchmark of the Raft node runtime: a 3-node cluster of real processes on 127.0.0.1.

    python -m bench.raft_bench [--quick] [--seconds S] [--failovers N] [--no-results]

1. Commit throughput and latency. Proposals are made on the leader itself (the harness `Load`
   request: N coroutines in the leader's process, each with one proposal in flight; the group
   coalesces whatever is queued into one batch per Ready cycle), so this is the ceiling a client API
   can reach. Events are 150 bytes (a 16-byte-ish key and a 134-byte value). Latency is from
   `propose` to the commit acknowledgement (majority durable, applied on the leader). Concurrency
   1, 16, 64 and 256 with one event per proposal, and proposer-side batches of 100 events.
2. Failover: four client connections write to the leader through the harness; the leader is
   killed with SIGKILL; the time from the kill to the first write acknowledged by the new leader.
   The killed node is restarted and the cluster converges before the next round.

Default timeouts: tick 50 ms, election timeout 10 ticks (randomized 500-1000 ms), heartbeat
1 tick. Segments are the default 64 MiB. The etcd figures quoted next to ours were measured on this
kind of machine by ../shared/anchors/etcd (3 members, grpc.aio client), not in this run.
Results go to the `raft` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.raft_harness import Committed, Failed, GroupState, HarnessClient, LoadReply
from bench.results import write_section
from tests.support.nodes import NodeCluster
from tests.support.wait import eventually

GROUP = "g0"
ETCD = {1: (959, 0.97, 2.00), 16: (4546, 3.25, 8.44), 64: (7524, 7.94, 19.19), 256: (8987, 27.50, 51.02)}
ETCD_TXN100 = 53_022
TARGETS = {"256": 100_000, "batch": 200_000, "p50_1_ms": 1.0, "failover_s": 2.0}


class Harness:
    """The benchmark's cluster: bench/raft_node.py processes run by a NodeCluster, and a control client
    (bench/raft_harness.py) to each running node."""

    def __init__(self, cluster: NodeCluster) -> None:
        self.cluster = cluster
        self.clients: dict[int, HarnessClient] = {}

    async def start(self, nodes: list[int] | None = None) -> None:
        ids = list(self.cluster.nodes) if nodes is None else nodes
        await asyncio.to_thread(self.cluster.start, ids)
        for i in ids:
            host, _, port = self.cluster.endpoint(i).rpartition(":")
            self.clients[i] = await HarnessClient.connect(host, int(port))

    def kill(self, node: int) -> float:
        self.clients.pop(node).abort()
        return self.cluster.kill9(node)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        self.clients.clear()
        self.cluster.close()

    async def states(self, group: str) -> dict[int, GroupState]:
        replies = {}
        for i, client in self.clients.items():
            try:
                replies[i] = next(g for g in (await client.status(timeout=1.0)).groups if g.group == group)
            except (TimeoutError, ConnectionError, OSError):
                pass
        return replies

    async def wait_leader(self, group: str, timeout: float = 10.0) -> GroupState:
        async def leader() -> GroupState | None:
            leading = [s for s in (await self.states(group)).values() if s.role == "leader"]
            return max(leading, key=lambda s: s.term) if leading else None
        return await eventually(leader, timeout, f"a leader of {group}")

    async def wait_converged(self, group: str, timeout: float = 15.0) -> None:
        async def converged() -> bool:
            states = await self.states(group)
            views = {(s.leader, s.term, s.commit, s.applied) for s in states.values()}
            return len(states) == len(self.clients) and len(views) == 1 and next(iter(views))[0] != 0
        await eventually(converged, timeout, f"{group} to converge")


@dataclass(frozen=True)
class Ack:
    node: int
    acked: float   # monotonic


async def write_until(harness: Harness, group: str, stop: asyncio.Event, acks: list[Ack], proposers: int = 4) -> None:
    """`proposers` writers of one 134-byte event at a time to the node believed to lead, following
    not_leader hints, until `stop`; every acknowledgement goes to `acks`."""
    target = [next(iter(harness.clients))]

    async def writer(n: int) -> None:
        i = 0
        while not stop.is_set():
            node = target[0]
            client = harness.clients.get(node)
            i += 1
            try:
                if client is None:
                    raise ConnectionError(f"node {node} is down")
                reply = await client.propose(group, [(b"w%d-%d" % (n, i), bytes(134))], timeout=0.5)
            except (TimeoutError, ConnectionError, OSError):
                if target[0] == node:   # the next node, unless another writer moved on already
                    ids = sorted(harness.cluster.nodes)
                    target[0] = ids[(ids.index(node) + 1) % len(ids)]
                await asyncio.sleep(0.01)
                continue
            if isinstance(reply, Committed):
                acks.append(Ack(node, time.monotonic()))
            elif isinstance(reply, Failed) and reply.code == "not_leader" and reply.leader:
                target[0] = reply.leader
            else:
                await asyncio.sleep(0.02)
    await asyncio.gather(*(writer(n) for n in range(proposers)))


@dataclass
class LoadResult:
    proposers: int
    batch: int
    events_per_s: float
    p50_ms: float
    p99_ms: float
    proposals: int
    errors: int


def pct(values: list[int], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))] / 1000


async def run_loads(cluster: Harness, seconds: float) -> list[LoadResult]:
    results = []
    cases = [(1, 1), (16, 1), (64, 1), (256, 1), (1, 100), (16, 100)]
    for proposers, batch in cases:
        leader = await cluster.wait_leader(GROUP)
        client = cluster.clients[leader.node]
        reply = await client.load(GROUP, proposers=proposers, seconds=seconds, batch=batch)
        assert isinstance(reply, LoadReply), reply
        r = LoadResult(proposers, batch, reply.events / reply.seconds, pct(reply.latencies_us, .5),
                       pct(reply.latencies_us, .99), reply.proposals, reply.errors)
        results.append(r)
        print(f"  {proposers:>4} proposers x {batch:>3} events: {r.events_per_s:>10,.0f} events/s  "
              f"p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:6.2f} ms  ({r.errors} errors)", flush=True)
    return results


async def run_failovers(cluster: Harness, rounds: int) -> list[float]:
    times = []
    for round_no in range(rounds):
        await cluster.wait_converged(GROUP, timeout=30)
        stop, acks = asyncio.Event(), []
        writers = asyncio.create_task(write_until(cluster, GROUP, stop, acks))
        await eventually(lambda: len(acks) > 50, 10, "writes before the kill")
        leader = (await cluster.wait_leader(GROUP)).node
        killed_at = cluster.kill(leader)
        first = await eventually(lambda: next((a.acked for a in acks if a.acked > killed_at and a.node != leader),
                                              None), 15, "a write acknowledged by a new leader")
        stop.set()
        await writers
        times.append(first - killed_at)
        print(f"  failover {round_no + 1}: killed leader {leader}, first write committed by the new leader "
              f"{(first - killed_at) * 1000:.0f} ms later", flush=True)
        await cluster.start([leader])
    return times


def report(loads: list[LoadResult], failovers: list[float], seconds: float, command: str) -> str:
    rows = ["| proposers | events per proposal | events/s | p50 ms | p99 ms | etcd puts/s (p50 ms) |",
            "|---|---|---|---|---|---|"]
    for r in loads:
        if r.batch == 1 and r.proposers in ETCD:
            e = ETCD[r.proposers]
            etcd = f"{e[0]:,} ({e[1]:.2f})"
        elif r.batch == 100:
            etcd = f"{ETCD_TXN100:,} (Txn of 100 puts, 16 clients)"
        else:
            etcd = ""
        rows.append(f"| {r.proposers} | {r.batch} | {r.events_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {etcd} |")
    by = {(r.proposers, r.batch): r for r in loads}
    best_batch = max((r for r in loads if r.batch == 100), key=lambda r: r.events_per_s)
    med_failover = statistics.median(failovers) if failovers else float("nan")

    def met(ok: bool) -> str:
        return "**met**" if ok else "**not met**"
    targets = [
        "| target | measured | met? |", "|---|---|---|",
        f"| >= 100,000 events/s at 256 proposers | {by[(256, 1)].events_per_s:,.0f} | "
        f"{met(by[(256, 1)].events_per_s >= TARGETS['256'])} |",
        f"| >= 200,000 events/s with batches of 100 | {best_batch.events_per_s:,.0f} ({best_batch.proposers} "
        f"proposers) | {met(best_batch.events_per_s >= TARGETS['batch'])} |",
        f"| commit p50 at 1 proposer <= 1 ms | {by[(1, 1)].p50_ms:.2f} ms | "
        f"{met(by[(1, 1)].p50_ms <= TARGETS['p50_1_ms'])} |",
        f"| failover (kill -9 to first committed write) < 2 s | median {med_failover * 1000:.0f} ms, max "
        f"{max(failovers) * 1000:.0f} ms over {len(failovers)} | {met(max(failovers) < TARGETS['failover_s'])} |",
    ]
    return "\n".join([
        "3 node processes on 127.0.0.1 (each: the Raft group `g0` on its own segmented log, group commit, "
        "64 MiB segments), default timeouts (tick 50 ms, election 10 ticks, heartbeat 1 tick). Proposals are "
        "made inside the leader's process (harness `Load`), each proposer with one proposal in flight; the "
        "group coalesces queued proposals into one entry per cycle. Events: 150 bytes. Latency: propose to "
        f"commit acknowledged on the leader (majority durable). {seconds:.0f} s per case. etcd: 3 members, "
        "grpc.aio client, measured earlier on this kind of machine by ../shared/anchors/etcd (not in this run).",
        "", "### Targets", "", *targets, "", "### Commit throughput and latency", "", *rows, "",
        "### Failover", "",
        "Four harness clients write to the leader; it is killed with SIGKILL; time from the kill to the first "
        "write the new leader acknowledges (detection takes one randomized election timeout, 500-1000 ms):",
        "", ", ".join(f"{t * 1000:.0f} ms" for t in failovers), ""])


async def main_async(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="raft-bench-", dir=args.dir))
    cluster = Harness(NodeCluster(root, size=3, groups=(GROUP,), log={"segment_bytes": 64 << 20}, seed=args.seed,
                                  module="bench.raft_node"))
    try:
        await cluster.start()
        await cluster.wait_leader(GROUP, timeout=20)
        print(f"cluster up in {root}", flush=True)
        loads = await run_loads(cluster, args.seconds)
        failovers = await run_failovers(cluster, args.failovers)
    finally:
        await cluster.close()
        shutil.rmtree(root, ignore_errors=True)
    body = report(loads, failovers, args.seconds, " ".join(sys.argv))
    print(body)
    if not args.no_results:
        write_section("raft", body, command="python -m bench.raft_bench " + " ".join(sys.argv[1:]))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per load case")
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 s per case, 1 failover")
    parser.add_argument("--dir", default=str(Path(__file__).parent / "out"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.failovers = 2.0, 1
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    code = asyncio.run(main_async(args))
    print(f"done in {time.monotonic() - started:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
