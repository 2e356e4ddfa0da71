"""The gRPC face of a node (proto/epochlog/v1/epochlog.proto), on the node's asyncio loop.

A thin adapter: each method turns its request into the call the native server makes on `Node`
(epochlog.grpc.convert), awaits it under the call's deadline, and turns the result or the error
back into a message or a status. Nothing here decides anything the native protocol does not.

Deadlines: a unary call gets the client's deadline (`context.time_remaining()`, at most
MAX_TIMEOUT_S; the node's default when the client sets none); a Session call gets its
`timeout_ms`, else the stream's deadline, else the default.

Session: the reader task starts every call of a request message at once (as the native server
does with a frame); replies are queued and written once per turn of the loop, so the replies that
complete together share one response message. At most MAX_SESSION_INFLIGHT calls run per stream;
past that the server stops reading the stream until some complete (gRPC flow control then pushes
back on the client).

Bad input: a request message that does not parse is answered INVALID_ARGUMENT (the handlers are
registered with deserializers that hand over `convert.Undecodable` instead of raising, which grpc
would report as UNKNOWN); values out of range (negative offsets, limits...) are INVALID_ARGUMENT
naming the field and the range, as on the native face (`convert.checked`). A Session message that
does not parse ends the stream with INVALID_ARGUMENT (its calls' ids cannot be known).

Concurrency contract: create, start and close on the node's loop; every handler runs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from eventlog.errors import EpochlogError
from epochlog.api import messages as p
from epochlog.api.frames import MAX_FRAME_BYTES
from epochlog.access_control import ANONYMOUS_CALLER, AccessControl, Caller
from epochlog.calls import CallRunner, Done, FaceRules, Failed
from epochlog.face_tls import ClientTlsConfig, certificate_node, certificate_principal, grpc_credentials, peercert_of_pem
from epochlog.grpc import convert as cv
from epochlog.grpc.v1 import epochlog_pb2 as pb
from epochlog.grpc.v1 import epochlog_pb2_grpc as pb_grpc
from epochlog.metrics import Metrics
from epochlog.errors import RejectedError
from epochlog.node import DEFAULT_TIMEOUT_S, Node
from epochlog.server import MAX_TIMEOUT_S

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = MAX_FRAME_BYTES            # 16 MiB, as a native frame
MAX_SESSION_INFLIGHT = 8192
WATCH_BUFFER_EVENTS = 4096                     # events read ahead of a slow watcher
WATCH_MESSAGE_EVENTS = 1024                    # at most this many events per WatchEvents message
# The node's own waits (read barriers) get the call's timeout and fail first, saying what they waited
# for; the whole call is cut this much later (writes have no timeout of their own).
DEADLINE_GRACE_S = 0.05
# A retriable error raised once the deadline passed is DEADLINE_EXCEEDED, as gRPC clients expect.
GRPC_RULES = FaceRules(metrics_prefix="grpc_", grace_s=DEADLINE_GRACE_S, late_retriable_is_deadline=True)


class GrpcService:
    """Serves the Epochlog gRPC service of `node` on one address."""

    def __init__(self, node: Node, metrics: Metrics | None = None, access: AccessControl | None = None,
                 tls: ClientTlsConfig | None = None) -> None:
        self.node = node
        self.servicer = EpochlogServicer(node, metrics, access)
        self.tls = tls
        self._server: grpc.aio.Server | None = None
        self._port = 0

    async def start(self, host: str, port: int) -> None:
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ])
        _add_servicer(self.servicer, server)
        credentials = grpc_credentials(self.tls, self.node.data_dir)
        if credentials is None:
            self._port = server.add_insecure_port(f"{host}:{port}")
        else:
            self._port = server.add_secure_port(f"{host}:{port}", credentials)
        if self._port == 0:
            raise OSError(f"gRPC could not listen on {host}:{port}")
        await server.start()
        self._server = server

    @property
    def port(self) -> int:
        return self._port

    async def close(self, grace_s: float = 1.0) -> None:
        """Stop taking calls; calls in flight get `grace_s` to finish, then are cancelled."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None


Handler = Callable[["EpochlogServicer", Any, Any, float], Awaitable[Any]]
Ctx = grpc.aio.ServicerContext


class EpochlogServicer(pb_grpc.EpochlogServicer):
    """The methods of the service; `_OPS` holds the calls that unary methods and Session share."""

    def __init__(self, node: Node, metrics: Metrics | None = None, access: AccessControl | None = None) -> None:
        self.node = node
        # the call path every face shares (epochlog/calls.py)
        self.runner = CallRunner(GRPC_RULES, metrics, access)
        self.grpc_addresses = {m.id: m.grpc_address for m in node.configs.cluster.members}

    # --- unary ------------------------------------------------------------------------------------

    async def _unary(self, op: str, request: Any, context: Ctx) -> Any:
        remaining = context.time_remaining()
        timeout = DEFAULT_TIMEOUT_S if remaining is None else max(0.0, min(remaining, MAX_TIMEOUT_S))
        outcome = await _run(self, op, request, timeout, self.caller(context))
        if isinstance(outcome, Done):
            return outcome.result
        f = self._failure(outcome.error)
        await context.abort(f.status, f.message, f.metadata())

    def caller(self, context: Ctx) -> Caller:
        """Who the call says it is: a bearer token (`authorization: Bearer <token>` metadata) and the
        client certificate the TLS handshake verified (when [clients.tls] requires one)."""
        if self.runner.access is None or not self.runner.access.enforce:
            return ANONYMOUS_CALLER
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                token = value[len("Bearer "):]
        pem = (context.auth_context() or {}).get("x509_pem_cert")
        peercert = peercert_of_pem(pem[0]) if pem else None
        return Caller(certificate=certificate_principal(peercert), node=certificate_node(peercert, self.node.cluster),
                      token=token)

    def _failure(self, error: EpochlogError) -> cv.Failure:
        """A call's error (its row, from the runner) as gRPC reports it."""
        return cv.failure(error, self.grpc_addresses)

    async def Put(self, request: pb.PutRequest, context: Ctx) -> Any:
        return await self._unary("put", request, context)

    async def Get(self, request: pb.GetRequest, context: Ctx) -> Any:
        return await self._unary("get", request, context)

    async def Delete(self, request: pb.DeleteRequest, context: Ctx) -> Any:
        return await self._unary("delete", request, context)

    async def List(self, request: pb.ListRequest, context: Ctx) -> Any:
        return await self._unary("list", request, context)

    async def History(self, request: pb.HistoryRequest, context: Ctx) -> Any:
        return await self._unary("history", request, context)

    async def Txn(self, request: pb.TxnRequest, context: Ctx) -> Any:
        return await self._unary("txn", request, context)

    async def Command(self, request: pb.CommandRequest, context: Ctx) -> Any:
        return await self._unary("command", request, context)

    async def Batch(self, request: pb.BatchRequest, context: Ctx) -> Any:
        return await self._unary("batch", request, context)

    async def LeaseGrant(self, request: pb.LeaseGrantRequest, context: Ctx) -> Any:
        return await self._unary("lease_grant", request, context)

    async def LeaseKeepAlive(self, request: pb.LeaseKeepAliveRequest, context: Ctx) -> Any:
        return await self._unary("lease_keep_alive", request, context)

    async def LeaseRevoke(self, request: pb.LeaseRevokeRequest, context: Ctx) -> Any:
        return await self._unary("lease_revoke", request, context)

    async def ReadEvents(self, request: pb.ReadEventsRequest, context: Ctx) -> Any:
        return await self._unary("read_events", request, context)

    async def ReadLog(self, request: pb.ReadLogRequest, context: Ctx) -> Any:
        return await self._unary("read_log", request, context)

    async def Status(self, request: pb.StatusRequest, context: Ctx) -> Any:
        return await self._unary("status", request, context)

    async def TransferLeader(self, request: pb.TransferLeaderRequest, context: Ctx) -> Any:
        return await self._unary("transfer_leader", request, context)

    async def Snapshot(self, request: pb.SnapshotRequest, context: Ctx) -> Any:
        return await self._unary("snapshot", request, context)

    async def CompactionStatus(self, request: pb.CompactionStatusRequest, context: Ctx) -> Any:
        return await self._unary("compaction_status", request, context)

    async def MemberList(self, request: pb.MemberListRequest, context: Ctx) -> Any:
        return await self._unary("member_list", request, context)

    async def MemberAdd(self, request: pb.MemberAddRequest, context: Ctx) -> Any:
        return await self._unary("member_add", request, context)

    async def MemberPromote(self, request: pb.MemberPromoteRequest, context: Ctx) -> Any:
        return await self._unary("member_promote", request, context)

    async def MemberRemove(self, request: pb.MemberRemoveRequest, context: Ctx) -> Any:
        return await self._unary("member_remove", request, context)

    # --- streams ----------------------------------------------------------------------------------

    async def Watch(self, request: pb.WatchRequest, context: Ctx) -> None:
        """Started, then the events in messages of what was read ahead (gRPC flow control paces it)."""
        try:
            call = cv.watch_call(request)
        except Exception as exc:
            opened: Done[Any] | Failed = Failed(self.runner.error("watch", exc))
        else:
            opened = await self.runner.run("watch", call, lambda: self.node.watch(call), None, self.caller(context),
                                           observe=False)
        if isinstance(opened, Failed):
            f = self._failure(opened.error)
            await context.abort(f.status, f.message, f.metadata())   # raises: the call ends here
        assert isinstance(opened, Done)
        group, start, records = opened.result
        queue: asyncio.Queue[p.EventRecord | BaseException] = asyncio.Queue(WATCH_BUFFER_EVENTS)

        async def read_ahead() -> None:
            try:
                async with contextlib.aclosing(records):  # type: ignore[type-var]
                    async for record in records:
                        await queue.put(record)
            except Exception as exc:  # handed to the writer, which ends the call with its status
                await queue.put(exc)

        reader = asyncio.ensure_future(read_ahead())
        try:
            await context.write(pb.WatchResponse(started=pb.WatchStarted(group=group, from_offset=start)))
            while True:
                batch = [await queue.get()]
                while not queue.empty() and len(batch) < WATCH_MESSAGE_EVENTS:
                    batch.append(queue.get_nowait())
                error = batch[-1] if isinstance(batch[-1], BaseException) else None
                records_ = [r for r in batch if isinstance(r, p.EventRecord)]
                if records_:
                    await context.write(pb.WatchResponse(events=pb.WatchEvents(
                        events=[cv.event(r, request.json, watched=True) for r in records_])))
                if error is not None:
                    f = self._failure(self.runner.error("watch", error))
                    await context.abort(f.status, f.message, f.metadata())
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def Session(self, request_iterator: AsyncIterator[pb.SessionRequest], context: Ctx) -> None:
        await _Session(self, context, self.caller(context)).run(request_iterator)


# --- the calls ------------------------------------------------------------------------------------

async def _write_one(s: EpochlogServicer, call: p.Write, r: Any, timeout: float) -> pb.WriteResponse:
    (result,) = await s.node.write(call.events)
    if not result.ok:
        raise RejectedError(result)
    return cv.write_result(result)


async def _get(s: EpochlogServicer, call: p.Get, r: pb.GetRequest, timeout: float) -> pb.GetResponse:
    return cv.got(await s.node.get(call, timeout), r.json)


async def _list(s: EpochlogServicer, call: p.List, r: pb.ListRequest, timeout: float) -> pb.ListResponse:
    return cv.listed(await s.node.list(call, timeout), r.json)


async def _history(s: EpochlogServicer, call: p.History, r: pb.HistoryRequest, timeout: float) -> pb.HistoryResponse:
    return cv.history_rows(r.key, await s.node.history(call, timeout), r.json)


_BATCH_WRITES: dict[str, Callable[[Any], Any]] = {
    "put": cv.put_event, "delete": cv.delete_event, "txn": cv.txn_event, "command": cv.command_event}


def _batch_call(r: pb.BatchRequest) -> tuple[p.Write, p.Gets]:
    """A batch as the native calls it makes: its writes, then its reads."""
    if not r.ops:
        raise cv.RequestError("a batch carries at least one op")
    events, gets = [], []
    for op in r.ops:
        kind = op.WhichOneof("op")
        if kind == "get":
            gets.append(cv.get_call(op.get))
        elif kind in _BATCH_WRITES:
            events.append(_BATCH_WRITES[kind](getattr(op, kind)))
        else:
            raise cv.RequestError("every batch op is a put, delete, txn, command or get")
    return p.Write(events), p.Gets(gets)


async def _batch(s: EpochlogServicer, call: tuple[p.Write, p.Gets], r: pb.BatchRequest,
                 timeout: float) -> pb.BatchResponse:
    """Every write in one Node.write (validated together, committed per group in order), then the reads."""
    writes, reads = call
    order = [op.WhichOneof("op") != "get" for op in r.ops]
    gets = [op.get for op in r.ops if op.WhichOneof("op") == "get"]
    written = await s.node.write(writes.events) if writes.events else []
    got = (await s.node.get_many(reads, timeout)).replies if reads.gets else []
    results, w, g = [], iter(written), iter(zip(gets, got))
    for is_write in order:
        if is_write:
            results.append(pb.BatchResult(write=cv.write_result(next(w))))
        else:
            request, reply = next(g)
            results.append(pb.BatchResult(get=cv.got(reply, request.json)))
    return pb.BatchResponse(results=results)


async def _lease_grant(s: EpochlogServicer, call: p.LeaseGrant, r: pb.LeaseGrantRequest,
                       timeout: float) -> pb.LeaseResponse:
    return cv.lease(await s.node.lease_grant(call))


def _lease_keep_alive(s: EpochlogServicer, call: p.LeaseKeepAlive, r: pb.LeaseKeepAliveRequest,
                      timeout: float) -> pb.LeaseResponse:
    return cv.lease(s.node.lease_keepalive(call))


async def _read_events(s: EpochlogServicer, call: p.ReadEvents, r: pb.ReadEventsRequest,
                       timeout: float) -> pb.ReadEventsResponse:
    return cv.events(await s.node.read_events(call, timeout), r.json)


async def _read_log(s: EpochlogServicer, call: p.ReadLog, r: pb.ReadLogRequest,
                    timeout: float) -> pb.ReadLogResponse:
    return cv.log_batches(await s.node.read_log(call, timeout))


def _status(s: EpochlogServicer, call: p.Status, r: pb.StatusRequest, timeout: float) -> pb.StatusResponse:
    return cv.status(s.node.status(), s.grpc_addresses)


def _transfer_leader(s: EpochlogServicer, call: p.TransferLeader, r: pb.TransferLeaderRequest,
                     timeout: float) -> pb.DoneResponse:
    return pb.DoneResponse(offset=s.node.transfer_leader(call).offset)


def _snapshot(s: EpochlogServicer, call: p.Snapshot, r: pb.SnapshotRequest, timeout: float) -> pb.DoneResponse:
    return pb.DoneResponse(offset=s.node.snapshot(call).offset)


def _compaction_status(s: EpochlogServicer, call: p.CompactionStatus, r: pb.CompactionStatusRequest,
                       timeout: float) -> pb.CompactionStatusResponse:
    return cv.compaction(s.node.compaction_status())


def _member_list(s: EpochlogServicer, call: p.MemberList, r: pb.MemberListRequest,
                 timeout: float) -> pb.MembersResponse:
    return cv.members(s.node.member_list(), s.grpc_addresses)


async def _member_add(s: EpochlogServicer, call: p.MemberAdd, r: pb.MemberAddRequest,
                      timeout: float) -> pb.MembersResponse:
    return cv.members(await s.node.member_add(call), s.grpc_addresses)


async def _member_promote(s: EpochlogServicer, call: p.MemberPromote, r: pb.MemberPromoteRequest,
                          timeout: float) -> pb.MembersResponse:
    return cv.members(await s.node.member_promote(call), s.grpc_addresses)


async def _member_remove(s: EpochlogServicer, call: p.MemberRemove, r: pb.MemberRemoveRequest,
                         timeout: float) -> pb.MembersResponse:
    return cv.members(await s.node.member_remove(call), s.grpc_addresses)


_SYNC: dict[str, Callable[[EpochlogServicer, Any, Any, float], Any]] = {
    "lease_keep_alive": _lease_keep_alive, "status": _status,
    "transfer_leader": _transfer_leader, "snapshot": _snapshot, "member_list": _member_list,
    "compaction_status": _compaction_status,
}
_ASYNC: dict[str, Handler] = {
    "put": _write_one, "get": _get, "delete": _write_one, "list": _list, "history": _history, "txn": _write_one,
    "command": _write_one, "batch": _batch, "lease_grant": _lease_grant, "lease_revoke": _write_one,
    "member_add": _member_add, "member_promote": _member_promote, "member_remove": _member_remove,
    "read_events": _read_events, "read_log": _read_log,
}
# Each method's request as the native call(s) it makes: what the runner authorizes (the same
# permissions as the native face: epochlog/api/permissions.py), and what the handler then runs.
_NATIVE: dict[str, Callable[[Any], Any]] = {
    "put": lambda r: p.Write([cv.put_event(r)]),
    "delete": lambda r: p.Write([cv.delete_event(r)]),
    "txn": lambda r: p.Write([cv.txn_event(r)]),
    "command": lambda r: p.Write([cv.command_event(r)]),
    "lease_revoke": lambda r: p.Write([cv.lease_revoke_event(r)]),
    "get": cv.get_call, "list": cv.list_call, "history": cv.history_call, "batch": _batch_call,
    "lease_grant": lambda r: p.LeaseGrant(r.ttl_ms, r.lease_id, r.request_id),
    "lease_keep_alive": lambda r: p.LeaseKeepAlive(r.lease_id),
    "read_events": cv.read_events_call, "read_log": cv.read_log_call, "status": lambda r: p.Status(),
    "transfer_leader": lambda r: p.TransferLeader(r.group, r.to), "snapshot": lambda r: p.Snapshot(r.group),
    "compaction_status": lambda r: p.CompactionStatus(), "member_list": lambda r: p.MemberList(),
    "member_add": lambda r: p.MemberAdd(r.node_id, r.peer_address, r.client_address, not r.manual_promote),
    "member_promote": lambda r: p.MemberPromote(r.node_id), "member_remove": lambda r: p.MemberRemove(r.node_id),
}

# The field of SessionReply that carries each Session call's result.
_REPLY_FIELD = {
    "put": "write", "delete": "write", "txn": "write", "command": "write", "lease_revoke": "write",
    "get": "get", "list": "list", "history": "history", "batch": "batch", "lease_grant": "lease",
    "lease_keep_alive": "lease", "read_events": "read_events", "status": "status",
}


def _add_servicer(servicer: EpochlogServicer, server: grpc.aio.Server) -> None:
    """What `add_EpochlogServicer_to_server` does, with deserializers that never raise (`cv.lenient`)."""
    service = pb.DESCRIPTOR.services_by_name["Epochlog"]
    handlers = {}
    for method in service.methods:
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=cv.lenient(request_class),
                                     response_serializer=response_class.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _native(s: EpochlogServicer, op: str, request: Any) -> Any:
    """The native call(s) of `request`, or its error's outcome (a message that does not parse, a value
    out of range)."""
    try:
        return _NATIVE[op](cv.decoded(request))
    except Exception as exc:
        return Failed(s.runner.error(op, exc))


def _run_now(s: EpochlogServicer, op: str, request: Any, timeout: float, caller: Caller) -> Done[Any] | Failed:
    """A call that completes without waiting (`_SYNC`), through the runner in this turn of the loop."""
    call = _native(s, op, request)
    if isinstance(call, Failed):
        return call
    return s.runner.now(op, call, lambda: _SYNC[op](s, call, request, timeout), caller)


async def _run(s: EpochlogServicer, op: str, request: Any, timeout: float,
               caller: Caller = ANONYMOUS_CALLER) -> Done[Any] | Failed:
    """A call of a unary method or of a Session, through the runner: in this turn of the loop when it
    does not wait, else in the caller's task under its deadline."""
    if op in _SYNC:
        return _run_now(s, op, request, timeout, caller)
    call = _native(s, op, request)
    if isinstance(call, Failed):
        return call
    return await s.runner.run(op, call, lambda: _ASYNC[op](s, call, request, timeout), timeout, caller)


class _Session:
    """One Session stream: a reader starting calls, and this task writing the coalesced replies."""

    def __init__(self, servicer: EpochlogServicer, context: grpc.aio.ServicerContext, caller: Caller) -> None:
        self.servicer = servicer
        self.context = context
        self.caller = caller
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending: list[pb.SessionReply] = []
        self.ready = asyncio.Event()         # replies are pending, or the reader ended
        self.room = asyncio.Event()          # fewer than MAX_SESSION_INFLIGHT calls run
        self.room.set()
        self.reading = True
        self.stream_deadline: float | None = None

    async def run(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        remaining = self.context.time_remaining()
        if remaining is not None:
            self.stream_deadline = self.loop.time() + remaining
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while True:
                await self.ready.wait()
                self.ready.clear()
                if self.pending:
                    replies, self.pending = self.pending, []
                    await self.context.write(pb.SessionResponse(replies=replies))
                if reader.done() and not self.tasks and not self.pending:
                    try:
                        reader.result()   # a failed read fails the stream
                    except cv.RequestError as exc:   # a message that did not parse
                        await self.context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    return
        finally:
            reader.cancel()
            for task in self.tasks:
                task.cancel()

    async def _read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for message in requests:
                for call in cv.decoded(message).calls:
                    self._start(call)
                while not self.room.is_set():
                    await self.room.wait()
        finally:
            self.reading = False
            self.ready.set()

    def _timeout(self, call: pb.SessionCall) -> float:
        if call.timeout_ms:
            return min(call.timeout_ms / 1000, MAX_TIMEOUT_S)
        if self.stream_deadline is not None:
            return max(0.0, min(self.stream_deadline - self.loop.time(), MAX_TIMEOUT_S))
        return DEFAULT_TIMEOUT_S

    def _start(self, call: pb.SessionCall) -> None:
        op = call.WhichOneof("call")
        if op is None:
            error = cv.RequestError(f"call {call.id} names no operation")
            self._answer(call.id, op, Failed(self.servicer.runner.error("session", error)))
            return
        request = getattr(call, op)
        timeout = self._timeout(call)
        if op in _SYNC:
            self._answer(call.id, op, _run_now(self.servicer, op, request, timeout, self.caller))
            return
        task = self.loop.create_task(self._call(call.id, op, request, timeout))
        self.tasks.add(task)
        if len(self.tasks) >= MAX_SESSION_INFLIGHT:
            self.room.clear()

    async def _call(self, rid: int, op: str, request: Any, timeout: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            self._answer(rid, op, await _run(self.servicer, op, request, timeout, self.caller))
        finally:
            self.tasks.discard(task)
            if len(self.tasks) < MAX_SESSION_INFLIGHT:
                self.room.set()
            if not self.tasks and not self.reading:
                self.ready.set()

    def _answer(self, rid: int, op: str | None, outcome: Done[Any] | Failed) -> None:
        if isinstance(outcome, Done):
            reply = pb.SessionReply(id=rid)
            assert op is not None
            getattr(reply, _REPLY_FIELD[op]).CopyFrom(outcome.result)
        else:
            reply = pb.SessionReply(id=rid, error=self.servicer._failure(outcome.error).error)
        self.pending.append(reply)
        self.ready.set()
