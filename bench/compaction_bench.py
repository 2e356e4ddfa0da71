"""Compaction benchmark: disk usage under endless overwrites, and put latency while compaction runs.

Two measurements, each on a FRESH single-node `epochlog serve` process (127.0.0.1, free ports, data in
a temporary directory that is removed afterwards):

    disk      overwrite `--keys` entities `--events` times through the SDK (batched `Write`s of
              `--batch` events, `--concurrency` calls in flight) and sample the node's disk every
              `--sample-s` seconds: per group the log directory, the views (RocksDB) and the
              snapshots, in allocated bytes (what `du` counts: preallocated segments included).
              The issue's QA case is `--keys 100 --events 600000 --kind offsets`; the "flat disk"
              case is `--keys 1000 --events 10000000`.
    latency   p99 of single puts (`--concurrency` callers, one KvPut per call) on a node with
              compaction off (baseline: no snapshots, no retention) and then on a node whose
              compaction runs all the time (a snapshot every few thousand entries, a short retention,
              pruning), each after the same pre-load of history.

    .venv/bin/python -m bench.compaction_bench disk --keys 100 --events 600000 --kind offsets
    .venv/bin/python -m bench.compaction_bench latency
    .venv/bin/python -m bench.compaction_bench all --flat-events 10000000 --write-results
        # the QA case (and with --before-root DIR, on an older checkout too), the flat-disk case,
        # the latency comparison; the section "compaction" of bench/RESULTS.md

`--server-root DIR` runs the node from another checkout of the repository (e.g. `git archive` of an
older revision) with this checkout's virtualenv: how the "before" figures were taken. `--config-extra
TOML` appends sections to the node's config. Every process started here is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("metadata", "offsets", "kv")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    for _ in range(500):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


def allocated_bytes(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (st_blocks, as `du` counts them)."""
    total = 0
    if not path.exists():
        return 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass   # deleted while we walked (a segment, an SST)
    return total


@dataclass
class Server:
    """One `epochlog serve` process on free ports, with its own data directory."""

    scratch: Path
    extra_config: str = ""
    segment_bytes: int = 64 << 20
    server_root: Path = ROOT
    cluster_extra: str = ""         # more [cluster] keys (snapshot_every_*)
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    data_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.scratch / "node-1"

    def start(self) -> None:
        peer, client = free_port(), free_port()
        self.address = f"127.0.0.1:{client}"
        config = self.scratch / "node.toml"
        config.write_text(
            "[cluster]\nname = \"bench\"\ngroups = [\"metadata\", \"offsets\", \"kv\"]\n" + self.cluster_extra + "\n"
            f"[[cluster.members]]\nid = 1\npeer_address = \"127.0.0.1:{peer}\"\nclient_address = \"{self.address}\"\n\n"
            f"[log]\nsegment_bytes = {self.segment_bytes}\n\n" + self.extra_config
            # plaintext client faces, said explicitly where the build has client TLS (on by default)
            + ("\n[clients.tls]\nenabled = false\n" if (self.server_root / "epochlog" / "face_tls.py").exists() else ""))
        if not (self.data_dir / "tls" / "node.crt").exists():   # peer TLS files (an older build ignores them)
            from epochlog.certs import ClusterCA

            ClusterCA.load_or_create(self.scratch / "ca", "bench").issue_member(1, self.data_dir / "tls")
        env = dict(os.environ)
        if self.server_root != ROOT:
            env["PYTHONPATH"] = str(self.server_root)
        out = open(self.scratch / "node.out", "wb")
        err = open(self.scratch / "node.err", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "epochlog", "serve", "--config", str(config),
                                      "--node-id", "1", "--data-dir", str(self.data_dir)],
                                     cwd=self.server_root, env=env, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while b"READY" not in (self.scratch / "node.out").read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node did not start:\n{(self.scratch / 'node.err').read_text()[-3000:]}")
            time.sleep(0.05)

    def sizes(self) -> dict[str, dict[str, int]]:
        out = {}
        for g in GROUPS:
            d = self.data_dir / "groups" / g
            out[g] = {"log": allocated_bytes(d / "log"), "views": allocated_bytes(d / "views"),
                      "snapshots": allocated_bytes(d / "snapshots")}
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU the node process used so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def _totals(sizes: dict[str, dict[str, int]]) -> dict[str, int]:
    return {kind: sum(g[kind] for g in sizes.values()) for kind in ("log", "views", "snapshots")}


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


async def _overwrite(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    from epochlog.client import AsyncClient
    from statemachines import events as ev

    client = AsyncClient(server.address, timeout=60.0)
    value = b"v" * args.value_bytes
    samples: list[dict[str, Any]] = []
    written = 0
    errors = 0
    started = time.monotonic()
    next_sample = started
    done = asyncio.Event()

    def event(i: int) -> ev.Event:
        k = i % args.keys
        if args.kind == "offsets":
            return ev.OffsetCommitted(consumer_group="bench", topic=f"topic-{k // 16}", queue_id=k % 16, offset=i)
        return ev.KvPut(name=f"bench/key-{k:06d}", value=value)

    async def sampler() -> None:
        nonlocal next_sample
        while not done.is_set():
            now = time.monotonic()
            if now >= next_sample:
                sizes = await asyncio.to_thread(server.sizes)
                samples.append({"t": round(now - started, 1), "events": written, **_totals(sizes)})
                next_sample = now + args.sample_s
            try:
                await asyncio.wait_for(done.wait(), max(0.05, next_sample - time.monotonic()))
            except TimeoutError:
                pass

    next_i = 0

    async def writer() -> None:
        nonlocal next_i, written, errors
        while next_i < args.events:
            i = next_i
            n = min(args.batch, args.events - i)
            next_i += n
            try:
                await client.commands([event(i + j) for j in range(n)])
                written += n
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors += 1
                if errors <= 3:
                    log(f"write failed: {exc!r}")
                await asyncio.sleep(0.1)

    sampling = asyncio.create_task(sampler())
    cpu0 = server.cpu_seconds()
    await asyncio.gather(*(writer() for _ in range(args.concurrency)))
    wrote_s = time.monotonic() - started
    cpu = server.cpu_seconds() - cpu0
    await asyncio.sleep(args.settle_s)   # let the last snapshot, truncation and pruning run
    done.set()
    await sampling
    final = await asyncio.to_thread(server.sizes)
    samples.append({"t": round(time.monotonic() - started, 1), "events": written, **_totals(final)})
    try:
        status = await client._call(_compaction_status_call(), group=None, leader=False)   # noqa: SLF001
    except Exception:  # noqa: BLE001 - an older node has no such call
        status = None
    await client.close()
    return {"events": written, "errors": errors, "seconds": round(wrote_s, 1),
            "events_per_s": round(written / wrote_s), "server_cpu_us_per_event": round(1e6 * cpu / max(1, written), 1),
            "samples": samples, "final": final, "status": _status_summary(status) or {}}


def run_disk(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="compaction-bench-", dir=args.scratch))
    server = Server(scratch, _extra(args), args.segment_bytes, Path(args.server_root), _cluster_extra(args))
    load0 = os.getloadavg()
    try:
        server.start()
        log(f"disk: {args.events:,} {args.kind} events over {args.keys} keys, batches of {args.batch}, "
            f"node {server.address}, data {server.data_dir}")
        result = asyncio.run(_overwrite(server, args))
    finally:
        code = server.stop()
        err_tail = (scratch / "node.err").read_text(errors="replace")[-2000:] if (scratch / "node.err").exists() else ""
        shutil.rmtree(scratch, ignore_errors=True)
    result.update({"label": args.label, "keys": args.keys, "kind": args.kind, "batch": args.batch,
                   "segment_bytes": args.segment_bytes, "exit_code": code, "load_before": load0,
                   "load_after": os.getloadavg(), "server_root": str(args.server_root)})
    if code not in (0, None):
        log(f"node exited with {code}:\n{err_tail}")
    return result


def _cluster_extra(args: argparse.Namespace) -> str:
    text = ""
    if args.snapshot_every_entries is not None:
        text += f"snapshot_every_entries = {args.snapshot_every_entries}\n"
    if args.snapshot_every_bytes is not None:
        text += f"snapshot_every_bytes = {args.snapshot_every_bytes}\n"
    return text


def _extra(args: argparse.Namespace) -> str:
    text = ""
    if args.config_extra:
        text = Path(args.config_extra).read_text()
    return text


def _table_step(samples: list[dict[str, Any]]) -> int:
    """disk_table shows every step-th sample (and the last), at most about 16 rows."""
    return max(1, len(samples) // 16)


def _thinned(samples: list[dict[str, Any]]) -> str:
    step = _table_step(samples)
    return "" if step == 1 else f"; 1 sample in {step} shown, the summary below uses all {len(samples)}"


def disk_table(result: dict[str, Any]) -> str:
    rows = ["| t (s) | events | log MB | views MB | snapshots MB |", "|---:|---:|---:|---:|---:|"]
    samples = result["samples"]
    step = _table_step(samples)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    for s in shown:
        rows.append(f"| {s['t']} | {s['events']:,} | {_mb(s['log'])} | {_mb(s['views'])} | {_mb(s['snapshots'])} |")
    return "\n".join(rows)


# --- latency ----------------------------------------------------------------------------------------

LATENCY_PHASES = (("baseline", 0), ("compaction", 20_000), ("stress", 5_000))
"""(name, snapshot every N offsets; 0: no compaction at all) of the latency phases."""


def _latency_config(snapshot_every: int) -> tuple[str, str]:
    """([cluster] keys, [compaction] section) of the baseline (no snapshots, no retention work) or of a
    node whose compaction runs all the time (a snapshot every `snapshot_every` offsets)."""
    if not snapshot_every:
        return ("snapshot_every_entries = 0\nsnapshot_every_bytes = 0\n",
                "[compaction]\nretain_offsets = 0\nexport_max_pin_offsets = 0\nprune_interval_ms = 0\n"
                "check_interval_ms = 3600000\n")
    return (f"snapshot_every_entries = {snapshot_every}\nsnapshot_every_bytes = 0\n",
            "[compaction]\nretain_offsets = 2000\ncheck_interval_ms = 200\nprune_interval_ms = 50\n")


async def _put_latency(address: str, args: argparse.Namespace) -> dict[str, Any]:
    from epochlog.client import AsyncClient
    from statemachines import events as ev

    client = AsyncClient(address, timeout=30.0)
    value = b"x" * args.value_bytes
    # Pre-load: history to snapshot, truncate and prune while the measured puts run.
    for start in range(0, args.preload, 500):
        await client.commands([ev.KvPut(name=f"pre/key-{(start + j) % args.keys:06d}", value=value)
                               for j in range(min(500, args.preload - start))])
    lat: list[float] = []
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < args.puts:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            await client.put(f"lat/key-{i % args.keys:06d}", value)
            lat.append(time.perf_counter() - t0)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    wall = time.monotonic() - t0
    status = None
    try:
        status = await client._call(_compaction_status_call(), group=None, leader=False)   # noqa: SLF001
    except Exception:  # noqa: BLE001 - an older node has no such call
        status = None
    await client.close()
    lat.sort()

    def q(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * (len(lat) - 1) + 0.5))] * 1000, 3)

    return {"puts": len(lat), "puts_per_s": round(len(lat) / wall), "p50_ms": q(0.5), "p99_ms": q(0.99),
            "p999_ms": q(0.999), "max_ms": round(lat[-1] * 1000, 3), "status": _status_summary(status)}


def _compaction_status_call() -> Any:
    from epochlog.api import messages as p

    return p.CompactionStatus()   # type: ignore[attr-defined]


def _status_summary(status: Any) -> dict[str, Any] | None:
    if status is None:
        return None
    out = {}
    for g in status.groups:
        out[g.group] = {"snapshots": g.snapshots_taken, "log_start": g.log_start,
                        "history_floor": g.history_floor, "prune_passes": g.prune_passes,
                        "last_snapshot_ms": g.last_snapshot_ms,
                        "cleanup_policy": getattr(g, "cleanup_policy", "delete"),
                        "clean_end_offset": getattr(g, "clean_end_offset", -1),
                        "clean_passes": getattr(g, "clean_passes", 0),
                        "clean_bytes_reclaimed": getattr(g, "clean_bytes_reclaimed", 0)}
    return out


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    for name, snapshot_every in LATENCY_PHASES:
        scratch = Path(tempfile.mkdtemp(prefix=f"compaction-lat-{name}-", dir=args.scratch))
        cluster_keys, section = _latency_config(snapshot_every)
        server = Server(scratch, section, args.latency_segment_bytes, Path(args.server_root), cluster_keys)
        try:
            server.start()
            log(f"latency/{name}: preload {args.preload:,}, {args.puts:,} puts, c={args.concurrency}")
            out[name] = asyncio.run(_put_latency(server.address, args))
            out[name]["sizes"] = _totals(server.sizes())
        finally:
            out[name + "_exit"] = server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    out["ratio_p99"] = round(out["compaction"]["p99_ms"] / out["baseline"]["p99_ms"], 2)
    out["ratio_p99_stress"] = round(out["stress"]["p99_ms"] / out["baseline"]["p99_ms"], 2)
    return out


def _qa_row(label: str, r: dict[str, Any]) -> str:
    g = r["final"]["offsets"]
    total = _totals(r["final"])
    return (f"| {label} | {r['events']:,} | {r['events_per_s']:,} | {r.get('server_cpu_us_per_event', '-')} | "
            f"{_mb(g['log'])} | {_mb(g['views'])} | {_mb(g['snapshots'])} | "
            f"{_mb(total['log'] + total['views'] + total['snapshots'])} |")


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    """The markdown of the `compaction` section of bench/RESULTS.md."""
    out = []
    if "qa" in results:
        out += ["### The QA case: 100 offset keys overwritten 600,000 times, one node, default config", "",
                "Allocated bytes on disk after the writes and a settle of "
                f"{args.settle_s:.0f} s (`du`: preallocated segments count in full; the idle metadata and kv "
                "groups hold two 64 MiB segment files each, the active one and the next, prepared).", "",
                "| run | events | events/s | server CPU us/event | offsets log MB | offsets views MB | "
                "offsets snapshots MB | node total MB |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        if "qa_before" in results:
            out.append(_qa_row(f"before (`{results['qa_before']['server_root']}`, revision "
                               f"{results.get('before_revision', '?')})", results["qa_before"]))
        out.append(_qa_row("after (this revision)", results["qa"]))
        out += ["", "The issue's QA figures were views 84 MB and log 201 MB. After: the offsets log keeps the active "
                "and prepared segments (a sealed one went after a snapshot), the views keep 100,000 offsets of history "
                "and the request ids above the floor; the extra server CPU per event pays for pruning, request-id "
                "eviction (which the old code only started after 1,000,000 offsets) and snapshots.", ""]
    if "flat" in results:
        f = results["flat"]
        st = f.get("status", {}).get("kv", {})
        cleaned = (f" At the end the kv log was key-compacted below offset {st['clean_end_offset']:,} by "
                   f"{st['clean_passes']} passes that reclaimed {st['clean_bytes_reclaimed'] / 1e6:,.0f} MB."
                   if st.get("cleanup_policy") == "compact" else "")
        out += [f"### Flat disk: {f['events']:,} overwrites of {f['keys']:,} kv keys, one node, default config", "",
                "Log: per group the active segment and the prepared next one (2 x 64 MiB, allocated in full) "
                "plus, in kv (key-compacted by default, `compact_groups`), the sealed segments the horizon still "
                "holds (a snapshot and `retain_offsets` behind the head) and the cleaned segments (one record per "
                "key) the cleaner leaves in their place." + cleaned + " Views and snapshots: the kv history "
                "(100,000 offsets by default), request ids above the history floor, and RocksDB's not yet "
                "compacted garbage; two snapshots are kept.", "",
                f"Batches of {f['batch']} puts per `Write`, {args.concurrency} in flight; {f['events_per_s']:,} "
                f"events/s; {f['errors']} failed calls. Sampled every {args.sample_s:.0f} s{_thinned(f['samples'])} "
                "(all groups; MB = "
                "10^6 bytes allocated):", "", disk_table(f), ""]
        samples = f["samples"]
        half = [s for s in samples if s["events"] >= f["events"] // 2]
        if half:
            out.append(f"From {half[0]['events']:,} events on (the second half): log {min(s['log'] for s in half) / 1e6:.0f}-"
                       f"{max(s['log'] for s in half) / 1e6:.0f} MB, views {min(s['views'] for s in half) / 1e6:.0f}-"
                       f"{max(s['views'] for s in half) / 1e6:.0f} MB, snapshots "
                       f"{min(s['snapshots'] for s in half) / 1e6:.0f}-{max(s['snapshots'] for s in half) / 1e6:.0f} MB.")
            out.append("")
    if "latency" in results:
        lat = results["latency"]
        b, c, x = lat["baseline"], lat["compaction"], lat["stress"]
        ok = lat["ratio_p99"] <= 2.0
        out += ["### Put latency while compaction runs", "",
                f"Single puts (one KvPut per call, {args.concurrency} callers, {args.puts:,} per phase) after a "
                f"pre-load of {args.preload:,} puts, on a fresh node each with {args.latency_segment_bytes >> 20} MiB "
                "segments: the baseline has no snapshots and no retention work; the others keep 2,000 offsets, check "
                "every 200 ms and prune every 50 ms, and take a snapshot every 20,000 offsets (\"compaction\": "
                "one every ~5 s at these rates) or every 5,000 (\"stress\": about one a second), so snapshots, "
                "key compaction of the kv log (the default cleanup policy of kv: each pass a worker process, "
                "the swaps in the node), log truncations of the other groups and pruning chunks run throughout "
                "the measurement.", "",
                "| node | puts/s | p50 ms | p99 ms | p99.9 ms | max ms | snapshots | kv log start | kv cleaned below "
                "| kv clean passes | history floor | prune passes |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in (("baseline", b), ("compaction (snapshot every 20,000)", c), ("stress (snapshot every 5,000)", x)):
            st = (r.get("status") or {}).get("kv", {})
            out.append(f"| {name} | {r['puts_per_s']:,} | {r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | "
                       f"{r['max_ms']} | {st.get('snapshots', '-')} | {st.get('log_start', '-')} | "
                       f"{st.get('clean_end_offset', '-')} | {st.get('clean_passes', '-')} | "
                       f"{st.get('history_floor', '-')} | {st.get('prune_passes', '-')} |")
        out += ["", "| target | measured | met? |", "|---|---|---|",
                f"| p99 put latency with compaction <= 2x baseline | {lat['ratio_p99']}x "
                f"({c['p99_ms']} ms vs {b['p99_ms']} ms) | {'met' if ok else '**not met**'} |",
                f"| (stress: a snapshot every 5,000 offsets) | {lat['ratio_p99_stress']}x ({x['p99_ms']} ms) | "
                f"{'met' if lat['ratio_p99_stress'] <= 2.0 else '**not met**'} |", "",
                "Where the time goes (measured with a loop-lag probe): a pruning chunk holds the loop for about 0.5 ms (at most "
                "~3 ms), a retention check ~0.5 ms, a truncation ~1-5 ms (its fsyncs), installing a snapshot 3-4 ms; "
                "the RocksDB checkpoint itself holds the GIL for 5-35 ms (rocksdict does not release it, and "
                "the checkpoint flushes every memtable written since the thread's own flush), once per snapshot: "
                "the stress row's p99.9 and max show it. At the default cadence (a snapshot every 100,000 "
                "offsets or 64 MiB) it is rarer still.", ""]
    loads = [v for k, v in results.items() if isinstance(v, dict) and "load_before" in v]
    if loads:
        out.append("Load average (1/5/15 min) before each run: "
                   + "; ".join(f"{' '.join(f'{x:.2f}' for x in v['load_before'])}" for v in loads)
                   + ". The machine (2 cores) was shared with other engineers' work: figures vary 30-50% run to run.")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("disk", "latency", "all"))
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--events", type=int, default=1_000_000, help="disk: overwrites in all")
    ap.add_argument("--kind", choices=("offsets", "kv"), default="kv")
    ap.add_argument("--batch", type=int, default=200, help="disk: events per Write call")
    ap.add_argument("--concurrency", "-c", type=int, default=8)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--settle-s", type=float, default=10.0, help="disk: wait after the last write")
    ap.add_argument("--segment-bytes", type=int, default=64 << 20)
    ap.add_argument("--preload", type=int, default=50_000, help="latency: events written first")
    ap.add_argument("--puts", type=int, default=20_000, help="latency: measured puts per phase")
    ap.add_argument("--latency-segment-bytes", type=int, default=1 << 20,
                    help="latency: segment size (small, so log truncation runs during the measurement too)")
    ap.add_argument("--config-extra", help="a TOML file appended to the node's config")
    ap.add_argument("--snapshot-every-entries", type=int, default=None, help="disk: [cluster] key (default: the node's)")
    ap.add_argument("--snapshot-every-bytes", type=int, default=None, help="disk: [cluster] key (default: the node's)")
    ap.add_argument("--server-root", default=str(ROOT), help="run the node from this checkout")
    ap.add_argument("--scratch", default=None, help="parent of the temporary data directories")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON")
    ap.add_argument("--write-results", action="store_true", help="write the section of bench/RESULTS.md")
    ap.add_argument("--flat-events", type=int, default=10_000_000, help="all: overwrites of the flat-disk case")
    ap.add_argument("--before-root", help="all: also run the QA case on this (older) checkout")
    ap.add_argument("--before-revision", default="?", help="all: the revision --before-root holds")
    ap.add_argument("--from-json", help="render (and with --write-results, write) the results a --json run "
                                        "printed on its last line, instead of measuring")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    command = ".venv/bin/python -m bench.compaction_bench " + " ".join(sys.argv[1:])
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text().strip().splitlines()[-1])
        args.mode = "rendered"
        command = command.split(" --from-json")[0]
    if args.mode == "disk":
        results["disk"] = run_disk(args)
        print(disk_table(results["disk"]))
        print(json.dumps({k: v for k, v in results["disk"].items() if k != "samples"}))
    if args.mode == "all":
        qa = argparse.Namespace(**{**vars(args), "keys": 100, "events": 600_000, "kind": "offsets"})
        if args.before_root:
            results["qa_before"] = run_disk(argparse.Namespace(**{**vars(qa), "server_root": args.before_root}))
            results["before_revision"] = args.before_revision
            print(_qa_row("before", results["qa_before"]))
        results["qa"] = run_disk(qa)
        print(_qa_row("after", results["qa"]))
        flat = argparse.Namespace(**{**vars(args), "keys": 1000, "events": args.flat_events, "kind": "kv"})
        results["flat"] = run_disk(flat)
        print(disk_table(results["flat"]))
    if args.mode in ("latency", "all"):
        results["latency"] = run_latency(args)
        print(json.dumps(results["latency"]))
    if args.json:
        print(json.dumps(results))
    if args.write_results:
        from bench.results import write_section

        write_section("compaction", render(results, args), command)


if __name__ == "__main__":
    main()
