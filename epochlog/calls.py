"""The call path every face shares: authorization, dispatch under a deadline, metrics, error mapping.

A face (the native protocol in epochlog/server.py, gRPC in epochlog/grpc_server.py) is a codec: it
turns bytes into a call of `Node` and the outcome back into bytes. What happens between is here, once:

- `CallRunner.authorize`: the one place where a call's caller is authenticated and checked against
  the permissions the call needs (issue 21: epochlog/access_control.py over statemachines/access.py),
  and where the events a client writes get its principal as their actor. The faces pass what the
  connection said about itself (`Caller`: a certificate's name, a token...). Without an
  `AccessControl` that enforces, every call is allowed as it comes;
- `CallRunner.now` runs a call that completes without waiting (status, a keep-alive...) in the
  caller's turn of the loop; `CallRunner.run` awaits one in the caller's task under its deadline: a
  timer cancels the task when it passes (one timer per call, not `asyncio.wait_for`, which would run
  the work in a second task: a task and a loop turn per request);
  `CallRunner.start` runs one without a task: the work tells its outcome to a callback (a write told in
  the turn that applies it: `Node.start_write`), the face answers from there, a loop turn sooner;
- the outcome is the result or the call's error as its row of the one error table
  (eventlog/errors.py), chosen by `call_error`; the face encodes it (`wire_error` for the native
  protocol, `convert.failure` for gRPC); a bug (`internal`) is logged with its traceback;
- `epochlog_rpc_seconds{op}` and `epochlog_rpc_errors_total{op,code}` are observed.

Concurrency contract: use from the node's loop, in the task that runs the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from prometheus_client import Counter, Histogram

from eventlog.errors import DeadlineExceededError, EpochlogError, as_error
from epochlog.api import messages as p
from epochlog.access_control import ANONYMOUS_CALLER, AccessControl, Caller, stamped
from epochlog.api.permissions import call_actions
from statemachines.access import Action
from statemachines.grants import Role

if TYPE_CHECKING:
    from epochlog.metrics import LocklessHistogram

logger = logging.getLogger(__name__)

T = TypeVar("T")


def call_error(exc: BaseException, *, timeout: float | None = None, deadline_passed: bool = False) -> EpochlogError:
    """The error a call ends with: its row of the table. A timeout, or a retriable error raised once the
    call's deadline passed (a wait the deadline cut: not caught up, no leader yet...), is
    `deadline_exceeded`, naming what the call was waiting for."""
    error = as_error(exc)
    if not (isinstance(exc, TimeoutError) or (deadline_passed and error.retriable)):
        return error
    waited = "" if timeout is None else f" of {timeout:.3g} s"
    detail = "" if error.code == DeadlineExceededError.code else f": {error}"
    return DeadlineExceededError(f"the deadline{waited} passed before the call completed{detail}")


def wire_error(error: EpochlogError, leader_address: str = "") -> p.WireError:
    """The native protocol's form of an error (`leader_address`: the leader's client address, if known)."""
    return p.WireError(error.code, str(error), error.retriable, error.leader_hint, leader_address)


@dataclass(frozen=True, slots=True)
class Failed:
    """A call's outcome when it failed: its row of the error table."""

    error: EpochlogError


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """A call's outcome when it completed: what it returned."""

    result: T


@dataclass(frozen=True, slots=True)
class FaceRules:
    """What differs between faces, stated once per face.

    `metrics_prefix`: prefixed to the op in the metrics' label (gRPC's are `grpc_put`...).
    `grace_s`: how much later than its deadline a call is cut. The node's own waits (read barriers)
    get the deadline and fail first, saying what they waited for; the cut is for what has no timeout
    of its own (a write waiting for its commit).
    `late_retriable_is_deadline`: a retriable error raised once the deadline passed is reported as
    `deadline_exceeded` (gRPC, whose clients expect DEADLINE_EXCEEDED at their deadline); the native
    face reports it as itself, so the SDK retries it elsewhere within its own deadline."""

    metrics_prefix: str = ""
    grace_s: float = 0.0
    late_retriable_is_deadline: bool = False


class RpcMetrics(Protocol):
    """What the runner observes (epochlog.metrics.Metrics has them)."""

    rpc_seconds: Histogram | LocklessHistogram   # labels: op
    rpc_errors: Counter        # labels: op, code


class Cancellable(Protocol):
    """Work started and not awaited (a task, a proposal's `Told`, a started call): cancelled when its
    caller no longer waits for it."""

    def cancel(self) -> bool: ...


Tell = Callable[[T | BaseException], None]
"""How started work tells its outcome, once: what it returned, or the error it ended with."""


class CallRunner:
    """Runs the calls of one face of a node; see the module docstring. Use on the node's loop."""

    def __init__(self, rules: FaceRules, metrics: RpcMetrics | None = None,
                 access: AccessControl | None = None) -> None:
        self.rules = rules
        self.metrics = metrics
        self.access = access

    # --- the hook of issue 21 ---------------------------------------------------------------------

    def authorize(self, caller: Caller, op: str, call: object) -> None:
        """Raise (AuthenticationError, PermissionDeniedError) unless `caller` may make `call` (`op` names
        it, as in the metrics). Every call of every face passes here before it runs: the one place
        authorization is enforced. `call` is a native call (epochlog/api/messages.py), or a tuple of them
        (a gRPC batch); its writes' events get the principal as their actor, in place, before they run."""
        access = self.access
        if access is None or not access.enforce:
            return
        principal = access.authenticate(caller, op)
        calls = call if isinstance(call, tuple) else (call,)
        actions: list[Action] = []
        for one in calls:
            actions.extend(call_actions(one))
        access.check(principal, self.rules.metrics_prefix + op, actions)
        if principal.has(Role.NODE):
            return   # another node writing for its own client (the Kafka face's CreateTopics): signed there
        for one in calls:
            if isinstance(one, p.Write):
                one.events = stamped(one.events, principal.name)

    # --- running ----------------------------------------------------------------------------------

    def now(self, op: str, call: object, work: Callable[[], T], caller: Caller = ANONYMOUS_CALLER) -> Done[T] | Failed:
        """Run `work`, a call that completes without waiting, in the caller's turn of the loop."""
        started = time.perf_counter()
        try:
            self.authorize(caller, op, call)
            outcome: Done[T] | Failed = Done(work())
        except Exception as exc:  # every error is an outcome; the face lives on
            outcome = Failed(self.error(op, exc))
        self.observe(op, started)
        return outcome

    async def run(self, op: str, call: object, work: Callable[[], Coroutine[Any, Any, T]], timeout: float | None,
                  caller: Caller = ANONYMOUS_CALLER, *, observe: bool = True) -> Done[T] | Failed:
        """Await `work()` in the current task, cut `timeout` (+ the face's grace) seconds from now;
        None: no deadline (a watch lives until cancelled or failed). A cancellation that is not the
        deadline's (the connection went, the client cancelled) propagates. `observe`: count the
        latency (not a watch's lifetime)."""
        started = time.perf_counter()
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout + self.rules.grace_s,
                                                                                   expire)
        try:
            self.authorize(caller, op, call)
            return Done(await work())
        except asyncio.CancelledError:
            if not expired:
                raise
            task.uncancel()
            return self.failed(op, TimeoutError(), started, timeout)
        except Exception as exc:
            return self.failed(op, exc, started, timeout)
        finally:
            if timer is not None:
                timer.cancel()
            if observe:
                self.observe(op, started)

    def start(self, op: str, call: object, begin: Callable[[Tell[T]], Cancellable], timeout: float,
              caller: Caller, done: Callable[[Done[T] | Failed], None]) -> Cancellable | None:
        """`run` without a task: `begin(tell)` starts the work, which tells its outcome to `tell`; `done`
        gets the call's outcome once, in the turn the work told it, from the deadline's timer (`timeout`
        + the face's grace; the work is then cancelled), or at once when the call is refused or `begin`
        raises. The same authorization, outcomes and metrics as `run`. Returns the running call (None
        when it ended at once): cancel it when the caller goes (its connection), and `done` is not
        called after that."""
        started = _StartedCall(self, op, timeout, done)
        try:
            self.authorize(caller, op, call)
            work = begin(started.tell)
        except Exception as exc:
            started.tell(exc)
            return None
        started.running(work, self.rules.grace_s)
        return None if started.over else started

    # --- outcomes ---------------------------------------------------------------------------------

    def failed(self, op: str, exc: BaseException, started: float, timeout: float | None) -> Failed:
        """The outcome of a call started at `started` (time.perf_counter()) that ended with `exc`: whether
        its deadline had passed decides how a retriable error is reported (`call_error`)."""
        late = timeout is not None and time.perf_counter() - started >= timeout - 0.001
        return Failed(self.error(op, exc, timeout=timeout, deadline_passed=late))

    def error(self, op: str, exc: BaseException, *, timeout: float | None = None,
              deadline_passed: bool = False) -> EpochlogError:
        """`exc` as the row the face reports, counted under `op` (a bug is logged with its traceback)."""
        error = call_error(exc, timeout=timeout,
                           deadline_passed=deadline_passed and self.rules.late_retriable_is_deadline)
        if error.code == EpochlogError.code:
            logger.error("%s%s failed", self.rules.metrics_prefix, op or "a request", exc_info=exc)
        if self.metrics is not None:
            self.metrics.rpc_errors.labels(self.rules.metrics_prefix + op, error.code).inc()
        return error

    def observe(self, op: str, started: float) -> None:
        """Count a call's latency under `op` (from `started`, a time.perf_counter())."""
        if self.metrics is not None:
            self.metrics.rpc_seconds.labels(self.rules.metrics_prefix + op).observe(time.perf_counter() - started)


__all__ = ["CallRunner", "Done", "FaceRules", "Failed", "RpcMetrics", "call_error", "wire_error"]


class _StartedCall(Generic[T]):
    """A call `CallRunner.start` runs: the deadline's timer, the work, and `done` told once."""

    __slots__ = ("runner", "op", "timeout", "done", "started", "work", "timer", "over")

    def __init__(self, runner: CallRunner, op: str, timeout: float, done: Callable[[Done[T] | Failed], None]) -> None:
        self.runner = runner
        self.op = op
        self.timeout = timeout
        self.done = done
        self.started = time.perf_counter()
        self.work: Cancellable | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.over = False

    def running(self, work: Cancellable, grace_s: float) -> None:
        """`begin` returned `work`: cut it at the deadline (unless it already told its outcome)."""
        if self.over:
            return
        self.work = work
        self.timer = asyncio.get_running_loop().call_later(self.timeout + grace_s, self._expire)

    def tell(self, outcome: T | BaseException) -> None:
        """The work's outcome (or the refusal): the call's, as `CallRunner.run` makes it."""
        if self.over:
            return
        if isinstance(outcome, BaseException):
            self._end(self.runner.failed(self.op, outcome, self.started, self.timeout))
        else:
            self._end(Done(outcome))

    def cancel(self) -> bool:
        """The caller went: stop the work, tell nothing (the latency is counted, as for a cancelled task)."""
        if self.over:
            return False
        self._close()
        return True

    def _expire(self) -> None:
        if not self.over:
            self._end(self.runner.failed(self.op, TimeoutError(), self.started, self.timeout))

    def _end(self, outcome: Done[T] | Failed) -> None:
        self._close()
        self.done(outcome)

    def _close(self) -> None:
        self.over = True
        if self.timer is not None:
            self.timer.cancel()
        if self.work is not None:
            self.work.cancel()   # a no-op for work that told its outcome
        self.runner.observe(self.op, self.started)
