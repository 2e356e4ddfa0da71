"""The control protocol of bench/raft_node.py: propose, status, and in-process load.

A node of raw Raft groups serves it on its client address, framed like the peer transport (4-byte
length + msgpack). Requests carry an id and may be pipelined; replies come back as they complete.

- `Propose(group, records)` -> `Committed(offset)` once the records are committed, or `Failed`.
- `Status()` -> `StatusReply`: role, term, leader, commit, applied... of every group, and the state
  machine's `records` and `digest` when it has those attributes (the node's `ChecksumStateMachine`
  does: two replicas at the same `applied` must show the same digest).
- `Load(group, proposers, seconds, batch, value_bytes)`: run `proposers` coroutines on this node,
  each proposing `batch` records of `value_bytes` at a time, one proposal in flight each, for
  `seconds`; -> `LoadReply` with commit latencies. Measures the Raft path without client overhead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable

import msgspec

from eventlog.errors import EpochlogError
from eventlog.raft.runtime.group import RaftGroup

_LEN = 4


class Propose(msgspec.Struct, tag="propose"):
    req: int
    group: str
    records: list[tuple[bytes | None, bytes | None]]


class Status(msgspec.Struct, tag="status"):
    req: int


class Load(msgspec.Struct, tag="load"):
    req: int
    group: str
    proposers: int
    seconds: float
    batch: int = 1
    value_bytes: int = 134


class Committed(msgspec.Struct, tag="committed"):
    req: int
    offset: int


class Failed(msgspec.Struct, tag="failed"):
    req: int
    code: str
    message: str
    leader: int = 0


class GroupState(msgspec.Struct):
    group: str
    node: int
    role: str
    term: int
    leader: int
    commit: int
    applied: int
    last_index: int
    log_start: int
    snapshot_index: int
    disk_full: str = ""   # why the node refuses writes to the group for lack of disk space ("": it does not)
    repair: str = ""      # what the node does about a damaged batch in its log ("": nothing, repair.py)
    records: int = -1   # the state machine's `records` as of `applied` (-1: it has none)
    digest: str = ""    # the state machine's `digest` as of `applied` ("": it has none)


class StatusReply(msgspec.Struct, tag="status_reply"):
    req: int
    node: int
    groups: list[GroupState]


class LoadReply(msgspec.Struct, tag="load_reply"):
    req: int
    events: int
    proposals: int
    errors: int
    seconds: float
    latencies_us: list[int]   # every proposal's commit latency, in microseconds


Request = Propose | Status | Load
Reply = Committed | Failed | StatusReply | LoadReply
_req_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()


def _frame(obj: msgspec.Struct) -> bytes:
    payload = _encoder.encode(obj)
    return len(payload).to_bytes(_LEN, "big") + payload


class HarnessServer:
    """Serves harness requests for the groups of one node."""

    def __init__(self, node_id: int, groups: Callable[[], dict[str, RaftGroup]]) -> None:
        self.node_id = node_id
        self._groups = groups
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                header = await reader.readexactly(_LEN)
                payload = await reader.readexactly(int.from_bytes(header, "big"))
                request = _req_decoder.decode(payload)
                task = asyncio.create_task(self._handle(request, writer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            writer.close()

    async def _handle(self, request: Request, writer: asyncio.StreamWriter) -> None:
        reply: msgspec.Struct
        try:
            if isinstance(request, Propose):
                offset = await self._group(request.group).propose(request.records)
                reply = Committed(request.req, offset)
            elif isinstance(request, Status):
                reply = StatusReply(request.req, self.node_id, [_group_state(g) for g in self._groups().values()])
            else:
                reply = await self._load(request)
        except EpochlogError as exc:
            reply = Failed(request.req, exc.code, str(exc), getattr(exc, "leader_hint", 0))
        writer.write(_frame(reply))

    def _group(self, name: str) -> RaftGroup:
        group = self._groups().get(name)
        if group is None:
            raise EpochlogError(f"no group {name!r}")
        return group

    async def _load(self, req: Load) -> LoadReply:
        group = self._group(req.group)
        deadline = time.perf_counter() + req.seconds
        latencies: list[int] = []
        errors = 0
        proposals = 0

        # Values are drawn once per proposer: the load generator must not cost more than the path it measures.
        values = [os.urandom(req.value_bytes) for _ in range(req.batch)]

        async def proposer(n: int) -> None:
            nonlocal errors, proposals
            i = 0
            while time.perf_counter() < deadline:
                records = [(b"p%d-%d-%d" % (n, i, j), values[j]) for j in range(req.batch)]
                t0 = time.perf_counter_ns()
                try:
                    await group.propose(records)
                except EpochlogError:
                    errors += 1
                    await asyncio.sleep(0.01)
                    continue
                latencies.append((time.perf_counter_ns() - t0) // 1000)
                proposals += 1
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(proposer(n) for n in range(req.proposers)))
        elapsed = time.perf_counter() - started
        return LoadReply(req.req, proposals * req.batch, proposals, errors, elapsed, latencies)


def _group_state(group: RaftGroup) -> GroupState:
    status = group.status()
    fields = {f.name: getattr(status, f.name) for f in dataclasses.fields(status) if f.name != "repair"}
    return GroupState(**fields, repair="" if status.repair is None else status.repair.state,
                      records=getattr(group.sm, "records", -1), digest=getattr(group.sm, "digest", ""))


class HarnessClient:
    """Async client of a HarnessServer (one connection, pipelined requests)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next = 0
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 5.0) -> HarnessClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(_LEN)
                reply = _reply_decoder.decode(await self._reader.readexactly(int.from_bytes(header, "big")))
                future = self._pending.pop(reply.req, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._fail_pending(ConnectionError(f"harness connection lost: {exc}"))

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    async def request(self, make: Callable[[int], msgspec.Struct], timeout: float | None = None) -> Reply:
        self._next += 1
        req = self._next
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[req] = future
        self._writer.write(_frame(make(req)))
        return await asyncio.wait_for(future, timeout)

    async def propose(self, group: str, records: list[tuple[bytes | None, bytes | None]],
                      timeout: float | None = None) -> Reply:
        return await self.request(lambda r: Propose(r, group, records), timeout)

    async def status(self, timeout: float | None = 5.0) -> StatusReply:
        reply = await self.request(lambda r: Status(r), timeout)
        assert isinstance(reply, StatusReply)
        return reply

    async def load(self, group: str, proposers: int, seconds: float, batch: int = 1,
                   value_bytes: int = 134) -> Reply:
        return await self.request(lambda r: Load(r, group, proposers, seconds, batch, value_bytes),
                                  timeout=seconds + 30)

    def abort(self) -> None:
        """Drop the connection at once (usable outside a coroutine); pending requests fail with
        ConnectionError instead of waiting for their timeout."""
        self._task.cancel()
        self._writer.transport.abort()
        self._fail_pending(ConnectionError("harness connection closed"))

    async def close(self) -> None:
        self._task.cancel()
        self._fail_pending(ConnectionError("harness connection closed"))
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


__all__ = ["Committed", "Failed", "GroupState", "HarnessClient", "HarnessServer", "LoadReply", "StatusReply"]
