"""A group's proposals on this node, from `submit` until their entry commits: queued, coalesced, awaited.

Proposals from any number of coroutines wait in a queue until the group's loop next turns; then
everything queued becomes as few entries as `max_batch_bytes` allows, one record batch each (a
proposal with a Kafka producer stamp is an entry of its own, whose batch header carries the stamp).
Each caller's future (or `Told` callback) waits under the entry's index with the term it was proposed
in: it resolves with its offsets and apply outcomes once that entry is applied in the same term, and fails with
ProposalDroppedError when another leader's entry (or a later one) takes the index. Membership
changes wait the same way for their CONF_CHANGE entry.

The state machine may be told what each entry holds as it is proposed (`on_proposed(index, data,
records)`: the bytes of the batch and the (key, value) pairs encoded in it), so the leader's applier
can take the records from there instead of parsing the batch again (statemachines/apply.py,
`Applier.proposed`: it uses them only for an entry whose bytes are the ones built here).

Concurrency contract: call only from the group's loop task (its `RaftGroup` owns one `Proposals`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventlog.raft.errors import ProposalDroppedError, RaftError
from eventlog.raft.node import RaftNode
from eventlog.raft.types import ConfState, Entry, EntryKind
from eventlog.records import HEADER_SIZE, encode_batch

if TYPE_CHECKING:
    from eventlog.raft.runtime.group import GroupCounters


logger = logging.getLogger(__name__)

OnProposed = Callable[[int, bytes, list[tuple[bytes | None, bytes | None]]], None]
"""Told of each entry proposed: its index, its batch's bytes as proposed (before the log stamps its
base offset and term) and the records encoded in them, in order."""


@dataclass(frozen=True, slots=True)
class Committed:
    """Where proposed records were committed, and what applying each one did (None: no outcome)."""

    offset: int
    outcomes: tuple[object | None, ...]


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    """A Kafka idempotent producer's (id, epoch, base sequence): its records become one entry whose
    batch header carries them, so producer state can be rebuilt from the log (epochlog/kafka)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int


class Told:
    """A proposal's waiter that is told at once: `then(committed or the error)` runs in the turn that
    applies (or drops) the entry, where a future's awaiting task would run a loop turn later. For a
    caller that answers from there (the client face's writes: epochlog/calls.py `CallRunner.start`).
    `then` runs at most once, never after `cancel`; an exception it raises is logged, not raised into
    the group's turn."""

    __slots__ = ("_then", "_done")

    def __init__(self, then: Callable[[Committed | BaseException], None]) -> None:
        self._then = then
        self._done = False

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        """The caller no longer waits (its deadline passed, its connection went)."""
        was = self._done
        self._done = True
        return not was

    def set_result(self, result: Committed) -> None:
        self._tell(result)

    def set_exception(self, exc: BaseException) -> None:
        self._tell(exc)

    def _tell(self, outcome: Committed | BaseException) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._then(outcome)
        except Exception:   # a bug of the caller's: the group's turn goes on
            logger.exception("a proposal's waiter failed")


Waiter = asyncio.Future[Committed] | Told
"""Who waits for a proposal: an awaiting caller's future, or a `Told` callback."""


class Proposal:
    """One `submit` call: its records and who waits for them (`future`: a future or a `Told`)."""

    __slots__ = ("records", "future", "size", "producer", "on_appended")

    def __init__(self, records: list[tuple[bytes | None, bytes | None]],
                 future: Waiter, producer: ProducerStamp | None = None,
                 on_appended: Callable[[int], None] | None = None) -> None:
        self.records = records
        self.future = future
        self.producer = producer
        self.on_appended = on_appended
        # An upper bound of the records' encoded size (RecordBatch v2 spends under 16 bytes of framing
        # per record), so a batch of proposals within max_batch_bytes is one the log accepts.
        self.size = sum(len(k or b"") + len(v or b"") + 16 for k, v in records)


class Proposals:
    """The queued proposals and the callers waiting for their entries (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, counters: GroupCounters,
                 on_proposed: OnProposed | None = None) -> None:
        self.loop = loop
        self.counters = counters
        self.on_proposed = on_proposed
        self.queued: list[Proposal] = []
        # entry index -> (term proposed in, [(waiter, first offset, record count)])
        self._waiters: dict[int, tuple[int, list[tuple[Waiter, int, int]]]] = {}
        self._conf_waiters: dict[int, tuple[int, asyncio.Future[ConfState]]] = {}  # index -> (term, future)

    def queue(self, proposal: Proposal) -> None:
        self.queued.append(proposal)

    def queued_bytes_at_most(self) -> int:
        """An upper bound of the log bytes the queued proposals take (each one a batch at worst)."""
        return sum(p.size for p in self.queued) + HEADER_SIZE * len(self.queued)

    def refuse_queued(self, error: BaseException) -> int:
        """Fail every queued proposal with `error`; how many there were."""
        pending, self.queued = self.queued, []
        for p in pending:
            if not p.future.done():
                p.future.set_exception(error)
        return len(pending)

    def propose_queued(self, node: RaftNode, max_batch_bytes: int) -> None:
        """Turn the queued proposals into entries of the leader `node`, as few as `max_batch_bytes`
        allows, and wait for them. A proposal the core refuses fails with its error, with those after it."""
        pending, self.queued = self.queued, []
        start, n = 0, len(pending)
        while start < n:
            end, size = start, 0
            stamp = pending[start].producer
            while end < n and (end == start or (stamp is None and pending[end].producer is None
                                                and size + pending[end].size <= max_batch_bytes)):
                size += pending[end].size
                end += 1
            batch = pending[start:end]
            records = [r for p in batch for r in p.records]
            if stamp is None:
                data = encode_batch(records, timestamp_ms=int(time.time() * 1000))
            else:
                data = encode_batch(records, timestamp_ms=int(time.time() * 1000), producer_id=stamp.producer_id,
                                    producer_epoch=stamp.producer_epoch, base_sequence=stamp.base_sequence)
            try:
                index = node.propose(data, count=len(records))
            except RaftError as exc:
                for p in pending[start:]:
                    if not p.future.done():
                        p.future.set_exception(exc)
                return
            start = end
            if self.on_proposed is not None:
                self.on_proposed(index, data, records)
            waiters = []
            offset = index
            for p in batch:
                waiters.append((p.future, offset, len(p.records)))
                if p.on_appended is not None:   # runs after this turn wrote the entry to the log (the Ready)
                    self.loop.call_soon(p.on_appended, offset)
                offset += len(p.records)
            self._waiters[index] = (node.term, waiters)

    def wait_conf_change(self, index: int, term: int) -> asyncio.Future[ConfState]:
        """A future for the membership change proposed at `index` in `term`: the configuration after it."""
        future: asyncio.Future[ConfState] = self.loop.create_future()
        self._conf_waiters[index] = (term, future)
        return future

    def resolve(self, committed: tuple[Entry, ...], outcomes: Mapping[int, object],
                conf_at: Callable[[int], ConfState]) -> None:
        """Answer the callers waiting for the applied entries `committed` (with `outcomes` by offset);
        those waiting for an index at or below the last one that did not get their entry lost it. A
        second call for the same entries finds nobody left to answer."""
        if self._conf_waiters:
            self._resolve_conf(committed, conf_at)
        for e in committed:
            waiting = self._waiters.pop(e.index, None)
            if waiting is None:
                continue
            term, futures = waiting
            for future, offset, count in futures:
                if future.done():
                    continue
                if e.term == term and e.kind is EntryKind.NORMAL:
                    future.set_result(Committed(offset, tuple(outcomes.get(o) for o in range(offset, offset + count))))
                    self.counters.proposals_committed += 1
                else:
                    future.set_exception(ProposalDroppedError(
                        f"leadership changed: offset {offset} was committed by another leader"))
        if committed:
            last = committed[-1].last_index
            for index in [i for i in self._waiters if i <= last]:
                for future, _, _ in self._waiters.pop(index)[1]:
                    if not future.done():
                        future.set_exception(ProposalDroppedError("the proposal was overwritten"))

    def _resolve_conf(self, committed: tuple[Entry, ...], conf_at: Callable[[int], ConfState]) -> None:
        for e in committed:
            waiting = self._conf_waiters.pop(e.index, None)
            if waiting is None or waiting[1].done():
                continue
            if e.term == waiting[0] and e.kind is EntryKind.CONF_CHANGE:
                waiting[1].set_result(conf_at(e.index))
            else:
                waiting[1].set_exception(ProposalDroppedError(
                    f"leadership changed: index {e.index} was committed by another leader"))
        last = committed[-1].last_index
        for index in [i for i in self._conf_waiters if i <= last]:
            future = self._conf_waiters.pop(index)[1]
            if not future.done():
                future.set_exception(ProposalDroppedError("the membership change was overwritten"))

    def fail_all(self, error: BaseException) -> None:
        """Fail every queued proposal and every waiter with `error` (the group stops or failed)."""
        for p in self.queued:
            if not p.future.done():
                p.future.set_exception(error)
        self.queued = []
        for _, futures in self._waiters.values():
            for future, _, _ in futures:
                if not future.done():
                    future.set_exception(error)
        self._waiters.clear()
        for _, conf_future in self._conf_waiters.values():
            if not conf_future.done():
                conf_future.set_exception(error)
        self._conf_waiters.clear()
