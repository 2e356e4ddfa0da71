"""`make run`'s tour end to end: `epochlog up --tour` on a config with free ports (Kafka face on) and a
temp data directory, as a user runs it, and every line it prints checked against what is on disk
afterwards: the nodes' logs (read offline once `up` stopped them) and the exported Delta table.

One test, slow (three nodes, simulated brokers through a failover that waits out a heartbeat timeout,
a Spark session): bounded by TOUR_TIMEOUT_S. The tour waits for each thing it shows (epochlog/tour.py);
this test waits for the process to end, then asserts.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from statemachines import events as ev
from tests.epochlog.local_cluster import ROOT, cluster_document, kill_leftovers, recorded_nodes, write_config
from tests.epochlog.local_cluster import epochlog_argv
from tests.support.offline import read_log_dir
from tests.support.ports import free_ports

TOUR_TIMEOUT_S = 900.0      # Spark's start takes minutes on a loaded 2-core machine
WIDTH = 80
SEGMENT_BYTES = 1 << 20
FENCE_AFTER_MS = 4_000


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    left = kill_leftovers(path)
    assert not left, f"node processes outlived `epochlog up`: {left}"


def tour_config(path: Path) -> tuple[Path, list[str]]:
    """A 3-node config on free ports with a Kafka address per member (the tour tails __metadata)."""
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    document = cluster_document(3, random.Random(seed), name="tour")
    kafka = [f"127.0.0.1:{port}" for port in free_ports(3)]
    for member, address in zip(document["cluster"]["members"], kafka):
        member["kafka_address"] = address
    document["log"]["segment_bytes"] = SEGMENT_BYTES
    # The failover waits out the silent master's heartbeat timeout: 4 s here instead of the controller
    # profile's 10 s (4 heartbeat intervals; the tour and the lines checked are the same).
    document["controller"] = {"heartbeat_timeout_ms": FENCE_AFTER_MS}
    return write_config(path, document), kafka


def events_of(node_dir: Path, group: str) -> list[tuple[int, ev.Event]]:
    """(offset, event) of every record of a stopped node's group log."""
    log = read_log_dir(node_dir / "groups" / group / "log", LogConfig(segment_bytes=SEGMENT_BYTES))
    out = []
    for batch in log.batches:
        if batch.control:
            continue
        for i, (_key, value) in enumerate(batch.records):
            if value is not None:
                out.append((batch.base + i, ev.decode_event(value)))
    return out


def step(out: str, name: str, pattern: str) -> re.Match[str]:
    """The tour's line of `step` matching `pattern` (a step's lines start with its name in 9 columns)."""
    found = re.search(rf"^{name:<9}{pattern}$", out, re.MULTILINE)
    assert found, f"no {name!r} line matching {pattern!r} in:\n{out}"
    return found


def test_make_run_tour_shows_the_mission_and_every_line_holds(tmp_path: Path, data_dir: Path) -> None:
    config, kafka = tour_config(tmp_path / "cluster.toml")
    # As `make run` does: relative paths from the working directory (so the lines show short ones).
    run = subprocess.run(epochlog_argv("up", "--config", config.name, "--data-dir", data_dir.name, "--tour"),
                         capture_output=True, text=True, timeout=TOUR_TIMEOUT_S, cwd=tmp_path)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert_every_line_holds(run.stdout, tmp_path, kafka)


def assert_every_line_holds(out: str, cwd: Path, kafka: list[str]) -> None:
    """The tour's output `out`, printed in `cwd` for the data directory `cwd/data`, against what is there."""
    data_dir = cwd / "data"
    assert "epochlog up: stopped cleanly" in out and "problem:" not in out, out
    steps = re.findall(r"^(?:sdk|kafka|brokers|failover|export|audit) .*$|^\[ *[\d.]+s\] .*$", out, re.MULTILINE)
    assert len(steps) >= 10 and all(len(line) <= WIDTH for line in steps), steps
    nodes = recorded_nodes(data_dir)
    assert sorted(nodes) == [1, 2, 3] and all(n["exit_code"] == 0 for n in nodes.values()), nodes

    # Every node holds the committed logs; node 1's is read (the run stopped every node cleanly).
    kv, offsets, metadata = (events_of(data_dir / "node-1", g) for g in ("kv", "offsets", "metadata"))

    # sdk: the load's lease, its puts (each key once: retries are answered, not applied twice) and commits.
    lease = int(step(out, "sdk", r"~\d+ kv puts/s, offset commits, lease (0x[0-9a-f]+)").group(1), 16)
    assert any(isinstance(e, ev.LeaseGranted) and e.lease_id == lease for _, e in kv), lease
    load = step(out, "sdk", r"(\d+) puts, (\d+) offset commits; the watch saw all; read back ok")
    puts, commits = int(load.group(1)), int(load.group(2))
    demo_keys = {e.name for _, e in kv if isinstance(e, ev.KvPut) and e.name.startswith("demo/keys/1-")}
    assert puts > 0 and len(demo_keys) == puts, (puts, len(demo_keys))
    assert commits > 0 and sum(isinstance(e, ev.OffsetCommitted) for _, e in offsets) >= commits

    # kafka: the consumer tailed __metadata through one of the members' Kafka addresses.
    assert step(out, "kafka", r"a KafkaConsumer tails __metadata at (\S+) \(from offset 0\)").group(1) in kafka

    # brokers and the failover: registrations, the fence of the silent master, the election of its successor.
    step(out, "brokers", r"6 simulated brokers in 2 groups registered, heartbeating every [\d.]+ s")
    registered = {(e.group, e.name): e.broker_id for _, e in metadata if isinstance(e, ev.BrokerRegistered)}
    assert len(registered) == 6 and {g for g, _ in registered} == {"broker-a", "broker-b"}, registered
    victim = step(out, "failover", rf"(\S+), master of (broker-a), stops heartbeating \(timeout {FENCE_AFTER_MS / 1000:g} s\)")
    new = step(out, "failover", r"(\S+) is master of broker-a after [\d.]+ s \(master epoch (\d+)\)")
    assert new.group(1) != victim.group(1)
    fenced = [o for o, e in metadata if isinstance(e, ev.BrokerFenced) and e.name == victim.group(1)]
    # The election after the fence (the tour's controlled shutdowns at its end elect others later).
    elected = [o for o, e in metadata if isinstance(e, ev.MasterElected) and e.group == "broker-a"
               and e.master == registered[("broker-a", new.group(1))] and fenced and o > fenced[0]]
    assert fenced and elected, metadata
    failover_offset = elected[0]

    # kafka: what it read of __metadata, the election included, is there.
    read = int(step(out, "kafka", r"(\d+) records of __metadata read, the new master's MasterElected too").group(1))
    types = Counter(type(e).__name__ for _, e in metadata)
    assert 6 + 1 <= read <= sum(types.values()), (read, types)

    # export: the rows it wrote are the Delta table's (a new table: all of them), events of every group.
    export = step(out, "export", r"(\d+) events to data/events in \d+ s \(Delta version (\d+)\)")
    from deltalake import DeltaTable

    table = DeltaTable(str(data_dir / "events"))
    assert table.version() == int(export.group(2))
    rows = table.to_pyarrow_table(columns=["group", "offset", "key", "event_type"]).to_pylist()
    assert len(rows) == int(export.group(1)), (len(rows), export.group(0))
    assert any(r["group"] == "metadata" and r["offset"] == failover_offset and r["event_type"] == "MasterElected"
               for r in rows)

    # audit: the greeting just before its second put, as the table and the live cluster answered it.
    audit = step(out, "audit", r"tour/greeting @ kv (\d+): '([^']*)' = live get --as-of")
    at, value = int(audit.group(1)), audit.group(2)
    greetings = [(o, e.value.decode()) for o, e in kv if isinstance(e, ev.KvPut) and e.name == "tour/greeting"]
    assert [o for o, _ in greetings][-1] == at + 1, (greetings, at)
    assert [v for o, v in greetings if o <= at][-1] == value == "hello from run 1", greetings

    # The "try next" audit line answers the same from the table, on its own.
    assert "try next (docs/local-cluster.md explains each):" in out
    command = re.search(r"^  epochlog audit state --table (\S+) --group kv --offset (\d+)$", out, re.MULTILINE)
    assert command and int(command.group(2)) == at, out
    assert command.group(1) == "data/events", command.group(0)   # relative to the working directory
    table_path = cwd / command.group(1)
    again = subprocess.run(epochlog_argv("audit", "state", "--table", str(table_path), "--group", "kv",
                                         "--offset", str(at), "--prefix", "tour/", "--json"),
                           capture_output=True, text=True, timeout=300.0, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    answered = json.loads(again.stdout)
    print(answered)
    assert [(r["key"], r["value"], r["offset"]) for r in answered] == [("tour/greeting", value, greetings[0][0])]
