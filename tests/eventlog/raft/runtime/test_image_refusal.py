"""Issue 18: a member that sends a snapshot whose bytes are no valid image never stops a group.

A real `RaftGroup` (node 1 of voters 1-3: its core, its asyncio task, a `LogStorage` on disk, a state
machine) is fed by the test, which plays node 2, the leader of term 5, with `deliver` as the
transport does; what the group sends back is recorded. The good snapshot is a real leader's: a
`LogStorage` that ships its log prefix, its snapshot written by the same state machine.

The leader first sends one chunk of 2 bytes that ends a "snapshot" (the storage fuzz case of
issue 18: the core took it, restored the snapshot, and staging it stopped the group), then a good
first chunk and, in the same delivery, the rest with a batch of the prefix damaged (so the check of
the second chunk must see the first one staged), then the good rest. Checked: each bad chunk is
dropped as lost (no answer, counted and logged as `snapshot_image`), the group never fails, the
good image installs (the state machine restored at the snapshot, the log holding the leader's
prefix), and the group goes on applying the leader's next entry.
"""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.raft.config import RaftConfig
from eventlog.raft.peer_check import SNAPSHOT_IMAGE
from eventlog.raft.runtime.group import RaftGroup
from eventlog.raft.runtime.log_storage import LogStorage
from bench.raft_node import ChecksumStateMachine
from eventlog.raft.types import (
    Append,
    ConfState,
    Entry,
    EntryKind,
    InstallSnapshot,
    InstallSnapshotResp,
    Message,
    SnapshotMeta,
)
from eventlog.records import encode_batch

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy="fsync", preallocate_next_segment=False)
CONF = ConfState(voters=(1, 2, 3))
TERM = 5
LEADER = 2
WAIT_S = 20.0


def entries(start: int, count: int) -> list[Entry]:
    """`count` entries of two records each from offset `start`, in TERM."""
    return [Entry(i, TERM, 2, EntryKind.NORMAL, encode_batch([(b"k%d" % (i % 5), b"v%d" % i + b"." * 80),
                                                              (b"j%d" % (i % 3), b"w%d" % i)], timestamp_ms=1000 + i))
            for i in range(start, start + 2 * count, 2)]


def leader_image(path: Path) -> tuple[SnapshotMeta, bytes, ChecksumStateMachine, LogStorage]:
    """A leader's snapshot at 299 (its image carries the log below it) and the state it restores."""
    st = LogStorage.open(path, CFG, CONF, ships_log_prefix=True)
    log = entries(0, 150)
    st.append(log)
    sm = ChecksumStateMachine()
    sm.apply(log)
    st.create_snapshot(299, CONF, sm.write_snapshot)
    meta = st.snapshot()
    image = st.snapshot_chunk(meta.index, 0, meta.size)
    assert len(image) == meta.size and meta.size > 10_000, "an image with the log prefix"
    return meta, image, sm, st


async def wait(check: object, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not check():   # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_a_garbage_image_from_the_leader_is_dropped_and_a_good_one_installs_later(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    meta, image, leader_sm, leader_st = leader_image(tmp_path / "leader")
    bad = bytearray(image)
    bad[-50] ^= 0xFF   # inside the last batch of the prefix: its CRC fails
    cut = meta.size // 2

    async def main() -> None:
        sent: list[Message] = []
        storage = LogStorage.open(tmp_path / "follower", CFG, CONF, ships_log_prefix=True)
        sm = ChecksumStateMachine()
        group = RaftGroup("g", 1, storage, sm, RaftConfig(election_timeout_ticks=1000), lambda dst, g, m: sent.append(m),
                          tick_interval_ms=50, rng=random.Random(1))
        group.start()
        drops = group.peer_drops.counts

        def answers() -> list[InstallSnapshotResp]:
            return [m for m in sent if isinstance(m, InstallSnapshotResp)]

        def chunk(offset: int, data: bytes, m: SnapshotMeta = meta) -> InstallSnapshot:
            return InstallSnapshot(term=TERM, src=LEADER, dst=1, meta=m, offset=offset, data=data,
                                   done=offset + len(data) == m.size)

        try:
            # A "snapshot" of 2 bytes at the same index: consistent as a message, no image.
            group.deliver(LEADER, chunk(0, b"ss", SnapshotMeta(index=meta.index, term=TERM, conf=CONF, size=2)))
            await wait(lambda: drops[SNAPSHOT_IMAGE] == 1, "the 2-byte snapshot dropped")
            # The good first half, and in the same delivery the rest with a damaged batch.
            group.deliver(LEADER, chunk(0, image[:cut]))
            group.deliver(LEADER, chunk(cut, bytes(bad[cut:])))
            await wait(lambda: drops[SNAPSHOT_IMAGE] == 2, "the damaged rest dropped")
            assert [(a.offset, a.reject) for a in answers()] == [(cut, False)], "bad chunks are lost, not answered"
            assert group.failed is None and not group.stopped
            assert (storage.latest_snapshot.index, sm.applied_index, group.snapshots.installed) == (-1, -1, 0)
            # The leader sends the rest again (as after a lost chunk): the image installs.
            group.deliver(LEADER, chunk(cut, image[cut:]))
            await wait(lambda: group.snapshots.installed == 1, "the snapshot installed")
            assert answers()[-1].offset == meta.size and not answers()[-1].reject
            assert (sm.applied_index, sm.digest, sm.records) == (299, leader_sm.digest, leader_sm.records)
            assert storage.latest_snapshot.index == 299
            assert [bytes(b.raw) for b in storage.log.batches(0, 300)] == \
                [bytes(b.raw) for b in leader_st.log.batches(0, 300)], "the leader's log below the snapshot"
            # And the group goes on: the leader's next entry is appended and applied.
            nxt = entries(300, 1)
            group.deliver(LEADER, Append(term=TERM, src=LEADER, dst=1, prev_index=299, prev_term=TERM,
                                         entries=tuple(nxt), commit=301))
            await wait(lambda: sm.applied_index == 301, "the next entry applied")
            assert group.failed is None and not group.stopped
        finally:
            await group.close()

    with caplog.at_level(logging.WARNING, logger="eventlog.raft.runtime.peer_drops"):
        asyncio.run(asyncio.wait_for(main(), 60))
    leader_st.close()
    lines = [r.getMessage() for r in caplog.records if SNAPSHOT_IMAGE in r.getMessage()]
    assert lines and "InstallSnapshot" in lines[0] and "from peer 2" in lines[0], lines
