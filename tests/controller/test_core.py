"""ControllerCore with a fake clock: heartbeats, expiry, unfence, the grace of a new controller, storms."""

from __future__ import annotations

from controller.config import ControllerConfig, controller_config
from controller.core import FENCED, NOT_FOUND, OK, ControllerCore, Fence, Register, Shutdown, Unfence
from controller.registry import Registry
from eventlog.errors import ConfigError
from statemachines import events as ev
from tests.controller.helpers import CLUSTER, GKEY, GROUP, B, G, registry

CONFIG = ControllerConfig(heartbeat_interval_ms=1000, heartbeat_timeout_ms=10_000)
KEY_A, KEY_B, KEY_C = (f"broker/{CLUSTER}/{GROUP}/{n}" for n in "abc")


def commit(core: ControllerCore, commands, now: float, offset: int = 1000) -> list[ev.Event]:
    events: list[ev.Event] = []
    for c in commands:
        decision = core.decide(c, now, offset + len(events))
        assert decision.error is None, decision.error
        events += decision.events
    return events


def names(events) -> list[tuple[str, object]]:
    return [(type(e).__name__, getattr(e, "name", getattr(e, "master", None))) for e in events]


def test_heartbeat_answers():
    core = ControllerCore(CONFIG, registry(G(0, 1, (0,), 1), [B("a", 0, epoch=10)]), now=0.0)
    assert core.heartbeat(KEY_A, 10, 5, 1.0) == OK
    assert core.heartbeat(KEY_A, 9, 5, 1.0) == FENCED          # an older incarnation's epoch
    assert core.heartbeat(KEY_B, 10, 5, 1.0) == NOT_FOUND      # never registered
    assert core.liveness.offset(KEY_A) == 5


def test_silence_fences_and_elects_the_in_sync_replica_with_the_highest_offset():
    core = ControllerCore(CONFIG, registry(G(0, 1, (0, 1, 2), 2), [B("a", 0), B("b", 1), B("c", 2)]), now=0.0)
    for t in range(1, 12):
        core.heartbeat(KEY_B, 10, 100 + t, float(t))
        core.heartbeat(KEY_C, 10, 200 + t, float(t))
    assert core.due(9.9) == []                       # the master's clock started at 0 (+10 s)
    due = core.due(10.0)
    assert due == [Fence(KEY_A, 10, "heartbeat timeout")]
    events = commit(core, due, 10.0)
    assert names(events) == [("BrokerFenced", "a"), ("MasterElected", 2)]
    assert core.registry.groups[GKEY].master == 2 and core.registry.groups[GKEY].master_epoch == 2
    assert core.due(10.1) == []                      # fenced: not offered again


def test_a_fenced_broker_heard_from_again_is_unfenced_and_a_masterless_group_takes_it_back():
    core = ControllerCore(CONFIG, registry(G(-1, 3, (0, 1), 4), [B("a", 0, fenced=True), B("b", 1, fenced=True)]),
                          now=0.0)
    assert core.due(1.0) == []
    assert core.heartbeat(KEY_B, 10, 7, 1.0) == OK
    due = core.due(1.0)
    assert due == [Unfence(KEY_B, 10)]
    events = commit(core, due, 1.0)
    assert names(events) == [("BrokerUnfenced", "b"), ("MasterElected", 1)]


def test_a_new_controller_starts_every_clock_in_full():
    """Grace: the registry says nothing of when brokers were last heard, so nobody is fenced before a
    full timeout after activation (a controller failover does not mass-fence)."""
    reg = registry(G(0, 1, (0, 1), 2), [B("a", 0), B("b", 1)])
    core = ControllerCore(CONFIG, reg, now=500.0)
    assert core.due(509.9) == []
    core.heartbeat(KEY_B, 10, 1, 505.0)
    assert core.due(510.0) == [Fence(KEY_A, 10, "heartbeat timeout")]


def test_an_expiry_not_acted_upon_is_offered_again():
    core = ControllerCore(CONFIG, registry(G(0, 1, (0,), 1), [B("a", 0)]), now=0.0)
    assert len(core.due(10.0)) == 1                  # the fence is lost (say leadership moved)
    assert core.due(12.0) == []
    assert len(core.due(15.0)) == 1                  # half a timeout later


def test_registration_storm_in_one_batch():
    core = ControllerCore(CONFIG, Registry(), now=0.0)
    commands = [Register(CLUSTER, f"g{i // 3}", f"b{i % 3}", f"10.0.{i // 250}.{i % 250}:10911", "0001")
                for i in range(300)]
    events = commit(core, commands, 0.0, offset=50)
    registered = [e for e in events if isinstance(e, ev.BrokerRegistered)]
    elected = [e for e in events if isinstance(e, ev.MasterElected)]
    assert len(registered) == 300 and len(elected) == 100
    assert all(e.master == 0 for e in elected)
    assert {(e.group, e.name): e.broker_id for e in registered}[("g7", "b2")] == 2
    epochs = [e.broker_epoch for e in registered]
    assert epochs == sorted(epochs) and len(set(epochs)) == 300
    # every epoch is at most the offset its event will be committed at
    offsets = {id(e): 50 + i for i, e in enumerate(events)}
    assert all(e.broker_epoch <= offsets[id(e)] for e in registered)


def test_controlled_shutdown_of_the_master():
    core = ControllerCore(CONFIG, registry(G(0, 1, (0, 1), 2), [B("a", 0), B("b", 1)]), now=0.0)
    events = commit(core, [Shutdown(CLUSTER, GROUP, "a", 10)], 1.0)
    assert names(events) == [("MasterElected", 1), ("BrokerFenced", "a")]
    assert core.due(100.0) == [Fence(KEY_B, 10, "heartbeat timeout")]   # a is fenced: not expired again


def test_re_registration_restarts_the_clock_and_fences_the_old_incarnation():
    core = ControllerCore(CONFIG, registry(G(0, 1, (0,), 1), [B("a", 0, epoch=10, incarnation="0001")]), now=0.0)
    events = commit(core, [Register(CLUSTER, GROUP, "a", "10.0.0.1:10911", "0002")], 1.0, offset=77)
    assert names(events) == [("BrokerRegistered", "a")]
    assert core.heartbeat(KEY_A, 10, 1, 2.0) == FENCED
    assert core.heartbeat(KEY_A, 77, 1, 2.0) == OK


def test_config_profiles():
    assert controller_config(None) == ControllerConfig()
    ns = controller_config({"profile": "nameserver"})
    assert (ns.heartbeat_interval_ms, ns.heartbeat_timeout_ms) == (30_000, 120_000)
    mixed = controller_config({"profile": "nameserver", "heartbeat_timeout_ms": 90_000})
    assert (mixed.heartbeat_interval_ms, mixed.heartbeat_timeout_ms) == (30_000, 90_000)
    for bad in ({"profile": "zookeeper"}, {"heartbeat_interval_ms": 5000, "heartbeat_timeout_ms": 5000},
                {"heartbeat_timeout_ms": 100, "check_interval_ms": 200, "heartbeat_interval_ms": 50}):
        try:
            controller_config(bad)
        except ConfigError as exc:
            assert exc.key.startswith("controller.")
        else:
            raise AssertionError(f"{bad} was accepted")
