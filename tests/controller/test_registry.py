"""The registry's model of the applier agrees with the applier, event for event.

The controller decides against `Registry.apply` (optimistic updates within a batch); the views are
written by statemachines/apply.py. Random sequences of broker and group events over a small
universe (so that most epochs collide: stale, current and future ones) go through both; after
every event the outcome and every broker and group state must be identical.
"""

from __future__ import annotations

import os
import random

import pytest

from controller.registry import Registry
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.apply import Applier
from statemachines.state import decode_state
from statemachines.store import ViewStore

CLUSTERS = ("c1",)
GROUPS = ("g1", "g2")
NAMES = ("a", "b", "c")


def random_event(rng: random.Random) -> ev.Event:
    common = {"cluster": rng.choice(CLUSTERS), "group": rng.choice(GROUPS)}
    kind = rng.randrange(7)
    epoch = rng.randrange(1, 6)
    if kind == 0:
        return ev.BrokerRegistered(**common, name=rng.choice(NAMES), address=f"10.0.0.{rng.randrange(3)}:10911",
                                   incarnation=f"{rng.randrange(3):04d}", broker_id=rng.randrange(4),
                                   broker_epoch=epoch)
    if kind == 1:
        return ev.BrokerFenced(**common, name=rng.choice(NAMES), broker_epoch=epoch, reason="test")
    if kind == 2:
        return ev.BrokerUnfenced(**common, name=rng.choice(NAMES), broker_epoch=epoch)
    if kind == 3:
        return ev.BrokerUnregistered(**common, name=rng.choice(NAMES), broker_epoch=epoch)
    if kind == 4:
        members = tuple(rng.sample(range(4), rng.randrange(0, 4)))
        return ev.SyncStateSetChanged(**common, sync_state_set=members, master_epoch=rng.randrange(4),
                                      sync_state_set_epoch=rng.randrange(6))
    members = tuple(rng.sample(range(4), rng.randrange(0, 3)))
    return ev.MasterElected(**common, master=rng.randrange(-1, 4), master_epoch=rng.randrange(4),
                            sync_state_set=members)


def view_states(store: ViewStore) -> tuple[dict, dict]:
    brokers = {k.decode(): decode_state(k, v) for k, v in store.scan("brokers", b"broker/", b"broker0")}
    groups = {k.decode(): decode_state(k, v) for k, v in store.scan("broker_groups", b"group/", b"group0")}
    return brokers, groups


@pytest.mark.parametrize("round_", range(3))
def test_registry_applies_broker_and_group_events_like_the_applier(tmp_path, round_):
    seed = int(os.environ.get("EPOCHLOG_CONTROLLER_SEED") or random.SystemRandom().getrandbits(32))
    print(f"seed={seed} (replay with EPOCHLOG_CONTROLLER_SEED={seed})")
    rng = random.Random(seed)
    store = ViewStore.open(tmp_path / "views")
    try:
        applier = Applier(store)
        registry = Registry()
        accepted = 0
        for index in range(0, 800):
            event = random_event(rng)
            key, value = ev.event_record(event)
            data = bytearray(encode_batch([(key, value)], timestamp_ms=1_700_000_000_000))
            stamp(data, index, 1)
            outcome = applier.apply_entries([Entry(index, 1, 1, EntryKind.NORMAL, bytes(data))])[index]
            ok, code = registry.apply(event, index)
            assert (ok, code) == (outcome.ok, outcome.code), f"seed={seed} offset {index}: {event!r}"
            accepted += ok
            brokers, groups = view_states(store)
            assert registry.brokers == brokers, f"seed={seed} offset {index}"
            assert registry.groups == groups, f"seed={seed} offset {index}"
            for gkey in groups:
                assert {b.name for b in registry.brokers_of(gkey)} == {
                    b.name for k, b in brokers.items() if k.startswith("broker/" + gkey[len("group/"):] + "/")}
        assert accepted > 40, "the random events should apply often enough to mean something"
    finally:
        store.close()
