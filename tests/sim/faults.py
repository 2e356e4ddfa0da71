"""The fault injector of the safety phase: crashes and restarts, partitions, membership churn and
leadership transfers, each at the rates the seed drew. (Message loss, duplication and delay are the
network's own faults; disk latency and torn writes the disk's.)

What each may break:

- crash + restart: everything not durable is lost, a write in flight may be torn; the node comes
  back with its durable term, vote, log and snapshot (vote-durability, commit-durability, and the
  leader lease: a restarted follower does not remember which leader it promised not to desert);
- partitions (isolate one node, split in two, or cut one direction of a node's links): stale
  leaders, competing candidates, terms racing ahead, leaders that can send but not hear;
- membership churn (add a learner that is auto-promoted once caught up, add a voter, remove a
  member, possibly the leader): configurations changing while replicating, new nodes catching up
  from snapshots, leaders stepping down when their removal commits;
- leadership transfer: TimeoutNow elections that bypass the followers' leader stickiness;
- pause (SIGSTOP for a while, then SIGCONT; the leader more often than not): not a crash -- the
  node keeps its memory and disk, but its clock stops, messages queue up for it and its disk
  writes in flight wait. It resumes with stale timers (a stale leader that still believes it
  leads, its lease included), a backlog of messages from older terms, and writes of entries a new
  leader has already replaced (issue 11: a follower whose acknowledgements waited forever for
  replaced entries to become durable, stuck until restarted).

Not thread-safe; one per simulation run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from eventlog.raft.errors import RaftError
from eventlog.raft.node import Role
from eventlog.raft.types import ConfChange, ConfChangeKind
from tests.sim.cluster import Cluster
from tests.sim.replica import Replica


@dataclass(frozen=True, slots=True)
class FaultParams:
    crash_prob: float = 0.0        # per tick: crash one live node
    max_down: int = 1              # at most this many nodes down at once
    restart_min_ticks: int = 1
    restart_max_ticks: int = 30
    partition_prob: float = 0.0    # per tick without a partition: start one
    partition_min_ticks: int = 5
    partition_max_ticks: int = 60
    churn_prob: float = 0.0        # per tick: one membership change through the leader
    max_members: int = 5
    max_new_nodes: int = 3
    transfer_prob: float = 0.0     # per tick: the leader transfers leadership
    pause_prob: float = 0.0        # per tick without a paused node: pause one (the leader more often)
    pause_min_ticks: int = 1
    pause_max_ticks: int = 60


class FaultInjector:
    def __init__(self, cluster: Cluster, rng: random.Random, params: FaultParams) -> None:
        self.cluster = cluster
        self.rng = rng
        self.p = params
        self.enabled = True
        self.heal_at = -1
        self.next_id = max(cluster.replicas) + 1
        self.new_nodes = 0
        self.log: list[str] = []      # what it did, for --verbose replays
        self.counts = {"crash": 0, "partition": 0, "conf_change": 0, "transfer": 0, "pause": 0}
        self._armed_pause: tuple[int, int] | None = None   # (leader to pause, pause anyway at this tick)

    def step(self, now: int) -> None:
        c = self.cluster
        for r in c.replicas.values():   # scheduled restarts and resumes happen even after faults stop
            if r.node is None and 0 <= r.restart_at <= now:
                r.restart_at = -1
                r.boot()
                self.note(now, f"restart n{r.id}")
            elif r.paused and r.resume_at <= now:
                self.resume(r, now)
        if not self.enabled:
            return
        rng, p = self.rng, self.p
        if self._armed_pause:
            self._armed_pause_step(now)
        elif p.pause_prob and rng.random() < p.pause_prob and not any(r.paused for r in c.replicas.values()):
            self._pause(now)
        if self.heal_at >= 0 and now >= self.heal_at:
            c.net.heal()
            self.heal_at = -1
            self.note(now, "heal")
        if p.crash_prob and rng.random() < p.crash_prob:
            down = sum(1 for r in c.replicas.values() if r.node is None)
            live = c.live_ids()   # a paused node may be killed too (kill -9 of a stopped process)
            if down < p.max_down and live:
                r = c.replicas[rng.choice(live)]
                r.crash()
                r.restart_at = now + rng.randint(p.restart_min_ticks, p.restart_max_ticks)
                self.counts["crash"] += 1
                self.note(now, f"crash n{r.id} (restart at {r.restart_at})")
        if p.partition_prob and self.heal_at < 0 and rng.random() < p.partition_prob:
            self._partition(now)
        if p.churn_prob and rng.random() < p.churn_prob:
            self._churn(now)
        if p.transfer_prob and rng.random() < p.transfer_prob:
            leader = c.leader()
            if leader is not None and leader.node is not None:
                voters = [v for v in leader.node.conf.voters if v != leader.id]
                if voters:
                    target = rng.choice(voters)
                    try:
                        leader.node.transfer_leadership(target)
                        self.counts["transfer"] += 1
                        self.note(now, f"transfer n{leader.id} -> n{target}")
                    except RaftError:
                        pass
                    leader.observe()

    def _pause(self, now: int) -> None:
        c, rng = self.cluster, self.rng
        reachable = c.reachable_ids()
        if not reachable:
            return
        leader = c.leader()
        if leader is not None and rng.random() < 0.7:
            # The leader, once it has disk writes in flight (within a few election timeouts), as
            # under the write load: that is what a new leader's entries may replace.
            self._armed_pause = (leader.id, now + 3 * self.cluster.cfg.election_timeout_ticks)
            self._armed_pause_step(now)
            return
        self._pause_node(c.replicas[rng.choice(reachable)], now)

    def _armed_pause_step(self, now: int) -> None:
        assert self._armed_pause is not None
        victim, deadline = self._armed_pause
        r = self.cluster.replicas[victim]
        if not r.reachable or r.node is None or r.node.role is not Role.LEADER:
            self._armed_pause = None    # it lost office meanwhile
        elif r.disk.queue or now >= deadline:
            self._armed_pause = None
            self._pause_node(r, now)

    def _pause_node(self, r: Replica, now: int) -> None:
        rng = self.rng
        until = now + rng.randint(self.p.pause_min_ticks, self.p.pause_max_ticks)
        victim = r.id
        mid_turn = rng.random() < 0.8   # a busy node is mid-turn most of the time
        r.pause(now, until, mid_turn=mid_turn)
        self.counts["pause"] += 1
        role = r.node.role.value if r.node is not None else "?"
        self.note(now, f"pause n{victim} ({role}) until {until}"
                       + (f", {len(r.outbox)} messages unsent" if mid_turn else ""))

    def resume(self, r: Replica, now: int) -> None:
        r.resume(now)
        self.note(now, f"resume n{r.id} ({len(r.inbox)} messages waiting)")

    def _partition(self, now: int) -> None:
        c, rng = self.cluster, self.rng
        ids = list(c.replicas)
        if len(ids) < 2:
            return
        kind = rng.randrange(4)
        if kind == 0:      # isolate one node
            x = rng.choice(ids)
            c.net.split([x], [i for i in ids if i != x])
            what = f"isolate n{x}"
        elif kind == 1:    # split in two random groups
            shuffled = ids[:]
            rng.shuffle(shuffled)
            k = rng.randint(1, len(ids) - 1)
            c.net.split(shuffled[:k], shuffled[k:])
            what = f"split {sorted(shuffled[:k])} | {sorted(shuffled[k:])}"
        elif kind == 2:    # one node hears nobody (it can still send)
            x = rng.choice(ids)
            for i in ids:
                if i != x:
                    c.net.cut(i, x)
            what = f"n{x} deaf"
        else:              # one node is heard by nobody (it still receives)
            x = rng.choice(ids)
            for i in ids:
                if i != x:
                    c.net.cut(x, i)
            what = f"n{x} mute"
        self.heal_at = now + rng.randint(self.p.partition_min_ticks, self.p.partition_max_ticks)
        self.counts["partition"] += 1
        self.note(now, f"partition: {what} until {self.heal_at}")

    def _churn(self, now: int) -> None:
        c, rng, p = self.cluster, self.rng, self.p
        leader = c.leader()
        if leader is None or leader.node is None:
            return
        conf = leader.node.conf
        members = conf.voters + conf.learners
        options = []
        if len(members) < p.max_members and self.new_nodes < p.max_new_nodes:
            options += ["add_learner", "add_voter"]
        if len(members) > 1:
            options.append("remove")
        manual = [n for n in conf.learners if n not in conf.auto_promote]
        if manual:
            options.append("promote")
        if not options:
            return
        action = rng.choice(options)
        if action == "add_learner":
            cc = ConfChange(ConfChangeKind.ADD_LEARNER, self.next_id, auto_promote=rng.random() < 0.8)
        elif action == "add_voter":
            cc = ConfChange(ConfChangeKind.ADD_VOTER, self.next_id)
        elif action == "promote":
            cc = ConfChange(ConfChangeKind.PROMOTE, rng.choice(manual))
        else:
            cc = ConfChange(ConfChangeKind.REMOVE, rng.choice(members))
        try:
            index = leader.node.propose_conf_change(cc)
        except RaftError:
            return
        finally:
            leader.observe()
        if cc.kind in (ConfChangeKind.ADD_LEARNER, ConfChangeKind.ADD_VOTER):
            c.add_replica(cc.node)
            self.next_id += 1
            self.new_nodes += 1
        self.counts["conf_change"] += 1
        self.note(now, f"conf change at {index} by n{leader.id}: {cc.kind.name} n{cc.node}"
                        f"{' auto' if cc.auto_promote else ''}")

    def note(self, now: int, what: str) -> None:
        self.log.append(f"[{now}] {what}")
