"""The controller's settings (`[controller]` in the node's TOML file).

Two timing profiles: `controller` (RocketMQ 5 controller mode: heartbeats every 1 s, a broker is
fenced after 10 s of silence) and `nameserver` (the NameServer's 30 s / 120 s, for brokers tuned
for it). The profile supplies `heartbeat_interval_ms` and `heartbeat_timeout_ms` when the table
does not give them; a key given explicitly always wins (`controller_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from eventlog.configuration import doc, from_mapping
from eventlog.errors import ConfigError

PROFILES: dict[str, tuple[int, int]] = {
    "controller": (1_000, 10_000),     # RocketMQ controller mode
    "nameserver": (30_000, 120_000),   # RocketMQ NameServer
}


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Heartbeat timing and election policy of the controller (runs on the metadata group's leader)."""

    profile: Literal["controller", "nameserver"] = field(default="controller", metadata=doc(
        "Timing profile: 'controller' (1 s / 10 s) or 'nameserver' (30 s / 120 s); supplies the "
        "heartbeat keys the table leaves out."))
    heartbeat_interval_ms: int = field(default=1_000, metadata=doc(
        "How often brokers send a heartbeat (told to them at registration).", min=10, max=600_000))
    heartbeat_timeout_ms: int = field(default=10_000, metadata=doc(
        "A broker silent this long is fenced (BrokerFenced); a master is replaced.", min=50, max=3_600_000))
    check_interval_ms: int = field(default=50, metadata=doc(
        "How often the controller looks for brokers past their timeout (bounds the detection delay).",
        min=5, max=60_000))
    unclean_election: bool = field(default=False, metadata=doc(
        "Allow electing a live broker outside the SyncStateSet when no in-sync one is live (may lose "
        "acknowledged messages)."))

    def validate(self, section: str = "controller") -> None:
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms:
            raise ConfigError(f"{section}.heartbeat_timeout_ms", self.heartbeat_timeout_ms,
                              f"must be above heartbeat_interval_ms ({self.heartbeat_interval_ms})")
        if self.check_interval_ms > self.heartbeat_timeout_ms:
            raise ConfigError(f"{section}.check_interval_ms", self.check_interval_ms,
                              f"must not exceed heartbeat_timeout_ms ({self.heartbeat_timeout_ms})")

    @property
    def timeout_s(self) -> float:
        return self.heartbeat_timeout_ms / 1000

    @property
    def interval_s(self) -> float:
        return self.heartbeat_interval_ms / 1000


def controller_config(table: Mapping[str, Any] | None, section: str = "controller") -> ControllerConfig:
    """The config of a `[controller]` table: the profile's timing for the heartbeat keys not given."""
    data = dict(table or {})
    profile = data.get("profile", "controller")
    if profile in PROFILES:
        interval, timeout = PROFILES[profile]
        data.setdefault("heartbeat_interval_ms", interval)
        data.setdefault("heartbeat_timeout_ms", timeout)
    return from_mapping(ControllerConfig, data, section)   # an unknown profile is refused here
