"""The simulated cluster: replicas over one fake network, driven tick by tick by one clock.

One tick, in this order (everything is deterministic given the seed):

1. the fault injector acts (crash, restart, partition, heal, membership change, transfer);
2. clients issue operations and give up on old ones;
3. a node resumed from a pause steps the messages that arrived while it was paused; then the
   network delivers every message due now: each is checked as the runtime checks peer messages
   (eventlog/raft/peer_check.py) and stepped into its live destination (held in the inbox of a
   paused one);
4. every live core that is not paused ticks;
5. disk writes due now complete (send what waited for them, apply, advance / persisted);
6. every live replica that is not paused takes Readys while it may (one at a time, or pipelined).

A message sent at tick t arrives at t + 1 or later, so a round trip takes at least two ticks.

Not thread-safe; one per simulation run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from eventlog.raft.config import RaftConfig
from eventlog.raft.node import Role
from eventlog.raft.peer_check import PeerCheck
from eventlog.raft.storage import MemoryStorage
from eventlog.raft.types import ConfState
from tests.sim.checkers import Hooks
from tests.sim.history import History
from tests.sim.network import Network, NetworkFaults
from tests.sim.replica import Replica


class Cluster:
    def __init__(self, rng: random.Random, cfg: RaftConfig, *, nodes: int, net_faults: NetworkFaults,
                 hooks: Hooks, history: History, max_disk_latency: int, torn: float, snapshot_every: int,
                 snapshot_padding: int, pipelined: bool = False, views_root: Path | None = None,
                 catch_up_entries: int = 0) -> None:
        self.rng = rng
        self.cfg = cfg
        self.net = Network(random.Random(rng.getrandbits(64)), net_faults)
        self.hooks = hooks
        self.history = history
        self.max_disk_latency = max_disk_latency
        self.torn = torn
        self.snapshot_every = snapshot_every
        self.snapshot_padding = snapshot_padding
        self.pipelined = pipelined
        self.catch_up_entries = catch_up_entries
        self.views_root = views_root   # a directory: every replica keeps real views (views_shadow.py)
        self.views_snapshots: dict[tuple[int, int], Path] = {}
        self.bootstrap = ConfState(voters=tuple(range(1, nodes + 1)))
        # Every server ever created is in the address book (the runtime's drops removed ones: a
        # superset here, so the checks are tested at their most permissive).
        self.peer_check = PeerCheck(known_peer=lambda peer: peer in self.replicas)
        self.replicas: dict[int, Replica] = {}
        self.now = 0
        self.before_tick: list[Callable[[int], None]] = []   # fault injector, workload
        for node_id in range(1, nodes + 1):
            self.add_replica(node_id)

    def add_replica(self, node_id: int) -> Replica:
        """A new server. It starts from the bootstrap membership and an empty log, like every member
        did, and learns later changes from the log or a snapshot."""
        assert node_id not in self.replicas
        views = None
        if self.views_root is not None:
            from tests.sim.views_shadow import ViewsShadow
            views = ViewsShadow(self.views_root / f"n{node_id}" / "group", self.views_snapshots)
        r = Replica(node_id, MemoryStorage(self.bootstrap, self.catch_up_entries), self.cfg, rng=self.rng, net=self.net,
                    hooks=self.hooks, history=self.history, max_disk_latency=self.max_disk_latency,
                    torn=self.torn, snapshot_every=self.snapshot_every, snapshot_padding=self.snapshot_padding,
                    peer_check=self.peer_check, pipelined=self.pipelined, views=views)
        self.replicas[node_id] = r
        return r

    def live_ids(self) -> list[int]:
        return [i for i, r in self.replicas.items() if r.alive]

    def reachable_ids(self) -> list[int]:
        """Live and not paused: the nodes a client (or an operator) can talk to."""
        return [i for i, r in self.replicas.items() if r.reachable]

    def leader(self, among: list[int] | None = None) -> Replica | None:
        """The reachable leader with the highest term (among the given nodes)."""
        best: Replica | None = None
        for node_id in among if among is not None else list(self.replicas):
            r = self.replicas[node_id]
            if r.reachable and r.node is not None and r.node.role is Role.LEADER and (
                    best is None or best.node is None or r.node.term > best.node.term):
                best = r
        return best

    def tick(self) -> None:
        now = self.now
        for hook in self.before_tick:
            hook(now)
        replicas = self.replicas
        for resumed in replicas.values():   # a node resumed from a pause steps its backlog first
            if resumed.inbox and resumed.node is not None and not resumed.paused:
                backlog, resumed.inbox = resumed.inbox, []
                for m in backlog:
                    if resumed.node is not None:
                        resumed.receive(m.src, m)
        for m in self.net.due(now):
            dst = replicas.get(m.dst)
            if dst is not None and dst.node is not None:
                if dst.paused:
                    dst.inbox.append(m)
                else:
                    dst.receive(m.src, m)
        live = [r for r in replicas.values() if r.node is not None and not r.paused]
        for r in live:
            r.tick()
        for r in live:
            if r.node is not None:
                r.complete_writes(now)
        for r in live:
            r.pump(now)
        self.now = now + 1

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.tick()
