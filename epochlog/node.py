"""An Epochlog node: its Raft groups with their views, and the operations clients call on them.

`Node` is what `epochlog serve` runs. It owns a NodeHost (every group of the cluster, each with a
ViewsStateMachine over RocksDB) and exposes the operations of the client protocol as coroutines
returning protocol messages, so the native server and the gRPC face share one implementation.

Writes go to the leader of the group that owns the entity (epochlog.routing); a follower answers
`not_leader` with the leader's id and client address, and the SDK retries there. A Write naming
several groups commits each group's part atomically and in order, but the groups independently:
each event carries a request id, so retrying the whole Write after a failure never applies an event
twice.

Membership. The configured members are every group's initial voters. The address book (peer and
client address of every member) is that list overlaid by the `member/<id>` records of the metadata
group's views (MemberAdded / MemberRemoved), so every node learns a member added at runtime as it
applies the record, durably, and keeps it across restarts and snapshots; the node follows the
metadata group and tells its peer transport (add_peer / remove_peer). A node outside the configured
list starts with its own addresses (`epochlog serve --peer-address ...`) and the configured initial
voters, so it never campaigns: it waits to be added.

Membership calls are served by the metadata leader, one node and one group at a time:

- add: record the node's addresses, then add it as a learner (auto-promoted to voter once caught up
  unless told otherwise) to the metadata group, then to every other group;
- promote: make the learner a voter in every group;
- remove: take it out of every group, the metadata group last, then record its removal (nodes stop
  dialing it and refuse it). The metadata leader removing itself first hands leadership over and
  answers not_leader, so the client retries at the new leader. Refused if the node is the last
  voter of a group; a removed group leader steps down once its removal commits.

Each group's change is made by that group's leader: the metadata leader makes the ones it leads and
forwards the others through the SDK with the call's `group` set (the SDK follows the group's
leader). A step already done is skipped, so retrying a call that failed half way finishes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from eventlog.configuration import from_mapping
from eventlog.errors import ConfigError, EpochlogError, OffsetOutOfRangeError
from eventlog.raft.errors import CompactedError, ConfChangeError, NotFoundError, NotLeaderError, RaftError
from eventlog.raft.node import Role
from eventlog.raft.runtime.config import MemberConfig, NodeConfigs, parse_address
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.host import NodeHost
from eventlog.raft.types import ConfChange, ConfChangeKind, ConfState
from epochlog import protocol as p
from controller.config import controller_config
from controller.runtime import ControllerRuntime
from epochlog.routing import REQUIRED_GROUPS, group_of_event, group_of_key
from statemachines import events as ev
from statemachines.query import MAX_LIMIT, Query
from statemachines.state import MemberState, Outcome, decode_state, encode
from statemachines.store import ViewsConfig, ViewStore, version_key
from statemachines.views import ViewsStateMachine

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
MEMBERSHIP_TIMEOUT_S = 60.0   # a whole membership call (the client's deadline usually ends it first)
MEMBERS_REFRESH_S = 0.05      # the address book is re-read at most this often under metadata writes
EXPORT_WATERMARKS = "config/export/"   # export watermarks (see export_floor)


class NodeError(EpochlogError):
    """A request the node cannot serve as asked (unknown group, bad consistency, ...)."""

    code = "invalid_argument"


class Node:
    """One node: call everything from the loop that ran `start()`."""

    def __init__(self, configs: NodeConfigs, node_id: int, data_dir: str | Path, *, seed: int | None = None,
                 member: MemberConfig | None = None) -> None:
        self.configs = configs
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.views_config = from_mapping(ViewsConfig, configs.views, "views")
        self.controller = ControllerRuntime(self, controller_config(configs.controller))  # on the metadata leader
        missing = [g for g in REQUIRED_GROUPS if g not in configs.cluster.groups]
        if missing:
            raise ConfigError("cluster.groups", list(configs.cluster.groups),
                              f"must include {', '.join(REQUIRED_GROUPS)} (missing {', '.join(missing)})")
        self.member = configs.cluster.member(node_id) if member is None else member
        self.views: dict[str, ViewsStateMachine] = {}
        self.host = NodeHost(node_id, self.data_dir, configs, self._open_views, seed=seed, member=self.member,
                             compaction_floor=self.export_floor)
        self.members: dict[int, p.MemberInfo] = self._configured_members()   # the address book
        self.removed: set[int] = set()   # nodes removed at runtime (tombstones in the metadata views)
        self._members_task: asyncio.Task[None] | None = None
        self._membership_lock: asyncio.Lock | None = None

    def _open_views(self, name: str, directory: Path) -> ViewsStateMachine:
        sm = ViewsStateMachine(directory, self.views_config)
        self.views[name] = sm
        return sm

    def export_floor(self, group: str) -> int | None:
        """The lowest export watermark recorded for `group`, or None when no exported table records one.

        `epochlog export` reports the highest offset of each group its Delta table holds as a config
        entry `config/export/<table>` of the metadata group (value: JSON {group: offset}); a group
        compacting its log keeps every offset above the lowest of them, so no event is deleted before
        every table has it (spark/export.py). A stale read of the local views only keeps more."""
        views = self.views.get("metadata")
        if views is None:
            return None
        floors = []
        for item in Query(views.store).list(EXPORT_WATERMARKS, limit=MAX_LIMIT).items:
            try:
                floors.append(int(json.loads(item.state.value)[group]))  # type: ignore[attr-defined]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue   # not a watermark of this group
        return min(floors) if floors else None

    async def start(self) -> None:
        await self.host.start()
        self._refresh_members()
        self._members_task = asyncio.get_running_loop().create_task(self._follow_members(), name="members")
        self.controller.start()

    async def stop(self) -> None:
        if self._members_task is not None:
            self._members_task.cancel()
            try:
                await self._members_task
            except (asyncio.CancelledError, EpochlogError):
                pass
        await self.controller.stop()
        await self.host.stop()

    @property
    def cluster(self) -> str:
        return self.configs.cluster.name

    def failure(self) -> str | None:
        """Why the node cannot go on (a group failed, e.g. its disk), or None."""
        for name, group in self.host.groups.items():
            if group.failed is not None:
                return f"group {name} failed: {group.failed!r}"
        return None

    # --- helpers ----------------------------------------------------------------------------------

    def group(self, name: str) -> RaftGroup:
        group = self.host.groups.get(name)
        if group is None:
            raise NodeError(f"no group {name!r} (groups: {', '.join(self.host.groups)})")
        return group

    @property
    def client_addresses(self) -> dict[int, str]:
        return {i: m.client_address for i, m in self.members.items()}

    def leader_address(self, error: NotLeaderError) -> str:
        return self.client_addresses.get(error.leader_hint, "")

    def _query(self, group: str) -> Query:
        return Query(self.views[group].store)

    async def _barrier(self, group: str, consistency: str, min_offset: int, timeout: float) -> int:
        if consistency not in p.CONSISTENCY:
            raise NodeError(f"consistency {consistency!r} is not one of {', '.join(p.CONSISTENCY)}")
        return await self.group(group).read_barrier(consistency, min_offset, timeout)

    # --- writes -----------------------------------------------------------------------------------

    async def write(self, events: Sequence[ev.Event]) -> list[p.WriteResult]:
        """Validate every event first (nothing is appended if one is invalid), then commit per group."""
        if not events:
            raise NodeError("a write carries at least one event")
        by_group: dict[str, list[int]] = defaultdict(list)
        records: dict[str, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
        for i, event in enumerate(events):
            if isinstance(event, ev.MemberAdded | ev.MemberRemoved):
                raise NodeError("member records are written by member_add and member_remove only")
            record = ev.event_record(event)
            group = group_of_event(event)
            by_group[group].append(i)
            records[group].append(record)
        for group in by_group:
            self.group(group)
        names = list(by_group)
        committed = await asyncio.gather(*(self.group(g).submit(records[g]) for g in names))
        results: list[p.WriteResult | None] = [None] * len(events)
        for group, done in zip(names, committed):
            for j, i in enumerate(by_group[group]):
                outcome = done.outcomes[j] if j < len(done.outcomes) else None
                results[i] = _result(group, done.offset + j, outcome)
        return [r for r in results if r is not None]

    async def lease_grant(self, call: p.LeaseGrant) -> p.Lease:
        lease_id = call.lease_id or (secrets.randbits(62) | 1)
        event = ev.LeaseGranted(lease_id=lease_id, ttl_ms=call.ttl_ms, request_id=call.request_id)
        (result,) = await self.write([event])
        if not result.ok:
            raise _rejected(result)
        return p.Lease(lease_id, call.ttl_ms, result.offset)

    def lease_keepalive(self, call: p.LeaseKeepAlive) -> p.Lease:
        ttl = self.group("kv").keepalive(call.lease_id)
        return p.Lease(call.lease_id, ttl)

    # --- reads ------------------------------------------------------------------------------------

    async def get(self, call: p.Get, timeout: float = DEFAULT_TIMEOUT_S) -> p.Got:
        group = group_of_key(call.key)
        applied = await self._barrier(group, call.consistency, call.min_offset, timeout)
        item = self._query(group).get(call.key, as_of=call.as_of)
        return p.Got(None if item is None else p.Item(item.key, encode(item.state), item.version), applied)

    async def get_many(self, call: p.Gets, timeout: float = DEFAULT_TIMEOUT_S) -> p.GotMany:
        if len(call.gets) > MAX_LIMIT:
            raise NodeError(f"at most {MAX_LIMIT} reads per call, got {len(call.gets)}")
        return p.GotMany(list(await asyncio.gather(*(self.get(g, timeout) for g in call.gets))))

    async def list(self, call: p.List, timeout: float = DEFAULT_TIMEOUT_S) -> p.Listed:
        if call.end and not call.start:
            raise NodeError("a range needs start as well as end")
        key = call.start or call.prefix
        group = group_of_key(key)
        applied = await self._barrier(group, call.consistency, call.min_offset, timeout)
        query = self._query(group)
        if call.end:
            page = query.range(call.start, call.end, limit=call.limit, after=call.after, as_of=call.as_of)
        else:
            page = query.list(call.prefix, limit=call.limit, after=call.after, as_of=call.as_of)
        items = [p.Item(i.key, encode(i.state), i.version) for i in page.items]
        return p.Listed(items, page.next, applied)

    async def history(self, call: p.History, timeout: float = DEFAULT_TIMEOUT_S) -> p.HistoryRows:
        group = group_of_key(call.key)
        applied = await self._barrier(group, call.consistency, call.min_offset, timeout)
        rows = self._query(group).history(call.key, limit=call.limit, after_offset=call.after_offset)
        return p.HistoryRows([p.HistoryRow(r.offset, r.event, None if r.state is None else encode(r.state))
                              for r in rows], applied)

    def read_events(self, call: p.ReadEvents) -> p.Events:
        """Committed records of a group's log from `from_offset` (what this node has applied)."""
        group = self.group(call.group)
        if call.max_events < 1 or call.max_bytes < 1:
            raise NodeError("max_events and max_bytes are positive")
        log = group.storage.log
        applied = group.sm.applied_index
        offset = max(call.from_offset, 0)
        if offset < log.start_offset:
            raise _compacted(group, offset)
        out: list[p.EventRecord] = []
        next_offset = offset
        if offset <= applied:
            try:
                chunk = log.read(offset, call.max_bytes, max_offset=applied + 1)
            except OffsetOutOfRangeError:
                raise _compacted(group, offset) from None
            if chunk is not None:
                store = self.views[call.group].store
                for batch in chunk.batches():
                    if batch.header.is_control:
                        continue
                    for record in batch.records():
                        if record.offset < offset or len(out) >= call.max_events:
                            continue
                        out.append(p.EventRecord(record.offset, _key_text(record.key),
                                                 None if record.value is None else bytes(record.value),
                                                 record.timestamp, batch.header.leader_epoch,
                                                 _changed_views(store, record.key, record.offset)))
                next_offset = out[-1].offset + 1 if len(out) >= call.max_events else max(offset, chunk.next_offset)
        return p.Events(out, next_offset, log.start_offset, group.node.log.committed)

    async def watch(self, call: p.Watch) -> tuple[str, int, AsyncIterator[p.EventRecord]]:
        """(group, first offset, the records) for a watch; the iterator raises CompactedError on a gap."""
        group_name = call.group or group_of_key(call.prefix if "/" in call.prefix else call.prefix + "/")
        group = self.group(group_name)
        start = call.from_offset if call.from_offset >= 0 else group.sm.applied_index + 1
        if start < group.storage.log.start_offset:
            raise _compacted(group, start)

        async def records() -> AsyncIterator[p.EventRecord]:
            async for e in group.watch(call.prefix.encode(), start):
                yield p.EventRecord(e.offset, _key_text(e.key), e.value, e.timestamp)

        return group_name, start, records()

    # --- cluster ----------------------------------------------------------------------------------

    def status(self) -> p.StatusInfo:
        groups = []
        for name, group in self.host.groups.items():
            s = group.status()
            conf = group.node.conf
            progress = group.node.progress if s.role == "leader" else {}
            peers = [p.PeerInfo(n, "voter" if n in conf.voters else "learner",
                                progress[n].match if n in progress else -1)
                     for n in (*conf.voters, *conf.learners)]
            groups.append(p.GroupInfo(name, self.node_id, s.role, s.term, s.leader, s.commit, s.applied,
                                      s.last_index, s.log_start, s.snapshot_index, peers))
        return p.StatusInfo(self.cluster, self.node_id, groups, self._members())

    def _members(self) -> list[p.MemberInfo]:
        return [self.members[i] for i in sorted(self.members)]

    def member_list(self) -> p.Members:
        """The address book, and the voters and learners of the metadata group as this node sees them."""
        conf = self.group("metadata").node.conf
        return p.Members(self._members(), list(conf.voters), list(conf.learners))

    # --- membership (see the module docstring) -----------------------------------------------------

    def _configured_members(self) -> dict[int, p.MemberInfo]:
        book = {m.id: p.MemberInfo(m.id, m.peer_address, m.client_address) for m in self.configs.cluster.members}
        me = self.member
        book[me.id] = p.MemberInfo(me.id, me.peer_address, me.client_address)
        return book

    def _refresh_members(self) -> None:
        """Rebuild the address book from the config and the metadata views; sync the peer transport."""
        book = self._configured_members()
        removed: set[int] = set()
        for key, raw in self.views["metadata"].store.scan_prefix("members", b"member/"):
            state = decode_state(key, raw)
            assert isinstance(state, MemberState)
            if state.removed:
                book.pop(state.node_id, None)
                removed.add(state.node_id)
            elif state.node_id != self.node_id:   # this node's own addresses are those it was started with
                book[state.node_id] = p.MemberInfo(state.node_id, state.peer_address, state.client_address)
        self.members = book
        self.removed = removed
        transport = self.host.transport
        if transport is None:
            return
        for node_id, info in book.items():
            if node_id != self.node_id:
                try:
                    transport.add_peer(node_id, parse_address(info.peer_address, f"member/{node_id}.peer_address"))
                except ConfigError as exc:
                    logger.error("cannot dial node %s: %s", node_id, exc)
        for node_id in removed:
            transport.remove_peer(node_id)

    async def _follow_members(self) -> None:
        group = self.group("metadata")
        while True:
            seen = group.sm.applied_index
            try:
                await group.wait_applied(seen + 1)
            except EpochlogError:
                return   # the group stopped
            self._refresh_members()
            await asyncio.sleep(MEMBERS_REFRESH_S)

    def _group_order(self, *, metadata_last: bool = False) -> tuple[str, ...]:
        others = tuple(g for g in self.host.groups if g != "metadata")
        return (*others, "metadata") if metadata_last else ("metadata", *others)

    def _require_leader(self, name: str) -> RaftGroup:
        group = self.group(name)
        if group.node.role is not Role.LEADER:
            raise NotLeaderError(self.node_id, group.node.leader, group.node.term)
        return group

    async def _change_group(self, name: str, cc: ConfChange, timeout: float) -> ConfState:
        """One group's change, on its leader; a change already made is not an error (retries are safe)."""
        group = self._require_leader(name)
        if _done(group.node.conf, cc):
            return group.node.conf
        try:
            return await group.change_membership(cc, timeout)
        except ConfChangeError:
            if _done(group.node.conf, cc):   # e.g. an automatic promotion got there first
                return group.node.conf
            raise

    async def _change_everywhere(self, cc: ConfChange, call: p.MemberAdd | p.MemberPromote | p.MemberRemove,
                                 names: Sequence[str], deadline: float) -> None:
        """`cc` in each group of `names` in turn: here if this node leads it, else forwarded to its leader."""
        loop = asyncio.get_running_loop()
        client = None
        try:
            for name in names:
                group = self.group(name)
                if group.node.role is Role.LEADER:
                    try:
                        await self._change_group(name, cc, max(0.1, deadline - loop.time()))
                        continue
                    except NotLeaderError:
                        pass   # lost the leadership meanwhile: ask the new leader
                if client is None:
                    from epochlog.client.aio import AsyncClient

                    endpoints = [m.client_address for m in self.members.values() if m.client_address]
                    if not endpoints:
                        raise NodeError(f"group {name} is led by another node and no client address is known")
                    client = AsyncClient(endpoints, timeout=max(1.0, deadline - loop.time()),
                                         name=f"epochlog-node-{self.node_id}")
                if isinstance(call, p.MemberAdd):
                    await client.member_add(call.node_id, call.peer_address, call.client_address,
                                            auto_promote=call.auto_promote, group=name)
                elif isinstance(call, p.MemberPromote):
                    await client.member_promote(call.node_id, group=name)
                else:
                    await client.member_remove(call.node_id, group=name)
        finally:
            if client is not None:
                await client.close()

    async def _record(self, event: ev.Event) -> None:
        """Commit a member record in the metadata group (this node leads it) and use it at once."""
        done = await self.group("metadata").submit([ev.event_record(event)])
        outcome = done.outcomes[0] if done.outcomes else None
        if isinstance(outcome, Outcome) and not outcome.ok:
            raise RejectedError(_result("metadata", done.offset, outcome))
        self._refresh_members()

    def _lock(self) -> asyncio.Lock:
        if self._membership_lock is None:
            self._membership_lock = asyncio.Lock()
        return self._membership_lock

    async def member_add(self, call: p.MemberAdd) -> p.Members:
        _check_node_id(call.node_id)
        cc = ConfChange(ConfChangeKind.ADD_LEARNER, call.node_id, call.auto_promote)
        if call.group:
            await self._change_group(call.group, cc, MEMBERSHIP_TIMEOUT_S)
            return self.member_list()
        parse_address(call.peer_address, "peer_address")
        if call.client_address:
            parse_address(call.client_address, "client_address")
        self._require_leader("metadata")
        deadline = asyncio.get_running_loop().time() + MEMBERSHIP_TIMEOUT_S
        async with self._lock():
            known = self.members.get(call.node_id)
            wanted = p.MemberInfo(call.node_id, call.peer_address, call.client_address)
            if known != wanted:
                if known is not None and any(g.node.conf.contains(call.node_id) for g in self.host.groups.values()):
                    raise NodeError(f"node {call.node_id} is a member at {known.peer_address}: remove it before "
                                    f"adding it with other addresses")
                taken = {a: m.id for m in self.members.values() if m.id != call.node_id
                         for a in (m.peer_address, m.client_address) if a}
                for address in (call.peer_address, call.client_address):
                    if address in taken:
                        raise NodeError(f"{address} is an address of node {taken[address]}")
                await self._record(ev.MemberAdded(node_id=call.node_id, peer_address=call.peer_address,
                                                  client_address=call.client_address, actor="epochlog/membership"))
            await self._change_everywhere(cc, call, self._group_order(), deadline)
        return self.member_list()

    async def member_promote(self, call: p.MemberPromote) -> p.Members:
        _check_node_id(call.node_id)
        cc = ConfChange(ConfChangeKind.PROMOTE, call.node_id)
        if call.group:
            await self._change_group(call.group, cc, MEMBERSHIP_TIMEOUT_S)
            return self.member_list()
        self._require_leader("metadata")
        deadline = asyncio.get_running_loop().time() + MEMBERSHIP_TIMEOUT_S
        async with self._lock():
            await self._change_everywhere(cc, call, self._group_order(), deadline)
        return self.member_list()

    async def member_remove(self, call: p.MemberRemove) -> p.Members:
        _check_node_id(call.node_id)
        cc = ConfChange(ConfChangeKind.REMOVE, call.node_id)
        if call.group:
            await self._change_group(call.group, cc, MEMBERSHIP_TIMEOUT_S)
            return self.member_list()
        metadata = self._require_leader("metadata")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MEMBERSHIP_TIMEOUT_S
        if call.node_id not in self.members and not any(g.node.conf.contains(call.node_id)
                                                         for g in self.host.groups.values()):
            if call.node_id in self.removed:
                return self.member_list()   # a retry of a removal that completed
            raise NotFoundError(f"node {call.node_id} is not a member")
        for name, group in self.host.groups.items():
            if group.node.conf.voters == (call.node_id,):
                raise NodeError(f"node {call.node_id} is the last voter of group {name}: add another first")
        if call.node_id == self.node_id:
            # Removing the metadata group's leader while it coordinates would cut it off from the rest of
            # the work: hand the leadership over first; the client retries at the new leader.
            await self._hand_off(metadata, deadline)
        async with self._lock():
            await self._change_everywhere(cc, call, self._group_order(metadata_last=True), deadline)
            await self._record(ev.MemberRemoved(node_id=call.node_id, actor="epochlog/membership"))
        return self.member_list()

    async def _hand_off(self, group: RaftGroup, deadline: float) -> None:
        """Transfer `group`'s leadership to its most caught-up other voter, then raise NotLeaderError."""
        n = group.node
        others = [v for v in n.conf.voters if v != self.node_id]
        if not others:
            raise NodeError(f"node {self.node_id} is the last voter of group {group.name}")
        target = max(others, key=lambda v: n.progress[v].match if v in n.progress else -1)
        group.transfer_leadership(target)
        loop = asyncio.get_running_loop()
        give_up = min(deadline, loop.time() + 5.0)
        while group.node.role is Role.LEADER and loop.time() < give_up:
            await asyncio.sleep(group.tick_interval)
        raise NotLeaderError(self.node_id, group.node.leader or target, group.node.term)

    def transfer_leader(self, call: p.TransferLeader) -> p.Done:
        group = self.group(call.group)
        if group.node.role.value != "leader":
            raise NotLeaderError(self.node_id, group.node.leader, group.node.term)
        target = call.to
        if target == 0:
            progress = group.node.progress
            followers = [n for n in group.node.conf.voters if n != self.node_id]
            if not followers:
                raise NodeError(f"group {call.group} has no other voter to hand leadership to")
            target = max(followers, key=lambda n: progress[n].match if n in progress else -1)
        group.transfer_leadership(target)
        return p.Done()

    # --- the controller (controller/runtime.py): brokers, their groups, topic routes ---------------------

    def broker_heartbeats(self, call: p.BrokerHeartbeats) -> p.HeartbeatsAck:
        return self.controller.heartbeats(call)

    async def broker_register(self, call: p.BrokerRegister) -> p.Registered:
        return await self.controller.register(call)

    async def sync_state_set_report(self, call: p.SyncStateSetReport) -> p.BrokerGroup:
        return await self.controller.report_sync_state_set(call)

    async def broker_shutdown(self, call: p.BrokerShutdown) -> p.BrokerGroup:
        return await self.controller.shutdown(call)

    async def route(self, call: p.RouteQuery, timeout: float = DEFAULT_TIMEOUT_S) -> p.TopicRoute:
        return await self.controller.route(call, timeout)

    async def brokers(self, call: p.BrokerList, timeout: float = DEFAULT_TIMEOUT_S) -> p.Brokers:
        return await self.controller.brokers(call, timeout)

    def snapshot(self, call: p.Snapshot) -> p.Done:
        return p.Done(self.group(call.group).snapshot_now())


def _result(group: str, offset: int, outcome: object | None) -> p.WriteResult:
    if isinstance(outcome, Outcome):
        if outcome.duplicate:
            return p.WriteResult(outcome.offset, group, outcome.ok, outcome.code, outcome.message, True)
        return p.WriteResult(offset, group, outcome.ok, outcome.code, outcome.message)
    return p.WriteResult(offset, group, True)


class RejectedError(EpochlogError):
    """The command was committed but applying it changed nothing (a failed condition, stale epoch...)."""

    code = "rejected"

    def __init__(self, result: p.WriteResult) -> None:
        self.result = result
        self.reason = result.code
        super().__init__(f"{result.code}: {result.message} (offset {result.offset})")


def _rejected(result: p.WriteResult) -> RejectedError:
    return RejectedError(result)


def _done(conf: ConfState, cc: ConfChange) -> bool:
    """Whether `conf` already has what `cc` asks for."""
    if cc.kind in (ConfChangeKind.ADD_LEARNER, ConfChangeKind.ADD_VOTER):
        return conf.contains(cc.node)
    if cc.kind is ConfChangeKind.PROMOTE:
        return cc.node in conf.voters
    return not conf.contains(cc.node)


def _check_node_id(node_id: int) -> None:
    if node_id <= 0:
        raise NodeError(f"node ids are positive integers, got {node_id}")


def _compacted(group: RaftGroup, offset: int) -> CompactedError:
    return CompactedError(f"compacted: offset {offset} is no longer in the log of group {group.name} (it starts at "
                          f"{group.storage.log.start_offset}); resync from the snapshot at offset "
                          f"{group.storage.snapshot().index}, then read from the offset after it")


def _changed_views(store: ViewStore, key: bytes | memoryview | None, offset: int) -> bool:
    """Whether applying the record at `offset` changed the views: every applied event writes a history
    row for its entity key (a Txn: for each op's key, the first one's is its record key after
    `txn/`) at its own offset; a rejected event or a retry of an applied request id writes none."""
    if not key:
        return False
    entity = bytes(key)
    entity = entity[4:] if entity.startswith(b"txn/") else entity
    return store.get("versions", version_key(entity, offset)) is not None


def _key_text(key: bytes | memoryview | None) -> str:
    return "" if key is None else bytes(key).decode("utf-8", "backslashreplace")


__all__ = ["Node", "NodeError", "RejectedError", "RaftError", "NotFoundError"]
