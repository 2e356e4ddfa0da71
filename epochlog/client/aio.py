"""The asyncio client: finds each group's leader, follows leader changes, retries safely.

Writes are requests of a client session (one per group, epochlog/client/sessions.py), numbered before
the first attempt, so a write retried after a lost reply or a leader change is applied at most once:
the node answers a retry with the first attempt's result, and a retry it can no longer judge is
refused, never applied again (the SDK raises OutcomeUnknownError when that hides an earlier attempt's
fate). Every write returns its commit offset; pass it as `min_offset` to read your own writes on any
node with `consistency="local"`.

A call never outlives its `timeout` (plus a network grace of a fraction of a second); within it, an
attempt on a node that stopped answering is abandoned after about two election timeouts and the call
moves to the other members (epochlog/client/retry.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from epochlog.api import messages as p
from epochlog.client.connection import GRACE_S, Connection, Sent
from epochlog.client.errors import (
    ClientError,
    InvalidArgumentError,
    NoAnswerError,
    NotLeaderError,
    OutcomeUnknownError,
    RejectedError,
    UnavailableError,
    from_wire,
)
from epochlog.client.retry import Attempts, Timing
from epochlog.client import credentials
from epochlog.client.tls import ClientTls
from epochlog.client.sessions import ClientSessions, GroupSession
from epochlog.api.routing import KV_PREFIX, entity_key, entity_prefix, group_of_event, group_of_key, user_key
from eventlog.errors import REQUEST_EXPIRED, SESSION_EXPIRED, from_code
from statemachines import events as ev
from statemachines.request_ids import uuid7s
from statemachines.sessions import session_id_at
from statemachines.state import KvState, decode_state

R = TypeVar("R")

_LEADER_READS = ("linearizable", "lease")


@dataclass(frozen=True, slots=True)
class KeyValue:
    name: str
    value: bytes
    version: int          # offset of the write that last changed it
    lease: int
    created: int          # offset of the write that created it


@dataclass(frozen=True, slots=True)
class Entity:
    key: str
    state: msgspec.Struct  # statemachines.state: BrokerState, TopicState, KvState...
    version: int


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Any]
    next_after: str | None
    applied: int


@dataclass(frozen=True, slots=True)
class Change:
    offset: int
    event: str
    state: msgspec.Struct | None


class History(list[Change]):
    """The changes of an entity, oldest first (a list), and `floor`: the group's history floor. The list
    starts with the entity's state at the floor; earlier changes are in the export archive only."""

    floor: int = 0


@dataclass(frozen=True, slots=True)
class WatchedEvent:
    """A committed event of a watch. Not every one changed anything: `applied` is False for a write
    that was rejected (a failed compare-and-set...), a retry answered with its first outcome, or a
    record the operator skipped; a consumer rebuilding state applies only the applied ones."""

    offset: int
    key: str
    event: ev.Event | None
    timestamp: int
    term: int = -1                  # the term of the leader that appended it (-1: the server did not say)
    applied: bool | None = None     # applying it changed the views (None: the server did not say, or
                                    # views older than the record's no-op bookkeeping; docs/protocol.md §8)


class AsyncClient:
    """A client of one cluster. `endpoints`: client addresses ("host:port") of some of its nodes."""

    def __init__(self, endpoints: Sequence[str] | str, *, timeout: float = 10.0, actor: str = "",
                 name: str = "epochlog-python", sessions: bool = True, tls: ClientTls | None = None,
                 token: str | None = None) -> None:
        """`sessions`: writes are requests of a client session (one per group, opened by the first write,
        closed by `close`): exactly once for retries however late. Off (for a client that makes a write
        or two and exits, like the CLI), each write carries a UUIDv7 request id instead: exactly once for
        retries within an hour (statemachines/request_ids.py), without the session's two extra records."""
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self.endpoints = [e.strip() for e in endpoints]
        if not self.endpoints:
            raise InvalidArgumentError("at least one endpoint is needed")
        self.timeout = timeout
        self.actor = actor
        self.name = name
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._leaders: dict[str, str] = {}   # group -> client address of its leader
        self._suspects: dict[str, float] = {}   # address -> monotonic time until which it is avoided
        self.timing = Timing.from_hello(0)      # from the latest hello (one cluster: one election timeout)
        self._rr = random.randrange(len(self.endpoints))
        self._sessions = ClientSessions(name, self._open_session)
        self.use_sessions = sessions
        # TLS and a bearer token: given, else the environment, else the credentials `epochlog up` made
        # for the cluster of these endpoints (epochlog/client/credentials.py)
        self.tls, self.token = credentials.resolve(self.endpoints, tls, token)
        self._tls_context = None if self.tls is None else self.tls.context()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._close_sessions()
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()

    # --- kv ---------------------------------------------------------------------------------------

    async def put(self, name: str, value: bytes, *, lease: int = 0, expected_version: int | None = None,
                  request_id: str = "") -> p.WriteResult:
        """Set `name`; with `expected_version` a compare-and-set (0: must not exist). Raises RejectedError
        if the condition failed. `request_id`: your own idempotency key, a UUIDv7
        (`statemachines.request_ids.uuid7()`): the same key within an hour is applied once, whichever
        client sends it; without one, this client's session makes its retries safe."""
        return await self.command(ev.KvPut(name=name, value=value, lease=lease, expected_version=expected_version,
                                           actor=self.actor, request_id=request_id))

    async def delete(self, name: str, *, expected_version: int | None = None) -> p.WriteResult:
        return await self.command(ev.KvDeleted(name=name, expected_version=expected_version, actor=self.actor))

    async def get(self, name: str, *, consistency: str = "linearizable", min_offset: int = -1,
                  as_of: int | None = None) -> KeyValue | None:
        got = await self.get_entity(_kv_key(name), consistency=consistency, min_offset=min_offset, as_of=as_of)
        return None if got is None else _kv(got)

    async def list(self, prefix: str = "", *, limit: int = 100, after: str | None = None,
                   consistency: str = "linearizable", min_offset: int = -1, as_of: int | None = None) -> Page:
        """One page of kv entries whose names start with `prefix` (`next_after` continues it)."""
        group_of_key(KV_PREFIX + prefix)   # refuses a prefix of another key space (kv/..., topic/...)
        page = await self.list_entities(prefix, limit=limit, after=after, consistency=consistency,
                                        min_offset=min_offset, as_of=as_of)
        return Page([_kv(e) for e in page.items], page.next_after, page.applied)

    async def scan(self, prefix: str = "", *, page_size: int = 1000, **read: Any) -> AsyncIterator[KeyValue]:
        """Every kv entry under `prefix`, page by page."""
        after = None
        while True:
            page = await self.list(prefix, limit=page_size, after=after, **read)
            for item in page.items:
                yield item
            if page.next_after is None:
                return
            after = page.next_after

    async def history(self, name: str, *, limit: int = 1000, after_offset: int = -1,
                      consistency: str = "linearizable", min_offset: int = -1) -> History:
        return await self.entity_history(_kv_key(name), limit=limit, after_offset=after_offset,
                                         consistency=consistency, min_offset=min_offset)

    async def txn(self, ops: Sequence[ev.Event], conditions: Iterable[tuple[str, int]] = ()) -> p.WriteResult:
        """Apply `ops` (KvPut, KvDeleted, ...) all or nothing if every (key, version) condition holds (keys
        as everywhere: `app/x` for a kv entry, `topic/orders` for another entity)."""
        return await self.command(ev.Txn(ops=tuple(ops),  # type: ignore[arg-type]
                                         conditions=tuple(ev.Condition(entity_key(k), v) for k, v in conditions),
                                          actor=self.actor))

    # --- leases -----------------------------------------------------------------------------------

    async def lease_grant(self, ttl_ms: int) -> p.Lease:
        lease_id = random.getrandbits(62) | 1
        written = await self.command(ev.LeaseGranted(lease_id=lease_id, ttl_ms=ttl_ms, actor=self.actor))
        return p.Lease(lease_id, ttl_ms, written.offset)

    async def lease_keepalive(self, lease_id: int) -> int:
        """Restart the lease's clock; its TTL in ms."""
        result = await self._call(p.LeaseKeepAlive(lease_id), group="kv", leader=True)
        assert isinstance(result, p.Lease)
        return result.ttl_ms

    async def lease_revoke(self, lease_id: int) -> p.WriteResult:
        return await self.command(ev.LeaseRevoked(lease_id=lease_id, actor=self.actor))

    # --- typed commands and entities --------------------------------------------------------------

    async def command(self, event: ev.Event) -> p.WriteResult:
        """Append one event; its result (raises RejectedError if applying it changed nothing)."""
        (result,) = await self.commands([event])
        if not result.ok:
            raise RejectedError(result)
        return result

    async def commands(self, events: Sequence[ev.Event]) -> list[p.WriteResult]:
        """Append many events in one call; one result per event (rejections are results, not errors).
        Events of one group are committed together, in order.

        Each write is applied at most once, however often it is retried (client sessions:
        epochlog/client/sessions.py); OutcomeUnknownError when a retry could not learn whether an
        earlier attempt was applied."""
        actor = self.actor
        fresh = iter(uuid7s(sum(1 for e in events if not e.request_id)))
        stamped = [e if e.request_id and (e.actor or not actor) else
                   msgspec.structs.replace(e, request_id=e.request_id or next(fresh), actor=e.actor or actor)
                   for e in events]
        for e in stamped:
            e.validate()
        groups = {group_of_event(e) for e in stamped}
        if len(groups) == 1:
            own_ids = [bool(e.request_id) for e in events]   # the caller's idempotency keys: no session
            return await self._write_in_session(groups.pop(), stamped, own_ids)
        # One call per group, each to its leader, concurrently; results in the caller's order.
        order: dict[str, list[int]] = {}
        for i, e in enumerate(stamped):
            order.setdefault(group_of_event(e), []).append(i)
        parts = await asyncio.gather(*(self.commands([stamped[i] for i in idx]) for idx in order.values()))
        results: list[p.WriteResult | None] = [None] * len(stamped)
        for idx, part in zip(order.values(), parts):
            for i, r in zip(idx, part):
                results[i] = r
        return [r for r in results if r is not None]

    async def _write_in_session(self, group: str, events: list[ev.Event], own_ids: list[bool]) -> list[p.WriteResult]:
        """One group's events as requests of this client's session in that group (see `commands`), or,
        without sessions, with their UUIDv7 request ids. An event that came with its own request id (the
        caller's idempotency key, reused across clients or restarts) is sent with it and no session."""
        attempts = Attempts()
        if not self.use_sessions or all(own_ids):
            result = await self._call(p.Write(events), group=group, leader=True, attempts=attempts)  # type: ignore[arg-type]
            assert isinstance(result, p.Written)
            refused = next((r for r in result.results if r.code == REQUEST_EXPIRED), None)
            if refused is not None and attempts.in_doubt:
                raise OutcomeUnknownError(f"the write to group {group} may or may not have been applied: an earlier "
                                          f"attempt got no answer, and the retry came too late ({refused.message})")
            return result.results
        deadline = time.monotonic() + self.timeout
        while True:
            session = self._sessions.current(group) or await self._sessions.get(group)
            seqs = session.take(len(events))
            below = session.answered_below
            requests = [e if own else msgspec.structs.replace(e, session_id=session.id, seq=seq, answered_below=below,
                                                              v=max(e.v, ev.SESSIONS_SCHEMA))
                        for e, seq, own in zip(events, seqs, own_ids)]
            try:
                result = await self._call(p.Write(requests), group=group, leader=True,  # type: ignore[arg-type]
                                          timeout=max(0.001, deadline - time.monotonic()), attempts=attempts)
            finally:
                session.answered(seqs)
            assert isinstance(result, p.Written)
            refused = [r for r in result.results if r.code in (SESSION_EXPIRED, REQUEST_EXPIRED)]
            if not refused:
                return result.results
            self._sessions.expired(session)
            if attempts.in_doubt:
                raise OutcomeUnknownError(
                    f"the write to group {group} may or may not have been applied: an earlier attempt got no "
                    f"answer, and its session expired before a retry could learn the outcome ({refused[0].message}); "
                    f"read the state to find out")
            if len(refused) < len(result.results) or time.monotonic() >= deadline:
                return result.results   # some applied: the refused ones are results like any rejection
            # Refused, and no attempt could have been applied: the same write under a new session.

    async def _open_session(self, group: str, client: str) -> int:
        """Open a client session in `group`: its id (the offset its ClientSessionOpened committed at + 1)."""
        opened = ev.ClientSessionOpened(group=group, client=client, actor=self.actor)
        result = await self._call(p.Write([opened]), group=group, leader=True)
        assert isinstance(result, p.Written)
        (written,) = result.results
        if not written.ok:
            raise from_code(written.code or ClientError.code,
                            f"cannot open a client session in group {group}: {written.code}: {written.message}")
        return session_id_at(written.offset)

    async def _close_sessions(self) -> None:
        """Close every open session (best effort, briefly: an unclosed session expires by itself)."""
        sessions = self._sessions.open_sessions()
        self._sessions.forget_all()

        async def close(session: GroupSession) -> None:
            (seq,) = session.take(1)
            closed = ev.ClientSessionClosed(group=session.group, client=self._sessions.client, actor=self.actor,
                                            session_id=session.id, seq=seq, answered_below=session.answered_below,
                                            v=ev.SESSIONS_SCHEMA)
            try:
                await self._call(p.Write([closed]), group=session.group, leader=True, timeout=min(self.timeout, 2.0))
            except (ClientError, TimeoutError):
                pass

        await asyncio.gather(*(close(s) for s in sessions))

    async def get_entity(self, key: str, *, consistency: str = "linearizable", min_offset: int = -1,
                         as_of: int | None = None) -> Entity | None:
        """The entity `key` names (`app/x`, `topic/orders`: epochlog/api/routing.py), or None."""
        key = entity_key(key)
        result = await self._read(p.Get(key, consistency, min_offset, as_of), group_of_key(key), consistency)
        assert isinstance(result, p.Got)
        return None if result.item is None else _entity(result.item)

    async def get_many(self, keys: Sequence[str], *, consistency: str = "linearizable",
                       min_offset: int = -1) -> list[Entity | None]:
        """Many entity reads in one call (all keys must belong to one group)."""
        keys = [entity_key(k) for k in keys]
        groups = {group_of_key(k) for k in keys}
        if len(groups) != 1:
            raise InvalidArgumentError("get_many reads from one group at a time")
        result = await self._read(p.Gets([p.Get(k, consistency, min_offset) for k in keys]), groups.pop(),
                                  consistency)
        assert isinstance(result, p.GotMany)
        return [None if g.item is None else _entity(g.item) for g in result.replies]

    async def list_entities(self, prefix: str, *, limit: int = 100, after: str | None = None,
                            consistency: str = "linearizable", min_offset: int = -1,
                            as_of: int | None = None) -> Page:
        """One page of the entities whose keys start with `prefix` (`app/`, `broker/c1/`; `next_after` continues)."""
        prefix = entity_prefix(prefix)
        call = p.List(prefix=prefix, limit=limit, after=None if after is None else entity_key(after),
                      consistency=consistency, min_offset=min_offset, as_of=as_of)
        result = await self._read(call, group_of_key(prefix), consistency)
        assert isinstance(result, p.Listed)
        return Page([_entity(i) for i in result.items],
                    None if result.next_after is None else user_key(result.next_after), result.applied)

    async def entity_history(self, key: str, *, limit: int = 1000, after_offset: int = -1,
                             consistency: str = "linearizable", min_offset: int = -1) -> History:
        key = entity_key(key)
        result = await self._read(p.History(key, limit, after_offset, consistency, min_offset), group_of_key(key),
                                  consistency)
        assert isinstance(result, p.HistoryRows)
        raw = key.encode()
        changes = History(Change(r.offset, r.event, None if r.state is None else decode_state(raw, r.state))
                          for r in result.rows)
        changes.floor = result.floor
        return changes

    # --- watch and events -------------------------------------------------------------------------

    async def watch(self, prefix: str, *, from_offset: int = -1, window: int = 4096) -> AsyncIterator[WatchedEvent]:
        """Events whose key starts with `prefix` (`app/` for kv entries, `broker/`...: one key space,
        epochlog/api/routing.py), from `from_offset` on, forever; `WatchedEvent.key` is in the same form.
        A transaction comes once if any of its operations writes under `prefix` (its key: `txn/<first op>`).

        If the node serving the watch goes away, the watch resumes on another node from the offset
        after the last event delivered: no gaps, no repeats. A watch behind the log start raises
        CompactedError. Every committed event comes, including those that changed nothing
        (`WatchedEvent.applied` False): skip them to rebuild the views.
        """
        prefix = entity_prefix(prefix)
        group = group_of_key(prefix)
        next_offset = from_offset
        deadline_base = self.timeout
        avoid: set[str] = set()    # nodes that just answered a retriable error (e.g. group_halted)
        while True:
            conn = await self._any_connection(deadline_base, avoid)
            rid, queue = conn.open_stream(p.Watch(prefix, next_offset, group, window))
            unacked = 0
            try:
                while True:
                    reply = await queue.get()
                    if reply.error is not None:
                        if reply.error.code == UnavailableError.code:
                            break   # the connection dropped: resume elsewhere
                        if reply.error.retriable:
                            avoid.add(conn.address)
                            await asyncio.sleep(0.05)
                            break   # this node cannot serve it now: resume on another one
                        raise from_wire(reply.error)
                    result = reply.result
                    if isinstance(result, p.WatchStarted):
                        next_offset = result.from_offset
                    elif isinstance(result, p.WatchEvents):
                        for r in result.events:
                            next_offset = r.offset + 1
                            yield WatchedEvent(r.offset, user_key(r.key), None if r.value is None else ev.decode_event(r.value),
                                               r.timestamp, r.term, r.applied)
                        unacked += len(result.events)
                        if unacked * 2 >= window:
                            conn.send_oneway(p.WatchAck(rid, unacked))
                            unacked = 0
            finally:
                conn.close_stream(rid)
                conn.send_oneway(p.CancelWatch(rid))

    async def read_events(self, group: str, from_offset: int, *, max_events: int = 1000,
                          max_bytes: int = 1 << 20, endpoint: str | None = None) -> p.Events:
        """Committed events of `group` from `from_offset`: every event committed before the call (up to
        the limits), from the leader or, with `endpoint`, from that node, leader or not (a follower asks
        its leader for the commit index and waits until it applied that far: docs/protocol.md)."""
        call = p.ReadEvents(group, from_offset, max_events, max_bytes)
        if endpoint is not None:
            result = await self._call_on(endpoint, call)
        else:
            result = await self._call(call, group=group, leader=True)
        assert isinstance(result, p.Events)
        return result

    async def read_log(self, group: str, from_offset: int, *, max_bytes: int = 4 << 20,
                       endpoint: str | None = None) -> p.LogBatches:
        """Committed batches of `group` from `from_offset` as the log stores them (decode them with
        `eventlog.offline.decode_batches`), from the leader or from the node at `endpoint` (see
        `read_events`): the form an exporter reads, as the node does no per-record work for it."""
        call = p.ReadLog(group, from_offset, max_bytes)
        if endpoint is not None:
            result = await self._call_on(endpoint, call)
        else:
            result = await self._call(call, group=group, leader=True)
        assert isinstance(result, p.LogBatches)
        return result

    # --- cluster ----------------------------------------------------------------------------------

    async def status(self, endpoint: str | None = None) -> p.StatusInfo:
        """One node's view of every group (the first reachable endpoint unless one is named)."""
        if endpoint is not None:
            result = await self._call_on(endpoint, p.Status())
        else:
            result = await self._call(p.Status(), group=None, leader=False)
        assert isinstance(result, p.StatusInfo)
        return result

    async def cluster_status(self) -> list[p.StatusInfo | ClientError]:
        """Every member's status (members found through any reachable node); an error for those down."""
        first = await self.status()
        addresses = [m.client_address for m in first.members if m.client_address]

        async def one(address: str) -> p.StatusInfo | ClientError:
            try:
                return await self.status(address)
            except ClientError as exc:   # unreachable, or connected but silent (NoAnswerError)
                return exc

        return list(await asyncio.gather(*(one(a) for a in addresses)))

    async def _leader_address(self, group: str) -> str:
        """The client address of `group`'s leader as a node's status names it (until the deadline)."""
        deadline = time.monotonic() + self.timeout
        while True:
            info = await self._call(p.Status(), group=None, leader=False,
                                    timeout=max(0.001, deadline - time.monotonic()))
            assert isinstance(info, p.StatusInfo)
            leader = next((g.leader for g in info.groups if g.group == group), None)
            if leader is None:
                raise InvalidArgumentError(f"no group {group!r} (groups: {', '.join(g.group for g in info.groups)})")
            address = next((m.client_address for m in info.members if m.id == leader), "")
            if address:
                self._leaders[group] = address
                return address
            if time.monotonic() > deadline:
                raise UnavailableError(f"group {group} has no leader with a client address (leader {leader})")
            await asyncio.sleep(0.1)

    async def transfer_leader(self, group: str, to: int = 0) -> None:
        await self._call(p.TransferLeader(group, to), group=group, leader=True)

    async def snapshot(self, group: str, endpoint: str | None = None) -> int:
        """Snapshot `group` on the node at `endpoint`, or on the group's leader; the snapshot's offset.

        A node snapshots whatever it applied and never answers not_leader here, so the leader is
        looked up first (sending it to "any node" would snapshot a follower instead)."""
        call = p.Snapshot(group)
        if endpoint is None:
            endpoint = await self._leader_address(group)
        result = await self._call_on(endpoint, call)
        assert isinstance(result, p.Done)
        return result.offset

    async def group_skip(self, group: str, offset: int, endpoint: str) -> int:
        """Skip the record `group` halted at (`offset`) on the node at `endpoint`; its applied offset after.

        Operator recovery (docs/views.md): only when no Epochlog version can apply the record, on
        every member halted there (`epochlog group skip` checks every member first)."""
        result = await self._call_on(endpoint, p.GroupSkip(group, offset))
        assert isinstance(result, p.Done)
        return result.offset

    async def compaction_status(self, endpoint: str | None = None) -> p.CompactionInfo:
        """One node's retention of every group (the first reachable endpoint unless one is named)."""
        if endpoint is not None:
            result = await self._call_on(endpoint, p.CompactionStatus())
        else:
            result = await self._call(p.CompactionStatus(), group=None, leader=False)
        assert isinstance(result, p.CompactionInfo)
        return result

    async def members(self) -> p.Members:
        result = await self._call(p.MemberList(), group="metadata", leader=True)
        assert isinstance(result, p.Members)
        return result

    async def member_add(self, node_id: int, peer_address: str, client_address: str = "", *,
                         auto_promote: bool = True, group: str = "") -> p.Members:
        """Add node `node_id` (started with `epochlog serve --peer-address ...`) as a learner of every
        group (`group`: of that one only), promoted to voter once caught up unless `auto_promote` is off.
        Safe to retry: what is already done is skipped."""
        result = await self._call(p.MemberAdd(node_id, peer_address, client_address, auto_promote, group),
                                  group=group or "metadata", leader=True, timeout=max(self.timeout, 30.0))
        assert isinstance(result, p.Members)
        return result

    async def member_promote(self, node_id: int, *, group: str = "") -> p.Members:
        result = await self._call(p.MemberPromote(node_id, group), group=group or "metadata", leader=True,
                                  timeout=max(self.timeout, 30.0))
        assert isinstance(result, p.Members)
        return result

    async def member_remove(self, node_id: int, *, group: str = "") -> p.Members:
        """Remove node `node_id` from every group (`group`: from that one only), then forget its address."""
        result = await self._call(p.MemberRemove(node_id, group), group=group or "metadata", leader=True,
                                  timeout=max(self.timeout, 30.0))
        assert isinstance(result, p.Members)
        return result

    # --- routing and retries ----------------------------------------------------------------------

    async def _read(self, call: p.Call, group: str, consistency: str) -> p.Result:
        return await self._call(call, group=group, leader=consistency in _LEADER_READS)

    async def _call(self, call: p.Call, *, group: str | None, leader: bool, timeout: float | None = None,
                    attempts: Attempts | None = None) -> p.Result:
        """Send `call` to the group's leader (or any node), retrying retriable failures until the deadline.

        An attempt that has no answer after `timing.attempt_s` is left for another node, unless the
        node still leads `group` (asked, see `_answer`). `attempts`, when given, is filled in as the
        attempts go: whether any of them may have been proposed (retry.Attempts), however the call ends.
        """
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        record = Attempts() if attempts is None else attempts
        limit = self.timing.attempt_s
        delay = 0.02
        last: ClientError | None = None
        tried: set[str] = set()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last or UnavailableError(f"no answer within {budget:.1f} s")
            address = self._pick(group if leader else None, tried)
            sent: Sent | None = None
            try:
                conn = self._connections.get(address)   # the usual case: open, no coroutine to run
                if conn is None or not conn.open:
                    conn = await self._connection(address, min(remaining, limit))
                sent = conn.send(call, remaining)   # raises, nothing sent, if the connection closed
                record.sent += 1
                try:
                    result = await self._answer(conn, sent, group if leader else None, deadline, limit)
                finally:
                    conn.forget(sent)
                record.settle(None)
                self._suspects.pop(address, None)
                if leader and group is not None:
                    self._leaders[group] = address   # it served as the leader: the next call goes straight there
                return result
            except NotLeaderError as exc:
                record.settle(exc)
                self._suspects.pop(address, None)
                last = exc
                tried.add(address)
                if group is not None:
                    if exc.leader_address and exc.leader_address != address:
                        self._leaders[group] = exc.leader_address   # _pick goes there next, unless tried or suspect
                    else:
                        self._leaders.pop(group, None)
            except ClientError as exc:
                if sent is not None:
                    record.settle(exc)
                if not exc.retriable:
                    raise
                last = exc
                tried.add(address)
                if group is not None and self._leaders.get(group) == address:
                    self._leaders.pop(group, None)
                if isinstance(exc, NoAnswerError) or sent is None:   # silent, or could not be reached
                    self._suspects[address] = time.monotonic() + self.timing.suspect_s
                    if sent is not None:
                        limit *= 2   # a node that is only slow gets longer next time
                else:
                    self._suspects.pop(address, None)
            except BaseException as exc:   # cancelled: an attempt in flight may have been proposed
                if sent is not None:
                    record.settle(exc)
                raise
            if not self._untried(tried):   # a round over every member not suspected: pause, start again
                tried.clear()
                await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, self.timing.backoff_max_s)

    async def _answer(self, conn: Connection, sent: Sent, group: str | None, deadline: float, limit: float) -> p.Result:
        """The answer to `sent`, until the call's deadline (plus the grace in which the node's own
        deadline_exceeded arrives).

        Past `limit` without one: a node that still says it leads `group` (a status request, answered
        from its memory, shared by the calls waiting on the connection) is slow, not stuck, and is
        waited for again, asked again every election timeout, rather than sent the request a second
        time (a starved leader would only get more work). Otherwise NoAnswerError: the node stopped
        answering, or lost its leadership (cut off from its peers, it stepped down), and the call
        goes elsewhere."""
        wait = limit
        while True:
            left = deadline + GRACE_S - time.monotonic()
            try:
                return await conn.wait(sent, max(0.0, min(wait, left)))
            except NoAnswerError:
                if group is None or wait >= left or not await self._still_leads(conn, group, deadline):
                    raise
            wait = conn.timing.election_timeout_s

    async def _still_leads(self, conn: Connection, group: str, deadline: float) -> bool:
        """Whether the node behind `conn` says it leads `group` (False when it does not answer in time)."""
        timing = conn.timing
        wait = min(timing.ping_timeout_s, deadline - time.monotonic())
        if not conn.open or wait <= 0:
            return False
        try:
            status = await conn.status(wait, max_age_s=timing.election_timeout_s / 2)
        except ClientError:
            return False
        return any(g.group == group and g.role == "leader" for g in status.groups)

    def _suspected(self, address: str) -> bool:
        until = self._suspects.get(address)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._suspects[address]
            return False
        return True

    def _untried(self, tried: set[str]) -> list[str]:
        """Known addresses not tried yet in this round, suspects left out (all of them, if every one is suspect)."""
        known = self._known_addresses()
        healthy = [a for a in known if not self._suspected(a)] or known
        return [a for a in healthy if a not in tried]

    def _known_addresses(self) -> list[str]:
        known = list(self.endpoints)
        known += [a for a in self._leaders.values() if a not in known]
        return known

    def _pick(self, group: str | None, tried: set[str]) -> str:
        if group is not None:
            leader = self._leaders.get(group)
            if leader is not None and leader not in tried and not self._suspected(leader):
                return leader
        candidates = self._untried(tried) or self._known_addresses()
        self._rr = (self._rr + 1) % len(candidates)
        return candidates[self._rr]

    async def _call_on(self, address: str, call: p.Call) -> p.Result:
        """`call` on the node at `address` only, connecting included, within the client's timeout."""
        deadline = time.monotonic() + self.timeout
        conn = await self._connection(address, self.timeout)
        return await conn.call(call, max(0.001, deadline - time.monotonic()))

    async def _any_connection(self, timeout: float, avoid: set[str] | None = None) -> Connection:
        """A connection to a reachable node, preferring those not in `avoid` (emptied once all were)."""
        deadline = time.monotonic() + timeout
        last: ClientError | None = None
        if avoid is not None and not set(self._known_addresses()) - avoid:
            avoid.clear()
        while time.monotonic() < deadline:
            known = self._known_addresses()
            for address in [a for a in known if a not in (avoid or ())] + [a for a in known if a in (avoid or ())]:
                try:
                    return await self._connection(address, max(0.1, deadline - time.monotonic()))
                except ClientError as exc:
                    last = exc
            await asyncio.sleep(0.1)
        raise last or UnavailableError("no endpoint reachable")

    async def _connection(self, address: str, timeout: float) -> Connection:
        """An open connection to `address` (UnavailableError within `timeout` if there is none)."""
        conn = self._connections.get(address)
        if conn is not None and conn.open:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:   # another call is connecting: wait for it, within this call's time
            try:
                conn = await asyncio.wait_for(asyncio.shield(pending), timeout)
            except TimeoutError:
                raise UnavailableError(f"cannot connect to {address}: no hello within {timeout:.2f} s") from None
            if not conn.open:     # it died while this call was being resumed
                raise UnavailableError(f"the connection to {address} closed as it opened")
            return conn
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            conn = Connection(address, client_name=self.name, tls=self._tls_context, token=self.token)
            await conn.connect(min(timeout, 5.0))
            self._connections[address] = conn
            self.timing = conn.timing
            future.set_result(conn)
            return conn
        except BaseException as exc:   # waiters get a connection error, even when this call was cancelled
            future.set_exception(exc if isinstance(exc, Exception)
                                 else UnavailableError(f"connecting to {address} was abandoned"))
            future.exception()   # retrieved: waiters re-raise it
            raise
        finally:
            del self._connecting[address]


def _entity(item: p.Item) -> Entity:
    return Entity(user_key(item.key), decode_state(item.key.encode(), item.state), item.version)


def _kv_key(name: str) -> str:
    """The user key of the kv entry `name` where only kv entries are meant: a name of another space
    (`kv/app/x`, `topic/orders`) is refused by the routing rule, not read as a key that cannot exist."""
    group_of_key(KV_PREFIX + name)
    return name


def _kv(entity: Entity) -> KeyValue:
    state = entity.state
    assert isinstance(state, KvState)
    return KeyValue(state.name, state.value, entity.version, state.lease, state.created)
