"""A cluster of real `epochlog serve` processes: the one real-process harness of the suite (the node, its
faces, the SDK, the CLI, the Raft runtime, compaction, the controller, Spark, chaos and the benchmarks).

Theory of operation. `NodeCluster` makes a CA for the cluster (`<root>/ca`) and gives each node a member
certificate in `<data dir>/tls` before it first starts (tests/support/tls.py: the members speak mutual TLS, as
in production; `insecure=True` writes `[cluster.tls] insecure = true` instead), writes one TOML config
(`cluster.toml`, every member with a peer, client and admin address on free 127.0.0.1 ports, and a gRPC
and a Kafka address when asked) under the test's directory and runs each
member as `python -m epochlog serve --config cluster.toml --node-id N --data-dir node-N`, with
stdout and stderr in files (one pair per incarnation: `node-<id>.<n>.out/.err`). A node counts as
started once its stdout has the `READY <id> <client address>` line.

With `proxied=True` every peer link goes through a `tests.support.proxy.Link` (`net`, a ProxyNetwork:
`net.isolate(node)` cuts a node off from its peers while its client port stays reachable): each
node then gets its own config (`node-<id>.toml`), naming the links as the peer addresses of the
members it dials (the lower id dials); `config_path` keeps the real addresses, for the CLI. A node
given its own `[raft]` settings (`node_raft`, e.g. a shorter election timeout to make it the leader)
gets its own config too.

A node can run another build of Epochlog (`ServeNode.build`, tests/support/builds.py: an older one
without the leader's check, a newer one knowing a newer schema) for mixed-version tests.

Processes are only ever signalled through the `subprocess.Popen` object that started them (its
pid): `kill9` (SIGKILL), `stop` (SIGTERM, SIGKILL past a deadline), `pause` and `resume` (SIGSTOP,
SIGCONT: the process keeps its memory, sockets and disk; it just stops running). `close()` kills whatever still
runs; the `node_cluster_factory` fixture (tests/support/fixtures.py) calls it in teardown, so no process
outlives its test. A node keeps its ports and data directory across restarts. Every wait is bounded.
`start(..., env=...)` sets environment variables of one incarnation, e.g. the disk faults and crash
points of eventlog/fault_injection.py for the node a test wants to break.

After a stop, `read_log` opens a node's group log offline (tests/support/offline.py) and
`views_on_disk` reads its views' applied offset and digest.

Every method blocks (processes are watched through files and pids; `status`, `leader` and
`wait_applied` ask the nodes through a short-lived blocking SDK client), so blocking tests call them
directly and asyncio tests through `asyncio.to_thread` when their own clients must keep running.
"""

from __future__ import annotations

import os
import random
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from epochlog.api import messages as p
from epochlog.client import Client
from eventlog.config import LogConfig
from eventlog.errors import EpochlogError
from statemachines.store import APPLIED, DIGEST, ViewStore, decode_offset
from tests.support.offline import OfflineLog, read_log_dir
from tests.support.ports import free_ports
from eventlog.raft.runtime.config import PeerTlsConfig
from eventlog.raft.runtime.tls import load_peer_tls
from tests.support.proxy import ProxyNetwork
from tests.support.tls import provision
from tests.support.wait import wait_until

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
PLAINTEXT_CLIENTS: dict[str, object] = {"tls": {"enabled": False}}
"""What the harness writes unless a test's `clients` gives its own `tls`: plaintext client faces, said
explicitly (a node whose config says nothing serves TLS with enforcement: epochlog/server.py)."""
START_TIMEOUT_S = 30.0      # process start to READY (python start-up, imports, RocksDB and logs opened)
STOP_TIMEOUT_S = 10.0       # SIGTERM to exit


@dataclass
class ServeNode:
    """One member: its addresses, its files and the process of its current incarnation."""

    id: int
    peer_address: str
    client_address: str
    admin_address: str
    data_dir: Path
    grpc_address: str = ""
    kafka_address: str = ""
    build: str | None = None              # another build of Epochlog (tests/support/builds.py) from the next start
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = -1
    out_path: Path | None = None
    err_path: Path | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path and self.out_path.exists() else ""

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path and self.err_path.exists() else ""


class NodeCluster:
    """`size` `epochlog serve` processes of one cluster (see the module docstring).

    `groups`, `tick_interval_ms`, `snapshot_every_entries` go to `[cluster]`, and `leader_balance = false`
    unless `cluster` says otherwise; `cluster` (a dict value is a sub-table: `cluster={"peer_limits": {...}}`), `raft`, `log`, `views`, `clients`, `compaction`,
    `controller` and `kafka_config` (the `[kafka]` section) are extra keys of those sections (a dict value
    is a sub-table: `compaction={"cleaner": {...}}` is `[compaction.cleaner]`); `node_raft` overrides
    `[raft]` keys for single nodes. The client faces are plaintext, written as `[clients.tls] enabled =
    false`, unless `clients` has its own `tls` table (tests/support/secured.py: TLS and enforcement). `grpc` and `kafka` give every member a gRPC or a Kafka address too.
    Logs get 1 MiB segments and the views small caches unless told otherwise (the defaults would cost
    each node hundreds of MiB). `env` adds environment variables to every process started. `module` is
    what runs as `python -m <module> serve ...` (bench/raft_node.py for the Raft benchmark), with
    `serve_args` after the cluster's own (e.g. `--log-format json`).
    """

    def __init__(self, root: Path, *, size: int = 3, seed: int = 0, name: str = "node-test",
                 groups: tuple[str, ...] = ("metadata", "offsets", "kv"), tick_interval_ms: int = 50,
                 snapshot_every_entries: int = 0, raft: dict[str, object] | None = None,
                 log: dict[str, object] | None = None, views: dict[str, object] | None = None,
                 clients: dict[str, object] | None = None, grpc: bool = False, kafka: bool = False,
                 cluster: dict[str, object] | None = None,
                 compaction: dict[str, object] | None = None, controller: dict[str, object] | None = None,
                 kafka_config: dict[str, object] | None = None, node_raft: dict[int, dict[str, object]] | None = None,
                 proxied: bool = False, insecure: bool = False, module: str = "epochlog",
                 serve_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.insecure = insecure
        self.root.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.rng = random.Random(seed)
        self.name = name
        self.groups = groups
        self.tick_interval_ms = tick_interval_ms
        self.snapshot_every_entries = snapshot_every_entries
        # Leader balancing off unless a test asks for it (cluster={"leader_balance": True}): a test that
        # finds a group's leader and then acts on it must not see the leadership move under it.
        self.cluster_extra = {"leader_balance": False, **(cluster or {})}
        self.raft = dict(raft or {})
        self.log = {"segment_bytes": 1 << 20, **(log or {})}
        self.views = {"block_cache_bytes": 8 << 20, "write_buffer_bytes": 4 << 20, **(views or {})}
        self.clients = {**PLAINTEXT_CLIENTS, **(clients or {})}
        self.compaction = dict(compaction or {})
        self.controller = dict(controller or {})
        self.kafka_config = dict(kafka_config or {})
        self.node_raft = dict(node_raft or {})
        self.module = module
        self.serve_args = serve_args
        self.env: dict[str, str] = {}
        self._on_close: list[Callable[[], None]] = []
        kinds = ("peer", "client", "admin", *(("grpc",) if grpc else ()), *(("kafka",) if kafka else ()))
        ports = iter(free_ports(len(kinds) * size))
        self.nodes: dict[int, ServeNode] = {}
        for i in range(1, size + 1):
            address = {kind: f"127.0.0.1:{next(ports)}" for kind in kinds}
            self.nodes[i] = ServeNode(i, address["peer"], address["client"], address["admin"], root / f"node-{i}",
                                      address.get("grpc", ""), address.get("kafka", ""))
        self.config_path = root / "cluster.toml"
        self.config_path.write_text(self.config_text())
        self.net: ProxyNetwork | None = None
        self._own_configs = proxied or bool(self.node_raft)
        self._configured = set(self.nodes)
        links: dict[tuple[int, int], int] = {}
        if proxied:
            self.net = ProxyNetwork()
            for i in self.nodes:   # the links terminate TLS with both members' certificates: made up front
                self.provision_tls(i)
            tls = {i: load_peer_tls(PeerTlsConfig(insecure=insecure), n.data_dir, self.name, i)
                   for i, n in self.nodes.items()}

            def contexts(a: int, b: int) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
                """a dials b: the link shows b's certificate to a, and a's to b."""
                ta, tb = tls[a], tls[b]
                return None if ta is None or tb is None else (tb.server, ta.client)

            links = {(a, b): self.net.add_link(a, b, _host_port(self.nodes[b].peer_address), tls=contexts(a, b))
                     for a in self.nodes for b in self.nodes if a < b}
        for i in self.nodes if self._own_configs else ():
            dialed = {j: f"127.0.0.1:{links[(i, j)]}" for j in self.nodes if i < j} if proxied else {}
            self.node_config_path(i).write_text(self.config_text(dialed, node_id=i))

    def node_config_path(self, node_id: int) -> Path:
        """The config node `node_id` runs with (its own when proxied or given its own `[raft]` keys)."""
        own = self._own_configs and node_id in self._configured   # a joiner runs with the cluster's
        return self.root / f"node-{node_id}.toml" if own else self.config_path

    def config_text(self, peer_addresses: dict[int, str] | None = None, node_id: int | None = None) -> str:
        """The cluster's TOML; `peer_addresses` replaces members' peer addresses (a proxied node's view),
        `node_id` adds that node's own `[raft]` keys."""
        peers = peer_addresses or {}
        lines = ["[cluster]", f'name = "{self.name}"', "groups = [" + ", ".join(f'"{g}"' for g in self.groups) + "]",
                 f"tick_interval_ms = {self.tick_interval_ms}",
                 f"snapshot_every_entries = {self.snapshot_every_entries}",
                 *(f"{k} = {_toml(v)}" for k, v in self.cluster_extra.items() if not isinstance(v, dict)), ""]
        for n in self.nodes.values():
            lines += ["[[cluster.members]]", f"id = {n.id}", f'peer_address = "{peers.get(n.id, n.peer_address)}"',
                      f'client_address = "{n.client_address}"', f'admin_address = "{n.admin_address}"']
            lines += [f'grpc_address = "{n.grpc_address}"'] if n.grpc_address else []
            lines += [f'kafka_address = "{n.kafka_address}"', ""] if n.kafka_address else [""]
        tables = {k: dict(v) for k, v in self.cluster_extra.items() if isinstance(v, dict)}
        if self.insecure:
            tables["tls"] = {**tables.get("tls", {}), "insecure": True}
        for name, table in tables.items():   # e.g. cluster={"peer_limits": {...}} is [cluster.peer_limits]
            lines += [f"[cluster.{name}]", *(f"{k} = {_toml(v)}" for k, v in table.items()), ""]
        raft = {**self.raft, **self.node_raft.get(node_id or 0, {})}
        for section, values in (("raft", raft), ("log", self.log), ("views", self.views), ("clients", self.clients),
                                ("compaction", self.compaction), ("controller", self.controller),
                                ("kafka", self.kafka_config)):
            if values:
                lines.append(f"[{section}]")
                lines += [f"{k} = {_toml(v)}" for k, v in values.items() if not isinstance(v, dict)]
                lines.append("")
                for name, table in values.items():   # a sub-table, e.g. compaction={"cleaner": {...}}
                    if isinstance(table, dict):
                        lines.append(f"[{section}.{name}]")
                        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
                        lines.append("")
        return "\n".join(lines)

    # --- addresses -------------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """Client addresses of every member (running or not), in node id order."""
        return [n.client_address for n in self.nodes.values()]

    def endpoint(self, node_id: int) -> str:
        return self.nodes[node_id].client_address

    @property
    def bootstrap(self) -> list[str]:
        """Kafka addresses of every member (with `kafka=True`), in node id order."""
        return [n.kafka_address for n in self.nodes.values()]

    def running(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.running]

    # --- processes -------------------------------------------------------------------------------

    def start(self, nodes: Iterable[int] | None = None, *, wait: bool = True,
              env: dict[str, str] | None = None) -> None:
        """Start `nodes` (default: every one not running) together and wait until each is READY (unless
        `wait` is false); `env` adds environment variables to these processes only."""
        ids = [i for i in self.nodes if not self.nodes[i].running] if nodes is None else list(nodes)
        for i in ids:
            self._spawn(i, env or {})
        for i in ids if wait else ():
            self.wait_ready(i)

    def provision_tls(self, node_id: int) -> None:
        """Node `node_id`'s member certificate in `<data dir>/tls` (made once; the CA on first use)."""
        if not self.insecure:
            provision(self.root / "ca", self.name, {node_id: self.nodes[node_id].data_dir})

    def _spawn(self, node_id: int, extra_env: dict[str, str], extra_args: tuple[str, ...] = ()) -> None:
        node = self.nodes[node_id]
        assert not node.running, f"node {node_id} is already running"
        self.provision_tls(node_id)
        node.incarnation += 1
        node.out_path = self.root / f"node-{node_id}.{node.incarnation}.out"
        node.err_path = self.root / f"node-{node_id}.{node.incarnation}.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPOCHLOG_")}
        program = ["-m", self.module] if node.build is None else ["-m", "tests.support.builds", node.build]
        env.update(self.env)
        env.update(extra_env)
        with open(node.out_path, "wb") as out, open(node.err_path, "wb") as err:
            node.proc = subprocess.Popen(
                [sys.executable, *program, "serve", "--config", str(self.node_config_path(node_id)),
                 "--node-id", str(node_id), "--data-dir", str(node.data_dir),
                 "--seed", str(self.rng.getrandbits(32)), *self.serve_args, *extra_args],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def wait_ready(self, node_id: int, timeout: float = START_TIMEOUT_S) -> None:
        node = self.nodes[node_id]

        def ready() -> bool:
            if not node.running:
                code = None if node.proc is None else node.proc.returncode
                raise AssertionError(f"node {node_id} exited with {code} before READY:\n{node.stderr()[-3000:]}")
            return f"READY {node_id} " in node.stdout()
        try:
            wait_until(ready, timeout, f"node {node_id} to be READY", interval=0.02)
        except AssertionError as exc:
            if not node.running:
                raise   # it exited: the message has its stderr already
            raise AssertionError(f"{exc}:\n{node.stderr()[-3000:]}") from None

    def wait_views_format(self, level: int | None = None, nodes: Iterable[int] | None = None,
                          timeout: float = 30.0) -> None:
        """Wait until every group of `nodes` (default: all) is at views format `level` (default: the newest):
        a new cluster's leaders raise it as soon as every member said it applies it, an entry of their own
        in each group's log (statemachines/views_format.py)."""
        from statemachines import views_format

        want = views_format.LATEST if level is None else level
        ids = list(self.nodes) if nodes is None else list(nodes)

        def raised() -> bool:
            for i in ids:
                status = self.status(i)
                if status is None or any(g.views_format != want for g in status.groups):
                    return False
            return True
        wait_until(raised, timeout, f"every group at views format level {want} on nodes {ids}")

    def start_joiner(self, node_id: int, build: str | None = None) -> ServeNode:
        """Start `node_id`, which is not in the cluster's config, with its addresses on the command line
        (it serves once an operator adds it: `member add`); `close()` kills it too, and a restart starts
        it without the flags (it remembers its addresses in its data directory). `build`: another build of
        Epochlog to run (tests/support/builds.py)."""
        peer, client, admin = (f"127.0.0.1:{port}" for port in free_ports(3))
        self.nodes[node_id] = ServeNode(node_id, peer, client, admin, self.root / f"node-{node_id}")
        self.nodes[node_id].build = build   # another build of Epochlog (tests/support/builds.py), or this tree
        self._spawn(node_id, {}, ("--peer-address", peer, "--client-address", client, "--admin-address", admin))
        self.wait_ready(node_id)
        return self.nodes[node_id]

    def kill9(self, node_id: int) -> float:
        """SIGKILL the node (by the pid we started); the monotonic time of the kill."""
        node = self.nodes[node_id]
        assert node.proc is not None and node.running, f"node {node_id} is not running"
        t = time.monotonic()
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(STOP_TIMEOUT_S)
        return t

    def pause(self, node_id: int) -> float:
        """SIGSTOP the node (by the pid we started); the monotonic time of the signal."""
        node = self.nodes[node_id]
        assert node.proc is not None and node.running, f"node {node_id} is not running"
        node.proc.send_signal(signal.SIGSTOP)
        return time.monotonic()

    def resume(self, node_id: int) -> float:
        """SIGCONT the node (a no-op for one that is not stopped); the monotonic time of the signal."""
        node = self.nodes[node_id]
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)
        return time.monotonic()

    def stop(self, node_id: int, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM the node and wait for it to exit; its exit code (AssertionError, after a SIGKILL,
        if it outlives `timeout`)."""
        node = self.nodes[node_id]
        assert node.proc is not None, f"node {node_id} was never started"
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)   # a stopped process handles SIGTERM only once resumed
            node.proc.send_signal(signal.SIGTERM)
        return self._wait_exit(node_id, timeout)

    def wait_exit(self, node_id: int, timeout: float) -> int | None:
        """The node's exit code once its process exited, or None if it still runs after `timeout`."""
        proc = self.nodes[node_id].proc
        assert proc is not None, f"node {node_id} was never started"
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _wait_exit(self, node_id: int, timeout: float) -> int:
        node = self.nodes[node_id]
        assert node.proc is not None
        try:
            return node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(STOP_TIMEOUT_S)
            raise AssertionError(f"node {node_id} did not stop within {timeout}s of SIGTERM (killed):\n"
                                 f"{node.stderr()[-3000:]}") from None

    def restart(self, node_id: int) -> None:
        """Start a stopped or killed node again (same ports, same data) and wait until READY."""
        if self.nodes[node_id].running:
            self.stop(node_id)
        self.start([node_id])

    def stop_all(self) -> dict[int, int]:
        """SIGTERM every running node (all at once), then wait for each; their exit codes."""
        running = self.running()
        for i in running:
            proc = self.nodes[i].proc
            assert proc is not None
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        # Only one SIGTERM each: a second one could land after the node's loop closed (its handler gone).
        return {i: self._wait_exit(i, STOP_TIMEOUT_S) for i in running}

    def stop_converged(self, groups: Iterable[str], attempts: int = 3) -> dict[str, dict[int, tuple[int, bytes]]]:
        """Stop every node once each applied every group's commit offset; per group, each node's
        (applied offset, views digest) read from its RocksDB afterwards.

        Stopping nodes together may let the last ones elect a leader whose first entry only they
        apply; then the nodes are started again, converge, and are stopped again (at most `attempts`
        times), so the digests returned are taken at one applied offset per group when possible."""
        groups = list(groups)
        for attempt in range(attempts):
            for group in groups:
                commit = max(g.commit_offset for g in (self.group_status(n, group) for n in self.running()) if g)
                for node in self.running():
                    self.wait_applied(node, group, commit)
            codes = self.stop_all()
            assert set(codes.values()) == {0}, f"exit codes after SIGTERM: {codes}"
            views = {group: {n: self.views_on_disk(n, group) for n in self.nodes} for group in groups}
            if all(len({a for a, _ in v.values()}) == 1 for v in views.values()) or attempt == attempts - 1:
                return views
            self.start()
        raise AssertionError("unreachable")

    def group_dir(self, node_id: int, group: str) -> Path:
        return self.nodes[node_id].data_dir / "groups" / group

    def read_log(self, node_id: int, group: str) -> OfflineLog:
        """Every batch of a stopped node's group log (opened with eventlog.log.Log, recovery included)."""
        assert not self.nodes[node_id].running, f"node {node_id} must be stopped to read its log"
        return read_log_dir(self.group_dir(node_id, group) / "log", self.log_config())

    def log_config(self) -> LogConfig:
        """The nodes' `[log]` config, for opening their group logs offline."""
        return LogConfig(**{**self.log, "preallocate_next_segment": False})  # type: ignore[arg-type]

    def views_on_disk(self, node_id: int, group: str) -> tuple[int, bytes]:
        """(applied offset, digest) of a stopped node's views of `group`, read from its RocksDB."""
        store = ViewStore.open(self.group_dir(node_id, group) / "views")
        try:
            raw = store.meta(APPLIED)
            return (-1 if raw is None else decode_offset(raw)), store.meta(DIGEST) or b""
        finally:
            store.close()

    def on_close(self, stop: Callable[[], None]) -> None:
        """Have `close()` call `stop` first (e.g. a WriteStream's, so no writer outlives a failed test)."""
        self._on_close.append(stop)

    def close(self) -> None:
        """Kill every process still running (by its pid), then stop the proxies. Idempotent; teardown calls it."""
        stops, self._on_close = self._on_close, []
        for stop in stops:
            stop()
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
                try:
                    node.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
        if self.net is not None:
            self.net.close()

    # --- what the nodes say (through the SDK; these block) ----------------------------------------

    def status(self, node_id: int, timeout: float = 2.0) -> p.StatusInfo | None:
        """Node `node_id`'s own status, or None when it does not answer within `timeout`."""
        if not self.nodes[node_id].running:
            return None
        try:
            with Client([self.endpoint(node_id)], timeout=timeout) as client:
                return client.status(self.endpoint(node_id))
        except (EpochlogError, TimeoutError, OSError):
            return None

    def group_status(self, node_id: int, group: str) -> p.GroupInfo | None:
        info = self.status(node_id)
        return None if info is None else next((g for g in info.groups if g.group == group), None)

    def wait_status(self, node_id: int, timeout: float = 15.0) -> p.StatusInfo:
        """Node `node_id`'s own status, asking again while it does not answer: on a loaded machine, or while
        the node applies a long catch-up, one status call can miss its own deadline without anything being
        wrong. AssertionError with the node's stderr tail once `timeout` passes."""
        return self._answer(node_id, lambda: self.status(node_id), timeout, "its status")

    def wait_group_status(self, node_id: int, group: str, timeout: float = 15.0) -> p.GroupInfo:
        """Node `node_id`'s status of `group`, asking again while it does not answer (as `wait_status`)."""
        return self._answer(node_id, lambda: self.group_status(node_id, group), timeout, f"its status of {group}")

    def leader(self, group: str, *, among: Iterable[int] | None = None, timeout: float = 15.0) -> int:
        """Wait until a node of `among` (default: running) says it leads `group`; the one with the highest
        term if several do (an old leader may not know yet)."""
        return self.wait_leader(group, among=among, timeout=timeout).node

    def wait_leader(self, group: str, *, among: Iterable[int] | None = None, min_term: int = 0,
                    timeout: float = 15.0) -> p.GroupInfo:
        """The status of a node of `among` (default: running) that says it leads `group` in a term >=
        `min_term` (the highest such term if several do)."""
        def check() -> p.GroupInfo | None:
            ids = self.running() if among is None else list(among)
            leading = [g for g in (self.group_status(i, group) for i in ids)
                       if g is not None and g.role == "leader" and g.term >= min_term]
            return max(leading, key=lambda g: g.term) if leading else None
        return wait_until(check, timeout, f"a leader of {group} in a term >= {min_term}")

    def move_leader(self, group: str, to: int, timeout: float = 30.0) -> None:
        """Transfer `group`'s leadership to node `to` (asking again until it leads)."""
        with Client(self.endpoints, timeout=20) as client:
            def moved() -> bool:
                if self.leader(group) == to:
                    return True
                try:
                    client.transfer_leader(group, to)
                except EpochlogError:
                    pass
                time.sleep(0.3)
                return self.leader(group) == to
            wait_until(moved, timeout, f"node {to} to lead {group}", interval=0.2)

    def followers(self, group: str) -> list[int]:
        """Running nodes other than `group`'s current leader."""
        leader = self.leader(group)
        return [i for i in self.running() if i != leader]

    def wait_converged(self, group: str, *, nodes: Iterable[int] | None = None,
                       timeout: float = 15.0) -> dict[int, p.GroupInfo]:
        """Wait until `nodes` (default: running) agree on `group`'s leader, term, commit and last offset and
        each applied its whole log; their statuses of that moment."""
        ids = self.running() if nodes is None else list(nodes)
        last: dict[int, p.GroupInfo | None] = {}

        def check() -> dict[int, p.GroupInfo] | None:
            last.clear()
            last.update({i: self.group_status(i, group) for i in ids})
            states = {i: g for i, g in last.items() if g is not None}
            views = {(g.leader, g.term, g.commit_offset, g.applied_offset, g.last_offset) for g in states.values()}
            if len(states) != len(ids) or len(views) != 1:
                return None
            leader, _, commit, applied, last_offset = views.pop()
            return states if leader and commit == applied == last_offset else None
        try:
            return wait_until(check, timeout, f"{group} to converge on nodes {ids}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last states: {last}") from None

    def wait_applied(self, node_id: int, group: str, offset: int, timeout: float = 15.0) -> p.GroupInfo:
        """Wait until node `node_id` applied `group` through `offset` (its own status says so)."""
        def check() -> p.GroupInfo | None:
            g = self.group_status(node_id, group)
            return g if g is not None and g.applied_offset >= offset else None
        return wait_until(check, timeout, f"node {node_id} to apply {group} through offset {offset}")

    def admin_url(self, node_id: int, path: str) -> str:
        """The URL of `path` on node `node_id`'s admin endpoint (https when `[clients.tls]` is on)."""
        tls = self.clients.get("tls")
        scheme = "https" if isinstance(tls, dict) and tls.get("enabled") else "http"
        return f"{scheme}://{self.nodes[node_id].admin_address}{path}"

    def metrics(self, node_id: int, timeout: float = 2.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Node `node_id`'s /metrics as {(family, ((label, value), ...)): value} ({} when it does not answer).
        Over TLS it presents the SDK's credentials of the environment (EPOCHLOG_TLS_*), as the harness's clients."""
        from prometheus_client.parser import text_string_to_metric_families

        from epochlog.client.tls import ClientTls
        url = self.admin_url(node_id, "/metrics")
        tls = ClientTls.from_env() if url.startswith("https") else None
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=None if tls is None else tls.context()) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def wait_metrics(self, node_id: int, timeout: float = 15.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Node `node_id`'s /metrics (as `metrics`), asking again while it does not answer (as `wait_status`)."""
        return self._answer(node_id, lambda: self.metrics(node_id) or None, timeout, "its /metrics")

    def _answer(self, node_id: int, ask: Callable[[], T | None], timeout: float, what: str) -> T:
        try:
            return wait_until(ask, timeout, f"node {node_id} to answer with {what}")
        except AssertionError as e:
            raise AssertionError(f"{e}; its stderr ends:\n{self.nodes[node_id].stderr()[-2000:]}") from None

    def describe(self) -> str:
        """Where to look after a failure: the directory, the seed and each node's stderr tail."""
        parts = [f"cluster dir {self.root} (seed {self.seed})"]
        for i, n in self.nodes.items():
            code = None if n.proc is None else n.proc.poll()
            parts.append(f"--- node {i} incarnation {n.incarnation} pid {n.pid} exit={code} stderr tail:\n"
                         f"{n.stderr()[-1500:]}")
        return "\n".join(parts)


class BackgroundWriter:
    """A daemon thread that writes through the SDK until `stop()`: subclasses implement `_run` and
    loop while `running`."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)
