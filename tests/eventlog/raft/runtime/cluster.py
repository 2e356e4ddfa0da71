"""A cluster of real node processes for tests: configs, processes, leaders, writers, offline logs.

Theory of operation. `Cluster` makes a CA for the cluster and each member's certificate in its data
directory (tests/support/tls.py: the peers speak mutual TLS, as in production; `insecure=True` writes
`[cluster.tls] insecure = true` instead) and writes one TOML config per node (free 127.0.0.1 ports; with
`proxied=True` the dialer of each pair reaches its peer through a `tests.support.proxy.Link`, which
terminates TLS on both sides with the two members' certificates, so
the configs differ per node: only a node's own `peer_address` must be its real listening address;
`node_raft` can also give one node its own `[raft]` settings, e.g. a shorter election timeout),
starts each node as `python -m eventlog.raft.runtime.process` with stdout and stderr in files under
the cluster directory (one pair per incarnation: `node-<id>.<n>.out/.err`), waits for `READY <id>`
and connects a `HarnessClient` to it.

Processes are only ever signalled through the `subprocess.Popen` object that started them (its
pid): `kill` (SIGKILL), `terminate` (SIGTERM, then SIGKILL past a deadline). `close()` kills
whatever still runs and stops the proxies; the `cluster_factory` fixture calls it in teardown, so
no process outlives its test even when the test fails. Every wait is bounded.

`WriteStream` is the workload: several proposers writing unique records to the leader of a group,
following NotLeader hints, and recording every `Committed` acknowledgement; a timeout, a dropped
connection or a `Failed` other than not_leader is indeterminate (the write may or may not commit).
Each attempt writes new keys, so an acknowledged offset names exactly one expected content.

The offline side (`read_log`) opens a stopped node's group log with `eventlog.log.Log` and returns
its batches (raw bytes, offsets, epochs, records); `check_acks` and `compare_committed` check that
acknowledged records are present and that replicas hold byte-identical committed batches.

Ports are drawn at random below the kernel's ephemeral range and bind-checked; a node's ports stay
the same across its restarts (the others' configs name them).

Use a `Cluster` from one asyncio loop (the test's); the proxy network has its own thread.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.raft.runtime.config import PeerTlsConfig
from eventlog.raft.runtime.faults import ENV_VAR as FAULTS_ENV
from eventlog.raft.runtime.faults import HEAL_ENV_VAR as FAULTS_HEAL_ENV
from eventlog.raft.runtime.harness import Committed, Failed, GroupState, HarnessClient
from eventlog.raft.runtime.tls import load_peer_tls
from tests.support.proxy import ProxyNetwork
from tests.support.tls import provision
from tests.support.ports import free_ports
from tests.support.wait import eventually

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[4]
START_TIMEOUT_S = 20.0      # process start to READY (python start-up + imports + log open)
STOP_TIMEOUT_S = 10.0       # SIGTERM to exit
STATUS_TIMEOUT_S = 1.0


@dataclass
class Node:
    """One member: its ports, files and the process of its current incarnation."""

    id: int
    peer_port: int
    harness_port: int
    data_dir: Path
    config_path: Path
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = -1
    client: HarnessClient | None = None
    out_path: Path | None = None
    err_path: Path | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path and self.err_path.exists() else ""

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path and self.out_path.exists() else ""


@dataclass(frozen=True)
class Batch:
    """One batch of a group log read offline."""

    base: int
    last: int
    epoch: int
    raw: bytes
    control: bool
    records: tuple[tuple[bytes | None, bytes | None], ...]   # (key, value) of offsets base..last


@dataclass(frozen=True)
class OfflineLog:
    start: int
    end: int
    batches: tuple[Batch, ...]

    def by_base(self) -> dict[int, Batch]:
        return {b.base: b for b in self.batches}

    def record_at(self, offset: int) -> tuple[bytes | None, bytes | None] | None:
        for b in self.batches:
            if b.base <= offset <= b.last:
                return None if b.control else b.records[offset - b.base]
        return None


class Cluster:
    """N node processes hosting the same Raft groups (see the module docstring)."""

    def __init__(self, root: Path, *, size: int = 3, groups: tuple[str, ...] = ("g0",),
                 tick_interval_ms: int = 50,
                 snapshot_every_entries: int = 0, raft: dict[str, object] | None = None,
                 log: dict[str, object] | None = None, proxied: bool = False, seed: int = 0,
                 node_raft: dict[int, dict[str, object]] | None = None, insecure: bool = False) -> None:
        self.root = root
        self.name = "runtime-test"
        self.insecure = insecure
        self.root.mkdir(parents=True, exist_ok=True)
        self.groups = groups
        self.seed = seed
        self.rng = random.Random(seed)
        self.tick_interval_ms = tick_interval_ms
        self.snapshot_every_entries = snapshot_every_entries
        self.raft = dict(raft or {})
        self.node_raft = dict(node_raft or {})   # per-node [raft] overrides (e.g. an eager candidate)
        # Small segments: a 64 MiB default would cost every node 128 MiB of zero-filling per group.
        self.log = {"segment_bytes": 1 << 20, **(log or {})}
        ports = free_ports(2 * size, random.Random(random.SystemRandom().getrandbits(64)))
        self.nodes = {i: Node(i, ports[2 * (i - 1)], ports[2 * (i - 1) + 1], root / f"node-{i}",
                              root / f"node-{i}.toml") for i in range(1, size + 1)}
        self.net: ProxyNetwork | None = None
        self.peer_addresses: dict[int, dict[int, str]] = {}   # node -> member -> address in its config
        try:
            if not insecure:
                provision(root / "ca", self.name, {i: n.data_dir for i, n in self.nodes.items()})
            if proxied:
                self.net = ProxyNetwork()
                tls = {i: load_peer_tls(PeerTlsConfig(insecure=insecure), n.data_dir, self.name, i)
                       for i, n in self.nodes.items()}
                proxy_ports = {}
                for a in self.nodes:
                    for b in self.nodes:
                        if a < b:   # a dials b: the link shows b's certificate to a, and a's to b
                            ta, tb = tls[a], tls[b]
                            contexts = None if ta is None or tb is None else (tb.server, ta.client)
                            proxy_ports[(a, b)] = self.net.add_link(a, b, ("127.0.0.1", self.nodes[b].peer_port),
                                                                    tls=contexts)
            for i in self.nodes:
                addresses = {}
                for j, node in self.nodes.items():
                    port = proxy_ports[(i, j)] if proxied and i < j else node.peer_port
                    addresses[j] = f"127.0.0.1:{port}"
                self.peer_addresses[i] = addresses
                raft = {**self.raft, **self.node_raft.get(i, {})}
                self.nodes[i].config_path.write_text(self._config_text(addresses, raft))
        except BaseException:
            self.close()
            raise

    def _config_text(self, addresses: dict[int, str], raft: dict[str, object]) -> str:
        lines = ["[cluster]", f'name = "{self.name}"', f"groups = {list(self.groups)!r}".replace("'", '"'),
                 f"tick_interval_ms = {self.tick_interval_ms}",
                 f"snapshot_every_entries = {self.snapshot_every_entries}", ""]
        for i, address in addresses.items():
            lines += ["[[cluster.members]]", f"id = {i}", f'peer_address = "{address}"', ""]
        if self.insecure:
            lines += ["[cluster.tls]", "insecure = true", ""]
        for section, values in (("raft", raft), ("log", self.log)):
            lines.append(f"[{section}]")
            for k, v in values.items():
                lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}")
            lines.append("")
        return "\n".join(lines)

    def log_config(self) -> LogConfig:
        """The `[log]` config of the nodes, for opening their group logs offline."""
        return LogConfig(**{**self.log, "preallocate_next_segment": False})  # type: ignore[arg-type]

    # --- processes -----------------------------------------------------------------------------

    async def start(self, nodes: Iterable[int] | None = None, *, faults: str | None = None,
                    heal_file: Path | None = None) -> None:
        """Start `nodes` (default: all) concurrently and wait until each is READY and connected."""
        ids = list(self.nodes) if nodes is None else list(nodes)
        await asyncio.gather(*(self.start_node(i, faults=faults, heal_file=heal_file) for i in ids))

    async def start_node(self, node_id: int, *, faults: str | None = None, wait_ready: bool = True,
                         heal_file: Path | None = None) -> None:
        """Start (or restart) one node; `faults` is its EPOCHLOG_FAULTS (see eventlog.raft.runtime.faults),
        `heal_file` its EPOCHLOG_FAULTS_HEAL_FILE (the disk-space faults heal once the file exists)."""
        node = self.nodes[node_id]
        assert not node.running, f"node {node_id} is already running"
        node.incarnation += 1
        node.out_path = self.root / f"node-{node_id}.{node.incarnation}.out"
        node.err_path = self.root / f"node-{node_id}.{node.incarnation}.err"
        env = {k: v for k, v in os.environ.items() if k not in (FAULTS_ENV, FAULTS_HEAL_ENV)}
        if faults:
            env[FAULTS_ENV] = faults
        if heal_file is not None:
            env[FAULTS_HEAL_ENV] = str(heal_file)
        node.proc = self._spawn(node, env)
        if wait_ready:
            await self.wait_ready(node_id)

    def _spawn(self, node: Node, env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert node.out_path is not None and node.err_path is not None
        node_seed = self.rng.getrandbits(32)
        with open(node.out_path, "wb") as out, open(node.err_path, "wb") as err:
            return subprocess.Popen(
                [sys.executable, "-m", "eventlog.raft.runtime.process", "--config", str(node.config_path),
                 "--node-id", str(node.id), "--data-dir", str(node.data_dir),
                 "--harness", f"127.0.0.1:{node.harness_port}", "--seed", str(node_seed)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    async def wait_ready(self, node_id: int) -> None:
        node = self.nodes[node_id]
        deadline = time.monotonic() + START_TIMEOUT_S
        while f"READY {node_id}" not in node.stdout():
            if not node.running:
                code = node.proc and node.proc.returncode
                raise AssertionError(f"node {node_id} exited with {code} before READY:\n"
                                     f"{node.stderr()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"node {node_id} not READY after {START_TIMEOUT_S}s:\n"
                                     f"{node.stderr()[-3000:]}")
            await asyncio.sleep(0.02)
        node.client = await HarnessClient.connect("127.0.0.1", node.harness_port, timeout=5.0)

    def kill(self, node_id: int) -> float:
        """SIGKILL the node's process (by the pid we started); returns the monotonic time of the kill."""
        node = self.nodes[node_id]
        assert node.proc is not None and node.running, f"node {node_id} is not running"
        self._drop_client(node)
        t = time.monotonic()
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(STOP_TIMEOUT_S)
        return t

    async def terminate(self, node_id: int, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM the node and wait for it to exit; returns its exit code (SIGKILL past `timeout`)."""
        node = self.nodes[node_id]
        assert node.proc is not None
        await self._close_client(node)
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
        code = await self.wait_exit(node_id, timeout)
        if code is None:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(STOP_TIMEOUT_S)
            raise AssertionError(f"node {node_id} did not stop within {timeout}s of SIGTERM (killed):\n"
                                 f"{node.stderr()[-3000:]}")
        return code

    async def wait_exit(self, node_id: int, timeout: float) -> int | None:
        """The exit code once the node's process exited, or None if it still runs after `timeout`."""
        node = self.nodes[node_id]
        assert node.proc is not None
        deadline = time.monotonic() + timeout
        while node.proc.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.02)
        self._drop_client(node)
        return node.proc.returncode

    async def stop_all(self) -> dict[int, int]:
        """SIGTERM every running node concurrently; their exit codes."""
        running = [i for i, n in self.nodes.items() if n.running]
        codes = await asyncio.gather(*(self.terminate(i) for i in running))
        return dict(zip(running, codes))

    def running(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.running]

    def _drop_client(self, node: Node) -> None:
        client, node.client = node.client, None
        if client is not None:
            client.abort()

    async def _close_client(self, node: Node) -> None:
        client, node.client = node.client, None
        if client is not None:
            await client.close()

    async def aclose(self) -> None:
        """Close the clients and stop every node (SIGTERM, SIGKILL if it hangs). Idempotent."""
        for node in self.nodes.values():
            await self._close_client(node)
        for i, node in self.nodes.items():
            if node.running:
                try:
                    await self.terminate(i, timeout=5.0)
                except AssertionError:
                    pass
        self.close()

    def close(self) -> None:
        """Kill every process still running (by its pid) and stop the proxies. Sync, idempotent."""
        for node in self.nodes.values():
            node.client = None
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
                try:
                    node.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
        if self.net is not None:
            self.net.close()

    def describe(self) -> str:
        """Where to look: the cluster directory and the tail of every node's stderr."""
        parts = [f"cluster dir {self.root} (seed {self.seed})"]
        for i, n in self.nodes.items():
            code = None if n.proc is None else n.proc.poll()
            parts.append(f"--- node {i} incarnation {n.incarnation} exit={code} stderr tail:\n"
                         f"{n.stderr()[-1500:]}")
        return "\n".join(parts)

    # --- status --------------------------------------------------------------------------------

    async def status(self, node_id: int, timeout: float = STATUS_TIMEOUT_S) -> dict[str, GroupState] | None:
        """The node's group states, or None when it does not answer."""
        client = self.nodes[node_id].client
        if client is None:
            return None
        try:
            reply = await client.status(timeout=timeout)
        except (TimeoutError, ConnectionError, OSError):
            return None
        return {g.group: g for g in reply.groups}

    async def states(self, group: str, nodes: Iterable[int] | None = None) -> dict[int, GroupState]:
        """`group`'s state on each of `nodes` (default: running) that answers."""
        ids = self.running() if nodes is None else list(nodes)
        replies = await asyncio.gather(*(self.status(i) for i in ids))
        return {i: r[group] for i, r in zip(ids, replies) if r is not None}

    async def wait_leader(self, group: str, *, timeout: float = 10.0, among: Iterable[int] | None = None,
                          min_term: int = 0) -> GroupState:
        """A node of `among` (default: running) that reports being `group`'s leader in a term >= `min_term`
        (the highest such term if several do)."""
        ids = None if among is None else list(among)

        async def check() -> GroupState | None:
            leaders = [s for s in (await self.states(group, ids)).values()
                       if s.role == "leader" and s.term >= min_term]
            return max(leaders, key=lambda s: s.term) if leaders else None
        return await eventually(check, timeout, f"a leader of {group} among {ids or 'running nodes'} "
                                              f"in term >= {min_term}")

    async def wait_converged(self, group: str, *, nodes: Iterable[int] | None = None,
                             timeout: float = 15.0) -> dict[int, GroupState]:
        """Wait until `nodes` agree on `group`'s leader and term and each applied its whole log."""
        ids = self.running() if nodes is None else list(nodes)
        last: dict[int, GroupState] = {}

        async def check() -> dict[int, GroupState] | None:
            nonlocal last
            last = await self.states(group, ids)
            if len(last) != len(ids):
                return None
            views = {(s.leader, s.term, s.commit, s.applied, s.last_index) for s in last.values()}
            if len(views) != 1:
                return None
            leader, _, commit, applied, last_index = views.pop()
            return last if leader and commit == applied == last_index else None
        try:
            return await eventually(check, timeout, f"{group} to converge on nodes {ids}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last states: {last}") from None

    # --- offline -------------------------------------------------------------------------------

    def group_dir(self, node_id: int, group: str) -> Path:
        return self.nodes[node_id].data_dir / "groups" / group

    def read_log(self, node_id: int, group: str) -> OfflineLog:
        """Every batch of a stopped node's group log (opened with eventlog.log.Log, recovery included)."""
        assert not self.nodes[node_id].running, f"node {node_id} must be stopped to read its log"
        return read_log_dir(self.group_dir(node_id, group) / "log", self.log_config())


def read_log_dir(directory: Path, config: LogConfig) -> OfflineLog:
    """Every batch of the (stopped) log in `directory`, opened with eventlog.log.Log, recovery included."""
    batches = []
    with Log.open(directory, config) as log:
        for b in log.batches():
            h = b.header
            records = () if h.is_control else tuple((r.key, r.value) for r in b.records())
            batches.append(Batch(h.base_offset, h.last_offset, h.leader_epoch, bytes(b.raw), h.is_control,
                                 records))
        return OfflineLog(log.start_offset, log.end_offset, tuple(batches))


def run_test(cluster: Cluster, body: Callable[[Cluster], Awaitable[None]], timeout: float = 90.0) -> None:
    """Run `body(cluster)` on a fresh event loop within `timeout` seconds; on failure print where
    to look (node stderr tails, proxy counters); always stop the nodes before returning."""
    async def main() -> None:
        try:
            await asyncio.wait_for(body(cluster), timeout)
        except BaseException:
            print(cluster.describe())
            if cluster.net is not None:
                print(f"proxy frames (passed, dropped) per direction: {cluster.net.counters()}")
            raise
        finally:
            await cluster.aclose()
    started = time.monotonic()
    asyncio.run(main())
    print(f"took {time.monotonic() - started:.1f}s")


# --- the workload ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ack:
    """A write acknowledged by a `Committed` reply: `records` are at offsets offset, offset + 1, ..."""

    offset: int
    records: tuple[tuple[bytes, bytes], ...]
    node: int
    sent: float      # monotonic
    acked: float     # monotonic


@dataclass
class WriteStream:
    """`proposers` concurrent proposers writing unique records to the leader of `group`.

    The shared guess of the leader follows NotLeader hints; a node that does not answer is skipped
    for the next node. Every attempt uses fresh keys `<group>/<proposer>/<attempt>/<j>`.
    """

    cluster: Cluster
    group: str
    proposers: int = 4
    batch: int = 2
    value_bytes: int = 48
    request_timeout_s: float = 1.0
    acks: list[Ack] = field(default_factory=list)
    indeterminate: int = 0
    not_leader: int = 0
    refused: dict[int, dict[str, int]] = field(default_factory=dict)   # node -> Failed code -> count
    _target: int = 1
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopping: bool = False

    def start(self) -> None:
        self._target = next(iter(self.cluster.running()), 1)
        self._tasks = [asyncio.create_task(self._run(p)) for p in range(self.proposers)]

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.gather(*self._tasks)

    def _rotate(self, away_from: int) -> None:
        if self._target == away_from:
            ids = sorted(self.cluster.nodes)
            self._target = ids[(ids.index(away_from) + 1) % len(ids)]

    async def _run(self, p: int) -> None:
        attempt = 0
        while not self._stopping:
            target = self._target
            client = self.cluster.nodes[target].client
            if client is None:
                self._rotate(target)
                await asyncio.sleep(0.01)
                continue
            attempt += 1
            prefix = f"{self.group}/{p}/{attempt}".encode()
            records = tuple((prefix + b"/%d" % j, (prefix + b"=").ljust(self.value_bytes, b"v"))
                            for j in range(self.batch))
            sent = time.monotonic()
            try:
                reply = await client.propose(self.group, list(records), timeout=self.request_timeout_s)
            except (TimeoutError, ConnectionError, OSError):
                self.indeterminate += 1
                self._rotate(target)
                await asyncio.sleep(0.01)
                continue
            if isinstance(reply, Committed):
                self.acks.append(Ack(reply.offset, records, target, sent, time.monotonic()))
            elif isinstance(reply, Failed) and reply.code == "not_leader":
                self.not_leader += 1
                if reply.leader and reply.leader != target:
                    self._target = reply.leader
                else:
                    self._rotate(target)
                await asyncio.sleep(0.02)
            else:
                self.indeterminate += 1   # dropped by a leadership change, or the group failed
                if isinstance(reply, Failed):
                    codes = self.refused.setdefault(target, {})
                    codes[reply.code] = codes.get(reply.code, 0) + 1
                await asyncio.sleep(0.02)

    def summary(self) -> str:
        return (f"{len(self.acks)} acks, {self.indeterminate} indeterminate, "
                f"{self.not_leader} not-leader replies")


def check_acks(acks: Iterable[Ack], logs: dict[int, OfflineLog]) -> int:
    """Every acknowledged record is in every log that still holds its offset, with its content.

    Returns how many (record, log) pairs were checked."""
    checked = 0
    for ack in acks:
        for node, log in logs.items():
            for j, (key, value) in enumerate(ack.records):
                offset = ack.offset + j
                if offset < log.start:
                    continue  # compacted into a snapshot (compared through the digest)
                found = log.record_at(offset)
                assert found == (key, value), (
                    f"acknowledged offset {offset} ({key!r}, acked by node {ack.node}) is {found!r} on "
                    f"node {node} (log [{log.start}, {log.end}))")
                checked += 1
    return checked


def compare_committed(logs: dict[int, OfflineLog], commit: int) -> tuple[int, int, int]:
    """Every log is contiguous from its start through `commit`, and every committed batch is
    byte-identical on all the logs that still hold it (compaction may have dropped it on some).

    Returns (lowest offset held by two logs or more, `commit`, batches compared between two logs or more).
    """
    holders: dict[int, list[tuple[int, Batch]]] = {}
    for node, log in logs.items():
        assert log.end > commit or log.start == commit + 1, (
            f"node {node}'s log [{log.start}, {log.end}) does not reach the commit {commit}")
        expected = log.start
        for b in log.batches:
            assert b.base == expected, f"node {node}: batch at {b.base}, expected {expected}"
            expected = b.last + 1
            if b.base <= commit:
                holders.setdefault(b.base, []).append((node, b))
    compared = 0
    shared = [base for base, held in holders.items() if len(held) > 1]
    for base, held in holders.items():
        ref_node, ref = held[0]
        for node, b in held[1:]:
            assert (b.last, b.epoch) == (ref.last, ref.epoch), (
                f"batch {base}: node {ref_node} has [{base}, {ref.last}] epoch {ref.epoch}, "
                f"node {node} has [{base}, {b.last}] epoch {b.epoch}")
            assert b.raw == ref.raw, f"batch {base} differs between node {ref_node} and node {node}"
        compared += len(held) > 1
    return (min(shared) if shared else commit + 1), commit, compared
