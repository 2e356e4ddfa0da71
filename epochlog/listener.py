"""A client face's TCP listener: the part every face shares below its own framing.

The native and Kafka faces (epochlog/server.py, epochlog/kafka/server.py) differ in their frames and
in how they answer, not in how they listen: both keep the set of open connections (their limits count
it), both close a connection whose frame has been due for longer than `frame_timeout_ms` (so a
stalled or trickling client holds neither memory nor a connection for long), and both abort every
connection when the node stops. That is this module; the frames stay with each face.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from eventlog.cancellation import cancel_and_wait


class FramedConnection(Protocol):
    """What the listener needs of a face's connection."""

    waiting_since: float | None   # time.monotonic() since which a frame is due; None: none is

    def overdue(self) -> str:
        """What did not arrive in time, for the close reason ('a frame (12 bytes so far)')."""

    def close_for_limit(self, reason: str) -> None: ...

    def abort(self) -> None: ...


C = TypeVar("C", bound=FramedConnection)


class Listener(Generic[C]):
    """Listens on one address for one face (`name` names its sweeper task). Use on the node's loop."""

    def __init__(self, name: str, frame_timeout_ms: int) -> None:
        self.name = name
        self.frame_timeout_ms = frame_timeout_ms
        self.connections: set[C] = set()   # the face's connections: each adds and removes itself
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, connection: Callable[[], asyncio.Protocol], host: str, port: int,
                    tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(connection, host, port, reuse_address=True, ssl=tls)
        self._sweeper = loop.create_task(self._sweep(), name=f"{self.name}-frame-timeouts")

    async def _sweep(self) -> None:
        """Close connections whose frame is overdue: one pass per quarter of the timeout (at most 1 s)."""
        timeout = self.frame_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for conn in list(self.connections):
                since = conn.waiting_since
                if since is not None and now - since > timeout:
                    conn.close_for_limit(f"{conn.overdue()} did not arrive in full within frame_timeout_ms "
                                         f"({self.frame_timeout_ms} ms)")

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and abort every connection."""
        if self._sweeper is not None:
            await cancel_and_wait([self._sweeper])
            self._sweeper = None
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn.abort()
            await self._server.wait_closed()
