"""Configuration of a cluster of nodes hosting Raft groups (`[cluster]` in the node's TOML file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eventlog.config import LogConfig
from eventlog.configuration import doc, from_mapping, load_toml, parse_address
from eventlog.errors import ConfigError
from eventlog.raft.config import RaftConfig

MAX_CLUSTER_NAME_BYTES = 256   # the name goes in every peer hello (eventlog.raft.runtime.transport)


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
class PeerTlsConfig:
    """Mutual TLS between members (`[cluster.tls]`): eventlog.raft.runtime.tls, docs/security.md.

    Relative paths are relative to the node's data directory, so the layout `epochlog up` and
    `epochlog certs member` write (`<data dir>/tls/`) needs no configuration.
    """

    insecure: bool = field(default=False, metadata=doc(
        "Plaintext peer connections: no TLS, and a peer is whoever its hello claims to be (anyone who "
        "can reach a peer port can act as a member). For development only; logged as a WARNING at start."))
    ca_file: str = field(default="tls/ca.crt", metadata=doc(
        "PEM certificate of the cluster CA: a peer must present a certificate it issued."))
    cert_file: str = field(default="tls/node.crt", metadata=doc(
        "PEM certificate of this node, issued by the CA, naming this cluster and node id (epochlog certs member)."))
    key_file: str = field(default="tls/node.key", metadata=doc(
        "PEM private key of cert_file (keep it 0600)."))

    def path(self, name: str, data_dir: str | Path) -> Path:
        """The file `name` (ca_file, cert_file or key_file) resolved against the node's data directory."""
        value = Path(getattr(self, name))
        return value if value.is_absolute() else Path(data_dir) / value


@dataclass(frozen=True, slots=True)
class PeerLimitsConfig:
    """What one peer connection may hold and for how long (`[cluster.peer_limits]`); each limit closes
    the offending connection, counts it and logs it (at a bounded rate): eventlog.raft.runtime.transport."""

    hello_timeout_ms: int = field(default=10_000, metadata=doc(
        "A connection must complete its TLS handshake and its hello within this many ms of being "
        "accepted (or dialed).", min=100, max=600_000))
    frame_timeout_ms: int = field(default=30_000, metadata=doc(
        "A frame must arrive in full within this many ms of its first byte.", min=100, max=3_600_000))
    partial_frames_bytes: int = field(default=64 << 20, metadata=doc(
        "Memory for frames being received, summed over every peer connection: a connection whose partly "
        "received frame would take the sum past it is closed. At least the largest frame a member sends "
        "(checked at start from [raft] and [log]).", min=1 << 20))
    unauthenticated_connections: int = field(default=64, metadata=doc(
        "Accepted connections whose TLS handshake or hello is not done yet: one more is closed at once.",
        min=1, max=100_000))


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
    leader_balance: bool = field(default=True, metadata=doc(
        "Spread the groups' leaders over the members: once a group is settled, its leader hands leadership "
        "(a Raft leadership transfer) to the group's first choice when that voter is caught up and answering "
        "(eventlog/raft/runtime/leader_balance.py). Group number i of `groups` prefers the voters sorted by "
        "id and rotated by i, so after a start, and again after a member returns, each member leads its "
        "share. false: leaders stay where elections put them."))
    leader_balance_settle_ms: int = field(default=2000, metadata=doc(
        "Balancing waits until the leader has led the group this long and the target voter has held the "
        "whole commit offset this long; repeated moves of one group wait twice as long each time (up to "
        "5 minutes).", min=100, max=3_600_000))
    preferred_leaders: tuple[int, ...] = field(default=(), metadata=doc(
        "The node id each group prefers as its leader, in the order of `groups` (0 or left out: by the "
        "rotation above); a preferred node that is not a voter of the group is ignored."))
    tls: PeerTlsConfig = field(default_factory=PeerTlsConfig, metadata=doc(
        "Mutual TLS between members ([cluster.tls]): on unless insecure = true."))
    peer_limits: PeerLimitsConfig = field(default_factory=PeerLimitsConfig, metadata=doc(
        "Limits of the peer port ([cluster.peer_limits])."))

    def validate(self, section: str = "cluster") -> None:
        if not self.name or len(self.name.encode()) > MAX_CLUSTER_NAME_BYTES:
            raise ConfigError(f"{section}.name", self.name, f"must be 1 to {MAX_CLUSTER_NAME_BYTES} bytes")
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
        if len(self.preferred_leaders) > len(self.groups) or any(i < 0 for i in self.preferred_leaders):
            raise ConfigError(f"{section}.preferred_leaders", list(self.preferred_leaders),
                              f"must be at most one node id (or 0) per group of `groups` ({len(self.groups)})")

    def preferred_leader(self, group: str) -> int:
        """The node `group` prefers as its leader by `preferred_leaders` (0: by rotation)."""
        i = self.groups.index(group)
        return self.preferred_leaders[i] if i < len(self.preferred_leaders) else 0

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
