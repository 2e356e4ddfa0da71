"""The admin HTTP endpoint of a node: /metrics (Prometheus), /healthz (alive), /readyz (serving).

A deliberately small HTTP/1.1 server on the node's event loop (one request per connection), so
scrapes read the node's state without threads or locks.

- /healthz: 200 while no group has failed (a failed fsync stops the node), else 503 with the reason.
  Liveness only: a node without a leader is healthy (restarting it would not help).
- /readyz: 200 when every group runs, is not halted on this node, knows a leader, and this node
  applied what it knew to be committed when it last heard from the leader (within `ready_lag`
  offsets), else 503 with the first reason found. A follower is ready: clients it cannot serve get
  `not_leader` with the leader's address.

A damaged batch in a group's log on this node, until it is dropped and fetched again
(eventlog/raft/runtime/repair.py), makes it unready too: /readyz names the group, the file, the offset
and what the node is doing about it.

A group halted on this node (a record its code cannot apply, epochlog/halts.py) makes it unready,
not unhealthy: a restart does not help (it halts again at the same record) and a liveness probe
that restarted it would only crash-loop it; /readyz says the offset, the reason and the fix.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epochlog.metrics import Metrics
from epochlog.node import Node

logger = logging.getLogger(__name__)


class AdminServer:
    def __init__(self, node: Node, metrics: Metrics, *, ready_lag: int = 1000) -> None:
        self.node = node
        self.metrics = metrics
        self.ready_lag = ready_lag
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def readiness(self) -> str | None:
        """Why this node is not ready to serve, or None."""
        failure = self.node.failure()
        if failure:
            return failure
        for g in self.node.status().groups:
            if self.node.host.groups[g.group].stopped:
                return f"group {g.group} is stopped"
            if g.damage is not None:
                return (f"group {g.group}: damaged batch at offset {g.damage.offset} of {g.damage.file} "
                        f"({g.damage.reason}); {g.damage.state}")
            if g.halted is not None:
                return (f"group {g.group} halted at offset {g.halted.offset}: {g.halted.reason}; {g.halted.fix} "
                        f"(or epochlog group skip --group {g.group} --offset {g.halted.offset} if no version "
                        f"can apply it)")
            if g.leader == 0:
                return f"group {g.group} has no leader"
            if g.commit_offset - g.applied_offset > self.ready_lag:
                return f"group {g.group} applied {g.applied_offset} of {g.commit_offset}"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
            elif path == "/healthz":
                failure = self.node.failure()
                status = "503 Service Unavailable" if failure else "200 OK"
                ctype, body = "text/plain", ((failure or "ok") + "\n").encode()
            elif path == "/readyz":
                reason = self.readiness()
                status = "503 Service Unavailable" if reason else "200 OK"
                ctype, body = "text/plain", ((reason or "ready") + "\n").encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"/metrics, /healthz or /readyz\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, ConnectionError):
            pass
        finally:
            writer.close()
