"""What one message between two processes costs on this machine: a loopback TCP round trip, three ways.

Every hop of a put (client -> leader -> follower -> leader -> client) is a message from one process to
another that was asleep waiting for it. This measures a bare round trip of 50 bytes between two Python
processes over 127.0.0.1 (blocking sockets, TCP_NODELAY), with nothing else in the way:

- `cross-cpu`: the two processes pinned to different CPUs, each sleeping in `recv` between messages
  (what a 3-node cluster on a 2-core machine mostly gets: the woken process runs on an idle CPU);
- `same-cpu`: both pinned to one CPU (the woken process runs where the sender was, once it sleeps);
- `spinning`: different CPUs, non-blocking sockets polled in a loop (no process ever sleeps).

    .venv/bin/python -m bench.loopback_rtt                  # 3,000 round trips each, twice
    .venv/bin/python -m bench.loopback_rtt --write          # section loopback-rtt of bench/RESULTS.md

The gap between `cross-cpu` and the other two is what waking a sleeping process on another CPU costs
(on a virtual machine: the idle virtual CPU's halt and the interrupt that wakes it). Not a pass/fail
test; on one CPU the `cross-cpu` and `spinning` rows are skipped.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time
from multiprocessing.connection import Connection

from bench.results import write_section

MESSAGE = b"x" * 50


def _receive(sock: socket.socket, spin: bool) -> bytes:
    while True:
        try:
            return sock.recv(100)
        except BlockingIOError:
            if not spin:
                raise


def _echo(cpu: int, spin: bool, ports: Connection) -> None:
    os.sched_setaffinity(0, {cpu})
    listener = socket.create_server(("127.0.0.1", 0))
    ports.send(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setblocking(not spin)
    while data := _receive(conn, spin):
        conn.sendall(data)


def round_trips(server_cpu: int, client_cpu: int, spin: bool, count: int) -> list[float]:
    """`count` round trips (us) between this process on `client_cpu` and an echo process on `server_cpu`."""
    ours, theirs = mp.Pipe()
    echo = mp.Process(target=_echo, args=(server_cpu, spin, theirs), daemon=True)
    echo.start()
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {client_cpu})
        sock = socket.create_connection(("127.0.0.1", ours.recv()))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(not spin)
        times = []
        for _ in range(count + 200):   # the first 200 warm up
            start = time.perf_counter_ns()
            sock.sendall(MESSAGE)
            _receive(sock, spin)
            times.append((time.perf_counter_ns() - start) / 1000)
        sock.close()
        return times[200:]
    finally:
        os.sched_setaffinity(0, before)
        echo.join(5)
        if echo.is_alive():
            echo.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write section loopback-rtt of bench/RESULTS.md")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    first, other = cpus[0], cpus[-1]
    ways = [("same-cpu", first, first, False)]
    if other != first:
        ways = [("cross-cpu", first, other, False), *ways, ("spinning", first, other, True)]
    load = os.getloadavg()[0]
    rows = ["| way | round | p50 us | p90 us | p99 us |", "|---|---:|---:|---:|---:|"]
    for round_ in range(1, args.rounds + 1):
        for name, server, client, spin in ways:
            t = sorted(round_trips(server, client, spin, args.count))
            rows.append(f"| {name} | {round_} | {statistics.median(t):,.0f} | {t[int(len(t) * 0.9)]:,.0f} | "
                        f"{t[int(len(t) * 0.99)]:,.0f} |")
    body = (f"{chr(10).join(rows)}\n\n{args.count:,} round trips of {len(MESSAGE)} bytes per row over 127.0.0.1 "
            f"(CPUs {first} and {other}). Load average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after.")
    print(body)
    if args.write:
        write_section("loopback-rtt", body)


if __name__ == "__main__":
    main()
