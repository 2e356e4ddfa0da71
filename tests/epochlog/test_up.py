"""`epochlog up` as a user runs it: real node processes, a status per group, resume from disk, clean stops.

The process tests run `python -m epochlog up` on a config with free ports (stdout is a pipe, so `up`
prints plain status lines), and check the pids `up` recorded in <data-dir>/up.json afterwards: no
node may outlive it. Teardown kills whatever a failed test left (by recorded pid, /proc-checked).
The rest checks the pieces without processes: the status view's arithmetic, `--nodes` config
generation and its refusals.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.configuration import load_toml
from eventlog.errors import EpochlogError
from epochlog.api import messages as p
from epochlog.certs import CertsError, ClusterCA
from epochlog.up import LOG_TAIL_LINES, ClusterView, UpError, ensure_certificates, make_plan
from tests.epochlog.local_cluster import (ROOT, cluster_document, epochlog_argv, kill_leftovers,
                                          live_node_pids, recorded_nodes, run_epochlog, write_config)
from tests.support.wait import wait_until

GROUPS = {"metadata", "offsets", "kv"}
UP_TIMEOUT_S = 120.0


@pytest.fixture
def rng() -> random.Random:
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    return random.Random(seed)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    left = kill_leftovers(path)
    assert not left, f"node processes outlived `epochlog up`: {left}"


def leaders(output: str) -> dict[str, int]:
    """group -> leader, from the final summary's `group X: leader N` lines."""
    return {g: int(n) for g, n in re.findall(r"^  group (\w+): leader (\d+),", output, re.MULTILINE)}


def assert_all_stopped(data_dir: Path, codes: dict[int, int] | None = None) -> None:
    nodes = recorded_nodes(data_dir)
    assert nodes, "up.json records no node"
    assert not live_node_pids(data_dir), "a node process is still running"
    expected = codes or {}
    for node_id, node in nodes.items():
        assert not node["running"]
        assert node["exit_code"] == expected.get(node_id, 0), (node_id, node)


def test_bounded_run_shows_leaders_then_a_second_run_resumes_from_disk(tmp_path, rng, data_dir):
    config = write_config(tmp_path / "cluster.toml", cluster_document(3, rng))
    first = run_epochlog("up", "--config", str(config), "--data-dir", str(data_dir), "--seconds", "3",
                         "--demo-load", timeout=UP_TIMEOUT_S)
    out = first.stdout
    assert first.returncode == 0, out + first.stderr
    assert set(leaders(out)) == GROUPS, out
    assert re.search(r"^\[ *[\d.]+s\] nodes 3/3 up \| metadata: leader \d", out, re.MULTILINE), out
    puts = re.search(r"demo load, run 1: (\d+) puts", out)
    assert puts and int(puts.group(1)) > 0, out
    puts1 = int(puts.group(1))
    assert f"saw {puts1} of {puts1} puts; last key read back: ok; keys from earlier runs: 0" in out, out
    assert re.search(r"group kv: leader \d, term \d+, commit (\d+)", out)
    assert out.count("stopped, exit code 0") == 3 and "stopped cleanly" in out, out
    assert_all_stopped(data_dir)
    pids1 = {n["pid"] for n in recorded_nodes(data_dir).values()}
    # Secure by default: up made the CA and every member's certificate; the nodes spoke mutual TLS.
    assert f"peer TLS: made the cluster CA in {data_dir / 'ca'}" in out, out
    for i in (1, 2, 3):
        assert (data_dir / f"node-{i}" / "tls" / "node.key").stat().st_mode & 0o777 == 0o600
        assert "peer TLS is OFF" not in (data_dir / f"node-{i}.log").read_text()
    assert (data_dir / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600

    second = run_epochlog("up", "--config", str(config), "--data-dir", str(data_dir), "--once", "--demo-load",
                          timeout=UP_TIMEOUT_S)
    out2 = second.stdout
    assert second.returncode == 0, out2 + second.stderr
    assert set(leaders(out2)) == GROUPS, out2
    # The second run numbered itself from the first run's counter and found every key it wrote.
    assert f"demo load, run 2: {puts1} keys from earlier runs found" in out2, (out, out2)
    assert "peer TLS: made" not in out2, "the second run must keep the certificates of the first"
    commit = re.search(r"group kv: leader \d, term \d+, commit (\d+)", out2)
    assert commit and int(commit.group(1)) > puts1, out2
    assert_all_stopped(data_dir)
    assert not pids1 & {n["pid"] for n in recorded_nodes(data_dir).values()}


def _wait_for(path: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float) -> re.Match[str]:
    def printed() -> re.Match[str] | None:
        exited = proc.poll() is not None
        text = path.read_text(errors="replace")
        found = re.search(pattern, text, re.MULTILINE)
        assert found or not exited, f"up exited with {proc.returncode} before printing {pattern!r}:\n{text}"
        return found
    try:
        return wait_until(printed, timeout, f"up to print {pattern!r}")
    except AssertionError:
        print(f"{path}:\n{path.read_text(errors='replace')}")
        raise


def test_sigint_in_the_middle_stops_every_node(tmp_path, rng, data_dir):
    config = write_config(tmp_path / "cluster.toml", cluster_document(3, rng))
    out = tmp_path / "up.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(epochlog_argv("up", "--config", str(config), "--data-dir", str(data_dir),
                                              "--demo-load"), stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        _wait_for(out, r"demo load, run 1: 0 keys from earlier runs found", proc, 90)
        _wait_for(out, r"kv: leader \d term \d+ commit \d+ applied \d+ [1-9][\d.]* ev/s", proc, 30)
        pids = live_node_pids(data_dir)
        assert len(pids) == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert re.search(r"demo load, run 1: [1-9]\d* puts", text), text
    assert text.count("stopped, exit code 0") == 3, text
    assert_all_stopped(data_dir)


def test_a_node_that_dies_is_shown_down_with_its_exit_code_and_log_tail(tmp_path, rng, data_dir):
    config = write_config(tmp_path / "cluster.toml", cluster_document(3, rng))
    out = tmp_path / "up.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(epochlog_argv("up", "--config", str(config), "--data-dir", str(data_dir),
                                              "--seconds", "4"),
                                stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        _wait_for(out, r"every group has a leader", proc, 90)
        victim = recorded_nodes(data_dir)[2]["pid"]
        assert victim in live_node_pids(data_dir)
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(60) == 1, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert f"node 2 (pid {victim}) is down (killed by SIGKILL); last lines of" in text, text
    log_path = Path(text.split("last lines of ", 1)[1].split(":\n", 1)[0])
    logged = [line for line in log_path.read_text().splitlines() if line.strip()]
    tail = "".join(f"    {line}\n" for line in logged[-LOG_TAIL_LINES:])
    assert f"last lines of {log_path}:\n{tail}" in text, "the log tail is shown:\n" + text
    assert re.search(r"nodes 2/3 up \| 2 down \(killed by SIGKILL\)", text), text
    assert re.search(r"^  node 2: down \(killed by SIGKILL\)", text, re.MULTILINE), text
    assert text.count("stopped, exit code 0") == 2 and "stopped with problems" in text, text
    assert f"problem: node 2 (pid {victim}) went down on its own (killed by SIGKILL)" in text, text
    assert_all_stopped(data_dir, codes={2: -9})


# --- without processes ---------------------------------------------------------------------------

def _status(node: int, groups: dict[str, tuple[str, int, int, int, int]], members: int = 3) -> p.StatusInfo:
    """groups: name -> (role, term, leader, commit, applied)."""
    infos = [p.GroupInfo(g, node, role, term, leader, commit, applied, commit, 0, -1,
                         [p.PeerInfo(i, "voter", -1) for i in range(1, members + 1)])
             for g, (role, term, leader, commit, applied) in groups.items()]
    return p.StatusInfo("test", node, infos, [])


def test_view_lags_rates_and_leaderless_groups():
    view = ClusterView(["kv", "offsets"], [1, 2, 3], window_s=5.0)
    view.observe(10.0, {
        1: _status(1, {"kv": ("leader", 2, 1, 100, 100), "offsets": ("follower", 1, 0, 5, 5)}),
        2: _status(2, {"kv": ("follower", 2, 1, 90, 80), "offsets": ("follower", 1, 0, 5, 4)}),
        3: None})
    kv, offsets = view.rows()
    assert (kv.leader, kv.term, kv.commit, kv.applied) == (1, 2, 100, 100)
    assert [(m.id, m.lag) for m in kv.members] == [(1, 0), (2, 20), (3, None)]
    assert offsets.leader is None and not view.all_led()
    view.observe(12.0, {
        1: _status(1, {"kv": ("leader", 2, 1, 300, 300), "offsets": ("leader", 2, 1, 6, 6)}),
        2: _status(2, {"kv": ("follower", 2, 1, 300, 300), "offsets": ("follower", 2, 1, 6, 6)}),
        3: _status(3, {"kv": ("follower", 2, 1, 250, 250), "offsets": ("follower", 2, 1, 6, 6)})})
    kv, offsets = view.rows()
    assert kv.events_per_s == pytest.approx(100.0)
    assert [m.lag for m in kv.members] == [0, 0, 50]
    assert view.all_led()
    # Samples older than the window drop out: the rate follows the recent commits.
    view.observe(20.0, {i: _status(i, {"kv": ("leader" if i == 1 else "follower", 2, 1, 340, 340),
                                       "offsets": ("follower", 2, 1, 6, 6)}) for i in (1, 2, 3)})
    assert view.rows()[0].events_per_s == pytest.approx(5.0)


def test_nodes_generates_a_config_following_the_port_scheme(tmp_path, rng):
    document = cluster_document(3, rng, room=5)   # the 5 nodes' ports of each kind must not overlap
    document["raft"] = {"election_timeout_ticks": 12}
    config = write_config(tmp_path / "three.toml", document)
    plan = make_plan(config, 5, tmp_path / "data")
    assert plan.generated and plan.config_path == (tmp_path / "data" / "cluster.toml").resolve()
    generated = tomllib.loads(plan.config_path.read_text())
    members = generated["cluster"]["members"]
    assert [m["id"] for m in members] == [1, 2, 3, 4, 5]
    for kind in ("peer_address", "client_address", "admin_address"):
        first = int(document["cluster"]["members"][0][kind].rpartition(":")[2])
        assert [int(m[kind].rpartition(":")[2]) for m in members] == [first + i for i in range(5)]
    assert generated["raft"] == {"election_timeout_ticks": 12} and generated["log"] == document["log"]
    assert plan.configs.raft.election_timeout_ticks == 12
    # Same count as the config: the config itself runs.
    same = make_plan(config, 3, tmp_path / "data3")
    assert not same.generated and same.config_path == config.resolve()


def test_nodes_refuses_addresses_without_a_scheme_and_a_membership_change(tmp_path, rng):
    document = cluster_document(3, rng)
    document["cluster"]["members"][2]["client_address"] = "127.0.0.1:1999"
    config = write_config(tmp_path / "odd.toml", document)
    with pytest.raises(UpError, match=r"client_addresses of .* do not follow one scheme"):
        make_plan(config, 5, tmp_path / "odd")
    assert not (tmp_path / "odd").exists()
    # A data dir made by a 3-node run refuses 5 nodes (membership changes are not available).
    good = write_config(tmp_path / "good.toml", cluster_document(3, rng))
    data = tmp_path / "data"
    for i in (1, 2, 3):
        (data / f"node-{i}").mkdir(parents=True)
    (data / "up.json").write_text('{"members": [1, 2, 3], "nodes": {}}')
    with pytest.raises(UpError, match="would change its membership"):
        make_plan(good, 5, data)
    assert not (data / "cluster.toml").exists()
    remote = cluster_document(3, rng)
    remote["cluster"]["members"][0]["peer_address"] = "10.1.2.3:7101"
    with pytest.raises(EpochlogError, match="not on this machine"):
        make_plan(write_config(tmp_path / "remote.toml", remote), None, tmp_path / "remote")


def test_configs_are_checked_before_any_process_starts(tmp_path, rng):
    document = cluster_document(3, rng)
    document["log"]["flush_policy"] = "sometimes"
    config = write_config(tmp_path / "bad.toml", document)
    result = run_epochlog("up", "--config", str(config), "--data-dir", str(tmp_path / "d"), "--once",
                          timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "log.flush_policy = 'sometimes'" in result.stderr
    assert not (tmp_path / "d").exists()
    assert load_toml(config)["log"]["flush_policy"] == "sometimes"


def test_up_certificates_are_made_once_renewed_near_their_end_and_others_left_alone(tmp_path, rng):
    config = write_config(tmp_path / "cluster.toml", cluster_document(3, rng, name="certs-test"))
    data = tmp_path / "data"
    plan = make_plan(config, None, data)
    made = ensure_certificates(plan)
    assert made[0] == f"the cluster CA in {data / 'ca'}" and len(made) == 4, made
    assert ensure_certificates(plan) == []
    ca = ClusterCA.load(data / "ca")
    ca.issue_member(2, data / "node-2" / "tls", days=10)            # ours, near its end: renewed
    ClusterCA.create(tmp_path / "other-ca", "certs-test").issue_member(3, data / "node-3" / "tls")  # not ours: kept
    foreign = (data / "node-3" / "tls" / "node.crt").read_bytes()
    assert ensure_certificates(plan) == [f"node 2's certificate {data / 'node-2' / 'tls' / 'node.crt'}"]
    assert (data / "node-3" / "tls" / "node.crt").read_bytes() == foreign
    # A CA of another cluster in the data directory is refused (exit 3 through the CLI).
    other = write_config(tmp_path / "other.toml", cluster_document(3, rng, name="another"))
    with pytest.raises(CertsError, match="is for cluster 'certs-test', not 'another'"):
        ensure_certificates(make_plan(other, None, data))
