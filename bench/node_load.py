"""Bounded asyncio load generator for an Epochlog cluster through the Python SDK (AsyncClient).

The twin of ../shared/anchors/etcd/etcd_load.py, so the two systems are loaded the same way: the
same metadata-like JSON values (142-148 bytes), the same keys, one client process, `--concurrency`
calls in flight over one connection per node, `--n` measured requests after `--warmup`.

Workloads:
  put   one KvPut per call
  txn   one call carrying --batch KvPuts (etcd: one Txn of --batch puts)
  get   a point read of one hot key; --consistency linearizable (etcd's default) or local
        (etcd's serializable)

Writes go through the SDK's client sessions (exactly once); `--no-sessions` sends UUIDv7 request ids
instead (bench/sessions_cost.py compares the two).

Prints ONE JSON line: ops/s, rpc/s, latency percentiles (ms), client and server CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import time
from collections import Counter

from bench.proc_cpu import process_cpu
from epochlog.client import AsyncClient, ClientError


def make_values(count: int = 1024) -> list[bytes]:
    """Metadata-like JSON values, 142-148 bytes each (as the etcd anchor's load generator)."""
    vals = []
    for i in range(count):
        if i % 2 == 0:
            doc: dict[str, object] = {
                "id": i, "host": f"broker-{i:05d}.kafka.svc.cluster.local", "port": 9092,
                "rack": f"rack-{i % 7}", "epoch": 1000 + i, "listeners": ["PLAINTEXT", "SSL"], "status": "online"}
        else:
            doc = {"name": f"topic-{i:06d}", "partitions": 12 + i % 48, "replication": 3,
                   "leader": i % 5, "isr": [i % 5, (i + 1) % 5, (i + 2) % 5],
                   "config": {"retention.ms": 604800000, "cleanup.policy": "delete"}}
        vals.append(json.dumps(doc, separators=(",", ":")).encode())
    return vals


def key_for(i: int) -> str:
    return f"brokers/{i}" if i % 2 == 0 else f"topics/{i}"


def percentiles(lat_ns: list[int]) -> dict[str, float]:
    if not lat_ns:
        return {}
    s = sorted(lat_ns)

    def pick(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] / 1e6, 3)

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "p999": pick(0.999),
            "max": round(s[-1] / 1e6, 3), "mean": round(sum(s) / len(s) / 1e6, 3)}


def cpu_of(pids: list[int]) -> dict[int, float]:
    """User+system CPU seconds of each process still running."""
    return {pid: cpu for pid in pids if (cpu := process_cpu(pid)) is not None}


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(args: argparse.Namespace) -> dict[str, object]:
    from statemachines.events import KvPut

    client = AsyncClient(args.endpoints, timeout=args.rpc_timeout, sessions=not args.no_sessions)
    values = make_values()
    batch = args.batch

    async def one(i: int) -> None:
        if args.workload == "put":
            await client.put(key_for(i), values[i % len(values)])
        elif args.workload == "txn":
            base = i * batch
            await client.commands([KvPut(name=key_for(base + j), value=values[(base + j) % len(values)])
                                   for j in range(batch)])
        else:
            await client.get("topics/hot", consistency=args.consistency)

    # The cluster may still be electing: one write (retried by the SDK) before anything is measured.
    await client.put("topics/hot", values[1])
    warm = min(args.warmup, args.n)
    for s in range(0, warm, max(1, args.concurrency)):
        await asyncio.gather(*(one(args.n * max(1, batch) + k) for k in range(s, min(warm, s + args.concurrency))),
                             return_exceptions=True)   # warm-up failures are not measured

    lat_ns: list[int] = []
    errors: Counter[str] = Counter()
    next_i = 0
    deadline = time.monotonic() + args.max_seconds

    async def worker() -> None:
        nonlocal next_i
        while next_i < args.n and time.monotonic() < deadline:
            i = next_i
            next_i += 1
            t0 = time.perf_counter_ns()
            try:
                await one(i)
            except ClientError as exc:
                errors[exc.code] += 1
                if sum(errors.values()) > args.max_errors:
                    return
                continue
            lat_ns.append(time.perf_counter_ns() - t0)

    server_pids = [int(p) for p in args.server_pids.split(",") if p] if args.server_pids else []
    cpu0, srv0, t0 = self_cpu(), cpu_of(server_pids), time.monotonic()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    wall = time.monotonic() - t0
    cpu1, srv1 = self_cpu(), cpu_of(server_pids)
    await client.close()
    ok = len(lat_ns)
    server_cpu = {str(p): round(srv1[p] - srv0.get(p, 0.0), 2) for p in srv1}
    return {
        "system": "epochlog",
        "label": args.label or f"{args.workload}-c{args.concurrency}"
                 + (f"-b{batch}" if args.workload == "txn" else "")
                 + (f"-{args.consistency}" if args.workload == "get" else ""),
        "workload": args.workload, "concurrency": args.concurrency,
        "batch": batch if args.workload == "txn" else 1,
        "consistency": args.consistency if args.workload == "get" else None,
        "requests_planned": args.n, "requests_ok": ok, "errors": dict(errors),
        "stopped_by": "time" if next_i < args.n else "count",
        "rpc_per_s": round(ok / wall, 1),
        "ops_per_s": round(ok * (batch if args.workload == "txn" else 1) / wall, 1),
        "latency_ms": percentiles(lat_ns),
        "wall_s": round(wall, 2),
        "client_cpu_s": round(cpu1 - cpu0, 2),
        "server_cpu_s": server_cpu,
        "client_cpu_us_per_rpc": round(1e6 * (cpu1 - cpu0) / ok, 1) if ok else None,
        "server_cpu_us_per_rpc": round(1e6 * sum(server_cpu.values()) / ok, 1) if ok and server_cpu else None,
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoints", required=True, help="comma-separated client addresses host:port")
    ap.add_argument("--workload", choices=("put", "txn", "get"), required=True)
    ap.add_argument("--n", type=int, default=10000, help="requests in the measured phase")
    ap.add_argument("--concurrency", "-c", type=int, default=16, help="calls in flight")
    ap.add_argument("--batch", "-b", type=int, default=10, help="puts per call (txn workload)")
    ap.add_argument("--consistency", choices=("linearizable", "lease", "local"), default="linearizable")
    ap.add_argument("--max-seconds", type=float, default=60)
    ap.add_argument("--rpc-timeout", type=float, default=10)
    ap.add_argument("--max-errors", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--server-pids", default="", help="comma-separated node pids, to account server CPU")
    ap.add_argument("--label")
    ap.add_argument("--uvloop", action="store_true", help="run the client on uvloop")
    ap.add_argument("--no-sessions", action="store_true",
                    help="writes carry UUIDv7 request ids instead of client-session fields (bench/sessions_cost.py)")
    args = ap.parse_args()
    if args.uvloop:
        import uvloop
        uvloop.install()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
