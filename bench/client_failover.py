"""How soon SDK writes go on after the kv leader stops (SIGSTOP) or is cut off from its peers (issue 17).

Three `epochlog serve` processes on 127.0.0.1 (tests/support/nodes.py), their peer links through the
partition proxy of tests/support/proxy.py. `--writers` writer clients (one AsyncClient each, call
timeout `--timeout`) put to their own keys, one call at a time, without pause. Each round takes the
current kv leader and either SIGSTOPs it (`stop`) or drops every frame of its peer links both ways
(`isolate`: its client port stays reachable, so a client sees an open, answering node that cannot
commit) for one of `--pauses` seconds, then resumes or heals it, waits until it caught up, and settles.

Measured per round, from the moment of the fault:

- `first_ack_s`: the first acknowledgement received more than 0.2 s after the fault. A reply
  received sooner was already on its way: no write can commit on a new leader within one election
  timeout (0.5 s with the defaults) of the old one going silent, and the old one commits nothing
  once stopped or cut off.
- `elected_s`: when a node other than the victim first says it leads kv (status polled every 50 ms
  through one client per node).
- `failed`: writer calls that failed during the round (their deadline passed). Before issue 17 every
  call in flight on the stopped leader failed once the pause outlived the call timeout.

Target (issue 17): `first_ack_s` median within 1.5 s and p99 within 3 s, whatever the pause length.

    .venv/bin/python -m bench.client_failover                  # 3 rounds x {stop, isolate} x pauses 2, 5, 10 s
    .venv/bin/python -m bench.client_failover --rounds 1 --pauses 3 --no-write    # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.results import write_section
from epochlog.client import AsyncClient, ClientError
from tests.support.nodes import NodeCluster

STRAGGLER_S = 0.2    # acknowledgements received this soon after the fault were sent back before it
CATCH_UP_S = 60.0    # bound on the wait for the resumed node to catch up after a round


@dataclass
class Writers:
    """`n` writer clients; every acknowledgement's receive time (monotonic) and every failure's."""

    acks: list[float] = field(default_factory=list)
    failures: list[tuple[float, str]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, endpoints: list[str], n: int, timeout: float) -> None:
        async def writer(w: int) -> None:
            async with AsyncClient(endpoints, timeout=timeout) as client:
                i = 0
                while not self.stop.is_set():
                    try:
                        await client.put(f"failover/{w}/{i % 16}", b"v%d" % i)
                        self.acks.append(time.monotonic())
                    except ClientError as exc:
                        self.failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                    i += 1
        await asyncio.gather(*(writer(w) for w in range(n)))


class Watch:
    """One client per node for status polls (a stopped node simply does not answer in time)."""

    def __init__(self, cluster: NodeCluster) -> None:
        self.cluster = cluster
        self.clients = {i: AsyncClient([cluster.endpoint(i)], timeout=0.5) for i in cluster.nodes}

    async def kv(self, node: int) -> tuple[str, int, int, int] | None:
        """(role, term, commit offset, applied offset) of kv on `node`, or None when it does not answer."""
        try:
            info = await self.clients[node].status(self.cluster.endpoint(node))
        except ClientError:
            return None
        g = next(g for g in info.groups if g.group == "kv")
        return g.role, g.term, g.commit_offset, g.applied_offset

    async def leader(self, among: list[int], above_term: int = -1, timeout: float = 30.0) -> tuple[int, int]:
        """(node, term) of a kv leader among `among` with a term above `above_term`, polled every 50 ms."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = await asyncio.gather(*(self.kv(i) for i in among))
            leaders = [(s[1], i) for i, s in zip(among, found) if s is not None and s[0] == "leader" and s[1] > above_term]
            if leaders:
                term, node = max(leaders)
                return node, term
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no kv leader among {among} above term {above_term} within {timeout} s")

    async def caught_up(self, timeout: float = CATCH_UP_S) -> None:
        """Until every node applied the kv leader's commit offset of the moment."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = await asyncio.gather(*(self.kv(i) for i in self.cluster.nodes))
            leaders = [s for s in states if s is not None and s[0] == "leader"]
            if leaders and all(s is not None and s[3] >= max(leaders, key=lambda s: s[1])[2] for s in states):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError("the nodes did not converge after the round")

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


async def one_round(cluster: NodeCluster, watch: Watch, writers: Writers, fault: str, pause_s: float) -> dict[str, object]:
    assert cluster.net is not None
    nodes = list(cluster.nodes)
    victim, term = await watch.leader(nodes)
    load = os.getloadavg()[0]
    failed_before = len(writers.failures)
    if fault == "stop":
        t0 = cluster.pause(victim)
    else:
        await asyncio.to_thread(cluster.net.isolate, victim)
        t0 = time.monotonic()
    others = [i for i in nodes if i != victim]
    try:
        new_leader, _ = await watch.leader(others, above_term=term, timeout=pause_s + 30)
        elected = time.monotonic() - t0
        while time.monotonic() < t0 + pause_s:
            await asyncio.sleep(0.05)
    finally:
        if fault == "stop":
            cluster.resume(victim)
        else:
            await asyncio.to_thread(cluster.net.heal)
    after = [t - t0 for t in writers.acks if t > t0 + STRAGGLER_S]
    while not after:   # the pause ended with no write acknowledged yet: wait for the first one
        await asyncio.sleep(0.05)
        after = [t - t0 for t in writers.acks if t > t0 + STRAGGLER_S]
    await watch.caught_up()
    failures = writers.failures[failed_before:]
    return {"fault": fault, "pause_s": pause_s, "victim": victim, "new_leader": new_leader,
            "elected_s": round(elected, 3), "first_ack_s": round(min(after), 3),
            "acks_during_pause": sum(1 for t in after if t < pause_s), "failed": len(failures),
            "failure": failures[0][1][:160] if failures else "", "load": round(load, 2)}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (with few samples, p99 is the maximum)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]


def summary(rows: list[dict[str, object]]) -> list[str]:
    lines = ["| fault | pause s | rounds | first ack median s | p99 s | max s | elected median s | failed calls |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(str(r["fault"]), float(r["pause_s"])) for r in rows})   # type: ignore[arg-type]
    for fault in ("stop", "isolate", "all"):
        groups = [k for k in keys if k[0] == fault] if fault != "all" else [("all", -1.0)]
        for key in groups:
            sel = [r for r in rows if fault == "all" or (r["fault"], r["pause_s"]) == key]
            if not sel:
                continue
            first = [float(r["first_ack_s"]) for r in sel]   # type: ignore[arg-type]
            elected = [float(r["elected_s"]) for r in sel]   # type: ignore[arg-type]
            pause = "all" if fault == "all" else f"{key[1]:g}"
            lines.append(f"| {fault} | {pause} | {len(sel)} | {statistics.median(first):.2f} | "
                         f"{percentile(first, 0.99):.2f} | {max(first):.2f} | {statistics.median(elected):.2f} | "
                         f"{sum(int(r['failed']) for r in sel)} |")   # type: ignore[call-overload]
    return lines


async def main(args: argparse.Namespace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="client-failover-") as tmp:
        cluster = NodeCluster(Path(tmp), seed=args.seed, proxied=True)
        try:
            await asyncio.to_thread(cluster.start)
            watch = Watch(cluster)
            writers = Writers()
            task = asyncio.create_task(writers.run(cluster.endpoints, args.writers, args.timeout))
            try:
                while len(writers.acks) < 200:
                    await asyncio.sleep(0.1)
                plan = [(f, p) for _ in range(args.rounds) for p in args.pauses for f in args.faults]
                for fault, pause in plan:
                    row = await one_round(cluster, watch, writers, fault, pause)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    await asyncio.sleep(args.settle)
            finally:
                writers.stop.set()
                await asyncio.wait_for(task, args.timeout + 5)
                await watch.close()
        finally:
            cluster.close()
    return rows


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=5.0, help="the writers' call timeout (s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every (fault, pause)")
    parser.add_argument("--pauses", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    parser.add_argument("--faults", nargs="+", choices=("stop", "isolate"), default=["stop", "isolate"])
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between rounds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = asyncio.run(main(args))
    table = summary(rows)
    print("\n".join(table))
    if not args.no_write:
        body = [(f"{args.writers} writer clients (AsyncClient, timeout {args.timeout:g} s, one put at a time each) "
                f"on 3 `epochlog serve` nodes on loopback (default [raft] and [cluster] timing: election timeout "
                f"10 ticks of 50 ms), peer links through tests/support/proxy.py. `stop`: SIGSTOP of the kv leader "
                f"for the pause, then SIGCONT; `isolate`: every frame of its peer links dropped both ways for the "
                f"pause (its client port stays reachable). First ack: the first acknowledged write received more "
                f"than {STRAGGLER_S} s after the fault; elected: when another node first said it leads kv. Load "
                f"average (1, 5, 15 min) before the run: {load}; per round in the JSON lines below."), "",
                *table, "", "Rounds (JSON lines):", "", "```", *(json.dumps(r) for r in rows), "```"]
        write_section("client-failover", "\n".join(body),
                      command=" ".join([".venv/bin/python", "-m", "bench.client_failover", *sys.argv[1:]]))


if __name__ == "__main__":
    cli()
