"""Linearizability checker for a history of KV operations (Wing & Gong's search, with Lowe's and
Porcupine's memoization).

Theory of operation. A history is linearizable when every operation can be given a point between
its invocation and its return such that, taken in the order of those points, the operations are a
legal sequential execution of the model. The model here is one register per key (put, cas, get),
and operations on different keys commute, so the history is split by key and each part checked on
its own (P-compositionality).

For one key, the search walks a linked list of call and return events in real-time order. At a
call it tries to linearize that operation now (apply it to the model state): if the model accepts
it and the pair (set of linearized ops, state) was not explored before, it lifts the call and its
return out of the list and continues from the head. Reaching a return event means the operation
ending there was not linearized before it returned: backtrack to the last choice and try the next
call. The history is linearizable when the list empties.

Operations with an unknown outcome (history.Status.UNKNOWN writes) have their return at infinity
and accept any output: they may be placed anywhere after their invocation, and placing one after
everything else is the same as "it never took effect".
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.sim.history import Operation, Status

_INF = 1 << 62


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    key: str = ""
    detail: str = ""
    inconclusive: bool = False   # the search budget ran out (not a failure)


def _step(state: int | None, op: Operation) -> tuple[bool, int | None]:
    """The register model: (op's output is possible in `state`, state after op)."""
    known = op.status is Status.OK
    if op.kind == "put":
        return True, op.a
    if op.kind == "cas":
        success = state == op.a
        if known and op.output != success:
            return False, state
        return True, (op.b if success else state)
    assert op.kind == "get", op.kind
    return (not known or op.output == state), state


def check_key(ops: list[Operation], budget: int = 2_000_000) -> tuple[bool | None, list[Operation]]:
    """Is this single-key history linearizable? (None when the budget ran out.)

    Also returns the longest linearized prefix found, for failure reports.
    """
    n = len(ops)
    if n == 0:
        return True, []
    # Node 2i is the call of ops[i], node 2i+1 its return; node 2n is the head sentinel.
    events = []
    for i, op in enumerate(ops):
        events.append((op.invoke, 2 * i))
        events.append((op.ret if op.ret is not None else _INF + op.invoke, 2 * i + 1))
    events.sort()
    head = 2 * n
    nxt = [-1] * (2 * n + 1)
    prv = [-1] * (2 * n + 1)
    last = head
    for _, node in events:
        nxt[last] = node
        prv[node] = last
        last = node

    def lift(i: int) -> None:
        for node in (2 * i, 2 * i + 1):
            nxt[prv[node]] = nxt[node]
            if nxt[node] != -1:
                prv[nxt[node]] = prv[node]

    def unlift(i: int) -> None:
        for node in (2 * i + 1, 2 * i):
            nxt[prv[node]] = node
            if nxt[node] != -1:
                prv[nxt[node]] = node

    cache: set[tuple[int, int | None]] = set()
    stack: list[tuple[int, int | None]] = []
    longest: list[int] = []
    state: int | None = None
    linearized = 0
    entry = nxt[head]
    steps = 0
    while nxt[head] != -1:
        steps += 1
        if steps > budget:
            return None, [ops[i] for i in longest]
        if entry % 2 == 0:  # a call: try to linearize it here
            i = entry // 2
            ok, new_state = _step(state, ops[i])
            if ok:
                new_linearized = linearized | (1 << i)
                if (new_linearized, new_state) not in cache:
                    cache.add((new_linearized, new_state))
                    stack.append((i, state))
                    state, linearized = new_state, new_linearized
                    lift(i)
                    if len(stack) > len(longest):
                        longest = [j for j, _ in stack]
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
        else:  # a return whose call is still in the list: backtrack
            if not stack:
                return False, [ops[i] for i in longest]
            i, state = stack.pop()
            linearized &= ~(1 << i)
            unlift(i)
            entry = nxt[2 * i]
    return True, []


def check_history(ops: list[Operation], budget: int = 2_000_000) -> Verdict:
    """Check every key's sub-history (ops: OK operations and unknown writes, see History)."""
    by_key: dict[str, list[Operation]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    inconclusive = ""
    for key in sorted(by_key):
        part = by_key[key]
        ok, prefix = check_key(part, budget)
        if ok is None:
            inconclusive = key
            continue
        if not ok:
            placed = {op.id for op in prefix}
            rest = sorted((op for op in part if op.id not in placed), key=lambda op: op.invoke)
            lines = ["longest linearization: " + ", ".join(f"#{op.id}" for op in prefix[-8:]),
                     "ops not placed (first 8):"] + ["  " + op.describe() for op in rest[:8]]
            return Verdict(False, key, f"key {key!r}: {len(part)} ops, not linearizable\n" + "\n".join(lines))
    if inconclusive:
        return Verdict(True, inconclusive, "search budget exhausted", inconclusive=True)
    return Verdict(True)
