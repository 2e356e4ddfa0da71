"""Two builds of Epochlog up at the same time, one client writing to each in turn: puts' latency and
server CPU under the same load.

bench/build_ab.py runs one build after the other, a fresh cluster each; on this shared machine the
load moves between two runs more than a small change moves the figures (per-round ratios of one
pair of builds from 0.7x to 2.6x). Here both builds' 3-node clusters (as bench/vs_etcd makes them)
run side by side for the whole run, and one SDK client alternates between them in short blocks of
puts (the order flipping every block), so each pair of blocks sees nearly the same load; the idle
cluster meanwhile only sends heartbeats. Reported per build: latency p50/p90 over all blocks,
puts/s (block wall time), server CPU per put (the three nodes' user + system CPU from /proc); and
per pair of blocks, head's median latency over base's: in how many pairs head was faster, and the
median ratio.

    .venv/bin/python -m bench.paired_ab --base-rev main --head-rev HEAD --blocks 40
    .venv/bin/python -m bench.paired_ab --base-rev main --head /tmp/tree -c 16 --runs 2
    .venv/bin/python -m bench.paired_ab --base-rev main -c 16 --batch 100   # vs_etcd's txn-b100-c16

With `--batch N` every call is one write of N KvPuts (bench/vs_etcd's txn case): latency is per call,
puts/s and server CPU per put count each KvPut.

The client is this checkout's SDK for both builds by default, so a change to the SDK is invisible.
With `--own-clients` each build is driven by its own tree's SDK instead: a client process per build
(`python -c` in that tree, so its `epochlog.client` is imported), told block by block what to put,
and the table gains each build's client CPU per put (that process's user + system CPU from /proc).

    .venv/bin/python -m bench.paired_ab --base-rev main --head . --own-clients --blocks 30 --runs 2 --no-write

A run's clusters are new (their leaders land where elections put them), so repeat it (`--runs`)
before reading a difference of a few percent. Writes section `--section` of bench/RESULTS.md unless
--no-write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.build_ab import add_build_args, builds_of
from bench.node_load import cpu_of, key_for, make_values
from bench.results import write_section
from bench.vs_etcd import epochlog_config, free_ports, log, wait_settled
from epochlog.client import AsyncClient
from statemachines.events import KvPut

WARMUP_PUTS = 300

# The client process of `--own-clients`, run with its build's tree as the working directory (first on the
# path): one JSON line per command on stdin, one JSON line per answer on stdout. Kept to what every tree
# has (the SDK, bench/node_load.py's keys and values), since the base tree may be an old revision.
OWN_CLIENT = """
import asyncio, json, sys, time
from bench.node_load import key_for, make_values
from epochlog.client import AsyncClient
from statemachines.events import KvPut

async def main() -> None:
    client = AsyncClient(sys.argv[1].split(","), timeout=10)
    values = make_values()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        order = json.loads(line)
        todo = iter(range(order["first"], order["first"] + order["puts"]))
        lat = []
        batch = order["batch"]

        async def worker() -> None:
            for i in todo:
                t0 = time.perf_counter_ns()
                if batch == 1:
                    await client.put(key_for(i), values[i % len(values)])
                else:
                    await client.commands([KvPut(name=key_for(i * batch + j), value=values[(i * batch + j) % len(values)])
                                           for j in range(batch)])
                lat.append(time.perf_counter_ns() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(order["conc"])))
        print(json.dumps({"lat": lat, "wall_s": time.perf_counter() - t0}), flush=True)
    await client.close()

asyncio.run(main())
"""


@dataclass
class Cluster:
    """One build's three `epochlog serve` processes."""

    endpoints: list[str]
    procs: list[subprocess.Popen[bytes]]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@dataclass
class Tally:
    """What one build did over a run."""

    latencies_ns: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0


class OwnClient:
    """A build's own SDK in a process of its own (`OWN_CLIENT`, `--own-clients`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, tree: Path, endpoints: list[str]) -> OwnClient:
        return cls(await asyncio.create_subprocess_exec(
            sys.executable, "-c", OWN_CLIENT, ",".join(endpoints), cwd=tree, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE))

    async def puts(self, first: int, puts: int, conc: int, batch: int) -> tuple[list[int], float]:
        """Latencies (ns) and wall time (s) of `puts` calls as `block` makes them, in the client process."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"first": first, "puts": puts, "conc": conc, "batch": batch}).encode() + b"\n")
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process {self.proc.pid} ended (exit {await self.proc.wait()})")
        answer = json.loads(line)
        return answer["lat"], answer["wall_s"]

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def start(tree: Path, data: Path) -> Cluster:
    data.mkdir(parents=True)
    config = data / "cluster.toml"
    endpoints = epochlog_config(config, free_ports(6))
    cluster = Cluster(endpoints, [])
    try:
        for i in (1, 2, 3):
            cluster.procs.append(subprocess.Popen(
                [sys.executable, "-m", "epochlog", "serve", "--config", str(config), "--node-id", str(i),
                 "--data-dir", str(data / f"node-{i}")], cwd=tree, stdout=subprocess.PIPE,
                stderr=open(data / f"node-{i}.log", "wb")))
        for p in cluster.procs:
            assert p.stdout is not None
            line = p.stdout.readline().decode()
            if not line.startswith("READY"):
                raise RuntimeError(f"a node of {tree} did not start: {line!r}")
        wait_settled(data)
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def block(client: AsyncClient | OwnClient, cluster: Cluster, tally: Tally, first: int, puts: int, conc: int,
                values: list[bytes], batch: int) -> float:
    """`puts` calls by `conc` workers (a put each, or a write of `batch` KvPuts); their median latency (ns)."""
    if isinstance(client, OwnClient):
        pids = [*cluster.pids, client.proc.pid]
        cpu0 = cpu_of(pids)
        lat, wall_s = await client.puts(first, puts, conc, batch)
        cpu1 = cpu_of(pids)
        tally.wall_s += wall_s
        tally.server_cpu_s += sum(cpu1.get(p, 0.0) - cpu0.get(p, 0.0) for p in cluster.pids)
        tally.client_cpu_s += cpu1.get(client.proc.pid, 0.0) - cpu0.get(client.proc.pid, 0.0)
        tally.latencies_ns += lat
        return statistics.median(lat)
    todo = iter(range(first, first + puts))
    lat: list[int] = []

    async def worker() -> None:
        for i in todo:
            t0 = time.perf_counter_ns()
            if batch == 1:
                await client.put(key_for(i), values[i % len(values)])
            else:
                await client.commands([KvPut(name=key_for(i * batch + j), value=values[(i * batch + j) % len(values)])
                                       for j in range(batch)])
            lat.append(time.perf_counter_ns() - t0)

    cpu0 = sum(cpu_of(cluster.pids).values())
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    tally.wall_s += time.perf_counter() - t0
    tally.server_cpu_s += sum(cpu_of(cluster.pids).values()) - cpu0
    tally.latencies_ns += lat
    return statistics.median(lat)


async def one_run(trees: dict[str, Path], scratch: Path, blocks: int, puts: int, conc: int, batch: int,
                  own_clients: bool = False) -> str:
    clusters: dict[str, Cluster] = {}
    clients: dict[str, AsyncClient | OwnClient] = {}
    try:
        for name, tree in trees.items():
            clusters[name] = start(tree, scratch / name)
        values = make_values()
        for n, c in clusters.items():
            if own_clients:
                clients[n] = own = await OwnClient.start(trees[n], c.endpoints)
                await own.puts(10**7, WARMUP_PUTS, 1, 1)
            else:
                clients[n] = sdk = AsyncClient(c.endpoints, timeout=10)
                for i in range(WARMUP_PUTS):
                    await sdk.put(key_for(10**7 + i), values[i % len(values)])
        tallies = {n: Tally() for n in clients}
        ratios: list[float] = []
        load0 = float(Path("/proc/loadavg").read_text().split()[0])
        for b in range(blocks):
            medians = {}
            for n in (("base", "head") if b % 2 == 0 else ("head", "base")):
                medians[n] = await block(clients[n], clusters[n], tallies[n], b * puts, puts, conc, values, batch)
            ratios.append(medians["head"] / medians["base"])
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
    finally:
        for client in clients.values():
            await client.close()
        for c in clusters.values():
            c.stop()
    cells = []
    for n in ("base", "head"):
        t = tallies[n]
        s = sorted(t.latencies_ns)
        cells.append(f"{s[len(s) // 2] / 1e6:.2f} / {s[int(len(s) * 0.9)] / 1e6:.2f} | "
                     f"{len(s) * batch / t.wall_s:,.0f} | {t.server_cpu_s / (len(s) * batch) * 1e6:,.0f}"
                     + (f" | {t.client_cpu_s / (len(s) * batch) * 1e6:,.0f}" if own_clients else ""))
    b, h = tallies["base"], tallies["head"]
    cpu = (h.server_cpu_s / len(h.latencies_ns)) / (b.server_cpu_s / len(b.latencies_ns))
    return (f"| {cells[0]} | {cells[1]} | {sum(r < 1 for r in ratios)} of {len(ratios)}, "
            f"{statistics.median(ratios):.2f} | {cpu:.2f} | {load0:.1f}, {load1:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_args(ap)
    ap.add_argument("-c", "--concurrency", type=int, default=1, help="puts in flight per block")
    ap.add_argument("--blocks", type=int, default=40, help="blocks per build and run")
    ap.add_argument("--block-puts", type=int, default=0,
                    help="calls per block (default: 100, 50 per worker with -c, 4 per worker with --batch)")
    ap.add_argument("--batch", type=int, default=1,
                    help="KvPuts per call: 1 a put each, N one write of N (vs_etcd's txn case: 100)")
    ap.add_argument("--runs", type=int, default=1, help="runs, each with new clusters")
    ap.add_argument("--section", default="paired-ab", help="the bench/RESULTS.md section written")
    ap.add_argument("--own-clients", action="store_true",
                    help="drive each build with its own tree's SDK, in a client process per build (default: this "
                         "checkout's SDK, in this process, for both)")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    if args.batch < 1:
        ap.error("--batch is at least 1")
    puts = args.block_puts or (4 * args.concurrency if args.batch > 1 else
                               100 if args.concurrency == 1 else 50 * args.concurrency)
    scratch = Path(tempfile.mkdtemp(prefix="paired-ab-"))
    rows = []
    try:
        trees = builds_of(ap, args, scratch)
        for r in range(args.runs):
            rows.append(asyncio.run(one_run(trees, scratch / f"run-{r}", args.blocks, puts, args.concurrency,
                                            args.batch, args.own_clients)))
            log(f"run {r + 1}: {rows[-1]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    client = " | {} client CPU us/put" if args.own_clients else ""
    body = "\n".join([
        f"| base p50 / p90 ms | base puts/s | base server CPU us/put{client.format('base')} | head p50 / p90 ms | "
        f"head puts/s | head server CPU us/put{client.format('head')} | block pairs head faster, median head/base | "
        "server CPU head/base | load avg 1 min (start, end) |",
        "|---:|---:|---:|" + "---:|" * bool(client) + "---:|---:|---:|" + "---:|" * bool(client) + "---|---:|---|",
        *rows, "",
        f"base: {args.base_rev or trees['base']}, head: {args.head_rev or trees['head']}. One row per run: both "
        f"builds' clusters up at once, {args.blocks} blocks of {puts} "
        f"{'puts' if args.batch == 1 else f'writes of {args.batch} KvPuts'} with {args.concurrency} in flight per "
        "build, alternating (bench/paired_ab.py)" + ("." if args.batch == 1 else "; puts/s and CPU per put count each KvPut.")
        + (" Each build driven by its own tree's SDK (--own-clients)." if args.own_clients else "")])
    print(body)
    if not args.no_write:
        write_section(args.section, body, command="python -m bench.paired_ab " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
