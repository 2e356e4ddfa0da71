"""Corruption is found and repaired (issue 18), on real `epochlog serve` processes with Kafka faces.

Bytes are changed in the middle of a sealed segment of a group's log on one member's disk: of a
stopped follower (found by the scrub after its restart), of the running leader (found by the scrub
while it leads), and of the only member that still holds a range of committed entries (the two others
were wiped or behind). In each case, with bounded waits: the member finds it within the scrub period
(counted in `epochlog_log_damage_found_total`) and repairs it (`epochlog_log_repairs_total`, status
clear again); no client ever receives a damaged record (native read_events from that member, a watch
served by it, kafka-python reading the topic from offset 0, all compared with what was written); no
member exits; afterwards `epochlog log verify` finds every log clean and the views are equal. A
last test changes a follower's views behind its back and checks the leader raises the digest alarm.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from epochlog.client import Client
from epochlog.client.errors import ClientError
from eventlog.records import HEADER_SIZE, read_header
from statemachines import events as ev
from statemachines.store import DIGEST, ViewStore
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until

KV = TopicPartition("__kv", 0)
SEGMENT_BYTES = 64 * 1024
LOG = {"segment_bytes": SEGMENT_BYTES}             # the scrub runs at its default rate
NO_CLEANER = {"cleaner": {"enabled": False}}       # sealed segments stay as written (the cleaner's own test is elsewhere)
PUTS_PER_CALL = 10
WAIT_S = 90.0


# --- writing and damaging ---------------------------------------------------------------------------

def _value(prefix: str, i: int) -> bytes:
    return f"{prefix}:{i}:".encode().ljust(500, b"#")


def _fill(cluster: NodeCluster, prefix: str, count: int) -> dict[int, tuple[str, bytes]]:
    """Put `count` keys (in calls of PUTS_PER_CALL); offset -> (name, value) of each."""
    written: dict[int, tuple[str, bytes]] = {}
    with Client(cluster.endpoints, timeout=20.0, sessions=False) as client:
        for start in range(0, count, PUTS_PER_CALL):
            events = [ev.KvPut(name=f"{prefix}/{i:05d}", value=_value(prefix, i))
                      for i in range(start, min(count, start + PUTS_PER_CALL))]
            for event, result in zip(events, client.commands(events)):
                assert result.ok, result
                written[result.offset] = (event.name, event.value)
    return written


def _segments(cluster: NodeCluster, node: int, group: str = "kv") -> list[Path]:
    return sorted((cluster.nodes[node].data_dir / "groups" / group / "log").glob("*.log"))


def _damage(path: Path) -> tuple[int, int]:
    """Invert a byte in the records of the middle batch of segment file `path`; its offsets [first, last]."""
    data = path.read_bytes()
    batches, pos = [], 0
    while pos < len(data):
        h = read_header(data, pos)
        if h.batch_length <= 0:
            break
        if not h.is_control:
            batches.append((pos, h))
        pos += h.size
    assert len(batches) >= 3, f"{path} holds too few batches to damage one in the middle"
    pos, h = batches[len(batches) // 2]
    at = pos + HEADER_SIZE + (h.size - HEADER_SIZE) // 2
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.base_offset, h.last_offset


def _sealed_middle_segment(cluster: NodeCluster, node: int, holding: set[int] | None = None) -> Path:
    """A sealed kv segment of `node` (never the active one, never the first), holding an offset of
    `holding` when given."""
    files = _segments(cluster, node)
    assert len(files) >= 4, f"node {node}: only {len(files)} kv segments"
    bases = [int(f.name[:20]) for f in files]
    for i in range(1, len(files) - 1):
        if holding is None or any(bases[i] <= o < bases[i + 1] for o in holding):
            return files[i]
    raise AssertionError(f"node {node}: no sealed segment holds the offsets {min(holding or {0})}..")


# --- what the nodes say ------------------------------------------------------------------------------

def _metric(cluster: NodeCluster, node: int, name: str, group: str = "kv") -> float:
    return cluster.wait_metrics(node).get((name, (("group", group),)), 0.0)


def _wait_found_and_repaired(cluster: NodeCluster, node: int) -> None:
    wait_until(lambda: _metric(cluster, node, "epochlog_log_damage_found_total") >= 1, WAIT_S,
               f"node {node} to find the damaged batch")
    wait_until(lambda: _metric(cluster, node, "epochlog_log_repairs_total") >= 1, WAIT_S,
               f"node {node} to drop the damaged batch")

    def whole() -> bool:
        mine = cluster.group_status(node, "kv")
        leader = cluster.group_status(cluster.leader("kv"), "kv")
        return (mine is not None and leader is not None and mine.damage is None
                and mine.last_offset >= leader.commit_offset and mine.applied_offset >= leader.commit_offset
                and _metric(cluster, node, "epochlog_log_damaged") == 0)
    wait_until(whole, WAIT_S, f"node {node} to fetch its kv log again")


def _check_record(written: dict[int, tuple[str, bytes]], offset: int, value: bytes | None, where: str) -> None:
    """A record a client received: if it is one of ours, exactly what was written at that offset."""
    if offset not in written:
        return
    assert value is not None, f"{where}: offset {offset} has no value"
    event = ev.decode_event(value)
    assert isinstance(event, ev.KvPut) and (event.name, event.value) == written[offset], \
        f"{where}: offset {offset} is not what was written there"


def _read_events(cluster: NodeCluster, node: int, written: dict[int, tuple[str, bytes]],
                 start: int, end: int) -> tuple[set[int], list[str]]:
    """read_events from `node` only, over [start, end): the offsets of ours it returned (each checked)
    and the error codes met (a damaged or refetched range answers with a retriable error)."""
    seen: set[int] = set()
    errors: list[str] = []
    offset = start
    with Client([cluster.endpoint(node)], timeout=10.0, sessions=False) as client:
        while offset < end:
            try:
                got = client.read_events("kv", offset, endpoint=cluster.endpoint(node), max_events=500)
            except ClientError as exc:
                errors.append(exc.code)
                assert exc.code in ("corrupt_batch", "log_refetching", "compacted"), exc
                if exc.code == "compacted":
                    return seen, errors
                time.sleep(0.2)
                if len(errors) > 200:
                    return seen, errors
                continue
            for e in got.events:
                _check_record(written, e.offset, e.value, f"read_events from node {node}")
                if e.offset in written:   # the group's own records (e.g. its views format raise) aside
                    seen.add(e.offset)
            if got.next_offset <= offset:
                break
            offset = got.next_offset
    return seen, errors


def _watch(cluster: NodeCluster, node: int, written: dict[int, tuple[str, bytes]], prefix: str) -> None:
    """A watch of `prefix` from offset 0 served by `node` (its only endpoint) sees every record of ours,
    each as written."""
    want = {o for o, (name, _) in written.items() if name.startswith(prefix + "/")}
    seen: set[int] = set()
    with Client([cluster.endpoint(node)], timeout=10.0, sessions=False) as client:
        for event in client.watch(f"{prefix}/", from_offset=0):
            assert isinstance(event.event, ev.KvPut)
            assert (event.event.name, event.event.value) == written[event.offset], event.offset
            seen.add(event.offset)
            if want <= seen:
                return


def _kafka_consumer(cluster: NodeCluster) -> KafkaConsumer:
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", check_crcs=True)
    consumer.assign([KV])
    consumer.seek_to_beginning(KV)
    return consumer


def _kafka_read(cluster: NodeCluster, written: dict[int, tuple[str, bytes]], stop: threading.Event | None = None,
                timeout: float = WAIT_S) -> set[int]:
    """kafka-python reads __kv from its beginning to its end (CRCs checked by the client): every record
    of ours is what was written; the offsets of ours it got.

    The kv leader may be handing over (it found damage). kafka-python 3.0's `end_offsets` retries a
    partition answered NOT_LEADER_OR_FOLLOWER at the leader its metadata names, without refreshing that
    metadata (`Fetcher._fetch_offsets_by_times_async`), so a consumer that learnt the old leader asks it
    until the call times out: each timed-out ask starts again with a new consumer, which learns the
    leader afresh."""
    deadline = time.monotonic() + timeout
    consumer = _kafka_consumer(cluster)
    seen: set[int] = set()
    try:
        while True:
            try:
                end = consumer.end_offsets([KV], timeout_ms=5_000)[KV]
                break
            except KafkaTimeoutError:
                assert time.monotonic() < deadline, "no end offset of __kv within the wait"
                consumer.close()
                consumer = _kafka_consumer(cluster)
        while consumer.position(KV) < end and (stop is None or not stop.is_set()):
            assert time.monotonic() < deadline, f"position {consumer.position(KV)}, end {end}"
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    _check_record(written, r.offset, r.value, "kafka-python")
                    if r.offset in written:   # the group's own records (e.g. its views format raise) aside
                        seen.add(r.offset)
    finally:
        consumer.close()
    return seen


def _finish(cluster: NodeCluster) -> None:
    """No member exited; stop them all, then every log verifies clean and the views agree."""
    assert cluster.running() == sorted(cluster.nodes), f"a member exited: {cluster.describe()}"
    views = cluster.stop_converged(cluster.groups)
    for group, by_node in views.items():
        assert len(set(by_node.values())) == 1, f"{group}: views differ {by_node}"
    for n, node in cluster.nodes.items():
        for group in cluster.groups:
            log_dir = node.data_dir / "groups" / group / "log"
            result = subprocess.run([sys.executable, "-m", "epochlog", "log", "verify", str(log_dir)],
                                    capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
            assert result.returncode == 0, (n, group, result.stdout[-2000:], result.stderr[-2000:])


def _critical_lines(cluster: NodeCluster, node: int) -> list[str]:
    return [line for line in cluster.nodes[node].stderr().splitlines() if "CRITICAL" in line]


# --- the cases ---------------------------------------------------------------------------------------

def test_a_follower_finds_and_repairs_a_damaged_sealed_segment(kafka_cluster_factory: Any) -> None:
    cluster: NodeCluster = kafka_cluster_factory(log=LOG, compaction=NO_CLEANER)
    cluster.start()
    written = _fill(cluster, "f", 400)
    leader = cluster.leader("kv")
    follower = next(n for n in cluster.nodes if n != leader)
    commit = cluster.wait_group_status(leader, "kv").commit_offset
    cluster.wait_applied(follower, "kv", commit)
    cluster.stop(follower)
    segment = _sealed_middle_segment(cluster, follower, set(written))
    first, last = _damage(segment)
    cluster.start([follower])

    _wait_found_and_repaired(cluster, follower)
    lines = _critical_lines(cluster, follower)
    assert any(segment.name in line and f"offset {first}" in line for line in lines), lines
    seen, _ = _read_events(cluster, follower, written, 0, max(written) + 1)
    assert seen == set(written), f"read_events from the repaired follower misses {sorted(set(written) - seen)[:5]}"
    _watch(cluster, follower, written, "f")
    assert _kafka_read(cluster, written) == set(written)
    _finish(cluster)


@pytest.mark.parametrize("found_by", ["scrub", "kafka fetch"])
def test_the_leader_finds_damage_while_it_leads_hands_over_and_repairs(kafka_cluster_factory: Any,
                                                                       found_by: str) -> None:
    """The bytes rot under the running leader (its page cache sees the write). Found by the scrub, or,
    with the scrub off, by the Fetch of a kafka-python consumer reading the topic from offset 0, which
    gets every record as written: the leader stops before the damaged batch, answers the retriable
    KAFKA_STORAGE_ERROR at it, hands leadership over, and the consumer goes on at the new leader."""
    log = LOG if found_by == "scrub" else {**LOG, "scrub_bytes_per_second": 0}
    cluster: NodeCluster = kafka_cluster_factory(log=log, compaction=NO_CLEANER)
    cluster.start()
    written = _fill(cluster, "l", 400)
    leader = cluster.leader("kv")
    readers_stop = threading.Event()
    kafka_seen: list[set[int]] = []
    failures: list[BaseException] = []

    def kafka_reader() -> None:
        try:
            while not readers_stop.is_set():
                kafka_seen.append(_kafka_read(cluster, written, readers_stop))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    thread = threading.Thread(target=kafka_reader, daemon=True)
    thread.start()
    segment = _sealed_middle_segment(cluster, leader, set(written))
    first, _ = _damage(segment)            # the running leader's page cache sees it at once
    _wait_found_and_repaired(cluster, leader)
    readers_stop.set()
    thread.join(WAIT_S)
    assert not failures, failures
    assert cluster.leader("kv") != leader, "the damaged leader kept the leadership"
    seen, _ = _read_events(cluster, leader, written, 0, max(written) + 1)
    assert seen == set(written)
    assert _kafka_read(cluster, written) == set(written)
    assert any(segment.name in line and f"offset {first}" in line for line in _critical_lines(cluster, leader))
    _finish(cluster)


def test_the_only_replica_of_committed_entries_never_serves_them_damaged(kafka_cluster_factory: Any) -> None:
    """Node 3 is down while a range is committed by the two others; then the follower among them goes
    down too, and node 3 comes back: the leader is the only running member that holds the range when
    its bytes rot. (A member whose disk is wiped instead would forget its votes and log, which no Raft
    implementation survives safely; a damaged member keeps a vote floor instead, see RaftNode.)
    The leader can neither hand over (node 3 holds nothing past the damage) nor drop it (nobody could
    send it again): it goes on leading without serving it; node 3 skips it with a snapshot the leader
    takes (its views applied the range before the damage), and once node 3 has caught up the leader
    hands over and drops the damage. The keys keep their values everywhere; the raw records of the
    damaged segment are gone from every log that serves (a reader is told `compacted`, Kafka readers
    start after them), and none is ever served damaged."""
    cluster: NodeCluster = kafka_cluster_factory(log=LOG, compaction=NO_CLEANER)
    cluster.start()
    before = _fill(cluster, "o1", 40)
    cluster.stop(3)
    leader = cluster.leader("kv", among=[1, 2])
    other = 2 if leader == 1 else 1
    only = _fill(cluster, "o2", 400)
    commit = cluster.wait_group_status(leader, "kv").commit_offset
    cluster.wait_applied(other, "kv", commit)
    cluster.stop(other)
    cluster.stop(leader)
    segment = _sealed_middle_segment(cluster, leader, set(only))
    files = _segments(cluster, leader)
    segment_end = int(files[files.index(segment) + 1].name[:20])
    first, last = _damage(segment)
    cluster.start([leader, 3])

    written = {**before, **only}
    _wait_found_and_repaired(cluster, leader)
    assert cluster.leader("kv") == 3
    for n in (leader, 3):   # the keys of the damaged range keep their values
        with Client([cluster.endpoint(n)], timeout=10.0, sessions=False) as client:
            for offset in range(first, last + 1):
                name, value = written[offset]
                got = client.get(name, consistency="local", min_offset=commit)
                assert got is not None and got.value == value, (n, name)
        seen, _ = _read_events(cluster, n, written, 0, max(written) + 1)
        assert not seen & set(range(first, segment_end)), f"node {n} served records of the damaged segment"
    kafka = _kafka_read(cluster, written)
    assert not kafka & set(range(first, segment_end))
    assert {o for o in written if o >= segment_end} <= kafka, "records after the damaged segment are all read"
    cluster.start([other])
    wait_until(lambda: (g := cluster.group_status(other, "kv")) is not None and g.applied_offset >= commit,
               WAIT_S, f"node {other} to catch up")
    _finish(cluster)


def test_views_changed_behind_a_members_back_raise_the_digest_alarm(kafka_cluster_factory: Any) -> None:
    cluster: NodeCluster = kafka_cluster_factory(
        log=LOG, compaction=NO_CLEANER, views={"digest_checkpoint_offsets": 20, "digest_check_interval_ms": 300})
    cluster.start()
    _fill(cluster, "d1", 100)
    leader = cluster.leader("kv")
    follower, other = [n for n in cluster.nodes if n != leader]
    cluster.stop(follower)
    store = ViewStore.open(cluster.nodes[follower].data_dir / "groups" / "kv" / "views")
    try:
        wb = store.new_batch()
        store.put_meta(wb, DIGEST, hashlib.sha256(b"changed behind its back").digest())
        store.write(wb)
    finally:
        store.close()
    cluster.start([follower])
    _fill(cluster, "d2", 100)

    def alarm() -> bool:
        info = cluster.group_status(cluster.leader("kv"), "kv")
        return info is not None and any(a.member == follower for a in info.digest_alarms)
    wait_until(alarm, WAIT_S, "the leader to raise the digest alarm")
    now = cluster.leader("kv")
    info = cluster.wait_group_status(now, "kv")
    assert [a.member for a in info.digest_alarms] == [follower], info.digest_alarms
    alarm_info = info.digest_alarms[0]
    assert alarm_info.digest != alarm_info.leader_digest
    metrics = cluster.wait_metrics(now)
    assert metrics[("epochlog_views_digest_mismatch", (("group", "kv"), ("member", str(follower))))] == 1
    assert ("epochlog_views_digest_mismatch", (("group", "kv"), ("member", str(other)))) not in metrics
    assert any("differ from the leader's" in line for line in _critical_lines(cluster, now))
    assert cluster.running() == sorted(cluster.nodes)


