"""The nemesis of a chaos run: one fault at a time on one node, drawn from the run's seed.

Faults, each on a group's leader or on a follower (mostly the kv group's leader):

- `kill`: kill -9, restart after a while (same ports, same data);
- `pause`: SIGSTOP, SIGCONT after a while: the process keeps its sockets, so clients and peers see
  open connections that stay silent;
- `isolate` (with partitions): every peer link of the node is cut both ways, each either silently
  (frames dropped, TCP connection up) or loudly (connections reset, reconnections refused), while
  its client port stays reachable: an isolated leader keeps accepting calls it can no longer
  commit, the case where an SDK call stays on a deposed leader;
- `one-way` (with partitions): only the node's outgoing frames are dropped (it still hears its
  peers) or only its incoming ones (its peers still hear it).

Partitions go through the frame-aware proxies of tests/support/proxy.py between the nodes
(`NodeCluster(proxied=True)`), not iptables: they need no root and act on whole transport frames.

One node at a time, healed before the next fault, so a majority can always make progress. With
partitions the first fault isolates the kv leader, so every such run has the case that found the
double application of issue 17. Runs in a thread; `stop` ends it (the current fault is healed first).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import TextIO

from tests.support.nodes import NodeCluster

GROUPS = ("metadata", "offsets", "kv")


class Nemesis:
    def __init__(self, cluster: NodeCluster, rng: random.Random, out: TextIO, *, partitions: bool,
                 gap_s: tuple[float, float], pause_s: tuple[float, float], down_s: tuple[float, float],
                 isolate_s: tuple[float, float]) -> None:
        assert not partitions or cluster.net is not None, "partitions need a proxied cluster"
        self.cluster = cluster
        self.rng = rng
        self.out = out
        self.kinds = {"pause": 3, "kill": 2, **({"isolate": 4, "one-way": 2} if partitions else {})}
        self.first: tuple[str, str, str] | None = ("isolate", "leader", "kv") if partitions else None
        self.gap_s, self.pause_s, self.down_s, self.isolate_s = gap_s, pause_s, down_s, isolate_s
        self.stop = threading.Event()
        self.faults: Counter[str] = Counter()
        self.started = time.monotonic()

    def note(self, what: str) -> None:
        print(f"  [{time.monotonic() - self.started:6.2f}s] {what}", file=self.out, flush=True)

    def run(self) -> None:
        rng = self.rng
        while not self.stop.wait(rng.uniform(*self.gap_s)):
            kind = rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
            role = rng.choices(("leader", "follower"), weights=(3, 1))[0]
            group = rng.choices(GROUPS, weights=(1, 1, 4))[0]
            if self.first is not None:
                (kind, role, group), self.first = self.first, None
            victim = self._pick(role, group)
            if victim is None:
                continue
            what = f"node {victim} ({group} {role})"
            {"pause": self._pause, "kill": self._kill, "isolate": self._isolate, "one-way": self._one_way}[kind](
                victim, what)
            self.faults[f"{kind} {role}"] += 1

    def _pause(self, victim: int, what: str) -> None:
        seconds = self.rng.uniform(*self.pause_s)
        self.note(f"SIGSTOP {what} for {seconds:.2f}s")
        self.cluster.pause(victim)
        try:
            self.stop.wait(seconds)
        finally:
            self.cluster.resume(victim)
        self.note(f"SIGCONT node {victim}")

    def _kill(self, victim: int, what: str) -> None:
        seconds = self.rng.uniform(*self.down_s)
        self.note(f"kill -9 {what}, restart after {seconds:.2f}s")
        self.cluster.kill9(victim)
        self.stop.wait(seconds)
        self.cluster.restart(victim)
        self.note(f"node {victim} restarted (READY)")

    def _isolate(self, victim: int, what: str) -> None:
        net = self.cluster.net
        assert net is not None
        seconds = self.rng.uniform(*self.isolate_s)
        how = {peer: self.rng.choice(("silently", "severed")) for peer in self._peers(victim)}
        self.note(f"isolate {what} from its peers for {seconds:.2f}s ("
                  + ", ".join(f"{h} from {peer}" for peer, h in how.items()) + "); its client port stays up")
        try:
            for peer, h in how.items():
                (net.partition if h == "silently" else net.sever)(victim, peer)
            self.stop.wait(seconds)
        finally:
            net.heal()
        self.note(f"healed node {victim}'s links")

    def _one_way(self, victim: int, what: str) -> None:
        net = self.cluster.net
        assert net is not None
        seconds = self.rng.uniform(*self.isolate_s)
        outgoing = self.rng.random() < 0.5
        self.note(f"drop every frame {'from' if outgoing else 'to'} {what} "
                  f"{'to' if outgoing else 'from'} its peers for {seconds:.2f}s (one-way)")
        try:
            for peer in self._peers(victim):
                net.drop(*((victim, peer) if outgoing else (peer, victim)))
            self.stop.wait(seconds)
        finally:
            net.heal()
        self.note(f"healed node {victim}'s links")

    def _peers(self, node: int) -> list[int]:
        return [i for i in self.cluster.nodes if i != node]

    def _pick(self, role: str, group: str) -> int | None:
        try:
            leader = self.cluster.leader(group, timeout=3.0)
        except AssertionError:
            return self.rng.choice(self.cluster.running()) if self.cluster.running() else None
        if role == "leader":
            return leader
        followers = [i for i in self.cluster.running() if i != leader]
        return self.rng.choice(followers) if followers else None
