"""Run one node of a cluster until SIGTERM/SIGINT: `epochlog serve --config FILE --node-id N`.

Starts the node's groups, its client service, its gRPC and Kafka services and its admin endpoint (addresses
from the member's entry in the config), prints `READY <node id> <client address>` on stdout once it
serves, and on a signal stops in order: clients first, then the groups (which flush their logs). A
failed group (for example a failed fsync) stops the node with exit code 2; a configuration error
exits with 3, and so does a node that cannot start where it was told to (`StartError`, one line: its
data directory cannot be made, or one of its addresses is taken; checked before anything opens).

Everything a node starts runs with `epochlog.logs.NODE` set to its id, so its log records name it
(several nodes may share one process in tests).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eventlog.configuration import from_mapping
from eventlog import kafka_codes as kc
from eventlog.errors import EpochlogError
from eventlog.raft.runtime.config import MemberConfig, NodeConfigs, parse_address
from epochlog.admin import AdminServer
from epochlog.face_tls import server_context
from epochlog.kafka.config import KafkaServiceConfig
from epochlog.logs import NODE
from epochlog.loop_monitor import LoopMonitor
from epochlog.metrics import Metrics
from epochlog.ports import taken_addresses
from epochlog.node import Node
from epochlog.server import ClientService, ClientServiceConfig
from epochlog import startup_gc
from epochlog.stop_watch import StopWatch

if TYPE_CHECKING:
    from epochlog.grpc_server import GrpcService
    from epochlog.kafka.server import KafkaService

logger = logging.getLogger(__name__)


class StartError(EpochlogError):
    """A node cannot start where it was told to: an address is taken, the data directory cannot be made."""

    code = "start"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


def check_can_start(member: MemberConfig, data_dir: str | Path) -> None:
    """StartError (one line) unless the data directory exists or can be made and every address is free."""
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        if not os.access(data_dir, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise StartError(f"node {member.id} cannot use its data directory {data_dir}: "
                         f"{exc.strerror or exc}") from None
    taken = taken_addresses(member)
    if taken:
        kind, address, why = taken[0]
        raise StartError(f"node {member.id} cannot listen on {address} ({kind}): {why}")


@dataclass
class RunningNode:
    """A node with its client service and admin endpoint, started and stopped together."""

    node: Node
    metrics: Metrics
    clients: ClientService
    loop: LoopMonitor
    admin: AdminServer | None = None
    grpc: GrpcService | None = None
    kafka: KafkaService | None = None
    addresses: dict[str, str] = field(default_factory=dict)

    @classmethod
    async def start(cls, configs: NodeConfigs, node_id: int, data_dir: str | Path, *,
                    seed: int | None = None, member: MemberConfig | None = None) -> RunningNode:
        """`member`: this node's entry when it is not a configured member (epochlog.identity)."""
        token = NODE.set(node_id)   # inherited by every task and server started below
        try:
            return await cls._start(configs, node_id, data_dir, seed, member)
        finally:
            NODE.reset(token)

    @classmethod
    async def _start(cls, configs: NodeConfigs, node_id: int, data_dir: str | Path,
                     seed: int | None, member: MemberConfig | None = None) -> RunningNode:
        client_config = from_mapping(ClientServiceConfig, configs.clients, "clients")
        kafka_config = from_mapping(KafkaServiceConfig, configs.kafka, "kafka")
        node = Node(configs, node_id, data_dir, seed=seed, member=member)   # checks every section and peer TLS
        # The faces' certificate before anything opens: a node whose config says nothing serves TLS, and
        # without certificates it refuses in one line naming both ways out (epochlog/face_tls.py).
        server_context(client_config.tls, node.data_dir)
        member = node.member
        await node.start()
        metrics = Metrics(node)
        cluster = configs.cluster
        loop = LoopMonitor(cluster.tick_interval_ms / 1000, cluster.loop_stall_warning_ms / 1000,
                           metrics.loop_stall_seconds.observe, metrics.loop_stall_own_seconds.observe)
        metrics.track_loop(loop)
        loop.start()
        clients = ClientService(node, metrics, client_config)
        running = cls(node, metrics, clients, loop)
        try:
            if member.client_address:
                host, port = parse_address(member.client_address, f"cluster.members[{node_id}].client_address")
                await clients.start(host, port)
                running.addresses["client"] = f"{host}:{clients.port}"
            if member.admin_address:
                host, port = parse_address(member.admin_address, f"cluster.members[{node_id}].admin_address")
                running.admin = AdminServer(node, metrics, tls=server_context(client_config.tls, node.data_dir),
                                            access=clients.access)
                await running.admin.start(host, port)
                running.addresses["admin"] = f"{host}:{running.admin.port}"
            if member.grpc_address:
                from epochlog.grpc_server import GrpcService   # grpc is imported only where it is served

                host, port = parse_address(member.grpc_address, f"cluster.members[{node_id}].grpc_address")
                running.grpc = GrpcService(node, metrics, clients.access, client_config.tls)
                await running.grpc.start(host, port)
                running.addresses["grpc"] = f"{host}:{running.grpc.port}"
            if member.kafka_address:
                from epochlog.kafka.server import KafkaService, brokers_of   # kafka-python: only where served

                host, port = parse_address(member.kafka_address, f"cluster.members[{node_id}].kafka_address")
                running.kafka = KafkaService(node, brokers_of(configs, member), kafka_config, clients.access,
                                             client_config.tls if client_config.tls.enabled else None)
                metrics.track_kafka(running.kafka.handler.counters)
                await running.kafka.start(host, port)
                running.addresses["kafka"] = f"{host}:{running.kafka.port}"
        except BaseException:
            await running.stop()
            raise
        return running

    async def stop(self, watch: StopWatch | None = None) -> None:
        """Clients first, then the groups; `watch` times each step (epochlog/stop_watch.py)."""
        watch = watch or StopWatch(f"node {self.node.node_id}")
        with watch.step("the loop monitor"):
            await self.loop.close()
        with watch.step("the client service"):
            await self.clients.close()
        if self.kafka is not None:
            with watch.step("the Kafka face"):
                await self.kafka.close()
        if self.grpc is not None:
            with watch.step("the gRPC face"):
                await self.grpc.close()
        if self.admin is not None:
            with watch.step("the admin endpoint"):
                await self.admin.close()
        await self.node.stop(watch)


async def serve(configs: NodeConfigs, node_id: int, data_dir: str | Path, *, seed: int | None = None,
                member: MemberConfig | None = None) -> int:
    NODE.set(node_id)
    check_can_start(member or configs.cluster.member(node_id), data_dir)
    try:
        running = await RunningNode.start(configs, node_id, data_dir, seed=seed, member=member)
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        # Taken between the check and the bind: still one line, naming what could not be bound.
        raise StartError(f"node {node_id} cannot listen: {exc.strerror or exc}") from None
    # What start made (modules, configs, the groups' structures) lives as long as the process: keep it
    # out of the collector's full passes, which then scan only what came after. A pass holds the loop:
    # under the pipelined-gets attack of tests/epochlog/node/test_loop_bounds.py on a loaded machine, the
    # longest went from 100 to 63 ms with this (64 passes over 20 ms in 20 s, then 27).
    gc.freeze()
    startup_gc.resume()   # paused by `python -m epochlog` while it started (epochlog/startup_gc.py)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {node_id} {running.addresses.get('client', '-')}", flush=True)
    logger.info("node %s serving: %s", node_id, running.addresses)
    code = 0
    while not stop.is_set():
        failure = running.node.failure()
        if failure is not None:
            logger.critical("node %s stops: %s", node_id, failure)
            code = 2
            break
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except TimeoutError:
            pass
    if code == 0:
        logger.info("node %s stopping (asked to)", node_id)
    watch = StopWatch(f"node {node_id}")
    watch.start()
    try:
        await running.stop(watch)
    finally:
        watch.close()
    logger.info("node %s stopped in %.2f s", node_id, watch.elapsed_s)
    return code
