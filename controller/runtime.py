"""The controller on a node: runs `ControllerCore` while the node leads the metadata group.

Theory of operation. A supervisor task looks at the metadata group every `check_interval_ms`:

- leader (in a term the controller is not active in): activate. A linearizable read barrier first
  (the leader has committed an entry of its term and applied everything before it), then the
  registry is loaded from the views and a new core starts every broker's clock in full (the grace
  period: a controller failover does not fence brokers that keep heartbeating), then every group
  is reconciled (one left without a master by a predecessor that died mid-way gets one);
- not leader any more: deactivate (pending requests fail with not_leader: the SDK follows the new
  leader);
- active: hand the core's due commands (fences of silent brokers, unfences) to the decider.

The decider task takes every queued command at once (requests from brokers and the supervisor's),
decides them in order against the core's registry, commits all their events in one submit (split
in chunks under the batch limit), re-reads every touched entity from the views (the authoritative
outcome: a rejected event simply leaves the views as they were) and answers. So a registration
storm becomes a few large batches, and a fence and the election it causes commit together.

Heartbeats never reach the decider: `heartbeats` answers at once from memory (no log write) and
only queues an unfence when a fenced broker is heard from again.

Events written by others (an admin's Write of a broker event) are picked up by a watcher of the
metadata group, which marks their keys for re-reading before the next decision.

The runtime sees the node through what it is given (the metadata group and its views' store, as
callables: a snapshot install replaces the store), never the node itself: the controller sits below
the node (tests/test_layers.py).

Call everything from the node's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import msgspec

from controller import routes
from controller.config import ControllerConfig
from controller.core import (
    AlterSyncStateSet,
    Command,
    ControllerCore,
    Register,
    Shutdown,
)
from controller.errors import ControllerError, ControllerStartingError, FencedError
from controller.registry import Registry, broker_key, group_key
from epochlog.api import messages as p
from eventlog.cancellation import cancel_and_wait
from eventlog.errors import EpochlogError, InvalidArgumentError, error_class, from_code
from eventlog.raft.errors import NotFoundError, NotLeaderError
from eventlog.raft.node import Role
from eventlog.raft.runtime.group import RaftGroup
from statemachines import events as ev
from statemachines.state import BrokerState, GroupState, Outcome, TopicState, decode_state
from statemachines.store import ViewStore, cf_for, prefix_upper_bound

logger = logging.getLogger(__name__)

GROUP = "metadata"
ACTIVATE_TIMEOUT_S = 5.0
SLOW_PASS_S = 0.2        # a batch of decisions slower than this is logged with its timings
# Commands decided and committed together at most: a pass runs on the node's loop, and so does the
# apply of its events; 1000 registrations (~1300 events) keep either well under the Raft election
# timeout (a 10,000-broker storm in one pass held the loop long enough to lose the leadership).
MAX_PASS_COMMANDS = 1000
LOGGED_ELECTIONS = 10    # per batch; a mass failure logs a count of the rest


@dataclass
class _Pending:
    command: Command
    future: asyncio.Future[None] | None = None


@dataclass
class ControllerCounters:
    heartbeats: int = 0
    heartbeats_rejected: int = 0
    commands: int = 0
    events: int = 0
    passes: int = 0
    activations: int = 0
    fenced: int = 0
    elections: int = 0
    last_pass_events: int = 0
    own_ranges: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=4096))


class ControllerRuntime:
    """See the module docstring. `metadata_group` and `metadata_store` give the node's metadata group and
    its views' store as they are at the moment of the call."""

    def __init__(self, config: ControllerConfig, node_id: int, metadata_group: Callable[[], RaftGroup],
                 metadata_store: Callable[[], ViewStore]) -> None:
        self.config = config
        self.node_id = node_id
        self._metadata_group = metadata_group
        self._metadata_store = metadata_store
        self.core: ControllerCore | None = None
        self.term = -1                       # the term the core was activated in
        self.counters = ControllerCounters()
        self._inbox: list[_Pending] = []
        self._inflight: list[_Pending] = []
        self._dirty: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._active_tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="controller")

    async def stop(self) -> None:
        if self._supervisor is not None:
            await cancel_and_wait([self._supervisor])
            self._supervisor = None
        await self._deactivate(NotLeaderError(self.node_id, 0, self.term))

    @property
    def group(self) -> RaftGroup:
        return self._metadata_group()

    @property
    def active(self) -> bool:
        return self.core is not None

    async def _supervise(self) -> None:
        interval = self.config.check_interval_ms / 1000
        while True:
            try:
                await self._supervise_once()
            except asyncio.CancelledError:
                raise
            except EpochlogError as exc:
                logger.info("controller: %s", exc)
            except Exception:   # a bug: log it and let the next round start over from the views
                logger.exception("controller failed; restarting it from the views")
                await self._deactivate(ControllerStartingError("the controller restarts"))
            await asyncio.sleep(interval)

    async def _supervise_once(self) -> None:
        group = self.group
        if group.stopped:
            await self._deactivate(NotLeaderError(self.node_id, 0, group.node.term))
            return
        n = group.node
        leading = n.role is Role.LEADER
        if leading and (self.core is None or self.term != n.term):
            await self._deactivate(NotLeaderError(self.node_id, n.leader, n.term))
            await self._activate(group)
        elif not leading and self.core is not None:
            await self._deactivate(NotLeaderError(self.node_id, n.leader, n.term))
        if self.core is not None:
            due = self.core.due(time.monotonic())
            if due:
                self._queue(due)

    async def _activate(self, group: RaftGroup) -> None:
        term = group.node.term
        await group.read_barrier("linearizable", timeout=ACTIVATE_TIMEOUT_S)
        if group.node.role is not Role.LEADER or group.node.term != term:
            return
        started = time.monotonic()
        store = self._metadata_store()
        brokers = [s for _, s in _scan(store, "brokers", b"broker/") if isinstance(s, BrokerState)]
        groups = [s for _, s in _scan(store, "broker_groups", b"group/") if isinstance(s, GroupState)]
        core = ControllerCore(self.config, Registry(brokers, groups), time.monotonic())
        self.core, self.term = core, term
        self.counters.activations += 1
        applied = group.sm.applied_index
        loop = asyncio.get_running_loop()
        self._active_tasks = [loop.create_task(self._decide(core), name="controller-decide"),
                              loop.create_task(self._follow(group, applied + 1), name="controller-follow")]
        self._queue(core.reconcile_all())
        logger.info("controller active in term %s: %d brokers, %d groups loaded in %.1f ms", term, len(brokers),
                    len(groups), (time.monotonic() - started) * 1000)

    async def _deactivate(self, error: EpochlogError) -> None:
        tasks, self._active_tasks = self._active_tasks, []
        await cancel_and_wait(tasks)
        pending = self._inbox + self._inflight
        self._inbox, self._inflight = [], []
        for item in pending:
            if item.future is not None and not item.future.done():
                item.future.set_exception(error)
        if self.core is not None:
            logger.info("controller stopped (term %s): %s", self.term, error)
        self.core, self.term = None, -1
        self._dirty.clear()

    # --- the decider ----------------------------------------------------------------------------------

    def _queue(self, commands: Sequence[Command]) -> None:
        self._inbox.extend(_Pending(c) for c in commands)
        assert self._wake is not None
        self._wake.set()

    def _submit(self, command: Command) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.append(_Pending(command, future))
        assert self._wake is not None
        self._wake.set()
        return future

    async def _decide(self, core: ControllerCore) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._dirty:
                self._refresh(core, self._dirty, time.monotonic())
                self._dirty = set()
            if not self._inbox:
                continue
            self._inflight, self._inbox = self._inbox[:MAX_PASS_COMMANDS], self._inbox[MAX_PASS_COMMANDS:]
            if self._inbox:
                self._wake.set()   # the rest in the next pass
            try:
                await self._pass(core, self._inflight)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Leadership lost or the proposal dropped (or a bug): what was committed is unknown,
                # so the registry may hold guesses. Fail the batch and start over from the views.
                if not isinstance(exc, EpochlogError):
                    logger.exception("controller: a batch of decisions failed")
                for item in self._inflight:
                    if item.future is not None and not item.future.done():
                        item.future.set_exception(exc)
                self._inflight = []
                asyncio.get_running_loop().create_task(self._deactivate(exc))
                return
            self._inflight = []

    async def _pass(self, core: ControllerCore, batch: list[_Pending]) -> None:
        group = self.group
        now = time.monotonic()
        base = group.node.log.last_index() + 1
        events: list[ev.Event] = []
        spans: list[tuple[_Pending, ControllerError | None, int, int]] = []
        for item in batch:
            decision = core.decide(item.command, now, base + len(events))
            spans.append((item, decision.error, len(events), len(events) + len(decision.events)))
            events.extend(decision.events)
        c = self.counters
        c.passes += 1
        c.commands += len(batch)
        c.last_pass_events = len(events)
        outcomes: list[Outcome | None] = []
        decided = time.monotonic()
        if events:
            outcomes = await self._commit(group, events)
            committed = time.monotonic()
            c.events += len(events)
            elections = [e for e in events if isinstance(e, ev.MasterElected)]
            c.elections += len(elections)
            c.fenced += sum(1 for e in events if isinstance(e, ev.BrokerFenced))
            changes = [e for e in elections if e.master_epoch > 0]   # not a new group's first master
            for e in changes[:LOGGED_ELECTIONS]:
                logger.info("controller: %s of %s: master %s in epoch %s", e.group, e.cluster, e.master,
                            e.master_epoch + 1)
            if len(changes) > LOGGED_ELECTIONS:
                logger.info("controller: ... and %d more elections", len(changes) - LOGGED_ELECTIONS)
            self._refresh(core, {e.key() for e in events}, time.monotonic())
            if committed - now > SLOW_PASS_S:
                logger.info("controller: %d commands, %d events: decided in %.0f ms, committed in %.0f ms, "
                            "re-read in %.0f ms", len(batch), len(events), (decided - now) * 1000,
                            (committed - decided) * 1000, (time.monotonic() - committed) * 1000)
        for item, error, start, end in spans:
            if item.future is None or item.future.done():
                continue
            if error is None:
                rejected = next((o for o in outcomes[start:end] if isinstance(o, Outcome) and not o.ok), None)
                if rejected is not None:
                    error = _refusal(rejected)
            if error is None:
                item.future.set_result(None)
            else:
                item.future.set_exception(error)

    async def _commit(self, group: RaftGroup, events: list[ev.Event]) -> list[Outcome | None]:
        """Commit `events` in order (chunks under the batch limit, submitted together); their outcomes."""
        records = [ev.event_record(e) for e in events]
        limit = max(1, group.max_batch_bytes // 2)
        chunks: list[list[tuple[bytes | None, bytes | None]]] = [[]]
        size = 0
        for record in records:
            n = len(record[0] or b"") + len(record[1] or b"") + 16
            if chunks[-1] and size + n > limit:
                chunks.append([])
                size = 0
            chunks[-1].append(record)
            size += n
        done = await asyncio.gather(*(group.submit(chunk) for chunk in chunks), return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result
        outcomes: list[Outcome | None] = []
        for chunk, committed in zip(chunks, done):
            assert not isinstance(committed, BaseException)
            self.counters.own_ranges.append((committed.offset, committed.offset + len(chunk)))
            for j in range(len(chunk)):
                o = committed.outcomes[j] if j < len(committed.outcomes) else None
                outcomes.append(o if isinstance(o, Outcome) else None)
        return outcomes

    def _refresh(self, core: ControllerCore, keys: set[str], now: float) -> None:
        """Make the registry say what the views say about `keys`."""
        for key in keys:
            state = self._views_state(key)
            if key.startswith("broker/"):
                core.refresh_broker(key, state if isinstance(state, BrokerState) else None, now)
            elif key.startswith("group/"):
                core.refresh_group(key, state if isinstance(state, GroupState) else None)

    async def _follow(self, group: RaftGroup, start: int) -> None:
        """Mark broker and group entities changed by someone else's events for re-reading."""
        ranges = self.counters.own_ranges
        try:
            async for record in group.watch(b"", start):
                key = bytes(record.key)
                if not (key.startswith(b"broker/") or key.startswith(b"group/")):
                    continue
                while ranges and ranges[0][1] <= record.offset - 100_000:
                    ranges.popleft()
                if any(lo <= record.offset < hi for lo, hi in ranges):
                    continue
                self._dirty.add(key.decode())
                assert self._wake is not None
                self._wake.set()
        except EpochlogError as exc:
            # E.g. the log was compacted past this follower: start over from the views (the clocks
            # restart in full, as after a failover).
            logger.warning("controller: following the metadata log failed (%s); reloading the registry", exc)
            asyncio.get_running_loop().create_task(self._deactivate(ControllerStartingError(str(exc))))

    # --- calls from brokers -----------------------------------------------------------------------------

    def _require_active(self) -> ControllerCore:
        n = self.group.node
        if n.role is not Role.LEADER:
            raise NotLeaderError(self.node_id, n.leader, n.term)
        if self.core is None or self.term != n.term:
            raise ControllerStartingError(f"node {self.node_id} leads the metadata group in term {n.term}; "
                                          f"its controller is starting")
        return self.core

    def heartbeats(self, call: p.BrokerHeartbeats) -> p.HeartbeatsAck:
        """Many heartbeats, answered from memory; only a fenced broker heard from again queues a decision."""
        core = self._require_active()
        now = time.monotonic()
        beat = core.heartbeat
        rejected = []
        for i, h in enumerate(call.heartbeats):
            code = beat(f"broker/{h.cluster}/{h.group}/{h.name}", h.broker_epoch, h.offset, now)
            if code:
                rejected.append(p.HeartbeatRejected(i, code))
        self.counters.heartbeats += len(call.heartbeats)
        self.counters.heartbeats_rejected += len(rejected)
        if core.unfence_pending:
            self._queue(core.due(now))
        return p.HeartbeatsAck(rejected)

    async def register(self, call: p.BrokerRegister) -> p.Registered:
        self._require_active()   # raises unless this node runs the controller
        if not call.brokers:
            raise InvalidArgumentError("a registration names at least one broker")
        futures = [self._submit(Register(b.cluster, b.group, b.name, b.address, b.incarnation)) for b in call.brokers]
        results = await asyncio.gather(*futures, return_exceptions=True)
        out = []
        for b, result in zip(call.brokers, results):
            if isinstance(result, ControllerError):
                out.append(p.Registration(-1, 0, None, result.code, str(result)))
                continue
            if isinstance(result, BaseException):
                raise result   # not_leader, dropped: the whole call is retried (registrations are idempotent)
            state = self._views_state(broker_key(b.cluster, b.group, b.name))
            if not isinstance(state, BrokerState) or state.incarnation != b.incarnation:
                out.append(p.Registration(-1, 0, None, FencedError.code,
                                          f"{b.name} of {b.group} was registered again meanwhile"))
                continue
            out.append(p.Registration(state.broker_id, state.broker_epoch, self._group_info(b.cluster, b.group)))
        return p.Registered(out, self.config.heartbeat_interval_ms, self.config.heartbeat_timeout_ms,
                            self._metadata_store().applied)

    async def report_sync_state_set(self, call: p.SyncStateSetReport) -> p.BrokerGroup:
        self._require_active()
        await self._submit(AlterSyncStateSet(call.cluster, call.group, call.name, call.broker_epoch,
                                             call.master_epoch, call.sync_state_set_epoch,
                                             tuple(call.sync_state_set)))
        return p.BrokerGroup(self._group_info(call.cluster, call.group))

    async def shutdown(self, call: p.BrokerShutdown) -> p.BrokerGroup:
        self._require_active()
        await self._submit(Shutdown(call.cluster, call.group, call.name, call.broker_epoch))
        return p.BrokerGroup(self._group_info(call.cluster, call.group))

    # Answers come from the views, not from the registry: by the time a caller resumes, the decider
    # may hold guesses of a batch not committed yet; the views say what is committed.

    def _views_state(self, key: str) -> msgspec.Struct | None:
        raw_key = key.encode()
        raw = self._metadata_store().get(cf_for(raw_key), raw_key)
        return None if raw is None else decode_state(raw_key, raw)

    def _group_info(self, cluster: str, group: str) -> p.BrokerGroupInfo:
        state = self._views_state(group_key(cluster, group))
        if not isinstance(state, GroupState):
            return p.BrokerGroupInfo(cluster, group, -1, 0, [], 0, "no master: no brokers registered")
        store = self._metadata_store()
        brokers = [s for _, s in _scan(store, "brokers", f"broker/{cluster}/{group}/".encode())
                   if isinstance(s, BrokerState)]
        return routes.group_info(state, brokers)

    # --- reads (any node) --------------------------------------------------------------------------------

    async def _read_barrier(self, consistency: str, min_offset: int, timeout: float) -> int:
        if consistency not in p.CONSISTENCY:
            raise InvalidArgumentError(f"consistency {consistency!r} is not one of {', '.join(p.CONSISTENCY)}")
        return await self.group.read_barrier(consistency, min_offset, timeout)

    async def route(self, call: p.RouteQuery, timeout: float) -> p.TopicRoute:
        if not call.topic:
            raise InvalidArgumentError("a route query names a topic")
        applied = await self._read_barrier(call.consistency, call.min_offset, timeout)
        store = self._metadata_store()
        raw_key = f"topic/{call.topic}".encode()
        raw = store.get("topics", raw_key)
        if raw is None:
            raise NotFoundError(f"topic {call.topic!r} does not exist")
        topic = decode_state(raw_key, raw)
        assert isinstance(topic, TopicState)
        groups = [s for _, s in _scan(store, "broker_groups", b"group/") if isinstance(s, GroupState)]

        def brokers_of(g: GroupState) -> list[BrokerState]:
            prefix = f"broker/{g.cluster}/{g.group}/".encode()
            return [s for _, s in _scan(store, "brokers", prefix) if isinstance(s, BrokerState)]

        return routes.topic_route(topic, topic.version, groups, brokers_of, applied, call.cluster)

    async def brokers(self, call: p.BrokerList, timeout: float) -> p.Brokers:
        applied = await self._read_barrier(call.consistency, call.min_offset, timeout)
        store = self._metadata_store()
        if call.group and not call.cluster:
            raise InvalidArgumentError("a group is named with its cluster")
        cluster = f"{call.cluster}/" if call.cluster else ""
        group = f"{call.group}/" if call.group else ""
        groups = {k.decode(): s for k, s in _scan(store, "broker_groups", f"group/{cluster}".encode())
                  if isinstance(s, GroupState) and (not call.group or s.group == call.group)}
        bprefix = f"broker/{cluster}{group}".encode()
        brokers = [s for _, s in _scan(store, "brokers", bprefix) if isinstance(s, BrokerState)]
        core = self.core if self.group.node.role is Role.LEADER else None
        now = time.monotonic()
        infos = []
        by_group: dict[str, list[BrokerState]] = {}
        for b in brokers:
            gkey = group_key(b.cluster, b.group)
            by_group.setdefault(gkey, []).append(b)
            offset, age = -1, -1
            if core is not None:
                clock = core.liveness.clocks.get(broker_key(b.cluster, b.group, b.name))
                if clock is not None:
                    offset = clock.offset
                    age = -1 if clock.last_beat < 0 else int((now - clock.last_beat) * 1000)
            infos.append(routes.broker_info(b, groups.get(gkey), offset, age))
        group_infos = [routes.group_info(g, by_group.get(k, [])) for k, g in sorted(groups.items())]
        return p.Brokers(infos, group_infos, applied, core is not None)


def _scan(store: ViewStore, cf: str, prefix: bytes) -> list[tuple[bytes, msgspec.Struct]]:
    return [(k, decode_state(k, v)) for k, v in store.scan(cf, prefix, prefix_upper_bound(prefix))]


def _refusal(rejected: Outcome) -> ControllerError:
    """A controller event the applier rejected, as the refusal a broker gets: the error its reason names
    (stale_epoch, not_found, fenced...), else invalid_argument."""
    code = rejected.code if error_class(rejected.code) is not EpochlogError else InvalidArgumentError.code
    return from_code(code, f"{rejected.code}: {rejected.message}")
