"""A deterministic simulation of the controller with brokers and faults (fake clock, seeded).

Theory of operation. The "views" are a Registry that only committed events reach (through the
applier's rules, `Registry.apply`); the controller is a `ControllerCore` built from a copy of them
whenever a new controller takes over, exactly as controller.runtime builds it from RocksDB. Every
tick (50 ms of fake time):

- faults, at rates each seed draws for itself: a broker is partitioned from the controller for a
  while (its heartbeats are lost), a broker process dies (restarted later with a new incarnation),
  a broker is restarted while its old process still runs (the old one must be fenced), and the
  controller fails over: the batch it decided in that tick is lost uncommitted, and a new core
  takes over from the views after an election pause;
- live, connected brokers heartbeat every interval (with their replicated offset) and register
  when they must; a broker that believes it is its group's master reports its SyncStateSet from
  replication progress, using the group state it last learned, which reaches brokers with a delay
  (so deposed masters do send stale reports);
- the controller decides everything due in one batch and commits it, and the checkers look at
  every committed event.

Checkers (safety, during faults): an elected master comes from the group's SyncStateSet (or the
group never had one); a heartbeat-timeout fence only hits a broker the current controller has not
heard from for a full timeout since its activation (no mass fencing on failover); an accepted
SyncStateSet change came from the group's master at its current epochs. Liveness (after the
faults stop): every broker is registered and unfenced, every group has a live master, and every
broker knows it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from controller.config import ControllerConfig
from controller.core import FENCED, NOT_FOUND, AlterSyncStateSet, Command, ControllerCore, Register
from controller.registry import Registry, broker_key, group_key
from statemachines import events as ev
from statemachines.state import GroupState

TICK_S = 0.05
CLUSTER = "sim"


@dataclass
class Broker:
    group: str
    name: str
    incarnation: int = 0
    alive: bool = True
    partitioned_until: float = 0.0
    epoch: int = 0                 # 0: must register
    broker_id: int = -1
    offset: int = 0
    next_beat: float = 0.0
    known: GroupState | None = None
    dead_until: float = 0.0

    @property
    def key(self) -> str:
        return broker_key(CLUSTER, self.group, self.name)


@dataclass
class Rates:
    partition: float
    death: float
    zombie: float
    failover: float

    @classmethod
    def draw(cls, rng: random.Random) -> Rates:
        return cls(partition=rng.uniform(0, 0.004), death=rng.uniform(0, 0.002), zombie=rng.uniform(0, 0.0005),
                   failover=rng.uniform(0, 0.003))


@dataclass
class Sim:
    seed: int
    groups: int = 3
    replicas: int = 3
    config: ControllerConfig = field(default_factory=lambda: ControllerConfig(
        heartbeat_interval_ms=1000, heartbeat_timeout_ms=5000, check_interval_ms=100))

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.rates = Rates.draw(self.rng)
        self.now = 0.0
        self.offset = 0                      # the log's next offset
        self.views = Registry()
        self.core: ControllerCore | None = None
        self.activated_at = 0.0
        self.down_until = 0.0
        self.last_heard: dict[str, float] = {}   # broker key -> when the current controller last heard it
        self.brokers = [Broker(f"g{g}", f"b{r}") for g in range(self.groups) for r in range(self.replicas)]
        self.zombies: list[Broker] = []
        self.stats = {"elections": 0, "fences": 0, "failovers": 0, "stale_reports": 0, "zombies_fenced": 0,
                      "sse_changes": 0}
        self.pending: list[tuple[Command, Broker | None]] = []

    # --- the run --------------------------------------------------------------------------------------

    def run(self, fault_s: float, settle_s: float) -> None:
        while self.now < fault_s:
            self.tick(faults=True)
        for b in self.brokers:
            b.partitioned_until = 0.0
            b.dead_until = min(b.dead_until, self.now)
        while self.now < fault_s + settle_s:
            self.tick(faults=False)
        self.check_settled()

    def tick(self, *, faults: bool) -> None:
        self.now = round(self.now + TICK_S, 6)
        rng = self.rng
        if faults:
            self._faults(rng)
        for b in self.brokers:
            if not b.alive and self.now >= b.dead_until:
                self._restart(b)
        if self.core is None and self.now >= self.down_until:
            self._activate()
        for b in self.brokers + self.zombies:
            self._broker_step(b)
        if self.core is not None:
            self._controller_step(rng if faults else None)
        for b in self.brokers:   # the group state reaches brokers with a delay (their watch)
            if b.alive and rng.random() < 0.3:
                b.known = self.views.groups.get(group_key(CLUSTER, b.group))

    def _faults(self, rng: random.Random) -> None:
        r = self.rates
        for b in self.brokers:
            if b.alive and rng.random() < r.partition:
                b.partitioned_until = self.now + rng.uniform(1, 3 * self.config.timeout_s)
            if b.alive and rng.random() < r.death:
                b.alive = False
                b.dead_until = self.now + rng.uniform(0.5, 4 * self.config.timeout_s)
            if b.alive and rng.random() < r.zombie:
                zombie = Broker(b.group, b.name, b.incarnation, True, b.partitioned_until, b.epoch, b.broker_id,
                                b.offset, b.next_beat, b.known)
                self.zombies.append(zombie)
                self._restart(b)
        if self.core is not None and rng.random() < r.failover:
            self._failover(rng)

    def _restart(self, b: Broker) -> None:
        b.alive = True
        b.incarnation += 1
        b.epoch = 0
        b.broker_id = -1
        b.offset = 0
        b.known = None

    def _failover(self, rng: random.Random) -> None:
        self.core = None
        self.pending = []
        self.down_until = self.now + rng.uniform(0.5, 2.0)
        self.stats["failovers"] += 1

    def _activate(self) -> None:
        self.core = ControllerCore(self.config, Registry(self.views.brokers.values(), self.views.groups.values()),
                                   self.now)
        self.activated_at = self.now
        self.last_heard = {}
        self.pending = [(c, None) for c in self.core.reconcile_all()]

    # --- brokers --------------------------------------------------------------------------------------

    def _connected(self, b: Broker) -> bool:
        return b.alive and self.now >= b.partitioned_until and self.core is not None

    def _broker_step(self, b: Broker) -> None:
        if not b.alive:
            return
        master_id = b.known.master if b.known is not None else -1
        if b.broker_id >= 0 and master_id == b.broker_id:
            b.offset += 10
        elif master_id >= 0:
            master = next((x for x in self.brokers if x.group == b.group and x.broker_id == master_id and x.alive), None)
            if master is not None:
                b.offset = min(master.offset, b.offset + 25)
        if not self._connected(b):
            return
        assert self.core is not None
        if b.epoch == 0:
            if not any(isinstance(c, Register) and who is b for c, who in self.pending):
                self.pending.append((Register(CLUSTER, b.group, b.name, f"10.0.0.1:{10000 + id(b) % 50000}",
                                              f"{b.incarnation:020d}"), b))
            return
        if self.now >= b.next_beat:
            b.next_beat = self.now + self.config.interval_s * self.rng.uniform(0.9, 1.0)
            code = self.core.heartbeat(b.key, b.epoch, b.offset, self.now)
            if code == FENCED:
                b.alive = False
                b.dead_until = float("inf")
                self.stats["zombies_fenced"] += 1 if b in self.zombies else 0
                return
            if code == NOT_FOUND:
                b.epoch = 0
                return
            self.last_heard[b.key] = self.now
        known = b.known
        if known is not None and known.master == b.broker_id and self.rng.random() < 0.2:
            peers = [x for x in self.brokers if x.group == b.group and x.alive and x.broker_id >= 0
                     and x.offset >= b.offset - 50]
            wanted = tuple(sorted({b.broker_id} | {x.broker_id for x in peers}))
            if wanted != known.sync_state_set:
                self.pending.append((AlterSyncStateSet(CLUSTER, b.group, b.name, b.epoch, known.master_epoch,
                                                       known.sync_state_set_epoch, wanted), b))

    # --- the controller -------------------------------------------------------------------------------

    def _controller_step(self, rng: random.Random | None) -> None:
        core = self.core
        assert core is not None
        batch = self.pending + [(c, None) for c in core.due(self.now)]
        self.pending = []
        decided: list[tuple[ev.Event, Broker | None]] = []
        replies: list[tuple[Command, Broker | None, bool]] = []
        for command, who in batch:
            decision = core.decide(command, self.now, self.offset + len(decided))
            decided += [(e, who) for e in decision.events]
            replies.append((command, who, decision.error is None))
            if decision.error is not None and decision.error.code == "stale_epoch":
                self.stats["stale_reports"] += 1
        if rng is not None and decided and rng.random() < self.rates.failover * 20:
            self._failover(rng)   # the controller dies after deciding, before its batch commits
            return
        touched = set()
        for event, who in decided:
            self._commit(event, who)
            touched.add(event.key())
        for key in touched:
            if key.startswith("broker/"):
                core.refresh_broker(key, self.views.brokers.get(key), self.now)
            else:
                core.refresh_group(key, self.views.groups.get(key))
        for command, who, ok in replies:
            if isinstance(command, Register) and who is not None and ok:
                state = self.views.brokers.get(who.key)
                if state is not None and state.incarnation == command.incarnation:
                    who.epoch, who.broker_id = state.broker_epoch, state.broker_id
                    who.next_beat = self.now
                    who.known = self.views.groups.get(group_key(CLUSTER, who.group))

    def _commit(self, event: ev.Event, who: Broker | None) -> None:
        """Apply one event to the views, checking it first (the safety checkers)."""
        offset = self.offset
        self.offset += 1
        before = self.views.groups.get(group_key(CLUSTER, event.group)) if hasattr(event, "group") else None
        if isinstance(event, ev.BrokerFenced) and event.reason == "heartbeat timeout":
            heard = max(self.last_heard.get(event.key(), -1.0), self.activated_at)
            assert self.now - heard >= self.config.timeout_s - 1e-6, (
                f"seed={self.seed}: {event.name} of {event.group} fenced at {self.now:.2f}, heard from at "
                f"{heard:.2f} (controller active since {self.activated_at:.2f})")
        ok, code = self.views.apply(event, offset)
        if not ok:
            return
        if isinstance(event, ev.MasterElected):
            self.stats["elections"] += 1
            assert before is not None or event.master_epoch == 0
            if event.master >= 0 and before is not None and before.master_epoch > 0:
                assert event.master in before.sync_state_set, (
                    f"seed={self.seed}: unclean election of {event.master} in {event.group}: in-sync set "
                    f"{before.sync_state_set}")
        elif isinstance(event, ev.BrokerFenced):
            self.stats["fences"] += 1
        elif isinstance(event, ev.SyncStateSetChanged):
            self.stats["sse_changes"] += 1
            assert who is not None and before is not None
            assert before.master == who.broker_id and who.epoch == self.views.brokers[who.key].broker_epoch, (
                f"seed={self.seed}: a SyncStateSet change from {who.name} who is not the master of {event.group}")

    # --- liveness -------------------------------------------------------------------------------------

    def check_settled(self) -> None:
        assert self.core is not None, f"seed={self.seed}: no controller at the end"
        for b in self.brokers:
            state = self.views.brokers.get(b.key)
            assert b.alive and state is not None and not state.fenced, (
                f"seed={self.seed}: {b.name} of {b.group} not live at the end: alive={b.alive} state={state}")
            assert state.incarnation == f"{b.incarnation:020d}"
        for g in range(self.groups):
            group = self.views.groups[group_key(CLUSTER, f"g{g}")]
            assert group.master >= 0, f"seed={self.seed}: g{g} has no master at the end: {group}"
            members = [b for b in self.brokers if b.group == f"g{g}"]
            assert any(b.broker_id == group.master for b in members)
            for b in members:
                assert b.known is not None and b.known.master == group.master, (
                    f"seed={self.seed}: {b.name} of g{g} believes the master is "
                    f"{b.known.master if b.known else None}, not {group.master}")
