"""What each client call asks permission for (epochlog/api/permissions.py), decided by the rule of
statemachines/access.py: every call of the API is mapped, and the calls of the issue-21 attacks are refused."""

from __future__ import annotations

import pytest

from epochlog.api import messages as p
from epochlog.api.permissions import _ACTIONS, call_actions
from statemachines import events as ev
from statemachines.access import (ANONYMOUS, Action, Operation, PermissionDeniedError, Principal, authorize)
from statemachines.grants import parse_grant


def who(name: str, *grants: tuple[str, str]) -> Principal:
    return Principal(name, frozenset(parse_grant(*g) for g in grants))


ADMIN = who("root", ("admin", ""))
AUDITOR = who("audit", ("auditor", ""))
APP = who("app", ("writer", "kv:app/"))
B2 = who("b2", ("broker", "c/broker-a/b2"))


def may(principal: Principal, call: p.Call) -> bool:
    try:
        authorize(principal, call_actions(call))
    except PermissionDeniedError:
        return False
    return True


def test_every_call_is_mapped() -> None:
    assert set(_ACTIONS) == set(p.Call.__args__)  # type: ignore[attr-defined]


def b1_identity() -> p.BrokerIdentity:
    return p.BrokerIdentity("c", "broker-a", "b1", "6.6.6.6:10911", "evil")


@pytest.mark.parametrize("call, allowed", [
    (p.BrokerRegister([b1_identity()]), {"admin"}),
    (p.BrokerRegister([p.BrokerIdentity("c", "broker-a", "b2", "127.0.0.1:1", "x")]), {"admin", "b2"}),
    (p.BrokerRegister([p.BrokerIdentity("c", "broker-a", "b2", "127.0.0.1:1", "x"), b1_identity()]), {"admin"}),
    (p.BrokerHeartbeats([p.Heartbeat("c", "broker-a", "b1", 1)]), {"admin"}),
    (p.SyncStateSetReport("c", "broker-a", "b1", 1, 1, 1, []), {"admin"}),
    (p.BrokerShutdown("c", "broker-a", "b1", 1), {"admin"}),
    (p.Write([ev.BrokerFenced(cluster="c", group="broker-a", name="b1", broker_epoch=1)]), set()),
    (p.Write([ev.MasterElected(cluster="c", group="broker-a", master=-1, master_epoch=1)]), set()),
    (p.Write([ev.TopicUpdated(name="orders", broker_groups=())]), {"admin"}),
    (p.Write([ev.KvDeleted(name="billing/x")]), {"admin"}),
    (p.Write([ev.KvPut(name="app/a", value=b""), ev.KvDeleted(name="billing/x")]), {"admin"}),
    (p.Write([ev.KvPut(name="app/a", value=b"")]), {"admin", "app"}),
    (p.MemberAdd(9, "6.6.6.6:1"), {"admin"}),
    (p.MemberRemove(1), {"admin"}),
    (p.TransferLeader("metadata", 0), {"admin"}),
    (p.GroupSkip("kv", 5), {"admin"}),
    (p.Snapshot("kv"), {"admin"}),
    (p.ReadEvents("metadata", 0), {"admin", "auditor"}),
    (p.ReadLog("kv", 0), {"admin", "auditor"}),
    (p.Watch(prefix="", group="kv"), {"admin", "auditor"}),
    (p.Watch(prefix="kv/app/"), {"admin", "auditor", "app"}),
    (p.Watch(prefix="kv/"), {"admin", "auditor"}),
    (p.List(prefix="kv/app/"), {"admin", "auditor", "app"}),
    (p.List(start="kv/app/a", end="kv/app/z"), {"admin", "auditor", "app"}),
    (p.List(start="kv/app/a", end="kv/b"), {"admin", "auditor"}),
    (p.Gets([p.Get("kv/app/a"), p.Get("kv/billing/b")]), {"admin", "auditor"}),
    (p.History("kv/app/a"), {"admin", "auditor", "app"}),
    (p.LeaseGrant(1000), {"admin", "app"}),
    (p.CompactionStatus(), {"admin", "auditor"}),
    (p.Status(), {"admin", "auditor", "app", "b2"}),
    (p.RouteQuery("orders"), {"admin", "auditor", "app", "b2"}),
    (p.Ping(), {"admin", "auditor", "app", "b2"}),
])
def test_who_may_make_each_call(call: p.Call, allowed: set[str]) -> None:
    principals = {"admin": ADMIN, "auditor": AUDITOR, "app": APP, "b2": B2, "anonymous": ANONYMOUS}
    assert {n for n, x in principals.items() if may(x, call)} == allowed


def test_a_range_is_judged_by_the_common_prefix_of_its_bounds() -> None:
    (action,) = call_actions(p.List(start="kv/app/a", end="kv/app/q"))
    assert action == Action(Operation.READ, "kv/app/", prefix=True)
