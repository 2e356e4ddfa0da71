"""`KafkaCluster`: tests/epochlog/node's NodeCluster whose members also serve the Kafka protocol."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.support.nodes import NodeCluster
from tests.support.ports import free_ports


class KafkaCluster(NodeCluster):
    """Every member gets `kafka_address` on a free 127.0.0.1 port (kept across restarts); `kafka_config`
    is the `[kafka]` section (the Kafka face's limits)."""

    def __init__(self, root: Path, *, size: int = 3, controller: dict[str, object] | None = None,
                 kafka_config: dict[str, object] | None = None, **kwargs: Any) -> None:
        ports = free_ports(size, random.Random(random.SystemRandom().getrandbits(64)))
        self.kafka = {i: f"127.0.0.1:{ports[i - 1]}" for i in range(1, size + 1)}
        self.controller = dict(controller or {})
        self.kafka_config = dict(kafka_config or {})
        super().__init__(root, size=size, **kwargs)

    def config_text(self) -> str:
        lines = []
        member = None
        for line in super().config_text().splitlines():
            lines.append(line)
            if line.startswith("id = "):
                member = int(line.split("=")[1])
            if line.startswith("admin_address") and member is not None:
                lines.append(f'kafka_address = "{self.kafka[member]}"')
        if self.controller:
            lines += ["[controller]", *(f"{k} = {v!r}" for k, v in self.controller.items())]
        if self.kafka_config:
            lines += ["[kafka]", *(f"{k} = {v!r}" for k, v in self.kafka_config.items())]
        return "\n".join(lines) + "\n"

    @property
    def bootstrap(self) -> list[str]:
        return list(self.kafka.values())
