"""Kafka consumer groups (the classic protocol): the coordinator runs on the `offsets` group's leader.

Theory of operation. FindCoordinator names the Raft leader of `offsets`; that node keeps each
group's membership in memory, as Kafka's GroupCoordinator does: JoinGroup moves a group to
PreparingRebalance, which completes once every known member has rejoined or the largest rebalance
timeout passed (members that did not rejoin are dropped); the new generation's JoinGroup responses
give the leader every member's subscription; the leader's SyncGroup carries the assignment, which is
stored as a `KafkaGroupStored` event in the offsets group before any member gets it (so a new
coordinator resumes the same generation and members keep their assignment across a failover);
heartbeats answer REBALANCE_IN_PROGRESS while a rebalance runs; a member silent past its session
timeout is expired and the group rebalances. Committed offsets are `OffsetCommitted` events
(consumer_group = group id, topic, queue_id = partition), written through the offsets group like any
native write, and OffsetFetch reads them from the views after a ReadIndex barrier.

A node that does not lead `offsets` answers NOT_COORDINATOR; when it loses leadership or the term
changes, its in-memory groups are dropped and pending joins fail with NOT_COORDINATOR (clients look
the coordinator up again and the new one loads the groups from the views).

Access (epochlog/kafka/sasl.py, with enforcement): a group is the resource `kafka-group/<id>`, as Kafka's
Group resource. FindCoordinator and OffsetFetch read it, JoinGroup, SyncGroup, Heartbeat, LeaveGroup
and OffsetCommit write it (a member's acts): refused, GROUP_AUTHORIZATION_FAILED. Committing or fetching
a topic's offsets also needs reading the topic: TOPIC_AUTHORIZATION_FAILED for its partitions (and an
OffsetFetch of every topic leaves out those the caller may not read). Commits are signed with the
caller's name.

Not kept: offset commit metadata strings and committed leader epochs (OffsetFetch answers "" and
-1), static membership (group.instance.id is recorded, not used to skip rebalances).

Bounded (`[kafka]`, epochlog/kafka/config.py): the coordinator keeps at most `max_groups` groups in
memory: at the cap, the groups without members or pending member ids whose state is stored leave
memory (they are read again from the views when used), and a request for one more group, when none
can leave, is answered GROUP_MAX_SIZE_REACHED. A group holds at most `max_group_members` members and pending
member ids (MEMBER_ID_REQUIRED hands one out; it lapses after the session timeout asked for, as in
Kafka); one more is answered GROUP_MAX_SIZE_REACHED.

Call everything from the node's loop.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from eventlog.errors import EpochlogError
from epochlog.group_log import GroupLog
from epochlog.kafka import errors as ke
from epochlog.kafka.config import KafkaServiceConfig
from epochlog.kafka.errors import KafkaError, kafka_code
from statemachines import events as ev
from statemachines.access import Action, Operation
from statemachines.query import MAX_LIMIT, Query
from statemachines.state import KafkaGroupState, OffsetState

logger = logging.getLogger(__name__)

OFFSETS_GROUP = "offsets"
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
CHECK_INTERVAL_S = 0.1
_GROUP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"

GROUP_APIS = {10: (0, 6), 11: (0, 7), 12: (0, 4), 13: (0, 5), 14: (0, 5), 8: (2, 8), 9: (1, 8)}


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""
    join: asyncio.Future[dict[str, Any]] | None = None
    sync: asyncio.Future[bytes] | None = None

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    # member ids handed out (MEMBER_ID_REQUIRED), not joined yet -> when they lapse (monotonic time)
    pending: dict[str, float] = field(default_factory=dict)
    rebalance_deadline: float = 0.0
    stored_generation: int = 0   # the generation the views hold (stored or loaded)

    @property
    def idle(self) -> bool:
        """Nothing here that the views do not hold: the group may leave memory."""
        return (self.state == EMPTY and not self.members and not self.pending
                and self.stored_generation == self.generation)


class GroupCoordinator:
    """The consumer-group APIs of one node's Kafka face (see the module docstring)."""

    def __init__(self, handler: Any, config: KafkaServiceConfig | None = None) -> None:
        self.handler = handler
        self.node = handler.node
        self.config = config or KafkaServiceConfig()
        self.groups: dict[str, Group] = {}
        self.term = -1
        self._task: asyncio.Task[None] | None = None
        self._loading: dict[str, asyncio.Future[Group]] = {}
        for key, versions in GROUP_APIS.items():
            request_class, method = {
                10: (FindCoordinatorRequest, self.find_coordinator), 11: (JoinGroupRequest, self.join_group),
                12: (HeartbeatRequest, self.heartbeat), 13: (LeaveGroupRequest, self.leave_group),
                14: (SyncGroupRequest, self.sync_group), 8: (OffsetCommitRequest, self.offset_commit),
                9: (OffsetFetchRequest, self.offset_fetch)}[key]
            handler.register(key, versions, request_class, method)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._check_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._drop_all(ke.NOT_COORDINATOR)

    # --- coordination -----------------------------------------------------------------------------

    def _offsets(self) -> GroupLog:
        group = self.node.group_log(OFFSETS_GROUP)
        assert group is not None, "every node runs the offsets group (epochlog.api.routing.REQUIRED_GROUPS)"
        return group

    def _authorize(self, op: str, group_id: str, operation: Operation) -> None:
        """KafkaError GROUP_AUTHORIZATION_FAILED (counted, logged) unless the caller may `operation` the group."""
        self.handler.auth.check(op, (Action(operation, f"kafka-group/{group_id}"),), ke.GROUP_AUTHORIZATION_FAILED)

    def _check_coordinator(self) -> None:
        g = self._offsets()
        if not g.leads:
            if self.groups:
                self._drop_all(ke.NOT_COORDINATOR)
            raise KafkaError(ke.NOT_COORDINATOR, f"node {self.handler.node_id} is not the group coordinator")
        if g.term != self.term:
            self._drop_all(ke.NOT_COORDINATOR)
            self.term = g.term

    def _drop_all(self, code: int) -> None:
        for group in self.groups.values():
            for m in group.members.values():
                _fail_join(m.join, code)
                _fail_sync(m.sync, code)
        self.groups.clear()

    async def _group(self, group_id: str, create: bool = True) -> Group | None:
        """The group in memory, loaded from the views on first use in this term."""
        self._check_coordinator()
        group = self.groups.get(group_id)
        if group is not None:
            return group
        loading = self._loading.get(group_id)
        if loading is None:
            self._make_room()
            loading = asyncio.get_running_loop().create_future()
            self._loading[group_id] = loading
            try:
                term = self.term
                await self._offsets().read_barrier("linearizable")
                state = Query(self.node.views[OFFSETS_GROUP].store).get(f"kafka-group/{group_id}")
                self._check_coordinator()
                if self.term != term:
                    raise KafkaError(ke.NOT_COORDINATOR, "the coordinator changed while loading the group")
                group = self.groups.get(group_id) or _from_state(group_id, state)
                self.groups[group_id] = group
                loading.set_result(group)
            except BaseException as exc:
                loading.set_exception(exc)
                loading.exception()
                raise
            finally:
                self._loading.pop(group_id, None)
        else:
            group = await asyncio.shield(loading)
        return group

    def _make_room(self) -> None:
        """Room for one more group in memory: drop the idle ones when at the cap; else refuse."""
        cap = self.config.max_groups
        if len(self.groups) + len(self._loading) < cap:
            return
        for group_id in [i for i, g in self.groups.items() if g.idle]:
            del self.groups[group_id]
        if len(self.groups) + len(self._loading) >= cap:
            raise KafkaError(ke.GROUP_MAX_SIZE_REACHED, f"the coordinator keeps {cap} groups with members "
                                                        f"(max_groups): no room for another")

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == PREPARING:
            return
        for m in group.members.values():
            _fail_sync(m.sync, ke.REBALANCE_IN_PROGRESS)
            m.sync = None
        group.state = PREPARING
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline = time.monotonic() + timeout / 1000

    def _maybe_complete_join(self, group: Group, *, deadline_passed: bool = False) -> None:
        if group.state != PREPARING:
            return
        if not deadline_passed and any(m.join is None for m in group.members.values()):
            return
        for member_id in [i for i, m in group.members.items() if m.join is None]:
            del group.members[member_id]   # did not rejoin within the rebalance timeout
        group.generation += 1
        if not group.members:
            group.state, group.protocol, group.leader = EMPTY, "", ""
            self.handler.spawn(self._store(group))
            return
        group.protocol = _select_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = COMPLETING
        logger.info("Kafka group %s: generation %d, protocol %s, leader %s, %d members", group.group_id,
                    group.generation, group.protocol, group.leader, len(group.members))
        for m in group.members.values():
            assert m.join is not None
            m.last_seen = time.monotonic()
            if not m.join.done():
                m.join.set_result(_join_result(group, m))
            m.join = None

    async def _store(self, group: Group) -> None:
        """Write the group's state (generation, members, assignments) to the offsets group."""
        event = ev.KafkaGroupStored(
            group_id=group.group_id, generation=group.generation, protocol_type=group.protocol_type,
            protocol=group.protocol, leader=group.leader, actor="kafka",
            members=tuple(ev.KafkaGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                              client_id=m.client_id, session_timeout_ms=m.session_timeout_ms,
                                              rebalance_timeout_ms=m.rebalance_timeout_ms,
                                              metadata=m.metadata(group.protocol), assignment=m.assignment)
                          for m in group.members.values()))
        try:
            await self.node.write([event])
        except EpochlogError as exc:
            logger.info("storing Kafka group %s failed: %s", group.group_id, exc)
            raise
        group.stored_generation = max(group.stored_generation, event.generation)

    async def _check_loop(self) -> None:
        """Expire silent members and finish rebalances whose timeout passed."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                if self.groups:
                    self._check_coordinator()
            except KafkaError:
                continue
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member_id in [i for i, lapses in group.pending.items() if lapses < now]:
                    del group.pending[member_id]
                expired = [m for m in group.members.values()
                           if m.join is None and now - m.last_seen > m.session_timeout_ms / 1000]
                for m in expired:
                    logger.info("Kafka group %s: member %s expired (no heartbeat for %d ms)", group.group_id,
                                m.member_id, m.session_timeout_ms)
                    self._remove(group, m.member_id)
                if group.state == PREPARING:
                    self._maybe_complete_join(group, deadline_passed=now >= group.rebalance_deadline)

    def _remove(self, group: Group, member_id: str) -> None:
        m = group.members.pop(member_id)
        _fail_join(m.join, ke.UNKNOWN_MEMBER_ID)
        _fail_sync(m.sync, ke.UNKNOWN_MEMBER_ID)
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance(group)
        if group.state == PREPARING:
            self._maybe_complete_join(group)

    # --- FindCoordinator --------------------------------------------------------------------------

    async def find_coordinator(self, request: Any, version: int) -> Any:
        keys = list(request.coordinator_keys) if version >= 4 else [request.key]
        key_type = getattr(request, "key_type", 0)
        leader = self._offsets().leader
        broker = self.handler.brokers.get(leader)
        results = []
        for key in keys:
            if key_type != 0:
                results.append((key, None, ke.COORDINATOR_NOT_AVAILABLE, "only consumer groups are coordinated"))
                continue
            try:
                self._authorize("find_coordinator", key, Operation.READ)
            except KafkaError as exc:
                results.append((key, None, exc.kafka_error, str(exc)))
                continue
            if broker is None:
                results.append((key, None, ke.COORDINATOR_NOT_AVAILABLE, "the offsets group has no leader"))
            else:
                results.append((key, broker, ke.NONE, None))
        if version >= 4:
            return FindCoordinatorResponse(throttle_time_ms=0, coordinators=[
                FindCoordinatorResponse.Coordinator(key=k, node_id=b.node_id if b else -1, host=b.host if b else "",
                                                    port=b.port if b else -1, error_code=code, error_message=msg)
                for k, b, code, msg in results], version=version)
        _, b, code, msg = results[0]
        return FindCoordinatorResponse(throttle_time_ms=0, error_code=code, error_message=msg,
                                       node_id=b.node_id if b else -1, host=b.host if b else "",
                                       port=b.port if b else -1, version=version)

    # --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup -------------------------------------------

    async def join_group(self, request: Any, version: int) -> Any:
        try:
            result = await self._join(request, version)
        except Exception as exc:  # noqa: BLE001
            result = {"error_code": _code(exc), "member_id": request.member_id}
        return JoinGroupResponse(throttle_time_ms=0, error_code=result["error_code"],
                                 generation_id=result.get("generation_id", -1),
                                 protocol_type=result.get("protocol_type"), protocol_name=result.get("protocol_name", ""),
                                 leader=result.get("leader", ""), member_id=result.get("member_id", ""),
                                 members=[JoinGroupResponse.JoinGroupResponseMember(
                                     member_id=i, group_instance_id=gi, metadata=md)
                                     for i, gi, md in result.get("members", [])], version=version)

    async def _join(self, request: Any, version: int) -> dict[str, Any]:
        self._authorize("join_group", request.group_id, Operation.WRITE)
        if not _GROUP_ID.match(request.group_id or ""):
            raise KafkaError(ke.INVALID_GROUP_ID, f"group id {request.group_id!r}: 1-128 letters, digits, '.', '_', "
                                                  f"':', '-' starting with a letter or digit")
        if not MIN_SESSION_TIMEOUT_MS <= request.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise KafkaError(ke.INVALID_SESSION_TIMEOUT, f"session timeout {request.session_timeout_ms} ms")
        group = await self._group(request.group_id)
        assert group is not None
        protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]
        if not protocols or not request.protocol_type:
            raise KafkaError(ke.INCONSISTENT_GROUP_PROTOCOL, "a member names a protocol type and protocols")
        if group.members and (request.protocol_type != group.protocol_type or not _shares_protocol(group, protocols)):
            raise KafkaError(ke.INCONSISTENT_GROUP_PROTOCOL, "the member's protocols do not match the group's")
        member_id = request.member_id
        rebalance_ms = request.rebalance_timeout_ms if version >= 1 and request.rebalance_timeout_ms > 0 \
            else request.session_timeout_ms
        if not member_id:
            cap = self.config.max_group_members
            if len(group.members) + len(group.pending) >= cap:
                raise KafkaError(ke.GROUP_MAX_SIZE_REACHED, f"group {group.group_id} has {cap} members "
                                                            f"(max_group_members)")
            member_id = f"{request.header.client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4:
                group.pending[member_id] = time.monotonic() + request.session_timeout_ms / 1000
                return {"error_code": ke.MEMBER_ID_REQUIRED, "member_id": member_id}
        elif member_id not in group.members and member_id not in group.pending:
            raise KafkaError(ke.UNKNOWN_MEMBER_ID, f"member {member_id} is not in group {group.group_id}")
        group.pending.pop(member_id, None)
        member = group.members.get(member_id)
        now = time.monotonic()
        if member is None:
            member = Member(member_id, getattr(request, "group_instance_id", None), request.header.client_id or "",
                            request.session_timeout_ms, rebalance_ms, request.protocol_type, protocols, now)
            group.members[member_id] = member
        else:
            member.last_seen = now
            unchanged = protocols == member.protocols
            # Kafka's rule: a known member rejoining with the same protocols gets the current
            # generation back (no rebalance), unless it leads a stable group (it may want a new plan).
            if unchanged and (group.state == COMPLETING or (group.state == STABLE and member_id != group.leader)):
                return _join_result(group, member)
            member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms = protocols, \
                request.session_timeout_ms, rebalance_ms
            _fail_join(member.join, ke.UNKNOWN_MEMBER_ID)   # a second join replaces the first
        group.protocol_type = request.protocol_type
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        member.join = future
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await future

    async def sync_group(self, request: Any, version: int) -> Any:
        response = SyncGroupResponse(throttle_time_ms=0, error_code=0, protocol_type=None, protocol_name=None,
                                     assignment=b"", version=version)
        try:
            self._authorize("sync_group", request.group_id, Operation.WRITE)
            group = await self._group(request.group_id)
            assert group is not None
            member = self._member(group, request.member_id, request.generation_id)
            if group.state == PREPARING:
                raise KafkaError(ke.REBALANCE_IN_PROGRESS, "a rebalance is in progress")
            if group.state == STABLE:
                response.assignment = member.assignment
            else:
                future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
                member.sync = future
                if member.member_id == group.leader:
                    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
                    for m in group.members.values():
                        m.assignment = assignments.get(m.member_id, b"")
                    generation = group.generation
                    try:
                        await self._store(group)
                    except Exception:
                        if group.generation == generation and group.state == COMPLETING:
                            self._prepare_rebalance(group)   # nobody got this assignment: do it again
                        raise
                    if group.generation == generation and group.state == COMPLETING:
                        group.state = STABLE
                        now = time.monotonic()
                        for m in group.members.values():
                            m.last_seen = now
                            if m.sync is not None and not m.sync.done():
                                m.sync.set_result(m.assignment)
                            m.sync = None
                response.assignment = await future
            response.protocol_type, response.protocol_name = group.protocol_type, group.protocol
        except Exception as exc:  # noqa: BLE001
            response.error_code = _code(exc)
        return response

    def _member(self, group: Group, member_id: str, generation: int) -> Member:
        member = group.members.get(member_id)
        if member is None:
            raise KafkaError(ke.UNKNOWN_MEMBER_ID, f"member {member_id} is not in group {group.group_id}")
        member.last_seen = time.monotonic()
        if generation != group.generation:
            raise KafkaError(ke.ILLEGAL_GENERATION, f"generation {generation}, the group is at {group.generation}")
        return member

    async def heartbeat(self, request: Any, version: int) -> Any:
        code = ke.NONE
        try:
            self._authorize("heartbeat", request.group_id, Operation.WRITE)
            group = await self._group(request.group_id)
            assert group is not None
            self._member(group, request.member_id, request.generation_id)
            if group.state == PREPARING:
                code = ke.REBALANCE_IN_PROGRESS
        except Exception as exc:  # noqa: BLE001
            code = _code(exc)
        return HeartbeatResponse(throttle_time_ms=0, error_code=code, version=version)

    async def leave_group(self, request: Any, version: int) -> Any:
        leaving = ([(m.member_id, m.group_instance_id) for m in request.members] if version >= 3
                   else [(request.member_id, None)])
        response = LeaveGroupResponse(throttle_time_ms=0, error_code=0, members=[], version=version)
        try:
            self._authorize("leave_group", request.group_id, Operation.WRITE)
            group = await self._group(request.group_id)
            assert group is not None
            for member_id, instance in leaving:
                code = ke.NONE
                if member_id in group.members:
                    self._remove(group, member_id)
                else:
                    code = ke.UNKNOWN_MEMBER_ID
                    if version < 3:
                        response.error_code = code
                response.members.append(LeaveGroupResponse.MemberResponse(
                    member_id=member_id, group_instance_id=instance, error_code=code))
            if not group.members and group.state != EMPTY:
                self._maybe_complete_join(group, deadline_passed=True)
        except Exception as exc:  # noqa: BLE001
            response.error_code = _code(exc)
        return response

    # --- offsets ----------------------------------------------------------------------------------

    async def offset_commit(self, request: Any, version: int) -> Any:
        topics = [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in request.topics]
        codes: dict[tuple[str, int], int] = {}
        try:
            self._authorize("offset_commit", request.group_id, Operation.WRITE)
            principal = self.handler.auth.principal("offset_commit")
            group = await self._group(request.group_id)
            assert group is not None
            generation = request.generation_id_or_member_epoch
            if generation >= 0 or request.member_id:
                self._member(group, request.member_id, generation)
                if group.state in (PREPARING, COMPLETING):
                    raise KafkaError(ke.REBALANCE_IN_PROGRESS, "a rebalance is in progress")
            elif group.members:
                raise KafkaError(ke.UNKNOWN_MEMBER_ID, "the group has members: commit as one of them")
            events = []
            for topic, parts in topics:
                try:
                    self.handler.auth.check("offset_commit", self.handler.topic_actions(topic)[:1])
                except EpochlogError as exc:
                    codes.update({(topic, partition): kafka_code(exc) for partition, _ in parts})
                    continue
                for partition, offset in parts:
                    event = ev.OffsetCommitted(consumer_group=request.group_id, topic=topic, queue_id=partition,
                                               offset=offset, actor="kafka" if principal is None else principal.name)
                    try:
                        event.validate()
                    except EpochlogError:
                        codes[(topic, partition)] = ke.INVALID_COMMIT_OFFSET_SIZE if offset < 0 \
                            else ke.INVALID_TOPIC_EXCEPTION
                        continue
                    events.append(event)
            if events:
                await self.node.write(events)
        except Exception as exc:  # noqa: BLE001
            code = _code(exc)
            codes = {(t, p): codes.get((t, p), code) for t, parts in topics for p, _ in parts}
        return OffsetCommitResponse(throttle_time_ms=0, topics=[
            OffsetCommitResponse.OffsetCommitResponseTopic(name=t, partitions=[
                OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                    partition_index=p, error_code=codes.get((t, p), ke.NONE)) for p, _ in parts])
            for t, parts in topics], version=version)

    async def offset_fetch(self, request: Any, version: int) -> Any:
        if version >= 8:
            wanted = [(g.group_id, None if g.topics is None else [(t.name, list(t.partition_indexes)) for t in g.topics])
                      for g in request.groups]
        else:
            wanted = [(request.group_id, None if request.topics is None
                       else [(t.name, list(t.partition_indexes)) for t in request.topics])]
        answers: list[tuple[str, int, dict[str, dict[int, int]], set[str]]] = []
        for group_id, topics in wanted:
            try:
                self._authorize("offset_fetch", group_id, Operation.READ)
                self._check_coordinator()
                await self._offsets().read_barrier("linearizable")
                found = self._committed(group_id, topics)
                answers.append((group_id, ke.NONE, found, self._unreadable(found, every_topic=topics is None)))
            except Exception as exc:  # noqa: BLE001
                answers.append((group_id, _code(exc),
                                {t: {p: -1 for p in ps} for t, ps in (topics or [])}, set()))

        def code_of(topic: str, group_code: int, denied: set[str]) -> int:
            return ke.TOPIC_AUTHORIZATION_FAILED if topic in denied else group_code if version < 2 else ke.NONE

        R = OffsetFetchResponse
        if version >= 8:
            return R(throttle_time_ms=0, groups=[R.OffsetFetchResponseGroup(group_id=g, error_code=code, topics=[
                R.OffsetFetchResponseGroup.OffsetFetchResponseTopics(name=t, partitions=[
                    R.OffsetFetchResponseGroup.OffsetFetchResponseTopics.OffsetFetchResponsePartitions(
                        partition_index=p, committed_offset=o, committed_leader_epoch=-1, metadata="",
                        error_code=code_of(t, ke.NONE, denied)) for p, o in sorted(parts.items())])
                for t, parts in sorted(found.items())])
                for g, code, found, denied in answers], version=version)
        _, code, found, denied = answers[0]
        return R(throttle_time_ms=0, error_code=code, topics=[R.OffsetFetchResponseTopic(name=t, partitions=[
            R.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                partition_index=p, committed_offset=o, committed_leader_epoch=-1, metadata="",
                error_code=code_of(t, code, denied)) for p, o in sorted(parts.items())])
            for t, parts in sorted(found.items())], version=version)

    def _unreadable(self, found: dict[str, dict[int, int]], *, every_topic: bool) -> set[str]:
        """The topics of `found` the caller may not read, their offsets hidden: asked by name, they are
        refused (returned, counted and logged); asked as every topic, they are left out (removed)."""
        auth = self.handler.auth
        principal = auth.principal("offset_fetch")
        denied = set()
        for topic in list(found):
            if auth.may_any(principal, "offset_fetch", self.handler.topic_actions(topic)[:1], report=not every_topic):
                continue
            if every_topic:
                del found[topic]
            else:
                denied.add(topic)
                found[topic] = {p: -1 for p in found[topic]}
        return denied

    def _committed(self, group_id: str, topics: list[tuple[str, list[int]]] | None) -> dict[str, dict[int, int]]:
        query = Query(self.node.views[OFFSETS_GROUP].store)
        found: dict[str, dict[int, int]] = {}
        if topics is None:
            after = None
            while True:
                page = query.list(f"offset/{group_id}/", limit=MAX_LIMIT, after=after)
                for item in page.items:
                    if isinstance(item.state, OffsetState):
                        found.setdefault(item.state.topic, {})[item.state.queue_id] = item.state.offset
                if not page.next:
                    return found
                after = page.next
        for topic, partitions in topics:
            for p in partitions:
                item = query.get(f"offset/{group_id}/{topic}/{p}")
                state = None if item is None else item.state
                found.setdefault(topic, {})[p] = state.offset if isinstance(state, OffsetState) else -1
        return found


def _fail_join(future: asyncio.Future[dict[str, Any]] | None, code: int) -> None:
    if future is not None and not future.done():
        future.set_result({"error_code": code})


def _fail_sync(future: asyncio.Future[bytes] | None, code: int) -> None:
    if future is not None and not future.done():
        future.set_exception(KafkaError(code, f"the group changed (error {code})"))


def _code(exc: BaseException) -> int:
    """Kafka code for a coordinator API: losing the offsets leadership means NOT_COORDINATOR."""
    code = kafka_code(exc)
    return ke.NOT_COORDINATOR if code == ke.NOT_LEADER_OR_FOLLOWER else code


def _join_result(group: Group, member: Member) -> dict[str, Any]:
    """The JoinGroup answer of the group's current generation (the leader gets every subscription)."""
    members = ([(o.member_id, o.group_instance_id, o.metadata(group.protocol)) for o in group.members.values()]
               if member.member_id == group.leader else [])
    return {"error_code": 0, "generation_id": group.generation, "protocol_type": group.protocol_type,
            "protocol_name": group.protocol, "leader": group.leader, "member_id": member.member_id,
            "members": members}


def _shares_protocol(group: Group, protocols: list[tuple[str, bytes]]) -> bool:
    names = {n for n, _ in protocols}
    return all(names & {n for n, _ in m.protocols} for m in group.members.values())


def _select_protocol(group: Group) -> str:
    """Kafka's choice: among protocols every member supports, the one most members prefer."""
    members = list(group.members.values())
    common = set.intersection(*({n for n, _ in m.protocols} for m in members))
    votes = Counter(next(n for n, _ in m.protocols if n in common) for m in members)
    return max(sorted(votes), key=lambda n: votes[n])


def _from_state(group_id: str, item: Any) -> Group:
    state = None if item is None else item.state
    if not isinstance(state, KafkaGroupState):
        return Group(group_id)
    now = time.monotonic()
    group = Group(group_id, state=STABLE if state.members else EMPTY, generation=state.generation,
                  protocol_type=state.protocol_type, protocol=state.protocol, leader=state.leader,
                  stored_generation=state.generation)
    for m in state.members:   # clocks restart in full: a coordinator failover expires nobody who heartbeats
        group.members[m.member_id] = Member(m.member_id, m.group_instance_id, m.client_id, m.session_timeout_ms,
                                            m.rebalance_timeout_ms, state.protocol_type, [(state.protocol, m.metadata)],
                                            now, assignment=m.assignment)
    return group
