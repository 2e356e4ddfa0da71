"""The shipped configs: every key documented, every file loads, a wrong key stops `epochlog serve`.

configs/production.example.toml must show every key of every config dataclass ([cluster] and its
members, [raft], [log], [views], [controller], [clients], [kafka], [compaction.cleaner]) with a comment giving
its meaning and `Default: <value>`; the test derives the list of keys from the dataclasses, so a new
key without documentation fails here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import tomllib
from typing import Any

import pytest

from compaction.config import CleanerConfig, CompactionConfig, compaction_configs
from controller.config import ControllerConfig, controller_config
from epochlog.client import Client, ClientError
from epochlog.client.tls import ClientTls
from epochlog.access_control import AccessConfig
from epochlog.face_tls import ClientTlsConfig
from epochlog.server import ClientServiceConfig
from eventlog.config import LogConfig
from eventlog.configuration import from_mapping, load_toml
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.config import (
    ClusterConfig,
    MemberConfig,
    PeerLimitsConfig,
    PeerTlsConfig,
    load_node_configs,
)
from epochlog.kafka.config import KafkaServiceConfig
from statemachines.store import ViewsConfig
from tests.epochlog.local_cluster import ROOT, cluster_document, epochlog_argv, scheme_bases, write_config
from tests.support.tls import provision
from tests.support.wait import wait_until

CONFIGS = ROOT / "configs"
PRODUCTION = CONFIGS / "production.example.toml"
SHIPPED = ("single.toml", "local-3.toml", "production.example.toml")
SECTIONS: dict[str, Any] = {"cluster": ClusterConfig, "cluster.members": MemberConfig,
                            "cluster.tls": PeerTlsConfig, "cluster.peer_limits": PeerLimitsConfig, "raft": RaftConfig,
                            "log": LogConfig, "views": ViewsConfig, "controller": ControllerConfig,
                            "clients": ClientServiceConfig, "clients.tls": ClientTlsConfig,
                            "clients.access": AccessConfig,
                            "kafka": KafkaServiceConfig,
                            "compaction": CompactionConfig,
                            "compaction.cleaner": CleanerConfig}
KEY_LINE = re.compile(r"^(?:# )?([a-z_]+) = ")


@pytest.fixture
def rng() -> random.Random:
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    return random.Random(seed)


def documented_keys(text: str) -> dict[tuple[str, str], str]:
    """(section, key) -> the comment block just above the key's line (first occurrence; a key may be
    commented out, `# key = value`, when the example leaves it unset). A sub-table, `[[cluster.members]]`
    or `[cluster.tls]`, counts as the key `members` (`tls`) of [cluster]."""
    found: dict[tuple[str, str], str] = {}
    section, comments = "", []
    for line in text.splitlines():
        header = re.match(r"^\[\[?([a-z_.]+)\]\]?$", line)
        if header:
            section = header.group(1)
            parent, _, key = section.rpartition(".")
            if parent:
                found.setdefault((parent, key), "\n".join(comments))
            comments = []
            continue
        key = KEY_LINE.match(line)
        if key and section:
            found.setdefault((section, key.group(1)), "\n".join(comments))
            comments = []
        elif line.startswith("#"):
            comments.append(line)
        else:
            comments = []
    return found


def toml_literal(value: Any) -> str:
    if value is None:   # a key whose default another key decides (the example shows it commented out)
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return str(value)


def test_production_example_documents_every_key_with_its_default():
    found = documented_keys(PRODUCTION.read_text())
    missing, undocumented, wrong_default = [], [], []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            comment = found.get((section, f.name))
            if comment is None:
                missing.append(f"{section}.{f.name}")
                continue
            if not f.metadata.get("doc") or "Default:" not in comment:
                undocumented.append(f"{section}.{f.name}")
                continue
            if section != "cluster.members" and f.name != "members" and f.default is not dataclasses.MISSING:
                expected = f"Default: {toml_literal(f.default)}"
                if expected not in comment:
                    wrong_default.append(f"{section}.{f.name} (expected {expected!r})")
    assert not missing, f"production.example.toml does not show: {missing}"
    assert not undocumented, f"keys without a comment giving their meaning and default: {undocumented}"
    assert not wrong_default, f"comments giving another default than the dataclass: {wrong_default}"


def test_production_example_uses_the_defaults_it_does_not_explain():
    assert set(tomllib.loads(PRODUCTION.read_text())) == {"cluster", "raft", "log", "views", "controller",
                                                          "clients", "kafka", "compaction"}
    configs = load_node_configs(PRODUCTION)
    assert configs.raft == RaftConfig() and configs.log == LogConfig()
    assert configs.cluster.tls == PeerTlsConfig() and configs.cluster.peer_limits == PeerLimitsConfig()
    assert compaction_configs(configs.compaction) == (CompactionConfig(), CleanerConfig())
    cluster = configs.cluster
    assert (cluster.snapshot_every_entries, cluster.snapshot_every_bytes) == (
        ClusterConfig().snapshot_every_entries, ClusterConfig().snapshot_every_bytes)
    assert controller_config(configs.controller) == ControllerConfig()
    assert from_mapping(ViewsConfig, configs.views, "views") == ViewsConfig()
    assert from_mapping(ClientServiceConfig, configs.clients, "clients") == ClientServiceConfig()
    assert from_mapping(KafkaServiceConfig, configs.kafka, "kafka") == KafkaServiceConfig()
    assert [m.id for m in configs.cluster.members] == [1, 2, 3]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load(name):
    configs = load_node_configs(CONFIGS / name)
    from_mapping(ViewsConfig, configs.views, "views")
    assert {"metadata", "offsets", "kv"} <= set(configs.cluster.groups), "epochlog serve needs these groups"
    for m in configs.cluster.members:
        assert m.client_address and m.admin_address, f"{name}: member {m.id} lacks a client or admin address"


def test_single_toml_serves_one_node(tmp_path, rng):
    """configs/single.toml as is, but on free ports: the node elects itself and answers a put and a get."""
    document = load_toml(CONFIGS / "single.toml")
    bases = scheme_bases(1, rng)
    for kind, base in bases.items():
        document["cluster"]["members"][0][kind] = f"127.0.0.1:{base + 1}"
    document["log"]["segment_bytes"] = 1 << 20   # the shipped 64 MiB would preallocate 0.4 GB here
    config = write_config(tmp_path / "single.toml", document)
    ca = provision(tmp_path / "ca", "single", {1: tmp_path / "node-1"})   # peer TLS: the default layout
    admin = ca.issue_client("admin", tmp_path / "client")   # its one super user (client TLS and access are on)
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                                              "--data-dir", str(tmp_path / "node-1")),
                                stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"serve exited with {proc.returncode}:\n{out.read_text()}"
            return b"READY 1 " in out.read_bytes()
        wait_until(ready, 60, f"READY from serve (output in {out})")
        address = f"127.0.0.1:{bases['client_address'] + 1}"
        with Client(address, timeout=20.0, tls=ClientTls(str(admin.ca), str(admin.cert), str(admin.key))) as client:
            written = client.put("single/x", b"1")
            got = client.get("single/x")
            assert got is not None and got.value == b"1" and got.version == written.offset
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# One wrong key or value per section: (section path, key, value, fragment of the message).
BAD = [
    (("cluster",), "tick_interval_ms", 0, "cluster.tick_interval_ms = 0: must be >= 1"),
    (("cluster",), "nmae", "x", "cluster.nmae = 'x': unknown key"),
    (("cluster", "members", 0), "peer_address", "nowhere", "cluster.members[0].peer_address = 'nowhere': "
                                                            "must be host:port"),
    (("cluster", "tls"), "insecure", "yes", "cluster.tls.insecure = 'yes': must be true or false"),
    (("cluster", "tls"), "ca_path", "x", "cluster.tls.ca_path = 'x': unknown key"),
    (("cluster", "peer_limits"), "hello_timeout_ms", 5, "cluster.peer_limits.hello_timeout_ms = 5: must be >= 100"),
    (("cluster", "peer_limits"), "partial_frames_bytes", 2 << 20,
     "cluster.peer_limits.partial_frames_bytes = 2097152: must hold the largest frame"),
    (("raft",), "election_timeout_ticks", 1, "raft.election_timeout_ticks = 1: must be >= 2"),
    (("raft",), "heartbeat_interval_ticks", 10, "raft.heartbeat_interval_ticks = 10: must be below"),
    (("log",), "flush_policy", "sometimes", "log.flush_policy = 'sometimes': must be one of"),
    (("views",), "block_cache_byte", 1, "views.block_cache_byte = 1: unknown key"),
    (("views",), "write_buffer_bytes", "big", "views.write_buffer_bytes = 'big': must be an integer"),
    (("controller",), "heartbeat_timeout_ms", 500, "controller.heartbeat_timeout_ms = 500: must be above"),
    (("clients",), "frame_timeout_ms", 10, "clients.frame_timeout_ms = 10: must be >= 100"),
    (("kafka",), "partial_frames_bytes", 1 << 20, "kafka.partial_frames_bytes = 1048576: must be >= 104857604"),
    (("compaction",), "retain_offsets", -1, "compaction.retain_offsets = -1: must be >= 0"),
    (("compaction", "cleaner"), "worker_nice", 40, "compaction.cleaner.worker_nice = 40: must be"),
    (("compaction",), "compact_groups", ["kv", "kv-9"], "compaction.compact_groups = ['kv', 'kv-9']: names kv-9, "
                                                        "not a group of [cluster] groups"),
    (("compaction",), "compact_groups", ["kv", "kv"], "compaction.compact_groups = ['kv', 'kv']: lists a group twice"),
    ((), "raft2", {}, "config raft2 = {}: unknown section"),
]


def test_a_wrong_key_or_value_stops_serve_with_exit_3_naming_it(tmp_path, rng):
    base = cluster_document(1, rng)
    base["cluster"]["tls"] = {}
    base["cluster"]["peer_limits"] = {}
    base["raft"] = {}
    base["controller"] = {}
    base["clients"] = {"tls": {"enabled": False}}   # no certificates: what is checked is the config
    base["kafka"] = {}
    base["compaction"] = {"cleaner": {}}
    procs = []
    for i, (path, key, value, fragment) in enumerate(BAD):
        document = json.loads(json.dumps(base))
        table = document
        for part in path:
            table = table[part]
        table[key] = value
        config = write_config(tmp_path / f"bad-{i}.toml", document)
        assert tomllib.loads(config.read_text())   # the file is valid TOML: the config is what is wrong
        procs.append((fragment, subprocess.Popen(
            epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                          "--data-dir", str(tmp_path / f"n{i}")),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))))
    failures = []
    try:
        for fragment, proc in procs:
            out, err = proc.communicate(timeout=90)
            if proc.returncode != 3 or fragment not in err:
                failures.append(f"{fragment!r}: exit {proc.returncode}\nstdout: {out}\nstderr: {err}")
            elif "READY" in out:
                failures.append(f"{fragment!r}: the node started before refusing")
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not failures, "\n\n".join(failures)



def test_a_node_without_its_tls_files_refuses_to_start_with_one_line_and_exit_3(tmp_path, rng):
    document = cluster_document(1, rng, name="tls-test")
    document["clients"]["tls"] = {"enabled": False}   # the peer port's files alone (the faces': test below)
    config = write_config(tmp_path / "node.toml", document)
    done = subprocess.run(epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                                        "--data-dir", str(tmp_path / "n1")),
                          capture_output=True, text=True, timeout=90, cwd=ROOT, check=False)
    assert done.returncode == 3, done
    assert "READY" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config cluster.tls.ca_file = ") and \
        "n1/tls/ca.crt" in lines[0] and "file not found" in lines[0], done.stderr
    # Another node's certificate is refused the same way: the node would speak as node 2.
    provision(tmp_path / "ca", "tls-test", {2: tmp_path / "n1"})
    done = subprocess.run(epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                                        "--data-dir", str(tmp_path / "n1")),
                          capture_output=True, text=True, timeout=90, cwd=ROOT, check=False)
    assert done.returncode == 3 and "not this node (epochlog://tls-test/node/1)" in done.stderr, done


@pytest.mark.parametrize("peers", ["default", "insecure"])
def test_a_node_whose_config_says_nothing_of_its_clients_refuses_to_start_without_certificates(tmp_path, rng, peers):
    """Client TLS and enforcement are the default: without certificates, one line naming both ways out."""
    document = cluster_document(1, rng, name="faces-test")
    del document["clients"]   # not a word about the client faces
    if peers == "insecure":
        document["cluster"]["tls"] = {"insecure": True}
    config = write_config(tmp_path / "node.toml", document)
    done = subprocess.run(epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                                        "--data-dir", str(tmp_path / "n1")),
                          capture_output=True, text=True, timeout=90, cwd=ROOT, check=False)
    assert done.returncode == 3 and "READY" not in done.stdout, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == (f"error: config clients.tls.cert_file = '{tmp_path / 'n1' / 'tls' / 'node.crt'}': file not "
                        "found: make the certificates (`epochlog certs init`, then `epochlog certs member`; `epochlog "
                        "up` makes them), or set [clients.tls] enabled = false for plaintext client faces"), lines


def test_a_node_whose_config_says_nothing_of_its_clients_serves_them_secured_once_it_has_certificates(tmp_path, rng):
    """The same node given its member certificate: it starts, refuses a plaintext client, and warns that no
    super user is named (a config from before the secure default would otherwise fail in silence)."""
    document = cluster_document(1, rng, name="faces-test")
    del document["clients"]
    config = write_config(tmp_path / "node.toml", document)
    provision(tmp_path / "ca", "faces-test", {1: tmp_path / "n1"})
    err, out = tmp_path / "serve.err", tmp_path / "serve.out"
    with err.open("wb") as sink, out.open("wb") as stdout:
        proc = subprocess.Popen(epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                                              "--data-dir", str(tmp_path / "n1")),
                                stdout=stdout, stderr=sink, cwd=ROOT)
    try:
        def ready() -> bool:
            assert proc.poll() is None, err.read_text()
            return "READY 1 " in out.read_text()
        wait_until(ready, 60, f"READY from serve (stderr in {err})")
        line = next(x for x in err.read_text().splitlines() if "super_users is empty" in x)
        assert " WARNING " in line, line
        with Client(document["cluster"]["members"][0]["client_address"], timeout=2.0,
                    tls=None, token="") as plain:
            assert plain.aio.tls is None
            with pytest.raises(ClientError):
                plain.status()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_insecure_peers_are_a_warning_at_start(tmp_path, rng):
    document = cluster_document(1, rng, name="insecure-test")
    document["cluster"]["tls"] = {"insecure": True}
    document["clients"]["tls"] = {"enabled": False}   # no certificates at all: plaintext faces, said explicitly
    config = write_config(tmp_path / "node.toml", document)
    err, out = tmp_path / "serve.err", tmp_path / "serve.out"
    with err.open("wb") as sink, out.open("wb") as stdout:
        proc = subprocess.Popen(epochlog_argv("serve", "--config", str(config), "--node-id", "1",
                                              "--data-dir", str(tmp_path / "n1")),
                                stdout=stdout, stderr=sink, cwd=ROOT)
    try:
        def ready() -> bool:   # READY: signal handlers installed
            assert proc.poll() is None, err.read_text()
            return "READY 1 " in out.read_text()
        wait_until(ready, 60, f"READY from serve (stderr in {err})")
        line = next(x for x in err.read_text().splitlines() if "peer TLS is OFF" in x)
        assert " WARNING " in line and "insecure = true" in line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
