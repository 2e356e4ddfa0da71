"""A frame-aware TCP proxy between node processes, to partition, cut and delay real peer links.

Theory of operation. The peer transport (`eventlog.raft.runtime.transport`) keeps one TCP
connection per pair of nodes, dialed by the lower id. A `Link` sits on that connection: in the
dialer's config the acceptor's `peer_address` is the link's listening address, and the link forwards
to the acceptor's real address (only a node's own `peer_address` must be real: it listens there).

With TLS between the members (the default) a link terminates it on both sides: the test made the
members' certificates, so the link shows the acceptor's certificate to the dialer and the dialer's to
the acceptor (each side verifies a certificate of the cluster CA naming the node it expects) and sees
the frames in the clear. A cluster with `insecure` peers gets a plain TCP link.

Each direction of a link is parsed into the transport's frames (4-byte big-endian length + payload),
and a decision is taken per whole frame, so a receiver never sees a frame cut in the middle:

- pass: forwarded after the direction's `delay_s` (0 by default), in order;
- drop: discarded while the direction drops (checked when the frame arrives and again when it is
  due, so after `drop()` returns nothing more is delivered that way). The first frame of each
  direction of a connection (the transport's `Hello`) always passes: a handshake is never half
  done, so a one-way drop stays one-way instead of making the receiver abort the connection.
- `sever()` is the exception: it aborts the TCP connections of the link at once (bytes in flight,
  possibly mid-frame, are lost, as when a cable is pulled) and, while severed, the link accepts
  new connections only to abort them.

A `ProxyNetwork` runs every link on one asyncio loop in a daemon thread of the test process, so the
network keeps moving while the test's own loop is busy or blocked. Its control methods may be
called from any thread; each returns once the change is in effect on the proxy loop. It measures its
own loop's stalls (`longest_stall_s`): a starved test process delays every frame by that much more.

Faults this does not model: reordering, duplication and byte corruption (TCP does not produce them
to the transport; the deterministic simulator in tests/sim covers message-level faults).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_LEN = 4
_CONTROL_TIMEOUT_S = 5.0
_STALL_PROBE_S = 0.01   # the proxy loop's stall probe: a timer this often


@dataclass(slots=True)
class DirectionState:
    """What happens to frames going from node `src` to node `dst` on one link."""

    src: int
    dst: int
    drop: bool = False
    delay_s: float = 0.0
    passed: int = 0       # frames forwarded (Hello included)
    dropped: int = 0      # frames discarded


@dataclass(eq=False)
class _Pipe:
    """One proxied TCP connection: the dialer's socket and ours to the acceptor."""

    down: asyncio.StreamWriter                 # towards the dialer
    up: asyncio.StreamWriter                   # towards the acceptor
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for w in (self.down, self.up):
            w.transport.abort()


class Link:
    """The proxy of the connection between `dialer` (lower id) and `acceptor`. Use on the proxy loop."""

    def __init__(self, dialer: int, acceptor: int, target: tuple[str, int],
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> None:
        """`tls`: (the acceptor's server context, the dialer's client context), or None for plain TCP."""
        assert dialer < acceptor, (dialer, acceptor)
        self.tls = tls
        self.dialer = dialer
        self.acceptor = acceptor
        self.target = target
        self.directions = {(dialer, acceptor): DirectionState(dialer, acceptor),
                           (acceptor, dialer): DirectionState(acceptor, dialer)}
        self.severed = False
        self.connections = 0       # connections accepted and forwarded
        self.refused = 0           # connections aborted because the link was severed
        self._pipes: set[_Pipe] = set()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0,
                                                  ssl=None if self.tls is None else self.tls[0])
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.sever_now()
        if self._server is not None:
            await self._server.wait_closed()

    def sever_now(self) -> None:
        for pipe in list(self._pipes):
            pipe.abort()
            for t in pipe.tasks:
                t.cancel()
        self._pipes.clear()

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        if self.severed:
            self.refused += 1
            down_w.transport.abort()
            return
        try:
            if self.tls is None:
                up_r, up_w = await asyncio.open_connection(*self.target)
            else:
                up_r, up_w = await asyncio.open_connection(*self.target, ssl=self.tls[1], server_hostname="")
        except OSError:
            down_w.transport.abort()   # the acceptor is down: the dialer sees a failed connection
            return
        if self.severed:               # severed while we connected
            self.refused += 1
            down_w.transport.abort()
            up_w.transport.abort()
            return
        self.connections += 1
        pipe = _Pipe(down_w, up_w)
        self._pipes.add(pipe)
        forward = self.directions[(self.dialer, self.acceptor)]
        backward = self.directions[(self.acceptor, self.dialer)]
        pipe.tasks = [asyncio.create_task(self._pump(down_r, up_w, forward, pipe)),
                      asyncio.create_task(self._pump(up_r, down_w, backward, pipe))]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: DirectionState,
                    pipe: _Pipe) -> None:
        """Read whole frames from `reader`; drop, delay or forward each to `writer`."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes, bool] | None] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer, state))
        pipe.tasks.append(sender)
        first = True
        try:
            while True:
                header = await reader.readexactly(_LEN)
                payload = await reader.readexactly(int.from_bytes(header, "big"))
                if state.drop and not first:
                    state.dropped += 1
                    continue
                queue.put_nowait((loop.time() + state.delay_s, header + payload, first))
                first = False
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait(None)  # the sender finishes what is due, then closes the pipe

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes, bool] | None],
                    writer: asyncio.StreamWriter, state: DirectionState) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await queue.get()) is not None:
                due, frame, is_hello = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if state.drop and not is_hello:
                    state.dropped += 1
                    continue
                writer.write(frame)
                state.passed += 1
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side is gone: take the whole connection down, as TCP would for the endpoints.
            for pipe in [p for p in self._pipes if writer in (p.down, p.up)]:
                pipe.abort()
                self._pipes.discard(pipe)


class ProxyNetwork:
    """All links of a test cluster, on one asyncio loop in a daemon thread.

    Control methods (`drop`, `delay`, `isolate`, `sever`, `heal`, ...) are thread-safe and take
    effect before they return. Node ids are the cluster's member ids.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy-network", daemon=True)
        self._thread.start()
        self.links: dict[tuple[int, int], Link] = {}
        self._closed = False
        self.longest_stall_s = 0.0   # how much later than due the proxy loop ran a timer, since reset_stall()
        asyncio.run_coroutine_threadsafe(self._watch_stalls(), self._loop)

    async def _watch_stalls(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + _STALL_PROBE_S
            await asyncio.sleep(_STALL_PROBE_S)
            self.longest_stall_s = max(self.longest_stall_s, loop.time() - due)

    def reset_stall(self) -> None:
        self.longest_stall_s = 0.0

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CONTROL_TIMEOUT_S)

    def _apply(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()
        return self._call(run())

    def add_link(self, a: int, b: int, target: tuple[str, int],
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> int:
        """Proxy the connection between nodes `a` and `b` (the lower dials) to the acceptor's real
        address `target` (`tls`: see `Link`); returns the port the dialer must use as the acceptor's
        peer_address."""
        dialer, acceptor = sorted((a, b))
        link = Link(dialer, acceptor, target, tls)
        self._call(link.start())
        self.links[(dialer, acceptor)] = link
        return link.port

    def link(self, a: int, b: int) -> Link:
        return self.links[(min(a, b), max(a, b))]

    def direction(self, src: int, dst: int) -> DirectionState:
        return self.link(src, dst).directions[(src, dst)]

    # --- faults --------------------------------------------------------------------------------

    def drop(self, src: int, dst: int, drop: bool = True) -> None:
        """Drop (or stop dropping) every frame from `src` to `dst`: a one-way partition."""
        def go() -> None:
            self.direction(src, dst).drop = drop
        self._apply(go)

    def delay(self, src: int, dst: int, seconds: float) -> None:
        """Deliver frames from `src` to `dst` `seconds` late (order kept)."""
        def go() -> None:
            self.direction(src, dst).delay_s = seconds
        self._apply(go)

    def partition(self, a: int, b: int) -> None:
        """Drop frames both ways between `a` and `b` (connections stay up: a silent partition)."""
        def go() -> None:
            self.direction(a, b).drop = True
            self.direction(b, a).drop = True
        self._apply(go)

    def sever(self, a: int, b: int) -> None:
        """Abort the TCP connections between `a` and `b` and refuse new ones until `heal`."""
        def go() -> None:
            link = self.link(a, b)
            link.severed = True
            link.sever_now()
        self._apply(go)

    def isolate(self, node: int, *, others: list[int] | None = None) -> None:
        """Partition `node` from every other node (or from `others`) in both directions."""
        peers = others if others is not None else [n for pair in self.links for n in pair if n != node]
        for peer in sorted(set(peers)):
            self.partition(node, peer)

    def heal(self) -> None:
        """Every link passes everything, at once, with no delay."""
        def go() -> None:
            for link in self.links.values():
                link.severed = False
                for d in link.directions.values():
                    d.drop = False
                    d.delay_s = 0.0
        self._apply(go)

    def counters(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(passed, dropped) frames per direction (src, dst)."""
        return {key: (d.passed, d.dropped)
                for link in self.links.values() for key, d in link.directions.items()}

    def close(self) -> None:
        """Stop every link and the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            for link in self.links.values():
                await link.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._call(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CONTROL_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()


__all__ = ["DirectionState", "Link", "ProxyNetwork"]
