"""The `epochlog` client commands as real processes (`python -m epochlog ...`) against a real cluster.

The cluster is named with --endpoints, --config and EPOCHLOG_ENDPOINTS; the JSON field names
checked here are the ones docs/cli.md documents.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from epochlog.client import Client
from statemachines.events import KvPut
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import wait_until

CLI_TIMEOUT_S = 30.0


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True, cwd=ROOT,
                          env=_env(**(env or {})), input=stdin, timeout=CLI_TIMEOUT_S)


class Streaming:
    """A streaming command (`watch`, `events tail --follow`) as a process whose stdout lines are read on a
    thread, so every wait has a timeout; killed by pid if the test leaves it running."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "epochlog", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=_env())
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def json_line(self, timeout: float = CLI_TIMEOUT_S) -> Any:
        line = self.lines.get(timeout=timeout)
        assert line is not None, f"the command ended early: {self.proc.wait(5)} {self.stderr()}"
        return json.loads(line)

    def rest(self, timeout: float = CLI_TIMEOUT_S) -> list[Any]:
        """Wait for the process to exit; the JSON lines not read yet."""
        self.proc.wait(timeout)
        self.thread.join(timeout)
        out = []
        while (line := self.lines.get_nowait()) is not None:
            out.append(json.loads(line))
        return out

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""

    def __enter__(self) -> Streaming:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "EPOCHLOG_ENDPOINTS"}, **extra}


@pytest.fixture(scope="module")
def cli(shared_cluster: NodeCluster) -> Any:
    """`cli(*args)`: run a client command with `--endpoints` and `--json`; its parsed output (exit 0 asserted)."""
    def call(*args: str, lines: bool = False) -> Any:
        result = run(*args, "--endpoints", ",".join(shared_cluster.endpoints), "--json")
        assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        if lines:
            return [json.loads(line) for line in result.stdout.splitlines()]
        return json.loads(result.stdout)
    return call


def test_put_get_ls_del_history(cli: Any, shared_cluster: NodeCluster) -> None:
    first = cli("put", "cli/a", "hello")
    assert set(first) == {"offset", "group"} and first["group"] == "kv"
    second = cli("put", "cli/b", "AAEC/w==", "--base64")
    assert second["offset"] > first["offset"]
    assert cli("get", "cli/a") == {"key": "cli/a", "value": "hello", "encoding": "utf-8", "offset": first["offset"],
                                   "created": first["offset"], "lease": 0}
    binary = cli("get", "cli/b", "--consistency", "local", "--min-offset", str(second["offset"]))
    assert (binary["value"], binary["encoding"]) == ("AAEC/w==", "base64")
    updated = cli("put", "cli/a", "hello again")
    listed = cli("ls", "cli/")
    assert [(i["key"], i["offset"]) for i in listed] == [("cli/a", updated["offset"]), ("cli/b", second["offset"])]
    assert [i["key"] for i in cli("ls", "cli/", "--limit", "1")] == ["cli/a"]
    assert [i["value"] for i in cli("ls", "cli/", "--as-of", str(first["offset"]))] == ["hello"]
    assert cli("get", "cli/a", "--as-of", str(first["offset"]))["value"] == "hello"
    deleted = cli("del", "cli/a")
    assert deleted["offset"] > updated["offset"]
    history = cli("history", "cli/a")
    assert [(h["offset"], h["event"], h["value"], h["deleted"]) for h in history] == [
        (first["offset"], "KvPut", "hello", False), (updated["offset"], "KvPut", "hello again", False),
        (deleted["offset"], "KvDeleted", None, True)]
    missing = run("get", "cli/a", "--endpoints", shared_cluster.endpoints[0])
    assert missing.returncode == 3 and missing.stderr.startswith("error: ") and "cli/a" in missing.stderr


def test_ls_follows_pages(cli: Any, shared_cluster: NodeCluster) -> None:
    """ls walks every page (1000 keys a page): seeded with the SDK in one call, 1005 CLI runs would be slow."""
    names = [f"pages/{i:04d}" for i in range(1005)]
    with Client(shared_cluster.endpoints) as c:
        results = c.commands([KvPut(name=n, value=b"x") for n in names])
    assert all(r.ok for r in results)
    listed = cli("ls", "pages/")
    assert [i["key"] for i in listed] == names
    assert [i["offset"] for i in listed] == [r.offset for r in results]
    assert [i["key"] for i in cli("ls", "pages/", "--limit", "1002")] == names[:1002]


def test_rejected_cas_exits_3_with_the_reason(cli: Any, shared_cluster: NodeCluster) -> None:
    created = cli("put", "cas-cli/k", "1", "--expected-version", "0")
    endpoints = ",".join(shared_cluster.endpoints)
    stale = run("put", "cas-cli/k", "2", "--expected-version", str(created["offset"] + 1000), "--endpoints", endpoints)
    assert stale.returncode == 3, stale
    assert stale.stderr.startswith("error: version_mismatch"), stale.stderr
    assert stale.stdout == ""
    stale_del = run("del", "cas-cli/k", "--expected-version", "1", "--endpoints", endpoints)
    assert stale_del.returncode == 3 and "version_mismatch" in stale_del.stderr
    assert cli("get", "cas-cli/k")["offset"] == created["offset"]
    assert cli("put", "cas-cli/k", "2", "--expected-version", str(created["offset"]))["offset"] > created["offset"]


def test_the_cluster_is_named_by_config_or_environment_and_missing_is_a_usage_error(
        cli: Any, shared_cluster: NodeCluster) -> None:
    written = run("put", "named/k", "v", "--config", str(shared_cluster.config_path), "--json")
    assert written.returncode == 0, written.stderr
    offset = json.loads(written.stdout)["offset"]
    by_env = run("get", "named/k", "--json", env={"EPOCHLOG_ENDPOINTS": shared_cluster.endpoints[-1]})
    assert by_env.returncode == 0, by_env.stderr
    assert json.loads(by_env.stdout)["offset"] == offset
    human = run("get", "named/k", env={"EPOCHLOG_ENDPOINTS": ",".join(shared_cluster.endpoints)})
    assert human.returncode == 0 and human.stdout.split("\n")[1].split() == ["value", "v"], human.stdout
    # No cluster named at all takes `epochlog up`'s default config (tests/node/test_cli_habits.py); an
    # empty EPOCHLOG_ENDPOINTS names none, a usage error.
    missing = run("get", "named/k", env={"EPOCHLOG_ENDPOINTS": ""})
    assert missing.returncode == 64 and "no cluster given" in missing.stderr, missing
    both = run("get", "named/k", "--config", str(shared_cluster.config_path), "--endpoints", "127.0.0.1:1")
    assert both.returncode == 64 and "not both" in both.stderr
    bad = run("get", "named/k", "--endpoints", "nowhere")
    assert bad.returncode == 64 and "host:port" in bad.stderr


def test_watch_count_streams_from_an_offset_then_live(cli: Any, shared_cluster: NodeCluster) -> None:
    first = cli("put", "watched/a", "1")
    with Streaming("watch", "watched/", "--from", str(first["offset"]), "--count", "3", "--json",
                   "--endpoints", shared_cluster.endpoints[0]) as watch:
        replayed = watch.json_line()           # the watch is running
        cli("put", "unwatched/x", "no")
        second = cli("put", "watched/b", "2")
        third = cli("del", "watched/a")
        events = [replayed, *watch.rest()]
        assert watch.proc.returncode == 0, watch.stderr()
    assert [(e["offset"], e["key"], e["event"], e["value"]) for e in events] == [
        (first["offset"], "watched/a", "KvPut", "1"), (second["offset"], "watched/b", "KvPut", "2"),
        (third["offset"], "watched/a", "KvDeleted", None)]
    assert all(e["timestamp"] > 0 for e in events)
    with Streaming("watch", "watched/", "--from", str(first["offset"]), "--json",
                   "--endpoints", shared_cluster.endpoints[1]) as endless:
        assert endless.json_line()["offset"] == first["offset"]
        endless.proc.send_signal(signal.SIGINT)      # Ctrl-C ends a watch cleanly, exit 0
        endless.rest()
        assert endless.proc.returncode == 0, endless.stderr()


def test_status_json_reports_every_member_from_its_own_status(cli: Any, shared_cluster: NodeCluster) -> None:
    written = cli("put", "status/k", "v")
    status = cli("status")
    assert [n["id"] for n in status["nodes"]] == [1, 2, 3] and all(n["reachable"] for n in status["nodes"])
    groups = {g["group"]: g for g in status["groups"]}
    assert set(groups) == {"metadata", "offsets", "kv"}
    for g in groups.values():
        assert set(g) == {"group", "leader", "term", "commit_offset", "members"}
        assert sorted(m["id"] for m in g["members"]) == [1, 2, 3]
        roles = {m["id"]: m["role"] for m in g["members"]}
        assert roles[g["leader"]] == "leader" and sorted(roles.values()) == ["follower", "follower", "leader"]
        for m in g["members"]:
            assert {"id", "role", "applied_offset", "match_offset"} <= set(m)
            assert m["applied_offset"] <= g["commit_offset"] or m["role"] != "leader"
    kv = groups["kv"]
    assert kv["commit_offset"] >= written["offset"]
    assert shared_cluster.leader("kv") == kv["leader"]
    leader = next(m for m in kv["members"] if m["id"] == kv["leader"])
    assert leader["applied_offset"] >= written["offset"]
    assert all(m["match_offset"] is not None for m in kv["members"])
    table = run("status", "--config", str(shared_cluster.config_path))
    assert table.returncode == 0 and table.stdout.split()[:4] == ["GROUP", "LEADER", "TERM", "COMMIT"]


def test_events_tail_reads_the_log_and_follows(cli: Any, shared_cluster: NodeCluster) -> None:
    a = cli("put", "tail/a", "1")
    b = cli("put", "tail/b", "2")
    events = cli("events", "tail", "--group", "kv", "--from", str(a["offset"]), lines=True)
    assert [(e["offset"], e["key"], e["type"]) for e in events] == [(a["offset"], "kv/tail/a", "KvPut"),
                                                                   (b["offset"], "kv/tail/b", "KvPut")]
    assert events[0]["group"] == "kv" and events[0]["event"]["name"] == "tail/a"
    assert events[0]["event"]["value"] == "MQ=="   # bytes in an event are base64 in JSON
    assert len(cli("events", "tail", "--max-events", "1", lines=True)) == 1
    with Streaming("events", "tail", "--from", str(b["offset"]), "--follow", "--json",
                   "--endpoints", ",".join(shared_cluster.endpoints)) as tail:
        assert tail.json_line()["offset"] == b["offset"]
        c = cli("put", "tail/c", "3")
        assert tail.json_line()["offset"] == c["offset"]     # followed, live
        tail.proc.send_signal(signal.SIGINT)                 # Ctrl-C ends it cleanly
        assert tail.rest() == []
        assert tail.proc.returncode == 0, tail.stderr()


def test_snapshot_is_reported_and_reads_go_on(cli: Any, shared_cluster: NodeCluster) -> None:
    written = cli("put", "snap/k", "v")
    snap = cli("snapshot", "--group", "kv")
    assert snap["group"] == "kv" and snap["offset"] >= written["offset"]
    kv = next(g for g in cli("status")["groups"] if g["group"] == "kv")
    leader = next(m for m in kv["members"] if m["id"] == kv["leader"])
    assert leader["snapshot_offset"] == snap["offset"] and leader["log_start"] <= snap["offset"] + 1
    later = cli("put", "snap/k", "w")
    assert [e["offset"] for e in cli("events", "tail", "--group", "kv", "--last", "5", lines=True)][-1] == later["offset"]
    assert cli("get", "snap/k")["value"] == "w"
    assert cli("get", "snap/k", "--as-of", str(written["offset"]))["value"] == "v"
    on_node = cli("snapshot", "--group", "metadata", "--node", "2")
    assert on_node["group"] == "metadata" and on_node["offset"] >= -1


def test_leader_transfer_moves_leadership(cli: Any, shared_cluster: NodeCluster) -> None:
    before = shared_cluster.leader("offsets")
    moved = cli("leader", "transfer", "--group", "offsets")
    assert moved["group"] == "offsets" and moved["previous_leader"] == before and moved["leader"] != before
    target = next(i for i in (1, 2, 3) if i != moved["leader"])
    again = cli("leader", "transfer", "--group", "offsets", "--to", str(target))
    assert again["leader"] == target and again["term"] > moved["term"]
    wait_until(lambda: shared_cluster.leader("offsets") == target, 10, "node status to agree")
    stay = cli("leader", "transfer", "--group", "offsets", "--to", str(target))   # already there: a no-op
    assert (stay["leader"], stay["term"]) == (target, again["term"])


def test_member_list_and_usage_errors(cli: Any, shared_cluster: NodeCluster) -> None:
    members = cli("member", "list")
    assert [(m["id"], m["role"]) for m in members["members"]] == [(1, "voter"), (2, "voter"), (3, "voter")]
    assert members["voters"] == [1, 2, 3] and members["learners"] == []
    assert [m["client_address"] for m in members["members"]] == shared_cluster.endpoints
    bad = run("member", "add", "0", "127.0.0.1:1", "--endpoints", shared_cluster.endpoints[0])
    assert bad.returncode == 64
    unknown = run("get", "--no-such-option")
    assert unknown.returncode == 64


def test_unreachable_cluster_is_an_error_not_a_traceback() -> None:
    started = time.monotonic()
    result = run("get", "k", "--endpoints", "127.0.0.1:1", "--timeout", "1")
    assert result.returncode == 3 and result.stderr.startswith("error: "), result
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 15
