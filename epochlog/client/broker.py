"""The broker side of the controller: calls, a shared heartbeat sender, and `BrokerAgent`.

`ControllerClient` wraps an AsyncClient with the controller's calls (registration and heartbeats
in batches, SyncStateSet reports, controlled shutdown, routes, the broker list). Writes go to the
metadata group's leader (the SDK follows it across failovers); a controller still loading answers
`controller_starting`, which the SDK retries like a leader change.

`BrokerAgent` is one broker's membership: it registers (an incarnation id per process run, so a
restarted broker fences its previous self), heartbeats through a `HeartbeatSender` (one call per
interval carries every agent of the process: a fleet of simulated brokers costs one call, not one
per broker), reports its replicated offset in each heartbeat, reports its SyncStateSet when it is
the master, and learns role changes by watching its group's entity (push): every event on
`group/<cluster>/<group>` makes it re-read the group at that offset, and the `on_role_change`
callback runs when the role, the master or an epoch changed. Nothing polls the controller.

A heartbeat answered `fenced` means another incarnation holds the name: the agent stops (role
"fenced"). `not_found` (unregistered by an operator) makes it register again.

Use from one asyncio loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from statemachines.brokers import new_incarnation
from epochlog.api import messages as p
from epochlog.client.aio import AsyncClient
from epochlog.client.errors import ClientError, InvalidArgumentError
from eventlog.errors import FENCED, NOT_FOUND, from_code
from statemachines.state import GroupState

logger = logging.getLogger(__name__)

DEFAULT_CLUSTER = "DefaultCluster"    # RocketMQ's default brokerClusterName
HEARTBEAT_CHUNK = 5_000               # heartbeats per call
REGISTER_CHUNK = 1_000                # registrations per call


class ControllerClient:
    """The controller's calls over an AsyncClient (see the module docstring)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def _leader(self, call: p.Call, timeout: float | None = None) -> p.Result:
        # The SDK's leader-following call (epochlog.client.aio), for calls it has no method for.
        return await self.client._call(call, group="metadata", leader=True, timeout=timeout)

    async def register(self, brokers: Sequence[p.BrokerIdentity], timeout: float | None = None) -> p.Registered:
        """Register many brokers (one Registration each, refusals included)."""
        results: list[p.Registration] = []
        reply: p.Registered | None = None
        for i in range(0, len(brokers), REGISTER_CHUNK):
            result = await self._leader(p.BrokerRegister(list(brokers[i:i + REGISTER_CHUNK])), timeout)
            assert isinstance(result, p.Registered)
            results += result.results
            reply = result
        assert reply is not None, "register at least one broker"
        return p.Registered(results, reply.heartbeat_interval_ms, reply.heartbeat_timeout_ms, reply.applied)

    async def heartbeats(self, heartbeats: Sequence[p.Heartbeat], timeout: float | None = None) -> p.HeartbeatsAck:
        """Send many heartbeats; the ones not accepted (index into `heartbeats`, code)."""
        rejected: list[p.HeartbeatRejected] = []
        for i in range(0, len(heartbeats), HEARTBEAT_CHUNK):
            result = await self._leader(p.BrokerHeartbeats(list(heartbeats[i:i + HEARTBEAT_CHUNK])), timeout)
            assert isinstance(result, p.HeartbeatsAck)
            rejected += [p.HeartbeatRejected(r.index + i, r.code) for r in result.rejected]
        return p.HeartbeatsAck(rejected)

    async def report_sync_state_set(self, cluster: str, group: str, name: str, broker_epoch: int, master_epoch: int,
                                    sync_state_set_epoch: int, sync_state_set: Sequence[int]) -> p.BrokerGroupInfo:
        """The master's new SyncStateSet; ClientError `stale_epoch` once the epochs moved on."""
        result = await self._leader(p.SyncStateSetReport(cluster, group, name, broker_epoch, master_epoch,
                                                         sync_state_set_epoch, sorted(set(sync_state_set))))
        assert isinstance(result, p.BrokerGroup)
        return result.group

    async def shutdown(self, cluster: str, group: str, name: str, broker_epoch: int,
                       timeout: float | None = None) -> p.BrokerGroupInfo:
        result = await self._leader(p.BrokerShutdown(cluster, group, name, broker_epoch), timeout)
        assert isinstance(result, p.BrokerGroup)
        return result.group

    async def route(self, topic: str, *, cluster: str = "", consistency: str = "linearizable",
                    min_offset: int = -1) -> p.TopicRoute:
        result = await self.client._read(p.RouteQuery(topic, cluster, consistency, min_offset), "metadata",
                                         consistency)
        assert isinstance(result, p.TopicRoute)
        return result

    async def brokers(self, *, cluster: str = "", group: str = "", consistency: str = "linearizable",
                      min_offset: int = -1) -> p.Brokers:
        """Every broker and group; offsets and heartbeat ages when the controller's node answers
        (consistency linearizable or lease)."""
        result = await self.client._read(p.BrokerList(cluster, group, consistency, min_offset), "metadata",
                                         consistency)
        assert isinstance(result, p.Brokers)
        return result


@dataclass(frozen=True, slots=True)
class RoleChange:
    """What an agent knows of its place in its group after a change."""

    role: str                   # master | slave | fenced (another incarnation took over: stopped)
    broker_id: int
    broker_epoch: int
    master: int                 # -1: the group has no master
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    status: str


RoleCallback = Callable[[RoleChange], Awaitable[None] | None]


class HeartbeatSender:
    """Sends the heartbeats of every agent added, in one call per interval."""

    def __init__(self, controller: ControllerClient, interval_s: float = 1.0) -> None:
        self.controller = controller
        self.interval_s = interval_s
        self.agents: dict[str, BrokerAgent] = {}
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failures = 0

    def add(self, agent: BrokerAgent) -> None:
        self.agents[agent.key] = agent
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="heartbeats")

    def remove(self, agent: BrokerAgent) -> None:
        if self.agents.get(agent.key) is agent:
            del self.agents[agent.key]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def beat_once(self) -> None:
        agents = [a for a in self.agents.values() if a.broker_epoch > 0]
        if not agents:
            return
        beats = [p.Heartbeat(a.cluster, a.group, a.name, a.broker_epoch, a.offset) for a in agents]
        # Keep trying for most of a timeout: across a controller failover the SDK follows the leader.
        ack = await self.controller.heartbeats(beats, timeout=max(2 * self.interval_s, 1.0))
        self.sent += len(beats)
        for r in ack.rejected:
            agents[r.index]._rejected(r.code, beats[r.index].broker_epoch)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.beat_once()
            except ClientError as exc:
                self.failures += 1
                logger.info("heartbeats failed (retried next interval): %s", exc)
            except TimeoutError:
                self.failures += 1
            next_at = max(next_at + self.interval_s, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))


class BrokerAgent:
    """One broker's registration, heartbeats, SyncStateSet reports and role (see the module docstring).

    Set `offset` to the broker's replicated offset; the next heartbeat reports it."""

    def __init__(self, client: AsyncClient, *, group: str, name: str, address: str,
                 cluster: str = DEFAULT_CLUSTER, incarnation: str | None = None,
                 on_role_change: RoleCallback | None = None, sender: HeartbeatSender | None = None) -> None:
        self.client = client
        self.controller = ControllerClient(client)
        self.cluster, self.group, self.name, self.address = cluster, group, name, address
        self.incarnation = incarnation or new_incarnation(time.time_ns())
        self.on_role_change = on_role_change
        self._own_sender = sender is None
        self.sender = sender or HeartbeatSender(self.controller)
        self.key = f"broker/{cluster}/{group}/{name}"
        self.group_key = f"group/{cluster}/{group}"
        self.offset = 0
        self.timeout_ms = 10_000      # the controller's heartbeat timeout (told at registration)
        self.broker_id = -1
        self.broker_epoch = 0
        self.info: p.BrokerGroupInfo | None = None
        self._info_version = -1
        self.last: RoleChange | None = None
        self.stopped = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._reregister: asyncio.Task[None] | None = None
        self._refresh_again = False
        self._refresh_at = -1

    # --- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> RoleChange:
        """Register, watch the group from the registration's offset on, start heartbeating; the role
        after registration."""
        applied = await self._register()
        self._watch = asyncio.get_running_loop().create_task(self._follow(applied + 1), name=f"watch-{self.name}")
        self.sender.add(self)
        assert self.last is not None
        return self.last

    async def stop(self, *, shutdown: bool = True) -> None:
        """Stop heartbeating; with `shutdown`, a controlled shutdown first (a master hands over)."""
        self.sender.remove(self)
        if shutdown and self.broker_epoch > 0 and not self.stopped.is_set():
            try:
                group = await self.controller.shutdown(self.cluster, self.group, self.name, self.broker_epoch,
                                                       timeout=min(self.client.timeout, 5.0))
                self._update(group, -1)
            except (ClientError, TimeoutError) as exc:
                logger.warning("%s: controlled shutdown failed: %s", self.name, exc)
        self.stopped.set()
        for task in (self._watch, self._refresh, self._reregister):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._watch, self._refresh, self._reregister) if t is not None),
                             return_exceptions=True)
        if self._own_sender:
            await self.sender.close()

    async def _register(self) -> int:
        """Register; the offset the reply describes the group at."""
        identity = p.BrokerIdentity(self.cluster, self.group, self.name, self.address, self.incarnation)
        reply = await self.controller.register([identity])
        (result,) = reply.results
        if result.code:
            raise from_code(result.code, f"{self.name} of {self.group}: registration refused: {result.message}")
        self.sender.interval_s = reply.heartbeat_interval_ms / 1000
        self.timeout_ms = reply.heartbeat_timeout_ms
        self.broker_id, self.broker_epoch = result.broker_id, result.broker_epoch
        assert result.group is not None
        self._update(result.group, reply.applied, force=True)
        return reply.applied

    # --- the controller's word ------------------------------------------------------------------------

    def _rejected(self, code: str, epoch: int) -> None:
        if epoch != self.broker_epoch or self.stopped.is_set():
            return
        if code == FENCED:
            logger.warning("%s of %s: fenced (another incarnation registered): stopping", self.name, self.group)
            self.sender.remove(self)
            self.stopped.set()
            self._emit(self._change("fenced"))
        elif code == NOT_FOUND and (self._reregister is None or self._reregister.done()):
            self._reregister = asyncio.get_running_loop().create_task(self._register_again())

    async def _register_again(self) -> None:
        try:
            await self._register()
        except (ClientError, TimeoutError) as exc:
            logger.warning("%s: registering again failed: %s", self.name, exc)

    async def _follow(self, from_offset: int) -> None:
        """Watch the group's entity from `from_offset`; re-read it at each event's offset. (The SDK's
        watch resumes on another node by itself; a compacted offset restarts from now with a read.)"""
        while not self.stopped.is_set():
            try:
                async for event in self.client.watch(self.group_key, from_offset=from_offset, window=256):
                    from_offset = event.offset + 1
                    if event.key == self.group_key:
                        self._schedule_refresh(event.offset)
            except ClientError as exc:
                logger.info("%s: watch of %s ended (%s); watching again", self.name, self.group_key, exc)
                from_offset = -1
                self._schedule_refresh(-1)
            await asyncio.sleep(0.2)

    def _schedule_refresh(self, offset: int) -> None:
        if self._refresh is not None and not self._refresh.done():
            self._refresh_again = True
            self._refresh_at = max(self._refresh_at, offset)
            return
        self._refresh_at = offset
        self._refresh = asyncio.get_running_loop().create_task(self._read_group())

    async def _read_group(self) -> None:
        while True:
            self._refresh_again = False
            offset = self._refresh_at
            try:
                entity = await self.client.get_entity(self.group_key, consistency="local" if offset >= 0 else
                                                      "linearizable", min_offset=offset)
            except (ClientError, TimeoutError) as exc:
                logger.info("%s: reading %s failed: %s", self.name, self.group_key, exc)
                entity = None
            if entity is not None and isinstance(entity.state, GroupState):
                g = entity.state
                status = "ok" if g.master >= 0 else "no master"
                self._update(p.BrokerGroupInfo(g.cluster, g.group, g.master, g.master_epoch, list(g.sync_state_set),
                                               g.sync_state_set_epoch, status), entity.version)
            if not self._refresh_again:
                return

    def _update(self, info: p.BrokerGroupInfo, version: int, *, force: bool = False) -> None:
        """Adopt newer group information; run the callback when the role picture changed."""
        if self.info is not None and not force:
            if (info.master_epoch, info.sync_state_set_epoch) < (self.info.master_epoch,
                                                                 self.info.sync_state_set_epoch):
                return   # older than what we know (a reply that crossed a later event)
        self.info = info
        self._info_version = max(self._info_version, version)
        if self.broker_id < 0 or self.stopped.is_set():
            return
        change = self._change("master" if info.master == self.broker_id else "slave")
        last = self.last
        if last is None or (change.role, change.master, change.master_epoch) != (last.role, last.master,
                                                                                 last.master_epoch):
            self._emit(change)
        else:
            self.last = change   # a SyncStateSet change: known, but not a role change

    def _change(self, role: str) -> RoleChange:
        i = self.info
        assert i is not None
        return RoleChange(role, self.broker_id, self.broker_epoch, i.master, i.master_epoch, tuple(i.sync_state_set),
                          i.sync_state_set_epoch, i.status)

    def _emit(self, change: RoleChange) -> None:
        self.last = change
        if self.on_role_change is None:
            return
        result = self.on_role_change(change)
        if inspect.isawaitable(result):
            asyncio.ensure_future(result)

    # --- master duties --------------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        return self.last is not None and self.last.role == "master"

    async def report_sync_state_set(self, members: Sequence[int]) -> p.BrokerGroupInfo:
        """As the master: the new SyncStateSet, under the epochs this agent knows. A ClientError
        `stale_epoch` means an election or another report got there first (the watch brings it)."""
        info = self.info
        if info is None:
            raise InvalidArgumentError("not registered")
        group = await self.controller.report_sync_state_set(self.cluster, self.group, self.name, self.broker_epoch,
                                                            info.master_epoch, info.sync_state_set_epoch, members)
        self._update(group, -1)
        return group
