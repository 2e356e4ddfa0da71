"""Simulated clients: each issues one KV operation at a time against the node it thinks leads.

Operations (weights drawn per seed): put and cas proposed through the log, get proposed through
the log ("get-as-write"), get via ReadIndex (`read_index`) and get via the leader lease
(`lease_read_index`). A client whose node is not the leader follows the NotLeaderError hint (or
tries a random node); refusals (NotLeaderError, ProposalDroppedError, no lease) never reach the
history -- they certainly had no effect. An invoked operation completes when the replica sees it
applied or served (see replica.py and history.py), or becomes unknown when the client gives up
after `timeout_ticks`.

Not thread-safe; one per simulated cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eventlog.raft.errors import ConfChangeError, NotLeaderError, ProposalDroppedError
from tests.sim.history import History, Operation
from tests.sim.kv import encode_op
from tests.sim.replica import Waiter

if TYPE_CHECKING:
    from tests.sim.cluster import Cluster


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    clients: int = 3
    keys: int = 2
    issue_prob: float = 0.3        # per idle client per tick
    timeout_ticks: int = 60
    max_count: int = 1             # indexes per proposed entry: 1..max_count
    weights: tuple[int, int, int, int, int] = (4, 2, 1, 2, 2)   # put, cas, get-log, read_index, lease


_KINDS = ("put", "cas", "get", "read_index", "lease")


@dataclass(slots=True)
class Client:
    id: int
    leader_guess: int = 0
    waiter: Waiter | None = None
    node: int = 0
    deadline: int = 0
    seen: list[int] = field(default_factory=list)   # values it has read or written (cas expectations)


class Workload:
    def __init__(self, cluster: Cluster, history: History, rng: random.Random, params: WorkloadParams) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = rng
        self.p = params
        self.clients = [Client(i + 1) for i in range(params.clients)]
        self.keys = [f"k{i}" for i in range(params.keys)]
        self._next_value = 0
        self._next_read = 0
        self.enabled = True

    def step(self, now: int) -> None:
        for c in self.clients:
            if c.waiter is not None:
                if now >= c.deadline:
                    self._give_up(c)
                continue
            if self.enabled and self.rng.random() < self.p.issue_prob:
                self.issue(c, now)

    def _give_up(self, c: Client) -> None:
        w = c.waiter
        assert w is not None
        r = self.cluster.replicas.get(c.node)
        if r is not None:
            r.forget(w)
        self.history.unknown(w.op)
        c.waiter = None

    def _done(self, c: Client, op: Operation) -> None:
        if c.waiter is not None and c.waiter.op is op:
            c.waiter = None
            if op.output is not None and not isinstance(op.output, bool):
                c.seen.append(op.output)
                del c.seen[:-8]

    def issue(self, c: Client, now: int, kind: str | None = None, key: str | None = None) -> Operation | None:
        """Try one operation; returns it if it was invoked (the core accepted it)."""
        rng = self.rng
        live = self.cluster.reachable_ids()
        if not live:
            return None
        target = c.leader_guess if c.leader_guess in live else rng.choice(live)
        r = self.cluster.replicas[target]
        node = r.node
        assert node is not None
        kind = kind or rng.choices(_KINDS, weights=self.p.weights)[0]
        key = key or rng.choice(self.keys)
        waiter: Waiter | None = None
        try:
            if kind in ("put", "cas", "get"):
                a = b = None
                if kind == "put":
                    a = self._value()
                elif kind == "cas":
                    a = rng.choice(c.seen) if c.seen and rng.random() < 0.8 else None
                    b = self._value()
                op_id = len(self.history.ops) + 1
                data = encode_op(op_id, kind, key, a, b)
                count = rng.randint(1, self.p.max_count)
                index = node.propose(data, count)
                op = self.history.invoke(c.id, kind, key, a, b, via="log", node=target)
                assert op.id == op_id
                waiter = Waiter(op, lambda o, c=c: self._done(c, o), term=node.term, data=data)
                r.proposals[index] = waiter
            elif kind == "read_index":
                self._next_read += 1
                node.read_index(self._next_read)
                op = self.history.invoke(c.id, "get", key, None, None, via="read_index", node=target)
                waiter = Waiter(op, lambda o, c=c: self._done(c, o))
                r.index_reads[self._next_read] = waiter
            else:
                index = node.lease_read_index()
                if index is None:
                    c.leader_guess = node.leader if node.leader != node.id else 0
                    return None
                r.hooks.lease_read(r, node.term, index)
                op = self.history.invoke(c.id, "get", key, None, None, via="lease", node=target)
                waiter = Waiter(op, lambda o, c=c: self._done(c, o))
                r.ready_reads.append((index, waiter))
        except NotLeaderError as e:
            c.leader_guess = e.leader_hint
            return None
        except (ProposalDroppedError, ConfChangeError):
            return None
        c.waiter, c.node, c.deadline = waiter, target, now + self.p.timeout_ticks
        c.leader_guess = target
        r.observe()
        r.serve_reads()
        return waiter.op

    def _value(self) -> int:
        self._next_value += 1
        return self._next_value

    def idle(self) -> bool:
        return all(c.waiter is None for c in self.clients)
