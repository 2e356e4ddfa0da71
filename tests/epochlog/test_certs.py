"""`epochlog certs` as docs/security.md shows it: every command of its example runs, and what it makes
is what a node accepts (and refuses).

The example's lines are taken from the doc itself, so the doc cannot drift from the commands.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from epochlog.certs import CertsError, ClusterCA, load_certificate
from eventlog.errors import ConfigError
from eventlog.raft.runtime.config import PeerTlsConfig
from eventlog.raft.runtime.tls import load_peer_tls, parse_identity
from tests.epochlog.local_cluster import ROOT, epochlog_argv

DOC = ROOT / "docs" / "security.md"


def doc_commands() -> list[list[str]]:
    """The `epochlog certs` lines of the doc's sh block, comments stripped."""
    block = re.search(r"```sh\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert block, "docs/security.md has no sh example"
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [shlex.split(line) for line in lines if line]


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(epochlog_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_the_documented_commands_make_what_a_node_accepts(tmp_path: Path) -> None:
    commands = doc_commands()
    assert [c[:3] for c in commands] == [["epochlog", "certs", "init"], ["epochlog", "certs", "member"],
                                         ["epochlog", "certs", "client"], ["epochlog", "certs", "show"]]
    outputs = []
    for command in commands:
        done = run(tmp_path, *command[1:])
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done.stdout)
    ca_dir, node_tls = tmp_path / "data" / "ca", tmp_path / "data" / "node-1" / "tls"
    for key in (ca_dir / "ca.key", node_tls / "node.key", tmp_path / "data" / "clients" / "alice.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
    assert node_tls.stat().st_mode & 0o777 == 0o700
    # The member's files are the default [cluster.tls] layout of data dir data/node-1: node 1 starts.
    assert load_peer_tls(PeerTlsConfig(), tmp_path / "data" / "node-1", "prod-meta", 1) is not None
    with pytest.raises(ConfigError, match="not this node"):
        load_peer_tls(PeerTlsConfig(), tmp_path / "data" / "node-1", "prod-meta", 2)
    assert "node 1 of cluster 'prod-meta'" in outputs[3]
    assert ClusterCA.load(ca_dir).cluster == "prod-meta"


def test_refusals_exit_3_or_64(tmp_path: Path) -> None:
    assert run(tmp_path, "certs", "init", "--dir", "ca", "--cluster", "c").returncode == 0
    again = run(tmp_path, "certs", "init", "--dir", "ca", "--cluster", "c")
    assert again.returncode == 3 and "already holds a CA" in again.stderr
    missing = run(tmp_path, "certs", "member", "--dir", "nowhere", "--node-id", "1")
    assert missing.returncode == 3 and "nowhere/ca.crt: no such file" in missing.stderr
    nameless = run(tmp_path, "certs", "init", "--dir", "ca2")
    assert nameless.returncode == 64 and "--cluster NAME or --config FILE" in nameless.stderr
    zero = run(tmp_path, "certs", "member", "--dir", "ca", "--node-id", "0")
    assert zero.returncode == 64


def test_identities_round_trip_through_their_uri() -> None:
    ca_name = "a cluster/with:odd%chars"
    ident = parse_identity(f"epochlog://{ca_name.replace('%', '%25').replace('/', '%2F').replace(' ', '%20')}"
                           "/node/7")
    assert ident is not None and (ident.cluster, ident.node_id) == (ca_name, 7)
    assert parse_identity(ident.uri) == ident
    for bad in ("https://c/node/1", "epochlog://c/node", "epochlog://c/broker/1", "epochlog:///node/1"):
        assert parse_identity(bad) is None, bad
    assert parse_identity("epochlog://c/node/01").node_id is None   # type: ignore[union-attr]
    assert parse_identity("epochlog://c/client/alice").node_id is None   # type: ignore[union-attr]


def test_a_ca_refuses_to_replace_itself_and_loads_only_with_its_key(tmp_path: Path) -> None:
    ca = ClusterCA.create(tmp_path / "ca", "c")
    with pytest.raises(CertsError, match="already holds a CA"):
        ClusterCA.create(tmp_path / "ca", "c")
    other = ClusterCA.create(tmp_path / "other", "c")
    (tmp_path / "ca" / "ca.key").write_bytes((tmp_path / "other" / "ca.key").read_bytes())
    with pytest.raises(CertsError, match="is not the key of"):
        ClusterCA.load(tmp_path / "ca")
    files = other.issue_member(3, tmp_path / "n3")
    assert other.issued(load_certificate(files.cert)) and not ca.issued(load_certificate(files.cert))
    assert other.member_is_current(3, files) and not other.member_is_current(4, files)
    assert not ca.member_is_current(3, files)
