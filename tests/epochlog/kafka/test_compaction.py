"""Key compaction on real `epochlog serve` nodes, read back by real Kafka clients (docs/compaction.md).

1. Three nodes with 512 KiB segments, a snapshot every 300 offsets, 300 offsets of retention and a
   1 s delete retention (so passes run within seconds). One follower is stopped first. Through the
   SDK: keys overwritten many times with 1 KiB values, keys put then deleted, a compare-and-set
   rejected and a retried request id (with another value) as the LATEST records of two keys, a
   delete of a key that never existed; through a KafkaProducer, keyed records and tombstones on a
   topic created with CreateTopics (hosted in the kv group, as Faust's changelogs are). Then:
   - the kv log on disk stays bounded while many times its size was written;
   - a kafka-python consumer reading `__kv` from offset 0 (log start reported unchanged: 0) sees,
     below the leader's cleaned range end E, exactly one record per key: the latest APPLIED one
     (never the rejected compare-and-set's value or the retry's), deleted keys gone; from E on,
     every record as `read_events` serves it;
   - an aiokafka consumer reading the hosted topic from its start, as Faust recovers a table, gets
     the latest value of every key (tombstoned keys gone) from fewer records than were produced;
   - `read_events` and `watch` from below E answer `compacted`;
   - the follower, started again, installs a snapshot of each compact group (`metadata` too: config
     entries overwritten and deleted meanwhile), with the leader's key-compacted log below it (its log
     still starts at 0). Leadership of `kv` and `metadata` then moves to it: read from offset 0 with
     kafka-python, `__kv` and `__metadata` give every key's latest applied record (the views' value at
     the views' version, through the SDK), one record per key below the old leader's cleaned range
     end, deleted keys gone, no rejected or retried value; the hosted topic recovers whole from it;
     `read_events` below its cleaned range answers `compacted`; stopped, the three nodes hold the
     same applied offset and views digest, and `epochlog log verify` passes on every node's log.
2. kill -9 while the cleaner works (EPOCHLOG_CRASH_AT, eventlog/fault_injection.py): a node
   SIGKILLs itself in the middle of the node-side swap of a cleaned segment (before it, after the
   checkpoint's swap line, around the commit rename, while the replaced segments are renamed, after
   it) or its worker process kills it while writing the cleaned files (after the fsync of one, after
   the whole pass). After every kill the node starts again and serves; at the end `epochlog log
   verify` passes on every node and the three views digests match. The suite runs a seeded sample
   (printed; EPOCHLOG_CLEAN_CRASH_SEED=<seed> replays it; EPOCHLOG_CLEAN_CRASH_POINTS=all runs all).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from epochlog.api import messages as p
from epochlog.client import Client, ClientError, CompactedError
from eventlog.fault_injection import CRASH_ENV_VAR
from statemachines import events as ev
from statemachines.request_ids import uuid7
from statemachines.views import ViewsStateMachine
from tests.epochlog.kafka.raw import RawKafka
from tests.support.nodes import BackgroundWriter, NodeCluster, ROOT
from tests.support.wait import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

KV = TopicPartition("__kv", 0)
KEYS = [f"cmp/k{i:02d}" for i in range(20)]
GONE = [f"cmp/gone-{i}" for i in range(5)]
META = TopicPartition("__metadata", 0)
CONFIGS = [f"c{i:02d}" for i in range(10)]          # config/cmp/<name>: metadata entities
GONE_CONFIGS = [f"gone-{i}" for i in range(3)]
PAD = b"." * 1024
CLEANER = {"delete_retention_ms": 1000}
COMPACTION = {"retain_offsets": 300, "check_interval_ms": 100, "prune_interval_ms": 20, "cleaner": CLEANER}
HOSTED = "cmp-changelog"
# The first test's segments and the kv log's bound on disk: 512 KiB and 5 segments (2.5 MiB), with 300 rounds
# of writes (were 1 MiB, 4 MiB and 450 rounds, before the suite's time bound): still more than twice the bound
# is written, which the test asserts.
SEGMENT = 512 << 10
KV_BOUND = 5 * SEGMENT


def _kv(info: p.CompactionInfo) -> p.CompactionGroupInfo:
    return next(g for g in info.groups if g.group == "kv")


def _create_topic(cluster: NodeCluster, name: str) -> None:
    from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

    with RawKafka(cluster.nodes[cluster.running()[0]].kafka_address) as raw:
        reply = raw.call(CreateTopicsRequest(topics=[CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=1, replication_factor=3, assignments=[], configs=[])],
            timeout_ms=5000, validate_only=False), CreateTopicsResponse, 3).topics[0]
    assert reply.error_code == 0, reply


def _consume(consumer: KafkaConsumer, tp: TopicPartition, end: int, timeout: float = 60.0) -> list[Any]:
    """Every record from the consumer's position until its position reaches `end`."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"position {consumer.position(tp)} after {len(out)} records, end {end}"
        for records in consumer.poll(timeout_ms=500).values():
            out.extend(records)
    return out


async def _recover(bootstrap: list[str], topic: str) -> tuple[dict[bytes, bytes], int]:
    """What Faust does to rebuild a table: read the changelog from its start to its end offset."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTp

    tp = AioTp(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        table: dict[bytes, bytes] = {}
        records = 0
        deadline = time.monotonic() + 60
        while await consumer.position(tp) < end:
            assert time.monotonic() < deadline, (await consumer.position(tp), end)
            for batch in (await consumer.getmany(tp, timeout_ms=500)).values():
                for record in batch:
                    records += 1
                    if record.value is None:
                        table.pop(record.key, None)
                    else:
                        table[record.key] = record.value
        return table, records
    finally:
        await consumer.stop()


def _verify_logs(cluster: NodeCluster, groups: tuple[str, ...] = ("metadata", "offsets", "kv")) -> None:
    """`epochlog log verify` passes on every group log of every (stopped) node: the runs go together
    (each is mostly an interpreter start; one after the other they took seconds)."""
    runs = {(n, group): subprocess.Popen([sys.executable, "-m", "epochlog", "log", "verify",
                                          str(node.data_dir / "groups" / group / "log")],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            for n, node in cluster.nodes.items() for group in groups}
    try:
        for (n, group), proc in runs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, (n, group, out[-2000:], err[-2000:])
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()   # only the processes started here
                proc.wait(10)


def _digests(cluster: NodeCluster, groups: tuple[str, ...] = ("metadata", "kv")) -> dict[str, set[tuple[int, bytes]]]:
    out: dict[str, set[tuple[int, bytes]]] = {}
    for group in groups:
        for node in cluster.nodes.values():
            sm = ViewsStateMachine(node.data_dir / "groups" / group)
            try:
                out.setdefault(group, set()).add((sm.applied_index, sm.digest))
            finally:
                sm.close()
    return out


def _group(info: p.CompactionInfo, group: str) -> p.CompactionGroupInfo:
    return next(g for g in info.groups if g.group == group)


def _read_topic(cluster: NodeCluster, tp: TopicPartition) -> list[Any]:
    """Every record of `tp` from offset 0 to its end, with kafka-python (the log start must be 0)."""
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([tp])
        assert consumer.beginning_offsets([tp])[tp] == 0, f"{tp.topic} no longer starts at 0"
        high = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        return _consume(consumer, tp, high)
    finally:
        consumer.close()


def _latest_by_key(records: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in records:
        if r.key is not None:
            out[r.key.decode()] = r
    return out


def _settle(cluster: NodeCluster, nodes: list[int]) -> None:
    """Wait until every node in `nodes` applied each group's commit offset (nothing is written)."""
    for group in cluster.groups:
        leader = cluster.leader(group)
        commit = cluster.wait_group_status(leader, group).commit_offset
        for n in nodes:
            cluster.wait_applied(n, group, commit, timeout=60)


def test_kafka_readers_see_the_latest_applied_value_of_every_key(
        kafka_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = kafka_cluster_factory(size=3, snapshot_every_entries=300, log={"segment_bytes": SEGMENT},
                                    compaction=COMPACTION)
    cluster.start()
    leader = cluster.leader("kv")
    meta_leader = cluster.leader("metadata")
    follower = next(n for n in cluster.nodes if n != leader and n != meta_leader)
    cluster.stop(follower)                                  # kept down past the cleaning
    running = [n for n in cluster.nodes if n != follower]
    latest: dict[str, tuple[int, bytes | None]] = {}        # key -> (offset, value or None) of its latest APPLIED write
    written_bytes = 0

    with Client([cluster.endpoint(n) for n in running], timeout=30.0) as client:
        # The records that must not survive as their key's latest: a rejected compare-and-set, a retry.
        applied = client.put("cmp/cas", b"cas-applied")
        latest["cmp/cas"] = (applied.offset, b"cas-applied")
        (rejected,) = client.commands([ev.KvPut(name="cmp/cas", value=b"cas-rejected",
                                                       expected_version=applied.offset + 1000)])
        assert not rejected.ok and rejected.code == "version_mismatch", rejected
        retry_id = uuid7()
        first = client.command(ev.KvPut(name="cmp/retry", value=b"retry-first", request_id=retry_id))
        latest["cmp/retry"] = (first.offset, b"retry-first")
        (again,) = client.commands([ev.KvPut(name="cmp/retry", value=b"retry-second", request_id=retry_id)])
        assert again.duplicate and again.offset == first.offset, again
        (missing,) = client.commands([ev.KvDeleted(name="cmp/never")])
        assert not missing.ok and missing.code == "not_found", missing
        for name in GONE:
            client.put(name, b"soon gone")
            latest[name] = (client.delete(name).offset, None)
        for name in GONE_CONFIGS:
            client.command(ev.ConfigChanged(scope="cmp", name=name, value="soon gone"))
            client.command(ev.ConfigChanged(scope="cmp", name=name, value=None))

        _create_topic(cluster, HOSTED)
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
        produced = 0
        table: dict[bytes, bytes] = {}
        try:
            for i in range(600):
                key = f"h{i % 12}".encode()
                value = None if i % 97 == 5 else f"{i}:".encode() + PAD
                producer.send(HOSTED, key=key, value=value)
                produced += 1
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
            producer.flush(60)
        finally:
            producer.close(10)

        rounds = 300
        started = time.monotonic()
        for r in range(rounds):
            values = [(name, f"{r}:{name}:".encode() + PAD) for name in KEYS]
            results = client.commands([ev.KvPut(name=n, value=v) for n, v in values])
            for (name, value), result in zip(values, results, strict=True):
                assert result.ok, result
                latest[name] = (result.offset, value)
                written_bytes += len(value)
            # And metadata entities (about 3 MiB in all), overwritten as long.
            client.commands([ev.ConfigChanged(scope="cmp", name=n, value=f"{r}:" + "." * 1000) for n in CONFIGS])
        print(f"{rounds * len(KEYS)} puts ({written_bytes / 1e6:.1f} MB) in {time.monotonic() - started:.1f}s, "
              f"{produced} records to {HOSTED}")

        def cleaned() -> p.CompactionGroupInfo | None:
            kv = _kv(client.compaction_status(cluster.endpoint(leader)))
            last = kv.last_clean
            done = (kv.clean_passes >= 2 and not kv.clean_running and kv.clean_waiting and last is not None
                    and last.tombstones_dropped >= 0 and kv.clean_end_offset > latest[KEYS[0]][0] - 3000)
            return kv if done else None
        kv = wait_until(cleaned, 120, "passes of the kv leader's cleaner", interval=0.5)

        def meta_cleaned() -> int | None:
            g = _group(client.compaction_status(cluster.endpoint(meta_leader)), "metadata")
            print(f"metadata leader {meta_leader}: cleaned below {g.clean_end_offset} ({g.clean_passes} passes, "
                  f"waiting: {g.clean_waiting!r}, last {g.last_clean})")
            if g.clean_end_offset < 1000:
                return None
            keys = _latest_by_key(_read_topic(cluster, META))
            return None if any(f"config/cmp/{n}" in keys for n in GONE_CONFIGS) else g.clean_end_offset
        meta_end = wait_until(meta_cleaned, 120, "the metadata leader's cleaner past the deletes' retention",
                              interval=3.0)
        print(f"leader {leader}: kv {kv.log_start}..{kv.log_end}, cleaned below {kv.clean_end_offset} "
              f"({kv.cleaned_segments} cleaned segments, {kv.clean_passes} passes, "
              f"{kv.clean_bytes_reclaimed / 1e6:.1f} MB reclaimed), {kv.log_bytes / 1e6:.1f} MB on disk; "
              f"last pass {kv.last_clean}")
        assert kv.cleanup_policy == "compact" and kv.log_start == 0
        # Bounded: the active segment and the next one (preallocated, 512 KiB each), what the horizon keeps
        # unclean and the cleaned segments (a record per key), while more than twice the bound was written.
        assert kv.log_bytes < KV_BOUND and written_bytes > 2 * KV_BOUND, (kv.log_bytes, written_bytes)
        end = kv.clean_end_offset
        statuses = {n: client.compaction_status(cluster.endpoint(n)) for n in running}
        for n, info in statuses.items():
            policies = {g.group: g.cleanup_policy for g in info.groups}
            assert policies == {"metadata": "compact", "offsets": "delete", "kv": "compact"}, (n, policies)
            assert _kv(info).clean_passes >= 1 and _kv(info).clean_end_offset > 0, (n, _kv(info))

        # Readers promised every event are told where the full history starts.
        with pytest.raises(CompactedError) as info:
            client.read_events("kv", 0)
        assert f"key-compacted below {end}" in str(info.value)
        # A watch goes to any node, and each cleans on its own: from below every running node's clean end
        # (cleaning only moves it up), wherever it lands. From below the leader's alone, a watch on a node
        # that had cleaned less found nothing to refuse and waited for events forever.
        below_all = min(_kv(info).clean_end_offset for info in statuses.values()) - 1
        with pytest.raises(CompactedError):
            for _ in client.watch("cmp/", from_offset=below_all):
                pass
        tail = client.read_events("kv", end, max_events=100_000, max_bytes=64 << 20)
        assert tail.log_start == end and tail.events[0].offset >= end
        above = [(e.offset, e.key, e.value) for e in tail.events]
        while tail.next_offset <= tail.commit_offset:
            tail = client.read_events("kv", tail.next_offset, max_events=100_000, max_bytes=64 << 20)
            above += [(e.offset, e.key, e.value) for e in tail.events]
        covered = tail.next_offset   # the client's session closes after this (its record is not compared)

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([KV])
        assert consumer.beginning_offsets([KV])[KV] == 0            # key compaction moves no log start
        high = consumer.end_offsets([KV])[KV]
        consumer.seek_to_beginning(KV)
        records = _consume(consumer, KV, high)
    finally:
        consumer.close()
    below = [r for r in records if r.offset < end]
    print(f"__kv: {len(records)} records read up to {high}, {len(below)} below the cleaned range's end {end}")
    assert [(r.offset, r.key.decode(), r.value) for r in records if end <= r.offset < covered] == \
           [a for a in above if a[0] < high], "the log from the cleaned range's end on is as written"
    by_key: dict[str, list[Any]] = {}
    for r in below:
        by_key.setdefault(r.key.decode(), []).append(r)
    assert all(len(rs) == 1 for rs in by_key.values()), {k: len(rs) for k, rs in by_key.items() if len(rs) > 1}
    for name, (offset, value) in latest.items():
        if offset >= end:
            continue
        found = by_key.get(f"kv/{name}")
        if value is None:
            assert found is None, f"{name} was deleted long ago: its tombstone should be gone, not {found}"
        else:
            assert found is not None, f"{name}: its latest applied value is missing"
            event = ev.decode_event(found[0].value)
            assert isinstance(event, ev.KvPut) and event.value == value and found[0].offset == offset, (name, event)
    assert "kv/cmp/never" not in by_key
    values = {ev.decode_event(r.value).value for r in below if isinstance(ev.decode_event(r.value), ev.KvPut)}
    assert b"cas-rejected" not in values and b"retry-second" not in values

    recovered, read = asyncio.run(_recover(cluster.bootstrap, HOSTED))
    print(f"{HOSTED}: {produced} records produced, {read} read back from its start, {len(recovered)} keys")
    assert recovered == table and read < produced / 3

    cluster.start([follower])
    _settle(cluster, list(cluster.nodes))
    installed = cluster.wait_metrics(follower)
    with Client(cluster.endpoints, timeout=30.0) as client:
        for group in ("kv", "metadata"):
            assert installed[("epochlog_snapshots_installed_total", (("group", group),))] >= 1, group
            mine = _group(client.compaction_status(cluster.endpoint(follower)), group)
            # It installed a snapshot with the leader's log below it: its log still starts at 0.
            assert mine.log_start == 0 and mine.clean_end_offset > 0, mine
        assert client.get("cmp/cas", consistency="local", min_offset=0).value == b"cas-applied"

        # The member that installed the snapshots leads; readers from offset 0 still get every key.
        for group in ("kv", "metadata"):
            def moved(group: str = group) -> bool:
                if cluster.leader(group) == follower:
                    return True
                try:
                    client.transfer_leader(group, to=follower)
                except ClientError as exc:
                    print(f"transfer of {group}: {exc}")
                return False
            wait_until(moved, 60, f"{group} led by node {follower}", interval=1.0)
        views_kv: dict[str, Any] = {}
        after = None
        while True:
            page = client.list("", limit=1000, after=after)
            views_kv.update((item.name, item) for item in page.items)
            if page.next_after is None:
                break
            after = page.next_after
        views_meta = {e.key: e for e in client.list_entities("config/cmp/", limit=1000).items}
        with pytest.raises(CompactedError):
            client.read_events("kv", 0)
    assert len(views_meta) == len(CONFIGS) and len(views_kv) >= len(KEYS)
    for tp, views, deleted in ((KV, {f"kv/{k}": (v.version, v.value) for k, v in views_kv.items()},
                                [f"kv/{n}" for n in GONE]),
                               (META, {k: (e.version, e.state.value) for k, e in views_meta.items()},
                                [f"config/cmp/{n}" for n in GONE_CONFIGS])):
        records = _read_topic(cluster, tp)
        top = _latest_by_key(records)
        for key, (version, value) in views.items():
            found = top.get(key)
            assert found is not None, f"{tp.topic} from node {follower}: {key} (version {version}) is missing"
            event = ev.decode_event(found.value)
            assert found.offset == version and event.value == value, (tp.topic, key, found.offset, version, event)
        assert not [k for k in deleted if k in top], f"{tp.topic}: deleted keys past the delete retention"
        end = kv.clean_end_offset if tp is KV else meta_end   # the old leader's cleaned range
        below: dict[str, int] = {}
        for r in records:
            if r.offset < end and r.key is not None:
                below[r.key.decode()] = below.get(r.key.decode(), 0) + 1
        assert all(n == 1 for n in below.values()), {k: n for k, n in below.items() if n > 1}
        print(f"{tp.topic} read from node {follower}: {len(records)} records, {len(top)} keys, "
              f"{len(views)} in the views")
    values = {getattr(ev.decode_event(r.value), "value", None) for r in _read_topic(cluster, KV)}
    assert b"cas-rejected" not in values and b"retry-second" not in values
    recovered, _ = asyncio.run(_recover(cluster.bootstrap, HOSTED))
    assert recovered == table, "the hosted topic recovered from the new leader"
    text = subprocess.run([sys.executable, "-m", "epochlog", "compaction", "status", "--endpoints",
                           ",".join(cluster.endpoints)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=False)
    assert text.returncode == 0 and "key compaction" in text.stdout and "compact below" in text.stdout, text
    print(text.stdout)
    metrics = cluster.wait_metrics(leader)
    assert metrics[("epochlog_cleaner_passes_total", (("group", "kv"),))] >= 2
    assert metrics[("epochlog_cleaner_bytes_reclaimed_total", (("group", "kv"),))] > 0
    assert cluster.stop_all() == {1: 0, 2: 0, 3: 0}
    digests = _digests(cluster)
    assert all(len(d) == 1 for d in digests.values()), digests
    _verify_logs(cluster)


# --- kill -9 while the cleaner works ------------------------------------------------------------------

# The swap's file operations (eventlog/log.py Log.swap_cleaned): io1-io3 the checkpoint's `swap` line
# (temp file fsync, rename, directory fsync), io4-io5 the index files renamed .swap, io6 the log file
# renamed .swap (the commit point), io7 the directory fsync, io8.. the replaced segments renamed .deleted.
SWAP_POINTS = ["clean.swap:before", "clean.swap:io3", "clean.swap:io5", "clean.swap:io6", "clean.swap:io7",
               "clean.swap:io9", "clean.swap:after"]
WORKER_POINTS = ["clean.write:io1", "clean.pass:after", "clean.pass:before"]
POINTS = SWAP_POINTS + WORKER_POINTS
SAMPLE = 2   # one point of each side (a third, a second swap point, cost a kill and two node starts)
VICTIM = 3


def _points() -> tuple[int, list[str]]:
    env = os.environ.get("EPOCHLOG_CLEAN_CRASH_SEED")
    seed = int(env) if env else random.SystemRandom().getrandbits(32)
    if os.environ.get("EPOCHLOG_CLEAN_CRASH_POINTS") == "all":
        return seed, list(POINTS)
    rng = random.Random(seed)
    # Both sides: the node's swap and the worker.
    chosen = [rng.choice(SWAP_POINTS), rng.choice(WORKER_POINTS)]
    chosen += rng.sample([x for x in POINTS if x not in chosen], SAMPLE - len(chosen))
    return seed, chosen


class Writer(BackgroundWriter):
    """Overwrites KEYS with 1 KiB values through the SDK until stopped (the cleaner's work)."""

    def __init__(self, endpoints: list[str], seed: int) -> None:
        super().__init__()
        self.endpoints = endpoints
        self.rng = random.Random(seed)
        self.acked = 0
        self.errors = 0

    def _run(self) -> None:
        with Client(self.endpoints, timeout=20.0) as client:
            i = 0
            while self.running:
                try:
                    client.commands([ev.KvPut(name=self.rng.choice(KEYS), value=f"{i}:{j}".encode() + PAD)
                                     for j in range(10)])
                    self.acked += 10
                except (ClientError, TimeoutError):
                    self.errors += 1
                i += 1


def test_kill9_while_the_cleaner_swaps_or_writes_then_logs_verify_and_views_agree(
        kafka_cluster_factory: Callable[..., NodeCluster]) -> None:
    seed, points = _points()
    print(f"seed={seed} (EPOCHLOG_CLEAN_CRASH_SEED={seed}); points: {points}")
    cluster = kafka_cluster_factory(size=3, snapshot_every_entries=100, log={"segment_bytes": 64 << 10},
                                    compaction={**COMPACTION, "retain_offsets": 100})
    cluster.start()
    cluster.leader("kv")
    writer = Writer(cluster.endpoints, seed)
    writer.start()
    try:
        wait_until(lambda: writer.acked >= 300, 60, "the first writes")
        cluster.stop(VICTIM)
        for point in points:
            started = time.monotonic()
            cluster.env = {CRASH_ENV_VAR: point}
            cluster.start([VICTIM], wait=False)
            node = cluster.nodes[VICTIM]
            wait_until(lambda node=node: not node.running, 120, f"node {VICTIM} to die at {point}", interval=0.1)
            cluster.env = {}
            assert node.proc is not None and node.proc.returncode == -9, (node.proc.returncode, node.stderr()[-3000:])
            assert f"epochlog-crash: SIGKILL at {point}@1" in node.stderr(), node.stderr()[-3000:]
            print(f"killed at {point} after {time.monotonic() - started:.1f}s ({writer.acked} writes acknowledged)")
            cluster.start([VICTIM])                           # it opens (recovery finishes or undoes the swap)
            with Client([cluster.endpoint(VICTIM)], timeout=20.0) as own:
                assert own.status(cluster.endpoint(VICTIM)).node == VICTIM
                own.get(KEYS[0], consistency="local")          # and serves
            cluster.stop(VICTIM)
        cluster.start([VICTIM])
        done = writer.acked
        wait_until(lambda: writer.acked >= done + 300, 60, "writes after the last restart")
    finally:
        writer.stop()
    print(f"{writer.acked} writes acknowledged, {writer.errors} errors")
    _settle(cluster, list(cluster.nodes))
    with Client(cluster.endpoints, timeout=20.0) as client:
        ends = {n: _kv(client.compaction_status(cluster.endpoint(n))).clean_end_offset for n in cluster.nodes}
    print(f"cleaned range ends per node: {ends}")
    assert all(e > 0 for e in ends.values()), ends
    assert cluster.stop_all() == {1: 0, 2: 0, 3: 0}
    digests = _digests(cluster)
    assert all(len(d) == 1 for d in digests.values()), digests
    _verify_logs(cluster)
    print(json.dumps({g: [a for a, _ in d] for g, d in digests.items()}))
