"""Configuration of a cluster of nodes hosting Raft groups (`[cluster]` in the node's TOML file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eventlog.config import LogConfig
from eventlog.configuration import doc, from_mapping, load_toml
from eventlog.errors import ConfigError
from eventlog.raft.config import RaftConfig


def parse_address(text: str, key: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, text, "must be host:port")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class MemberConfig:
    """One node of the cluster."""

    id: int = field(default=0, metadata=doc("Node id: a positive integer, unique in the cluster.", min=1))
    peer_address: str = field(default="", metadata=doc("host:port where the node listens for its peers."))
    client_address: str = field(default="", metadata=doc(
        "host:port where the node serves clients (native protocol); empty: no client service."))
    admin_address: str = field(default="", metadata=doc(
        "host:port of the admin HTTP endpoint (/metrics, /healthz, /readyz); empty: none."))
    grpc_address: str = field(default="", metadata=doc(
        "host:port where the node serves the gRPC API (proto/epochlog/v1/epochlog.proto, docs/grpc.md); "
        "empty: no gRPC service."))
    kafka_address: str = field(default="", metadata=doc(
        "host:port where the node serves the Kafka protocol (epochlog/kafka, docs/kafka.md); the address "
        "Kafka clients are given in Metadata; empty: no Kafka service."))

    def validate(self, section: str) -> None:
        if self.id <= 0:
            raise ConfigError(f"{section}.id", self.id, "is required (a positive integer)")
        parse_address(self.peer_address, f"{section}.peer_address")
        for name in ("client_address", "admin_address", "grpc_address", "kafka_address"):
            value = getattr(self, name)
            if value:
                parse_address(value, f"{section}.{name}")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The members, the Raft groups every node hosts, and timing."""

    name: str = field(default="epochlog", metadata=doc(
        "Cluster name; nodes refuse peers that give another one."))
    members: tuple[MemberConfig, ...] = field(default=(), metadata=doc(
        "The initial voters ([[cluster.members]] tables with id and peer_address)."))
    groups: tuple[str, ...] = field(default=("metadata", "offsets", "kv"), metadata=doc(
        "Raft groups hosted by every node, each with its own directory, leader and log."))
    tick_interval_ms: int = field(default=50, metadata=doc(
        "Duration of one Raft tick (election and heartbeat timeouts are counted in ticks).", min=1, max=60_000))
    snapshot_every_entries: int = field(default=100_000, metadata=doc(
        "Take a snapshot of a group (in the background) and drop its log below it every this many applied "
        "offsets (0: not by offsets).", min=0))
    snapshot_every_bytes: int = field(default=64 << 20, metadata=doc(
        "... or every this many bytes of applied entries, whichever comes first (0: not by bytes; both 0: "
        "never).", min=0))
    lag_warning_ms: int = field(default=10_000, metadata=doc(
        "A group's leader logs a warning when a member has not acknowledged an offset committed this "
        "long ago (stuck, cut off or catching up slowly); 0 = never.", min=0, max=86_400_000))
    lag_warning_offsets: int = field(default=1, metadata=doc(
        "... and is at least this many offsets behind the commit offset.", min=1))
    lag_warning_repeat_ms: int = field(default=30_000, metadata=doc(
        "How often the warning repeats while the member stays behind (an info line says when it caught "
        "up).", min=100, max=86_400_000))
    loop_stall_warning_ms: int = field(default=200, metadata=doc(
        "The node logs a warning (at most one line per 10 s) when its event loop, which every group's "
        "heartbeats leave from, ran a timer this much later than due (epochlog_loop_stall_seconds); keep it "
        "below half the election timeout.", min=1, max=3_600_000))

    def validate(self, section: str = "cluster") -> None:
        ids = [m.id for m in self.members]
        if not ids:
            raise ConfigError(f"{section}.members", [], "at least one member is required")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{section}.members", ids, "node ids must be unique")
        addresses = [a for m in self.members
                     for a in (m.peer_address, m.client_address, m.admin_address, m.grpc_address, m.kafka_address)
                     if a]
        if len(set(addresses)) != len(addresses):
            raise ConfigError(f"{section}.members", addresses,
                              "every address (peer, client, admin, grpc, kafka) must be unique")
        if not self.groups or len(set(self.groups)) != len(self.groups):
            raise ConfigError(f"{section}.groups", list(self.groups), "must be a non-empty list of unique names")
        for g in self.groups:
            if not g or "/" in g or g.startswith("."):
                raise ConfigError(f"{section}.groups", g, "group names are plain directory names")

    def member(self, node_id: int) -> MemberConfig:
        for m in self.members:
            if m.id == node_id:
                return m
        raise ConfigError("--node-id", node_id, f"is not a member (members: {[m.id for m in self.members]})")


@dataclass(frozen=True, slots=True)
class NodeConfigs:
    """Every component's configuration, as read from one TOML file.

    `views`, `controller`, `clients`, `kafka` and `compaction` stay plain tables here (their sections):
    the runtime does not depend on the layers above it; the node validates them with
    `statemachines.store.ViewsConfig`, `controller.config.controller_config`,
    `epochlog.server.ClientServiceConfig`, `epochlog.kafka.config.KafkaServiceConfig` and
    `compaction.config.CompactionConfig` (with its `[compaction.cleaner]` table,
    `compaction.config.CleanerConfig`).
    """

    cluster: ClusterConfig
    raft: RaftConfig
    log: LogConfig
    views: dict[str, object] | None = None
    controller: dict[str, object] | None = None
    clients: dict[str, object] | None = None
    compaction: dict[str, object] | None = None
    kafka: dict[str, object] | None = None


def load_node_configs(path: str | Path) -> NodeConfigs:
    data = load_toml(path)
    known = {"cluster", "raft", "log", "views", "controller", "clients", "compaction", "kafka"}
    for key in data:
        if key not in known:
            raise ConfigError(key, data[key], f"unknown section (known: {', '.join(sorted(known))})")
    return NodeConfigs(from_mapping(ClusterConfig, data.get("cluster"), "cluster"),
                       from_mapping(RaftConfig, data.get("raft"), "raft"),
                       from_mapping(LogConfig, data.get("log"), "log"),
                       data.get("views"), data.get("controller"), data.get("clients"),
                       data.get("compaction"), data.get("kafka"))
