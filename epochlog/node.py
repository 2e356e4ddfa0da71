"""An Epochlog node: its Raft groups with their views, and the operations clients call on them.

`Node` is what `epochlog serve` runs. It owns a NodeHost (every group of the cluster, each with a
ViewsStateMachine over RocksDB) and exposes the operations of the client protocol as coroutines
returning protocol messages, so the native server and the gRPC face share one implementation.

Writes go to the leader of the group that owns the entity (epochlog.api.routing); a follower answers
`not_leader` with the leader's id and client address, and the SDK retries there. A Write naming
several groups commits each group's part atomically and in order, but the groups independently:
each event carries a request id, so retrying the whole Write after a failure never applies an event
twice.

Membership changes and the address book are epochlog/membership.py's; retention (snapshot-driven
log truncation, the history floor, pruning, the free-space guard) is compaction/service.py's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from eventlog.configuration import from_mapping
from eventlog.errors import BatchTooLargeError, ConfigError, OffsetOutOfRangeError
from eventlog.raft.errors import CompactedError, NotLeaderError
from eventlog.raft.runtime.config import MemberConfig, NodeConfigs
from eventlog.raft.runtime.group import RaftGroup, full_history_start
from eventlog.raft.runtime.proposals import Committed
from eventlog.raft.runtime.host import NodeHost
from compaction.config import compaction_configs
from compaction.service import CompactionService, allocated_bytes
from controller.config import controller_config
from controller.runtime import GROUP as CONTROLLER_GROUP, ControllerRuntime
from epochlog.api import messages as p
from epochlog.api.routing import REQUIRED_GROUPS, group_of_event, group_of_key, group_of_record_key
from epochlog.errors import GroupHaltedError, InvalidArgumentError, RejectedError
from epochlog.group_log import GroupLog
from epochlog.halts import Halts
from epochlog.identity import storage_id
from epochlog.integrity import DigestCheck, damage_info
from epochlog.local_groups import LocalGroups
from epochlog.membership import Membership
from epochlog.stop_watch import StopWatch
from statemachines import events as ev
from statemachines import views_format
from statemachines.apply import HALTED
from statemachines.query import MAX_LIMIT, Query
from statemachines.request_ids import check_client_request_id
from statemachines.state import Outcome, encode
from statemachines.noops import ChangedViews, changed_views_in, unchanged_in
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine

if TYPE_CHECKING:
    from epochlog.calls import Cancellable
    from epochlog.client.tls import ClientTls
    from eventlog.log import LogRead

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
READS_PER_TURN = 256      # get_many serves this many reads per turn of the loop
EVENTS_PER_TURN = 256     # write checks this many events per turn of the loop
EXPORT_WATERMARKS = "config/export/"   # export watermarks (see export_watermarks)


class Node:
    """One node: call everything from the loop that ran `start()`."""

    def __init__(self, configs: NodeConfigs, node_id: int, data_dir: str | Path, *, seed: int | None = None,
                 member: MemberConfig | None = None) -> None:
        self.configs = configs
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.views_config = from_mapping(ViewsConfig, configs.views, "views")
        self.views: dict[str, ViewsStateMachine] = {}
        self.controller = ControllerRuntime(controller_config(configs.controller), node_id,
                                            lambda: self.group(CONTROLLER_GROUP),   # runs on its leader
                                            lambda: self.views[CONTROLLER_GROUP].store)
        missing = [g for g in REQUIRED_GROUPS if g not in configs.cluster.groups]
        if missing:
            raise ConfigError("cluster.groups", list(configs.cluster.groups),
                              f"must include {', '.join(REQUIRED_GROUPS)} (missing {', '.join(missing)})")
        self.member = configs.cluster.member(node_id) if member is None else member
        compaction_config, self.cleaner_config = compaction_configs(configs.compaction)
        compaction_config.check_groups(configs.cluster.groups)
        self.compaction = CompactionService(compaction_config,
                                            lambda: self.host.groups, self.views, self.export_watermarks,
                                            self.data_dir, self.cleaner_config)
        self.host = NodeHost(node_id, self.data_dir, configs, self._open_views, seed=seed, member=self.member,
                             retention_floor=self.compaction.retention_floor,
                             space_guard=self.compaction.space_guard,
                             ships_log_prefix=self.compaction.ships_log_prefix,
                             features={views_format.FEATURE: views_format.LATEST})
        self.local_groups = LocalGroups(node_id, lambda: self.host.groups, self.views)
        # What this node's own clients of the other nodes present (its member certificate), set by the
        # client service when the faces speak TLS (epochlog/server.py): forwarded calls authenticate by it.
        self.internal_tls: ClientTls | None = None
        self.membership = Membership(self.local_groups, configs.cluster.members, self.member,
                                     lambda: self.host.transport, lambda: self.internal_tls)
        self.halts = Halts(self.local_groups, lambda name: self.transfer_leader(p.TransferLeader(name, 0)))
        self.digest_check = DigestCheck(self.local_groups, lambda: self.client_addresses,
                                        self.views_config.digest_check_interval_ms, lambda: self.internal_tls)
        self.instance = secrets.token_hex(8)   # this run of the node (status: `epochlog up` tells restarts apart)
        self.storage = ""                      # the data directory's id, read at start (epochlog.identity)

    def _open_views(self, name: str, directory: Path) -> ViewsStateMachine:
        sm = ViewsStateMachine(directory, self.views_config, name=name)
        sm.format_support = lambda: self.host.feature_levels(name, views_format.FEATURE)
        self.views[name] = sm
        return sm

    def export_watermarks(self, group: str) -> dict[str, int]:
        """The export watermark of every table that records one for `group`: table -> highest offset.

        `epochlog export` reports the highest offset of each group its Delta table holds as a config
        entry `config/export/<table>` of the metadata group (value: JSON {group: offset}); the
        retention horizon keeps every offset above each of them (capped: compaction/policy.py), so no
        event leaves the log before every table has it (spark/export.py). A stale read of the local
        views only keeps more."""
        views = self.views.get("metadata")
        if views is None:
            return {}
        found = {}
        for item in Query(views.store).list(EXPORT_WATERMARKS, limit=MAX_LIMIT).items:
            try:
                found[item.key[len(EXPORT_WATERMARKS):]] = int(json.loads(item.state.value)[group])  # type: ignore[attr-defined]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue   # not a watermark of this group
        return found

    async def start(self) -> None:
        self.storage = storage_id(self.data_dir)
        await self.host.start()
        self.compaction.start()
        self.membership.start()
        self.controller.start()
        self.halts.start()
        self.digest_check.start()

    async def stop(self, watch: StopWatch | None = None) -> None:
        """Its background work first, then the groups; `watch` times each step (epochlog/stop_watch.py)."""
        watch = watch or StopWatch(f"node {self.node_id}")
        with watch.step("the digest check"):
            await self.digest_check.stop()
        with watch.step("the halts"):
            await self.halts.stop()
        with watch.step("membership"):
            await self.membership.stop()
        with watch.step("the controller"):
            await self.controller.stop()
        with watch.step("compaction"):
            await self.compaction.stop()
        await self.host.stop(watch.step)

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
        return self.local_groups.group(name)

    @property
    def members(self) -> dict[int, p.MemberInfo]:
        """The address book (configured members overlaid by the metadata group's member records)."""
        return self.membership.members

    @property
    def client_addresses(self) -> dict[int, str]:
        return {i: m.client_address for i, m in self.members.items()}

    def leader_address(self, error: NotLeaderError) -> str:
        return self.client_addresses.get(error.leader_hint, "")

    def group_log(self, name: str) -> GroupLog | None:
        """Group `name`'s log as a face produces to and fetches from it (the Kafka face: epochlog/group_log.py);
        None when this node runs no such group."""
        group = self.host.groups.get(name)
        return None if group is None else GroupLog(group)

    def group_logs(self) -> dict[str, GroupLog]:
        """Every group's log on this node, by name (see group_log)."""
        return {name: GroupLog(group) for name, group in self.host.groups.items()}

    def serving(self, name: str) -> RaftGroup:
        """The group, if its views can serve on this node (GroupHaltedError when it halted here)."""
        group = self.group(name)
        self.halts.check(name)
        return group

    def _query(self, group: str) -> Query:
        return Query(self.views[group].store, group)

    async def _barrier(self, group: str, consistency: str, min_offset: int, timeout: float) -> int:
        if consistency not in p.CONSISTENCY:
            raise InvalidArgumentError(f"consistency {consistency!r} is not one of {', '.join(p.CONSISTENCY)}")
        applied = await self.serving(group).read_barrier(consistency, min_offset, timeout)
        self.halts.check(group)   # it may have halted while the read waited
        return applied

    # --- writes -----------------------------------------------------------------------------------

    async def write(self, events: Sequence[ev.Event]) -> list[p.WriteResult]:
        """Validate every event first (nothing is appended if one is invalid), then commit per group.

        Per event the leader's work is `_check_events` (a write of a transaction's hundred events is a
        hundred turns of it), so it does each thing once: the group's part (`_WritePart`) and batch limit
        are looked up once per group, the route is read from the key `checked_record` already made."""
        _not_empty(events)
        parts: dict[str, _WritePart] = {}
        for start in range(0, len(events), EVENTS_PER_TURN):
            if start:
                await asyncio.sleep(0)   # thousands of events are checked in slices, the loop running between
            self._check_events(events, start, parts)
        return await self._commit(parts, len(events))

    def start_write(self, events: Sequence[ev.Event],
                    then: Callable[[list[p.WriteResult] | BaseException], None]) -> Cancellable:
        """`write`, its outcome told to `then` (the results, or the error) instead of awaited; an invalid
        write raises here. A write of one group checked in one turn (the usual one) is told in the turn
        that applies it, so its caller answers from there, a loop turn and a task sooner than an awaiting
        one (epochlog/calls.py `CallRunner.start`); any other runs as `write` in a task of its own. Cancel
        the returned handle when no longer waiting (`then` is not called after that)."""
        _not_empty(events)
        if len(events) > EVENTS_PER_TURN:
            return _told_by_task(self.write(events), then)
        parts: dict[str, _WritePart] = {}
        self._check_events(events, 0, parts)
        if len(parts) > 1:
            return _told_by_task(self._commit(parts, len(events)), then)
        self._hand_over(parts)
        ((group, part),) = parts.items()
        count = len(events)

        def told(done: Committed | BaseException) -> None:
            if isinstance(done, BaseException):
                then(done)
                return
            try:
                results = _results(group, done, count)
            except Exception as exc:   # the group halted before applying them
                then(exc)
                return
            then(results)

        return part.group.submit_told(part.records, told)

    def _check_events(self, events: Sequence[ev.Event], start: int, parts: dict[str, _WritePart]) -> None:
        """Check the events of one turn (`EVENTS_PER_TURN` from `start`) and add them to their groups'
        parts; InvalidArgumentError, EventError or BatchTooLargeError for the first that cannot be written."""
        client_event = self.client_event
        chunk = events[start:start + EVENTS_PER_TURN]
        checked: Iterable[tuple[bytes, bytes, ev.Event]] | None = None
        if len(chunk) > 1:   # one event is checked faster alone (no array to build and decode)
            try:
                checked = ev.checked_records([client_event(event) for event in chunk])
            except InvalidArgumentError:   # EventError included
                pass
        if checked is None:   # one event, or one refused: checked one by one as they are added, so the
            checked = _checked_one_by_one(client_event, chunk)   # first refusal in the caller's order is raised
        for i, (key, value, decoded) in enumerate(checked, start):
            # The route of the decoded event (equal to the client's): a record's key is its event's entity
            # key, but a Txn's is `txn/<first key>`, routed by all its operations and conditions.
            group = group_of_event(decoded) if isinstance(decoded, ev.Txn) else group_of_record_key(key)
            part = parts.get(group)
            if part is None:
                part = parts[group] = _WritePart(self.group(group))
            part.indexes.append(i)
            part.records.append((key, value))
            part.checked.append((key, value, decoded))
            part.size += len(key) + len(value) + 16   # RaftGroup.submit's estimate
            if part.size > part.limit:   # refused before the rest is checked: the work is bounded by the batch
                raise BatchTooLargeError(f"the events of group {group} take more than its batch limit "
                                         f"({part.limit} bytes) from event {i} on: split the write")

    def _hand_over(self, parts: dict[str, _WritePart]) -> None:
        """Before proposing: every group serves here, and its leader's applier takes the events decoded
        when they were checked (propose once)."""
        for group in parts:
            self.halts.check(group)   # each group as `serving` checks it, looked up once above
        for group, part in parts.items():
            self.views[group].expect(part.checked)

    async def _commit(self, parts: dict[str, _WritePart], count: int) -> list[p.WriteResult]:
        """Propose the checked `parts` of a write of `count` events; their results in the write's order."""
        self._hand_over(parts)
        if len(parts) == 1:   # the usual write: no task to gather (two turns of the loop fewer per call)
            ((group, part),) = parts.items()
            done = await part.group.submit(part.records)
            return _results(group, done, count)
        names = list(parts)
        committed = await asyncio.gather(*(parts[g].group.submit(parts[g].records) for g in names))
        results: list[p.WriteResult | None] = [None] * count
        for group, done in zip(names, committed):
            for i, result in zip(parts[group].indexes, _results(group, done, len(parts[group].indexes))):
                results[i] = result
        return [r for r in results if r is not None]

    def client_event(self, event: ev.Event) -> ev.Event:
        """A client's event as the node proposes it, or InvalidArgumentError/EventError (nothing is appended).

        The rules every client face shares: member records and history floors are the node's own; a
        request id without a session must be time-ordered (statemachines/request_ids.py); a session
        opens with the bounds of this node's `[views]` config, stamped here so that every replica applies
        the leader's (statemachines/sessions.py)."""
        refusal = _node_only(type(event))
        if refusal:
            raise InvalidArgumentError(refusal)
        if event.request_id:
            check_client_request_id(event)
        if isinstance(event, ev.ClientSessionOpened):
            c = self.views_config
            event = msgspec.structs.replace(event, timeout_ms=c.client_session_timeout_ms,
                                            max_outcomes=c.client_session_max_outcomes,
                                            max_sessions=c.client_sessions_max)
        return event

    async def lease_grant(self, call: p.LeaseGrant) -> p.Lease:
        lease_id = call.lease_id or (secrets.randbits(62) | 1)
        event = ev.LeaseGranted(lease_id=lease_id, ttl_ms=call.ttl_ms, request_id=call.request_id)
        (result,) = await self.write([event])
        if not result.ok:
            raise RejectedError(result)
        return p.Lease(lease_id, call.ttl_ms, result.offset)

    def lease_keepalive(self, call: p.LeaseKeepAlive) -> p.Lease:
        ttl = self.serving("kv").keepalive(call.lease_id)
        return p.Lease(call.lease_id, ttl)

    # --- reads ------------------------------------------------------------------------------------

    async def get(self, call: p.Get, timeout: float = DEFAULT_TIMEOUT_S) -> p.Got:
        group = group_of_key(call.key)
        applied = await self._barrier(group, call.consistency, call.min_offset, timeout)
        item = self._query(group).get(call.key, as_of=call.as_of)
        return p.Got(None if item is None else p.Item(item.key, encode(item.state), item.version), applied)

    async def get_many(self, call: p.Gets, timeout: float = DEFAULT_TIMEOUT_S) -> p.GotMany:
        """One barrier per group and consistency covers every read of the call (each is taken after the
        call arrived, so every read keeps its consistency), then the reads are served READS_PER_TURN
        per turn of the loop: thousands of reads never hold the loop that sends the heartbeats."""
        if len(call.gets) > MAX_LIMIT:
            raise InvalidArgumentError(f"at most {MAX_LIMIT} reads per call, got {len(call.gets)}")
        barriers: dict[tuple[str, str], int] = {}
        for g in call.gets:
            key = (group_of_key(g.key), g.consistency)
            barriers[key] = max(barriers.get(key, -1), g.min_offset)
        await asyncio.gather(*(self._barrier(group, consistency, min_offset, timeout)
                               for (group, consistency), min_offset in barriers.items()))
        got = []
        for i, g in enumerate(call.gets):
            if i and i % READS_PER_TURN == 0:
                await asyncio.sleep(0)
            group = group_of_key(g.key)
            applied = self.serving(group).sm.applied_index   # it may have halted since the barrier
            item = self._query(group).get(g.key, as_of=g.as_of)
            got.append(p.Got(None if item is None else p.Item(item.key, encode(item.state), item.version), applied))
        return p.GotMany(got)

    async def list(self, call: p.List, timeout: float = DEFAULT_TIMEOUT_S) -> p.Listed:
        if call.end and not call.start:
            raise InvalidArgumentError("a range needs start as well as end")
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
        query = self._query(group)
        rows = query.history(call.key, limit=call.limit, after_offset=call.after_offset)
        return p.HistoryRows([p.HistoryRow(r.offset, r.event, None if r.state is None else encode(r.state))
                              for r in rows], applied, query.history_floor)

    async def read_events(self, call: p.ReadEvents, timeout: float = DEFAULT_TIMEOUT_S) -> p.Events:
        """Committed records of a group's log from `from_offset`, at any member: every record committed
        before the call, up to the page's limits (`_log_read`)."""
        group = self.group(call.group)
        if call.max_events < 1 or call.max_bytes < 1:
            raise InvalidArgumentError("max_events and max_bytes are positive")
        events, short = self._read_events_applied(group, call)
        if short and await self._caught_up(call.group, group, timeout):
            events, _ = self._read_events_applied(group, call)
        return events

    def _read_events_applied(self, group: RaftGroup, call: p.ReadEvents) -> tuple[p.Events, bool]:
        """The page from what this node applied, and whether it stopped at the applied offset (not at a limit)."""
        log = group.storage.log
        offset = max(call.from_offset, 0)
        applied = group.sm.applied_index
        chunk = self._applied_chunk(group, offset, call.max_bytes, applied)
        out: list[p.EventRecord] = []
        next_offset = offset
        if chunk is not None:
            changed = self._changed_views(call.group)(offset, chunk.next_offset)
            for batch in chunk.batches():
                if batch.header.is_control:
                    continue
                for record in batch.records():
                    if record.offset < offset or len(out) >= call.max_events:
                        continue
                    out.append(p.EventRecord(record.offset, _key_text(record.key),
                                             None if record.value is None else bytes(record.value),
                                             record.timestamp, batch.header.leader_epoch,
                                             changed(record.key, record.offset)))
            next_offset = out[-1].offset + 1 if len(out) >= call.max_events else max(offset, chunk.next_offset)
        short = len(out) < call.max_events and (chunk is None or chunk.next_offset > applied)
        return p.Events(out, next_offset, full_history_start(log), group.node.log.committed), short

    async def read_log(self, call: p.ReadLog, timeout: float = DEFAULT_TIMEOUT_S) -> p.LogBatches:
        """Committed batches of a group's log as stored (CRC included), bounded like `read_events` (and,
        like it, holding every batch committed before the call, at any member): from the batch holding
        `from_offset`, refused below the full history (`compacted`) or at a damaged batch. The node
        copies bytes and scans the no-op rows of the range: no work per record, so an exporter's reads
        do not load the serving node (its executors decode the batches, eventlog/offline.py
        `decode_batches`)."""
        group = self.group(call.group)
        batches, short = self._read_log_applied(group, call)
        if short and await self._caught_up(call.group, group, timeout):
            batches, _ = self._read_log_applied(group, call)
        return batches

    def _read_log_applied(self, group: RaftGroup, call: p.ReadLog) -> tuple[p.LogBatches, bool]:
        log = group.storage.log
        offset = call.from_offset
        applied = group.sm.applied_index
        chunk = self._applied_chunk(group, offset, call.max_bytes, applied)
        data, start, next_offset = b"", offset, offset
        noops: list[int] = []
        unknown: list[int] = []
        if chunk is not None and chunk.data:
            data, start, next_offset = bytes(chunk.data), chunk.start_offset, max(offset, chunk.next_offset)
            views = self.views[call.group]

            def records() -> Iterator[tuple[bytes | None, int]]:
                for batch in chunk.batches():
                    if not batch.header.is_control:
                        yield from ((r.key, r.offset) for r in batch.records())

            noops, unknown = unchanged_in(views.store, offset, next_offset, views.applier.noops_from, records)
        short = chunk is None or chunk.next_offset > applied
        return p.LogBatches(data, start, next_offset, full_history_start(log), group.node.log.committed, noops,
                            unknown), short

    async def _caught_up(self, name: str, group: RaftGroup, timeout: float) -> bool:
        """A log read stopped at what this node applied: wait until it applied every entry committed
        before the call (a follower asks its leader how far that is: group.commit_barrier); whether it
        applied more meanwhile. A group halted here applies nothing more: its reads are what it applied."""
        if self.halts.info(name) is not None:
            return False
        applied = group.sm.applied_index
        await group.commit_barrier(timeout)
        return group.sm.applied_index > applied

    def _applied_chunk(self, group: RaftGroup, offset: int, max_bytes: int, applied: int) -> LogRead | None:
        """Whole batches of `group`'s log from the one holding `offset`, never past `applied` (what this
        node applied; None when `offset` is past it); `compacted` below the full history or when the
        cleaner rewrote the range while it was read (records may be missing). read_events and read_log."""
        log = group.storage.log
        if offset < full_history_start(log):
            raise _compacted(group, offset)
        group.check_readable(offset)
        if offset > applied:
            return None
        try:
            chunk = log.read(offset, max_bytes, max_offset=applied + 1)
        except OffsetOutOfRangeError:
            raise _compacted(group, offset) from None
        if offset < log.clean_end_offset:
            raise _compacted(group, offset)
        return chunk

    async def watch(self, call: p.Watch) -> tuple[str, int, AsyncIterator[p.EventRecord]]:
        """(group, first offset, the records) for a watch; the iterator raises CompactedError on a gap."""
        group_name = call.group or group_of_key(call.prefix if "/" in call.prefix else call.prefix + "/")
        group = self.serving(group_name)
        start = call.from_offset if call.from_offset >= 0 else group.sm.applied_index + 1
        if start < full_history_start(group.storage.log):
            raise _compacted(group, start)

        async def records() -> AsyncIterator[p.EventRecord]:
            async for e in group.watch(call.prefix.encode(), start, changed=self._changed_views(group_name),
                                       written_keys=ev.written_keys):
                yield p.EventRecord(e.offset, _key_text(e.key), e.value, e.timestamp, e.term, e.applied)

        return group_name, start, records()

    def _changed_views(self, group: str) -> Callable[[int, int], ChangedViews]:
        """Whether the records of a log chunk changed the group's views (`applied` of read_events and
        watch): the views (and their store) of the moment, as a snapshot install replaces them."""
        def changed(lo: int, hi: int) -> ChangedViews:
            views = self.views[group]
            return changed_views_in(views.store, lo, hi, views.applier.noops_from)
        return changed

    # --- cluster ----------------------------------------------------------------------------------

    def status(self) -> p.StatusInfo:
        groups = []
        for name, group in self.host.groups.items():
            s = group.status()
            conf = group.node.conf
            progress = group.node.progress if s.role == "leader" else {}
            now = group.loop.time()
            peers = [p.PeerInfo(n, "voter" if n in conf.voters else "learner",
                                progress[n].match if n in progress else -1,
                                round((now - group.heard_at[n]) * 1000) if n in group.heard_at else -1)
                     for n in (*conf.voters, *conf.learners)]
            views = self.views.get(name)
            groups.append(p.GroupInfo(name, self.node_id, s.role, s.term, s.leader, s.commit, s.applied,
                                      s.last_index, s.log_start, s.snapshot_index, peers, self.halts.info(name),
                                      sorted(views.applier.skipped) if views is not None else [],
                                      damage_info(s.repair), self.digest_check.digests(name),
                                      list(self.digest_check.alarms.get(name, {}).values()),
                                      views.views_format if views is not None else 0))
        return p.StatusInfo(self.cluster, self.node_id, groups, self.membership.sorted(), self.instance, os.getpid(),
                            self.storage)

    def compaction_status(self) -> p.CompactionInfo:
        """This node's retention of every group (`epochlog compaction status`)."""
        out = []
        for name, group in self.host.groups.items():
            log = group.storage.log
            spans = log.segment_spans()
            views = self.views[name]
            state = self.compaction.groups.get(name)
            h = None if state is None else state.horizon
            snap = group.snapshots
            pruned = views.pruner.counters
            out.append(p.CompactionGroupInfo(
                name, group.node.role.value, log.start_offset, log.end_offset, len(spans),
                allocated_bytes(log.directory), group.storage.snapshot().index, snap.taken,
                round(snap.last_seconds * 1000, 1), snap.last_finished_at, snap.last_error,
                views.store.history_floor, -1 if h is None else h.history_floor, "" if h is None else h.history_bound,
                -1 if h is None else h.log_floor, "" if h is None else h.log_bound,
                [] if h is None else [p.ExportPinInfo(x.table, x.watermark, x.floor, x.capped_by or "")
                                      for x in h.pins],
                pruned.pruned_floor, pruned.passes, pruned.rows_deleted, allocated_bytes(views.path),
                0.0 if state is None else state.last_check_at,
                0.0 if state is None else round(state.last_check_seconds * 1000, 2),
                snap.segments_deleted, group.disk_full))
            self._add_cleaning(out[-1], name, group)
        return p.CompactionInfo(self.node_id, out, self.compaction.free_disk_bytes)

    def _add_cleaning(self, info: p.CompactionGroupInfo, name: str, group: RaftGroup) -> None:
        """The key-compaction fields of a group's `CompactionGroupInfo`."""
        log = group.storage.log
        c = self.compaction.cleaning.state(name)
        info.cleanup_policy = c.policy
        info.clean_end_offset = log.clean_end_offset
        info.cleaned_segments = len(log.cleaned_segments)
        info.clean_below = c.clean_below if c.policy == "compact" else -1
        info.clean_waiting = c.waiting
        info.clean_running = c.running
        info.clean_passes = c.passes
        info.clean_failures = c.passes_failed
        info.clean_error = c.last_error
        info.clean_bytes_reclaimed = c.bytes_reclaimed
        last = c.last
        if last is not None:
            info.last_clean = p.CleanPassInfo(
                last.clean_below, last.cleaned_through, round(last.seconds, 3), last.segments_before,
                last.segments_after, last.bytes_before, last.bytes_after, last.records_kept, last.records_dropped,
                last.tombstones_dropped, last.noops_dropped, c.last_finished_at, last.aborted or "")

    def member_list(self) -> p.Members:
        return self.membership.leader_list()

    async def member_add(self, call: p.MemberAdd) -> p.Members:
        return await self.membership.add(call)

    async def member_promote(self, call: p.MemberPromote) -> p.Members:
        return await self.membership.promote(call)

    async def member_remove(self, call: p.MemberRemove) -> p.Members:
        return await self.membership.remove(call)


    def transfer_leader(self, call: p.TransferLeader) -> p.Done:
        group = self.group(call.group)
        if group.node.role.value != "leader":
            raise NotLeaderError(self.node_id, group.node.leader, group.node.term)
        target = call.to
        if target == 0:
            progress = group.node.progress
            followers = [n for n in group.node.conf.voters if n != self.node_id]
            if not followers:
                raise InvalidArgumentError(f"group {call.group} has no other voter to hand leadership to")
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

    async def group_skip(self, call: p.GroupSkip) -> p.Done:
        return await self.halts.skip(call)


class _WritePart:
    """One group's events of a write, as `Node.write` gathers them."""

    __slots__ = ("group", "limit", "indexes", "records", "checked", "size")

    def __init__(self, group: RaftGroup) -> None:
        self.group = group
        self.limit = group.max_batch_bytes
        self.indexes: list[int] = []                                  # their places in the write
        self.records: list[tuple[bytes | None, bytes | None]] = []    # what is proposed
        self.checked: list[tuple[bytes, bytes, ev.Event]] = []        # what the leader's applier is handed
        self.size = 0                                                 # RaftGroup.submit's estimate of them


def _checked_one_by_one(client_event: Callable[[ev.Event], ev.Event],
                        events: Sequence[ev.Event]) -> Iterator[tuple[bytes, bytes, ev.Event]]:
    """`checked_record` of each event, made as the caller takes them (it stops at the first refusal)."""
    for event in events:
        yield ev.checked_record(client_event(event))


def _not_empty(events: Sequence[ev.Event]) -> None:
    if not events:
        raise InvalidArgumentError("a write carries at least one event")


def _told_by_task(work: Coroutine[Any, Any, list[p.WriteResult]],
                  then: Callable[[list[p.WriteResult] | BaseException], None]) -> asyncio.Task[list[p.WriteResult]]:
    """Run `work` in a task of its own and tell `then` how it ended (not when the task is cancelled)."""
    task = asyncio.get_running_loop().create_task(work)

    def ended(task: asyncio.Task[list[p.WriteResult]]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        then(exc if exc is not None else task.result())

    task.add_done_callback(ended)
    return task


@functools.cache
def _node_only(kind: type) -> str:
    """Why a client may not write events of type `kind` ("" when it may): the node writes them itself."""
    if issubclass(kind, ev.MemberAdded | ev.MemberRemoved):
        return "member records are written by member_add and member_remove only"
    if issubclass(kind, ev.HistoryPruned):
        return "history floors are written by the node's compaction service only"
    if issubclass(kind, ev.ViewsFormatRaised):
        return "the views format level is raised by a group's leader only (statemachines/views_format.py)"
    return ""


def _results(group: str, done: Committed, count: int) -> list[p.WriteResult]:
    """The results of `count` events of `group` committed together (`done`), in order; GroupHaltedError
    when this node (their leader then) halted before applying them."""
    results: list[p.WriteResult] = []
    append = results.append
    write_result = p.WriteResult
    outcomes = done.outcomes
    offset = done.offset
    known = len(outcomes)
    for j in range(count):
        outcome = outcomes[j] if j < known else None
        if type(outcome) is Outcome and not outcome.duplicate and outcome.code != HALTED:   # the usual event
            append(write_result(offset + j, group, outcome.ok, outcome.code, outcome.message))
            continue
        if outcome is None:
            results.append(p.WriteResult(offset + j, group, True))
            continue
        if isinstance(outcome, Outcome) and outcome.code == HALTED:
            # Committed, but this node (its leader then) halted before applying it: the outcome is
            # another member's to give. A retry with the same request ids gets it there.
            raise GroupHaltedError(f"group {group}: offset {offset + j} was {outcome.message}; "
                                   f"retry (request ids make it safe) on a member that applies it")
        results.append(_result(group, offset + j, outcome))
    return results


def _result(group: str, offset: int, outcome: object | None) -> p.WriteResult:
    if isinstance(outcome, Outcome):
        if outcome.duplicate:
            return p.WriteResult(outcome.offset, group, outcome.ok, outcome.code, outcome.message, True)
        return p.WriteResult(offset, group, outcome.ok, outcome.code, outcome.message)
    return p.WriteResult(offset, group, True)


def _compacted(group: RaftGroup, offset: int) -> CompactedError:
    log = group.storage.log
    where = (f"it starts at {log.start_offset}" if log.clean_end_offset <= log.start_offset else
             f"it starts at {log.start_offset} and is key-compacted below {log.clean_end_offset}: only each "
             f"entity's latest record is left there")
    return CompactedError(f"compacted: offset {offset} is no longer in the log of group {group.name} record by record "
                          f"({where}); resync from the snapshot at offset {group.storage.snapshot().index} (or read "
                          f"the views), then read from the offset after it")


def _key_text(key: bytes | memoryview | None) -> str:
    return "" if key is None else bytes(key).decode("utf-8", "backslashreplace")

