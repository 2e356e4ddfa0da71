"""Applying committed events to the views: deterministic, exactly once, all or nothing per batch.

`Applier.apply_entries` turns committed Raft entries into ONE RocksDB WriteBatch holding every view
mutation and the new applied offset, so a crash at any point neither loses nor repeats an event: on
restart the views say which offset they reached and the log replays what follows.

Per record: decode the event with `events.applicable` (the test the leader also runs before
proposing; on the leader, the event it decoded then, `Applier.expect`); if its request id was seen
within the dedupe window (and at or above the history floor, below which request ids are forgotten
too), return the first outcome and change nothing; check its conditions (epochs, expected
versions) against the current state, including the writes of earlier records in the same batch; then
write the new entity state, its history row in `versions` (at views format level 2, for most kinds, the
row of the state it replaces: statemachines/views_format.py), and lease attachments. A rejected event
changes nothing (savepoints, or handlers that write only once they cannot reject); every record that changed nothing
gets a `noops` row at its offset in the same WriteBatch (statemachines/noops.py: key compaction drops
those records).

An apply call is `prepare` (every decision, the outcomes and the WriteBatch, nothing written) then `commit`
(the write); the leader prepares its newest entry before it commits and commits it when it does, or
`abandon`s it when something else came first (statemachines/views.py `ViewsStateMachine.speculate`).

Per entry, what can be: the kv rows its records name are read in one RocksDB multi-get before its
records are applied (`Overlay.prefetch`), and a client session's write of n requests (n consecutive
records) is admitted and recorded as a whole once its first request is (`sessions.RunExtension`: the
decisions and bytes that admitting and recording each request would make); its plain puts are then
applied in one loop (`Applier._extend_run`), which hands anything else back to the generic path.

A record this code cannot apply, two cases:

- No version applies it (not msgpack, a field of the wrong type, invalid fields): it is REJECTED,
  alike on every replica (same bytes, same code, same outcome; the digest stays equal).
- This node cannot apply it but another may (a newer schema version or an unknown type, written by
  a newer Epochlog in a mixed-version cluster or by an older one that did not check; an event
  nested deeper than this process decodes; a handler failing unexpectedly, i.e. a bug): the group
  HALTS on this node before the entry holding it (`Applier.halt`). Nothing of that entry is
  applied, later entries are not applied either (their outcome is `group_halted`), and nothing
  raises: the node and its other groups go on. Applying it differently from a peer that can is
  never an option. A restart replays up to the same entry and halts again, so the node never
  crash-loops; a restart of an upgraded node applies it. When no version will ever apply it, the
  operator skips it on every node (`skip(offset)`, `epochlog group skip`): the record is then
  recorded as `skipped` (changing nothing, like a rejection) and the skip is remembered in the
  views, so a replay skips it again.

Determinism: only the events decide the mutations (no clocks, no randomness, no iteration over
unordered sets). A running digest chains, per entry, the sorted mutations it made, so replicas that
applied the same entries hold the same digest whatever batches they applied them in.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import msgspec

from eventlog.errors import (ALREADY_EXISTS, CONDITION_FAILED, HALTED, INVALID_ARGUMENT, NOT_FOUND,
                             VERSION_MISMATCH, InvalidBatchError)
from eventlog.errors import SKIPPED as SKIPPED_CODE   # the reason (SKIPPED below is a meta key)
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import (COMPRESSION_MASK, HEADER_SIZE, LOG_OVERHEAD, MAGIC, MIN_BATCH_LENGTH, NO_PRODUCER_ID,
                              BatchHeader, RecordBatch, Row, record_rows, records_payload)
from eventlog.records import read_header   # the leader's own batches (`Applier.proposed`)
from statemachines import events as ev
from statemachines import brokers, producers, request_ids, sessions, views_format
from statemachines.deadlines import Deadlines
from statemachines.kept_outcomes import KeptOutcomes
from statemachines.noops import CF as NOOPS
from statemachines.noops import ensure_noops_from
from statemachines.state import (
    AclState,
    BrokerState,
    ConfigState,
    GroupState,
    KafkaGroupState,
    KvState,
    LeaseState,
    MemberState,
    OffsetState,
    Outcome,
    SessionState,
    TopicState,
    UserState,
    Version,
    decode_outcome,
    decode_state,
    encode,
)
from statemachines.store import (
    ALL_CFS,
    APPLIED,
    DIGEST,
    HISTORY_FLOOR,
    META,
    ViewsConfig,
    ViewStore,
    WriteBatch,
    cf_for,
    decode_offset,
    encode_offset,
    prefix_upper_bound,
    version_key,
)

DEDUPE_EVICTED = b"dedupe_evicted_to"
EVICT_PER_ENTRY = 128
"""Request ids forgotten per entry at most, beyond the entry's own record count (so eviction always
outpaces new request ids, and costs each entry about what its own records do): a history floor that
jumps far ahead drains over the next entries instead of stalling one apply call (per entry, not per
call, so replicas stay identical)."""
SKIPPED = b"skipped_offsets"    # meta: msgpack list of the offsets the operator skipped (`Applier.skip`)
DIGEST_CHECKPOINTS_KEPT = 16   # (offset, digest) notes an applier keeps for the leader's comparison
EXPECTED_BYTES = 16 << 20
"""Record values a leader's applier holds decoded at most (`Applier.expect`): past it they are dropped,
and those records are decoded when applied, as any other."""
PROPOSED_BYTES = 16 << 20
"""Batches a leader's applier holds with their records (`Applier.proposed`) at most: past it they are
dropped, and those entries are parsed when applied, as any other."""
UPGRADE = "upgrade this node: a restart of a newer Epochlog applies it"
_SKIP_HINT = ("if no Epochlog version can apply it (e.g. a node before the leader check accepted it), "
              "skip it on every node: epochlog group skip --group {group} --offset {offset}")


@dataclass(frozen=True, slots=True)
class Halt:
    """Why applying stopped on this node: the record at `offset` cannot be applied by this code.

    The views end just before the entry holding it. `fix` says what the operator does about it.
    """

    offset: int
    reason: str
    fix: str

    def describe(self, group: str) -> str:
        return (f"group {group} halted at offset {self.offset}: {self.reason}; {self.fix}; "
                + _SKIP_HINT.format(group=group, offset=self.offset))


class _CannotApply(Exception):
    """Raised inside `apply_entries` for a record this node cannot apply (becomes `Applier.halt`)."""

    def __init__(self, offset: int, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.halt = Halt(offset, reason, fix)


@dataclass(slots=True)
class Prepared:
    """An apply call up to its write (`Applier.prepare`): what `Applier.commit` writes and hands over."""

    entries: Sequence[Entry]
    outcomes: dict[int, Outcome]
    batch: WriteBatch | None                      # None: the applied offset does not move
    writes: dict[str, dict[bytes, bytes | None]]  # the batch's rows by column family
    applied: int                                  # the applied offset it writes
    digest: bytes
    lease_changes: list[tuple[int, int, int]]
    checkpoints: list[tuple[int, bytes]]          # digest checkpoints it reached
    access_changes: int                           # user and ACL events in it
    halt_before: Halt | None
    store_writes: int                             # `store.writes` it was prepared at


class Overlay:
    """Pending writes over the store (or a parent overlay): reads see them before they are written.

    Writes are kept per column family, so a scan merges only its own family's pending writes: with
    every write of an apply call in one dict, each scan walked all of them (a client session's
    `_forget` per request, and the expiries per entry: quadratic in the entries of a call).

    Reads of the store are remembered in the root overlay (`reads`, shared by its children): the store
    does not change while overlays over it live (the applier writes it once, after its last use of
    them), and a client session's rows are read for every request of it. The reads of meta and client
    session rows outlive the call: the applier hands every call's root overlay the ones it kept
    (`Applier._overlay`)."""

    def __init__(self, store: ViewStore, parent: Overlay | None = None) -> None:
        self.store = store
        self.parent = parent
        self.writes: dict[str, dict[bytes, bytes | None]] = {}   # column family -> key -> value (None: deleted)
        self.reads: dict[str, dict[bytes, bytes | None]] = {} if parent is None else parent.reads

    def get(self, cf: str, key: bytes) -> bytes | None:
        layer: Overlay | None = self
        while layer is not None:
            pending = layer.writes.get(cf)
            if pending is not None:
                hit = pending.get(key, _MISSING)
                if hit is not _MISSING:
                    return hit  # type: ignore[return-value]
            layer = layer.parent
        reads = self.reads.get(cf)
        if reads is None:
            reads = self.reads[cf] = {}
        else:
            hit = reads.get(key, _MISSING)
            if hit is not _MISSING:
                return hit  # type: ignore[return-value]
        value = reads[key] = self.store.get(cf, key)
        return value

    def prefetch(self, cf: str, keys: list[bytes]) -> None:
        """Read the rows of `keys` in `cf` that no read has yet, in one call to the store, for the `get`s
        that follow: the answers are the store's either way (it does not change while overlays over it live)."""
        reads = self.reads.get(cf)
        if reads is None:
            reads = self.reads[cf] = {}
        missing = [key for key in keys if key not in reads]
        if missing:
            reads.update(zip(missing, self.store.get_many(cf, missing)))

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        pending = self.writes.get(cf)
        if pending is None:
            pending = self.writes[cf] = {}
        pending[key] = value

    def delete(self, cf: str, key: bytes) -> None:
        pending = self.writes.get(cf)
        if pending is None:
            pending = self.writes[cf] = {}
        pending[key] = None

    def scan(self, cf: str, start: bytes, end: bytes | None, limit: int | None = None) -> list[tuple[bytes, bytes]]:
        """Live keys in [start, end), pending writes merged over the store, in key order: the first
        `limit` or fewer of them (always a prefix of the whole answer), or all of them.

        Materializes what it returns: for small ranges (one lease's keys) or with a limit.
        """
        stored = list(itertools.islice(self.store.scan(cf, start, end), limit))
        if limit is not None and len(stored) == limit:
            end = stored[-1][0] + b"\x00"   # past the store's last row, pending writes could skip some
        merged: dict[bytes, bytes | None] = dict(stored)
        chain = []
        layer: Overlay | None = self
        while layer is not None:
            chain.append(layer)
            layer = layer.parent
        for layer in reversed(chain):  # inner layers' writes win
            for k, v in layer.writes.get(cf, _NONE).items():
                if k >= start and (end is None or k < end):
                    merged[k] = v
        live = [(k, v) for k, v in sorted(merged.items()) if v is not None]
        return live if limit is None else live[:limit]

    def commit_to_parent(self) -> None:
        parent = self.parent
        assert parent is not None
        for cf, pending in self.writes.items():
            into = parent.writes.get(cf)
            if into is None:
                parent.writes[cf] = pending
            else:
                into.update(pending)
        self.writes = {}


_NONE: dict[bytes, bytes | None] = {}
_MISSING = object()
SESSIONS = sessions.SESSIONS
_EXPIRIES: tuple[tuple[Deadlines, Callable[[Applier, Overlay], None]], ...] = (
    (sessions.DEADLINES, lambda a, ov: sessions.expire(ov, a.kept_outcomes, a.now_ms)),
    (request_ids.TIMES, lambda a, ov: request_ids.forget(ov, a.now_ms)),
    (producers.DEADLINES, lambda a, ov: producers.expire(ov, a.now_ms)),
)
"""What an entry expires, in this order, after its records: each deadline index with its expiry."""
_KEPT_FAMILIES = (META, SESSIONS)
"""Column families whose rows an applier keeps read from one apply call to the next (`Applier._overlay`)."""


Handler = Callable[["Applier", Overlay, ev.Event, int], Outcome]


class Applier:
    """Applies committed entries of one group to its views. Call from the group's loop only."""

    def __init__(self, store: ViewStore, config: ViewsConfig | None = None) -> None:
        self.store = store
        self.config = config or ViewsConfig()
        # (lease id, ttl ms or 0 when it ended, offset) of the last apply call, for the leader's clocks
        self.lease_changes: list[tuple[int, int, int]] = []
        # Bumped by every user or ACL event applied: the faces' caches of principals drop then
        # (epochlog/access_control.py).
        self.access_changes = 0
        self.halt: Halt | None = None      # set when a record cannot be applied here (see the module doc)
        raw = store.meta(SKIPPED)
        self.skipped: frozenset[int] = frozenset(msgspec.msgpack.decode(raw, type=list[int]) if raw else ())
        self.noops_from = ensure_noops_from(store)
        self.now_ms: int = 0   # the committed clock at the entry being applied (statemachines/sessions.py)
        # (offset, digest) after each entry holding an offset k * digest_checkpoint_offsets - 1: the same
        # offsets on every member (entries have the same bounds everywhere), compared by the leader
        # (epochlog/integrity.py). In memory: after a restart the next ones are noted.
        self.digest_checkpoints: deque[tuple[int, bytes]] = deque(maxlen=DIGEST_CHECKPOINTS_KEPT)
        # record value -> (record key, the event `applicable` decodes from the value): see `expect`
        self._expected: dict[bytes, tuple[bytes, ev.Event]] = {}
        self._expected_bytes = 0
        # entry index -> (its batch as proposed, its records): see `proposed`
        self._proposed: dict[int, tuple[bytes, list[tuple[bytes | None, bytes | None]]]] = {}
        self._proposed_bytes = 0
        self.records_handed = 0           # records applied from `proposed` (not parsed)
        self.records_parsed_instead = 0   # entries proposed here whose bytes differed when applied
        # which client-session requests have an outcome row, in step with the pending writes: cleared
        # whenever pending writes are abandoned (statemachines/kept_outcomes.py)
        self.kept_outcomes: KeptOutcomes = KeptOutcomes(self.config.client_sessions_max)
        # the views format level (statemachines/views_format.py), in step with the pending writes: read
        # again from what is written whenever pending writes are abandoned
        self.level = views_format.decode_level(store.meta(views_format.META_KEY))
        # The meta rows (a small fixed set: applied offset, digest, clocks, counts, deadline checks) and
        # the client sessions' rows (at most `client_sessions_max` live) as stored, kept from one apply
        # call to the next while nothing else writes the store (store.writes is `_meta_at`): an entry reads
        # about ten meta rows and its session's row, each a RocksDB read per call otherwise.
        self._kept_rows: dict[str, dict[bytes, bytes | None]] = {cf: {} for cf in _KEPT_FAMILIES}
        self._meta_at = -1
        # Per deadline index of `_EXPIRIES`: the committed time before which its `due` finds nothing and
        # writes nothing (its `checked` row, which `due` alone writes, is under `check_ms` old), as the kept
        # rows say: dropped with them (another writer, a failed write). 0: look.
        self._quiet_until = [0] * len(_EXPIRIES)

    def expect(self, records: Iterable[tuple[bytes, bytes, ev.Event]]) -> None:
        """Records this node is about to propose as the leader, each with the event `events.applicable`
        decoded from its value (`events.checked_record`): applying a record with that very key and value
        takes the event from here instead of decoding and checking the value again. A memo of a pure
        function of the bytes, so the outcome is the same; any other record (on a follower, from another
        proposer, one this memo dropped) is decoded and checked as always. Held until applied, at most
        EXPECTED_BYTES of values (what never gets applied here, e.g. refused on a follower, is dropped
        with the rest when that overflows)."""
        expected = self._expected
        for key, value, event in records:
            if self._expected_bytes > EXPECTED_BYTES:
                expected.clear()
                self._expected_bytes = 0
            expected[value] = (key, event)
            self._expected_bytes += len(value)

    def proposed(self, index: int, data: bytes, records: list[tuple[bytes | None, bytes | None]]) -> None:
        """An entry this node just proposed as the leader: the batch it encoded (`data`, before the log
        stamped its base offset and term) and the records in it. Applying entry `index` takes its records
        from here instead of parsing its batch, but only if its bytes are these (the stamped fields
        aside): then parsing would give these very records (`encode_batch` and `decode_records` are exact
        inverses; tests/statemachines/test_proposed_records.py). Any other entry (another leader's at
        that index, one read back from disk that differs, any entry after a restart or on a follower) is
        parsed as always. Held until that index is applied, at most PROPOSED_BYTES."""
        if any(type(k) is not bytes and k is not None or type(v) is not bytes and v is not None
               for k, v in records):
            return   # only what parsing makes (bytes or None) stands in for parsing
        if self._proposed_bytes > PROPOSED_BYTES:
            self._proposed.clear()
            self._proposed_bytes = 0
        self._proposed[index] = (data, records)
        self._proposed_bytes += len(data)

    def _proposed_records(self, entry: Entry) -> tuple[BatchHeader, list[Row]] | None:
        """The header and records of NORMAL `entry` from `proposed`, when this node built exactly its bytes
        (None: parse it). Forgets what was proposed at or below its index (applied or replaced)."""
        memo = self._proposed
        held = memo.pop(entry.index, None)
        if held is not None:
            self._proposed_bytes -= len(held[0])
        if memo and min(memo) < entry.index:
            for index in [i for i in memo if i < entry.index]:
                self._proposed_bytes -= len(memo.pop(index)[0])
        if held is None:
            return None
        data, records = held
        applied = entry.data
        # Equal but for baseOffset (0:8) and partitionLeaderEpoch (12:16), which the log stamps; the CRC
        # does not cover them (eventlog/records.py).
        if (len(applied) != len(data) or applied[8:12] != data[8:12] or applied[16:] != data[16:]
                or len(records) != entry.count):
            self.records_parsed_instead += 1
            return None
        header = read_header(applied)
        base = header.base_offset
        self.records_handed += len(records)
        return header, [(base + i, key, value) for i, (key, value) in enumerate(records)]

    def skip(self, offset: int) -> None:
        """Record, durably, that the record at `offset` (where this applier halted) is skipped: applied
        as a rejection that changes nothing. The halt stays until `apply_entries(..., resume=True)`
        got past it; the operator's command does that (epochlog.halts)."""
        if self.halt is None or self.halt.offset != offset:
            where = "is not halted" if self.halt is None else f"is halted at offset {self.halt.offset}"
            raise ev.EventError(f"cannot skip offset {offset}: this group {where} (only the record it halted "
                                f"at can be skipped)")
        skipped = sorted(self.skipped | {offset})
        wb = self.store.new_batch()
        self.store.put_meta(wb, SKIPPED, msgspec.msgpack.encode(skipped))
        self.store.write(wb)
        self.skipped = frozenset(skipped)

    def apply_entries(self, entries: Sequence[Entry], *, resume: bool = False) -> dict[int, Outcome]:
        """Apply entries (offset order, after the applied offset) in one WriteBatch; outcomes by offset.

        While halted, entries are not applied (outcome `group_halted`); `resume=True` applies them
        anyway (the caller re-reads them from the log after a skip or an upgrade) and halts again only
        on another record it cannot apply."""
        return self.commit(self.prepare(entries, resume=resume))

    def prepare(self, entries: Sequence[Entry], *, resume: bool = False) -> Prepared:
        """Everything `apply_entries` does but the write: the outcomes and the WriteBatch, held until
        `commit` writes them or `abandon` forgets them. Nothing else may write the store meanwhile (`commit`
        checks it), and no other call of this applier may come between (its state is the prepared call's).

        Lets a leader apply an entry while its followers store it: the commit then only writes
        (statemachines/views.py `ViewsStateMachine.speculate`). What others read of this applier changes at
        `commit` only (the lease changes, the digest checkpoints, `access_changes`); a halt and a raised
        views format level are this call's at once (`ViewsStateMachine.speculate` abandons such a call)."""
        store = self.store
        halt_before, access_before = self.halt, self.access_changes
        self.lease_changes = []
        checkpoints: list[tuple[int, bytes]] = []
        batch_ov = self._overlay()
        outcomes: dict[int, Outcome] = {}
        digest = batch_ov.get(META, DIGEST) or b""
        raw_applied = batch_ov.get(META, APPLIED)
        applied = applied_before = -1 if raw_applied is None else decode_offset(raw_applied)
        halted = None if resume else self.halt
        for entry in entries:
            last = entry.last_index
            if last <= applied:
                continue  # already in the views (a restart replays from the persisted commit)
            if halted is not None:
                _not_applied(outcomes, entry, halted)
                continue
            assert entry.index == applied + 1, f"gap: entry {entry.index} after applied offset {applied}"
            entry_ov = Overlay(store, batch_ov)
            leases_before = len(self.lease_changes)
            try:
                if entry.kind is EntryKind.NORMAL:
                    handed = self._proposed_records(entry) if self._proposed else None
                    header, records = _records(entry, self.skipped) if handed is None else handed
                    if len(records) > 1:   # the rows the KvPuts read, in one call (a new key's is absent: a read per key)
                        kv_rows = [key for _, key, _ in records if key is not None and key[:3] == b"kv/"]
                        if len(kv_rows) > 1:   # one row: its handler's own read (a multi-get of one costs more)
                            entry_ov.prefetch("kv", kv_rows)
                    self.now_ms = sessions.Clock.advance(entry_ov, header.max_timestamp if header else 0)
                    instead = _producer_batch(entry_ov, entry, header, records, self.now_ms)
                    if instead is None:
                        self._apply_records(entry_ov, records, outcomes)
                    else:
                        for i, (offset, _, _) in enumerate(records):
                            outcomes[offset] = msgspec.structs.replace(instead, offset=instead.offset + i)
                    _record_noops(entry_ov, entry, outcomes)
                    self._expire(entry_ov)
            except _CannotApply as stop:   # nothing of this entry is applied: the views end before it
                self.kept_outcomes.clear()   # it followed the entry's abandoned writes
                self.level = views_format.decode_level(batch_ov.get(META, views_format.META_KEY))
                halted = self.halt = stop.halt
                del self.lease_changes[leases_before:]
                _not_applied(outcomes, entry, halted)
                continue
            self._evict_dedupe(entry_ov, last, EVICT_PER_ENTRY + entry.count)
            digest = _chain(digest, last, entry_ov.writes)
            every = self.config.digest_checkpoint_offsets
            if (last + 1) // every > entry.index // every:
                checkpoints.append((last, digest))
            entry_ov.commit_to_parent()
            applied = last
        batch = None
        if applied != applied_before:
            batch = store.new_batch()
            for cf, pending in batch_ov.writes.items():
                store.put_all(batch, cf, pending)
            store.put_meta(batch, APPLIED, encode_offset(applied))
            store.put_meta(batch, DIGEST, digest)
        lease_changes, self.lease_changes = self.lease_changes, []
        access_changes, self.access_changes = self.access_changes - access_before, access_before
        return Prepared(entries, outcomes, batch, batch_ov.writes, applied, digest, lease_changes, checkpoints,
                        access_changes, halt_before, store.writes)

    def commit(self, prepared: Prepared) -> dict[int, Outcome]:
        """Write what `prepare` made (one WriteBatch) and make its changes this applier's; its outcomes."""
        store = self.store
        if store.writes != prepared.store_writes:
            raise AssertionError("the views store was written between an apply's prepare and its commit")
        self.lease_changes = prepared.lease_changes
        self.access_changes += prepared.access_changes
        if prepared.batch is None:
            return prepared.outcomes
        self._meta_at = -1   # until written: a failed write leaves the stored rows unknown
        try:
            store.write(prepared.batch)
        except BaseException:
            self.kept_outcomes.clear()   # it followed writes that did not happen
            self.level = views_format.decode_level(store.meta(views_format.META_KEY))
            raise
        self.digest_checkpoints.extend(prepared.checkpoints)
        self._rows_written(prepared.writes, prepared.applied, prepared.digest)
        return prepared.outcomes

    def abandon(self, prepared: Prepared) -> None:
        """Forget a prepared call (not committed): this applier is as if it had not run (what it read
        and decoded on the way is read and decoded again when needed)."""
        self._undo(prepared.halt_before)

    def recover(self, halt_before: Halt | None, access_before: int) -> None:
        """After a `prepare` that raised (given what `halt` and `access_changes` were before it): as if it had
        not run."""
        self.access_changes = access_before
        self.lease_changes = []
        self._undo(halt_before)

    def _undo(self, halt_before: Halt | None) -> None:
        self.kept_outcomes.clear()   # it followed the abandoned writes
        self.level = views_format.decode_level(self.store.meta(views_format.META_KEY))
        self.halt = halt_before
        self._meta_at = -1   # drops the quiet expiries, decided on its pending writes (and the kept rows)

    def _overlay(self) -> Overlay:
        """The root overlay of an apply call, its reads of meta and client-session rows taken from
        `_kept_rows` while those are current (the store was written by nothing but this applier since they
        were read)."""
        ov = Overlay(self.store)
        kept = self._kept_rows
        if self._meta_at != self.store.writes or len(kept[SESSIONS]) > 2 * self.config.client_sessions_max:
            # the second: absent rows (requests naming unknown sessions) are kept too, so they are bounded
            kept = self._kept_rows = {cf: {} for cf in _KEPT_FAMILIES}
            self._meta_at = self.store.writes
            self._quiet_until = [0] * len(_EXPIRIES)
        ov.reads.update(kept)   # reads of the store, the only thing an Overlay keeps there
        return ov

    def _rows_written(self, pending: dict[str, dict[bytes, bytes | None]], applied: int, digest: bytes) -> None:
        """The batch of `pending` writes, the applied offset and the digest is written: the kept rows are
        as stored again (`ViewStore.put_all` stores b"" for a meta row's None, deletes for another's)."""
        rows = self._kept_rows[META]
        for key, value in pending.get(META, _NONE).items():
            rows[key] = b"" if value is None else value
        rows[APPLIED] = encode_offset(applied)
        rows[DIGEST] = digest
        written = pending.get(SESSIONS)
        if written:
            self._kept_rows[SESSIONS].update(written)
        self._meta_at = self.store.writes

    def _expire(self, ov: Overlay) -> None:
        """The entry's expiries (sessions, time-ordered request ids, producers: statemachines/deadlines.py),
        each skipped while its `due` is known to do nothing: before `checked` + `check_ms` it returns no
        items and writes nothing, and `checked` changes only when it runs (or another writer writes the
        store, which drops `_quiet_until`), so skipping it is the same writes."""
        now = self.now_ms
        quiet = self._quiet_until
        for i, (deadlines, expire) in enumerate(_EXPIRIES):
            if now < quiet[i]:
                continue
            expire(self, ov)
            raw = ov.get(META, deadlines.checked)
            quiet[i] = 0 if raw is None else decode_offset(raw) + deadlines.check_ms

    # --- records ------------------------------------------------------------------------------

    def _apply_records(self, ov: Overlay, records: list[Row], outcomes: dict[int, Outcome]) -> None:
        """Apply the records of a NORMAL entry in offset order, each one's outcome into `outcomes`.

        A client session's write of n requests is n consecutive records; once the first is applied, the
        next ones that extend its outcome run skip the session's `admit` and `record` (sessions.
        RunExtension: the decisions and the bytes those would make), a KvPut's handler alone. Anything
        else ends the extension (its run row written) before it is applied."""
        run: sessions.RunExtension | None = None
        last: tuple[sessions.Admission, ev.Event, Outcome] | None = None   # a session's KvPut, just recorded
        event: ev.Event
        i, n = 0, len(records)
        while i < n:
            offset, key, value = records[i]
            i += 1
            decoded = self._decode(key, value, offset)
            if (last is not None or run is not None) and type(decoded) is tuple and decoded[1] is None \
                    and type(decoded[0]) is ev.KvPut:
                event = decoded[0]
                if run is None:
                    run = sessions.RunExtension.start(ov, *last, self.level, event, offset)  # type: ignore[misc, call-arg]
                if run is not None and run.admits(event, offset):
                    outcome = outcomes[offset] = self._handle(ov, event, offset)
                    if outcome.ok and not outcome.code and not outcome.message and not outcome.duplicate:
                        run.extend()
                        i = self._extend_run(ov, run, records, i, outcomes)
                        continue
                    run.close(ov)
                    sessions.record(ov, run.admission(), event, outcome)
                    run = last = None
                    continue
            if run is not None:
                run.close(ov)
                run = None
            last = None
            if type(decoded) is not tuple:
                outcomes[offset] = decoded   # type: ignore[assignment]
                continue
            event, invalid = decoded
            outcome, admitted = self._apply_event(ov, event, invalid, offset)
            outcomes[offset] = outcome
            if admitted is not None and type(event) is ev.KvPut:
                last = (admitted, event, outcome)
        if run is not None:
            run.close(ov)

    def _extend_run(self, ov: Overlay, run: sessions.RunExtension, records: list[Row], i: int,
                    outcomes: dict[int, Outcome]) -> int:
        """Apply `records[i:]` while each is a plain put extending `run`; the index of the first one it did
        not apply (the generic path's, from `_decode` on).

        The fast path of batched writes: one frame per record instead of about ten (`_decode`, `applicable`,
        `decode_event`, `validate`, `admits`, `_handle`, `_kv_put`, `extend`), the same decisions and writes.
        It takes a record only when the generic path would (1) decode it to a valid KvPut of this code's
        version whose key is its record key (the leader's memo, `expect`, or `events.decode_event` without
        its error wording: any error hands the record over, to be decoded and worded there), (2) admit it
        as the run's next (`RunExtension.admits`), and (3) have `_kv_put` end it plain ok without touching
        a lease or a compare-and-set: no lease on the put nor on the row it replaces, no expected version.
        Anything else, checked before its first write, goes to the generic path, which decides it from
        scratch (a memo popped here is decoded there: the same event). tests/statemachines/
        test_put_runs.py applies random logs with and without it."""
        if self.skipped or self.level < 2:
            return i
        n = len(records)
        expected = self._expected
        decode = ev.decode_any
        KvPut = ev.KvPut
        newest = KvPut.VERSION
        get, put = ov.get, ov.put
        # `get` and `put` of kv rows inlined: this overlay's pending kv writes, and (when no layer below
        # has any: the entry's overlay right over a call's first entry) the store's rows read already
        kv_written = ov.writes.get("kv")
        if kv_written is None:
            kv_written = ov.writes["kv"] = {}
        layer, kv_read = ov.parent, ov.reads.get("kv")
        while layer is not None and kv_read is not None:
            if layer.writes.get("kv"):
                kv_read = None
            layer = layer.parent
        sid, kept_from, seq_limit = run.sid, run.session.kept_from, run.seq_limit
        next_seq, next_offset = run.next_seq, run.next_offset
        ends = run.seqs.ends
        start = i
        while i < n:
            offset, key, value = records[i]
            if offset != next_offset or value is None:
                break
            event = None
            if expected:
                held = expected.pop(value, None)
                if held is not None:
                    self._expected_bytes -= len(value)
                    if held[0] == key:
                        event = held[1]   # `applicable` passed it: valid, of a version this code knows
            if event is None:
                try:
                    event = decode(value)
                except Exception:   # the generic path decodes it again, and words or halts on it
                    break
                if type(event) is not KvPut or event.v > newest or not event.plainly_valid():
                    break
            elif type(event) is not KvPut:
                break
            if (event.session_id != sid or event.seq != next_seq or next_seq >= seq_limit
                    or event.answered_below > kept_from or event.lease or event.expected_version is not None):
                break
            name = event.name
            raw_key = b"kv/" + name.encode()
            if key != raw_key:
                break
            raw = kv_written.get(raw_key, _MISSING)
            if raw is _MISSING:
                raw = _MISSING if kv_read is None else kv_read.get(raw_key, _MISSING)
                if raw is _MISSING:
                    raw = get("kv", raw_key)
            if raw is None:
                created = offset
            else:
                try:
                    current = _KV_STATE.decode(raw)   # type: ignore[arg-type]
                except Exception:   # the handler raises it too, and halts
                    break
                if current.lease:
                    break
                created = current.created
                put("versions", version_key(raw_key, current.version), _encode(Version("KvPut", raw)))  # type: ignore[arg-type]
            kv_written[raw_key] = _encode(KvState(name=name, value=event.value, lease=0, version=offset,
                                                  created=created))
            outcomes[offset] = Outcome(True, offset)
            next_seq += 1
            next_offset += 1
            i += 1
        if i > start:   # what `extend` did per request
            ends[-1] = next_seq
            run.next_seq, run.next_offset = next_seq, next_offset
            run.extended = True
        return i

    def _decode(self, key: bytes | None, value: bytes | None,
                offset: int) -> tuple[ev.Event, ev.InvalidEventError | None] | Outcome:
        """The record's event (and, for one that decodes with invalid fields, why it is invalid), or its
        outcome when it has no event to apply (skipped, not an event, a key not the event's)."""
        if offset in self.skipped:
            return Outcome(False, offset, SKIPPED_CODE, "skipped by the operator: no node could apply it")
        if self._expected and value is not None:
            expected = self._expected.pop(value, None)
            if expected is not None:
                self._expected_bytes -= len(value)
                if expected[0] == key:
                    return expected[1], None   # what `applicable(value)` gives, decoded by this node's leader (`expect`)
        invalid: ev.InvalidEventError | None = None
        try:
            event = ev.applicable(value or b"")
        except ev.InvalidEventError as exc:   # decoded: its key and request id still count, as they always did
            event, invalid = exc.event, exc
        except ev.EventError as exc:
            return Outcome(False, offset, exc.code, str(exc))
        except ev.SchemaVersionError as exc:
            raise _CannotApply(offset, str(exc), UPGRADE) from None
        except RecursionError as exc:
            raise _CannotApply(offset, f"{exc} in this process", "a node with a deeper stack may apply it") from None
        if key != event.key().encode():
            return Outcome(False, offset, INVALID_ARGUMENT, f"record key {key!r} is not the event's key")
        return event, invalid

    def _apply_event(self, ov: Overlay, event: ev.Event, invalid: ev.InvalidEventError | None,
                     offset: int) -> tuple[Outcome, sessions.Admission | None]:
        """Apply a record's event: its outcome, and the admission of a client session's request the
        outcome was recorded with (else None)."""
        admitted: sessions.Admission | None = None
        dedupe_key = None
        request_time = None
        if event.session_id and invalid is None:   # a request of a client session (statemachines/sessions.py)
            admitted = sessions.admit(ov, self.kept_outcomes, event, offset, self.now_ms, self.level)
            if admitted.outcome is not None:
                return admitted.outcome, None
        elif event.request_id:
            dedupe_key = event.actor.encode() + b"\x00" + event.request_id.encode()
            request_time = request_ids.time_of(event.request_id) if not event.session_id else None
            if request_time is not None:   # time-ordered: remembered by committed time (request_ids.py)
                refused = request_ids.admit(ov, request_time, offset, self.now_ms)
                if refused is not None:
                    return refused, None
            first = ov.get("dedupe", dedupe_key)
            if first is not None:
                o = decode_outcome(first)
                floor = ov.get(META, HISTORY_FLOOR)
                if request_time is not None or (offset - o.offset <= self.config.dedupe_window_offsets and (
                        floor is None or o.offset >= decode_offset(floor))):   # not yet evicted: still forgotten
                    return Outcome(o.ok, o.offset, o.code, o.message, duplicate=True), None
        # A handler that rejects only before its first write needs no savepoint (_WRITES_LAST).
        savepoint = ov if type(event) in _WRITES_LAST else Overlay(self.store, ov)
        if invalid is not None:
            outcome = Outcome(False, offset, invalid.code, str(invalid))
        else:
            outcome = self._handle(savepoint, event, offset)
        if outcome.ok:
            if savepoint is not ov:
                savepoint.commit_to_parent()
            if isinstance(event, ev.LeaseGranted):
                self.lease_changes.append((event.lease_id, event.ttl_ms, offset))
            elif isinstance(event, ev.LeaseRevoked | ev.LeaseExpired):
                self.lease_changes.append((event.lease_id, 0, offset))
        if admitted is not None and admitted.session is not None:
            sessions.record(ov, admitted, event, outcome)
        elif dedupe_key is not None:
            ov.put("dedupe", dedupe_key, encode(outcome))
            if request_time is not None:
                request_ids.remember(ov, request_time, dedupe_key)
            else:
                ov.put("dedupe_expiry", encode_offset(offset) + dedupe_key, b"")
        return outcome, admitted

    def _handle(self, savepoint: Overlay, event: ev.Event, offset: int) -> Outcome:
        """The event's handler on `savepoint` (the entry's overlay, or one over it): a rejection for an
        EventError; a halt for anything else it raises but a broken invariant."""
        try:
            return _HANDLERS[type(event)](self, savepoint, event, offset)
        except ev.EventError as exc:
            return Outcome(False, offset, exc.code, str(exc))
        except AssertionError:
            raise   # a broken invariant is never hidden
        except Exception as exc:   # a handler bug: halting keeps the replicas from diverging
            raise _CannotApply(offset, f"applying {type(event).__name__} failed: {exc!r}",
                               "a bug: report it with this log line") from exc

    def _evict_dedupe(self, ov: Overlay, last_offset: int, limit: int) -> None:
        """Forget request ids older than the window or below the history floor, whichever is later
        (deterministic: by offsets the log decides, not by time), at most `limit` of them."""
        threshold = last_offset - self.config.dedupe_window_offsets
        raw_floor = ov.get(META, HISTORY_FLOOR)
        if raw_floor is not None:
            threshold = max(threshold, decode_offset(raw_floor))
        if threshold <= 0:
            return
        raw = ov.get(META, DEDUPE_EVICTED)
        start = decode_offset(raw) if raw else 0
        if start >= threshold:
            return
        rows = ov.scan("dedupe_expiry", encode_offset(max(start, 0)), encode_offset(threshold), limit)
        for k, _ in rows:
            ov.delete("dedupe_expiry", k)
            request = k[8:]
            stored = ov.get("dedupe", request)
            if stored is not None and decode_outcome(stored).offset < threshold:
                ov.delete("dedupe", request)
        evicted_to = decode_offset(rows[-1][0][:8]) + 1 if len(rows) == limit else threshold
        ov.put(META, DEDUPE_EVICTED, encode_offset(evicted_to))

    # --- entities ------------------------------------------------------------------------------

    @staticmethod
    def load(ov: Overlay, key: str) -> msgspec.Struct | None:
        raw_key = key.encode()
        raw = ov.get(cf_for(raw_key), raw_key)
        return None if raw is None else decode_state(raw_key, raw)

    def save(self, ov: Overlay, key: str, state: msgspec.Struct, event: ev.Event, offset: int) -> None:
        raw_key = key.encode()
        self.save_raw(ov, cf_for(raw_key), raw_key, state, event, offset)

    def save_raw(self, ov: Overlay, cf: str, raw_key: bytes, state: msgspec.Struct, event: ev.Event,
                 offset: int) -> None:
        """`save` of an entity key already encoded, in its column family `cf`: the entity row and its
        history row (at level 2, for most kinds, the previous state's instead: views_format.py)."""
        data = encode(state)
        if self.level >= 2 and views_format.latest_in_entity(self.level, raw_key):
            self._supersede(ov, cf, raw_key)
        else:
            ov.put("versions", version_key(raw_key, offset), encode(Version(_TAGS[type(event)], data)))
        ov.put(cf, raw_key, data)

    def remove(self, ov: Overlay, key: str, event: ev.Event, offset: int) -> None:
        raw_key = key.encode()
        cf = cf_for(raw_key)
        if self.level >= 2 and views_format.latest_in_entity(self.level, raw_key):
            self._supersede(ov, cf, raw_key)
        ov.delete(cf, raw_key)
        ov.put("versions", version_key(raw_key, offset), encode(Version(_tag(event), None)))

    @staticmethod
    def _supersede(ov: Overlay, cf: str, raw_key: bytes, previous: bytes | None = None,
                   version: int | None = None) -> None:
        """Level 2: the entity's current state (if any) gets its `versions` row, keyed by its own offset,
        as it is about to be replaced (a state written at level 1 has that row already: the same bytes)."""
        if previous is None:
            previous = ov.get(cf, raw_key)
            if previous is None:
                return
        if version is None:
            version = decode_state(raw_key, previous).version  # type: ignore[attr-defined]
        tag = views_format.LATEST_IN_ENTITY[raw_key.partition(b"/")[0]]
        ov.put("versions", version_key(raw_key, version), encode(Version(tag, previous)))


def _records(entry: Entry, skipped: frozenset[int]) -> tuple[BatchHeader | None, list[Row]]:
    """The batch header and records of a NORMAL entry. Its CRC was checked when it was stored; a batch
    that still does not parse (a writer's bug) halts the group like any entry this code cannot apply (at
    its first offset: skipping that offset skips the whole entry).

    An uncompressed batch whose framing checks pass (those of `RecordBatch.parse` without the CRC) is read
    straight from the entry's bytes, without the batch object and its two memoryviews: the same header and
    rows (`record_rows` takes bytes or a view alike); anything else, or a record that does not decode, takes
    `_parsed_records`, so its errors are that path's."""
    data = entry.data
    if len(data) >= HEADER_SIZE:
        header = read_header(data)
        if (header.magic == MAGIC and not header.attributes & COMPRESSION_MASK
                and MIN_BATCH_LENGTH <= header.batch_length <= len(data) - LOG_OVERHEAD):
            try:
                return header, record_rows(header, data[HEADER_SIZE:header.batch_length + LOG_OVERHEAD])
            except InvalidBatchError:
                pass
    return _parsed_records(entry, skipped)


def _parsed_records(entry: Entry, skipped: frozenset[int]) -> tuple[BatchHeader | None, list[Row]]:
    """`_records` through `RecordBatch.parse` (any batch: compressed, damaged)."""
    try:
        batch = RecordBatch.parse(entry.data, verify_crc=False)
        return batch.header, record_rows(batch.header, records_payload(batch.header, batch.raw))
    except InvalidBatchError as exc:
        if entry.index in skipped:
            return None, []
        raise _CannotApply(entry.index, f"the record batch of entry {entry.index} does not parse: {exc}",
                           "a bug or a damaged log: report it with this log line") from None


def _producer_batch(ov: Overlay, entry: Entry, header: BatchHeader | None, records: list[Row],
                    now_ms: int) -> Outcome | None:
    """For the batch of a Kafka idempotent producer (statemachines/producers.py): None to apply its
    records, or what its first record gets instead (a retry's outcome at the original offset, or a
    refusal; the others follow, offset by offset)."""
    if header is None or header.producer_id == NO_PRODUCER_ID or header.base_sequence < 0 or not records:
        return None
    return producers.apply_batch(ov, producers.partition_of(records[0][1]), header.producer_id,
                                 header.producer_epoch, header.base_sequence, entry.index, entry.last_index, now_ms)


def _record_noops(ov: Overlay, entry: Entry, outcomes: dict[int, Outcome]) -> None:
    """One `noops` row per record of a NORMAL entry that changed nothing: rejected, a retried request id
    (`duplicate`), skipped, or not a record at all (an unparseable batch skipped whole). Part of the
    entry's writes, hence of the digest (statemachines/noops.py says who reads them)."""
    for offset in range(entry.index, entry.last_index + 1):
        outcome = outcomes.get(offset)
        if outcome is None:
            ov.put(NOOPS, encode_offset(offset), SKIPPED_CODE.encode())
        elif not outcome.ok or outcome.duplicate:
            ov.put(NOOPS, encode_offset(offset), (outcome.code or "duplicate").encode())


def _not_applied(outcomes: dict[int, Outcome], entry: Entry, halt: Halt) -> None:
    """Outcomes of an entry left unapplied by a halt (for whoever waits on it: not a rejection, not done)."""
    if entry.kind is not EntryKind.NORMAL:
        return
    message = f"committed, but this node halted before applying it (at offset {halt.offset}: {halt.reason})"
    for offset in range(entry.index, entry.last_index + 1):
        outcomes[offset] = Outcome(False, offset, HALTED, message)


def _tag(event: ev.Event) -> str:
    return _TAGS[type(event)]


_TAGS: dict[type, str] = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}


def _chain(digest: bytes, offset: int, writes: dict[str, dict[bytes, bytes | None]]) -> bytes:
    """The digest after an entry whose writes are `writes`: its mutations in (family, key) order."""
    parts = [digest, encode_offset(offset)]   # hashed in one call: the bytes of one update per piece
    add = parts.extend
    lengths = _LENGTHS
    pack = _LENGTH.pack
    for cf in sorted(writes):
        pending = writes[cf]
        prefix = _CF_PREFIXES.get(cf) or cf.encode() + b"\x00"
        for key in sorted(pending):
            value = pending[key]
            n = len(key)
            key_length = lengths[n] if n < _LENGTHS_KEPT else pack(n)
            if value is None:
                add((prefix, key_length, key, b"\x00"))
            else:
                n = len(value)
                add((prefix, key_length, key, b"\x01", lengths[n] if n < _LENGTHS_KEPT else pack(n), value))
    return hashlib.sha256(b"".join(parts)).digest()


_LENGTH = struct.Struct(">I")
_CF_PREFIXES = {cf: cf.encode() + b"\x00" for cf in (META, *ALL_CFS)}   # what `_chain` hashes before a family's rows
_LENGTHS_KEPT = 4096
_LENGTHS = [_LENGTH.pack(n) for n in range(_LENGTHS_KEPT)]   # a row's lengths, mostly short: a lookup, not a call


def _ok(offset: int) -> Outcome:
    return Outcome(True, offset)


def _reject(offset: int, code: str, message: str) -> Outcome:
    return Outcome(False, offset, code, message)


def _version_mismatch(offset: int, key: str, expected: int | None, state: msgspec.Struct | None) -> Outcome | None:
    """Compare-and-set: None when `expected` matches the entity's version (0 = must not exist)."""
    if expected is None:
        return None
    current = 0 if state is None else state.version  # type: ignore[attr-defined]
    if current == expected:
        return None
    return _reject(offset, VERSION_MISMATCH, f"{key} is at version {current}, not {expected}")


# --- handlers ------------------------------------------------------------------------------------

def _broker_registered(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.BrokerRegistered)
    current, group = a.load(ov, e.key()), a.load(ov, e.group_key())
    change = brokers.broker_registered(current if isinstance(current, BrokerState) else None,
                                       group if isinstance(group, GroupState) else None, e, offset)
    return _broker_change(a, ov, e, offset, change)


def _broker_fenced(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """BrokerFenced, BrokerUnfenced and BrokerUnregistered (statemachines/brokers.py)."""
    assert isinstance(e, ev.BrokerFenced | ev.BrokerUnfenced | ev.BrokerUnregistered)
    current, group = a.load(ov, e.key()), a.load(ov, e.group_key())
    change = brokers.broker_changed(current if isinstance(current, BrokerState) else None,
                                    group if isinstance(group, GroupState) else None, e, offset)
    return _broker_change(a, ov, e, offset, change)


def _broker_change(a: Applier, ov: Overlay, e: ev.BrokerRegistered | ev.BrokerFenced | ev.BrokerUnfenced
                   | ev.BrokerUnregistered, offset: int, change: brokers.BrokerChange | brokers.Rejected) -> Outcome:
    if isinstance(change, brokers.Rejected):
        return _reject(offset, change.code, change.message)
    if change.broker is None:
        a.remove(ov, e.key(), e, offset)
    else:
        a.save(ov, e.key(), change.broker, e, offset)
    if change.group is not None:
        a.save(ov, e.group_key(), change.group, e, offset)
    return _ok(offset)


def _group_change(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """SyncStateSetChanged and MasterElected (statemachines/brokers.py)."""
    assert isinstance(e, ev.SyncStateSetChanged | ev.MasterElected)
    current = a.load(ov, e.key())
    group = current if isinstance(current, GroupState) else None
    changed = (brokers.sync_state_set_changed(group, e, offset) if isinstance(e, ev.SyncStateSetChanged)
               else brokers.master_elected(group, e, offset))
    if isinstance(changed, brokers.Rejected):
        return _reject(offset, changed.code, changed.message)
    a.save(ov, e.key(), changed, e, offset)
    return _ok(offset)


def _topic_created(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.TopicCreated)
    if a.load(ov, e.key()) is not None:
        return _reject(offset, ALREADY_EXISTS, f"topic {e.name} exists")
    a.save(ov, e.key(), TopicState(name=e.name, read_queues=e.read_queues, write_queues=e.write_queues,
                                   perm=e.perm, broker_groups=tuple(e.broker_groups), config=dict(e.config),
                                   version=offset, created=offset), e, offset)
    return _ok(offset)


def _topic_updated(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.TopicUpdated)
    current = a.load(ov, e.key())
    if not isinstance(current, TopicState):
        return _reject(offset, NOT_FOUND, f"topic {e.name} does not exist")
    mismatch = _version_mismatch(offset, e.key(), e.expected_version, current)
    if mismatch:
        return mismatch
    changes = {k: getattr(e, k) for k in ("read_queues", "write_queues", "perm", "broker_groups", "config")
               if getattr(e, k) is not None}
    a.save(ov, e.key(), msgspec.structs.replace(current, **changes, version=offset), e, offset)
    return _ok(offset)


def _topic_deleted(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.TopicDeleted)
    current = a.load(ov, e.key())
    if current is None:
        return _reject(offset, NOT_FOUND, f"topic {e.name} does not exist")
    mismatch = _version_mismatch(offset, e.key(), e.expected_version, current)
    if mismatch:
        return mismatch
    a.remove(ov, e.key(), e, offset)
    return _ok(offset)


def _offset_committed(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.OffsetCommitted)
    current = a.load(ov, e.key())
    created = current.created if isinstance(current, OffsetState) else offset
    a.save(ov, e.key(), OffsetState(consumer_group=e.consumer_group, topic=e.topic, queue_id=e.queue_id,
                                    offset=e.offset, version=offset, created=created), e, offset)
    return _ok(offset)


def _lease_key(lease_id: int, entity_key: str) -> bytes:
    return f"{lease_id:020d}/{entity_key}".encode()


def _attach(a: Applier, ov: Overlay, old_lease: int, new_lease: int, key: str, offset: int) -> Outcome | None:
    if new_lease and not isinstance(a.load(ov, f"lease/{new_lease:020d}"), LeaseState):
        return _reject(offset, NOT_FOUND, f"lease {new_lease} does not exist (expired or revoked?)")
    if old_lease and old_lease != new_lease:
        ov.delete("lease_keys", _lease_key(old_lease, key))
    if new_lease:
        ov.put("lease_keys", _lease_key(new_lease, key), b"")
    return None


def _kv_put(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """The hot path of batched writes: the key is built and encoded once (`Applier.load`/`save` inlined)."""
    assert isinstance(e, ev.KvPut)
    key = e.key()
    raw_key = key.encode()
    raw = ov.get("kv", raw_key)
    current = None if raw is None else _KV_STATE.decode(raw)
    if e.expected_version is not None:
        mismatch = _version_mismatch(offset, key, e.expected_version, current)
        if mismatch:
            return mismatch
    old_lease = current.lease if current is not None else 0
    rejected = _attach(a, ov, old_lease, e.lease, key, offset) if old_lease or e.lease else None
    if rejected:
        return rejected
    state = KvState(name=e.name, value=e.value, lease=e.lease, version=offset,
                    created=offset if current is None else current.created)
    if a.level >= 2:   # the latest state in the kv row only; the one it replaces moves to `versions`
        if raw is not None:   # `_supersede`, inlined: a kv state's history rows are KvPut's
            ov.put("versions", version_key(raw_key, current.version), _encode(Version("KvPut", raw)))  # type: ignore[union-attr]
        ov.put("kv", raw_key, _encode(state))
    else:
        a.save_raw(ov, "kv", raw_key, state, e, offset)
    return Outcome(True, offset)


_KV_STATE = msgspec.msgpack.Decoder(KvState)
_encode = msgspec.msgpack.Encoder().encode   # `state.encode` without its call (the same bytes)
_WRITES_LAST = frozenset({ev.KvPut})
"""Events whose handler writes only once it can no longer reject (nor raise): applied without a savepoint."""


def _kv_deleted(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.KvDeleted)
    current = a.load(ov, e.key())
    if not isinstance(current, KvState):
        return _reject(offset, NOT_FOUND, f"key {e.name!r} does not exist")
    mismatch = _version_mismatch(offset, e.key(), e.expected_version, current)
    if mismatch:
        return mismatch
    _attach(a, ov, current.lease, 0, e.key(), offset)
    a.remove(ov, e.key(), e, offset)
    return _ok(offset)


def _lease_granted(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.LeaseGranted)
    if a.load(ov, e.key()) is not None:
        return _reject(offset, ALREADY_EXISTS, f"lease {e.lease_id} exists")
    a.save(ov, e.key(), LeaseState(lease_id=e.lease_id, ttl_ms=e.ttl_ms, version=offset, created=offset), e, offset)
    return _ok(offset)


def _lease_ended(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """LeaseRevoked / LeaseExpired: the lease and every entity attached to it go."""
    assert isinstance(e, ev.LeaseRevoked | ev.LeaseExpired)
    if a.load(ov, e.key()) is None:
        return _reject(offset, NOT_FOUND, f"lease {e.lease_id} does not exist")
    prefix = f"{e.lease_id:020d}/".encode()
    for k, _ in list(ov.scan("lease_keys", prefix, prefix_upper_bound(prefix))):
        ov.delete("lease_keys", k)
        entity = k[len(prefix):].decode()
        if a.load(ov, entity) is not None:
            a.remove(ov, entity, e, offset)
    a.remove(ov, e.key(), e, offset)
    return _ok(offset)


def _session_opened(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.SessionOpened)
    current = a.load(ov, e.key())
    old_lease = current.lease if isinstance(current, SessionState) else 0
    rejected = _attach(a, ov, old_lease, e.lease, e.key(), offset)
    if rejected:
        return rejected
    created = current.created if isinstance(current, SessionState) and not e.clean else offset
    a.save(ov, e.key(), SessionState(client_id=e.client_id, node=e.node, clean=e.clean, lease=e.lease,
                                     version=offset, created=created), e, offset)
    return _ok(offset)


def _session_closed(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.SessionClosed)
    current = a.load(ov, e.key())
    if not isinstance(current, SessionState):
        return _reject(offset, NOT_FOUND, f"session {e.client_id!r} is not open")
    _attach(a, ov, current.lease, 0, e.key(), offset)
    a.remove(ov, e.key(), e, offset)
    return _ok(offset)


def _config_changed(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.ConfigChanged)
    current = a.load(ov, e.key())
    if e.value is None:
        if current is None:
            return _reject(offset, NOT_FOUND, f"config {e.scope}/{e.name} is not set")
        a.remove(ov, e.key(), e, offset)
    else:
        created = current.created if isinstance(current, ConfigState) else offset
        a.save(ov, e.key(), ConfigState(scope=e.scope, name=e.name, value=e.value, version=offset,
                                        created=created), e, offset)
    return _ok(offset)


def _kafka_group_stored(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.KafkaGroupStored)
    current = a.load(ov, e.key())
    created = current.created if isinstance(current, KafkaGroupState) else offset
    a.save(ov, e.key(), KafkaGroupState(group_id=e.group_id, generation=e.generation, protocol_type=e.protocol_type,
                                        protocol=e.protocol, leader=e.leader, members=e.members, version=offset,
                                        created=created), e, offset)
    return _ok(offset)


def _member_added(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.MemberAdded)
    current = a.load(ov, e.key())
    created = current.created if isinstance(current, MemberState) and not current.removed else offset
    a.save(ov, e.key(), MemberState(node_id=e.node_id, peer_address=e.peer_address,
                                    client_address=e.client_address, version=offset, created=created), e, offset)
    return _ok(offset)


def _member_removed(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """Always recorded (a configured member has no record before): the tombstone keeps it out."""
    assert isinstance(e, ev.MemberRemoved)
    current = a.load(ov, e.key())
    if isinstance(current, MemberState):
        state = msgspec.structs.replace(current, removed=True, version=offset)
    else:
        state = MemberState(node_id=e.node_id, peer_address="", removed=True, version=offset, created=offset)
    a.save(ov, e.key(), state, e, offset)
    return _ok(offset)


def _history_pruned(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """Raise the history floor (never lower it): a meta key, so the digest covers it."""
    assert isinstance(e, ev.HistoryPruned)
    if e.floor > offset:
        return _reject(offset, INVALID_ARGUMENT, f"history floor {e.floor} is beyond its own offset {offset}")
    raw = ov.get(META, HISTORY_FLOOR)
    if raw is None or decode_offset(raw) < e.floor:
        ov.put(META, HISTORY_FLOOR, encode_offset(e.floor))
    return _ok(offset)


def _views_format_raised(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """Raise the views format level (statemachines/views_format.py; never lower it): a meta key, so the
    digest chains it. A level this code does not know never gets here (a newer schema version: halted)."""
    assert isinstance(e, ev.ViewsFormatRaised)
    if e.level <= a.level:
        return _reject(offset, CONDITION_FAILED, f"the views format is at level {a.level} already")
    ov.put(META, views_format.META_KEY, views_format.encode_level(e.level))
    a.level = e.level
    a.kept_outcomes.clear()   # it holds sessions' outcome rows as the level before wrote them
    return _ok(offset)


def _client_session_opened(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.ClientSessionOpened)
    return sessions.open_session(ov, a.kept_outcomes, e, offset, a.now_ms)


def _client_session_closed(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.ClientSessionClosed)
    return sessions.close_session(ov, a.kept_outcomes, e, offset)


def _user_added(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """The user's credentials, whole: a password change or a token revoked replaces them."""
    assert isinstance(e, ev.UserAdded)
    a.access_changes += 1
    current = a.load(ov, e.key())
    created = current.created if isinstance(current, UserState) else offset
    a.save(ov, e.key(), UserState(name=e.name, scram=e.scram, tokens=e.tokens, version=offset, created=created),
           e, offset)
    return _ok(offset)


def _user_removed(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    """The user's credentials go; its grants stay (they name a principal, which a certificate may be too)."""
    assert isinstance(e, ev.UserRemoved)
    a.access_changes += 1
    if a.load(ov, e.key()) is None:
        return _reject(offset, NOT_FOUND, f"user {e.name} does not exist")
    a.remove(ov, e.key(), e, offset)
    return _ok(offset)


def _acl_granted(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.AclGranted)
    a.access_changes += 1
    if a.load(ov, e.key()) is not None:
        return _reject(offset, ALREADY_EXISTS, f"{e.principal} already holds {e.role} {e.resource}".rstrip())
    a.save(ov, e.key(), AclState(principal=e.principal, role=e.role, resource=e.resource, version=offset,
                                 created=offset), e, offset)
    return _ok(offset)


def _acl_revoked(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.AclRevoked)
    a.access_changes += 1
    if a.load(ov, e.key()) is None:
        return _reject(offset, NOT_FOUND, f"{e.principal} does not hold {e.role} {e.resource}".rstrip())
    a.remove(ov, e.key(), e, offset)
    return _ok(offset)


def _txn(a: Applier, ov: Overlay, e: ev.Event, offset: int) -> Outcome:
    assert isinstance(e, ev.Txn)
    for cond in e.conditions:
        state = a.load(ov, cond.key)
        current = 0 if state is None else state.version  # type: ignore[attr-defined]
        if current != cond.version:
            return _reject(offset, CONDITION_FAILED, f"{cond.key} is at version {current}, not {cond.version}")
    for op in e.ops:
        outcome = _HANDLERS[type(op)](a, ov, op, offset)
        if not outcome.ok:
            return _reject(offset, outcome.code, f"transaction aborted: {outcome.message}")
    return _ok(offset)


_HANDLERS: dict[type, Handler] = {
    ev.BrokerRegistered: _broker_registered,
    ev.BrokerFenced: _broker_fenced,
    ev.BrokerUnfenced: _broker_fenced,
    ev.BrokerUnregistered: _broker_fenced,
    ev.SyncStateSetChanged: _group_change,
    ev.MasterElected: _group_change,
    ev.TopicCreated: _topic_created,
    ev.TopicUpdated: _topic_updated,
    ev.TopicDeleted: _topic_deleted,
    ev.OffsetCommitted: _offset_committed,
    ev.KvPut: _kv_put,
    ev.KvDeleted: _kv_deleted,
    ev.LeaseGranted: _lease_granted,
    ev.LeaseRevoked: _lease_ended,
    ev.LeaseExpired: _lease_ended,
    ev.SessionOpened: _session_opened,
    ev.SessionClosed: _session_closed,
    ev.ConfigChanged: _config_changed,
    ev.Txn: _txn,
    ev.MemberAdded: _member_added,
    ev.MemberRemoved: _member_removed,
    ev.KafkaGroupStored: _kafka_group_stored,
    ev.HistoryPruned: _history_pruned,
    ev.ClientSessionOpened: _client_session_opened,
    ev.ClientSessionClosed: _client_session_closed,
    ev.UserAdded: _user_added,
    ev.UserRemoved: _user_removed,
    ev.AclGranted: _acl_granted,
    ev.AclRevoked: _acl_revoked,
    ev.ViewsFormatRaised: _views_format_raised,
}
