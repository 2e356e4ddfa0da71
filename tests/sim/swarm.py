"""Swarm testing: every seed draws its own cluster, configuration and fault rates, then runs a
safety phase with faults followed by a liveness phase that must converge.

One `random.Random(seed)` is the only source of randomness: it draws the parameters and derives
the cluster's, the network's, the disks', the clients' and each core incarnation's own Random, so
a seed replays exactly (`python -m tests.sim --start SEED --seeds 1 -v`).

Phases:

1. safety (`safety_ticks`): clients, and every fault the seed enabled. Checkers watch throughout.
   The forger (forger.py) hands servers forged messages throughout, in both phases.
2. liveness: no more crashes (crashed nodes restart now), pauses (paused nodes resume now),
   partitions, churn, transfers or new client operations; no loss, duplication or reordering
   (delays stay). Either the whole network heals, or one voter stays isolated when every
   configuration any node holds can do without it.
   Required: a leader is elected among the reachable nodes, a fresh proposal commits (a client
   sees it applied), and every reachable member of the leader's configuration converges: applies
   it, and the leader knows its log holds it (its match offset) --
   without ever going `liveness_ticks` without any replica applying anything new, and within
   30 * liveness_ticks in all.
3. the client history must be linearizable.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from eventlog.raft.config import RaftConfig
from eventlog.raft.progress import majority
from tests.sim.checkers import Hooks, InvariantViolation, Linearizability, standard_checkers
from tests.sim.cluster import Cluster
from tests.sim.faults import FaultInjector, FaultParams
from tests.sim.forger import Forger
from tests.sim.history import History, Operation, Status
from tests.sim.network import NetworkFaults
from tests.sim.workload import Client, Workload, WorkloadParams


@dataclass(frozen=True, slots=True)
class SimParams:
    nodes: int
    raft: RaftConfig
    net: NetworkFaults
    faults: FaultParams
    workload: WorkloadParams
    max_disk_latency: int
    torn: float
    snapshot_every: int          # indexes applied between snapshots (0 = never)
    snapshot_padding: int        # extra snapshot bytes, so a snapshot spans several chunks
    safety_ticks: int
    liveness_ticks: int
    heal_all: bool
    pipelined: bool              # hand Readys off before their entries are durable (accept/persisted)
    views: bool = False          # every replica also keeps real RocksDB views (views_shadow.py)
    catch_up_entries: int = 0    # indexes a snapshot leaves in the log below it (MemoryStorage)
    forge_prob: float | None = None   # per tick: the forger hands a server a forged message (None: by seed)


CATCH_UP_ENTRIES = (0, 2, 10)
"""Indexes a snapshot leaves in the log below it, by seed: the runtime's log keeps entries its
snapshot covers, and a lagging follower is sent those instead of the snapshot."""

FORGE_PROBS = (0.0, 0.05, 0.2, 0.5)
"""Per tick, how often the forger (forger.py) hands a server a message no honest member sends, by
seed (`seed // 3`, so every rate meets every CATCH_UP_ENTRIES): forged messages never reach a core,
so the rest of a seed's run is what it was without them."""


def draw_params(rng: random.Random) -> SimParams:
    # A pause seed stops and resumes nodes (SIGSTOP / SIGCONT, the leader more often than not) in a
    # cluster that can elect without the paused node, under load, with slow disks and mostly with
    # pipelined persistence: how issue 11 found a follower stuck for good after its pause.
    pause = rng.random() < 0.45
    nodes = rng.randint(3, 5) if pause else rng.randint(1, 5)
    max_delay = rng.choice([1, 1, 2, 3, 5])
    max_disk_latency = rng.choice([1, 2, 4]) if pause else rng.choice([0, 0, 1, 2, 4])
    # Raft's timing requirement (broadcast time << election timeout): an election is two round
    # trips, each waiting for a persist on both ends, and elections only succeed when the spread of
    # the randomized timeouts, [E, 2E), is wider than that.
    election = rng.randint(0, 8) + max(6, 2 * max_delay + 2 * max_disk_latency + 2)
    raft = RaftConfig(
        election_timeout_ticks=election,
        heartbeat_interval_ticks=rng.choice([1, 2, 3]),
        pre_vote=rng.random() < 0.8,
        check_quorum=rng.random() < 0.8,
        max_inflight_appends=rng.choice([1, 2, 8, 64]),
        max_inflight_bytes=rng.choice([100, 1000, 8 << 20]),
        max_append_bytes=rng.choice([1, 100, 400, 1 << 20]),
        max_uncommitted_bytes=rng.choice([200, 1000, 64 << 20]),
        snapshot_chunk_bytes=rng.choice([8, 32, 1 << 20]),
        lease_drift_ticks=rng.choice([0, 1, 2]),
        learner_catch_up_entries=rng.choice([0, 0, 3]),
    )
    net = NetworkFaults(
        loss=rng.choice([0.0, 0.0, 0.01, 0.05, 0.15, 0.3]),
        dup=rng.choice([0.0, 0.0, 0.02, 0.1]),
        min_delay=1, max_delay=max_delay,
        reorder=rng.choice([0.0, 0.05, 0.2]),
        reorder_ticks=rng.randint(1, 3 * election),
    )
    # Membership churn needs pre-vote or check-quorum: without either, nothing stops a removed
    # server that never learned of its removal (or that it committed) from deposing every leader
    # with higher-term votes (thesis §4.2.3), and the liveness phase could not converge.
    churn = rng.random() < 0.4 and (raft.pre_vote or raft.check_quorum)
    faults = FaultParams(
        crash_prob=rng.choice([0.0, 0.0, 0.003, 0.01, 0.03]),
        max_down=rng.choice([1, nodes]),
        restart_min_ticks=1,
        restart_max_ticks=rng.choice([5, 30, 100]),
        partition_prob=rng.choice([0.0, 0.005, 0.02, 0.05]),
        partition_min_ticks=5,
        partition_max_ticks=rng.choice([20, 60, 150]),
        churn_prob=rng.choice([0.005, 0.02, 0.05]) if churn else 0.0,
        max_members=5,
        max_new_nodes=rng.choice([1, 3, 6]),
        transfer_prob=rng.choice([0.0, 0.0, 0.005, 0.02]),
    )
    weights = [rng.choice([0, 2, 4]) for _ in range(5)]
    if not any(weights):
        weights[0] = 1
    workload = WorkloadParams(
        clients=rng.randint(2, 4) if pause else rng.randint(1, 4),
        keys=rng.randint(1, 3),
        issue_prob=rng.choice([0.3, 0.6]) if pause else rng.choice([0.1, 0.3, 0.6]),
        timeout_ticks=rng.randint(3 * election, 10 * election),
        max_count=rng.choice([1, 1, 3]),
        weights=(weights[0], weights[1], weights[2], weights[3], weights[4]),
    )
    params = SimParams(
        nodes=nodes, raft=raft, net=net, faults=faults, workload=workload,
        max_disk_latency=max_disk_latency,
        torn=rng.choice([0.0, 0.5, 1.0]),
        snapshot_every=rng.choice([0, 3, 8, 20]),
        snapshot_padding=rng.choice([0, 20, 100]),
        safety_ticks=rng.randint(200, 600),
        liveness_ticks=600 + 40 * election,
        heal_all=rng.random() < 0.5,
        pipelined=rng.random() < (0.7 if pause else 0.5),
    )
    if not pause:
        return params
    # Long enough, often, for the others to elect a new leader meanwhile.
    return replace(params, faults=replace(faults, pause_prob=rng.choice([0.005, 0.01, 0.03]),
                                          pause_min_ticks=rng.choice([1, election]),
                                          pause_max_ticks=rng.choice([2 * election, 4 * election, 10 * election])))


@dataclass(slots=True)
class SeedResult:
    seed: int
    invariant: str = ""            # "" when every invariant held
    detail: str = ""
    ticks: int = 0
    ops: int = 0                   # client operations invoked
    ops_ok: int = 0
    messages: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    inconclusive: bool = False     # linearizability search budget ran out
    fingerprint: str = ""          # digest of the run, for determinism checks
    views: dict[str, int] = field(default_factory=dict)   # views shadow statistics (views runs only)
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)   # fault log and params (verbose runs only)

    @property
    def ok(self) -> bool:
        return not self.invariant


class Simulation:
    """One seed's run: builds the cluster, runs both phases, reports the first violation."""

    def __init__(self, seed: int, tweak: Callable[[SimParams], SimParams] | None = None,
                 views: bool = False) -> None:
        self.seed = seed
        rng = random.Random(seed)
        self.params = p = draw_params(rng) if tweak is None else tweak(draw_params(rng))
        # From the seed, not drawn: every seed's other parameters and run stay what they were.
        self.params = p = replace(p, catch_up_entries=CATCH_UP_ENTRIES[seed % len(CATCH_UP_ENTRIES)])
        if p.forge_prob is None:
            self.params = p = replace(p, forge_prob=FORGE_PROBS[seed // 3 % len(FORGE_PROBS)])
        # Seeds 500-999 of every thousand: a new commit index only with the next append or heartbeat (the
        # lower half, which the seeded tests use, runs as it did before the option).
        self.params = p = replace(p, raft=replace(p.raft, commit_broadcast=seed % 1000 < 500))
        if views:
            self.params = p = replace(p, views=True)
        self.history = History()
        self.checkers = standard_checkers(self.history, pipelined=p.pipelined)
        self.hooks = Hooks(self.checkers)
        self.views_root = Path(tempfile.mkdtemp(prefix=f"sim-views-{seed}-")) if p.views else None
        self.cluster = Cluster(random.Random(rng.getrandbits(64)), p.raft, nodes=p.nodes, net_faults=p.net,
                               hooks=self.hooks, history=self.history, max_disk_latency=p.max_disk_latency,
                               torn=p.torn, snapshot_every=p.snapshot_every, snapshot_padding=p.snapshot_padding,
                               pipelined=p.pipelined, views_root=self.views_root,
                               catch_up_entries=p.catch_up_entries)
        if p.views:
            from tests.sim.views_shadow import ViewsDigest
            self.checkers.insert(len(self.checkers) - 1, ViewsDigest(self.cluster.replicas))
        self.faults = FaultInjector(self.cluster, random.Random(rng.getrandbits(64)), p.faults)
        self.workload = Workload(self.cluster, self.history, random.Random(rng.getrandbits(64)), p.workload)
        self.forger = Forger(self.cluster, random.Random(rng.getrandbits(64)), p.forge_prob or 0.0)
        self.cluster.before_tick += [self.faults.step, self.workload.step, self.forger.step]
        self.isolated: int = 0
        self._probe_index = -1

    def run(self) -> SeedResult:
        started = time.perf_counter()
        result = SeedResult(self.seed)
        try:
            self.cluster.run(self.params.safety_ticks)
            self._liveness()
            self.hooks.finish()
        except InvariantViolation as v:
            result.invariant, result.detail = v.invariant, v.detail
        except Exception as e:   # a core assertion or error is a bug too
            tb = traceback.extract_tb(e.__traceback__)
            where = next((f"{fr.filename.rsplit('/', 1)[-1]}:{fr.lineno} in {fr.name}" for fr in reversed(tb)
                          if "/eventlog/raft/" in fr.filename), "")
            result.invariant = "core-assertion" if isinstance(e, AssertionError) else "exception"
            result.detail = f"{type(e).__name__}: {e} ({where or tb[-1].filename.rsplit('/', 1)[-1]})\n" + \
                "".join(traceback.format_exception(e)[-6:])
        c = self.cluster
        result.views = self._views_stats()
        result.ticks = c.now
        result.ops = len(self.history.ops)
        result.ops_ok = sum(1 for op in self.history.ops if op.status is Status.OK)
        result.messages = c.net.sent
        result.faults = dict(self.faults.counts)
        result.faults["torn"] = sum(r.disk.torn_writes for r in c.replicas.values())
        result.faults["snapshots_installed"] = sum(r.snapshots_installed for r in c.replicas.values())
        result.faults["forged"] = sum(self.forger.counts.values())
        lin = next(ch for ch in self.checkers if isinstance(ch, Linearizability))
        result.inconclusive = lin.inconclusive
        if lin.inconclusive and not result.detail:
            result.detail = lin.inconclusive_detail
        h = hashlib.blake2b(digest_size=8)
        for op in self.history.ops:
            h.update(op.describe().encode())
        h.update(f"{c.now} {c.net.sent} {c.net.dropped}".encode())
        result.fingerprint = h.hexdigest()
        result.seconds = time.perf_counter() - started
        self._close_views()
        return result

    def _views_stats(self) -> dict[str, int]:
        if self.views_root is None:
            return {}
        from tests.sim.views_shadow import ViewsDigest
        checker = next(ch for ch in self.checkers if isinstance(ch, ViewsDigest))
        shadows = [r.views for r in self.cluster.replicas.values() if r.views is not None]
        return {"enabled": 1, "checks": checker.checks, "offsets": len(checker.digests),
                "max_offset": max((s.applied for s in shadows if s.sm is not None), default=-1),
                "checkpoints": len(self.cluster.views_snapshots),
                "restored_on_boot": sum(s.restored_on_boot for s in shadows)}

    def _close_views(self) -> None:
        if self.views_root is None:
            return
        for r in self.cluster.replicas.values():
            if r.views is not None:
                r.views.close()
        shutil.rmtree(self.views_root, ignore_errors=True)

    # --- liveness --------------------------------------------------------------------------------

    def _calm(self) -> None:
        c = self.cluster
        self.faults.enabled = False
        # No new client operations (those in flight still complete): under sustained load a
        # leader that snapshots every few indexes replaces its snapshot faster than a chunked
        # transfer to a lagging follower completes (MemoryStorage serves only its latest snapshot
        # and keeps no log tail behind it), and the follower never catches up. That is the
        # application's compaction policy, not a protocol property.
        self.workload.enabled = False
        for r in c.replicas.values():
            if r.node is None:
                r.restart_at = -1
                r.boot()
            elif r.paused:
                self.faults.resume(r, c.now)
        c.net.heal()
        c.net.faults = NetworkFaults(min_delay=c.net.faults.min_delay, max_delay=c.net.faults.max_delay)
        if not self.params.heal_all:
            self.isolated = self._pick_isolated()
            if self.isolated:
                others = [i for i in c.replicas if i != self.isolated]
                c.net.split([self.isolated], others)
                self.faults.note(c.now, f"liveness: n{self.isolated} stays isolated")

    def _pick_isolated(self) -> int:
        """A voter every configuration can do without (majorities survive, no learner to promote)."""
        c = self.cluster
        confs = [r.node.conf for r in c.replicas.values() if r.node is not None]
        if not confs:
            return 0
        candidates = sorted(set(confs[0].voters).intersection(*(set(k.voters) for k in confs)))
        candidates = [x for x in candidates
                      if all(len(k.voters) >= 3 and len(k.voters) - 1 >= majority(k.voters)
                             and not k.auto_promote for k in confs)]
        return self.faults.rng.choice(candidates) if candidates else 0

    def _liveness(self) -> None:
        """Phase 2: a leader commits a fresh proposal (the probe) and every reachable member of its
        configuration applies it. Catching up a long log one small append at a time may take long,
        so the bound is on stalling: the run fails when for `stall` ticks no replica applies anything
        new (elections without commits, a follower that never catches up), or at an absolute cap."""
        c = self.cluster
        self._calm()
        E = self.params.raft.election_timeout_ticks
        stall = self.params.liveness_ticks
        cap = c.now + 30 * self.params.liveness_ticks
        probe_client = Client(0)
        probe: Operation | None = None
        probe_deadline = 0
        applied_sum, last_progress = -1, c.now
        while probe is None or probe.status is not Status.OK or self._lagging():
            c.tick()
            total = sum(r.kv.applied for r in c.replicas.values())
            if total != applied_sum:
                applied_sum, last_progress = total, c.now
            if c.now - last_progress > stall or c.now >= cap:
                raise InvariantViolation("liveness", self._liveness_report(probe, c.now - last_progress))
            if probe is not None and probe.status is Status.OK:
                continue
            if probe is not None and probe.status is Status.PENDING:
                if c.now < probe_deadline:
                    continue
                if probe_client.waiter is not None:   # stuck (its leader lost office): try again
                    c.replicas[probe.node].forget(probe_client.waiter)
                self.history.unknown(probe)
                probe_client.waiter = None
            leader = c.leader([i for i in c.replicas if i != self.isolated])
            if leader is None:
                continue
            probe_client.leader_guess = leader.id
            probe = self.workload.issue(probe_client, c.now, kind="put", key="k0")
            if probe is not None:
                self._probe_index = max(i for i, w in leader.proposals.items() if w.op is probe)
                probe_deadline = c.now + 4 * E + 20

    def _lagging(self) -> list[int]:
        """Reachable members of the leader's configuration that have not converged on the probe: the
        convergence check. A member converged once it applied the probe (so its log holds the
        leader's committed prefix through it) and the leader knows it (its progress shows a match at
        or past the probe). A follower whose log stopped advancing -- the stuck follower of issue 11,
        an exact prefix of the leader's log with a match of -1 on the leader -- never does."""
        c = self.cluster
        leader = c.leader([i for i in c.replicas if i != self.isolated])
        if leader is None or leader.node is None:
            return [i for i in c.replicas if i != self.isolated]
        node = leader.node
        members = node.conf.voters + node.conf.learners
        return [m for m in members if m != self.isolated
                and (c.replicas[m].kv.applied < self._probe_index
                     or (m in node.progress and node.progress[m].match < self._probe_index))]

    def _liveness_report(self, probe: Operation | None, idle: int) -> str:
        c = self.cluster
        nodes = "; ".join(f"n{r.id}: {r.node!r} applied {r.kv.applied}" if r.node else f"n{r.id}: down"
                          for r in c.replicas.values())
        iso = f", n{self.isolated} isolated" if self.isolated else ""
        if probe is None or probe.status is not Status.OK:
            what = "no leader" if c.leader() is None else "the probe did not commit"
        else:
            leader = c.leader([i for i in c.replicas if i != self.isolated])
            matches = "" if leader is None or leader.node is None else (
                f", leader n{leader.id}'s matches {({n: p.match for n, p in leader.node.progress.items()})}")
            what = f"nodes {self._lagging()} did not converge on the probe (index {self._probe_index}){matches}"
        return f"{what}: nothing applied for {idle} calm ticks (at tick {c.now}){iso} ({nodes})"


def run_seed(seed: int, verbose: bool = False, tweak: Callable[[SimParams], SimParams] | None = None,
             views: bool = False) -> SeedResult:
    sim = Simulation(seed, tweak, views)
    result = sim.run()
    if verbose:
        p = sim.params
        result.log = [f"params: {p.nodes} nodes, raft {p.raft}", f"  net {p.net}", f"  faults {p.faults}",
                      f"  workload {p.workload}",
                      f"  disk latency <= {p.max_disk_latency}, torn {p.torn}, snapshot every {p.snapshot_every} "
                      f"(+{p.snapshot_padding} B, {p.catch_up_entries} indexes kept below), safety {p.safety_ticks} ticks, "
                      f"heal_all {p.heal_all}, "
                      f"pipelined {p.pipelined}, views {p.views}, forge {p.forge_prob}/tick"]
        result.log += sim.faults.log
    return result

