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

With `[clients.tls]` on, the endpoint speaks HTTPS with the faces' certificate (a plaintext request
gets no further than the handshake). With `[clients.access] enforce = true`, /metrics (member lag,
offsets, terms, who was denied what) needs a principal with the admin or auditor role: a client
certificate of the cluster CA or `Authorization: Bearer <token>` (401 without a credential, 403
without the role). /healthz and /readyz stay open: they reveal only whether this node serves, which
any client learns by calling it, and a kubelet or load balancer probes them without credentials.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epochlog.access_control import AccessControl, Caller
from epochlog.face_tls import certificate_node, certificate_principal
from epochlog.metrics import Metrics
from epochlog.node import Node
from eventlog.errors import AuthenticationError, PermissionDeniedError
from statemachines.access import Action, Operation

logger = logging.getLogger(__name__)


class AdminServer:
    def __init__(self, node: Node, metrics: Metrics, *, ready_lag: int = 1000,
                 tls: ssl.SSLContext | None = None, access: AccessControl | None = None) -> None:
        """`tls`: the faces' server context (face_tls.server_context), None for plaintext; `access`: the
        node's access state, which guards /metrics when it enforces."""
        self.node = node
        self.metrics = metrics
        self.ready_lag = ready_lag
        self.tls = tls
        self.access = access
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True, ssl=self.tls,
                                                  ssl_handshake_timeout=5.0 if self.tls else None)

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

    def refusal(self, writer: asyncio.StreamWriter, head: bytes) -> str | None:
        """The HTTP status refusing /metrics to this request, or None when it may read it (always, unless
        enforcing). Counted and logged like any face's denial (AccessControl)."""
        access = self.access
        if access is None or not access.enforce:
            return None
        peercert = writer.get_extra_info("peercert")
        token = ""
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            scheme, _, credential = value.strip().partition(" ")
            if name.strip().lower() == "authorization" and scheme.lower() == "bearer":
                token = credential.strip()
        caller = Caller(certificate=certificate_principal(peercert), node=certificate_node(peercert, self.node.cluster),
                        token=token)
        try:
            principal = access.authenticate(caller, "admin.metrics")
            access.check(principal, "admin.metrics", [Action(Operation.INSPECT)])
        except AuthenticationError:
            return "401 Unauthorized"
        except PermissionDeniedError:
            return "403 Forbidden"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                refused = self.refusal(writer, head)
                if refused is not None:
                    status, ctype, body = refused, "text/plain", (refused.split(" ", 1)[1] + "\n").encode()
                else:
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
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, ConnectionError,
                ssl.SSLError):
            pass
        finally:
            writer.close()
