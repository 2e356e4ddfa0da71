"""Simulated brokers: a `BrokerAgent` with a replicated offset and a master's SyncStateSet duty.

What `epochlog broker run` and `epochlog sim brokers` run. No messages are stored; what a real
broker would do is imitated closely enough for the controller to act on it:

- the master's log grows by `offset_rate` offsets per second;
- a slave replicates from the master at twice that rate until it has caught up (and truncates to
  the master's offset if it is ahead: a deposed master's unreplicated tail);
- the master, every heartbeat interval, looks at its group in the controller's broker list (which
  carries each broker's last reported offset: the stand-in for replication progress), puts the
  replicas that have caught up (within a few intervals of its own offset, heard from within the
  timeout, unfenced) in its SyncStateSet and takes out those fenced, silent or behind by more than
  a timeout's worth, and reports the new set when it differs (RocketMQ's expand and shrink). So a
  killed master has in-sync successors.

Use from one asyncio loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from epochlog.client.aio import AsyncClient
from epochlog.client.broker import DEFAULT_CLUSTER, BrokerAgent, ControllerClient, HeartbeatSender, RoleChange
from epochlog.client.errors import ClientError

logger = logging.getLogger(__name__)

EXPAND_INTERVALS = 4   # a replica within this many heartbeat intervals of the master's offset has caught up


class SimulatedBroker:
    """One simulated broker (see the module docstring). `say` receives one line per role change."""

    def __init__(self, client: AsyncClient, *, group: str, name: str, address: str, offset_rate: float = 100.0,
                 cluster: str = DEFAULT_CLUSTER, sender: HeartbeatSender | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.controller = ControllerClient(client)
        self.offset_rate = offset_rate
        self.say = say or (lambda line: None)
        self.agent = BrokerAgent(client, cluster=cluster, group=group, name=name, address=address,
                                 on_role_change=self._on_role_change, sender=sender)
        self.offset = 0.0
        self._task: asyncio.Task[None] | None = None
        self.reports = 0

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def group(self) -> str:
        return self.agent.group

    async def start(self) -> RoleChange:
        change = await self.agent.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"broker-{self.name}")
        return change

    async def stop(self, *, shutdown: bool = True) -> None:
        """Stop; with `shutdown` a controlled shutdown (a master hands over), else a silent death."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.agent.stop(shutdown=shutdown)

    def _on_role_change(self, change: RoleChange) -> None:
        stamp = time.strftime("%H:%M:%S")
        if change.role == "fenced":
            self.say(f"{stamp} {self.group}/{self.name}: fenced (another incarnation registered): stopping")
            return
        master = "none" if change.master < 0 else str(change.master)
        self.say(f"{stamp} {self.group}/{self.name} id {change.broker_id}: {change.role} "
                 f"(master {master}, master epoch {change.master_epoch}, broker epoch {change.broker_epoch})")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self.agent.stopped.is_set():
            interval = self.agent.sender.interval_s
            await asyncio.sleep(interval)
            now = loop.time()
            dt, last = now - last, now
            try:
                await self._step(dt, interval)
            except (ClientError, TimeoutError) as exc:
                logger.info("%s: %s", self.name, exc)

    async def _step(self, dt: float, interval: float) -> None:
        agent = self.agent
        info = agent.info
        if info is None:
            return
        master = info.master == agent.broker_id
        if master:
            self.offset += self.offset_rate * dt
            agent.offset = int(self.offset)
        listing = await self.controller.brokers(cluster=agent.cluster, group=agent.group)
        if not listing.controller:
            return   # offsets are known on the controller's node only
        mine = [b for b in listing.brokers if b.group == agent.group]
        if not master:
            leader = next((b for b in mine if b.id == info.master and b.offset >= 0), None)
            if leader is not None:
                if self.offset > leader.offset:
                    self.offset = float(leader.offset)          # truncate a deposed master's tail
                else:
                    self.offset = min(float(leader.offset), self.offset + 2 * self.offset_rate * dt + 1)
                agent.offset = int(self.offset)
            return
        # Offsets reach the controller with the heartbeats, so a replica that keeps up still looks a
        # few intervals behind: it joins within EXPAND_INTERVALS of the master, and only leaves once
        # silent, fenced, or behind by more than a timeout's worth (RocketMQ's haMaxTimeSlaveNotCatchup).
        timeout_ms = agent.timeout_ms
        join = self.offset - EXPAND_INTERVALS * self.offset_rate * interval - 1
        stay = self.offset - self.offset_rate * timeout_ms / 1000 - 1
        current = set(info.sync_state_set)
        wanted = sorted({b.id for b in mine if not b.fenced and 0 <= b.heartbeat_age_ms < timeout_ms
                         and b.offset >= 0 and b.offset >= (stay if b.id in current else join)}
                        | {agent.broker_id})
        if wanted != sorted(info.sync_state_set):
            try:
                await agent.report_sync_state_set(wanted)
                self.reports += 1
            except ClientError as exc:   # an election or a newer report got there first: next round
                logger.info("%s: SyncStateSet report refused: %s", self.name, exc)
