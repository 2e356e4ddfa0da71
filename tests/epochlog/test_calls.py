"""The call runner every face shares (epochlog/calls.py): deadlines, the authorization hook, error rows, metrics.

Real asyncio timers and tasks, real prometheus metrics in a registry of the test's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from eventlog.errors import EpochlogError, InvalidArgumentError, NotCaughtUpError
from epochlog.calls import CallRunner, Done, FaceRules, Failed
from epochlog.access_control import ANONYMOUS_CALLER, Caller


@dataclass
class RpcMetrics:
    registry: CollectorRegistry
    rpc_seconds: Histogram
    rpc_errors: Counter

    @classmethod
    def fresh(cls) -> RpcMetrics:
        r = CollectorRegistry()
        return cls(r, Histogram("rpc_seconds", "", ["op"], registry=r),
                   Counter("rpc_errors", "", ["op", "code"], registry=r))

    def errors(self, op: str, code: str) -> float:
        return self.registry.get_sample_value("rpc_errors_total", {"op": op, "code": code}) or 0.0

    def calls(self, op: str) -> float:
        return self.registry.get_sample_value("rpc_seconds_count", {"op": op}) or 0.0


NATIVE = FaceRules()
GRPC = FaceRules(metrics_prefix="grpc_", grace_s=0.05, late_retriable_is_deadline=True)


def test_a_call_past_its_deadline_is_cut_and_reported_as_deadline_exceeded() -> None:
    metrics = RpcMetrics.fresh()
    runner = CallRunner(NATIVE, metrics)
    reached_the_end = False

    async def slow() -> str:
        nonlocal reached_the_end
        await asyncio.sleep(5)
        reached_the_end = True
        return "late"

    async def main() -> Done[str] | Failed:
        outcome = await runner.run("get", object(), slow, 0.05)
        await asyncio.sleep(0)   # the task was uncancelled: it goes on normally after its deadline
        return outcome

    outcome = asyncio.run(main())
    assert isinstance(outcome, Failed) and outcome.error.code == "deadline_exceeded", outcome
    assert "0.05 s" in str(outcome.error) and not reached_the_end
    assert metrics.errors("get", "deadline_exceeded") == 1 and metrics.calls("get") == 1


def test_a_cancellation_that_is_not_the_deadline_propagates() -> None:
    runner = CallRunner(NATIVE)

    async def main() -> None:
        task = asyncio.ensure_future(runner.run("get", object(), lambda: asyncio.sleep(5), 10.0))
        await asyncio.sleep(0.01)
        task.cancel()   # the connection went
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_errors_become_their_rows_and_a_bug_is_internal() -> None:
    metrics = RpcMetrics.fresh()
    runner = CallRunner(GRPC, metrics)

    async def refuse() -> None:
        raise InvalidArgumentError("no such group")

    async def bug() -> None:
        raise KeyError("oops")

    refused, broken = asyncio.run(runner.run("get", object(), refuse, 1.0)), asyncio.run(runner.run("get", object(), bug, 1.0))
    assert isinstance(refused, Failed) and refused.error.code == "invalid_argument"
    assert isinstance(broken, Failed) and broken.error.code == "internal" and "KeyError" in str(broken.error)
    assert metrics.errors("grpc_get", "invalid_argument") == 1 and metrics.errors("grpc_get", "internal") == 1
    sync = runner.now("status", object(), lambda: 1 // 0)
    assert isinstance(sync, Failed) and sync.error.code == "internal" and metrics.calls("grpc_status") == 1
    assert runner.now("status", object(), lambda: "fine") == Done("fine")


@pytest.mark.parametrize("late_retriable_is_deadline", [False, True])
def test_a_retriable_error_at_the_deadline_is_reported_by_the_face_s_rule(late_retriable_is_deadline: bool) -> None:
    """A read barrier that waited out the call's deadline (and failed within the grace): gRPC says
    DEADLINE_EXCEEDED naming what it waited for; the native face says not_caught_up, which the SDK
    retries elsewhere."""
    runner = CallRunner(FaceRules(grace_s=1.0, late_retriable_is_deadline=late_retriable_is_deadline))
    code = "deadline_exceeded" if late_retriable_is_deadline else "not_caught_up"

    async def barrier() -> None:
        await asyncio.sleep(0.06)
        raise NotCaughtUpError("applied 4, asked for 9")

    outcome = asyncio.run(runner.run("get", object(), barrier, 0.05))
    assert isinstance(outcome, Failed) and outcome.error.code == code
    assert "applied 4, asked for 9" in str(outcome.error)


class Refusing(CallRunner):
    """A runner whose authorization refuses one caller (the hook's contract; the real rule: test_access_control)."""

    def authorize(self, caller: Caller, op: str, call: object) -> None:
        if caller.authenticated == "mallory":
            raise InvalidArgumentError(f"{caller.authenticated} may not {op}")


def test_every_call_passes_the_authorization_hook_before_it_runs() -> None:
    runner = Refusing(NATIVE)
    ran: list[str] = []

    async def work() -> str:
        ran.append("async")
        return "ok"

    def now() -> str:
        ran.append("sync")
        return "ok"

    mallory = Caller(authenticated="mallory")
    refused = [asyncio.run(runner.run("put", object(), work, 1.0, mallory)), runner.now("status", object(), now, mallory)]
    assert all(isinstance(o, Failed) and "mallory may not" in str(o.error) for o in refused) and ran == []
    allowed = [asyncio.run(runner.run("put", object(), work, 1.0, ANONYMOUS_CALLER)), runner.now("status", object(), now)]
    assert allowed == [Done("ok"), Done("ok")] and ran == ["async", "sync"]


def test_the_root_error_is_the_row_of_anything_unexpected() -> None:
    outcome = CallRunner(NATIVE).now("get", object(), lambda: [][1])
    assert isinstance(outcome, Failed) and type(outcome.error) is EpochlogError


class Work:
    """Work a started call began: told by the test, and whether the call cancelled it."""

    def __init__(self) -> None:
        self.tell: Callable[[object], None] | None = None
        self.cancelled = 0

    def begin(self, tell: Callable[[object], None]) -> Work:
        self.tell = tell
        return self

    def cancel(self) -> bool:
        self.cancelled += 1
        return True


def test_a_started_call_is_done_once_in_the_turn_its_work_tells_it() -> None:
    """`CallRunner.start`: no task; `done` runs in the callback that tells the outcome, once."""
    metrics = RpcMetrics.fresh()
    runner = CallRunner(NATIVE, metrics)
    outcomes: list[object] = []

    async def main() -> None:
        work = Work()
        runner.start("write", object(), work.begin, 10.0, ANONYMOUS_CALLER, outcomes.append)
        assert outcomes == [] and work.tell is not None
        work.tell(["result"])
        assert outcomes == [Done(["result"])]   # at once, not a loop turn later
        work.tell(["again"])
        assert outcomes == [Done(["result"])]
        failing = Work()
        runner.start("write", object(), failing.begin, 10.0, ANONYMOUS_CALLER, outcomes.append)
        assert failing.tell is not None
        failing.tell(InvalidArgumentError("no such group"))

    asyncio.run(main())
    assert isinstance(outcomes[1], Failed) and outcomes[1].error.code == "invalid_argument"
    assert metrics.calls("write") == 2 and metrics.errors("write", "invalid_argument") == 1


def test_a_started_call_past_its_deadline_is_cut_and_its_work_cancelled() -> None:
    metrics = RpcMetrics.fresh()
    runner = CallRunner(FaceRules(grace_s=0.02), metrics)
    outcomes: list[object] = []
    work = Work()

    async def main() -> None:
        runner.start("write", object(), work.begin, 0.05, ANONYMOUS_CALLER, outcomes.append)
        while not outcomes:
            await asyncio.sleep(0.01)
        assert work.tell is not None
        work.tell(["too late"])   # the work's outcome after the cut is not told

    asyncio.run(asyncio.wait_for(main(), 5))
    assert len(outcomes) == 1 and isinstance(outcomes[0], Failed), outcomes
    assert outcomes[0].error.code == "deadline_exceeded" and "0.05 s" in str(outcomes[0].error)
    assert work.cancelled == 1 and metrics.calls("write") == 1 and metrics.errors("write", "deadline_exceeded") == 1


def test_a_started_call_its_caller_cancels_tells_nothing_and_cancels_its_work() -> None:
    """The connection went: no outcome, the work cancelled, the deadline's timer gone, the latency counted."""
    metrics = RpcMetrics.fresh()
    runner = CallRunner(NATIVE, metrics)
    outcomes: list[object] = []
    work = Work()

    async def main() -> None:
        call = runner.start("write", object(), work.begin, 0.05, ANONYMOUS_CALLER, outcomes.append)
        assert call is not None and call.cancel() and not call.cancel()
        await asyncio.sleep(0.1)   # past the deadline: its timer was cancelled with the call
        assert work.tell is not None
        work.tell(["after the caller went"])

    asyncio.run(main())
    assert outcomes == [] and work.cancelled == 1 and metrics.calls("write") == 1


def test_a_started_call_refused_or_failing_to_begin_is_done_at_once() -> None:
    runner = Refusing(NATIVE)
    outcomes: list[object] = []
    began: list[str] = []

    def begin(tell: Callable[[object], None]) -> Work:
        began.append("begun")
        return Work()

    def invalid(tell: Callable[[object], None]) -> Work:
        raise InvalidArgumentError("a write carries at least one event")

    async def main() -> None:
        assert runner.start("write", object(), begin, 1.0, Caller(authenticated="mallory"), outcomes.append) is None
        assert runner.start("write", object(), invalid, 1.0, ANONYMOUS_CALLER, outcomes.append) is None
        assert len(outcomes) == 2   # at once, and nothing left running
        await asyncio.sleep(0)

    asyncio.run(main())
    assert began == [] and all(isinstance(o, Failed) for o in outcomes)
    assert "mallory may not" in str(outcomes[0].error)   # type: ignore[union-attr]
    assert outcomes[1].error.code == "invalid_argument"   # type: ignore[union-attr]
