"""The controller end to end: real `epochlog serve` nodes and real `epochlog broker run` processes.

- A master broker's process is killed (SIGKILL): an in-sync replica is elected within the
  heartbeat timeout plus a margin, routes show it at once, the new master's process hears of it by
  its watch (push), and a report from the deposed master is refused as stale.
- The controller (the metadata group's leader) is killed in the middle of an election: the new
  controller finishes it, and fences nobody else (every clock restarts in full).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest

from epochlog.api import messages as p
from epochlog.client import Client, ClientError
from epochlog.client.broker import ControllerClient
from statemachines import events as ev
from tests.controller.conftest import CLUSTER, HEARTBEAT_TIMEOUT_MS, Brokers
from tests.support.nodes import NodeCluster, ROOT
from tests.support.wait import wait_until

TIMEOUT_S = HEARTBEAT_TIMEOUT_MS / 1000
MARGIN_S = 1.0     # detection (25 ms scan) + commit + this test's 50 ms polling, on 2 shared cores


class Ctl:
    """A blocking face of ControllerClient for the test's own checks."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.client = Client(list(endpoints), timeout=15.0)
        self.ctl = ControllerClient(self.client.aio)

    def __enter__(self) -> Ctl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def brokers(self) -> p.Brokers:
        return self.client._run(self.ctl.brokers(cluster=CLUSTER))

    def group(self, name: str) -> p.BrokerGroupInfo | None:
        return next((g for g in self.brokers().groups if g.group == name), None)

    def broker(self, group: str, name: str) -> p.BrokerInfo:
        return next(b for b in self.brokers().brokers if (b.group, b.name) == (group, name))

    def route(self, topic: str) -> p.TopicRoute:
        return self.client._run(self.ctl.route(topic, cluster=CLUSTER))

    def report(self, group: str, name: str, broker_epoch: int, master_epoch: int, sse_epoch: int,
               members: list[int]) -> p.BrokerGroupInfo:
        return self.client._run(self.ctl.report_sync_state_set(CLUSTER, group, name, broker_epoch, master_epoch,
                                                               sse_epoch, members))

    def events_since(self, offset: int) -> list[tuple[int, ev.Event]]:
        out = []
        while True:
            batch = self.client._run(self.client.aio.read_events("metadata", offset, max_events=1000))
            out += [(r.offset, ev.decode_event(r.value)) for r in batch.events if r.value is not None]
            if batch.next_offset >= batch.commit_offset + 1 or not batch.events:
                return out
            offset = batch.next_offset


def in_sync(ctl: Ctl, group: str, members: list[int]) -> p.BrokerGroupInfo | None:
    g = ctl.group(group)
    return g if g is not None and sorted(g.sync_state_set) == members else None


def cli(cluster: NodeCluster, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "epochlog", *args, "--endpoints", ",".join(cluster.endpoints)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_killed_master_is_replaced_by_an_in_sync_replica(controller_cluster: NodeCluster,
                                                           brokers: Brokers) -> None:
    c = controller_cluster
    with Ctl(c.endpoints) as ctl:
        cli(c, "topic", "create", "orders", "--groups", "g1")
        procs = [brokers.start("g1", f"b{i}", 31000 + i) for i in range(3)]   # b0 first: the master
        before = wait_until(lambda: in_sync(ctl, "g1", [0, 1, 2]), 20, "the master to take both replicas in sync")
        assert before.master == 0 and before.status == "ok"
        deposed = ctl.broker("g1", "b0")

        killed_at = procs[0].kill9()
        after = wait_until(lambda: g if (g := ctl.group("g1")) is not None and g.master != 0 else None,
                           TIMEOUT_S + 10, "a new master of g1", interval=0.05)
        elapsed = time.monotonic() - killed_at
        print(f"master killed -> new master visible: {elapsed * 1000:.0f} ms (timeout {HEARTBEAT_TIMEOUT_MS} ms)")
        assert after.master in (1, 2), after
        # a new set of the new master alone (which may have taken the other replica back in already)
        assert after.master_epoch == before.master_epoch + 1 and after.master in after.sync_state_set
        assert 0 not in after.sync_state_set
        assert elapsed <= TIMEOUT_S + MARGIN_S, f"election took {elapsed:.2f} s"

        # Routes show the new master at once and leave the fenced broker out.
        route = ctl.route("orders")
        (g1,) = route.groups
        assert g1.master is not None and g1.master.id == after.master and g1.status == "ok"
        assert [r.name for r in g1.replicas] == [f"b{3 - after.master}"]
        assert ctl.broker("g1", "b0").fenced

        # The new master's process learnt it by its watch (push), and says so.
        winner = procs[after.master]
        wait_until(lambda: f"id {after.master}: master (master {after.master}" in winner.stdout(), 5,
                   "the new master's process to print its new role")

        # The deposed master (were it still alive) can change nothing: its epochs are stale.
        with pytest.raises(ClientError) as refused:
            ctl.report("g1", "b0", deposed.broker_epoch, before.master_epoch, before.sync_state_set_epoch, [0, 1, 2])
        assert refused.value.code == "stale_epoch"
        assert ctl.group("g1").master == after.master

        # The CLI's JSON agrees.
        listing = json.loads(cli(c, "brokers", "--json", "--cluster", CLUSTER))
        rows = {b["name"]: b for b in listing["brokers"] if b["group"] == "g1"}
        for field in ("group", "name", "id", "address", "role", "broker_epoch", "master_epoch", "fenced"):
            assert field in rows["b0"], field
        assert rows["b0"]["fenced"] is True and rows["b0"]["role"] == "slave"
        assert rows[f"b{after.master}"]["role"] == "master"
        assert {r["master_epoch"] for r in rows.values()} == {after.master_epoch}
        routed = json.loads(cli(c, "routes", "orders", "--json"))
        assert routed["groups"][0]["master"]["id"] == after.master


def test_controller_failover_in_the_middle_of_an_election_fences_nobody_else(
        controller_cluster: NodeCluster, brokers: Brokers) -> None:
    c = controller_cluster
    with Ctl(c.endpoints) as ctl:
        procs = [brokers.start("g2", f"x{i}", 32000 + i) for i in range(3)]
        before = wait_until(lambda: in_sync(ctl, "g2", [0, 1, 2]), 20, "g2 fully in sync")
        start = ctl.brokers().applied + 1
        controller = c.leader("metadata")

        killed_at = procs[0].kill9()                  # the master dies...
        time.sleep(TIMEOUT_S / 2)
        c.kill9(controller)                           # ...and half way to its fence, so does the controller
        try:
            after = wait_until(lambda: g if (g := ctl.group("g2")) is not None and g.master > 0 else None,
                               TIMEOUT_S + 15, "the new controller to elect a master of g2", interval=0.05)
            print(f"master killed -> new master visible across a controller failover: "
                  f"{(time.monotonic() - killed_at) * 1000:.0f} ms")
            assert after.master_epoch == before.master_epoch + 1 and after.master in (1, 2)
            time.sleep(TIMEOUT_S)                     # long enough for a wrong fence to show
            fenced = [e for _, e in ctl.events_since(start) if isinstance(e, ev.BrokerFenced) and e.group == "g2"]
            assert [(e.name, e.reason) for e in fenced] == [("x0", "heartbeat timeout")], fenced
            survivors = [b for b in ctl.brokers().brokers if b.group == "g2" and b.name != "x0"]
            assert survivors and not any(b.fenced for b in survivors)
        finally:
            c.restart(controller)


def test_sim_brokers_and_a_route_watch_see_a_killed_master_replaced(controller_cluster: NodeCluster,
                                                                   tmp_path) -> None:
    """`epochlog sim brokers` kills one of its masters; `epochlog routes --watch --json` is pushed the
    new route (the killed broker gone, another master) without polling."""
    c = controller_cluster
    endpoints = ",".join(c.endpoints)
    base = [sys.executable, "-m", "epochlog"]
    sim_out, watch_out = tmp_path / "sim.out", tmp_path / "watch.out"
    with open(sim_out, "wb") as sink:
        sim = subprocess.Popen([*base, "sim", "brokers", "--endpoints", endpoints, "--cluster", "simc", "--groups", "2",
                                "--replicas", "2", "--topics", "3", "--kill-master-after", "3", "--seconds", "9",
                                "--seed", "7"], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    watch = None
    try:
        wait_until(lambda: "SIM 4 brokers" in sim_out.read_text(), 30, "the simulated brokers to start")
        with open(watch_out, "wb") as sink:
            watch = subprocess.Popen([*base, "routes", "topic-001", "--watch", "--json", "--cluster", "simc",
                                      "--endpoints", endpoints], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        killed = wait_until(lambda: next((line.split()[2] for line in sim_out.read_text().splitlines()
                                          if line.startswith("KILL master")), None), 15, "a master to be killed")
        group, name = killed.split("/")

        def replaced() -> dict | None:
            for line in watch_out.read_text().splitlines():
                doc = json.loads(line)
                g = next(x for x in doc["groups"] if x["group"] == group)
                names = {r["name"] for r in g["replicas"]} | ({g["master"]["name"]} if g["master"] else set())
                if g["master"] is not None and g["master"]["name"] != name and name not in names:
                    return doc
            return None
        wait_until(replaced, TIMEOUT_S + 10, "the route watch to show the new master")
        survivor = f"{group}-1" if name.endswith("-0") else f"{group}-0"
        wait_until(lambda: f"{group}/{survivor} id" in sim_out.read_text()
                   and ": master (master" in sim_out.read_text().split("KILL master", 1)[1], 5,
                   "the surviving broker to print its new role")
    finally:
        codes = {}
        for proc, signum, what in ((watch, signal.SIGINT, "watch"), (sim, None, "sim")):
            if proc is None:
                continue
            if signum is not None:
                proc.send_signal(signum)
            try:
                codes[what] = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[what] = proc.wait(10)
        print(sim_out.read_text()[-3000:])
    assert codes == {"watch": 0, "sim": 0}, (codes, watch_out.read_text()[-2000:])
