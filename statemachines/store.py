"""The RocksDB database behind a group's materialized views (rocksdict), under a memory budget.

Column families:

    brokers, broker_groups, topics, offsets, kv, leases, sessions, config, members, kafka_groups, users, acls
                  current state of each entity, key = entity key (e.g. b"kv/a/b")
    versions      MVCC history: entity key + b"\\0" + 8-byte big-endian offset -> the event type and
                  the entity's state after it (or a tombstone); serves `as_of` reads and `history`
                  (at views format level 2, most kinds' latest state is in the entity row only:
                  statemachines/views_format.py)
    lease_keys    lease id (20 digits) + b"/" + attached entity key -> b""
    dedupe        actor + b"\\0" + request id -> the offset and outcome of the first application
    dedupe_expiry 8-byte offset + dedupe key -> b"" (evicts request ids past the dedupe window)
    noops         8-byte offset -> outcome code: a record whose applying changed nothing (rejected, a
                  retried request id, skipped), written with the apply (statemachines/noops.py)
    client_sessions, session_outcomes, session_deadlines
                  live client sessions, the outcomes they keep, their expiry order
                  (statemachines/sessions.py)
    request_times 8-byte time (ms) of a time-ordered request id + dedupe key -> b"" (forgets those
                  request ids by committed time: statemachines/request_ids.py)
    producers, producer_deadlines
                  Kafka idempotent producers' sequence state and its expiry order
                  (statemachines/producers.py)
    default       meta: b"applied" (8-byte offset), b"digest" (running SHA-256 over applied mutations),
                  b"history_floor" (8-byte offset: history below it is pruned, see statemachines/prune.py),
                  b"noops_from" (8-byte offset: `noops` rows exist from there on), b"committed_ms" (the
                  committed clock), b"client_sessions_live" (how many sessions are live),
                  b"views_format" (8-byte level, statemachines/views_format.py; absent: level 1)

Memory: one LRU block cache (`block_cache_bytes`) holds data, index and filter blocks, and the
memtables of every column family are charged to it through a write buffer manager
(`write_buffer_bytes`), so resident memory stays bounded however many keys there are (the kv family's
memtables carry a bloom filter of their keys, 2 % of their size, in their own arena: charged alike). Index and
filter blocks are partitioned (about 4 KiB pieces under a small pinned top level): whole-file index
and filter blocks grow to hundreds of KiB per 64 MiB SST, and the cache is split into 64 shards of
1 MiB, so past ~1M keys they evicted each other and every lookup re-read and re-checksummed them
(apply fell from ~20,000 to 1,000-3,000 events/s; bench/views_bench.py).

Not thread-safe: used from the group's loop only (reads included), so a multi-key read never sees a
half-applied batch.
"""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
)

from eventlog.configuration import doc
from statemachines.store_keys import META, decode_offset, encode_offset, prefix_upper_bound

ENTITY_CFS = {"broker": "brokers", "group": "broker_groups", "topic": "topics", "offset": "offsets", "kv": "kv",
              "lease": "leases", "session": "sessions", "config": "config", "member": "members",
              "kafka-group": "kafka_groups", "user": "users", "acl": "acls"}
INTERNAL_CFS = ("versions", "lease_keys", "dedupe", "dedupe_expiry", "noops", "client_sessions", "session_outcomes",
                "session_deadlines", "request_times", "producers", "producer_deadlines")
ALL_CFS = (*ENTITY_CFS.values(), *INTERNAL_CFS)
APPLIED = b"applied"
DIGEST = b"digest"
HISTORY_FLOOR = b"history_floor"
NOOPS_FROM = b"noops_from"
MANY_TABLE_FILES = 256   # from here on a store opens its table files with 16 threads (file_opening_threads)


_CF_OF_KIND = {kind.encode(): cf for kind, cf in ENTITY_CFS.items()}


def cf_for(entity_key: bytes) -> str:
    return _CF_OF_KIND[entity_key.partition(b"/")[0]]   # KeyError: no entity kind


def version_key(entity_key: bytes, offset: int) -> bytes:
    return entity_key + b"\x00" + encode_offset(offset)


@dataclass(frozen=True, slots=True)
class ViewsConfig:
    """Memory and retention settings of the views (`[views]` in the node's TOML file)."""

    block_cache_bytes: int = field(default=64 << 20, metadata=doc(
        "LRU cache for data, index and filter blocks; memtables are charged to it too.", min=1 << 20))
    write_buffer_bytes: int = field(default=32 << 20, metadata=doc(
        "Total memtable memory of all column families (part of the block cache budget).", min=1 << 20))
    dedupe_window_offsets: int = field(default=1_000_000, metadata=doc(
        "A request id the node wrote itself (not a UUIDv7) is remembered for this many offsets, and no further "
        "back than the history floor. Clients use client sessions or UUIDv7 request ids, which do not depend on "
        "it (statemachines/sessions.py, request_ids.py).", min=1))
    client_session_timeout_ms: int = field(default=3_600_000, metadata=doc(
        "A client session expires this long (committed time) after its latest request; a retry after that "
        "is refused (session_expired), never applied twice. Stamped into each session as it opens, by the "
        "leader that opens it.", min=1_000, max=30 * 24 * 3600 * 1000))
    client_session_max_outcomes: int = field(default=10_000, metadata=doc(
        "Most request outcomes a client session keeps (requests it sent but has not seen answered): past it "
        "the oldest are forgotten, and their retries refused. Stamped into each session as it opens.",
        min=1, max=1_000_000))
    digest_checkpoint_offsets: int = field(default=10_000, metadata=doc(
        "The views note their running digest (meta `digest`) after each entry holding an offset that is a "
        "multiple of this minus one, so every member notes it at the same offsets; the last 16 are kept "
        "(in memory) and shown in status for the leader to compare (digest_check_interval_ms).",
        min=1, max=1 << 40))
    digest_check_interval_ms: int = field(default=60_000, metadata=doc(
        "How often the leader of a group compares its views digest with every member's, at the latest offset "
        "both noted one (epochlog/integrity.py): a mismatch raises the digest alarm (status, metric, CRITICAL "
        "log). 0: never.", min=0, max=86_400_000))
    client_sessions_max: int = field(default=100_000, metadata=doc(
        "Most live client sessions per group: opening one more evicts the session closest to expiry. Stamped "
        "into each session as it opens.", min=1, max=100_000_000))

    def validate(self, section: str = "views") -> None:
        from eventlog.errors import ConfigError

        if self.write_buffer_bytes > self.block_cache_bytes:
            raise ConfigError(f"{section}.write_buffer_bytes", self.write_buffer_bytes,
                              f"must fit in block_cache_bytes ({self.block_cache_bytes})")


class ViewStore:
    """The views database of one group."""

    def __init__(self, path: Path, db: Rdict) -> None:
        self.path = path
        self.db = db
        self.cfs = {name: db.get_column_family(name) for name in ALL_CFS}
        self.handles = {name: db.get_column_family_handle(name) for name in ALL_CFS}
        self.writes = 0   # write batches written: a copy of some of its rows is current while this stands

    @classmethod
    def open(cls, path: str | Path, config: ViewsConfig | None = None) -> ViewStore:
        config = config or ViewsConfig()
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        cache = Cache(config.block_cache_bytes)
        opts = _options(cache)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_write_buffer_manager(WriteBufferManager.new_write_buffer_manager_with_cache(
            config.write_buffer_bytes, False, cache))
        opts.set_max_file_opening_threads(file_opening_threads(p))
        db = Rdict(str(p), opts, column_families={name: _options(cache, name == "kv") for name in ALL_CFS})
        return cls(p, db)

    # --- reads ---------------------------------------------------------------------------------

    def get(self, cf: str, key: bytes) -> bytes | None:
        """A key of column family `cf` (META: the default column family, where meta keys live)."""
        value = self.db.get(key) if cf == META else self.cfs[cf].get(key)
        return value  # type: ignore[no-any-return]

    def get_many(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        """`get` of each key of column family `cf` (not META), in one call (RocksDB's multi-get): a
        batch's reads of its entity rows cost about two thirds of one call per key."""
        values = self.cfs[cf].get(keys)
        return values  # type: ignore[no-any-return]

    def meta(self, key: bytes) -> bytes | None:
        value = self.db.get(key)
        return value  # type: ignore[no-any-return]

    @property
    def applied(self) -> int:
        raw = self.db.get(APPLIED)
        return -1 if raw is None else decode_offset(raw)

    @property
    def history_floor(self) -> int:
        """The lowest offset `as_of` reads are answered for (0: all history is kept)."""
        raw = self.db.get(HISTORY_FLOOR)
        return 0 if raw is None else decode_offset(raw)

    def scan(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end) in order (end None: to the end of the column family)."""
        ro = ReadOptions()
        if end is not None:
            ro.set_iterate_upper_bound(end)
        it = self.cfs[cf].iter(ro)
        it.seek(start)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def scan_prefix(self, cf: str, prefix: bytes, start_after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        start = prefix if start_after is None else start_after + b"\x00"
        return self.scan(cf, max(start, prefix), prefix_upper_bound(prefix))

    def last_at_or_before(self, cf: str, key: bytes, lower: bytes) -> tuple[bytes, bytes] | None:
        """The last entry with a key in [lower, key] (seek_for_prev).

        No iterate_lower_bound: in rocksdict 0.3.29 it behaves like an upper bound (a seek inside
        the range finds nothing), so the range is checked here instead.
        """
        it = self.cfs[cf].iter()
        it.seek_for_prev(key)
        if it.valid() and it.key() >= lower:
            return it.key(), it.value()
        return None

    # --- writes --------------------------------------------------------------------------------

    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def put(self, batch: WriteBatch, cf: str, key: bytes, value: bytes) -> None:
        batch.put(key, value, self.handles[cf])

    def delete(self, batch: WriteBatch, cf: str, key: bytes) -> None:
        batch.delete(key, self.handles[cf])

    def put_meta(self, batch: WriteBatch, key: bytes, value: bytes) -> None:
        batch.put(key, value)

    def put_all(self, batch: WriteBatch, cf: str, pending: dict[bytes, bytes | None]) -> None:
        """Every write of `pending` (None: delete) to column family `cf` (META: meta keys, None writes b"")."""
        if cf == META:
            for key, value in pending.items():
                batch.put(key, value or b"")
            return
        handle = self.handles[cf]
        put, delete = batch.put, batch.delete
        for key, value in pending.items():
            if value is None:
                delete(key, handle)
            else:
                put(key, value, handle)

    def write(self, batch: WriteBatch) -> None:
        """Atomic across column families (checked with kill -9, see LIBRARY-FACTS)."""
        self.writes += 1   # before: a failed write may have written it all the same
        self.db.write(batch)

    # --- snapshots -----------------------------------------------------------------------------

    def write_snapshot(self, target: Path) -> int:
        """A RocksDB checkpoint of the current state, packed as one tar file at `target`; returns the
        applied offset it holds. All on the calling thread (ViewsStateMachine.snapshot_job spreads the
        same steps over a thread and the loop)."""
        self.flush()
        ckpt = target.with_name(target.name + ".ckpt")
        applied = self.checkpoint(ckpt)
        self.pack_checkpoint(ckpt, target)
        return applied

    def flush(self) -> None:
        """Write every column family's memtable to disk (RocksDB releases the GIL meanwhile: run it
        in a thread), so that a checkpoint taken next has little left to flush."""
        for name in ALL_CFS:
            self.cfs[name].flush()
        self.db.flush()

    def checkpoint(self, directory: Path) -> int:
        """A RocksDB checkpoint (hard links) in `directory`; the applied offset it holds. It holds the GIL
        while it runs (quick after `flush`); call it where no apply can run meanwhile: the group's loop."""
        shutil.rmtree(directory, ignore_errors=True)
        Checkpoint(self.db).create_checkpoint(str(directory))
        return self.applied

    def pack_checkpoint(self, directory: Path, target: Path) -> None:
        """Pack a checkpoint directory into the tar file `target` and remove it (files only: any thread)."""
        try:
            with tarfile.open(target, "w") as tar:
                for f in sorted(directory.iterdir()):
                    tar.add(f, arcname=f.name)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    @staticmethod
    def unpack_snapshot(source: Path, directory: Path) -> None:
        """Unpack a snapshot file made by `write_snapshot` into an empty `directory`."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        with tarfile.open(source, "r") as tar:
            tar.extractall(directory, filter="data")

    def close(self) -> None:
        """Close the database. rocksdict releases the directory's lock only once no column family
        object refers to it any more, so the store drops its own references first."""
        self.cfs.clear()
        self.handles.clear()
        self.db.close()


def file_opening_threads(path: Path) -> int:
    """Threads RocksDB opens the table files with when it opens the store: RocksDB's 16 only when there
    are many. It starts that many threads for each column family (24 here) at every open, however few
    files there are: reopening a small store took 50 ms of CPU and 110 ms of wall, 26 and 30 with one
    (bench/RESULTS.md startup-cost), and a node opens three at every start."""
    tables = sum(1 for _ in path.glob("*.sst"))
    return 1 if tables < MANY_TABLE_FILES else 16


def _options(cache: Cache, memtable_bloom: bool = False) -> Options:
    opts = Options(raw_mode=True)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    if memtable_bloom:
        # A bloom filter of the memtable's keys, 2 % of its size (in its arena: charged to the write
        # buffers). Every apply call reads the kv row of each key its puts name (`get_many`), and a new
        # key's (absent) walked each memtable's skip list: 1.7-2.1 -> 0.6-0.7 us per absent key on a
        # scratch store (bench/RESULTS.md issue-20-follower-decode). Reads only: what is stored is the same.
        opts.set_memtable_prefix_bloom_ratio(0.02)
        opts.set_memtable_whole_key_filtering(True)
    return opts
