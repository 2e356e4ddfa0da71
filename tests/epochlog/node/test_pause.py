"""SIGSTOP / SIGCONT of real `epochlog serve` processes under write load (issue 11).

- The kv leader paused for 1-3 s, three times (EPOCHLOG_SOAK=<k>: 3k), under 8 writer threads: every member's applied
  offset converges to the leader's commit offset within a bounded time, and the leader knows it
  (its match offset for each member); each paused node noticed its tick clock stalled (and so
  voided any lease it held: epochlog_clock_stalls_total). Before the fix, a resumed leader whose last writes a new
  leader replaced could stay a follower whose log never advanced (match -1 on the leader) until it
  restarted.
- A paused follower: the leader measures its lag (/metrics epochlog_member_lag_offsets and
  _seconds) and logs a WARNING naming group, member, lag and for how long once it stays behind past
  `lag_warning_ms`, repeated at a bounded rate; resumed, it catches up and the leader logs so.

Every wait is bounded; processes are signalled by the pids the test started (NodeCluster).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable

from epochlog.client import Client, ClientError
from eventlog.errors import EpochlogError
from tests.support.nodes import NodeCluster
from tests.support.seeds import soak
from tests.support.wait import wait_until

WRITERS = 8
ROUNDS = soak(3)   # pauses of the kv leader (5 before the suite's time bound; EPOCHLOG_SOAK=<k>: k times as many)
CONVERGE_S = 20.0


class Writers:
    """`n` threads putting to their own keys through the SDK until stopped; counts acknowledgements."""

    def __init__(self, cluster: NodeCluster, n: int) -> None:
        self.stop = threading.Event()
        self.acks = [0] * n
        self.errors = [0] * n
        self.last_offset = -1
        self.threads = [threading.Thread(target=self._run, args=(cluster.endpoints, w), daemon=True)
                        for w in range(n)]

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def _run(self, endpoints: list[str], w: int) -> None:
        with Client(endpoints, timeout=5.0) as client:
            i = 0
            while not self.stop.is_set():
                try:
                    result = client.put(f"pause/{w}/{i % 20}", b"v%d" % i)
                    self.acks[w] += 1
                    self.last_offset = max(self.last_offset, result.offset)
                except (ClientError, EpochlogError, TimeoutError, OSError):
                    self.errors[w] += 1
                i += 1

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)
        assert not any(t.is_alive() for t in self.threads), "a writer thread did not stop"


def _converged(cluster: NodeCluster, group: str) -> str | None:
    """None once every member applied the leader's commit offset and the leader's match for each
    member reached it; else what is still behind."""
    infos = {i: cluster.group_status(i, group) for i in cluster.nodes}
    leaders = [g for g in infos.values() if g is not None and g.role == "leader"]
    if not leaders:
        return "no leader"
    leader = max(leaders, key=lambda g: g.term)
    behind = [f"node {i}: {'unreachable' if g is None else f'{g.role} applied {g.applied_offset}'}"
              for i, g in infos.items() if g is None or g.applied_offset < leader.commit_offset]
    behind += [f"leader {leader.node}'s match for {p.id} is {p.match_offset}" for p in leader.peers
               if p.match_offset < leader.commit_offset]
    if not behind:
        return None
    return f"commit {leader.commit_offset} (leader {leader.node}, term {leader.term}): " + "; ".join(behind)


def test_sigstop_of_the_kv_leader_under_writes_every_member_converges(
        node_cluster_factory: Callable[..., NodeCluster], seed: int) -> None:
    cluster: NodeCluster = node_cluster_factory()
    cluster.start()
    rng = random.Random(seed)
    writers = Writers(cluster, WRITERS).start()
    paused: list[tuple[int, float]] = []
    try:
        wait_until(lambda: sum(writers.acks) >= 200, 30, "200 acknowledged writes")
        for _ in range(ROUNDS):
            victim = cluster.leader("kv", timeout=20)
            pause = rng.uniform(1.0, 3.0)
            cluster.pause(victim)
            paused.append((victim, round(pause, 2)))
            try:
                time.sleep(pause)
            finally:
                cluster.resume(victim)
            def resumed(target: int = sum(writers.acks) + 50) -> bool:
                return sum(writers.acks) >= target
            wait_until(resumed, 30, "writes going on after SIGCONT")
    finally:
        writers.finish()
    print(f"paused (node, seconds): {paused}; {sum(writers.acks)} acks, {sum(writers.errors)} errors, "
          f"last acked offset {writers.last_offset}")
    started = time.monotonic()
    state: list[str | None] = []

    def converged() -> bool:
        state[:] = [_converged(cluster, "kv")]
        return state[0] is None
    try:
        wait_until(converged, CONVERGE_S, "every kv member to converge on the leader's commit offset")
    except AssertionError:
        raise AssertionError(f"not converged after {CONVERGE_S}s: {state[0]}\n{cluster.describe()}") from None
    print(f"converged {time.monotonic() - started:.2f}s after the writers stopped")
    leader = cluster.leader("kv")
    info = cluster.wait_group_status(leader, "kv")
    assert info.commit_offset >= writers.last_offset
    for victim in {v for v, _ in paused}:   # each saw its clock stall, and voided any lease it held
        stalls = cluster.wait_metrics(victim).get(("epochlog_clock_stalls_total", (("group", "kv"),)), 0)
        assert stalls >= 1, f"node {victim} was stopped for seconds and did not notice its clock stalled"
    for i in cluster.nodes:   # nobody was stuck long enough to be warned about, or it recovered
        err = cluster.nodes[i].stderr()
        for m in re.finditer(r"group kv: member (\d+) is \d+ offsets behind", err):
            assert re.search(rf"group kv: member {m.group(1)} caught up", err[m.end():]), (
                f"node {i} warned that member {m.group(1)} lagged and never saw it catch up")


def test_a_paused_follower_is_reported_lagging_then_caught_up(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster: NodeCluster = node_cluster_factory(cluster={"lag_warning_ms": 1000, "lag_warning_repeat_ms": 1000})
    cluster.start()
    leader = cluster.leader("kv")
    follower = next(i for i in cluster.nodes if i != leader)
    writers = Writers(cluster, 2).start()
    labels = (("group", "kv"), ("member", str(follower)))
    try:
        wait_until(lambda: sum(writers.acks) >= 50, 30, "50 acknowledged writes")
        assert cluster.leader("kv") == leader, "the kv leader changed under a quiet load"
        stopped = cluster.pause(follower)
        try:
            warned = re.compile(rf"WARNING .*group kv: member {follower} is (\d+) offsets behind the commit offset "
                                rf"(\d+) \(its match (-?\d+)\) and has lacked committed offsets for ([\d.]+) s")
            found = wait_until(lambda: warned.findall(cluster.nodes[leader].stderr()) or None, 15,
                               "the leader's lag warning about the paused follower")
            seen_after = time.monotonic() - stopped
            lag, commit, match, seconds = (int(found[0][0]), int(found[0][1]), int(found[0][2]), float(found[0][3]))
            assert lag == commit - match > 0 and seconds >= 1.0, found[0]
            metrics = wait_until(lambda: (m := cluster.metrics(leader)).get(("epochlog_member_lag_seconds", labels), 0)
                                 >= 2.0 and m or None, 10, "the lag metric to pass 2 s")
            assert metrics[("epochlog_member_lag_offsets", labels)] > 0
            repeats = wait_until(lambda: len(n := warned.findall(cluster.nodes[leader].stderr())) >= 3 and n or None,
                                 10, "the warning to repeat")
            assert len(repeats) <= 2 + (time.monotonic() - stopped), "repeated faster than once a second"
        finally:
            resumed = cluster.resume(follower)
        caught = wait_until(lambda: re.search(rf"INFO .*group kv: member {follower} caught up \((\d+) offsets behind\) "
                                              rf"after ([\d.]+) s behind", cluster.nodes[leader].stderr()), 20,
                            "the leader's caught-up line")
        assert float(caught.group(2)) >= 1.0
        print(f"warned {seen_after:.1f}s after SIGSTOP ({found[0]}), caught up {time.monotonic() - resumed:.1f}s "
              f"after SIGCONT: {caught.group(0)}")
        wait_until(lambda: cluster.metrics(leader).get(("epochlog_member_lag_seconds", labels), 99) < 1.0 or None,
                   10, "the lag metric back under a second (writes still going on)")
    finally:
        writers.finish()
    wait_until(lambda: _converged(cluster, "kv") is None, CONVERGE_S, "every kv member to converge")
