"""Memory of a node holding partly received frames (issue 11): N connections, each sending most of a
large frame and then nothing more.

QA measured 32 connections holding 15 MiB each: the node's RSS went from 0.5 to 1 GB. The native
server now budgets the bytes of unfinished frames over all connections (`[clients]
partial_frames_bytes`, 64 MiB by default) and closes a connection that would go past it with
`connection_limit`; stalled frames are closed after `frame_timeout_ms`.

Runs ONE `epochlog serve` node (a one-member cluster, default settings but 1 MiB log segments) from
the source tree `--tree` (default: this one; give a checkout of an older revision to compare), and
reports its RSS (VmRSS) before, once every connection sent its bytes, and after they close, with
the peak (VmHWM), and how many connections the server closed.

    .venv/bin/python -m bench.frame_memory                       # this tree, 32 x 15 MiB
    .venv/bin/python -m bench.frame_memory --tree /tmp/old --label "before (90f05d6)"
    .venv/bin/python -m bench.frame_memory --write                # and the section of bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from epochlog.certs import ClusterCA

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def _frame(payload: object) -> bytes:
    data = msgspec.msgpack.encode(payload)
    return struct.pack(">I", len(data)) + data


def _hello(sock: socket.socket) -> None:
    sock.sendall(_frame({"type": "client_hello", "version": 1, "client": "frame-memory-bench"}))
    sock.settimeout(10)
    head = sock.recv(4)
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))


def run(tree: Path, connections: int, frame_mib: int) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="frame-memory-"))
    client, peer = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    config = work / "node.toml"
    config.write_text(f'[cluster]\nname = "frame-memory"\ngroups = ["metadata", "offsets", "kv"]\n\n'
                      f'[[cluster.members]]\nid = 1\npeer_address = "{peer}"\nclient_address = "{client}"\n\n'
                      f"[log]\nsegment_bytes = {MIB}\n"
                      # plaintext client faces, said explicitly where the tree has client TLS (on by default)
                      + ("\n[clients.tls]\nenabled = false\n" if (tree / "epochlog" / "face_tls.py").exists() else ""))
    ClusterCA.create(work / "ca", "frame-memory").issue_member(1, work / "data" / "tls")   # peer TLS files
    out = work / "node.out"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "epochlog", "serve", "--config", str(config), "--node-id", "1",
                                 "--data-dir", str(work / "data")], cwd=tree, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while b"READY 1 " not in out.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the node did not start:\n{out.read_text()[-2000:]}")
            time.sleep(0.05)
        time.sleep(2.0)
        idle, _ = _memory(proc.pid)
        host, port = client.rsplit(":", 1)
        chunk = b"\x00" * MIB
        refused = 0
        for _ in range(connections):
            sock = socket.create_connection((host, int(port)))
            _hello(sock)
            socks.append(sock)
            try:
                sock.sendall(struct.pack(">I", (frame_mib + 1) * MIB))
                for _ in range(frame_mib):
                    sock.sendall(chunk)
            except OSError:
                refused += 1
        time.sleep(1.0)
        held, peak = _memory(proc.pid)
        closed = 0
        for sock in socks:
            sock.settimeout(0.2)
            try:
                data = sock.recv(1 << 16)
                closed += 1 if data is not None else 0   # a connection_limit reply, or the close itself
            except (TimeoutError, ConnectionResetError):
                pass
        for sock in socks:
            sock.close()
        socks = []
        time.sleep(3.0)
        after, peak = _memory(proc.pid)
        return {"load": round(os.getloadavg()[0], 2), "connections": connections, "frame_mib": frame_mib,
                "rss_idle_mib": round(idle),
                "rss_held_mib": round(held), "rss_after_mib": round(after), "peak_mib": round(peak),
                "closed_by_server": closed, "send_failed": refused}
    finally:
        for sock in socks:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=ROOT, help="Source tree whose `epochlog serve` runs.")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--frame-mib", type=int, default=15)
    ap.add_argument("--from-jsonl", type=Path, default=None, help="Render rows saved by earlier runs.")
    ap.add_argument("--write", action="store_true", help="Write the frame-memory section of bench/RESULTS.md.")
    args = ap.parse_args()
    if args.from_jsonl is not None:
        rows = [json.loads(line) for line in args.from_jsonl.read_text().splitlines() if line.strip()]
    else:
        row = run(args.tree, args.connections, args.frame_mib)
        row["label"] = args.label
        rows = [row]
    for row in rows:
        print(json.dumps(row))
    if args.write:
        from bench.results import write_section

        lines = ["| node | connections x MiB sent | RSS idle | RSS while held | peak (VmHWM) | RSS after close | "
                 "connections closed by the node | load (1 min) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['label']} | {r['connections']} x {r['frame_mib']} | {r['rss_idle_mib']} MiB | "
                         f"{r['rss_held_mib']} MiB | {r['peak_mib']} MiB | {r['rss_after_mib']} MiB | "
                         f"{r['closed_by_server']} | {r.get('load', '?')} |")
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        body = "\n".join(lines) + (
            f"\n\nOne node (default `[clients]`: partial_frames_bytes 64 MiB, frame_timeout_ms 30 s); each connection "
            f"says hello, declares a frame of {rows[0]['frame_mib'] + 1} MiB and sends {rows[0]['frame_mib']} MiB of "
            f"it, then nothing. RSS from /proc/<pid>/status 1 s after the last send; 'after' 3 s after the client "
            f"closed every connection. The idle RSS is small because the bench uses 1 MiB log segments (QA's 0.5 GB "
            f"node had 64 MiB ones); what counts is the growth: every byte held before, at most the budget (plus "
            f"one read of a connection) now. The connections the node kept are closed by frame_timeout_ms later. "
            f"Load average when rendered: {load}.")
        write_section("frame-memory", body, ".venv/bin/python -m bench.frame_memory [--tree OLD --label ...] "
                                            "--write (rows: --from-jsonl)")


if __name__ == "__main__":
    main()
