"""Every example of docs/kafka.md, run: the config fragment, the producer and consumer (against a real
3-node cluster's Kafka face, its addresses swapped in), the behaviour of an idempotent producer after
a refused record as the page states it; the Faust command is run by test_faust.py (`faust_command`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError

from epochlog.client import Client
from statemachines import events as ev
from tests.support.nodes import ROOT, NodeCluster

DOC = ROOT / "docs" / "kafka.md"
LOCAL = ROOT / "configs" / "local-3.toml"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def local_bootstrap() -> str:
    members = tomllib.loads(LOCAL.read_text())["cluster"]["members"]
    return ",".join(m["kafka_address"] for m in members)


def faust_command(bootstrap: list[str], data_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The Faust command of docs/kafka.md with this cluster's Kafka addresses and data directory: argv, env."""
    (line,) = [x for block in blocks("sh") for x in block.splitlines() if "examples.live_brokers" in x]
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
    argv = [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
    assert env["EPOCHLOG_KAFKA"] == local_bootstrap(), "the page's addresses are not configs/local-3.toml's"
    assert argv[0] == ".venv/bin/python3", argv   # the interpreter `make venv` installed into
    env.update(EPOCHLOG_KAFKA=",".join(bootstrap), EPOCHLOG_FAUST_DIR=str(data_dir))
    return [sys.executable, *argv[1:]], env


def test_the_config_fragment_is_a_member_entry_and_local_3_ships_kafka_addresses() -> None:
    (fragment,) = blocks("toml")
    (member,) = tomllib.loads(fragment)["cluster"]["members"]
    assert set(member) == {"id", "peer_address", "client_address", "kafka_address"}
    members = tomllib.loads(LOCAL.read_text())["cluster"]["members"]
    assert member["kafka_address"] == members[0]["kafka_address"]
    assert all(m.get("kafka_address") for m in members)


def test_the_producer_and_consumer_example_reads_what_it_wrote(kafka_cluster: NodeCluster) -> None:
    (example,) = blocks("python")
    assert f'BOOTSTRAP = "{local_bootstrap()}"' in example
    script = example.replace(local_bootstrap(), ",".join(kafka_cluster.bootstrap))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    offset = int(re.search(r"^appended at offset (\d+)$", done.stdout, re.M).group(1))  # type: ignore[union-attr]
    # The group consumer started from the log's start ("earliest") and got the record just appended.
    assert re.search(rf"^{offset} b'kv/app/x' KvPut\(.*value=b'1'", done.stdout, re.M), done.stdout[-3000:]


def test_an_idempotent_producer_fails_after_a_refused_record_and_a_new_one_does_not(
        kafka_cluster: NodeCluster) -> None:
    tag = uuid.uuid4().hex[:8]

    def put(n: int) -> bytes:
        return ev.encode_event(ev.KvPut(name=f"docs-{tag}/{n}", value=b"v"))

    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all")
    try:
        assert producer.send("__kv", value=put(0)).get(timeout=30).offset > 0
        with pytest.raises(KafkaError) as refused:
            producer.send("__kv", value=b"not an event").get(timeout=30)
        assert type(refused.value).__name__ == "InvalidRecordError" and "malformed event" in str(refused.value)
        for n in (1, 2):   # what the page says: every later send of this producer fails with that error
            with pytest.raises(KafkaError) as later:
                producer.send("__kv", value=put(n)).get(timeout=30)
            assert str(later.value) == str(refused.value), later.value
    finally:
        producer.close(timeout=10)
    fresh = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all")
    try:
        assert fresh.send("__kv", value=put(3)).get(timeout=30).offset > 0
    finally:
        fresh.close(timeout=10)
    with Client(kafka_cluster.endpoints) as client:
        assert [client.get(f"docs-{tag}/{n}") is not None for n in range(4)] == [True, False, False, True]
