"""The SDK alone: CPU and latency per put of two builds' `AsyncClient`, against a node that answers at once.

A put's path through a real cluster is milliseconds of Raft, disk and wake-ups, so the SDK's own part
(tenths of a millisecond: uuid7, session bookkeeping, encoding, the loop turns from the reply to the
caller) drowns in it (bench/paired_ab.py --own-clients shows it, barely). Here one scripted node
(this module with `--serve`: hello, then every write answered `Written` in the same turn, no Raft, on
uvloop) serves two client processes, one per build, each importing its own tree's SDK (`python -c`
in that tree) and putting one key at a time; they alternate in blocks (the order flipping every
block), and each block reports its process CPU (time.process_time) per put and its median latency.
Reported per run: each build's median over blocks, and per pair of blocks head over base: in how many
head was lower, and the median ratio. Placement on the cores differs between runs more than between
blocks, so look at several runs.

    .venv/bin/python -m bench.client_cost --base-rev main --runs 3
    .venv/bin/python -m bench.client_cost --base-rev main --head-rev HEAD --blocks 40 --block-puts 500

Writes section `--section` of bench/RESULTS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.build_ab import add_build_args, builds_of
from bench.results import write_section

WARMUP_PUTS = 300

# One client process of a build, run in that build's tree (first on the path): a number of puts per
# line on stdin, one JSON line [CPU us per put, median latency us] per block on stdout.
CLIENT = """
import asyncio, sys, time
from epochlog.client import AsyncClient

async def main() -> None:
    client = AsyncClient([sys.argv[1]], timeout=10)
    value = b"v" * 100
    for i in range(int(sys.argv[2])):
        await client.put(f"warm/{i}", value)
    print("[]", flush=True)
    for line in sys.stdin:
        n = int(line)
        lat = []
        cpu0 = time.process_time()
        for i in range(n):
            t0 = time.perf_counter_ns()
            await client.put(f"k/{i}", value)
            lat.append(time.perf_counter_ns() - t0)
        cpu = time.process_time() - cpu0
        lat.sort()
        print(f"[{cpu / n * 1e6}, {lat[n // 2] / 1e3}]", flush=True)
    await client.close()

asyncio.run(main())
"""


def serve() -> None:
    """The scripted node: prints its port, then answers hellos and writes until killed."""
    import uvloop

    from epochlog.api import messages as p
    from epochlog.api.frames import ClientFrame, FrameDecoder, encode_frame, encode_frames

    class Answering(asyncio.Protocol):
        def __init__(self) -> None:
            self.decoder = FrameDecoder(ClientFrame)
            self.transport: Any = None
            self.offset = 0

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            replies = []
            for frame in self.decoder.feed(data):
                if isinstance(frame, p.ClientHello):
                    self.transport.write(encode_frame(p.ServerHello(p.PROTOCOL_VERSION, "bench", 1,
                                                                    election_timeout_ms=1000)))
                    continue
                for request in frame.requests:
                    call = request.call
                    if isinstance(call, p.Write):
                        results = []
                        for _ in call.events:
                            self.offset += 1
                            results.append(p.WriteResult(self.offset, "kv", True))
                        replies.append(p.Reply(request.id, result=p.Written(results)))
                    else:
                        replies.append(p.Reply(request.id, result=p.Done()))
            for out in encode_frames(replies, p.Replies):
                self.transport.write(out)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Answering, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    uvloop.install()
    asyncio.run(main())


def one_run(trees: dict[str, Path], blocks: int, puts: int) -> str:
    node = subprocess.Popen([sys.executable, "-m", "bench.client_cost", "--serve"], stdout=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1])
    clients: dict[str, subprocess.Popen[bytes]] = {}
    try:
        assert node.stdout is not None
        address = f"127.0.0.1:{int(node.stdout.readline())}"
        for name, tree in trees.items():
            clients[name] = subprocess.Popen([sys.executable, "-c", CLIENT, address, str(WARMUP_PUTS)], cwd=tree,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for c in clients.values():   # warmed up (a session opened, the code paths run)
            assert c.stdout is not None
            c.stdout.readline()
        load0 = float(Path("/proc/loadavg").read_text().split()[0])
        got: dict[str, list[tuple[float, float]]] = {n: [] for n in clients}
        for b in range(blocks):
            for n in (("base", "head") if b % 2 == 0 else ("head", "base")):
                c = clients[n]
                assert c.stdin is not None and c.stdout is not None
                c.stdin.write(f"{puts}\n".encode())
                c.stdin.flush()
                line = c.stdout.readline()
                if not line:
                    raise RuntimeError(f"the {n} client ended (exit {c.wait()})")
                cpu, p50 = json.loads(line)
                got[n].append((cpu, p50))
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
    finally:
        for c in clients.values():
            if c.stdin is not None:
                c.stdin.close()
        for c in clients.values():
            try:
                c.wait(20)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        node.kill()
        node.wait()
    cpu_ratio = [h[0] / b[0] for b, h in zip(got["base"], got["head"])]
    lat_ratio = [h[1] / b[1] for b, h in zip(got["base"], got["head"])]
    cells = [f"{statistics.median(x[0] for x in got[n]):.0f} | {statistics.median(x[1] for x in got[n]):.0f}"
             for n in ("base", "head")]
    return (f"| {cells[0]} | {cells[1]} | {sum(r < 1 for r in cpu_ratio)} of {blocks}, {statistics.median(cpu_ratio):.2f} "
            f"| {sum(r < 1 for r in lat_ratio)} of {blocks}, {statistics.median(lat_ratio):.2f} | {load0:.1f}, {load1:.1f} |")


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_args(ap)
    ap.add_argument("--blocks", type=int, default=30, help="blocks per build and run")
    ap.add_argument("--block-puts", type=int, default=300, help="puts per block")
    ap.add_argument("--runs", type=int, default=3, help="runs, each with new processes")
    ap.add_argument("--section", default="client-cost", help="the bench/RESULTS.md section written")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="client-cost-"))
    rows = []
    try:
        trees = builds_of(ap, args, scratch)
        for r in range(args.runs):
            rows.append(one_run(trees, args.blocks, args.block_puts))
            print(f"run {r + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    body = "\n".join([
        "| base client CPU us/put | base p50 us | head client CPU us/put | head p50 us | blocks head CPU lower, "
        "median head/base | blocks head p50 lower, median head/base | load avg 1 min (start, end) |",
        "|---:|---:|---:|---:|---|---|---|", *rows, "",
        f"base: {args.base_rev or trees['base']}, head: {args.head_rev or trees['head']}. One row per run: "
        f"{args.blocks} blocks of {args.block_puts} puts (one at a time) per build, alternating, against a node "
        "that answers at once (bench/client_cost.py); medians over blocks."])
    print(body)
    if not args.no_write:
        write_section(args.section, body, command="python -m bench.client_cost " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
