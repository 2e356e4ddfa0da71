"""The controller's commands of the `epochlog` command line.

    epochlog brokers [--cluster C] [--group G] [--json]       every broker, its role and epochs
    epochlog routes TOPIC [--cluster C] [--watch] [--json]    the live master and replicas per group
    epochlog topic create NAME [--groups a,b] [--read-queues N] [--write-queues N] [--perm rw]
    epochlog broker run --group G --name NAME --address HOST:PORT [--offset-rate N]
    epochlog sim brokers --groups 3 --replicas 3 --topics 100 [--offset-rate N] [--kill-master-after S]

The cluster is named as for every client command (--endpoints, --config or EPOCHLOG_ENDPOINTS).
`broker run` is one simulated broker in the foreground (epochlog/broker_sim.py): it registers,
heartbeats, reports a growing offset and, as master, its SyncStateSet; it prints each role change.
Ctrl-C or SIGTERM is a controlled shutdown (a master hands over first); SIGKILL is a broker dying.
`sim brokers` runs a whole fleet of them in one process, with one heartbeat call per interval for
all of them; SIGUSR1 (or --kill-master-after) kills one master silently, to watch an election.

JSON field names are stable: `brokers --json` prints {"brokers": [{cluster, group, name, id, address,
role, broker_epoch, master_epoch, fenced, incarnation, offset, heartbeat_age_ms}], "groups": [...],
"applied"}; `routes --json` prints {topic, read_queues, write_queues, perm, version, applied,
"groups": [{cluster, group, master: {id, name, address} | null, master_epoch, replicas, status}]}.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Callable
from typing import Any

import click

from epochlog.api import messages as p
from epochlog.cli_client import Target, _cluster_command, _table
from epochlog.client import AsyncClient, ClientError, RejectedError
from epochlog.client.broker import DEFAULT_CLUSTER, ControllerClient, HeartbeatSender
from eventlog.errors import ALREADY_EXISTS
from statemachines import events as ev

_COMMANDS = click.Group("broker-commands")


def register(cli: click.Group) -> None:
    """Add the controller's commands to the `epochlog` group (cli.py calls this once)."""
    for command in _COMMANDS.commands.values():
        cli.add_command(command)


def _group_document(g: p.BrokerGroupInfo) -> dict[str, Any]:
    return {"cluster": g.cluster, "group": g.group, "master": g.master, "master_epoch": g.master_epoch,
            "sync_state_set": g.sync_state_set, "sync_state_set_epoch": g.sync_state_set_epoch, "status": g.status}


def _broker_document(b: p.BrokerInfo) -> dict[str, Any]:
    return {"cluster": b.cluster, "group": b.group, "name": b.name, "id": b.id, "address": b.address,
            "role": b.role, "broker_epoch": b.broker_epoch, "master_epoch": b.master_epoch, "fenced": b.fenced,
            "incarnation": b.incarnation, "offset": b.offset, "heartbeat_age_ms": b.heartbeat_age_ms}


def _route_broker(b: p.RouteBroker | None) -> dict[str, Any] | None:
    return None if b is None else {"id": b.id, "name": b.name, "address": b.address}


# --- reads ------------------------------------------------------------------------------------------

@_cluster_command(_COMMANDS, "brokers")
@click.option("--cluster", default="", help="Only this broker cluster.")
@click.option("--group", default="", help="Only this broker group (with --cluster).")
def brokers_command(target: Target, cluster: str, group: str) -> None:
    """Every registered broker: group, id, address, role, epochs, fenced; and each group's state."""
    if group and not cluster:
        raise click.UsageError("--group needs --cluster")
    listing = target.run(lambda c: ControllerClient(c).brokers(cluster=cluster, group=group))
    document = {"brokers": [_broker_document(b) for b in listing.brokers],
                "groups": [_group_document(g) for g in listing.groups], "applied": listing.applied}

    def human() -> None:
        _table(("CLUSTER", "GROUP", "NAME", "ID", "ADDRESS", "ROLE", "BROKER_EPOCH", "MASTER_EPOCH", "FENCED",
                "OFFSET", "HEARD_MS_AGO"),
               [(b.cluster, b.group, b.name, b.id, b.address, b.role, b.broker_epoch, b.master_epoch,
                 "yes" if b.fenced else "no", b.offset if b.offset >= 0 else None,
                 b.heartbeat_age_ms if b.heartbeat_age_ms >= 0 else None) for b in listing.brokers])
        click.echo("")
        _table(("CLUSTER", "GROUP", "MASTER", "MASTER_EPOCH", "SYNC_STATE_SET", "SSE_EPOCH", "STATUS"),
               [(g.cluster, g.group, g.master if g.master >= 0 else None, g.master_epoch,
                 ",".join(map(str, g.sync_state_set)) or None, g.sync_state_set_epoch, g.status)
                for g in listing.groups])
    target.emit(document, human)


@_cluster_command(_COMMANDS, "routes")
@click.argument("topic")
@click.option("--cluster", default="", help="Only the broker groups of this cluster.")
@click.option("--watch", "follow", is_flag=True,
              help="Print the route again at every change (pushed by watches of topic/, group/ and broker/) "
                   "until Ctrl-C.")
def routes_command(target: Target, topic: str, cluster: str, follow: bool) -> None:
    """Where TOPIC lives: each broker group's live master and replicas (fenced brokers are left out)."""
    if not follow:
        target.emit(*_route_output(target.run(lambda c: ControllerClient(c).route(topic, cluster=cluster))))
        return

    async def body(client: AsyncClient, stop: asyncio.Event) -> None:
        ctl = ControllerClient(client)
        route = await ctl.route(topic, cluster=cluster)
        document, human = _route_output(route)
        target.emit(document, human)
        shown = {k: v for k, v in document.items() if k != "applied"}
        changed = asyncio.Event()

        async def follow_prefix(prefix: str) -> None:
            async for _ in client.watch(prefix, from_offset=route.applied + 1):
                changed.set()

        watches = [asyncio.ensure_future(follow_prefix(x)) for x in (f"topic/{topic}", "group/", "broker/")]
        try:
            while not stop.is_set():
                await changed.wait()
                changed.clear()
                await asyncio.sleep(0.05)   # let a burst of events (a fence and its election) settle
                changed.clear()
                document, human = _route_output(await ctl.route(topic, cluster=cluster))
                now = {k: v for k, v in document.items() if k != "applied"}
                if now != shown:   # a SyncStateSet change, say, moves no route
                    shown = now
                    target.emit(document, human)
        finally:
            for w in watches:
                w.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
    target.stream(body)


def _route_output(route: p.TopicRoute) -> tuple[dict[str, Any], Callable[[], None]]:
    document = {"topic": route.topic, "read_queues": route.read_queues, "write_queues": route.write_queues,
                "perm": route.perm, "version": route.version, "applied": route.applied,
                "groups": [{"cluster": g.cluster, "group": g.group, "master": _route_broker(g.master),
                            "master_epoch": g.master_epoch,
                            "replicas": [_route_broker(r) for r in g.replicas], "status": g.status}
                           for g in route.groups]}

    def human() -> None:
        click.echo(f"topic {route.topic} at offset {route.applied}: {route.read_queues} read / "
                   f"{route.write_queues} write queues, perm {route.perm}")
        _table(("CLUSTER", "GROUP", "MASTER", "ADDRESS", "MASTER_EPOCH", "REPLICAS", "STATUS"),
               [(g.cluster, g.group, None if g.master is None else f"{g.master.id} ({g.master.name})",
                 None if g.master is None else g.master.address, g.master_epoch,
                 ", ".join(f"{r.id}@{r.address}" for r in g.replicas) or None, g.status) for g in route.groups])
    return document, human


@click.group("topic")
def topic_group() -> None:
    """Topics (NameServer routes): create one on broker groups."""


_COMMANDS.add_command(topic_group)


@_cluster_command(topic_group, "create")
@click.argument("name")
@click.option("--groups", default="", help="Broker groups, comma separated [default: every group].")
@click.option("--read-queues", type=click.IntRange(0, 1024), default=8, show_default=True)
@click.option("--write-queues", type=click.IntRange(0, 1024), default=8, show_default=True)
@click.option("--perm", type=click.Choice(["rw", "r", "w", "-"]), default="rw", show_default=True)
def topic_create(target: Target, name: str, groups: str, read_queues: int, write_queues: int, perm: str) -> None:
    """Create topic NAME; prints the offset it committed at."""
    mode = (ev.PERM_READ if "r" in perm else 0) | (ev.PERM_WRITE if "w" in perm else 0)
    event = ev.TopicCreated(name=name, read_queues=read_queues, write_queues=write_queues, perm=mode,
                            broker_groups=tuple(g.strip() for g in groups.split(",") if g.strip()))
    result = target.run(lambda c: c.command(event))
    target.emit({"offset": result.offset, "group": result.group},
                lambda: click.echo(f"offset {result.offset} (group {result.group})"))


# --- simulated brokers ------------------------------------------------------------------------------

@click.group("broker")
def broker_group() -> None:
    """Run a (simulated) broker against the cluster's controller."""


_COMMANDS.add_command(broker_group)


def _stoppable(stop: asyncio.Event) -> None:
    """SIGTERM stops like Ctrl-C (a controlled shutdown), so `kill PID` is a clean exit and only
    SIGKILL is a broker dying."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)


@_cluster_command(broker_group, "run")
@click.option("--group", required=True, help="Broker group (RocketMQ broker name).")
@click.option("--name", required=True, help="This broker's name within its group.")
@click.option("--address", required=True, metavar="HOST:PORT", help="Where the broker would serve.")
@click.option("--cluster", default=DEFAULT_CLUSTER, show_default=True, help="Broker cluster name.")
@click.option("--offset-rate", type=click.FloatRange(min=0), default=100.0, show_default=True,
              help="Offsets per second the master's log grows by (slaves replicate it).")
def broker_run(target: Target, group: str, name: str, address: str, cluster: str, offset_rate: float) -> None:
    """One broker in the foreground: registers, heartbeats, prints its role changes until Ctrl-C
    (a controlled shutdown); SIGKILL is the broker dying."""
    from epochlog.broker_sim import SimulatedBroker

    async def body(client: AsyncClient, stop: asyncio.Event) -> None:
        _stoppable(stop)
        broker = SimulatedBroker(client, cluster=cluster, group=group, name=name, address=address,
                                 offset_rate=offset_rate, say=lambda line: click.echo(line))
        change = await broker.start()
        click.echo(f"REGISTERED {group}/{name} id {change.broker_id} broker epoch {change.broker_epoch} "
                   f"pid {os.getpid()}")
        try:
            done = asyncio.ensure_future(broker.agent.stopped.wait())
            await asyncio.wait({done, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await broker.stop(shutdown=not broker.agent.stopped.is_set())
            click.echo(f"{group}/{name}: stopped")
    target.stream(body)


@click.group("sim")
def sim_group() -> None:
    """Simulations against a running cluster."""


_COMMANDS.add_command(sim_group)


@_cluster_command(sim_group, "brokers")
@click.option("--groups", type=click.IntRange(1, 10_000), default=3, show_default=True)
@click.option("--replicas", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--topics", type=click.IntRange(0, 100_000), default=100, show_default=True,
              help="Topics created on the simulated groups (existing ones are kept).")
@click.option("--cluster", default=DEFAULT_CLUSTER, show_default=True)
@click.option("--offset-rate", type=click.FloatRange(min=0), default=100.0, show_default=True)
@click.option("--seconds", type=click.FloatRange(min=0), default=None, help="Stop after S seconds.")
@click.option("--kill-master-after", type=click.FloatRange(min=0), default=None,
              help="Kill one master silently (no shutdown) after S seconds.")
@click.option("--seed", type=int, default=None, help="Which master gets killed.")
def sim_brokers(target: Target, groups: int, replicas: int, topics: int, cluster: str, offset_rate: float,
                seconds: float | None, kill_master_after: float | None, seed: int | None) -> None:
    """GROUPS x REPLICAS simulated brokers (groups broker-a, broker-b, ...) in one process, and TOPICS
    topics on them; prints role changes. SIGUSR1 kills a master; Ctrl-C stops (controlled shutdowns)."""
    from epochlog.broker_sim import SimulatedBroker

    rng = random.Random(seed)
    names = [_group_name(i) for i in range(groups)]

    async def body(client: AsyncClient, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        _stoppable(stop)
        kill_now = asyncio.Event()
        loop.add_signal_handler(signal.SIGUSR1, kill_now.set)
        await _create_topics(client, topics, names)
        sender = HeartbeatSender(ControllerClient(client))
        fleet = [SimulatedBroker(client, cluster=cluster, group=g, name=f"{g}-{r}",
                                 address=f"127.0.0.1:{10911 + 10 * (i * replicas + r)}", offset_rate=offset_rate,
                                 sender=sender, say=lambda line: click.echo(line))
                 for i, g in enumerate(names) for r in range(replicas)]
        for broker in fleet:   # one by one: the first of each group becomes its master
            await broker.start()
        click.echo(f"SIM {len(fleet)} brokers in {groups} groups, {topics} topics, pid {os.getpid()} "
                   f"(kill -USR1 {os.getpid()} kills a master)")
        if kill_master_after is not None:
            loop.call_later(kill_master_after, kill_now.set)
        if seconds is not None:
            loop.call_later(seconds, stop.set)
        killed: set[str] = set()
        try:
            while not stop.is_set():
                waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(kill_now.wait())}
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
                if kill_now.is_set() and not stop.is_set():
                    kill_now.clear()
                    masters = [b for b in fleet if b.agent.is_master and b.name not in killed]
                    if masters:
                        victim = rng.choice(masters)
                        killed.add(victim.name)
                        click.echo(f"KILL master {victim.group}/{victim.name} (id {victim.agent.broker_id}): its "
                                   f"heartbeats stop")
                        await victim.stop(shutdown=False)
        finally:
            await asyncio.gather(*(b.stop(shutdown=True) for b in fleet if b.name not in killed),
                                 return_exceptions=True)
            await sender.close()
            click.echo("SIM stopped")
    target.stream(body)


def _group_name(i: int) -> str:
    """broker-a .. broker-z, then broker-aa, broker-ab, ..."""
    letters = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        letters = chr(ord("a") + r) + letters
    return f"broker-{letters}"


async def _create_topics(client: AsyncClient, count: int, groups: list[str]) -> None:
    events = [ev.TopicCreated(name=f"topic-{i:03d}", broker_groups=tuple(groups)) for i in range(count)]
    for i in range(0, len(events), 500):
        for result in await client.commands(events[i:i + 500]):
            if not result.ok and result.code != ALREADY_EXISTS:
                raise RejectedError(result)


__all__ = ["register", "ClientError"]
