"""Epochlog against etcd, side by side, in one run on one machine.

For every case, a FRESH 3-member etcd cluster (../shared/anchors/etcd/etcd_cluster.sh) is loaded by
the anchor's own grpc.aio generator (etcd_load.py), then a FRESH 3-node Epochlog cluster (three
`epochlog serve` processes on 127.0.0.1) is loaded by bench/node_load.py through the SDK: same
values (~145 bytes), same keys, same number of concurrent callers, one client process each.
The ratio column is Epochlog / etcd (> 1: Epochlog is faster). Epochlog's load starts once the
cluster is settled (every group has a leader, on three different nodes with a build that balances
leaders, and none changed for 5 s: the start's elections and the leader balancer's moves are over); its leader changes are counted during the case, those before it
are reported apart. The report ends with issue 20's targets (`TARGETS`, the server CPU per batched event, no
leader change), each met or not in this run.

    .venv/bin/python -m bench.vs_etcd                 # every case (~10 minutes)
    .venv/bin/python -m bench.vs_etcd --scale 0.2     # fewer requests per case (smoke run)
    .venv/bin/python -m bench.vs_etcd --only put-c1   # one case
    .venv/bin/python -m bench.vs_etcd --peer-tls off  # Epochlog's peers in plaintext ([cluster.tls] insecure)
    .venv/bin/python -m bench.vs_etcd --etcd-peer-tls # etcd's members speak TLS too (bench/etcd_peer_tls.sh)

Epochlog's members speak mutual TLS by default (a CA and member certificates are made per cluster);
the anchor's etcd cluster speaks plain HTTP between its members. So by default the two differ in the
TLS record layer on every Raft message; `--peer-tls off` or `--etcd-peer-tls` compare like with like
(bench/peer_tls.py compares put-c16 with and without Epochlog's).

Needs /usr/bin/etcd and /usr/bin/etcdctl (Debian: apt-get install etcd-server etcd-client) and the etcd stubs/venv the anchor builds
(first run: `--setup-etcd` creates /tmp/etcd-bench-venv and /tmp/etcd-bench-stubs as the anchor's
run_all.sh does). Every process started here is stopped by pid; data lives under a temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import write_section
from epochlog.certs import ClusterCA

ROOT = Path(__file__).resolve().parents[1]
# ../shared of the main checkout; a git worktree under /work/wt/<branch> finds it one level further up.
ANCHOR = next((p for p in ((ROOT / ".." / "shared" / "anchors" / "etcd").resolve(),
                           (ROOT / ".." / ".." / "shared" / "anchors" / "etcd").resolve()) if p.exists()),
              (ROOT / ".." / "shared" / "anchors" / "etcd").resolve())
ETCD_VENV = Path(os.environ.get("VENV", "/tmp/etcd-bench-venv"))
ETCD_STUBS = Path(os.environ.get("ETCD_STUBS", "/tmp/etcd-bench-stubs"))

# (label, workload, concurrency, requests, extra args for etcd, extra args for epochlog)
CASES: list[tuple[str, str, int, int, list[str], list[str]]] = [
    ("put-c1", "put", 1, 5000, [], []),
    ("put-c16", "put", 16, 30000, [], []),
    ("put-c64", "put", 64, 50000, [], []),
    ("put-c256", "put", 256, 60000, [], []),
    ("txn-b100-c16", "txn", 16, 1500, ["--batch", "100"], ["--batch", "100"]),
    ("get-linearizable-c64", "get", 64, 60000, [], ["--consistency", "linearizable"]),
    ("get-local-c64", "get", 64, 60000, ["--serializable"], ["--consistency", "local"]),
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def setup_etcd() -> None:
    """The anchor's client venv and stubs (as run_all.sh steps 1-2 make them)."""
    py = ETCD_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ETCD_VENV)], check=True)
        subprocess.run([str(ETCD_VENV / "bin" / "pip"), "install", "-q", "grpcio", "grpcio-tools", "protobuf"],
                       check=True)
    if not (ETCD_STUBS / "rpc_pb2_grpc.py").exists():
        deb = Path(tempfile.mkdtemp(prefix="etcd-deb-"))
        subprocess.run(["apt-get", "download", "golang-etcd-server-dev"], cwd=deb, check=True)
        (pkg,) = deb.glob("golang-etcd-server-dev_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(pkg), str(deb / "root")], check=True)
        proto_root = deb / "root" / "usr" / "share" / "gocode" / "src" / "go.etcd.io" / "etcd"
        subprocess.run([str(py), str(ANCHOR / "gen_stubs.py"), "--proto-root", str(proto_root),
                        "--out", str(ETCD_STUBS)], check=True)


def last_json_line(text: str) -> dict[str, object]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    raise RuntimeError(f"no JSON result in output:\n{text[-2000:]}")


def run_etcd(case: tuple[str, str, int, int, list[str], list[str]], n: int, scratch: Path, *,
             peer_tls: bool = False) -> dict[str, object]:
    """One fresh 3-member etcd cluster loaded with `case`; with `peer_tls` its members speak TLS to each
    other (bench/etcd_peer_tls.sh), else plain HTTP (the anchor's cluster as it is)."""
    label, workload, conc, _, etcd_args, _ = case
    data = scratch / f"etcd-{label}"
    cluster = str(ANCHOR / "etcd_cluster.sh")
    env = {**os.environ, "ETCD": str(ROOT / "bench" / "etcd_peer_tls.sh")} if peer_tls else None
    subprocess.run([cluster, "start", str(data)], check=True, stdout=subprocess.DEVNULL, env=env)
    try:
        endpoints = subprocess.run([cluster, "endpoints", str(data)], check=True, capture_output=True,
                                   text=True).stdout.strip()
        out = subprocess.run([str(ETCD_VENV / "bin" / "python"), str(ANCHOR / "etcd_load.py"), "--endpoints",
                              endpoints, "--pid-dir", str(data), "--workload", workload, "-c", str(conc),
                              "--n", str(n), "--max-seconds", "60", "--quiet-wait", "0", "--label", label,
                              "--stubs", str(ETCD_STUBS), *etcd_args],
                             check=True, capture_output=True, text=True, timeout=300)
        return last_json_line(out.stdout)
    finally:
        subprocess.run([cluster, "stop", str(data)], check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def free_ports(count: int) -> list[int]:
    import socket

    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(20000, 40000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def epochlog_config(path: Path, ports: list[int], *, peer_tls: bool = True) -> list[str]:
    """A 3-node config; with `peer_tls` a CA and the members' certificates next to it (the default
    [cluster.tls] layout of data dirs node-N), else `[cluster.tls] insecure = true`."""
    members = "".join(
        f'\n[[cluster.members]]\nid = {i}\npeer_address = "127.0.0.1:{ports[i - 1]}"\n'
        f'client_address = "127.0.0.1:{ports[i + 2]}"\n' for i in (1, 2, 3))
    tls = "" if peer_tls else "\n[cluster.tls]\ninsecure = true\n"
    faces = "\n[clients.tls]\nenabled = false\n"   # plaintext client faces, as etcd's here (said explicitly)
    path.write_text('[cluster]\nname = "bench"\ngroups = ["metadata", "offsets", "kv"]\n' + members + tls + faces)
    if peer_tls:
        ca = ClusterCA.create(path.parent / "ca", "bench")
        for i in (1, 2, 3):
            ca.issue_member(i, path.parent / f"node-{i}" / "tls")
    return [f"127.0.0.1:{ports[i + 2]}" for i in (1, 2, 3)]


def run_epochlog(case: tuple[str, str, int, int, list[str], list[str]], n: int, scratch: Path, *,
                 peer_tls: bool = True, tree: Path = ROOT) -> dict[str, object]:
    """One fresh 3-node cluster loaded with `case`; nodes and load generator run the source in `tree`
    (bench/build_ab.py passes another build's)."""
    label, workload, conc, _, _, our_args = case
    data = scratch / f"epochlog-{label}-{'tls' if peer_tls else 'plain'}"
    data.mkdir(parents=True)
    config = data / "cluster.toml"
    endpoints = epochlog_config(config, free_ports(6), peer_tls=peer_tls)
    procs: list[subprocess.Popen[bytes]] = []
    py = sys.executable
    try:
        for i in (1, 2, 3):
            procs.append(subprocess.Popen([py, "-m", "epochlog", "serve", "--config", str(config), "--node-id", str(i),
                                           "--data-dir", str(data / f"node-{i}")], cwd=tree,
                                          stdout=subprocess.PIPE, stderr=open(data / f"node-{i}.log", "wb")))
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            if not line.startswith("READY"):
                raise RuntimeError(f"a node did not start: {line!r}")
        marks = wait_settled(data)
        out = subprocess.run([py, "-m", "bench.node_load", "--endpoints", ",".join(endpoints), "--workload", workload,
                              "-c", str(conc), "--n", str(n), "--max-seconds", "60", "--label", label,
                              "--server-pids", ",".join(str(p.pid) for p in procs), *our_args],
                             cwd=tree, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            tails = "".join(f"\n--- node-{i}.log:\n" + (data / f"node-{i}.log").read_text(errors="replace")[-1500:]
                            for i in (1, 2, 3))
            raise RuntimeError(f"bench.node_load failed ({out.returncode}):\n{out.stderr[-3000:]}{tails}")
        return {**last_json_line(out.stdout), "leader_changes": leader_changes(data, since=marks),
                "leader_changes_at_start": leader_changes(data, until=marks)}
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(data, ignore_errors=True)


SETTLED_QUIET_S = 5.0
"""No leadership change for this long after every group has a leader: the start's elections and the
leader balancer's moves (2 s settle time by default) are over, the case may start."""
SETTLED_TIMEOUT_S = 60.0
_LEADS = re.compile(r"group (\S+): node \d+ leads in term (\d+)")
_LEADS_NODE = re.compile(r"group (\S+): node (\d+) leads in term (\d+)")


def _leaderships(text: str) -> dict[str, set[int]]:
    terms: dict[str, set[int]] = {}
    for m in _LEADS.finditer(text):
        terms.setdefault(m.group(1), set()).add(int(m.group(2)))
    return terms


def wait_settled(data: Path, groups: tuple[str, ...] = ("metadata", "offsets", "kv")) -> dict[str, int]:
    """Wait (at most SETTLED_TIMEOUT_S) until every group has a leader, each on another node when the
    nodes balance leaders (they log 'leader balance: ...' at start), and no leadership changed for
    SETTLED_QUIET_S, read from the nodes' INFO lines 'group G: node N leads in term T'; each node log's
    size then (`leader_changes(since=...)` counts what the case itself moved)."""
    deadline = time.monotonic() + SETTLED_TIMEOUT_S
    seen: dict[str, set[int]] = {}
    changed = time.monotonic()
    while True:
        texts = {f.name: f.read_text(errors="replace") for f in sorted(data.glob("node-*.log"))}
        now = _leaderships("".join(texts.values()))
        spread = any("leader balance: " in text for text in texts.values())
        if now != seen:
            seen, changed = now, time.monotonic()
        leaders = _leaders("".join(texts.values()))
        if (all(g in leaders for g in groups) and (not spread or len({leaders[g] for g in groups}) == len(groups))
                and time.monotonic() - changed >= SETTLED_QUIET_S):
            return {name: len(text) for name, text in texts.items()}
        if time.monotonic() > deadline:
            log(f"leaderships not settled within {SETTLED_TIMEOUT_S:.0f} s: {seen}; starting the case anyway")
            return {name: len(text) for name, text in texts.items()}
        time.sleep(0.2)


def _leaders(text: str) -> dict[str, int]:
    """Each group's leader in the highest term the lines name."""
    best: dict[str, tuple[int, int]] = {}
    for m in _LEADS_NODE.finditer(text):
        group, node, term = m.group(1), int(m.group(2)), int(m.group(3))
        if term > best.get(group, (-1, 0))[0]:
            best[group] = (term, node)
    return {g: node for g, (_, node) in best.items()}


def leader_changes(data: Path, *, since: dict[str, int] | None = None,
                   until: dict[str, int] | None = None) -> dict[str, int]:
    """Per group, how many times its leadership changed (the nodes' INFO lines 'group G: node N leads in
    term T', read from every node's log): with `since` (log sizes from wait_settled) the new terms after
    that point, i.e. during the case; with `until` the changes after the first leader up to it (the
    start's elections and the leader balancer's moves); else over the whole run. 0: none."""
    before: dict[str, set[int]] = {}
    after: dict[str, set[int]] = {}
    for log_file in sorted(data.glob("node-*.log")):
        text = log_file.read_text(errors="replace")
        cut = len(text) if since is None and until is None else (since or until or {}).get(log_file.name, 0)
        for g, t in _leaderships(text[:cut]).items():
            before.setdefault(g, set()).update(t)
        for g, t in _leaderships(text[cut:]).items():
            after.setdefault(g, set()).update(t)
    if since is not None:
        return {g: len(after.get(g, set()) - before.get(g, set())) for g in sorted(set(before) | set(after))}
    return {g: max(0, len(t) - 1) for g, t in sorted(before.items())}


def table(rows: list[tuple[str, dict[str, object], dict[str, object]]]) -> str:
    lines = ["| case | etcd ops/s | etcd p50 / p99 ms | Epochlog ops/s | Epochlog p50 / p99 ms | ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, etcd, ours in rows:
        el, ol = etcd["latency_ms"], ours["latency_ms"]
        assert isinstance(el, dict) and isinstance(ol, dict)
        e_ops, o_ops = float(etcd["ops_per_s"]), float(ours["ops_per_s"])  # type: ignore[arg-type]
        lines.append(f"| {label} | {e_ops:,.0f} | {el.get('p50')} / {el.get('p99')} | {o_ops:,.0f} | "
                     f"{ol.get('p50')} / {ol.get('p99')} | {o_ops / e_ops if e_ops else 0:.2f}x |")
    return "\n".join(lines)


TARGETS: dict[str, tuple[float, str]] = {
    "put-c1": (1.0, ">= 1x etcd, p50 <= etcd's"),
    "put-c16": (1.5, ">= 1.5x etcd"),
    "put-c64": (1.5, ">= 1.5x etcd"),
    "put-c256": (1.5, ">= 1.5x etcd"),
    "txn-b100-c16": (1.0, ">= 1x etcd (stretch 2x)"),
    "get-linearizable-c64": (1.0, ">= 1x etcd"),
    "get-local-c64": (1.0, ">= 1x etcd"),
}
"""Issue 20's targets by case: the least ops/s ratio to etcd, and how the issue words it."""


def targets(rows: list[tuple[str, dict[str, object], dict[str, object]]]) -> str:
    """Issue 20's targets, each met or not in this run: the ratio of each case (put-c1's p50 too), the
    server CPU per batched event against etcd's, and no leader change during any case."""
    lines = ["| target (issue 20) | this run | met? |", "|---|---|---|"]

    def row(what: str, measured: str, met: bool) -> None:
        lines.append(f"| {what} | {measured} | {'met' if met else '**not met**'} |")

    for label, etcd, ours in rows:
        want, words = TARGETS.get(label, (1.0, ">= 1x etcd"))
        e_ops, o_ops = float(etcd["ops_per_s"]), float(ours["ops_per_s"])  # type: ignore[arg-type]
        ratio = o_ops / e_ops if e_ops else 0.0
        met, measured = ratio >= want, f"{ratio:.2f}x"
        if label == "put-c1":
            e_p50, o_p50 = etcd["latency_ms"]["p50"], ours["latency_ms"]["p50"]  # type: ignore[index]
            met = met and o_p50 <= e_p50
            measured += f", p50 {o_p50} vs {e_p50} ms"
        row(f"{label}: {words}", measured, met)
        if label.startswith("txn"):
            batch = float(ours.get("batch") or 1)  # type: ignore[arg-type]
            e_cpu = float(etcd["server_cpu_us_per_rpc"]) / batch  # type: ignore[arg-type]
            o_cpu = float(ours["server_cpu_us_per_rpc"]) / batch  # type: ignore[arg-type]
            row("server CPU per batched event <= etcd's", f"{o_cpu:.1f} vs {e_cpu:.1f} us", o_cpu <= e_cpu)
    changes = [sum(c.values()) for _, _, ours in rows if isinstance(c := ours.get("leader_changes"), dict)]
    row("no leader change during any case", f"{sum(changes)} in {len(changes)} cases", sum(changes) == 0)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every case's request count")
    ap.add_argument("--only", default="", help="comma-separated case labels to run")
    ap.add_argument("--setup-etcd", action="store_true", help="build the etcd client venv and stubs first")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    ap.add_argument("--out", type=Path, default=None, help="also append every JSON result to this file")
    ap.add_argument("--peer-tls", choices=("on", "off"), default="on",
                    help="Epochlog's members speak mutual TLS (the default) or plaintext ([cluster.tls] insecure)")
    ap.add_argument("--etcd-peer-tls", action="store_true",
                    help="etcd's members speak TLS to each other too (else plain HTTP, the anchor's default)")
    ap.add_argument("--from-jsonl", type=Path, default=None,
                    help="render the results of an earlier run (its --out file) instead of running")
    args = ap.parse_args()
    if args.from_jsonl is not None:
        results = [json.loads(line) for line in args.from_jsonl.read_text().splitlines() if line.strip()]
        pairs = [(results[i]["label"], results[i], results[i + 1]) for i in range(0, len(results) - 1, 2)]
        report(pairs, args, command=f"python -m bench.vs_etcd --scale {args.scale} (rendered from --out)")
        return
    missing = [tool for tool in ("/usr/bin/etcd", "/usr/bin/etcdctl") if not Path(tool).exists()]
    if missing:  # etcd_cluster.sh asks etcdctl whether the cluster is healthy
        raise SystemExit(f"{', '.join(missing)} not installed (apt-get install etcd-server etcd-client)")
    if args.setup_etcd:
        setup_etcd()
    if not (ETCD_STUBS / "rpc_pb2_grpc.py").exists():
        raise SystemExit(f"no etcd stubs in {ETCD_STUBS}: run with --setup-etcd once")
    only = {s for s in args.only.split(",") if s}
    cases = [c for c in CASES if not only or c[0] in only]
    scratch = Path(tempfile.mkdtemp(prefix="vs-etcd-"))
    rows = []
    try:
        for case in cases:
            n = max(200, int(case[3] * args.scale))
            etcd = run_etcd(case, n, scratch, peer_tls=args.etcd_peer_tls)
            log(f"{case[0]}: etcd {etcd['ops_per_s']} ops/s p50 {etcd['latency_ms']['p50']} ms")  # type: ignore[index]
            ours = run_epochlog(case, n, scratch, peer_tls=args.peer_tls == "on")
            log(f"{case[0]}: epochlog {ours['ops_per_s']} ops/s p50 {ours['latency_ms']['p50']} ms "  # type: ignore[index]
                f"errors {ours['errors']}")
            rows.append((case[0], etcd, ours))
            if args.out is not None:
                with args.out.open("a") as f:
                    f.write(json.dumps(etcd) + "\n" + json.dumps(ours) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, args)


def report(rows: list[tuple[str, dict[str, object], dict[str, object]]], args: argparse.Namespace,
           command: str | None = None) -> None:
    body = table(rows) + "\n\n" + targets(rows)
    print(body)
    if args.no_write:
        return
    cpu = ["| case | etcd client / server CPU us per call | Epochlog client / server CPU us per call | "
           "Epochlog leader changes during the case (etcd: leader changed?); before it (start, balancing) |",
           "|---|---:|---:|---|"]
    for label, etcd, ours in rows:
        changes, start = ours.get("leader_changes"), ours.get("leader_changes_at_start")
        cpu.append(f"| {label} | {etcd.get('client_cpu_us_per_rpc')} / {etcd.get('server_cpu_us_per_rpc')} | "
                   f"{ours.get('client_cpu_us_per_rpc')} / {ours.get('server_cpu_us_per_rpc')} | "
                   f"{'?' if changes is None else ', '.join(f'{g} {n}' for g, n in changes.items())} "  # type: ignore[union-attr]
                   f"({etcd.get('leader_changed', '?')})"
                   f"{'' if not start else '; before the case: ' + ', '.join(f'{g} {n}' for g, n in start.items())} |")  # type: ignore[union-attr]
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    write_section("vs-etcd", body + "\n\n" + "\n".join(cpu) +
                  f"\n\nFresh 3-node clusters per case and system; one client process each "
                  f"(etcd: the anchor's grpc.aio generator; Epochlog: bench/node_load.py over the SDK); "
                  f"requests per case scaled by {args.scale}; Epochlog's peer TLS {args.peer_tls}, etcd's "
                  f"{'on (bench/etcd_peer_tls.sh)' if args.etcd_peer_tls else 'off'}. "
                  f"Server CPU is the sum over the three nodes. "
                  f"Load average when rendered: {' '.join(loadavg)}. "
                  f"Run-to-run spread on this shared machine is 10-25 %: compare ratios within one run.",
                  command=command)


if __name__ == "__main__":
    main()
