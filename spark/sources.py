"""Reading committed records by offset range: from a running cluster, or offline from segment files.

Both sources yield lists of `SourceRecord` for offsets [lo, hi) of one group, skipping control
batches (Raft no-ops and membership changes: not events), and both fail rather than return fewer
offsets than asked: an export must never commit a range it did not read completely.

- `ClusterSource`: the SDK's `read_events`. Every node serves the committed records it applied, so
  the ranges are spread over all members (range i from member i mod n); a member that fails, lags
  or no longer holds the range hands it to the leader. A node that has not applied through `hi` yet
  is waited for (bounded); a range below the leader's log start is an ExportError (the export
  watermark exists so that compaction does not do that).
- `OfflineSource`: the segment files of a stopped node (or a copy of its data directory), read
  without taking the log's lock, every batch CRC-checked. The commit bound comes from the group's
  `quorum-state` (the commit index, persisted lazily, so a lower bound) and from the views' applied
  offset when the views can be opened read-only; nothing past it is read, so a tail that a new
  leader could still truncate is never exported. With the views, each record also says whether
  applying it changed them (`applied`, as the node reports it online). A cleaned segment (key
  compaction) covers up to the next segment's base: the offsets it dropped are a compacted range,
  not missing data.

Layout read offline (eventlog/raft/runtime/log_storage.py): `<data dir>/groups/<group>/log/` (the
segments), `quorum-state`, `views/` (RocksDB).
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from eventlog.cleaned import cleaned_ranges
from eventlog.log import read_offsets_checkpoint
from eventlog.offline import effective_layout
from eventlog.records import (
    HEADER_SIZE,
    MAGIC,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_MASK,
    RecordBatch,
    check_batch,
    decode_varint,
    read_header,
)
from spark.errors import ExportError
from spark.records import SourceRecord

READ_MAX_EVENTS = 5000
READ_MAX_BYTES = 4 << 20
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
        more than FOLLOWER_WAIT_S or no longer holds the range)."""
        from epochlog.client import Client, ClientError, CompactedError

        endpoint = self.readers[slot % len(self.readers)] if self.readers else None
        with Client(list(self.endpoints), timeout=self.timeout_s, name="epochlog-export") as client:
            offset = lo
            stalled_since: float | None = None
            while offset < hi:
                try:
                    got = client.read_events(group, offset, max_events=min(READ_MAX_EVENTS, hi - offset),
                                             max_bytes=READ_MAX_BYTES, endpoint=endpoint)
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
                records = [SourceRecord(e.offset, e.key, e.value, e.timestamp, e.term, e.applied)
                           for e in got.events if e.offset < hi]
                if records:
                    yield records
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
        g = self.group(group)
        views = ViewsLookup.open(g.views_dir)
        try:
            yield from read_segments(g.log_dir, lo, hi, views)
        finally:
            if views is not None:
                views.close()


def log_start(log_dir: Path) -> int:
    """The first offset the segment files hold every committed record of, as written: past the log
    start and past the key-compacted range (cleaned segments hold each entity's latest record only),
    as the node's read_events reports it online. An export's first run reports what lies below as a
    gap."""
    start, _ = read_offsets_checkpoint(log_dir)
    cleaner, files, _ = effective_layout(log_dir)
    if not files:
        return start
    cleaned = cleaned_ranges(cleaner, [b for b, _ in files])
    return max(start, files[0][0], max(cleaned.values(), default=0))


def commit_bound(g: OfflineGroup) -> int:
    """The highest offset known committed: max of quorum-state's commit and the views' applied offset."""
    commit = -1
    qs = Path(g.directory) / "quorum-state"
    if qs.exists():
        try:
            commit = int(msgspec.json.decode(qs.read_bytes()).get("commit", -1))
        except (msgspec.DecodeError, AttributeError, ValueError) as exc:
            raise ExportError(f"{qs} is malformed: {exc}") from None
    views = ViewsLookup.open(g.views_dir)
    if views is not None:
        try:
            commit = max(commit, views.applied())
        finally:
            views.close()
    return commit


def read_segments(log_dir: Path, lo: int, hi: int, views: ViewsLookup | None = None,
                  chunk: int = 10_000) -> Iterator[list[SourceRecord]]:
    """Records of offsets [lo, hi) from the segment files in `log_dir` (read-only, every CRC checked)."""
    cleaner, files, _ = effective_layout(log_dir)
    cleaned = cleaned_ranges(cleaner, [b for b, _ in files])
    out: list[SourceRecord] = []
    offset = lo
    for i, (base, path) in enumerate(files):
        seg_end = files[i + 1][0] if i + 1 < len(files) else None
        if seg_end is not None and seg_end <= lo:
            continue
        if base >= hi:
            break
        if base > offset:
            raise ExportError(f"{log_dir}: offsets {offset}..{base - 1} are missing (segment {path.name})")
        for header, batch_view in _batches(path, lo):
            if header.base_offset >= hi:
                break
            offset = header.base_offset + header.last_offset_delta + 1
            if header.is_control:
                continue
            term = header.leader_epoch
            for o, ts, raw_key, value in _records(header, batch_view):
                if o < lo or o >= hi:
                    continue
                key = "" if raw_key is None else raw_key.decode("utf-8", "backslashreplace")
                applied = None if views is None else views.applied_at(key, o)
                out.append(SourceRecord(o, key, value, ts, term, applied))
            if len(out) >= chunk:
                yield out
                out = []
        if seg_end is not None and base in cleaned:
            offset = max(offset, seg_end)   # the rest of a cleaned segment's range was compacted away
        if offset >= hi:
            break
    if out:
        yield out
    if offset < hi:
        raise ExportError(f"{log_dir}: the log ends at offset {offset}, before {hi} (the commit bound)")


def _batches(path: Path, lo: int) -> Iterator[tuple[Any, memoryview]]:
    """(header, bytes) of each valid batch of a segment file holding offsets at or above `lo`, up to
    the first invalid one (the zeroed, preallocated end, or a torn tail past the commit bound).
    Batches below `lo` are stepped over by their headers (no CRC: they are not read)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                pos = 0
                while pos + HEADER_SIZE <= size:
                    h = read_header(view, pos)
                    if h.magic != MAGIC or h.batch_length < MIN_BATCH_LENGTH or pos + h.size > size:
                        return
                    if h.base_offset + h.last_offset_delta < lo:
                        pos += h.size
                        continue
                    checked = check_batch(view, pos, size)
                    if isinstance(checked, str):
                        return
                    end = pos + checked.size
                    # Records are decoded from a copy so no view of the mapping outlives it.
                    yield checked, memoryview(bytes(view[pos:end]))
                    pos = end
            finally:
                view.release()
    finally:
        os.close(fd)


def _records(header: Any, raw: memoryview) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, timestamp, key, value) of each record of a CRC-checked batch.

    The export's hot loop: uncompressed batches without record headers (what Epochlog writes) are
    parsed here with the one-byte varint case inlined, about 2x faster than `RecordBatch.records()`,
    which handles everything else (compression, headers, LogAppendTime)."""
    if header.compression != 0 or header.attributes & TIMESTAMP_TYPE_MASK:
        for r in RecordBatch(header, raw).records():
            yield r.offset, r.timestamp, r.key, r.value
        return
    data = bytes(raw[HEADER_SIZE:])
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    pos = 0
    for _ in range(header.records_count):
        b = data[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            length, pos = decode_varint(data, pos)
        end = pos + length
        pos += 1                                    # record attributes
        b = data[pos]
        if b < 0x80:
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            ts_delta, pos = decode_varint(data, pos)
        b = data[pos]
        if b < 0x80:
            offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            offset_delta, pos = decode_varint(data, pos)
        b = data[pos]
        if b < 0x80:
            klen, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            klen, pos = decode_varint(data, pos)
        key = None
        if klen >= 0:
            key = data[pos:pos + klen]
            pos += klen
        b = data[pos]
        if b < 0x80:
            vlen, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            vlen, pos = decode_varint(data, pos)
        value = None
        if vlen >= 0:
            value = data[pos:pos + vlen]
            pos += vlen
        if data[pos] != 0:                          # record headers: let the general decoder do it
            yield from ((r.offset, r.timestamp, r.key, r.value) for r in RecordBatch(header, raw).records()
                        if r.offset >= base_offset + offset_delta)
            return
        if pos + 1 != end:
            raise ExportError(f"record at offset {base_offset + offset_delta} is malformed")
        pos = end
        yield base_offset + offset_delta, base_ts + ts_delta, key, value


class ViewsLookup:
    """Read-only access to a stopped group's views (RocksDB): applied offset, and whether an event
    changed them (a `versions` row at its offset for its entity key, as the node checks online)."""

    def __init__(self, db: object, versions: object) -> None:
        self._db = db
        self._versions = versions
        self._cfs: dict[str, Any] = {"versions": versions}

    @classmethod
    def open(cls, path: Path) -> ViewsLookup | None:
        if not (path / "CURRENT").exists():
            return None
        from rocksdict import AccessType, Options, Rdict

        try:
            # Every family the database has (views written before a family existed lack it).
            families = [name for name in Rdict.list_cf(str(path)) if name != "default"]
            db = Rdict(str(path), Options(raw_mode=True),
                       column_families={name: Options(raw_mode=True) for name in families},
                       access_type=AccessType.read_only())
        except Exception:   # noqa: BLE001 - no views is an answer too: records then say "unknown"
            return None
        return cls(db, db.get_column_family("versions"))

    def applied(self) -> int:
        from statemachines.store import APPLIED, decode_offset

        raw = self._db.get(APPLIED)  # type: ignore[attr-defined]
        return -1 if raw is None else decode_offset(raw)

    def applied_at(self, record_key: str, offset: int) -> bool | None:
        """As the node answers online (statemachines/noops.py `changed_views`): from the `noops` rows,
        else from the history; None below the history floor where its row may be pruned (unknown)."""
        from statemachines.noops import changed_views, noops_from_meta
        from statemachines.store import NOOPS_FROM

        start = noops_from_meta(self._db.get(NOOPS_FROM))  # type: ignore[attr-defined]
        return changed_views(self._get, record_key.encode(), offset, start)

    def _get(self, cf: str, key: bytes) -> bytes | None:
        if cf == "":
            return self._db.get(key)  # type: ignore[attr-defined,no-any-return]
        if cf not in self._cfs:
            try:
                self._cfs[cf] = self._db.get_column_family(cf)  # type: ignore[attr-defined]
            except Exception:   # noqa: BLE001 - a family these views do not have: nothing in it
                self._cfs[cf] = None
        family = self._cfs[cf]
        return None if family is None else family.get(key)

    def close(self) -> None:
        self._versions = None
        self._cfs.clear()
        self._db.close()  # type: ignore[attr-defined]
