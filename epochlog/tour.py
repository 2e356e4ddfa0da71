"""`make run`'s tour (`epochlog up --tour`): what Epochlog is for, on the cluster `up` just started.

Once every group has a leader, `Tour.run` goes through the mission in about a minute, one line per
step (at most 80 columns; the test of the tour checks each claim a line makes):

1. sdk      kv puts and consumer-offset commits through the SDK (epochlog.demo_load: ~100 puts/s, a
            lease kept alive, a watch counting what it sees), and a key written twice
            (`tour/greeting`) for the audit of step 7;
2. kafka    a kafka-python consumer tails `__metadata` through the Kafka face (a thread: the client
            blocks), decoding every record as a typed event;
3. brokers  simulated brokers (epochlog.broker_sim: two groups of three) register and heartbeat;
4. failover once its SyncStateSet has a successor, one master stops heartbeating; the controller
            fences it after the heartbeat timeout and elects an in-sync replica; the Kafka consumer
            must see that MasterElected record;
5. sdk      the load stops and reports (its watch must have seen every put, the last key read back);
6. export   Spark (its session started in the background at step 1, so its slow start overlaps
            the failover's wait) exports every committed event to the Delta table `<data-dir>/events` (one commit;
            the next run adds only what is new) and reports the watermark to the cluster;
7. audit    the state of `tour/greeting` just before its second put, asked of the exported table
            with spark/audit.py's SQL on the export's Spark session (already warm: a second JVM
            start would double the step), compared with the live `get --as-of` of that offset.

Spark's JVM writes its start-up noise to stderr: it goes to `<data-dir>/spark.log` (the fd is
redirected while the session starts, and the JVM keeps it). Each step is bounded; one that fails
raises TourError, which `up` reports (exit 1). Use from `up`'s loop; cancelling stops the brokers,
the consumer and the load.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventlog import kafka_codes as kc
from eventlog.errors import EpochlogError
from eventlog.raft.runtime.config import MemberConfig
from epochlog.client import AsyncClient
from epochlog.demo_load import DemoLoad, DemoReport
from statemachines import events as ev

GREETING = "tour/greeting"
BROKER_GROUPS = ("broker-a", "broker-b")
REPLICAS = 3
SYNC_TIMEOUT_S = 30.0         # a master's SyncStateSet to include a successor
FAILOVER_GRACE_S = 30.0       # past the heartbeat timeout, for the controller to elect a new master
KAFKA_TIMEOUT_S = 30.0        # for the consumer to connect, and to see the failover's record
LOAD_BEFORE_FAILOVER_S = 2.0  # the load runs at least this long before the brokers start
WIDTH = 80


class TourError(EpochlogError):
    """A step of the tour did not do what it shows (the message names the step)."""

    code = "tour"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


@dataclass
class TourReport:
    """What the tour did and saw (each line it printed is drawn from here)."""

    load: DemoReport | None = None
    lease: int = 0
    greeting: tuple[int, int] = (-1, -1)          # the kv offsets of its two puts
    brokers: int = 0
    failover: tuple[str, str, float, int] = ("", "", 0.0, 0)   # old master, new master, seconds, master epoch
    kafka_records: int = 0
    kafka_types: collections.Counter[str] = field(default_factory=collections.Counter)
    kafka_saw_failover: bool = False
    export_rows: int = 0
    export_version: int | None = None
    audit_offset: int = -1
    audit_value: str | None = None
    live_value: str | None = None

    def problems(self) -> list[str]:
        """What a healthy cluster would not show (`up` fails the run on any)."""
        out = list(self.load.problems()) if self.load is not None else ["the tour's load did not run"]
        if not self.kafka_saw_failover:
            out.append("the Kafka consumer did not see the failover's MasterElected record")
        if self.audit_value != self.live_value:
            out.append(f"audit answered {self.audit_value!r}, the live get --as-of {self.live_value!r}")
        return out


class Tour:
    """The steps above against the cluster of `members` (their client and kafka addresses)."""

    def __init__(self, members: Sequence[MemberConfig], data_dir: Path) -> None:
        self.endpoints = [m.client_address for m in members if m.client_address]
        self.kafka = [m.kafka_address for m in members if m.kafka_address]
        self.data_dir = data_dir
        self.table = data_dir / "events"
        self.say: Callable[[str], None] = print
        self.report = TourReport()

    def line(self, step: str, text: str) -> None:
        self.say(f"{step:<9}{text}"[:WIDTH])

    async def run(self, say: Callable[[str], None]) -> TourReport:
        """The steps, each printed through `say` as it completes; TourError when one fails."""
        self.say = say
        if not self.kafka:
            raise TourError("kafka: no member has a kafka_address (configs/local-3.toml gives each one)")
        logging.getLogger("kafka").setLevel(logging.WARNING)   # its INFO lines would bury the tour's
        spark_start = asyncio.ensure_future(asyncio.to_thread(self._spark))
        try:
            await self._cluster_steps()
            # Spark blocks: a thread, so `up` goes on drawing its status meanwhile.
            self.line("export", f"starting Spark to export to {_short_path(self.table)} (a minute or two)...")
            await self._table_steps(await spark_start)
        finally:
            if spark_start.done() and not spark_start.cancelled() and spark_start.exception() is None:
                await asyncio.to_thread(spark_start.result().stop)
        return self.report

    async def _cluster_steps(self) -> None:
        """sdk, kafka, brokers, failover, and the load's report."""
        from epochlog.broker_sim import SimulatedBroker
        from epochlog.client.broker import ControllerClient, HeartbeatSender

        r = self.report
        load = DemoLoad(self.endpoints, lambda _line: None)
        load_stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        load_task = loop.create_task(load.run(load_stop))
        tail = MetadataTail(self.kafka)
        fleet: list[SimulatedBroker] = []
        killed: set[str] = set()
        client = AsyncClient(self.endpoints, timeout=10.0, actor="epochlog-tour", name="epochlog-tour")
        sender = HeartbeatSender(ControllerClient(client))
        async with client as c:
            try:
                await self._wait(lambda: load.report.lease_id != 0 or load_task.done(), 30.0, "sdk",
                                 "the demo load to start")
                if load_task.done():
                    load_task.result()   # its error
                r.lease = load.report.lease_id
                first = await c.put(GREETING, f"hello from run {load.report.run}".encode())
                self.line("sdk", f"~{load.puts_per_s:.0f} kv puts/s, offset commits, lease {r.lease:#x}")
                tail.start()
                await self._wait(lambda: tail.connected or tail.error is not None, KAFKA_TIMEOUT_S, "kafka",
                                 "the consumer to read __metadata")
                if tail.error is not None:
                    raise TourError(f"kafka: the consumer failed: {tail.error}")
                self.line("kafka", f"a KafkaConsumer tails __metadata at {self.kafka[0]} (from offset 0)")
                await asyncio.sleep(max(0.0, LOAD_BEFORE_FAILOVER_S))

                fleet = [SimulatedBroker(c, group=g, name=f"{g}-{i}", address=f"127.0.0.1:{10911 + 10 * n}",
                                         sender=sender)
                         for n, (g, i) in enumerate((g, i) for g in BROKER_GROUPS for i in range(REPLICAS))]
                for broker in fleet:   # one by one: the first of each group becomes its master
                    await broker.start()
                r.brokers = len(fleet)
                interval = fleet[0].agent.sender.interval_s
                self.line("brokers", f"{len(fleet)} simulated brokers in {len(BROKER_GROUPS)} groups registered, "
                                     f"heartbeating every {interval:g} s")
                victim = next(b for b in fleet if b.group == BROKER_GROUPS[0] and b.agent.is_master)
                await self._wait(lambda: victim.agent.info is not None
                                 and len(victim.agent.info.sync_state_set) > 1, SYNC_TIMEOUT_S, "failover",
                                 f"{victim.group}'s SyncStateSet to include a replica")
                killed.add(victim.name)
                await victim.stop(shutdown=False)   # silent: its heartbeats just stop
                stopped_at = time.monotonic()
                timeout_s = victim.agent.timeout_ms / 1000
                self.line("failover", f"{victim.name}, master of {victim.group}, stops heartbeating "
                                      f"(timeout {timeout_s:g} s)")
                others = [b for b in fleet if b.group == victim.group and b is not victim]
                await self._wait(lambda: any(b.agent.is_master for b in others), timeout_s + FAILOVER_GRACE_S,
                                 "failover", f"a new master of {victim.group}")
                new = next(b for b in others if b.agent.is_master)
                info = new.agent.info
                epoch = info.master_epoch if info is not None else 0
                r.failover = (victim.name, new.name, time.monotonic() - stopped_at, epoch)
                self.line("failover", f"{new.name} is master of {victim.group} after {r.failover[2]:.1f} s "
                                      f"(master epoch {epoch})")
                await self._wait(lambda: tail.saw_master(victim.group, new.agent.broker_id, epoch),
                                 KAFKA_TIMEOUT_S, "kafka", "the consumer to read the failover")
                r.kafka_saw_failover = True
                r.kafka_records, r.kafka_types = tail.counts()
                self.line("kafka", f"{r.kafka_records} records of __metadata read, the new master's "
                                   f"MasterElected too")

                second = await c.put(GREETING, f"hello again from run {load.report.run}".encode())
                r.greeting = (first.offset, second.offset)
                load_stop.set()
                r.load = await asyncio.wait_for(load_task, 30.0)
                d = r.load
                watched = "all" if d.watched == d.puts else f"{d.watched}"
                self.line("sdk", f"{d.puts} puts, {d.offset_commits} offset commits; the watch saw {watched}; "
                                 f"read back {'ok' if d.read_back else 'WRONG'}")
            finally:
                load_stop.set()
                if not load_task.done():
                    load_task.cancel()
                await asyncio.gather(load_task, return_exceptions=True)
                await asyncio.gather(*(b.stop(shutdown=True) for b in fleet if b.name not in killed),
                                     return_exceptions=True)
                await sender.close()
                tail.stop()
                await asyncio.to_thread(tail.join, 10.0)

    async def _table_steps(self, spark: Any) -> None:
        """export and audit, with `spark`'s session."""
        r = self.report
        r.audit_offset = r.greeting[1] - 1
        log = self.data_dir / "spark.log"
        try:
            exported = await asyncio.to_thread(self._export_and_audit, spark, r.audit_offset)
        except Exception as exc:   # Spark's own errors are long: the whole chain goes to the log
            with log.open("a") as f:
                f.write("".join(traceback.format_exception(exc)))
            raise TourError(f"export: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                            f"(details in {_short_path(log)})") from None
        r.export_rows, r.export_version, seconds, r.audit_value = exported
        where = _short_path(self.table)
        version = "nothing new" if r.export_version is None else f"Delta version {r.export_version}"
        self.line("export", f"{r.export_rows} events to {where} in {seconds:.0f} s ({version})")
        async with AsyncClient(self.endpoints, timeout=10.0, name="epochlog-tour") as c:
            kv = await c.get(GREETING, as_of=r.audit_offset)
        r.live_value = None if kv is None else kv.value.decode("utf-8", "replace")
        same = "= live get --as-of" if r.audit_value == r.live_value else f"!= live {r.live_value!r}"
        self.line("audit", f"{GREETING} @ kv {r.audit_offset}: {r.audit_value!r} {same}")

    async def _wait(self, done: Callable[[], bool], timeout: float, step: str, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TourError(f"{step}: timed out after {timeout:.0f} s waiting for {what}")
            await asyncio.sleep(0.05)

    def _spark(self) -> Any:
        """A local SparkSession; what its JVM says goes to <data-dir>/spark.log."""
        from spark.session import get_session

        with _stderr_to(self.data_dir / "spark.log"):
            return get_session("local[*]", "epochlog-tour")

    def _export_and_audit(self, spark: Any, offset: int) -> tuple[int, int | None, float, str | None]:
        """Export everything committed into the table, then ask it the state of the greeting at `offset`
        (kv group); (rows exported, table version, seconds, the value or None)."""
        from spark.audit import Audit, Point
        from spark.export import export_once, report_watermark
        from spark.sources import ClusterSource
        from spark.storage import TableLocation
        from spark.table import resolve

        location = TableLocation.of(str(self.table))
        result = export_once(spark, location, ClusterSource(tuple(self.endpoints), 10.0))
        if result.table_version is not None:
            report_watermark(tuple(self.endpoints), location, result.exported_through, timeout_s=10.0)
        rows = Audit(spark, resolve(location)).state(Point(group="kv", offset=offset), f"kv/{GREETING}")
        value = next((row["value"] for row in rows if row["key"] == f"kv/{GREETING}"), None)
        return result.rows, result.table_version, result.seconds, value

    def next_steps(self, up_command: str, naming: str) -> list[str]:
        """What to try after the run (printed by `up` at the very end); `naming`: the option client
        commands need to find this cluster ("" when its addresses are the default config's)."""
        lines = ["try next (docs/local-cluster.md explains each):",
                 f"  {up_command}",
                 "      runs this cluster again until Ctrl-C; meanwhile, in another terminal:"]
        if naming:
            lines.append(f"      (add {naming} to each command below)")
        lines += [
            "  epochlog status                        # leaders, lag, last heard",
            "  epochlog put app/x 1 && epochlog get app/x",
            "  epochlog watch app/                    # then put from elsewhere",
            "  epochlog lease grant 30                # then: put --lease <id>",
            "  epochlog brokers                       # what the controller knows",
            "  epochlog audit state --table " + _short_path(self.table)
            + f" --group kv --offset {self.report.audit_offset}",
        ]
        return lines


class MetadataTail(threading.Thread):
    """A kafka-python consumer reading `__metadata` from its start until stopped (the client blocks,
    hence a thread); counts the records by event type and remembers the MasterElected ones."""

    def __init__(self, bootstrap: Sequence[str]) -> None:
        super().__init__(name="tour-kafka", daemon=True)
        self.bootstrap = list(bootstrap)
        self._stop_flag = threading.Event()
        self._lock = threading.Lock()
        self._types: collections.Counter[str] = collections.Counter()
        self._masters: list[tuple[str, int, int]] = []   # (group, master, master epoch before the election)
        self.connected = False
        self.error: str | None = None

    def run(self) -> None:
        try:
            from kafka import KafkaConsumer, TopicPartition

            from epochlog.client.credentials import kafka_python_options

            consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="epochlog-tour",
                                     auto_offset_reset="earliest", enable_auto_commit=False,
                                     **kafka_python_options(self.bootstrap))   # SSL with `up`'s admin certificate
            try:
                partition = TopicPartition("__metadata", 0)
                consumer.assign([partition])
                consumer.seek_to_beginning(partition)
                while not self._stop_flag.is_set():
                    polled = consumer.poll(timeout_ms=200)
                    self.connected = True
                    for records in polled.values():
                        for record in records:
                            self._count(record.value)
            finally:
                consumer.close()
        except Exception as exc:   # reported by the tour as the step's failure
            self.error = f"{type(exc).__name__}: {exc}"

    def _count(self, value: bytes | None) -> None:
        if value is None:
            return
        try:
            event = ev.decode_event(value)
        except (ev.EventError, ev.SchemaVersionError):
            return
        with self._lock:
            self._types[type(event).__name__] += 1
            if isinstance(event, ev.MasterElected):
                self._masters.append((event.group, event.master, event.master_epoch))

    def saw_master(self, group: str, master: int, epoch: int) -> bool:
        """Whether a MasterElected of `group` naming `master` was read (for the election into `epoch`)."""
        with self._lock:
            return any(g == group and m == master and e < epoch for g, m, e in self._masters)

    def counts(self) -> tuple[int, collections.Counter[str]]:
        with self._lock:
            return sum(self._types.values()), collections.Counter(self._types)

    def stop(self) -> None:
        self._stop_flag.set()


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at `path` (appended) while the block runs: processes started meanwhile
    (Spark's JVM) keep writing there."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _short_path(path: Path) -> str:
    """`path` relative to the working directory when it is under it (shorter lines)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


__all__ = ["Tour", "TourError", "TourReport", "MetadataTail"]
