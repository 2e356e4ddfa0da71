"""Child process of the views crash test (tests/statemachines/test_crash.py): apply until SIGKILLed.

    python -m tests.statemachines.crash_child GROUP_DIR SNAP_DIR STREAM_SEED CHILD_SEED
    python -m tests.statemachines.crash_child restore GROUP_DIR SNAPSHOT_FILE INDEX POINT
    python -m tests.statemachines.crash_child follower NODE_ID DATA_DIR PORT1,PORT2,PORT3 SNAPSHOT_EVERY

Opens the ViewsStateMachine in GROUP_DIR (its RocksDB lives in GROUP_DIR/views) and applies the
deterministic event stream of STREAM_SEED (`build_stream`) batch by batch, from the batch after the
applied offset it finds to the end. Now and then (CHILD_SEED decides when) it writes a snapshot of
its views into SNAP_DIR and, a few batches later, restores it -- going back to the snapshot's offset
through the restore swap (`views.restore` / `views.old`) -- and applies on from there.

Every line goes out with one `os.write` once the step it reports is done (the parent never sees half
a line):

    READY <applied>          the store is open (a crash in the middle of a swap was finished)
    APPLIED <offset>         apply() of the batch ending at <offset> returned
    SNAPSHOT <offset> <n>    snapshot file n holds the views as of <offset>
    RESTORE <offset> <n>     about to restore snapshot file n (views go back to <offset>)
    RESTORED <offset>        the restore returned
    DONE <applied>           the whole stream is applied

The stream is a function of STREAM_SEED only: the parent builds the same one to compute, in its own
directory, the state the views must hold at every batch boundary. Batch boundaries are fixed by the
stream too, so wherever a crash leaves the applied offset, the child resumes on a boundary.

The `restore` form opens the views in GROUP_DIR and restores SNAPSHOT_FILE (the views as of INDEX),
killing itself with SIGKILL at crash point POINT: every file-system step of the restore -- each file
the snapshot unpacks (`TarFile.makefile`), each `os.rename`, `os.unlink`, `os.rmdir`,
`shutil.rmtree` and directory fsync -- is an event, and point 2j is "just before event j", 2j + 1
"just after it". The steps are the real ones of `ViewsStateMachine.restore`, whatever they become;
only the moment of death is chosen. With POINT -1 it does not crash and prints each event
(`EVENT <j> <kind> <path>`) and then `RESTORED <index>`.

The `follower` form runs node NODE_ID of a 3-node views cluster (tests/support/hosts.py's
`cluster_configs`, as its HostCluster in the test) as a NodeHost
whose views kill the process with SIGKILL the moment the group asks them to restore a snapshot --
after the log storage installed it (renamed it into place, reset the log behind it) and before the
views changed. It prints `READY` once started and `RESTORE <index>` just before dying.

Backstop: the child exits by itself after MAX_SECONDS.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from eventlog.raft.types import Entry, EntryKind, SnapshotMeta
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine

MAX_SECONDS = 30.0
BASE_TIMESTAMP_MS = 1_700_000_000_000
# Small memtables (many flushes and compactions under the kill) and a small dedupe window (request
# ids are evicted while the test runs). The parent must use the very same configuration.
CONFIG = ViewsConfig(block_cache_bytes=4 << 20, write_buffer_bytes=1 << 20, dedupe_window_offsets=300)


@dataclass(frozen=True, slots=True)
class Stream:
    entries: list[Entry]
    batches: list[tuple[int, int]]     # (first entry position, end position) of each apply() call

    def boundaries(self) -> list[int]:
        """The applied offset after each batch (-1: nothing applied yet), in order."""
        return [-1] + [self.entries[end - 1].last_index for _, end in self.batches]

    def batches_after(self, applied: int) -> list[list[Entry]]:
        """The batches that follow the boundary `applied` (which must be a boundary)."""
        bounds = self.boundaries()
        assert applied in bounds, f"applied offset {applied} is not a batch boundary"
        k = bounds.index(applied)
        return [self.entries[a:b] for a, b in self.batches[k:]]


class _Gen:
    """Draws plausible events: it keeps a rough model (last write offset per key, live leases) so
    that most compare-and-sets and lease attachments succeed, but it is never told the outcome, so a
    fair share of events is rejected -- deterministically, on every run alike."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.version: dict[str, int] = {}        # entity key -> offset of the last write issued
        self.leases: list[int] = []
        self.next_lease = 1
        self.brokers: dict[str, int] = {}        # broker name -> epoch
        self.master_epoch = 0
        self.sss_epoch = 0
        self.topics: list[str] = []
        self.requests: list[tuple[str, str]] = []  # (actor, request id) already used
        self.sessions: list[str] = []

    def _key(self) -> str:
        return f"app/{self.rng.randrange(48)}/{self.rng.choice('abc')}"

    def _value(self) -> bytes:
        n = self.rng.choice((0, 8, 40, 200, 700))
        return self.rng.randbytes(n)

    def _expected(self, key: str) -> int | None:
        r = self.rng.random()
        if r < 0.6:
            return None
        if r < 0.9:
            return self.version.get(key, 0)
        return self.rng.randrange(1, 5000)

    def _ids(self) -> dict[str, str]:
        r = self.rng.random()
        if r < 0.5:
            return {}
        if r < 0.62 and self.requests:   # a retry: same request id, maybe another payload
            actor, request = self.rng.choice(self.requests[-400:])
            return {"actor": actor, "request_id": request}
        actor = f"client-{self.rng.randrange(4)}"
        request = f"r-{len(self.requests)}"
        self.requests.append((actor, request))
        return {"actor": actor, "request_id": request}

    def _lease(self) -> int:
        if not self.leases or self.rng.random() < 0.6:
            return 0
        return self.rng.choice(self.leases) if self.rng.random() < 0.9 else self.next_lease + 50

    def event(self, offset: int) -> tuple[bytes, bytes]:
        rng = self.rng
        r = rng.random()
        e: ev.Event
        if r < 0.36:
            name = self._key()
            e = ev.KvPut(name=name, value=self._value(), lease=self._lease(),
                         expected_version=self._expected(f"kv/{name}"), **self._ids())
        elif r < 0.46:
            name = self._key()
            e = ev.KvDeleted(name=name, expected_version=self._expected(f"kv/{name}"), **self._ids())
        elif r < 0.52:
            e = ev.LeaseGranted(lease_id=self.next_lease, ttl_ms=rng.choice((100, 5000, 60_000)),
                                **self._ids())
            self.leases.append(self.next_lease)
            self.next_lease += 1
        elif r < 0.56 and self.leases:
            lease = self.leases.pop(rng.randrange(len(self.leases)))
            cls = ev.LeaseRevoked if rng.random() < 0.5 else ev.LeaseExpired
            e = cls(lease_id=lease, **self._ids())
        elif r < 0.60:
            client = f"mqtt-{rng.randrange(12)}"
            self.sessions.append(client)
            e = ev.SessionOpened(client_id=client, node=f"n{rng.randrange(3)}", clean=rng.random() < 0.5,
                                 lease=self._lease())
        elif r < 0.62 and self.sessions:
            e = ev.SessionClosed(client_id=rng.choice(self.sessions))
        elif r < 0.72:
            ops: list[ev.KvPut | ev.KvDeleted | ev.OffsetCommitted | ev.ConfigChanged] = []
            names = sorted({self._key() for _ in range(rng.randint(1, 4))})
            for name in names:
                ops.append(ev.KvPut(name=name, value=self._value()) if rng.random() < 0.8
                           else ev.KvDeleted(name=name))
            if rng.random() < 0.5:
                ops.append(ev.OffsetCommitted(consumer_group="cg", topic="t0", queue_id=rng.randrange(4),
                                              offset=offset))
            conds = tuple(ev.Condition(f"kv/{n}", self.version.get(f"kv/{n}", 0)) for n in names
                          if rng.random() < 0.5)
            e = ev.Txn(conditions=conds, ops=tuple(ops), **self._ids())
        elif r < 0.80:
            name = f"b{rng.randrange(4)}"
            epoch = self.brokers.get(name, 0)
            kind = rng.random()
            if kind < 0.4 or not epoch:
                self.brokers[name] = epoch + 1
                e = ev.BrokerRegistered(cluster="c1", group="broker-a", name=name,
                                        address=f"10.0.0.{rng.randrange(1, 9)}:10911",
                                        incarnation=f"i-{offset}", broker_id=int(name[1:]),
                                        broker_epoch=epoch + 1 if rng.random() < 0.9 else 1)
            elif kind < 0.6:
                e = ev.BrokerFenced(cluster="c1", group="broker-a", name=name, broker_epoch=epoch,
                                    reason="test")
            elif kind < 0.8:
                e = ev.BrokerUnfenced(cluster="c1", group="broker-a", name=name, broker_epoch=epoch)
            else:
                del self.brokers[name]
                e = ev.BrokerUnregistered(cluster="c1", group="broker-a", name=name, broker_epoch=epoch)
        elif r < 0.85:
            if rng.random() < 0.5:
                e = ev.MasterElected(cluster="c1", group="broker-a", master=rng.randrange(4),
                                     master_epoch=self.master_epoch)
                self.master_epoch += 1
                self.sss_epoch += 1
            else:
                e = ev.SyncStateSetChanged(cluster="c1", group="broker-a",
                                           sync_state_set=tuple(sorted(rng.sample(range(4), 2))),
                                           master_epoch=self.master_epoch,
                                           sync_state_set_epoch=self.sss_epoch)
                self.sss_epoch += 1
        elif r < 0.92:
            topic = f"t{rng.randrange(6)}"
            kind = rng.random()
            if kind < 0.4:
                e = ev.TopicCreated(name=topic, read_queues=rng.randrange(1, 9), broker_groups=("broker-a",))
            elif kind < 0.8:
                e = ev.TopicUpdated(name=topic, perm=rng.choice((2, 4, 6)),
                                    expected_version=self._expected(f"topic/{topic}"))
            else:
                e = ev.TopicDeleted(name=topic)
            self.topics.append(topic)
        elif r < 0.97:
            e = ev.OffsetCommitted(consumer_group=f"cg{rng.randrange(3)}", topic="t0",
                                   queue_id=rng.randrange(8), offset=offset)
        elif r < 0.99:
            e = ev.ConfigChanged(scope="cluster", name=f"c{rng.randrange(5)}",
                                 value=None if rng.random() < 0.3 else str(offset))
        else:
            return b"kv/garbage", b"\x93not an event"   # rejected alike everywhere
        key, value = ev.event_record(e)
        if isinstance(e, ev.KvPut | ev.KvDeleted | ev.TopicUpdated):
            self.version[e.key()] = offset
        elif isinstance(e, ev.Txn):
            for op in e.ops:
                self.version[op.key()] = offset
        return key, value


class _ClientSessions:
    """Entries of client-session requests (statemachines/sessions.py), as SDKs send them: a session's
    requests batched in one entry (consecutive offsets: one outcome run at views format level 3), the
    client saying some were answered (forgetting whole runs or cutting one), retries of kept and
    forgotten requests, rejected requests, out-of-order commits, the `max_outcomes` bound."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.sessions: dict[int, list[int]] = {}   # session id -> [next seq, answered below]

    def records(self, index: int) -> list[tuple[bytes, bytes]]:
        rng = self.rng
        if not self.sessions or rng.random() < 0.05:
            self.sessions[index + 1] = [1, 1]   # the id: the opening record's offset + 1
            return [ev.event_record(ev.ClientSessionOpened(group="kv", client=f"sdk-{index}", timeout_ms=3_600_000,
                                                           max_outcomes=rng.choice((5, 50, 1000)), max_sessions=6))]
        sid = rng.choice(list(self.sessions))
        state = self.sessions[sid]
        if rng.random() < 0.4:
            state[1] = rng.randrange(state[1], state[0] + 1)
        out: list[tuple[bytes, bytes]] = []

        def put(seq: int, below: int, **kw: int) -> tuple[bytes, bytes]:
            return ev.event_record(ev.KvPut(name=f"sdk/{rng.randrange(20)}", value=b"%d/%d" % (sid, seq), session_id=sid,
                                            seq=seq, answered_below=below, v=ev.SESSIONS_SCHEMA, **kw))
        for _ in range(rng.choice((1, 2, 5, 20, 60))):
            r = rng.random()
            if r < 0.08:
                seq = rng.randrange(max(1, state[0] - 70), state[0] + 1)
                out.append(put(seq, min(seq, state[1])))   # a retry (of a request kept, forgotten or never sent)
            elif r < 0.11:
                out.append(put(state[0], state[1], expected_version=999_999))   # rejected: a row of its own
                state[0] += 1
            else:
                out.append(put(state[0], state[1]))
                state[0] += 1
        if rng.random() < 0.15:
            rng.shuffle(out)
        return out


def build_stream(seed: int, entries: int = 1500, *, history_floors: bool = False,
                 client_sessions: bool = False) -> Stream:
    """The deterministic stream of `seed`: Raft entries (record batches of 1-6 events, now and
    then a leader's NOOP) from offset 0, grouped into apply() batches of 1-12 entries. With
    `history_floors`, now and then an entry of one `HistoryPruned` event raises the history floor to
    an offset 0-300 below its own (as the leader's compaction service does). With `client_sessions`,
    now and then an entry of client-session requests (`_ClientSessions`; drawn from a random source of
    its own, so the other entries are those of the stream without them)."""
    rng = random.Random(f"views-stream:{seed}")
    gen = _Gen(random.Random(rng.getrandbits(64)))
    sessions_rng = random.Random(f"client-sessions:{seed}")
    requests = _ClientSessions(sessions_rng)
    out: list[Entry] = []
    index, term = 0, 1
    for _ in range(entries):
        if client_sessions and sessions_rng.random() < 0.25:
            records = requests.records(index)
            data = bytearray(encode_batch(records, timestamp_ms=BASE_TIMESTAMP_MS + index))
            stamp(data, index, term)
            out.append(Entry(index, term, len(records), EntryKind.NORMAL, bytes(data)))
            index += len(records)
        if history_floors and rng.random() < 0.03:
            floor = max(0, index - rng.randrange(0, 300))
            data = bytearray(encode_batch([ev.event_record(ev.HistoryPruned(floor=floor, actor="epochlog/compaction"))],
                                          timestamp_ms=BASE_TIMESTAMP_MS + index))
            stamp(data, index, term)
            out.append(Entry(index, term, 1, EntryKind.NORMAL, bytes(data)))
            index += 1
            continue
        if rng.random() < 0.02:
            term += 1
            out.append(Entry(index, term, 1, EntryKind.NOOP, b""))
            index += 1
            continue
        count = rng.choice((1, 1, 1, 2, 3, 6))
        records = [gen.event(index + i) for i in range(count)]
        data = bytearray(encode_batch(records, timestamp_ms=BASE_TIMESTAMP_MS + index))
        stamp(data, index, term)
        out.append(Entry(index, term, count, EntryKind.NORMAL, bytes(data)))
        index += count
    batches: list[tuple[int, int]] = []
    pos = 0
    while pos < len(out):
        end = min(len(out), pos + rng.choice((1, 1, 2, 4, 8, 12)))
        batches.append((pos, end))
        pos = end
    return Stream(out, batches)


def say(line: str) -> None:
    os.write(1, (line + "\n").encode("ascii"))   # one write: a line never tears


def restore_with_crash(argv: list[str]) -> int:
    import shutil
    import signal
    import tarfile

    import statemachines.views as views_module

    group_dir, snapshot, index, point = Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    threading.Timer(MAX_SECONDS, os._exit, args=(3,)).start()
    sm = ViewsStateMachine(group_dir, CONFIG)
    events = 0

    def wrap(kind: str, fn):  # type: ignore[no-untyped-def]
        def step(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal events
            j = events
            events += 1
            where = str(args[-1] if kind == "makefile" else args[0])
            if point < 0:
                say(f"EVENT {j} {kind} {where}")
            if point == 2 * j:
                os.kill(os.getpid(), signal.SIGKILL)
            result = fn(*args, **kwargs)
            if point == 2 * j + 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return step

    tarfile.TarFile.makefile = wrap("makefile", tarfile.TarFile.makefile)  # type: ignore[method-assign]
    for name in ("rename", "unlink", "rmdir"):
        setattr(os, name, wrap(name, getattr(os, name)))
    shutil.rmtree = wrap("rmtree", shutil.rmtree)  # type: ignore[assignment]
    views_module.fsync_dir = wrap("fsync_dir", views_module.fsync_dir)  # type: ignore[attr-defined]
    sm.restore(snapshot, SnapshotMeta(index=index, term=1))
    say(f"RESTORED {sm.applied_index}")
    sm.close()
    os._exit(0)


class _KilledInRestore(ViewsStateMachine):
    def restore(self, path: Path, meta: SnapshotMeta) -> None:
        import signal

        say(f"RESTORE {meta.index}")
        os.kill(os.getpid(), signal.SIGKILL)


def follower(argv: list[str]) -> int:
    import asyncio

    from eventlog.raft.runtime.host import NodeHost
    from tests.support.hosts import GROUP, cluster_configs

    node_id, data_dir = int(argv[0]), Path(argv[1])
    ports, snapshot_every = [int(p) for p in argv[2].split(",")], int(argv[3])
    threading.Timer(MAX_SECONDS, os._exit, args=(3,)).start()

    async def run() -> None:
        host = NodeHost(node_id, data_dir, cluster_configs(ports, snapshot_every_entries=snapshot_every),
                        lambda name, directory: _KilledInRestore(directory), seed=node_id)
        await host.start()
        say("READY")
        while True:
            failed = host.groups[GROUP].failed
            if failed is not None:
                raise SystemExit(f"group failed: {failed!r}")
            await asyncio.sleep(0.05)

    asyncio.run(run())
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "restore":
        return restore_with_crash(argv[1:])
    if argv[0] == "follower":
        return follower(argv[1:])
    group_dir, snap_dir, stream_seed, child_seed = Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    threading.Timer(MAX_SECONDS, os._exit, args=(3,)).start()   # never outlive the test by much
    rng = random.Random(child_seed)
    stream = build_stream(stream_seed)
    bounds = stream.boundaries()
    snap_dir.mkdir(parents=True, exist_ok=True)
    sm = ViewsStateMachine(group_dir, CONFIG)
    say(f"READY {sm.applied_index}")
    snapshot: tuple[int, Path] | None = None
    restore_in = 0
    files = 0
    while True:
        todo = stream.batches_after(sm.applied_index)
        if not todo:
            break
        batch = todo[0]
        sm.apply(batch)
        assert sm.applied_index == batch[-1].last_index, (sm.applied_index, batch[-1])
        say(f"APPLIED {sm.applied_index}")
        if snapshot is None and rng.random() < 0.04:
            files += 1
            path = snap_dir / f"snap-{child_seed}-{files}.tar"
            sm.write_snapshot(path)
            snapshot = (sm.applied_index, path)
            restore_in = rng.randint(1, 6)
            say(f"SNAPSHOT {sm.applied_index} {files}")
        elif snapshot is not None:
            restore_in -= 1
            if restore_in <= 0:
                index, path = snapshot
                say(f"RESTORE {index} {files}")
                sm.restore(path, SnapshotMeta(index=index, term=1))
                assert sm.applied_index == index and index in bounds
                say(f"RESTORED {index}")
                snapshot = None
    say(f"DONE {sm.applied_index}")
    sm.close()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
