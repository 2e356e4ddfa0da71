"""Limits of the Kafka face (`[kafka]` in the node's TOML file; docs/kafka.md, "Limits").

Apart from the rest of epochlog/kafka so that a config can be checked without kafka-python loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from eventlog.configuration import doc

MAX_REQUEST_BYTES: Final = 100 << 20   # Kafka's socket.request.max.bytes default: a larger frame closes


@dataclass(frozen=True, slots=True)
class KafkaServiceConfig:
    """Limits of the Kafka face: memory and time per connection, connections, consumer groups."""

    partial_frames_bytes: int = field(default=128 << 20, metadata=doc(
        "Memory for Kafka request frames being received, summed over every Kafka connection of the node: a "
        "connection whose partly received frame would take the sum past it is closed. At least one frame of "
        "the maximum size (100 MiB).", min=MAX_REQUEST_BYTES + 4))
    frame_timeout_ms: int = field(default=30_000, metadata=doc(
        "A request frame must be received in full within this many ms of its first byte; else the "
        "connection is closed.", min=100, max=3_600_000))
    max_connections: int = field(default=4096, metadata=doc(
        "Kafka connections the node keeps open at once; one more is closed as soon as it is accepted.",
        min=1))
    max_groups: int = field(default=10_000, metadata=doc(
        "Consumer groups the coordinator keeps in memory (groups with members or a rebalance under way; empty "
        "ones are dropped and read again when used): a JoinGroup for one more is answered "
        "GROUP_MAX_SIZE_REACHED.", min=1))
    max_group_members: int = field(default=1_000, metadata=doc(
        "Members of one consumer group (joined, or given a member id and not yet joined): a JoinGroup past "
        "it is answered GROUP_MAX_SIZE_REACHED (Kafka's group.max.size).", min=1))
