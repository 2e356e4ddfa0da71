"""Benchmark of the Delta export and the audit (spark/): a live 3-node cluster, local and S3 tables.

    python -m bench.export_bench [--live 1000000,10000000] [--targets local,s3,offline] [--audit 10000000]
                                 [--audit-live] [--no-serving] [--master local[2]] [--keys K] [--dir DIR]
                                 [--no-results]

1. live      for each N of --live: a real 3-node cluster (`epochlog serve` processes on 127.0.0.1,
             tests.support.nodes), loaded with N kv puts (64-byte values over K keys) through the SDK
             (AsyncClient.commands, 2,000-event writes, 8 in flight: every event a committed, applied
             KvPut); then, once the nodes are back to their idle CPU, `export_once` (what `epochlog
             export` runs: ranges spread over the three members, read through the SDK's read_log) into
             a fresh table for each of --targets in order, each just after a warm-up export of 20,000
             offsets to the same kind of target (unless --cold: Spark ends Python workers idle for a
             minute, so the first export after the load would start them): local (a directory), s3 (moto's server mode
             on 127.0.0.1, tests/spark/s3_server.py), offline (node 1's segment files into a directory),
             on one warm SparkSession. Reported: events/s, the load, and the CPU seconds of each process
             role (nodes, JVM, Python workers, driver, moto) and its busiest threads per phase
             (bench/proc_cpu.py, JSON lines); unless --no-serving, what serving every event to one reader
             costs a follower through read_events and through read_log (`serving_cost`). --audit-live:
             the audit questions (below) on the largest run's first local table.
2. audit     N events generated offline into segment files (tests/spark/synthetic.py) and exported; then
             `history KEY` and `state --offset M --prefix P` (1% of the keys) at the table as
             exported, after `table optimize` clusters it by key, and after state checkpoints
             (every N/4 offsets): seconds (first and median of the next 3, warm session) and the
             files each question read.

The machine is shared (2 cores): the run reports the load of other processes at the start and per phase.
Results: stdout and the `export` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import bench.results as bench_results
from bench import proc_cpu
from bench.log_bench import machine_busy_seconds, wait_quiet

T = TypeVar("T")
RANGE_OFFSETS = 250_000
WARM_OFFSETS = 20_000   # a warm-up export: 4 ranges, so each of local[2]'s task slots starts its workers
BATCH = 2000        # events per write (a write's events must fit the group's batch limit, 1 MiB)
IN_FLIGHT = 8       # writes outstanding (16,000 events: at 2,000 events/s on a saturated machine an answer
                    # still comes within the client's attempt time, so writes are not sent twice)


def log(msg: str) -> None:
    print(msg, flush=True)


def load(endpoints: list[str], events: int, keys: int) -> tuple[float, int]:
    """Write `events` kv puts through the SDK; (seconds taken, writes the bench sent again).

    The fastest write path the product has for events that stay events (one KvPut record each; a `Txn` would
    make one record of up to 128 puts): `AsyncClient.commands` of BATCH events with IN_FLIGHT calls
    outstanding, so the leader always has the next entries to replicate while the previous ones commit
    and apply. Each event carries its own request id, so a retry after a leader change is answered from
    its first outcome; every write must come back applied."""
    import asyncio

    from epochlog.client import AsyncClient, ClientError
    from statemachines import events as ev
    from statemachines.request_ids import uuid7

    pad = b"x" * 56
    next_event = 0
    retried = 0

    async def writer(client: AsyncClient) -> None:
        nonlocal next_event, retried
        while next_event < events:
            base = next_event
            n = min(BATCH, events - base)
            next_event += n
            batch = [ev.KvPut(name=f"k/{(base + i) * 7919 % keys:08d}", value=b"%08d" % (base + i) + pad,
                              request_id=uuid7()) for i in range(n)]
            for attempt in range(10):
                try:
                    results = await client.commands(batch)
                    break
                except ClientError as exc:
                    # A leader change on the loaded machine: the same request ids again (the node
                    # answers a retry of a committed request without applying it twice, but the
                    # retry is a record too: the export counts rows, not N).
                    if not exc.retriable or attempt == 9:
                        raise
                    retried += 1
                    await asyncio.sleep(0.5)
            failed = [r for r in results if not r.ok]
            assert not failed, f"{len(failed)} puts not applied: {failed[0]}"

    async def run() -> None:
        async with AsyncClient(endpoints, timeout=60, sessions=False, name="bench-load") as client:
            await asyncio.gather(*(writer(client) for _ in range(IN_FLIGHT)))

    started = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - started, retried


def process_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes `pids` used so far (/proc/<pid>/stat)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every process below it (the nodes, moto, the Spark
    driver's JVM and its Python workers): the export's own cost, whatever other processes on the shared
    machine use. Each process counts its own time and that of its children it reaped (a live child
    counts for itself), so nothing is counted twice."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue   # exited meanwhile
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / tick   # utime stime cutime cstime
    me = os.getpid()

    def below_me(pid: int) -> bool:
        while pid > 1 and pid != me:
            pid = parent.get(pid, 0)
        return pid == me
    return sum(seconds for pid, seconds in cpu.items() if below_me(pid))


def serving_cost(cluster: Any) -> dict[str, tuple[float, float]]:
    """What serving the export's reads costs a follower: every committed kv record read from one follower
    in this process (no Spark) through `read_events` (records decoded and re-encoded by the node, 5,000
    a call, as the export read before read_log) and through `read_log` (batches as stored, decoded here
    as the export's executors decode them). Per call: (events/s, the node's CPU seconds per 1M events)."""
    from epochlog.client import Client
    from eventlog.offline import decode_batches

    leader = cluster.leader("kv")
    follower = next(i for i in sorted(cluster.nodes) if i != leader)
    endpoint, pid = cluster.endpoint(follower), cluster.nodes[follower].pid
    out = {}
    with Client([endpoint], timeout=30, sessions=False) as client:
        end = client.read_events("kv", 1 << 62, max_events=1, endpoint=endpoint).commit_offset + 1
        cluster.wait_applied(follower, "kv", end - 1, timeout=120)

        def by_events() -> int:
            offset, rows = 0, 0
            while offset < end:
                got = client.read_events("kv", offset, max_events=5000, max_bytes=4 << 20, endpoint=endpoint)
                rows += len(got.events)
                offset = got.next_offset
            return rows

        def by_batches() -> int:
            offset, rows = 0, 0
            while offset < end:
                got = client.read_log("kv", offset, max_bytes=4 << 20, endpoint=endpoint)
                rows += len(decode_batches(got.data, offset, end, applied=frozenset(got.noops))[0])
                offset = got.next_offset
            return rows

        for name, read in (("read_events", by_events), ("read_log", by_batches)):
            wait_quiet(10, log)
            cpu, t = process_cpu_seconds([pid]), time.perf_counter()
            rows = read()
            seconds, cpu = time.perf_counter() - t, process_cpu_seconds([pid]) - cpu
            out[name] = (rows / seconds, cpu / rows * 1e6)
            log(f"  {name} from follower {follower}: {rows:,} events in {seconds:.1f} s ({rows / seconds:,.0f}/s), "
                f"the node used {cpu:.1f} CPU s ({cpu / rows * 1e6:.2f} s per 1M events)")
    return out


def role_of(cluster: Any, s3: Any) -> Callable[[int, str, str | None], str | None]:
    """The roles of the processes below the bench (bench.proc_cpu): the three nodes, moto's S3 server, the
    Spark driver's JVM and the Python workers below it (pyspark's daemon and the workers it forks)."""
    nodes = {node.pid for node in cluster.nodes.values() if node.pid is not None}
    moto = s3.proc.pid if s3.proc is not None else None

    def role(pid: int, comm: str, above: str | None) -> str | None:
        if pid in nodes:
            return "nodes"
        if pid == moto:
            return "s3"
        if comm == "java":
            return "jvm"
        if above in ("jvm", "workers"):
            return "workers"
        return None
    return role


def phase(name: str, n: int, roles: Callable[[int, str, str | None], str | None], run: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """Run one phase of a live run; its result and its record (one JSON line): seconds, the load average
    before it, how busy the machine was during it, and the CPU seconds of each role and its busiest threads."""
    load_avg = os.getloadavg()
    before, busy, t = proc_cpu.snapshot(roles), machine_busy_seconds(), time.perf_counter()
    result = run()
    seconds = time.perf_counter() - t
    used = proc_cpu.snapshot(roles).delta(before)
    record = {"phase": name, "n": n, "s": round(seconds, 1), "load_avg": [round(x, 1) for x in load_avg],
              "machine_busy_cores": round((machine_busy_seconds() - busy) / seconds, 2), **used.summary()}
    log("  " + json.dumps(record))
    return result, record


def nodes_cores(roles: Callable[[int, str, str | None], str | None], seconds: float) -> float:
    """The cores the nodes used together over the next `seconds`."""
    before = proc_cpu.snapshot(roles).roles.get("nodes", 0.0)
    time.sleep(seconds)
    return (proc_cpu.snapshot(roles).roles.get("nodes", 0.0) - before) / seconds


def settle(roles: Callable[[int, str, str | None], str | None], idle: float, max_wait: float) -> float:
    """Wait (bounded) until the nodes are back to what they used idle before the load (`idle` cores: ticks
    and heartbeats), within 0.03 cores plus half of it, over 3 s. Whatever a node still does after the last
    write was applied (views flushing and compacting, a snapshot) is then over before an export starts, so
    that export is not charged for it. Seconds waited."""
    t = time.perf_counter()
    while time.perf_counter() - t < max_wait and nodes_cores(roles, 3.0) > 1.5 * idle + 0.03:
        pass
    return time.perf_counter() - t


def live(spark: Any, base: Path, n: int, keys: int, s3: Any, targets: list[str], audit_live: bool,
         serving: bool, warm: bool) -> dict[str, Any]:
    """Load a fresh cluster with `n` events, then export them to each of `targets` in turn (a fresh table
    each, the nodes quiet before each, with `warm` a small warm-up export just before); with `audit_live`,
    the audit questions on the first local table."""
    from spark.export import export_once
    from spark.sources import ClusterSource, OfflineSource
    from spark.storage import TableLocation
    from tests.support.nodes import NodeCluster

    # Election timeouts of 2-4 s (40 ticks of 50 ms): on this shared, loaded machine the default 0.5-1 s
    # elects new leaders during the load for no other reason than scheduling delays.
    # Retention above N and kv truncated rather than key-compacted: the export is the table's first, and a
    # deployment's first export registers its watermark only after it (kv is key-compacted by default).
    cluster = NodeCluster(base / f"cluster-{n}", size=3, seed=n, log={"segment_bytes": 64 << 20},
                          raft={"election_timeout_ticks": 40},
                          compaction={"retain_offsets": 2 * n, "compact_groups": ["metadata"]})
    try:
        cluster.start()
        cluster.leader("kv")
        roles = role_of(cluster, s3)
        idle = nodes_cores(roles, 5.0)
        log(f"the nodes idle: {idle:.3f} cores")
        (load_s, retried), rec = phase("load", n, roles, lambda: load(cluster.endpoints, n, keys))
        phases = [rec]
        log(f"{n:,} events: loaded into the cluster in {load_s:.1f} s ({n / load_s:,.0f}/s; {retried} writes sent "
            f"again by the bench)")
        settled, rec = phase("settle after load", n, roles, lambda: settle(roles, idle, 600))
        phases.append(rec)
        source = ClusterSource(tuple(cluster.endpoints), 30.0, ("kv",))
        out: dict[str, Any] = {"n": n, "load": load_s, "settle": settled, "idle": idle, "serving": serving_cost(cluster) if serving else None,
                               "phases": phases, "targets": []}
        # The same events from node 1's segment files (the offline reader, no serving node) into a local
        # table: what the live export costs beyond decoding and writing.
        offline = OfflineSource.discover(cluster.nodes[1].data_dir, ("kv",))
        for i, name in enumerate(targets):
            table = base / f"{name}-{n}-{i}"
            loc, src = {"local": (TableLocation.parse(table), source),
                        "s3": (TableLocation.parse(f"s3://bench/live-{n}-{i}", environ=s3.env), source),
                        "offline": (TableLocation.parse(table), offline)}[name]
            settle(roles, idle, 120)
            other = wait_quiet(30, log)
            if warm:
                # Spark ends a Python worker idle for a minute (PythonWorkerFactory), so after the load every
                # worker is gone and the first export would pay for starting and importing them, and for the
                # JIT of its code paths: a small export of the same source to the same kind of target first,
                # its cost a phase of its own.
                scratch = TableLocation.parse(base / f"warm-{n}-{i}") if name != "s3" else \
                    TableLocation.parse(f"s3://bench/warm-{n}-{i}", environ=s3.env)
                _, rec = phase(f"warm-up for {name}", n, roles, lambda: export_once(
                    spark, scratch, src, range_offsets=WARM_OFFSETS // 4, max_offsets=WARM_OFFSETS))
                phases.append(rec)
                shutil.rmtree(base / f"warm-{n}-{i}", ignore_errors=True)
            tree = tree_cpu_seconds()
            result, rec = phase(f"export to {name}", n, roles,
                                lambda: export_once(spark, loc, src, range_offsets=RANGE_OFFSETS))
            phases.append(rec)
            assert result.rows >= n, (result.rows, n)
            seconds, cpu = rec["s"], tree_cpu_seconds() - tree
            out["rows"] = result.rows
            out["targets"].append({"target": name, "s": seconds, "other": other, "cpu": cpu,
                                   "nodes_cpu": rec["cpu_s"].get("nodes", 0.0), "busy": rec["machine_busy_cores"],
                                   "load_avg": rec["load_avg"][0], "roles": rec["cpu_s"]})
            log(f"  export to {name}: {result.rows:,} rows in {seconds:.1f} s, {result.rows / seconds:,.0f} events/s "
                f"({len(result.plan.ranges())} ranges over 3 members; other processes {other:.2f} cores before it; "
                f"the machine busy {rec['machine_busy_cores']:.2f} cores during it; the export's processes {cpu:.1f} "
                f"CPU s: {rec['cpu_s']})")
            if audit_live and name == "local" and "audit" not in out:
                out["audit"] = audit_table(spark, table, n, keys, int(source.bounds()["kv"][1] * 0.95))
            shutil.rmtree(table, ignore_errors=True)
        return out
    finally:
        cluster.close()
        shutil.rmtree(base / f"cluster-{n}", ignore_errors=True)


def timed(fn: Any, repeat: int = 3) -> tuple[float, float, Any]:
    """(first call seconds, median of `repeat` more, last result)."""
    t = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        runs.append(time.perf_counter() - t)
    return first, statistics.median(runs), result


def questions(spark: Any, table: Path, point: int, keys: int) -> dict[str, Any]:
    from spark.audit import Audit, Point
    from spark.table import resolve

    a = Audit(spark, resolve(table))
    prefix = "kv/k/" + "0" * (8 - len(str(max(1, keys // 100) - 1)))   # about 1% of the keys
    out: dict[str, Any] = {"files": len(a.snapshot.files)}
    out["h_first"], out["h_median"], rows = timed(lambda: a.history("kv/k/00000001"))
    out["h_rows"], out["h_files"] = len(rows), a.files_read
    out["s_first"], out["s_median"], rows = timed(lambda: a.state(Point(group="kv", offset=point), prefix))
    out["s_rows"], out["s_files"], out["s_checkpoint"] = len(rows), a.files_read, a.checkpoint_used
    return out


def audit(spark: Any, base: Path, n: int, keys: int) -> dict[str, Any]:
    from spark.export import export_once
    from spark.sources import OfflineSource
    from tests.spark.synthetic import write_group

    data, table = base / f"data-{n}", base / f"audit-{n}"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)
    write_group(data, "kv", n, batch_records=1000, keys=keys, seed=1)
    source = OfflineSource.discover(data)
    export_once(spark, table, source, range_offsets=RANGE_OFFSETS)
    out = audit_table(spark, table, n, keys, int(source.bounds()["kv"][1] * 0.95))
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(table, ignore_errors=True)
    return out


def audit_table(spark: Any, table: Path, n: int, keys: int, point: int) -> dict[str, Any]:
    """The audit questions on a table of `n` events as it is, after clustering, after state checkpoints."""
    from spark.checkpoints import make_checkpoints
    from spark.maintenance import optimize_table
    from spark.storage import TableLocation

    out: dict[str, Any] = {"n": n}
    out["as_exported"] = questions(spark, table, point, keys)
    log(f"  audit as exported: {out['as_exported']}")
    t = time.perf_counter()
    optimize_table(table, cluster=True)
    out["cluster_s"] = time.perf_counter() - t
    out["clustered"] = questions(spark, table, point, keys)
    log(f"  clustered in {out['cluster_s']:.1f} s: {out['clustered']}")
    t = time.perf_counter()
    made = make_checkpoints(spark, TableLocation.parse(table), max(1, n // 4))
    out["checkpoint_s"], out["checkpoints"] = time.perf_counter() - t, len(made)
    out["checkpointed"] = questions(spark, table, point, keys)
    log(f"  {len(made)} checkpoints in {out['checkpoint_s']:.1f} s: {out['checkpointed']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", default="1000000,10000000", help="Live-cluster export sizes, comma-separated.")
    parser.add_argument("--audit", default="10000000", help="Audit table sizes, comma-separated.")
    parser.add_argument("--targets", default="local,s3,offline",
                        help="Exports after each live load, in order (local, s3, offline; repeats allowed).")
    parser.add_argument("--audit-live", action="store_true",
                        help="The audit questions on the largest live run's first local table too.")
    parser.add_argument("--cold", action="store_true",
                        help="No warm-up export before each measured one (the first after the load then starts "
                             "Spark's Python workers).")
    parser.add_argument("--no-serving", action="store_true", help="Skip the serving cost (reads without Spark).")
    parser.add_argument("--keys", type=int, default=100_000, help="Distinct kv keys.")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, default=Path("bench/out/export"))
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args(argv)
    live_sizes = [int(s) for s in args.live.split(",") if s.strip()]
    audit_sizes = [int(s) for s in args.audit.split(",") if s.strip()]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    base = args.dir.resolve()
    base.mkdir(parents=True, exist_ok=True)
    load_avg = os.getloadavg()
    other = wait_quiet(60, log)
    log(f"load average {load_avg[0]:.1f}/{load_avg[1]:.1f}/{load_avg[2]:.1f}; other processes used {other:.2f} "
        f"cores at the start")

    from spark.session import get_session
    from tests.spark.s3_server import S3Server

    t = time.perf_counter()
    spark = get_session(args.master, "epochlog-export-bench")
    session_s = time.perf_counter() - t
    s3 = S3Server().start()
    s3.create_bucket("bench")
    from spark.export import export_once
    from spark.sources import OfflineSource
    from tests.spark.synthetic import write_group

    warm = base / "warm"
    write_group(warm, "kv", 20_000, keys=1000)
    t = time.perf_counter()
    export_once(spark, base / "warm-table", OfflineSource.discover(warm))
    log(f"SparkSession {session_s:.1f} s; first (cold) export of 20k events {time.perf_counter() - t:.1f} s")
    lives, audits = [], []
    try:
        for n in live_sizes:
            lives.append(live(spark, base, n, args.keys, s3, targets, args.audit_live and n == max(live_sizes),
                              not args.no_serving, not args.cold))
        for n in audit_sizes:
            log(f"audit at {n:,} events")
            audits.append(audit(spark, base, n, args.keys))
    finally:
        s3.stop()
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)

    md = [(f"Live export: a 3-node cluster on 127.0.0.1 (`epochlog serve` processes) loaded with N kv puts (64-byte "
           f"values, {args.keys:,} keys) through the SDK ({BATCH:,} events a write, {IN_FLIGHT} writes in flight), "
           f"then `export_once` (what `epochlog export` runs) on a warm Spark `{args.master}` session (start-up "
           f"{session_s:.1f} s), ranges of {RANGE_OFFSETS:,} offsets spread over the three members, one Delta "
           f"commit; to a local directory, to moto's S3 server on 127.0.0.1, and offline from node 1's segment "
           f"files to a local directory, in the order listed, each once the nodes were quiet"
           + ("" if args.cold else f" and just after a warm-up export of {WARM_OFFSETS:,} offsets of the same source "
                                   f"to the same kind of target (Spark's Python workers and JIT warm)")
           + f". Load average at the "
           f"start {load_avg[0]:.1f}/{load_avg[1]:.1f}/{load_avg[2]:.1f}."), "",
          "| events | load through the SDK | export | events/s | load average; other processes before; machine busy "
          "during | CPU s of the export's processes (nodes, JVM, Python workers, driver, moto) |",
          "|---|---|---|---|---|---|"]
    for r in lives:
        n, rows = r["n"], r["rows"]
        for i, x in enumerate(r["targets"]):
            roles = ", ".join(f"{role} {x['roles'].get(role, 0.0):.1f}" for role in ("nodes", "jvm", "workers", "driver", "s3"))
            md.append(f"| {n:,} ({rows:,} rows) | " + (f"{n / r['load']:,.0f}/s ({r['load']:.0f} s; nodes quiet "
                                                          f"{r['settle']:.0f} s later)" if i == 0 else "")
                      + f" | {x['target']} | {rows / x['s']:,.0f}/s ({x['s']:.1f} s) | {x['load_avg']:.1f}; "
                      f"{x['other']:.2f} cores; {x['busy']:.2f} cores | {x['cpu']:.1f} ({roles}) |")
    md += ["", ("Serving cost: every committed event read from one follower by one reader in the benchmark's "
                "process (no Spark), through `read_events` (the node decodes and re-encodes each record) and through "
                "`read_log` (whole batches as stored; the reader checks and decodes them): events/s and the node's "
                "CPU seconds per 1M events."), "", "| events | read_events | read_log |", "|---|---|---|"]
    for r in (r for r in lives if r["serving"]):
        md.append(f"| {r['n']:,} | " + " | ".join(f"{r['serving'][k][0]:,.0f}/s, node {r['serving'][k][1]:.2f} CPU s/1M"
                                                  for k in ("read_events", "read_log")) + " |")
    md += ["", ("Audit on a table of N offline-generated events (one day partition), warm session: seconds of the "
                "first question / median of the next 3, and files read of the table's files. `state` is at 95 % of "
                "the log with a 1 % key prefix."), "",
           "| events | layout | history KEY | state --offset --prefix |", "|---|---|---|---|"]
    for r in audits + [dict(r["audit"], live=True) for r in lives if "audit" in r]:
        for name, label in (("as_exported", "as exported"), ("clustered", f"clustered by key ({r['cluster_s']:.0f} s)"),
                            ("checkpointed", f"+ {r['checkpoints']} state checkpoints ({r['checkpoint_s']:.0f} s)")):
            q = r[name]
            md.append(f"| {r['n']:,}{' live' if r.get('live') else ''} | {label} | {q['h_first']:.2f} / {q['h_median']:.2f} s, {q['h_files']}/{q['files']} "
                      f"files ({q['h_rows']} rows) | {q['s_first']:.2f} / {q['s_median']:.2f} s, {q['s_files']}/"
                      f"{q['files']} files ({q['s_rows']} rows; checkpoint {q['s_checkpoint']}) |")
    md += ["", "Phases of the live runs (JSON lines: seconds, load average before, machine busy cores during, CPU "
                "seconds per role and each role's busiest threads):", "", "```",
           *(json.dumps(p) for r in lives for p in r["phases"]), "```"]
    body = "\n".join(md)
    print(body)
    if not args.no_results:
        bench_results.write_section("export", body,
                                    command="python -m bench.export_bench " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
