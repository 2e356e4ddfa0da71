"""Building registries and clocks for the table-driven controller tests, in a compact notation.

A group is written as `G(master, master_epoch, sse, sse_epoch)` and its brokers as
`B(name, id, epoch, fenced=False, incarnation="0001")`; `clocks(alive={"a": 50, ...})` makes the
named brokers live with the given replicated offsets (-1: alive, offset unknown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.registry import Registry, broker_key
from statemachines.state import BrokerState, GroupState

CLUSTER = "c"
GROUP = "g"
GKEY = f"group/{CLUSTER}/{GROUP}"


@dataclass(frozen=True)
class G:
    master: int = -1
    master_epoch: int = 0
    sse: tuple[int, ...] = ()
    sse_epoch: int = 0


@dataclass(frozen=True)
class B:
    name: str
    id: int
    epoch: int = 10
    fenced: bool = False
    incarnation: str = "0001"
    address: str = ""


def registry(group: G | None, brokers: Sequence[B] = ()) -> Registry:
    states = [BrokerState(cluster=CLUSTER, group=GROUP, name=b.name, address=b.address or f"10.0.0.{b.id + 1}:10911",
                          incarnation=b.incarnation, broker_id=b.id, broker_epoch=b.epoch, fenced=b.fenced,
                          version=b.epoch, created=b.epoch) for b in brokers]
    groups = [] if group is None else [
        GroupState(cluster=CLUSTER, group=GROUP, master=group.master, master_epoch=group.master_epoch,
                   sync_state_set=group.sse, sync_state_set_epoch=group.sse_epoch,
                   brokers={b.name: b.id for b in brokers}, version=1, created=1)]
    return Registry(states, groups)


class FakeClocks:
    def __init__(self, alive: Mapping[str, int]) -> None:
        self._alive = {broker_key(CLUSTER, GROUP, name): offset for name, offset in alive.items()}

    def alive(self, key: str) -> bool:
        return key in self._alive

    def offset(self, key: str) -> int:
        return self._alive.get(key, -1)


def clocks(alive: Mapping[str, int] | None = None) -> FakeClocks:
    return FakeClocks(alive or {})
