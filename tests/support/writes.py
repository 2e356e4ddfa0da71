"""A stream of writes to one group of a NodeCluster that records every acknowledgement, and the check that
acknowledged records are in the replicas' logs.

Theory of operation. `WriteStream` runs `proposers` writers on an event loop of its own thread (so the
test's thread stays free to kill, pause and partition nodes and to poll their status). Each writer
sends `batch` new events per write, over the native protocol, to the one node the stream believes
leads the group (one connection per node, no SDK routing: the node that acknowledges is the node
asked); a `not_leader` answer moves the shared guess to the leader it names, a node that cannot be
reached moves it to the next node. Every write is new: keys `<proposer>/<attempt>/<j>`, so an
acknowledged offset names exactly one expected record (the event's `event_record`, byte for byte).
A reply other than the result (a timeout, a dropped connection, another error) is indeterminate: the
write may or may not commit.

Events are kv puts for the `kv` group and consumer-offset commits for `offsets` (the two groups no
controller or broker writes to).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from epochlog.api import messages as p
from epochlog.client.connection import Connection
from epochlog.client.errors import ClientError
from statemachines import events as ev
from tests.support.nodes import NodeCluster
from tests.support.offline import OfflineLog

CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Ack:
    """A write acknowledged by its node: `records` are at offsets offset, offset + 1, ..."""

    offset: int
    records: tuple[tuple[bytes, bytes], ...]   # (key, value) as the log holds them
    node: int
    sent: float      # monotonic
    acked: float     # monotonic


def _event(group: str, proposer: int, attempt: int, j: int, value_bytes: int) -> ev.Event:
    tag = f"{proposer}/{attempt}/{j}"
    if group == "offsets":
        return ev.OffsetCommitted(consumer_group=f"w{proposer}", topic=f"t{attempt}", queue_id=j, offset=attempt)
    assert group == "kv", f"WriteStream writes to kv or offsets, not {group!r}"
    return ev.KvPut(name=f"stream/{tag}", value=f"{tag}=".encode().ljust(value_bytes, b"v"))


@dataclass
class WriteStream:
    """`proposers` concurrent writers of new events to the leader of `group` (see the module docstring).

    Read `acks`, `indeterminate`, `not_leader` and `refused` from the test's thread while it runs (they
    only grow); `stop()` ends it.
    """

    cluster: NodeCluster
    group: str
    proposers: int = 4
    batch: int = 2
    value_bytes: int = 48
    request_timeout_s: float = 1.0
    acks: list[Ack] = field(default_factory=list)
    indeterminate: int = 0
    not_leader: int = 0
    refused: dict[int, dict[str, int]] = field(default_factory=dict)   # node -> error code -> count
    _target: int = 1
    _stopping: bool = False
    _thread: threading.Thread | None = None
    _conns: dict[int, Connection] = field(default_factory=dict)

    def start(self) -> None:
        self._target = next(iter(self.cluster.running()), 1)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        self.cluster.on_close(self.stop)   # a failed test leaves no writer behind

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the writers and wait for their thread (idempotent)."""
        self._stopping = True
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the write stream did not stop within {timeout}s"

    def summary(self) -> str:
        return f"{len(self.acks)} acks, {self.indeterminate} indeterminate, {self.not_leader} not-leader replies"

    async def _main(self) -> None:
        try:
            await asyncio.gather(*(self._run(n) for n in range(self.proposers)))
        finally:
            for conn in self._conns.values():
                await conn.close()

    def _rotate(self, away_from: int) -> None:
        if self._target == away_from:
            ids = sorted(self.cluster.nodes)
            self._target = ids[(ids.index(away_from) + 1) % len(ids)]

    async def _connection(self, node: int) -> Connection | None:
        conn = self._conns.get(node)
        if conn is not None and conn.open:
            return conn
        self._conns.pop(node, None)
        conn = Connection(self.cluster.endpoint(node), client_name="write-stream")
        try:
            await conn.connect(CONNECT_TIMEOUT_S)
        except (ClientError, OSError, TimeoutError):
            return None
        if node in self._conns:   # another writer connected meanwhile
            await conn.close()
            return self._conns[node]
        self._conns[node] = conn
        return conn

    async def _run(self, proposer: int) -> None:
        attempt = 0
        while not self._stopping:
            target = self._target
            conn = await self._connection(target) if self.cluster.nodes[target].running else None
            if conn is None:
                self._rotate(target)
                await asyncio.sleep(0.01)
                continue
            attempt += 1
            events = [_event(self.group, proposer, attempt, j, self.value_bytes) for j in range(self.batch)]
            sent = time.monotonic()
            try:
                result = await conn.call(p.Write(events), self.request_timeout_s)
            except ClientError as exc:
                if exc.code == "not_leader":
                    self.not_leader += 1
                    if exc.leader_hint and exc.leader_hint != target:
                        self._target = exc.leader_hint
                    else:
                        self._rotate(target)
                elif exc.code == "unavailable":   # the connection failed, or the node did not answer
                    self.indeterminate += 1
                    self._rotate(target)
                else:   # refused (disk_full), or dropped by a leadership change or a failed group
                    self.indeterminate += 1
                    codes = self.refused.setdefault(target, {})
                    codes[exc.code] = codes.get(exc.code, 0) + 1
                await asyncio.sleep(0.02)
                continue
            except (OSError, TimeoutError):
                self.indeterminate += 1
                self._rotate(target)
                await asyncio.sleep(0.01)
                continue
            assert isinstance(result, p.Written), result
            offsets = [r.offset for r in result.results]
            assert all(r.ok for r in result.results), result
            assert offsets == list(range(offsets[0], offsets[0] + len(events))), offsets
            self.acks.append(Ack(offsets[0], tuple(ev.event_record(e) for e in events), target, sent,
                                 time.monotonic()))


def check_acks(acks: Iterable[Ack], logs: dict[int, OfflineLog]) -> int:
    """Every acknowledged record is in every log that still holds its offset, with its content.

    Returns how many (record, log) pairs were checked."""
    checked = 0
    for ack in acks:
        for node, log in logs.items():
            for j, (key, value) in enumerate(ack.records):
                offset = ack.offset + j
                if offset < log.start:
                    continue  # compacted into a snapshot (compared through the views)
                found = log.record_at(offset)
                assert found == (key, value), (
                    f"acknowledged offset {offset} ({key!r}, acked by node {ack.node}) is {found!r} on "
                    f"node {node} (log [{log.start}, {log.end}))")
                checked += 1
    return checked
