"""Reading committed records by offset range: from a running cluster, or offline from segment files.

Both sources yield lists of `SourceRecord` for offsets [lo, hi) of one group, skipping control
batches (Raft no-ops and membership changes: not events), and both fail rather than return fewer
offsets than asked: an export must never commit a range it did not read completely.

- `ClusterSource`: the SDK's `read_log`: batches as the log stores them (CRC included), decoded here
  by the offline reader's decoder (`decode_batches`), so the serving node does no per-record work.
  Every node serves the committed records it applied, so the ranges are spread over all members
  (range i from member i mod n); a member that fails, lags or no longer holds the range hands it to
  the leader. A node that has not applied through `hi` yet
  is waited for (bounded); a range below the leader's log start is an ExportError (the export
  watermark exists so that compaction does not do that).
- `OfflineSource`: the segment files of a stopped node (or a copy of its data directory), read with
  the public offline reader (eventlog/offline.py `read_committed`: no lock taken, every batch
  CRC-checked). The commit bound comes from the group's `quorum-state` (the commit index, persisted
  lazily, so a lower bound) and from the views' applied offset when the views can be opened
  read-only (statemachines/offline.py); nothing past it is read, so a tail that a new leader could
  still truncate is never exported. With the views, each record also says whether applying it
  changed them (`applied`, as the node reports it online). A cleaned segment (key compaction) covers
  up to the next segment's base: the offsets it dropped are a compacted range, not missing data.

Layout read offline (eventlog/raft/runtime/log_storage.py): `<data dir>/groups/<group>/log/` (the
segments), `quorum-state`, `views/` (RocksDB).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eventlog.errors import EpochlogError
from eventlog.offline import AppliedLookup, committed_offset, decode_batches, log_start, read_committed
from spark.errors import ExportError
from spark.records import SourceRecord

if TYPE_CHECKING:
    from epochlog.api.messages import LogBatches

T = TypeVar("T")

READ_MAX_BYTES = 4 << 20   # per read_log call: whole batches, decoded on the reading worker
APPLY_WAIT_S = 30.0      # how long a range waits for the leader to apply through its end
FOLLOWER_WAIT_S = 5.0    # how long it waits for a lagging follower before asking the leader


# --- a running cluster -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ClusterSource:
    endpoints: tuple[str, ...]
    timeout_s: float = 10.0
    only: tuple[str, ...] = ()    # these groups only (default: every group)
    readers: tuple[str, ...] = ()  # client addresses of every member: range i is read from readers[i % n]

    def bounds(self) -> dict[str, tuple[int, int]]:
        """Per group (log start, commit offset), as each group's leader reports them."""
        from epochlog.client import Client

        with Client(list(self.endpoints), timeout=self.timeout_s, name="epochlog-export") as client:
            groups = [g.group for g in client.status().groups]
            unknown = set(self.only) - set(groups)
            if unknown:
                raise ExportError(f"no group {', '.join(sorted(unknown))} (groups: {', '.join(groups)})")
            out = {}
            for g in groups:
                if self.only and g not in self.only:
                    continue
                probe = client.read_events(g, 1 << 62, max_events=1)
                out[g] = (probe.log_start, probe.commit_offset)
            return out

    def prepared(self) -> ClusterSource:
        """This source with every member as a reader: the ranges are spread over the nodes (followers
        serve committed ranges too), so an export does not load the leaders alone."""
        from epochlog.client import Client

        with Client(list(self.endpoints), timeout=self.timeout_s, name="epochlog-export") as client:
            members = sorted((m.id, m.client_address) for m in client.status().members if m.client_address)
        return ClusterSource(self.endpoints, self.timeout_s, self.only, tuple(a for _, a in members))

    def read(self, group: str, lo: int, hi: int, slot: int = 0) -> Iterator[list[SourceRecord]]:
        """Offsets [lo, hi) of `group`, from the member `slot` picks (the leader if that one fails, lags
        more than FOLLOWER_WAIT_S or no longer holds the range). The replies are fetched one ahead by a
        thread (`_ahead`): the next one is on its way while this one is decoded."""
        for offset, got in _ahead(self._replies(group, lo, hi, slot)):
            records = _decoded(group, got, offset, hi)
            if records:
                yield records

    def _replies(self, group: str, lo: int, hi: int, slot: int) -> Iterator[tuple[int, LogBatches]]:
        """(offset asked, read_log reply) covering [lo, hi), with the fall-backs `read` describes."""
        from epochlog.client import Client, ClientError, CompactedError

        endpoint = self.readers[slot % len(self.readers)] if self.readers else None
        with Client(list(self.endpoints), timeout=self.timeout_s, name="epochlog-export") as client:
            offset = lo
            stalled_since: float | None = None
            while offset < hi:
                try:
                    got = client.read_log(group, offset, max_bytes=READ_MAX_BYTES, endpoint=endpoint)
                except CompactedError as exc:
                    if endpoint is not None:
                        endpoint = None   # that member compacted (or installed a snapshot): the leader
                        continue
                    raise ExportError(f"group {group}: offsets from {offset} were compacted before they were "
                                      f"exported ({exc})") from None
                except (ClientError, TimeoutError):
                    if endpoint is None:
                        raise
                    endpoint = None
                    continue
                if got.data:
                    yield offset, got
                if got.next_offset > offset:
                    offset = got.next_offset
                    stalled_since = None
                    continue
                # The serving node has not applied `offset` yet (a follower behind, a new leader catching
                # up): wait, then ask the leader.
                now = time.monotonic()
                stalled_since = stalled_since or now
                if endpoint is not None and now - stalled_since > FOLLOWER_WAIT_S:
                    endpoint, stalled_since = None, None
                elif now - stalled_since > APPLY_WAIT_S:
                    raise ExportError(f"group {group}: offset {offset} was not served within {APPLY_WAIT_S:.0f} s "
                                      f"(commit offset {got.commit_offset})")
                time.sleep(0.05)


_DONE = object()


def _ahead(items: Iterator[T]) -> Iterator[T]:
    """`items`, produced by a thread one item ahead of the consumer (a queue of one): the next read_log
    call waits on the node while the consumer decodes. The producer's exception is raised here, in
    order; a consumer that stops early (closes this generator) stops the producer at its next item."""
    slot: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(entry: tuple[Any, BaseException | None]) -> bool:
        """Hand `entry` over unless the consumer stopped meanwhile (then False)."""
        while not stop.is_set():
            try:
                slot.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            put((_DONE, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="epochlog-export-read", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slot.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


def _decoded(group: str, got: LogBatches, lo: int, hi: int) -> list[SourceRecord]:
    """The records of [lo, hi) in a `read_log` reply, decoded here (eventlog.offline.decode_batches, the
    offline reader's decoder), `applied` set from the reply's no-op and unknown offsets."""
    noops, unknown = frozenset(got.noops), frozenset(got.unknown)
    applied: AppliedLookup | frozenset[int] = noops
    if unknown:   # views older than their no-op rows
        def lookup(_key: bytes | None, offset: int) -> bool | None:
            return None if offset in unknown else offset not in noops
        applied = lookup
    try:
        records, end = decode_batches(got.data, lo, hi, applied=applied)
    except EpochlogError as exc:
        raise ExportError(f"group {group}: {exc}") from None
    if got.data and end < min(hi, got.next_offset):
        raise ExportError(f"group {group}: the batches read end at offset {end}, before {got.next_offset}")
    return records


# --- segment files of a stopped node -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OfflineGroup:
    group: str
    directory: str        # the group directory (log/, quorum-state, views/)

    @property
    def log_dir(self) -> Path:
        return Path(self.directory) / "log"

    @property
    def views_dir(self) -> Path:
        return Path(self.directory) / "views"


@dataclass(frozen=True, slots=True)
class OfflineSource:
    groups: tuple[OfflineGroup, ...] = field(default=())

    @classmethod
    def discover(cls, directory: str | Path, only: tuple[str, ...] = ()) -> OfflineSource:
        """The groups under a node's data directory (`groups/<name>/log`), or the one group directory
        given (`<dir>/log`)."""
        root = Path(directory)
        if (root / "groups").is_dir():
            found = [OfflineGroup(p.name, str(p.resolve())) for p in sorted((root / "groups").iterdir())
                     if (p / "log").is_dir()]
        elif (root / "log").is_dir():
            found = [OfflineGroup(root.name, str(root.resolve()))]
        else:
            raise ExportError(f"{root} holds no group logs: give a node's data directory (with groups/<name>/log) "
                              f"or one group's directory (with log/)")
        if only:
            unknown = set(only) - {g.group for g in found}
            if unknown:
                raise ExportError(f"no group {', '.join(sorted(unknown))} under {root} "
                                  f"(found {', '.join(g.group for g in found)})")
            found = [g for g in found if g.group in only]
        return cls(tuple(found))

    def group(self, name: str) -> OfflineGroup:
        for g in self.groups:
            if g.group == name:
                return g
        raise ExportError(f"no group {name!r} in the offline source")

    def bounds(self) -> dict[str, tuple[int, int]]:
        return {g.group: (log_start(g.log_dir), commit_bound(g)) for g in self.groups}

    def prepared(self) -> OfflineSource:
        return self

    def read(self, group: str, lo: int, hi: int, slot: int = 0) -> Iterator[list[SourceRecord]]:
        """Offsets [lo, hi) of `group` from its segment files (eventlog.offline.read_committed), each
        record saying whether it changed the views when they can be opened (else None)."""
        from statemachines.offline import OfflineViews

        g = self.group(group)
        views = OfflineViews.open(g.views_dir)
        try:
            yield from read_committed(g.log_dir, lo, hi, applied=None if views is None else views.applied_at)
        except EpochlogError as exc:
            raise ExportError(str(exc)) from None
        finally:
            if views is not None:
                views.close()


def commit_bound(g: OfflineGroup) -> int:
    """The highest offset known committed: max of quorum-state's commit and the views' applied offset."""
    from statemachines.offline import OfflineViews

    try:
        commit = committed_offset(g.directory)
    except EpochlogError as exc:
        raise ExportError(str(exc)) from None
    views = OfflineViews.open(g.views_dir)
    if views is not None:
        try:
            commit = max(commit, views.applied())
        finally:
            views.close()
    return commit
