"""The views shadow: each simulated replica also keeps real materialized views (a ViewsStateMachine
on a RocksDB directory) fed the same committed entries as its KV state, and a checker holds every
replica that reaches an offset to the same views digest there.

Enabled per run (`SimParams.views`, `python -m tests.sim --views`, `test_views_sim.py`); off, the
simulator is untouched.

- Events: every committed NORMAL entry becomes a record batch of `entry.count` views events derived
  from the KV operation it carries (`views_entry`: puts, compare-and-sets as conditional puts and
  transactions, deletes, leases with attached keys and sessions, lease expiry, offsets, broker
  registrations with epochs, retried request ids inside a small dedupe window). NOOP and
  CONF_CHANGE entries pass through (they advance the applied offset). The mapping is a function
  of the entry alone, so all replicas apply the same events.
- Apply: one `apply()` per Ready (a WriteBatch per Ready, as the runtime does), so replicas apply
  the same entries in different batches -- the digest must not care.
- Snapshots: when a replica snapshots its KV state it also writes its views checkpoint
  (`ViewsStateMachine.write_snapshot`); the file is kept by the cluster under the snapshot's
  (index, term), outside the Raft snapshot bytes, so the Raft schedule of a seed is exactly the
  one it has without views. A replica that installs snapshot (index, term) restores those views
  (`ViewsStateMachine.restore`, the swap through views.restore / views.old).
- Crash and restart: a crash closes the views (a process crash keeps every RocksDB write: the WAL
  is in the page cache; power loss of the views is not modelled -- the sim's disk faults apply to
  the Raft log). A restart reopens them; if they are behind the durable snapshot (a torn write
  installed the snapshot in the log storage but the replica never restored it), they are restored
  from it first -- what `NodeHost.start` does -- and entries already in the views are skipped when
  the log replays them. (While the KV state replays up to them, the replica does not snapshot: a
  snapshot's views would not be at its index.)

Checker `views-digest`: every replica whose views reach offset i (after applying a Ready,
installing a snapshot, restarting, taking a snapshot) has the digest first seen at i; at the end,
replicas at the same applied offset hold byte-identical column families (all keys and values).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from eventlog.raft.types import Entry, EntryKind, HardState, SnapshotMeta
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.store import ALL_CFS, ViewsConfig
from statemachines.views import ViewsStateMachine
from tests.sim.checkers import Checker, InvariantViolation
from tests.sim.kv import decode_op

if TYPE_CHECKING:
    from tests.sim.replica import Replica

CONFIG = ViewsConfig(block_cache_bytes=1 << 20, write_buffer_bytes=1 << 20, dedupe_window_offsets=40)


def _event(op_id: int, kind: str, key: str, a: int | None, b: int | None, i: int, offset: int) -> ev.Event:
    """The i-th views event of the entry carrying KV operation (op_id, kind, key, a, b) at `offset`."""
    lease = 1 + (op_id + i) % 5
    pick = (op_id * 7 + i * 3) % 11 if i else -1
    ids = {"actor": f"c{op_id % 3}", "request_id": f"r{op_id % 60}-{i}"}   # retries: ids come back
    if pick == -1:
        if kind == "put":
            return ev.KvPut(name=key, value=b"%d" % (a or 0), lease=lease if op_id % 4 == 0 else 0, **ids)
        if kind == "cas":
            if op_id % 2:
                return ev.KvPut(name=key, value=b"%d" % (b or 0), expected_version=a or 0)
            return ev.Txn(conditions=(ev.Condition(f"kv/{key}", a or 0),),
                          ops=(ev.KvPut(name=key, value=b"%d" % (b or 0)),
                               ev.OffsetCommitted(consumer_group="cg", topic="t", queue_id=op_id % 3,
                                                  offset=offset)))
        return ev.KvDeleted(name=key) if op_id % 3 == 0 else ev.OffsetCommitted(
            consumer_group="cg", topic="t", queue_id=op_id % 4, offset=offset)
    if pick == 0:
        return ev.LeaseGranted(lease_id=lease, ttl_ms=1000, **ids)
    if pick == 1:
        return (ev.LeaseExpired if op_id % 2 else ev.LeaseRevoked)(lease_id=lease)
    if pick == 2:
        return ev.SessionOpened(client_id=f"s{op_id % 4}", lease=lease, clean=op_id % 2 == 0)
    if pick == 3:
        return ev.SessionClosed(client_id=f"s{op_id % 4}")
    if pick == 4:
        return ev.BrokerRegistered(cluster="c", group="g", name=f"b{op_id % 3}", address="10.0.0.1:10911",
                                   incarnation=f"i{op_id}", broker_id=op_id % 3, broker_epoch=1 + op_id % 4)
    if pick == 5:
        return ev.BrokerFenced(cluster="c", group="g", name=f"b{op_id % 3}", broker_epoch=1 + op_id % 4)
    if pick == 6:
        return ev.MasterElected(cluster="c", group="g", master=op_id % 3, master_epoch=op_id % 3)
    if pick == 7:
        return ev.KvPut(name=f"{key}/x{i}", value=b"%d" % offset, lease=lease, **ids)
    if pick == 8:
        return ev.ConfigChanged(scope="s", name=f"n{op_id % 3}",
                                value=None if op_id % 5 == 0 else str(offset))
    if pick == 9:
        return ev.TopicCreated(name=f"t{op_id % 3}") if op_id % 2 else ev.TopicDeleted(name=f"t{op_id % 3}")
    return ev.KvDeleted(name=f"{key}/x{(i + 1) % 3}", **ids)


def views_entry(entry: Entry) -> Entry:
    """The views form of a committed entry: same index, term and count; NORMAL data as events."""
    if entry.kind is not EntryKind.NORMAL:
        return entry
    op_id, kind, key, a, b = decode_op(entry.data)
    records = [ev.event_record(_event(op_id, kind, key, a, b, i, entry.index + i))
               for i in range(entry.count)]
    data = bytearray(encode_batch(records, timestamp_ms=1_700_000_000_000 + entry.index))
    stamp(data, entry.index, entry.term)
    return Entry(entry.index, entry.term, entry.count, EntryKind.NORMAL, bytes(data))


class ViewsShadow:
    """The views of one replica. `snapshots` is shared by the cluster: (index, term) -> file."""

    def __init__(self, directory: Path, snapshots: dict[tuple[int, int], Path]) -> None:
        self.directory = directory
        self.snapshots = snapshots
        self.sm: ViewsStateMachine | None = None
        self.restored_on_boot = 0

    @property
    def applied(self) -> int:
        assert self.sm is not None
        return self.sm.applied_index

    @property
    def digest(self) -> bytes:
        assert self.sm is not None
        return self.sm.digest

    def boot(self, snap: SnapshotMeta) -> None:
        if self.sm is not None:
            self.sm.close()
        self.sm = ViewsStateMachine(self.directory, CONFIG)
        if self.sm.applied_index < snap.index:
            self.restored_on_boot += 1
            self.install(snap)

    def crash(self) -> None:
        if self.sm is not None:
            self.sm.close()
            self.sm = None

    def apply(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        assert self.sm is not None
        self.sm.apply([views_entry(e) for e in entries])

    def can_snapshot(self, index: int) -> bool:
        """Are the views at `index`? (After a restart they may be ahead while the KV state replays
        the log from its snapshot; the runtime never is in that state: its log resumes from the
        views' applied offset.)"""
        return self.sm is not None and self.sm.applied_index == index

    def snapshot(self, meta: SnapshotMeta) -> None:
        """The replica snapshotted its KV state as `meta`: keep the views checkpoint beside it."""
        assert self.sm is not None and self.sm.applied_index == meta.index, (self.applied, meta)
        key = (meta.index, meta.term)
        if key in self.snapshots:
            return
        path = self.directory.parent / f"snapshot-{meta.index}-{meta.term}.tar"
        self.sm.write_snapshot(path)
        self.snapshots[key] = path

    def install(self, meta: SnapshotMeta) -> None:
        assert self.sm is not None
        path = self.snapshots.get((meta.index, meta.term))
        assert path is not None, f"no views checkpoint for snapshot ({meta.index}, term {meta.term})"
        self.sm.restore(path, meta)

    def dump(self) -> dict[str, list[tuple[bytes, bytes]]]:
        assert self.sm is not None
        store = self.sm.store
        it = store.db.iter()
        it.seek_to_first()
        rows = []
        while it.valid():
            rows.append((bytes(it.key()), bytes(it.value())))
            it.next()
        out = {"default": rows}
        for cf in ALL_CFS:
            out[cf] = [(bytes(k), bytes(v)) for k, v in store.scan(cf, b"")]
        return out

    def close(self) -> None:
        self.crash()

    @staticmethod
    def remove_all(root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)


class ViewsDigest(Checker):
    """views-digest: equal views at equal offsets, on every replica, however it got there."""

    def __init__(self, replicas: dict[int, Replica]) -> None:
        self.replicas = replicas
        self.digests: dict[int, tuple[bytes, int, str]] = {}   # offset -> (digest, first node, how)
        self.checks = 0

    def _check(self, r: Replica, how: str) -> None:
        views = r.views
        if views is None or views.sm is None:
            return
        at, d = views.applied, views.digest
        if at < 0:
            return
        self.checks += 1
        other = self.digests.setdefault(at, (d, r.id, how))
        if other[0] != d:
            raise InvariantViolation("views-digest", f"node {r.id} views at offset {at} ({how}) have "
                                     f"digest {d.hex()[:16]}, node {other[1]} had {other[0].hex()[:16]} "
                                     f"({other[2]})")

    def applied(self, r: Replica, entry: Entry) -> None:
        views = r.views
        if views is None or views.sm is None:
            return
        if views.applied < entry.last_index:   # the replica applies a Ready's views before its entries
            raise InvariantViolation("views-digest", f"node {r.id} applied entry {entry.index}-"
                                     f"{entry.last_index} but its views are at {views.applied}")
        self._check(r, "applied")

    def snapshot_installed(self, r: Replica, meta: SnapshotMeta) -> None:
        self._check(r, "snapshot installed")

    def restarted(self, r: Replica, hard: HardState) -> None:
        self._check(r, "restarted")

    def finish(self) -> None:
        by_offset: dict[int, list[Replica]] = {}
        for r in self.replicas.values():
            if r.views is not None and r.views.sm is not None:
                self._check(r, "end of run")
                by_offset.setdefault(r.views.applied, []).append(r)
        for at, rs in by_offset.items():
            first = rs[0].views.dump()  # type: ignore[union-attr]
            for r in rs[1:]:
                d = r.views.dump()  # type: ignore[union-attr]
                if d != first:
                    cf = next(c for c in first if first[c] != d.get(c))
                    raise InvariantViolation("views-digest", f"nodes {rs[0].id} and {r.id} at offset {at} "
                                             f"hold different views in column family {cf}")
