"""The blocking client: an AsyncClient driven by a private event loop on a background thread.

Thread-safe: calls from many threads share the client's connections (and its frame coalescing).
A calling thread waits at most the call's timeout plus `WAIT_GRACE_S`, whatever happens on the loop
thread (a call never outlives its deadline, even if the loop is stuck).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from epochlog.api import messages as p
from epochlog.client.aio import AsyncClient, Entity, History, KeyValue, Page, WatchedEvent
from epochlog.client.errors import ClientError, DeadlineExceededError

T = TypeVar("T")

WAIT_GRACE_S = 1.0   # beyond the call's own bound (its timeout plus the network grace), for a busy loop


class Client:
    """Blocking counterpart of AsyncClient: same methods, same arguments, same results."""

    def __init__(self, endpoints: Sequence[str] | str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="epochlog-client", daemon=True)
        self._thread.start()
        self.aio = AsyncClient(endpoints, **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the client's loop; DeadlineExceededError (and the coroutine cancelled) if
        it has not finished within `timeout` (default: the client's) plus WAIT_GRACE_S."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        limit = (self.aio.timeout if timeout is None else timeout) + WAIT_GRACE_S
        try:
            return future.result(limit)
        except TimeoutError:
            if future.done() and not future.cancelled():
                return future.result()   # finished as the wait ran out
            future.cancel()
            raise DeadlineExceededError(f"the call did not finish within {limit:.1f} s (the client's loop is "
                                        f"stuck or starved)") from None

    @property
    def _member_s(self) -> float:
        return max(self.aio.timeout, 30.0)   # as AsyncClient's membership calls

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.aio.close())
        except DeadlineExceededError:
            pass   # a stuck loop: its connections go with it
        # Not a bare loop.stop: a call the stuck loop has not started yet (close's own, above) would be
        # left a task never stepped, and its coroutine "never awaited".
        asyncio.run_coroutine_threadsafe(_cancel_tasks_then_stop(), self._loop)
        self._thread.join()
        self._loop.close()

    def put(self, name: str, value: bytes, **kw: Any) -> p.WriteResult:
        return self._run(self.aio.put(name, value, **kw))

    def delete(self, name: str, **kw: Any) -> p.WriteResult:
        return self._run(self.aio.delete(name, **kw))

    def get(self, name: str, **kw: Any) -> KeyValue | None:
        return self._run(self.aio.get(name, **kw))

    def list(self, prefix: str = "", **kw: Any) -> Page:
        return self._run(self.aio.list(prefix, **kw))

    def history(self, name: str, **kw: Any) -> History:
        return self._run(self.aio.history(name, **kw))

    def txn(self, ops: Sequence[Any], conditions: Sequence[tuple[str, int]] = ()) -> p.WriteResult:
        return self._run(self.aio.txn(ops, conditions))

    def lease_grant(self, ttl_ms: int) -> p.Lease:
        return self._run(self.aio.lease_grant(ttl_ms))

    def lease_keepalive(self, lease_id: int) -> int:
        return self._run(self.aio.lease_keepalive(lease_id))

    def lease_revoke(self, lease_id: int) -> p.WriteResult:
        return self._run(self.aio.lease_revoke(lease_id))

    def command(self, event: Any) -> p.WriteResult:
        return self._run(self.aio.command(event))

    def commands(self, events: Sequence[Any]) -> list[p.WriteResult]:
        return self._run(self.aio.commands(events))

    def get_entity(self, key: str, **kw: Any) -> Entity | None:
        return self._run(self.aio.get_entity(key, **kw))

    def get_many(self, keys: Sequence[str], **kw: Any) -> list[Entity | None]:
        return self._run(self.aio.get_many(keys, **kw))

    def list_entities(self, prefix: str, **kw: Any) -> Page:
        return self._run(self.aio.list_entities(prefix, **kw))

    def entity_history(self, key: str, **kw: Any) -> History:
        return self._run(self.aio.entity_history(key, **kw))

    def read_events(self, group: str, from_offset: int, **kw: Any) -> p.Events:
        return self._run(self.aio.read_events(group, from_offset, **kw))

    def read_log(self, group: str, from_offset: int, **kw: Any) -> p.LogBatches:
        return self._run(self.aio.read_log(group, from_offset, **kw))

    def status(self, endpoint: str | None = None) -> p.StatusInfo:
        return self._run(self.aio.status(endpoint))

    def cluster_status(self) -> list[p.StatusInfo | ClientError]:
        return self._run(self.aio.cluster_status(), 2 * self.aio.timeout)   # one node, then every member

    def transfer_leader(self, group: str, to: int = 0) -> None:
        self._run(self.aio.transfer_leader(group, to))

    def snapshot(self, group: str, endpoint: str | None = None) -> int:
        return self._run(self.aio.snapshot(group, endpoint), 2 * self.aio.timeout)   # find the leader, then ask it

    def compaction_status(self, endpoint: str | None = None) -> p.CompactionInfo:
        return self._run(self.aio.compaction_status(endpoint))

    def members(self) -> p.Members:
        return self._run(self.aio.members())

    def member_add(self, node_id: int, peer_address: str, client_address: str = "", **kw: Any) -> p.Members:
        return self._run(self.aio.member_add(node_id, peer_address, client_address, **kw), self._member_s)

    def member_promote(self, node_id: int, **kw: Any) -> p.Members:
        return self._run(self.aio.member_promote(node_id, **kw), self._member_s)

    def member_remove(self, node_id: int, **kw: Any) -> p.Members:
        return self._run(self.aio.member_remove(node_id, **kw), self._member_s)

    def watch(self, prefix: str, *, from_offset: int = -1, window: int = 4096) -> Iterator[WatchedEvent]:
        """Events under `prefix` as they commit; stop by closing the iterator (or breaking out of a for)."""
        items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=window)
        stop = threading.Event()

        async def pump() -> None:
            try:
                async for event in self.aio.watch(prefix, from_offset=from_offset, window=window):
                    while not stop.is_set():
                        try:
                            items.put_nowait(("event", event))
                            break
                        except queue.Full:
                            await asyncio.sleep(0.005)
                    if stop.is_set():
                        return
            except BaseException as exc:  # handed to the consuming thread
                items.put(("error", exc))

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                kind, value = items.get()
                if kind == "error":
                    raise value
                yield value
        finally:
            stop.set()
            future.cancel()


async def _cancel_tasks_then_stop() -> None:
    """Cancel every other task of the running loop, wait for them to end, then stop the loop."""
    loop = asyncio.get_running_loop()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    loop.stop()
