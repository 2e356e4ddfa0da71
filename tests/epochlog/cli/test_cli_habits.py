"""The etcdctl habits of the `epochlog` command line, as real processes against a real cluster: leases
(hex and decimal ids round-trip), transactions from arguments and JSON, `status` with LAG and HEARD
and a non-zero exit when a member is down, and the default endpoints when no cluster is named.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from epochlog.up import to_toml
from eventlog.configuration import load_toml
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until
from tests.support.ports import free_ports

CLI_TIMEOUT_S = 60.0


def run(*args: str, cwd: Path = ROOT, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EPOCHLOG_ENDPOINTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, input=stdin, timeout=CLI_TIMEOUT_S)


@pytest.fixture(scope="module")
def cli(shared_cluster: NodeCluster) -> Any:
    """`cli(*args)`: a client command on the shared cluster with --json; its parsed output (exit 0 asserted)."""
    def call(*args: str, stdin: str | None = None) -> Any:
        result = run(*args, "--endpoints", ",".join(shared_cluster.endpoints), "--json", stdin=stdin)
        assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        return json.loads(result.stdout)
    return call


def test_a_lease_id_is_taken_as_printed_in_hex_bare_hex_or_decimal(cli: Any, shared_cluster: NodeCluster) -> None:
    endpoints = ",".join(shared_cluster.endpoints)
    human = run("lease", "grant", "60", "--endpoints", endpoints)
    assert human.returncode == 0, human.stderr
    words = human.stdout.split()
    assert words[0] == "lease" and words[1].startswith("0x") and "granted with TTL 60 s" in human.stdout, human.stdout
    lease_id = int(words[1], 16)
    for spelling, key in ((words[1], "habits/hex"), (words[1][2:], "habits/bare"), (str(lease_id), "habits/dec")):
        written = cli("put", key, "v", "--lease", spelling)
        got = cli("get", key)
        assert got["lease"] == lease_id and got["offset"] == written["offset"], (spelling, got)
    shown = run("get", "habits/hex", "--endpoints", endpoints)
    assert f"lease   {words[1]}" in shown.stdout, shown.stdout
    listed = cli("lease", "list")
    mine = next(d for d in listed if d["id"] == lease_id)
    assert (mine["id_hex"], mine["ttl_ms"], mine["offset"]) == (words[1], 60_000, int(words[-1].rstrip(")"))), listed
    assert cli("lease", "keep-alive", words[1], "--once") == {"id": lease_id, "id_hex": words[1], "ttl_ms": 60_000}
    bad = run("put", "habits/x", "v", "--lease", "0xnothex", "--endpoints", endpoints)
    assert bad.returncode == 64 and "not a lease id" in bad.stderr, bad
    revoked = cli("lease", "revoke", str(lease_id))
    assert revoked["offset"] > 0
    for key in ("habits/hex", "habits/bare", "habits/dec"):   # the keys went with the lease
        gone = run("get", key, "--endpoints", endpoints)
        assert gone.returncode == 3 and "no key" in gone.stderr, gone
    assert lease_id not in [d["id"] for d in cli("lease", "list")]
    ended = run("lease", "keep-alive", words[1], "--once", "--endpoints", endpoints)
    assert ended.returncode == 3 and ended.stderr.startswith("error: ") and "Traceback" not in ended.stderr, ended


def test_txn_from_arguments_and_json_applies_all_or_nothing(cli: Any, shared_cluster: NodeCluster) -> None:
    endpoints = ",".join(shared_cluster.endpoints)
    before = cli("put", "txn-cli/b", "old")
    done = cli("txn", "--if", "txn-cli/a=0", "--if", f"txn-cli/b={before['offset']}",
               "put", "txn-cli/a", "1", "del", "txn-cli/b")
    got = cli("get", "txn-cli/a")
    assert (got["value"], got["offset"]) == ("1", done["offset"])
    assert run("get", "txn-cli/b", "--endpoints", endpoints).returncode == 3
    # The same condition again fails: exit 3 naming it, and nothing of the transaction is applied.
    failed = run("txn", "--if", "txn-cli/a=0", "put", "txn-cli/a", "2", "put", "txn-cli/c", "3",
                 "--endpoints", endpoints)
    assert failed.returncode == 3 and "condition_failed" in failed.stderr and "kv/txn-cli/a" in failed.stderr, failed
    assert cli("get", "txn-cli/a")["value"] == "1"
    assert run("get", "txn-cli/c", "--endpoints", endpoints).returncode == 3
    lease = cli("lease", "grant", "60")
    document = {"conditions": [{"key": "txn-cli/a", "version": done["offset"]}],
                "ops": [{"op": "put", "key": "txn-cli/j", "value": "from json", "lease": lease["id_hex"]},
                        {"op": "del", "key": "txn-cli/a"}]}
    by_json = cli("txn", "--file", "-", stdin=json.dumps(document))
    got = cli("get", "txn-cli/j")
    assert (got["value"], got["lease"], got["offset"]) == ("from json", lease["id"], by_json["offset"])
    assert run("get", "txn-cli/a", "--endpoints", endpoints).returncode == 3
    for bad_args in (("put", "txn-cli/x"), ("merge", "txn-cli/x", "1"), ()):
        usage = run("txn", *bad_args, "--endpoints", endpoints)
        assert usage.returncode == 64, (bad_args, usage)
    not_json = run("txn", "--file", "-", "--endpoints", endpoints, stdin="{not json")
    assert not_json.returncode == 64 and "not a transaction document" in not_json.stderr, not_json


def test_no_cluster_named_uses_the_default_config_and_says_so(tmp_path: Path) -> None:
    """With neither --endpoints, --config nor EPOCHLOG_ENDPOINTS, the client addresses of
    configs/local-3.toml (of the working directory, as `epochlog up` takes it): here free ports, so the
    error names them and how to name another cluster."""
    document = load_toml(ROOT / "configs" / "local-3.toml")
    ports = free_ports(3, random.Random(time.time_ns()))
    for member, port in zip(document["cluster"]["members"], ports):
        member["client_address"] = f"127.0.0.1:{port}"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "local-3.toml").write_text(to_toml(document))
    result = run("get", "some/key", "--timeout", "1", cwd=tmp_path)
    assert result.returncode == 3, result
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "no cluster named: tried " + ", ".join(f"127.0.0.1:{p}" for p in ports) in result.stderr, result.stderr
    assert "--endpoints, --config or EPOCHLOG_ENDPOINTS" in result.stderr


def test_status_shows_lag_heard_and_processes_and_exits_1_with_a_member_down(
        cli: Any, shared_cluster: NodeCluster) -> None:
    written = cli("put", "status-habits/k", "v")
    healthy = wait_until(lambda: (lambda d: d if all(
        m["lag"] == 0 for g in d["groups"] for m in g["members"]) else None)(cli("status")), 30.0,
        "every member to apply what is committed")
    kv = next(g for g in healthy["groups"] if g["group"] == "kv")
    assert kv["commit_offset"] >= written["offset"]
    for m in kv["members"]:
        assert (m["heard_ms"] is None) == (m["id"] == kv["leader"]), m   # the leader hears from the others
        assert m["heard_ms"] is None or 0 <= m["heard_ms"] < 5000, m
    pids = {n["id"]: n["pid"] for n in healthy["nodes"]}
    assert pids == {i: shared_cluster.nodes[i].pid for i in (1, 2, 3)}, pids
    assert len({n["instance"] for n in healthy["nodes"]}) == 3
    table = run("status", "--endpoints", ",".join(shared_cluster.endpoints))
    assert table.returncode == 0 and table.stdout.split()[:10] == [
        "GROUP", "LEADER", "TERM", "COMMIT", "NODE", "ROLE", "APPLIED", "MATCH", "LAG", "HEARD"], table.stdout

    down = next(i for i in (1, 2, 3) if i != shared_cluster.leader("kv"))
    killed_instance = next(n["instance"] for n in healthy["nodes"] if n["id"] == down)
    shared_cluster.kill9(down)
    try:
        up_ids = [i for i in (1, 2, 3) if i != down]
        endpoints = ",".join(shared_cluster.endpoint(i) for i in up_ids)

        def heard_long_ago() -> subprocess.CompletedProcess[str] | None:
            result = run("status", "--endpoints", endpoints, "--json", "--timeout", "3")
            if result.returncode != 1:
                return None
            doc = json.loads(result.stdout)
            g = next(g for g in doc["groups"] if g["group"] == "kv")
            m = next(m for m in g["members"] if m["id"] == down)
            return result if m["role"] == "unreachable" and (m["heard_ms"] or 0) >= 1500 else None
        result = wait_until(heard_long_ago, 60.0, "status to exit 1 with the killed member heard >= 1.5 s ago")
        doc = json.loads(result.stdout)
        node = next(n for n in doc["nodes"] if n["id"] == down)
        assert not node["reachable"] and node["error"] and node["pid"] is None
        human = run("status", "--endpoints", endpoints, "--timeout", "3")
        assert human.returncode == 1 and "unreachable: " in human.stdout, human.stdout
    finally:
        shared_cluster.restart(down)
    back = wait_until(lambda: (lambda d: d if all(n["reachable"] for n in d["nodes"]) else None)(cli("status")),
                      60.0, "the restarted member to answer")
    assert next(n["instance"] for n in back["nodes"] if n["id"] == down) != killed_instance
