"""The client-visible history of KV operations, for the linearizability checker.

Every event (an operation's invocation or its return) takes the next number of one counter, so the
history is a total order of events in simulated real time, finer than ticks. An operation ends in
one of three ways:

- OK: the client saw its output (the proposal was applied at the index it was proposed at, or a
  read was served);
- FAILED: it certainly had no effect (the core refused it, or its index was later applied with an
  entry of another term: entries never move, so it can never commit). It leaves the history;
- UNKNOWN: the client stopped waiting (timeout, crash of the node it talked to, a snapshot skipped
  its index). A write may or may not have taken effect, at any time after its invocation; an
  unknown read has no effect and leaves the history.

Not thread-safe; one per simulated cluster.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.Enum):
    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Operation:
    id: int
    client: int
    kind: str                  # "put" | "cas" | "get"
    key: str
    a: int | None              # put: value; cas: expected
    b: int | None              # cas: new value
    via: str                   # "log" | "read_index" | "lease" (how it was served)
    node: int                  # the node the client talked to
    invoke: int                # event number of the invocation
    ret: int | None = None     # event number of the return (None unless OK)
    output: int | bool | None = None
    status: Status = Status.PENDING

    def describe(self) -> str:
        args = {"put": f"{self.a}", "cas": f"{self.a}->{self.b}", "get": ""}[self.kind]
        out = "?" if self.status is not Status.OK else repr(self.output)
        end = "inf" if self.ret is None else str(self.ret)
        return (f"#{self.id} c{self.client} {self.kind}({self.key}{', ' if args else ''}{args}) -> {out} "
                f"[{self.invoke}, {end}] via {self.via}@n{self.node}")


class History:
    def __init__(self) -> None:
        self.ops: list[Operation] = []
        self._events = 0

    def _next(self) -> int:
        self._events += 1
        return self._events

    def invoke(self, client: int, kind: str, key: str, a: int | None, b: int | None, *, via: str,
               node: int) -> Operation:
        op = Operation(len(self.ops) + 1, client, kind, key, a, b, via, node, self._next())
        self.ops.append(op)
        return op

    def ok(self, op: Operation, output: int | bool | None) -> None:
        assert op.status is Status.PENDING, op.describe()
        op.status, op.ret, op.output = Status.OK, self._next(), output

    def failed(self, op: Operation) -> None:
        assert op.status is Status.PENDING, op.describe()
        op.status = Status.FAILED

    def unknown(self, op: Operation) -> None:
        if op.status is Status.PENDING:
            op.status = Status.UNKNOWN

    def close(self) -> None:
        """The run is over: whatever is still pending has an unknown outcome."""
        for op in self.ops:
            self.unknown(op)

    def checked_ops(self) -> list[Operation]:
        """The operations the linearizability checker must place: OK ones and unknown writes."""
        return [op for op in self.ops
                if op.status is Status.OK or (op.status is Status.UNKNOWN and op.kind != "get")]
