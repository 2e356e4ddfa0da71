"""What a chaos run watches besides its clients: the kv log as it commits, and a watch consumer.

Theory of operation. Both follow the chaos keys (`chaos/`) from offset 0 while the run goes on,
each with its own SDK client:

- `LogTail` reads committed records with `read_events` (from whichever node is ahead), which says
  of each whether applying it changed the views (`applied`). It is the checker's record of where each value was
  applied (tests/chaos/versions.py), taken before key compaction or a snapshot install can drop the
  records. Where the log no longer holds a range (`compacted`) the tail skips it and says so
  (`coverage`).
- `WatchConsumer` is an ordinary application: it applies the SDK's `watch` in order to its own copy
  of the keys (`Replay`), skipping what the watch marks as not applied (`WatchedEvent.applied`; a
  watch that does not say is taken as applied, as a consumer without the flag would). Offsets must
  strictly increase (the watch promises no gaps and no repeats across node changes). When the watch
  falls behind the log start it re-lists the keys (a linearizable `list` and its applied offset)
  and watches on from there, as a Kubernetes informer does. At the end its copy must equal every
  node's views: value and version of every key.

Use each from the run's asyncio loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from epochlog.client import AsyncClient, ClientError
from epochlog.client.errors import CompactedError
from eventlog.errors import EpochlogError
from statemachines.events import Event, KvDeleted, KvPut, decode_event
from tests.chaos.versions import Coverage, LogRecord

PREFIX = "chaos/"            # the chaos keys (their records: RECORD_PREFIX)
RECORD_PREFIX = "kv/" + PREFIX
_RETRY_S = 0.1


class Replay:
    """Kv events folded in log order into {name: (value, version)}: what applying them yields."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[int, int]] = {}
        self.applied = 0
        self.skipped = 0

    def apply(self, offset: int, event: Event | None, applied: bool | None) -> None:
        if applied is False:
            self.skipped += 1
            return
        if isinstance(event, KvPut):
            self.state[event.name] = (int(event.value), offset)
        elif isinstance(event, KvDeleted):
            self.state.pop(event.name, None)
        self.applied += 1

    def reset(self, state: dict[str, tuple[int, int]]) -> None:
        self.state = dict(state)


class LogTail:
    """The committed kv records of the chaos keys, read from offset 0 on (see the module docstring).

    Any node's applied records are committed ones, so the tail reads from one node at a time and asks
    the next one whenever a read fails or brings nothing new: a node cut off from its peers, or
    paused, stops moving while the others go on, and the cleaner may compact what the tail has not
    read yet. A range is skipped (a gap) only when every node says it no longer holds it."""

    def __init__(self, endpoints: Sequence[str], timeout: float = 1.0) -> None:
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.records: dict[int, LogRecord] = {}
        self.events: list[tuple[int, Event | None, bool | None]] = []   # (offset, event, applied), in order
        self.next_offset = 0
        self.gaps: list[tuple[int, int]] = []
        self.stop = asyncio.Event()
        self._at = 0                                  # the node asked next (index into endpoints)
        self._compacted: dict[str, int] = {}          # node -> its log start, when it refused next_offset

    @property
    def coverage(self) -> Coverage:
        return Coverage(0, self.next_offset, tuple(self.gaps))

    async def run(self) -> None:
        """Follow the log until `stop`."""
        async with AsyncClient(self.endpoints, timeout=self.timeout) as client:
            while not self.stop.is_set():
                if not await self._step(client):
                    try:
                        await asyncio.wait_for(self.stop.wait(), _RETRY_S)
                    except TimeoutError:
                        pass

    async def drain(self, through: int, timeout: float) -> bool:
        """Read on until every record through `through` is in (after `run` stopped); False past `timeout`."""
        deadline = time.monotonic() + timeout
        async with AsyncClient(self.endpoints, timeout=self.timeout) as client:
            while self.next_offset <= through:
                if time.monotonic() > deadline:
                    return False
                if not await self._step(client):
                    await asyncio.sleep(_RETRY_S)
        return True

    async def _step(self, client: AsyncClient) -> bool:
        """Read one chunk from the current node; whether it got anywhere."""
        endpoint = self.endpoints[self._at]
        try:
            got = await client.read_events("kv", self.next_offset, max_events=1000, endpoint=endpoint)
        except CompactedError:
            try:   # asked past its end, a node says where its log starts
                start = (await client.read_events("kv", 1 << 62, max_events=1, endpoint=endpoint)).log_start
                self._compacted[endpoint] = start
            except (ClientError, EpochlogError, TimeoutError, OSError):
                pass
            self._at = (self._at + 1) % len(self.endpoints)
            if len(self._compacted) < len(self.endpoints):
                return False
            start = min(self._compacted.values())
            self._compacted.clear()
            if start <= self.next_offset:
                return False
            self.gaps.append((self.next_offset, start))
            self.next_offset = start
            return True
        except (ClientError, EpochlogError, TimeoutError, OSError):
            self._at = (self._at + 1) % len(self.endpoints)
            return False
        for r in got.events:
            if r.offset < self.next_offset or not r.key.startswith(RECORD_PREFIX):
                continue
            event = None if r.value is None else decode_event(r.value)
            value = int(event.value) if isinstance(event, KvPut) else None
            self.records[r.offset] = LogRecord(r.offset, r.key[3:], value, r.applied)
            self.events.append((r.offset, event, r.applied))
        progressed = got.next_offset > self.next_offset
        self.next_offset = max(self.next_offset, got.next_offset)
        if progressed:
            self._compacted.clear()
        else:
            self._at = (self._at + 1) % len(self.endpoints)
        return progressed


class WatchConsumer:
    """An application replaying `watch(PREFIX)` into a `Replay` (see the module docstring)."""

    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.replay = Replay()
        self.last_offset = -1
        self.events = 0
        self.relisted: list[int] = []        # offsets it watched on from after a re-list
        self.problems: list[str] = []        # broken promises of the watch (offsets not increasing)
        self.errors: list[str] = []          # errors that ended a watch call (it starts again)
        self.flag_seen = False               # whether the watch said `applied` at all

    async def run(self) -> None:
        """Watch until cancelled."""
        async with AsyncClient(self.endpoints, timeout=self.timeout) as client:
            from_offset = 0
            while True:
                try:
                    async for watched in client.watch(PREFIX, from_offset=from_offset):
                        self._apply(watched.offset, watched.event, getattr(watched, "applied", True))
                        self.flag_seen = self.flag_seen or hasattr(watched, "applied")
                        from_offset = watched.offset + 1
                except CompactedError:
                    from_offset = await self._relist(client)
                except (ClientError, EpochlogError, TimeoutError, OSError) as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(_RETRY_S)

    def _apply(self, offset: int, event: Event | None, applied: bool | None) -> None:
        if offset <= self.last_offset:
            self.problems.append(f"the watch delivered offset {offset} after offset {self.last_offset}")
            return
        self.last_offset = offset
        self.events += 1
        self.replay.apply(offset, event, applied)

    async def _relist(self, client: AsyncClient) -> int:
        """Resync from a linearizable list of the keys (one page: a chaos run has a handful); the offset
        to watch on from."""
        while True:
            try:
                page = await client.list(PREFIX, limit=1000, consistency="linearizable")
                break
            except (ClientError, EpochlogError, TimeoutError, OSError):
                await asyncio.sleep(_RETRY_S)
        assert page.next_after is None, "a chaos run lists more than 1000 keys"
        self.replay.reset({kv.name: (int(kv.value), kv.version) for kv in page.items})
        self.last_offset = page.applied
        self.relisted.append(page.applied + 1)
        return page.applied + 1
