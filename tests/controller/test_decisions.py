"""The controller's decisions, table-driven: each row is a registry, a request and the expected answer.

Expected events are written as short tuples (type, fields...) so a table reads like the rules in
controller/decisions.py; an error is expected as its code.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller import decisions as d
from controller.errors import ControllerError
from statemachines import events as ev
from statemachines.brokers import new_incarnation
from tests.controller.helpers import CLUSTER, GKEY, GROUP, B, G, clocks, registry


def summary(decision: d.Decision) -> Any:
    """('error', code) or a list of short tuples, one per event."""
    if decision.error is not None:
        assert isinstance(decision.error, ControllerError)
        return ("error", decision.error.code)
    out: list[tuple[Any, ...]] = []
    for e in decision.events:
        assert e.actor == d.ACTOR
        e.validate()
        if isinstance(e, ev.BrokerRegistered):
            out.append(("registered", e.name, e.broker_id, e.broker_epoch))
        elif isinstance(e, ev.MasterElected):
            out.append(("elected", e.master, e.master_epoch, e.sync_state_set))
        elif isinstance(e, ev.SyncStateSetChanged):
            out.append(("sse", e.sync_state_set, e.master_epoch, e.sync_state_set_epoch))
        elif isinstance(e, ev.BrokerFenced):
            out.append(("fenced", e.name, e.broker_epoch, e.reason))
        elif isinstance(e, ev.BrokerUnfenced):
            out.append(("unfenced", e.name, e.broker_epoch))
        else:
            raise AssertionError(e)
    return out


# --- register -----------------------------------------------------------------------------------

REGISTER = [
    # (case, group, brokers, (name, address, incarnation), next_offset, expected)
    ("first broker of a new group gets id 0", None, [], ("a", "10.0.0.1:10911", "0005"), 100,
     [("registered", "a", 0, 100)]),
    ("the others get 1..n", G(0, 1, (0,), 1), [B("a", 0)], ("b", "10.0.0.2:10911", "0005"), 100,
     [("registered", "b", 1, 100)]),
    ("ids above every id used, the SyncStateSet's included", G(0, 3, (0, 4), 2), [B("a", 0), B("b", 1)],
     ("c", "10.0.0.3:10911", "0005"), 100, [("registered", "c", 5, 100)]),
    ("ids above the master's even when it left the group", G(7, 3, (7,), 2), [B("a", 0)],
     ("c", "10.0.0.3:10911", "0005"), 100, [("registered", "c", 8, 100)]),
    ("the same incarnation again is a retry: nothing", G(0, 1, (0,), 1), [B("a", 0, incarnation="0005",
                                                                             address="10.0.0.1:10911")],
     ("a", "10.0.0.1:10911", "0005"), 100, []),
    ("a newer incarnation keeps the id, takes a higher epoch", G(0, 1, (0,), 1), [B("a", 0, epoch=40), B("b", 1)],
     ("a", "10.0.0.1:10911", "0009"), 100, [("registered", "a", 0, 100)]),
    ("the epoch grows past the old one even if the offset hint is lower", G(0, 1, (0,), 1), [B("a", 0, epoch=400)],
     ("a", "10.0.0.1:10911", "0009"), 100, [("registered", "a", 0, 401)]),
    ("an older incarnation is fenced", G(0, 1, (0,), 1), [B("a", 0, incarnation="0005")],
     ("a", "10.0.0.1:10911", "0004"), 100, ("error", "fenced")),
    ("same incarnation, new address: registered again", G(0, 1, (0,), 1),
     [B("a", 0, incarnation="0005", address="10.0.0.1:10911")], ("a", "10.0.0.9:10911", "0005"), 100,
     [("registered", "a", 0, 100)]),
    ("a malformed address is refused", None, [], ("a", "nowhere", "0005"), 100, ("error", "invalid_argument")),
    ("a malformed name is refused", None, [], ("a b", "10.0.0.1:10911", "0005"), 100, ("error", "invalid_argument")),
]


@pytest.mark.parametrize("case,group,brokers,req,next_offset,expected", REGISTER, ids=[r[0] for r in REGISTER])
def test_register(case, group, brokers, req, next_offset, expected):
    name, address, incarnation = req
    reg = registry(group, brokers)
    assert summary(d.register(reg, CLUSTER, GROUP, name, address, incarnation, next_offset)) == expected


def test_incarnations_sort_by_start_time():
    early, late = new_incarnation(1_700_000_000_000_000_000), new_incarnation(1_700_000_000_000_000_001)
    assert early < late and len(early) == len(late)
    assert new_incarnation(5) != new_incarnation(5)


# --- elect --------------------------------------------------------------------------------------

ELECT = [
    # (case, group, brokers, alive {name: offset}, unclean, exclude, expected)
    ("a live master: nothing", G(0, 1, (0, 1), 2), [B("a", 0), B("b", 1)], {"a": 5, "b": 5}, False, (), []),
    ("master fenced: the in-sync replica with the highest offset", G(0, 1, (0, 1, 2), 2),
     [B("a", 0, fenced=True), B("b", 1), B("c", 2)], {"b": 50, "c": 70}, False, (), [("elected", 2, 1, (2,))]),
    ("master silent (not fenced yet) counts as gone", G(0, 1, (0, 1), 2), [B("a", 0), B("b", 1)], {"b": 1},
     False, (), [("elected", 1, 1, (1,))]),
    ("equal offsets: the lowest id", G(0, 4, (0, 1, 2), 6), [B("a", 0, fenced=True), B("b", 1), B("c", 2)],
     {"b": 9, "c": 9}, False, (), [("elected", 1, 4, (1,))]),
    ("a live broker outside the set is not eligible", G(0, 1, (0, 1), 2),
     [B("a", 0, fenced=True), B("b", 1), B("c", 2)], {"c": 99}, False, (), [("elected", -1, 1, (0, 1))]),
    ("unless unclean election is on", G(0, 1, (0, 1), 2), [B("a", 0, fenced=True), B("b", 1), B("c", 2)],
     {"c": 99}, True, (), [("elected", 2, 1, (2,))]),
    ("unclean prefers in-sync brokers all the same", G(0, 1, (0, 1), 2), [B("a", 0, fenced=True), B("b", 1), B("c", 2)],
     {"b": 1, "c": 99}, True, (), [("elected", 1, 1, (1,))]),
    ("a fenced in-sync broker is not eligible", G(0, 1, (0, 1), 2), [B("a", 0, fenced=True), B("b", 1, fenced=True)],
     {"b": 5}, False, (), [("elected", -1, 1, (0, 1))]),
    ("already masterless with nobody eligible: nothing more", G(-1, 2, (0, 1), 3), [B("a", 0), B("b", 1)], {},
     False, (), []),
    ("masterless, an in-sync broker is back: elected", G(-1, 2, (0, 1), 3), [B("a", 0), B("b", 1)], {"a": 3},
     False, (), [("elected", 0, 2, (0,))]),
    ("a group that never had a master takes any live broker", G(-1, 0, (), 0), [B("a", 0), B("b", 1)],
     {"a": -1, "b": -1}, False, (), [("elected", 0, 0, (0,))]),
    ("... the highest offset first", G(-1, 0, (), 0), [B("a", 0), B("b", 1)], {"a": 1, "b": 2}, False, (),
     [("elected", 1, 0, (1,))]),
    ("the master leaving (excluded) is replaced", G(0, 1, (0, 1), 2), [B("a", 0), B("b", 1)], {"a": 9, "b": 5},
     False, (0,), [("elected", 1, 1, (1,))]),
    ("master no longer registered", G(3, 1, (1, 3), 2), [B("b", 1)], {"b": 5}, False, (), [("elected", 1, 1, (1,))]),
]


@pytest.mark.parametrize("case,group,brokers,alive,unclean,exclude,expected", ELECT, ids=[r[0] for r in ELECT])
def test_elect(case, group, brokers, alive, unclean, exclude, expected):
    reg = registry(group, brokers)
    assert summary(d.elect(reg, GKEY, clocks(alive), unclean=unclean, exclude=exclude)) == expected


# --- SyncStateSet reports -----------------------------------------------------------------------

GROUP3 = G(0, 3, (0, 1), 5)
BROKERS3 = [B("a", 0, epoch=10), B("b", 1, epoch=11), B("c", 2, epoch=12)]
ALL_ALIVE = {"a": 9, "b": 9, "c": 9}

SSE = [
    # (case, group, brokers, alive, (name, broker_epoch, master_epoch, sse_epoch, new set), expected)
    ("the master expands with a live replica", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10, 3, 5, (0, 1, 2)),
     [("sse", (0, 1, 2), 3, 5)]),
    ("the master shrinks (a dead replica may leave)", GROUP3, BROKERS3, {"a": 9}, ("a", 10, 3, 5, (0,)),
     [("sse", (0,), 3, 5)]),
    ("the same set: nothing", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10, 3, 5, (1, 0)), []),
    ("a stale master epoch (a deposed master) is refused", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10, 2, 5, (0, 1, 2)),
     ("error", "stale_epoch")),
    ("a stale sync-state-set epoch is refused", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10, 3, 4, (0, 1, 2)),
     ("error", "stale_epoch")),
    ("a stale broker epoch (an older incarnation) is refused", GROUP3, BROKERS3, ALL_ALIVE,
     ("a", 9, 3, 5, (0, 1, 2)), ("error", "fenced")),
    ("only the master reports", GROUP3, BROKERS3, ALL_ALIVE, ("b", 11, 3, 5, (0, 1, 2)), ("error", "invalid_argument")),
    ("the master stays in its set", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10, 3, 5, (1, 2)),
     ("error", "invalid_argument")),
    ("a dead broker cannot join", GROUP3, BROKERS3, {"a": 9, "b": 9}, ("a", 10, 3, 5, (0, 1, 2)),
     ("error", "invalid_argument")),
    ("a fenced broker cannot join", GROUP3, [B("a", 0, epoch=10), B("b", 1), B("c", 2, fenced=True)], ALL_ALIVE,
     ("a", 10, 3, 5, (0, 1, 2)), ("error", "invalid_argument")),
    ("an id outside the group cannot join", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10, 3, 5, (0, 7)),
     ("error", "invalid_argument")),
    ("an unknown reporter", GROUP3, BROKERS3, ALL_ALIVE, ("z", 10, 3, 5, (0,)), ("error", "not_found")),
    ("a fenced master", G(0, 3, (0, 1), 5), [B("a", 0, epoch=10, fenced=True), B("b", 1)], ALL_ALIVE,
     ("a", 10, 3, 5, (0,)), ("error", "fenced")),
]


@pytest.mark.parametrize("case,group,brokers,alive,req,expected", SSE, ids=[r[0] for r in SSE])
def test_alter_sync_state_set(case, group, brokers, alive, req, expected):
    name, broker_epoch, master_epoch, sse_epoch, members = req
    reg = registry(group, brokers)
    got = d.alter_sync_state_set(reg, CLUSTER, GROUP, name, broker_epoch, master_epoch, sse_epoch, members,
                                 clocks(alive))
    assert summary(got) == expected


# --- controlled shutdown, fence, unfence ------------------------------------------------------------

SHUTDOWN = [
    ("a master hands over to an in-sync replica, then is fenced", GROUP3, BROKERS3, ALL_ALIVE, ("a", 10),
     [("elected", 1, 3, (1,)), ("fenced", "a", 10, "controlled shutdown")]),
    ("a master without a successor leaves the group masterless", G(0, 3, (0,), 5), BROKERS3, ALL_ALIVE, ("a", 10),
     [("elected", -1, 3, (0,)), ("fenced", "a", 10, "controlled shutdown")]),
    ("a slave is just fenced", GROUP3, BROKERS3, ALL_ALIVE, ("b", 11), [("fenced", "b", 11, "controlled shutdown")]),
    ("an older incarnation cannot shut the broker down", GROUP3, BROKERS3, ALL_ALIVE, ("a", 3), ("error", "fenced")),
    ("unknown", GROUP3, BROKERS3, ALL_ALIVE, ("z", 3), ("error", "not_found")),
]


@pytest.mark.parametrize("case,group,brokers,alive,req,expected", SHUTDOWN, ids=[r[0] for r in SHUTDOWN])
def test_shutdown(case, group, brokers, alive, req, expected):
    name, epoch = req
    reg = registry(group, brokers)
    assert summary(d.shutdown(reg, CLUSTER, GROUP, name, epoch, clocks(alive), unclean=False)) == expected


FENCING = [
    # (case, fenced now, function, epoch, expected)
    ("fence a live broker", False, "fence", 10, [("fenced", "a", 10, "heartbeat timeout")]),
    ("fencing twice: nothing", True, "fence", 10, []),
    ("fence at a stale epoch (re-registered since): nothing", False, "fence", 9, []),
    ("unfence a fenced broker", True, "unfence", 10, [("unfenced", "a", 10)]),
    ("unfence a live one: nothing", False, "unfence", 10, []),
    ("unfence at a stale epoch: nothing", True, "unfence", 9, []),
]


@pytest.mark.parametrize("case,fenced,function,epoch,expected", FENCING, ids=[r[0] for r in FENCING])
def test_fence_and_unfence(case, fenced, function, epoch, expected):
    reg = registry(G(0, 1, (0,), 1), [B("a", 0, epoch=10, fenced=fenced)])
    key = f"broker/{CLUSTER}/{GROUP}/a"
    got = d.fence(reg, key, epoch, "heartbeat timeout") if function == "fence" else d.unfence(reg, key, epoch)
    assert summary(got) == expected
