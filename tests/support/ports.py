"""Ports of 127.0.0.1 for test servers: drawn at random below the kernel's ephemeral range (32768-60999,
so they never clash with the ports the kernel gives outgoing connections) and bind-checked.

The machine is shared: a port free a moment ago may be taken by the time a server binds it, which
the harnesses report as a start-up failure; nothing here assumes a port is ours. The suite's own
pytest-xdist workers draw from disjoint shares of the range (`port_range`), so two tests running at
once never pick the same port (they did: a node of one worker bound the port another's had just checked).
"""

from __future__ import annotations

import os
import random
import socket

PORT_RANGE = (20000, 32000)


def port_range() -> tuple[int, int]:
    """The ports this process draws from: PORT_RANGE, or under pytest-xdist this worker's share of it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")   # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count <= 1 or not worker.startswith("gw"):
        return PORT_RANGE
    lo, hi = PORT_RANGE
    share = (hi - lo) // count
    index = int(worker[2:])
    return lo + index * share, lo + (index + 1) * share


def is_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` could be bound just now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """`n` distinct ports of 127.0.0.1 that were free a moment ago (a fresh random source by default)."""
    rng = rng or random.Random(random.SystemRandom().getrandbits(64))
    ports: list[int] = []
    for _ in range(200 * n):
        if len(ports) == n:
            return ports
        port = rng.randrange(*port_range())
        if port not in ports and is_free(port):
            ports.append(port)
    raise RuntimeError(f"could not find {n} free ports")
