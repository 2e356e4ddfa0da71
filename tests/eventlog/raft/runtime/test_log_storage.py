"""Raft storage on the segmented log (eventlog.raft.runtime.log_storage), and entries as batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.errors import InvalidBatchError
from eventlog.raft.confchange import encode_conf_change
from eventlog.raft.errors import CompactedError
from eventlog.raft.raft_log import RaftLog
from eventlog.raft.runtime import log_storage
from eventlog.raft.runtime.entries import batch_to_entry, entry_to_batch
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.snapshot_image import ImageHeader
from eventlog.raft.storage import MemoryStorage
from eventlog.raft.types import ConfChange, ConfChangeKind, ConfState, Entry, EntryKind, HardState
from eventlog.records import RecordBatch, encode_batch

CFG = LogConfig(segment_bytes=16 * 1024, flush_policy="fsync")
CONF = ConfState(voters=(1, 2, 3))


def normal(index: int, term: int, n: int = 2) -> Entry:
    data = encode_batch([(b"k%d" % (index + i), b"v" * 50) for i in range(n)], timestamp_ms=index)
    return Entry(index, term, n, EntryKind.NORMAL, data)


def conf_entry(index: int, term: int, node: int) -> Entry:
    return Entry(index, term, 1, EntryKind.CONF_CHANGE,
                 encode_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, node)))


def chain(start: int, term: int, count: int) -> list[Entry]:
    out, index = [], start
    for _ in range(count):
        e = normal(index, term)
        out.append(e)
        index = e.last_index + 1
    return out


def test_entries_round_trip_through_batches_byte_for_byte():
    for e in (normal(10, 3, 5), Entry(7, 2, 1, EntryKind.NOOP, b""), conf_entry(8, 2, 4)):
        raw = entry_to_batch(e)
        back = batch_to_entry(RecordBatch.parse(raw))
        assert (back.index, back.term, back.count, back.kind) == (e.index, e.term, e.count, e.kind)
        assert entry_to_batch(back) == raw, "the stored bytes are a pure function of the entry"


def test_a_stamped_entry_is_stored_as_sent_and_a_damaged_one_is_refused_stamped_or_not(tmp_path: Path):
    """A follower stores the leader's stamped bytes without copying them; whether copied or not, a damaged
    batch (a byte flipped inside its CRC) is refused by the log and leaves storage and log unchanged."""
    st = LogStorage.open(tmp_path, CFG, CONF)
    sent = Entry(0, 1, 2, EntryKind.NORMAL, entry_to_batch(normal(0, 1)))   # as the leader sends it
    assert entry_to_batch(sent) is sent.data
    st.append([sent])
    assert st.entries(0, 2, 1 << 20)[0].data == sent.data
    good = normal(2, 1)
    for damaged in (good, Entry(2, 1, 2, EntryKind.NORMAL, entry_to_batch(good))):   # unstamped, stamped
        raw = bytearray(damaged.data)
        raw[-1] ^= 0x01
        with pytest.raises(InvalidBatchError, match="CRC"):
            st.append([Entry(2, 1, 2, EntryKind.NORMAL, bytes(raw))])
        assert st.last_index() == 1 and st.log.end_offset == 2
        assert [e.index for e in st.entries(0, 2, 1 << 20)] == [0]
    st.append([good])
    assert [e.data for e in st.entries(0, 4, 1 << 20)] == [sent.data, entry_to_batch(good)]
    st.close()


def test_append_truncate_and_reopen(tmp_path: Path):
    st = LogStorage.open(tmp_path, CFG, CONF)
    entries = chain(0, 1, 10) + [conf_entry(20, 1, 4)] + chain(21, 1, 5)
    assert st.append(entries) == 30
    assert (st.first_index(), st.last_index(), st.term(5), st.entry_bounds(5)) == (0, 30, 1, (4, 5))
    assert [e.index for e in st.entries(0, 31, 1 << 20)] == [e.index for e in entries]
    assert [e.index for e in st.entries(4, 31, 300)][:1] == [4], "max_bytes still gives one entry"
    # a newer leader replaces the suffix from 12 on (including the membership change at 20)
    st.append(chain(12, 2, 3))
    assert st.last_index() == 17 and st.term(12) == 2 and st.conf_entries() == []
    st.set_hard_state(HardState(term=2, vote=3, commit=11))
    st.append([conf_entry(18, 2, 5)])
    st.close()
    again = LogStorage.open(tmp_path, CFG, CONF)
    hard, snap = again.initial_state()
    assert (hard.term, hard.vote, hard.commit, snap.index) == (2, 3, 11, -1)
    assert [e.index for e in again.conf_entries()] == [18], "found past conf_scanned_to on open"
    again.close()


def test_entry_bounds_of_the_last_entry_match_the_log_through_appends_replacements_and_drops(tmp_path: Path):
    """The last entry's bounds are answered without reading it back (every Append and acknowledgement
    names it): never a stale answer once a newer leader replaced the suffix or a drop cut it."""
    st = LogStorage.open(tmp_path, CFG, CONF)

    def from_log(index: int) -> tuple[int, int]:
        e = batch_to_entry(next(st.log.read(index, 1).batches()))
        return e.index, e.last_index

    def check(*indexes: int) -> None:
        for i in indexes:
            assert st.entry_bounds(i) == from_log(i), f"index {i}"

    st.append(chain(0, 1, 5))                      # entries of 2: 0-1 ... 8-9
    check(8, 9, 7)
    st.append([normal(10, 1, 5)])                  # 10-14
    check(10, 12, 14, 9)
    st.append([normal(10, 2, 1)])                  # a newer leader replaces the suffix from 10: 10 alone
    assert st.last_index() == 10
    check(10, 9)
    st.append([normal(11, 2, 4)])                  # 11-14
    check(14, 12, 10)
    st.drop_from(11)                               # found damaged: the log ends at 10 again
    assert st.last_index() == 10
    check(10, 9)
    st.append([normal(11, 2, 2)])                  # fetched again, in another shape: 11-12
    check(11, 12, 10)
    st.close()
    st = LogStorage.open(tmp_path, CFG, CONF)
    check(12, 11, 10)
    st.close()


def test_snapshots_keep_the_previous_one_readable_and_install_resets_the_log(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    st = LogStorage.open(tmp_path / "a", CFG, CONF)
    st.append(chain(0, 1, 40))
    first = st.create_snapshot(9, CONF, lambda p: p.write_bytes(b"state@9" * 100))
    sent = st.snapshot()                     # a transfer of it starts: the core sees its image's size
    head = st.snapshot_chunk(first.index, 0, 12)
    second = st.create_snapshot(19, CONF, lambda p: p.write_bytes(b"state@19" * 100))
    assert st.latest_snapshot == second and st.log.start_offset == 0
    assert st.snapshot().index == 19 and sent.size > first.size == 700, "the image frames the data"
    # The log still holds what the snapshots cover: a follower lagging behind them catches up from it.
    assert st.first_index() == 0 and st.term(-1) == 0
    assert (st.term(9), st.entry_bounds(19)) == (1, (18, 19)), "the entry ending at the snapshot, from the log"
    assert [e.index for e in st.entries(0, 20, 1 << 20)] == list(range(0, 20, 2))
    rest = st.snapshot_chunk(first.index, 12, sent.size)
    assert rest.endswith(b"state@9" * 100) and len(head + rest) == sent.size, "a transfer of the previous one can finish"
    st.create_snapshot(29, CONF, lambda p: p.write_bytes(b"x"))
    assert not st.snapshot_dir(first).exists()
    assert st.snapshot_chunk(first.index, 0, 12) == head, "a transfer still reading a dropped snapshot goes on"
    monkeypatch.setattr(log_storage, "IMAGE_IDLE_S", 0.0)   # ... until no chunk was read from it for that long
    st.snapshot()
    with pytest.raises(CompactedError):
        st.snapshot_chunk(first.index, 0, 7)
    st.compact(29)
    assert st.log.start_offset == 0 and st.first_index() == 0, "no segment lies wholly at or below 29"
    st.append(chain(80, 1, 200))                      # offsets 80-479, several 16 KiB segments
    st.create_snapshot(479, CONF, lambda p: p.write_bytes(b"y"))
    assert st.compact(479) >= 1 and 0 < (start := st.log.start_offset) < 480
    # The term before the log's new start is unknown: the core is served from the entry after the
    # first one held (its predecessor's term is in the log), still below the snapshot.
    assert st.first_index() == start + 2 and st.term(start + 1) == 1 and st.term(479) == 1
    assert st.entries(start + 2, start + 4, 1 << 20)[0].index == start + 2
    with pytest.raises(CompactedError):
        st.term(start - 1)
    with pytest.raises(CompactedError):
        st.entries(start, start + 2, 1 << 20)
    st.close()

    follower = LogStorage.open(tmp_path / "b", CFG, CONF)
    follower.append(chain(0, 1, 5))
    data = b"snapshot bytes" * 50
    head = ImageHeader(len(data)).encode()
    meta = second.__class__(index=55, term=3, conf=CONF, size=len(head) + len(data))
    follower.stage_snapshot_chunk(meta, 0, (head + data)[:100])
    follower.stage_snapshot_chunk(meta, 100, (head + data)[100:])
    path = follower.install_snapshot(meta)
    assert (path / "data").read_bytes() == data
    assert (follower.first_index(), follower.last_index(), follower.term(55)) == (56, 55, 3)
    follower.append(chain(56, 3, 2))
    follower.close()
    reopened = LogStorage.open(tmp_path / "b", CFG, CONF)
    assert (reopened.latest_snapshot.index, reopened.latest_snapshot.size) == (55, len(data))
    assert (reopened.snapshot(), reopened.first_index(), reopened.last_index()) == (meta, 56, 59)
    reopened.close()


def test_applied_counts_as_committed_when_the_commit_hint_lags():
    """A runtime persists the commit lazily; a state machine that applied further proves more committed."""
    storage = MemoryStorage(CONF)
    storage.append(chain(0, 1, 5))
    storage.set_hard_state(HardState(term=1, vote=1, commit=3))
    log = RaftLog(storage, committed=3, applied=7)
    assert (log.committed, log.applied) == (7, 7)
    with pytest.raises(AssertionError):
        RaftLog(storage, committed=3, applied=20)  # applied beyond the log: broken storage


def test_memory_storage_keeps_catch_up_entries_below_its_snapshot_as_the_log_does(tmp_path: Path):
    """The simulator's storage with `catch_up_entries` answers like LogStorage over a log that still
    holds what its snapshot covers: served from below the snapshot, whole entries, the term before
    the first one known; an install resets it."""
    mem = MemoryStorage(CONF, catch_up_entries=5)
    mem.append(chain(0, 1, 10) + [conf_entry(20, 2, 4)] + chain(21, 2, 5))   # 0-19, conf 20, 21-30
    mem.create_snapshot(19, CONF, b"s")
    # 19 - 5 = 14 lies inside the entry [14, 15]: it stays whole, so the log starts at 14.
    assert (mem.first_index(), mem.term(13), mem.term(19), mem.entry_bounds(19)) == (14, 1, 1, (18, 19))
    assert [e.index for e in mem.entries(14, 20, 1 << 20)] == [14, 16, 18]
    assert [e.index for e in mem.conf_entries()] == [20], "only those after the snapshot"
    with pytest.raises(CompactedError):
        mem.term(12)
    log = LogStorage.open(tmp_path / "log", CFG, CONF)
    log.append(chain(0, 1, 10) + [conf_entry(20, 2, 4)] + chain(21, 2, 5))
    log.create_snapshot(19, CONF, lambda p: p.write_bytes(b"s"))
    assert (log.first_index(), log.term(19), log.entry_bounds(19)) == (0, 1, (18, 19))
    assert [e.index for e in log.entries(14, 20, 1 << 20)] == [e.index for e in mem.entries(14, 20, 1 << 20)]
    log.close()
    mem.create_snapshot(30, CONF, b"t")
    assert mem.first_index() == 25 and mem.term(24) == 2
    meta = mem.snapshot().__class__(index=40, term=3, conf=CONF, size=1)
    mem.stage_snapshot_chunk(meta, 0, b"u")
    mem.install_snapshot(meta)
    assert (mem.first_index(), mem.last_index(), mem.term(40)) == (41, 40, 3)


def test_recent_entries_are_served_as_the_log_reads_them_back_and_never_once_replaced(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch):
    """`entries` serves the latest appended entries from memory (no read back per applied write): each
    exactly as read from the log (a NORMAL entry's batch stamped with its index and term), and never an
    entry a newer leader replaced, a drop removed, or that the budget let go."""
    monkeypatch.setattr(log_storage, "RECENT_ENTRIES_BYTES", 1000)
    st = LogStorage.open(tmp_path, CFG, CONF)

    def from_log(lo: int, hi: int) -> list[Entry]:
        out, offset = [], lo
        while offset < hi:
            e = batch_to_entry(next(st.log.read(offset, 1).batches()))
            out.append(e)
            offset = e.last_index + 1
        return out

    reads = 0
    real_read = st.log.read

    def counting_read(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return real_read(*args, **kwargs)

    monkeypatch.setattr(st.log, "read", counting_read)
    entries = chain(0, 1, 4) + [Entry(8, 1, 1, EntryKind.NOOP, b""), conf_entry(9, 1, 4)] + chain(10, 1, 3)
    st.append(entries[:3])
    st.append(entries[3:])
    served = st.entries(6, 16, 1 << 20)
    assert reads == 0, "the latest entries come from memory"
    assert served == from_log(6, 16)
    assert served[0].data != entries[3].data, "stamped with index and term, as stored"
    assert [e.index for e in st.entries(10, 16, 1)] == [10], "max_bytes still gives one entry"
    assert [e.index for e in st.entries(8, 10, 1 << 20)] == [8, 9], "up to hi"
    reads = 0
    assert st.entries(0, 16, 1 << 20) == from_log(0, 16), "older than the budget kept: read back"
    assert reads > 0
    # A newer leader replaces the suffix from 9 on: the replaced entries are never served again.
    st.append(chain(9, 2, 2))
    assert st.entries(8, 13, 1 << 20) == from_log(8, 13)
    assert [e.term for e in st.entries(9, 13, 1 << 20)] == [2, 2]
    assert st.entries(13, 16, 1 << 20) == [], "gone with the replaced suffix"
    # A drop cuts the log: what follows is appended again, and served as stored.
    st.drop_from(11)
    assert st.last_index() == 10
    st.append([normal(11, 3)])
    assert st.entries(9, 13, 1 << 20) == from_log(9, 13)
    st.close()
