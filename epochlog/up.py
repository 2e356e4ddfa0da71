"""`epochlog up`: a local cluster in the foreground, with a live status view.

Theory of operation. `make_plan` reads the cluster config. With `--nodes N` other than the config's
member count it writes `<data-dir>/cluster.toml`: the same sections, N members whose ports follow
the config's scheme (port = base + node id for the peer, client and admin addresses, as in
configs/local-3.toml); a config whose addresses follow no such scheme is refused, and so is a node
count other than the one a data directory was created with (membership changes are not available).

`NodeProcess` runs one `python -m epochlog serve --config ... --node-id N --data-dir
<data-dir>/node-N`, stdout and stderr appended to `<data-dir>/node-N.log`, in its own session (a
Ctrl-C in the terminal reaches `up` alone, which then stops the nodes in order) and, on Linux, with a
parent-death signal (if `up` itself is killed, the kernel sends every node SIGTERM). The pids are
recorded in `<data-dir>/up.json`; another `up` on the same directory refuses while they live.

`ClusterView` (no IO: times are arguments) folds each node's status answer into per-group rows:
leader, term, commit and applied offsets, events/s (the rate of the commit offset over the last
`RATE_WINDOW_S`), and each member's lag (the leader's commit offset minus the member's own applied
offset). On a terminal the rows are drawn with rich.live; otherwise one plain line per second.

Only its own nodes. Before any process starts, every address of every member is bind-checked: a port
another process listens on (another cluster, another `up`) is refused in one line (exit 3), so `up`
never shows, loads or stops someone else's cluster. Each node reports in its status the id of its
data directory (epochlog.identity.storage_id, which `up` reads or makes before the start), its pid
and a per-run instance nonce: an answer whose node id, cluster or data directory id is not the
expected one is another cluster's (shown as such, never counted or drawn as this cluster's, and a
problem of the run); an answer from the expected data directory but another pid is this cluster's
node restarted by hand, shown up (and left running at the end: `up` signals only what it started).

Peer TLS (`ensure_certificates`, before any node starts): unless the config says `[cluster.tls]
insecure`, `up` keeps the cluster's CA in `<data-dir>/ca/` and each member's certificate, key and CA
copy where `[cluster.tls]` says (by default `<data-dir>/node-N/tls/`), made when missing and re-issued
when this CA issued them and they expire within 30 days; files the CA did not issue are left to the
node's own check. So a local cluster is mutual TLS without any configuration.

Client TLS (`ensure_client_credentials`): the client faces present the same member certificates
(`[clients.tls]`, on unless the config turns it off), and `up` keeps an admin credential in
`<data-dir>/client/`: a client certificate of the CA for the first of `[clients.access] super_users`,
made once and re-issued like the members', with `credentials.json` and `<data-dir>/client.env` naming
it (epochlog/client/credentials.py says how the CLI and SDK find it). `up`'s own clients (the status
poll, the demo load, the tour, Spark's workers) get it through the SDK's environment variables,
which the nodes do not inherit. Faces configured plaintext get no credential (a stale one is removed).

Stopping (SIGINT, SIGTERM, or the end of `--seconds`): the demo load finishes, then SIGTERM to every
node, a wait of up to `STOP_TIMEOUT_S`, SIGKILL for what is left (a second signal does that at once).
The data stays: the same command resumes the cluster from disk.

Exit codes: 0 the run ended as asked and every node stopped cleanly; 1 a node exited on its own,
start-up elected no leader for some group within `START_TIMEOUT_S`, a node had to be killed, another
cluster's node answered on a member's address, or the demo load or the tour failed; 3 a configuration
problem, an address in use or a data directory that cannot be made (an EpochlogError before any
process starts).

`--tour` (what `make run` runs): once every group has a leader, epochlog.tour walks through what the
cluster is for, one line per step, then the nodes stop; lines fit 80 columns when piped (and
the status line is shortened and printed every TOUR_STATUS_EVERY_S), the live table on a terminal.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventlog.configuration import from_mapping, load_toml
from eventlog import kafka_codes as kc
from eventlog.errors import ConfigError, EpochlogError
from eventlog.raft.runtime.config import (ClusterConfig, MemberConfig, NodeConfigs, load_node_configs,
                                          parse_address)
from epochlog.api import messages as p
from epochlog.client import AsyncClient, ClientError
from epochlog.client.credentials import ENV_FILE_NAME, FILE_NAME, LocalCredentials
from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV
from epochlog.demo_load import DemoLoad, DemoReport
from epochlog.identity import storage_id
from epochlog.ports import address_taken
from epochlog.tour import Tour

if TYPE_CHECKING:
    from epochlog.certs import IssuedFiles
    from epochlog.server import ClientServiceConfig

START_TIMEOUT_S = 60.0      # launch to a leader in every group (2 shared cores, cold imports)
STOP_TIMEOUT_S = 15.0       # SIGTERM to exit, for all nodes together
STATUS_TIMEOUT_S = 1.0      # one node's status call
RATE_WINDOW_S = 5.0         # events/s is the commit offset's rate over this window
LOG_TAIL_LINES = 8
TOUR_STATUS_EVERY_S = 10.0  # piped, with --tour: a short status line this often (the steps say the rest)
SUMMARY_SETTLE_S = 2.0      # the closing summary waits this long at most for a group between two leaders
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# Every address of a member (peer, client, admin, ...): `--nodes` extends each one's port scheme.
ADDRESS_KINDS = tuple(f.name for f in dataclasses.fields(MemberConfig) if f.name.endswith("_address"))
REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class UpError(EpochlogError):
    """`epochlog up` cannot run as asked (the message says why and what to do)."""

    code = "up"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


def default_config() -> Path:
    """configs/local-3.toml of the working directory, else the one shipped next to the package."""
    here = Path("configs/local-3.toml")
    return here if here.exists() else REPO_CONFIGS / "local-3.toml"


# --- the plan: which config, which members, which directories -------------------------------------

@dataclass(frozen=True, slots=True)
class Plan:
    """What `up` runs: the config file the nodes get (given or generated) and where their data lives."""

    config_path: Path
    configs: NodeConfigs
    data_dir: Path
    generated: bool

    @property
    def members(self) -> tuple[MemberConfig, ...]:
        return self.configs.cluster.members

    @property
    def clients(self) -> ClientServiceConfig:
        """`[clients]` with its defaults: TLS and enforcement unless the config turns them off."""
        from epochlog.server import ClientServiceConfig

        return from_mapping(ClientServiceConfig, self.configs.clients, "clients")

    @property
    def record_path(self) -> Path:
        return self.data_dir / "up.json"

    def node_dir(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}"

    def log_path(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}.log"


def make_plan(config_path: Path, nodes: int | None, data_dir: Path) -> Plan:
    """Load and check everything before a process starts; raises ConfigError / UpError."""
    from epochlog.api.routing import REQUIRED_GROUPS
    from epochlog.kafka.config import KafkaServiceConfig
    from epochlog.server import ClientServiceConfig
    from statemachines.store import ViewsConfig

    configs = load_node_configs(config_path)
    from_mapping(ViewsConfig, configs.views, "views")
    clients = from_mapping(ClientServiceConfig, configs.clients, "clients")
    from_mapping(KafkaServiceConfig, configs.kafka, "kafka")
    if clients.access.enforce and not clients.access.super_users:
        raise UpError(f"{config_path}: [clients.access] super_users is empty, so no credential `up` makes "
                      f"could do anything: add super_users = [\"admin\"] (or set [clients.tls] enabled = false "
                      f"for plaintext client faces)")
    missing = [g for g in REQUIRED_GROUPS if g not in configs.cluster.groups]
    if missing:
        raise ConfigError("cluster.groups", list(configs.cluster.groups),
                          f"must include {', '.join(REQUIRED_GROUPS)} (missing {', '.join(missing)})")
    text = None
    if nodes is not None and nodes != len(configs.cluster.members):
        document = scaled_config(load_toml(config_path), configs.cluster.members, nodes, source=config_path)
        cluster = from_mapping(ClusterConfig, document["cluster"], "cluster")
        configs = dataclasses.replace(configs, cluster=cluster)
        text = (f"# Generated by `epochlog up --nodes {nodes}` from {config_path}: the same settings,\n"
                f"# {nodes} members with ports following its scheme (port = base + node id).\n"
                f"# Rewritten by every such run.\n\n" + to_toml(document))
    for m in configs.cluster.members:
        if not m.client_address:
            raise UpError(f"{config_path}: member {m.id} has no client_address; `up` needs one per node "
                          "to show its status")
        for kind in ADDRESS_KINDS:
            address = getattr(m, kind)
            if address and parse_address(address, kind)[0] not in LOCAL_HOSTS:
                raise UpError(f"{config_path}: member {m.id} {kind} {address} is not on this machine; "
                              f"`up` runs a local cluster ({', '.join(LOCAL_HOSTS)})")
    if text is not None:
        config_path = data_dir / "cluster.toml"
    plan = Plan(config_path.resolve(), configs, data_dir, text is not None)
    _check_previous_run(plan)
    if text is not None:
        make_data_dir(data_dir)
        tmp = config_path.with_suffix(".toml.tmp")
        tmp.write_text(text)
        os.replace(tmp, config_path)
    return plan


def scaled_config(raw: Mapping[str, Any], members: Sequence[MemberConfig], nodes: int, *,
                  source: Path) -> dict[str, Any]:
    """The config document `raw` with N members numbered 1..N whose ports follow the scheme of `members`."""
    schemes: dict[str, tuple[str, int]] = {}
    for kind in ADDRESS_KINDS:
        values = [getattr(m, kind) for m in members]
        if not any(values):
            continue
        parsed = [parse_address(v, kind) if v else None for v in values]
        hosts = {a[0] for a in parsed if a is not None}
        bases = {a[1] - m.id for a, m in zip(parsed, members) if a is not None}
        if None in parsed or len(hosts) != 1 or len(bases) != 1:
            raise UpError(f"--nodes {nodes}: the {kind}es of {source} do not follow one scheme "
                          f"(same host, port = base + node id), so `up` cannot extend them; write a config "
                          f"with {nodes} members and pass it with --config")
        base = bases.pop()
        if base + 1 < 1 or base + nodes > 65535:
            raise UpError(f"--nodes {nodes}: {kind} ports {base + 1}..{base + nodes} are out of range")
        schemes[kind] = (hosts.pop(), base)
    data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    cluster = dict(data.get("cluster") or {})
    cluster["members"] = [{"id": i, **{kind: f"{host}:{base + i}" for kind, (host, base) in schemes.items()}}
                          for i in range(1, nodes + 1)]
    data["cluster"] = cluster
    return data


def to_toml(data: Mapping[str, Any]) -> str:
    """TOML for a config document: tables of scalars and lists, sub-tables ([compaction.cleaner]) and
    arrays of tables (cluster.members)."""
    out: list[str] = []
    for name, table in data.items():
        if not isinstance(table, Mapping):
            raise UpError(f"cannot write top-level key {name!r} as a config section")
        _write_table(out, name, table)
    return "\n".join(out).lstrip("\n") + "\n"


def _write_table(out: list[str], name: str, table: Mapping[str, Any]) -> None:
    arrays = {k: v for k, v in table.items() if isinstance(v, list) and v and isinstance(v[0], Mapping)}
    subtables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    out.append(f"\n[{name}]")
    out.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if k not in arrays and k not in subtables)
    for key, items in arrays.items():
        for item in items:
            out.append(f"\n[[{name}.{key}]]")
            out.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
    for key, sub in subtables.items():
        _write_table(out, f"{name}.{key}", sub)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise UpError(f"cannot write {value!r} as a TOML value")


def up_command(plan: Plan) -> tuple[str, str]:
    """The `epochlog up` command line that runs this plan's cluster again (defaults left out), and the
    option the client commands need to reach it ("" for the default config's addresses)."""
    words = ["epochlog up"]
    naming = ""
    if plan.config_path != default_config().resolve():
        naming = f"--config {_relative(plan.config_path)}"
        words.append(naming)
    if plan.data_dir.resolve() != Path("data/local").resolve():
        words.append(f"--data-dir {_relative(plan.data_dir)}")
    return " ".join(words), naming


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def make_data_dir(path: Path) -> None:
    """Create `path` (and its parents) for `up`'s data; UpError (one line) when that is not possible."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UpError(f"cannot use {path} as the data directory: {exc.strerror or exc}") from None


def check_ports(plan: Plan) -> None:
    """UpError (one line) naming the first member address another process listens on."""
    for m in plan.members:
        for kind in ADDRESS_KINDS:
            address = getattr(m, kind)
            why = address_taken(address, kind) if address else None
            if why is not None:
                raise UpError(f"{address} ({kind} of node {m.id}) is {why}: `up` runs only nodes it starts; "
                              f"stop what listens there (another `epochlog up`?) or use --config with other ports")


def _check_previous_run(plan: Plan) -> None:
    try:
        record = json.loads(plan.record_path.read_text())
    except (OSError, ValueError):   # none yet (or no data directory: make_data_dir says why)
        return
    ids = [m.id for m in plan.members]
    recorded = record.get("members") or []
    if recorded and sorted(recorded) != sorted(ids) and any(plan.node_dir(i).exists() for i in recorded):
        raise UpError(f"{plan.data_dir} holds a cluster of nodes {sorted(recorded)}; running nodes {ids} "
                      f"on it would change its membership, which this version cannot do: use another "
                      f"--data-dir (or remove {plan.data_dir})")
    for node_id, node in (record.get("nodes") or {}).items():
        pid = node.get("pid")
        if node.get("running") and isinstance(pid, int) and is_node_process(pid):
            raise UpError(f"node {node_id} of an earlier `epochlog up` on {plan.data_dir} still runs as "
                          f"pid {pid}: stop that `up` first (or `kill {pid}`)")


def is_node_process(pid: int) -> bool:
    """Whether `pid` is a live `epochlog serve` process (not a reused pid, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
        return False
    return b"epochlog" in cmdline and b"serve" in cmdline


# --- node processes -------------------------------------------------------------------------------

def _parent_death_hook() -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to SIGTERM the child when `up` dies (Linux; elsewhere None)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl = libc.prctl
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:   # `up` died before the hook ran
            os._exit(1)

    return hook


@dataclass
class NodeProcess:
    """One `epochlog serve` child. Signalled only through its Popen (its pid); call from `up`'s loop."""

    member: MemberConfig
    plan: Plan
    proc: subprocess.Popen[bytes] | None = None
    stopping: bool = False            # `up` asked it to stop: its exit is expected
    answered: bool = False            # it answered a status call at least once
    answering: bool = False           # it answered the last status call
    reported: bool = False            # its unexpected exit was reported
    log_start: int = 0                # where this incarnation's lines begin in the log
    storage: str = ""                 # the id of its data directory (epochlog.identity.storage_id)
    instance: str = ""                # the run nonce of the process that last answered as this node
    answer_pid: int = 0               # that process's pid (not `pid` after a restart by hand)
    foreign: str = ""                 # what else answered on its client address ("": nothing)
    foreign_reported: bool = False

    @property
    def id(self) -> int:
        return self.member.id

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.plan.log_path(self.id)

    def start(self, hook: Callable[[], None] | None) -> None:
        self.plan.data_dir.mkdir(parents=True, exist_ok=True)
        # Not `up`'s own client credential (use_credentials): a node's clients present its member certificate.
        env = {k: v for k, v in os.environ.items() if k not in (CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV)}
        env["PYTHONUNBUFFERED"] = "1"
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, "-m", "epochlog", "serve", "--config", str(self.plan.config_path),
               "--node-id", str(self.id), "--data-dir", str(self.plan.node_dir(self.id))]
        with self.log_path.open("ab") as log:
            self.log_start = log.tell()
            log.write(f"=== epochlog up {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True, preexec_fn=hook)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def judge(self, status: p.StatusInfo, cluster: str) -> bool:
        """Whether `status` (from this node's client address) comes from this node: its id, cluster and
        data directory. Remembers the answering process, or what answered instead."""
        if (status.node, status.cluster, status.storage) != (self.id, cluster, self.storage):
            self.foreign = (f"node {status.node} of cluster {status.cluster!r} (pid {status.pid or '?'}, data "
                            f"directory id {status.storage[:8] or '?'}) answers at {self.member.client_address}")
            return False
        self.foreign = ""
        self.instance, self.answer_pid = status.instance, status.pid
        return True

    @property
    def by_hand(self) -> bool:
        """It answers from a process `up` did not start (restarted by hand on its data directory)."""
        return self.answering and self.answer_pid != self.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last lines of the node's log (stdout and stderr)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(self.log_start, f.tell() - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def state(self) -> str:
        code = self.exit_code()
        if self.proc is None:
            return "not started"
        if self.by_hand:
            return "up"
        if code is not None:
            return f"{'stopped' if self.stopping else 'down'} ({describe_exit(code)})"
        if self.stopping:
            return "stopping"
        if self.answering:
            return "up"
        if self.foreign:
            return "another cluster's node answers"
        return "not answering" if self.answered else "starting"

    def process(self) -> str:
        """`pid N, instance X` of what answers as this node (`by hand` when `up` did not start it)."""
        if self.answering:
            return f"pid {self.answer_pid}{' (by hand)' if self.by_hand else ''}, instance {self.instance[:8]}"
        return f"pid {self.pid}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def describe_exit(code: int) -> str:
    """`exit code 2`, or `killed by SIGKILL` for a process a signal ended (Popen's negative codes)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def write_record(plan: Plan, nodes: Sequence[NodeProcess]) -> None:
    """`<data-dir>/up.json`: config, members, and each node's pid and state (for tools and tests)."""
    record = {
        "config": str(plan.config_path),
        "members": [n.id for n in nodes],
        "up_pid": os.getpid(),
        "nodes": {str(n.id): {"pid": n.pid, "running": n.running, "exit_code": n.exit_code(),
                              "instance": n.instance, "answer_pid": n.answer_pid, "by_hand": n.by_hand,
                              "client_address": n.member.client_address,
                              "admin_address": n.member.admin_address,
                              "log": str(n.log_path.resolve()),
                              "data_dir": str(plan.node_dir(n.id).resolve())}
                  for n in nodes},
    }
    tmp = plan.record_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, plan.record_path)


# --- the view: per-group rows from status answers (no IO) -----------------------------------------

@dataclass(frozen=True, slots=True)
class MemberLag:
    id: int
    role: str            # voter | learner
    lag: int | None      # leader commit minus the member's applied offset; None: no answer


@dataclass(frozen=True, slots=True)
class GroupRow:
    name: str
    leader: int | None
    term: int
    commit: int
    applied: int
    events_per_s: float
    members: tuple[MemberLag, ...]

    def lags(self) -> str:
        return ", ".join(f"{m.id}{'' if m.role == 'voter' else ' (learner)'} "
                         f"{'down' if m.lag is None else f'lag {m.lag}'}" for m in self.members)


class ClusterView:
    """The latest status answer of every node, and each group's commit offset over time.

    Call `observe` with the answers of one polling round (None for a node that did not answer).
    """

    def __init__(self, groups: Sequence[str], member_ids: Sequence[int],
                 window_s: float = RATE_WINDOW_S) -> None:
        self.groups = list(groups)
        self.member_ids = list(member_ids)
        self.window_s = window_s
        self.latest: dict[int, p.StatusInfo | None] = {i: None for i in member_ids}
        self._commits: dict[str, collections.deque[tuple[float, int]]] = {
            g: collections.deque() for g in groups}

    def observe(self, now: float, answers: Mapping[int, p.StatusInfo | None]) -> None:
        self.latest.update(answers)
        for row in self.rows():
            if row.leader is None:
                continue
            samples = self._commits[row.name]
            samples.append((now, row.commit))
            while len(samples) > 2 and samples[1][0] <= now - self.window_s:
                samples.popleft()

    def _infos(self, group: str) -> dict[int, p.GroupInfo]:
        infos = {}
        for node_id, status in self.latest.items():
            if status is not None:
                for g in status.groups:
                    if g.group == group:
                        infos[node_id] = g
        return infos

    def rows(self) -> list[GroupRow]:
        rows = []
        for group in self.groups:
            infos = self._infos(group)
            leaders = [g for g in infos.values() if g.role == "leader"]
            leader = max(leaders, key=lambda g: g.term) if leaders else None
            term = max((g.term for g in infos.values()), default=0)
            if leader is not None:
                commit, applied = leader.commit_offset, leader.applied_offset
                peers = [(x.id, x.role) for x in leader.peers]
            else:   # no leader known: the most any node has seen
                commit = max((g.commit_offset for g in infos.values()), default=-1)
                applied = max((g.applied_offset for g in infos.values()), default=-1)
                peers = [(i, "voter") for i in self.member_ids]
            members = tuple(MemberLag(i, role, max(0, commit - infos[i].applied_offset) if i in infos
                                      else None) for i, role in peers)
            rows.append(GroupRow(group, leader.node if leader else None, term, commit, applied,
                                 self._rate(group), members))
        return rows

    def _rate(self, group: str) -> float:
        samples = self._commits[group]
        if len(samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return max(0.0, (c1 - c0) / (t1 - t0)) if t1 > t0 else 0.0

    def all_led(self) -> bool:
        return all(row.leader is not None for row in self.rows())


# --- rendering ------------------------------------------------------------------------------------

def plain_line(elapsed: float, nodes: Sequence[NodeProcess], rows: Sequence[GroupRow]) -> str:
    up = sum(1 for n in nodes if n.state() == "up")
    parts = [f"[{elapsed:6.1f}s] nodes {up}/{len(nodes)} up"]
    parts += [f"{n.id} {n.state()}" for n in nodes if n.state() != "up"]
    parts += [f"{n.id} up by hand (pid {n.answer_pid})" for n in nodes if n.by_hand]
    for r in rows:
        lags = " ".join(f"{m.id}:{'down' if m.lag is None else m.lag}" for m in r.members)
        parts.append(f"{r.name}: leader {r.leader or '-'} term {r.term} commit {r.commit} "
                     f"applied {r.applied} {r.events_per_s:.1f} ev/s lag {lags}")
    return " | ".join(parts)


def short_line(elapsed: float, nodes: Sequence[NodeProcess], rows: Sequence[GroupRow]) -> str:
    """The status in at most 80 columns (the tour's piped output): nodes up, leaders, kv's rate."""
    up = sum(1 for n in nodes if n.state() == "up")
    leaders = " ".join(f"{r.name} {r.leader or '-'}" for r in rows)
    kv = next((r for r in rows if r.name == "kv"), None)
    rate = f"; kv {kv.events_per_s:.0f} ev/s" if kv is not None else ""
    return f"[{elapsed:5.1f}s] {up}/{len(nodes)} up; leaders: {leaders}{rate}"[:80]


def summary_lines(elapsed: float, cluster: str, nodes: Sequence[NodeProcess],
                  rows: Sequence[GroupRow]) -> list[str]:
    lines = [f"status after {elapsed:.1f} s, cluster {cluster!r}, {_count(len(nodes), 'node')}:"]
    for n in nodes:
        lines.append(f"  node {n.id}: {n.state()}, {n.process()}, client {n.member.client_address}, "
                     f"admin {n.member.admin_address or '-'}, log {n.log_path}")
    for r in rows:
        lines.append(f"  group {r.name}: leader {r.leader or '-'}, term {r.term}, commit {r.commit}, "
                     f"applied {r.applied}, {r.events_per_s:.1f} events/s, members {r.lags()}")
    return lines


def live_view(title: str, elapsed: float, nodes: Sequence[NodeProcess], rows: Sequence[GroupRow]) -> Any:
    from rich import box
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    leads: dict[int, list[str]] = collections.defaultdict(list)
    for r in rows:
        if r.leader is not None:
            leads[r.leader].append(r.name)
    node_table = Table(box=box.SIMPLE_HEAD, title="nodes", title_justify="left")
    for column in ("node", "state", "pid", "instance", "client", "admin", "leads"):
        node_table.add_column(column)
    for n in nodes:
        state = n.state()
        style = "green" if state == "up" else "yellow" if state in ("starting", "stopping") else "red"
        pid = (f"{n.answer_pid} (by hand)" if n.by_hand else str(n.answer_pid)) if n.answering else str(n.pid or "-")
        node_table.add_row(str(n.id), Text(state, style=style), pid, n.instance[:8] if n.answering else "-",
                           n.member.client_address, n.member.admin_address or "-",
                           ", ".join(leads.get(n.id, [])) or "-")
    group_table = Table(box=box.SIMPLE_HEAD, title="groups", title_justify="left")
    for column, justify in (("group", "left"), ("leader", "right"), ("term", "right"), ("commit", "right"),
                            ("applied", "right"), ("events/s", "right"), ("members (lag)", "left")):
        group_table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        members = Text()
        for i, m in enumerate(r.members):
            if i:
                members.append("  ")
            label = f"{m.id}{'*' if m.id == r.leader else ''}{'' if m.role == 'voter' else '(l)'} "
            members.append(label)
            members.append("down" if m.lag is None else str(m.lag), style="red" if m.lag is None else
                           "green" if m.lag == 0 else "yellow")
        leader = Text(str(r.leader), style="") if r.leader else Text("none", style="red")
        group_table.add_row(r.name, leader, str(r.term), str(r.commit), str(r.applied),
                            f"{r.events_per_s:.1f}", members)
    parts: list[Any] = [Text(f"{title}   {elapsed:.1f} s   (Ctrl-C stops every node)", style="bold"),
                        node_table, group_table]
    for n in nodes:
        if n.exit_code() is not None and not n.stopping and not n.by_hand:
            title = f"node {n.id} is down ({describe_exit(n.exit_code() or 0)}): last lines of {n.log_path}"
            parts.append(Panel("\n".join(n.tail()) or "(empty)", title=title, border_style="red"))
    return Group(*parts)


# --- the run --------------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int = 0
    reasons: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.code = 1
        self.reasons.append(reason)


def _member_files(plan: Plan, node_id: int) -> list[IssuedFiles]:
    """Where node `node_id` reads its certificate: [cluster.tls] unless insecure, [clients.tls] when
    enabled (the same files by default)."""
    from epochlog.certs import IssuedFiles

    node_dir = plan.node_dir(node_id)
    out: list[IssuedFiles] = []
    peer = plan.configs.cluster.tls
    if not peer.insecure:
        out.append(IssuedFiles(peer.path("cert_file", node_dir), peer.path("key_file", node_dir),
                               peer.path("ca_file", node_dir)))
    faces = plan.clients.tls
    if faces.enabled:
        def path(name: str) -> Path:
            return Path(name) if Path(name).is_absolute() else node_dir / name
        files = IssuedFiles(path(faces.cert_file), path(faces.key_file), path(faces.ca_file))
        if files not in out:
            out.append(files)
    return out


def ensure_certificates(plan: Plan) -> list[str]:
    """The local cluster's CA and member certificates (see the module docstring); what was made."""
    from epochlog.certs import ClusterCA, load_certificate

    layouts = {m.id: _member_files(plan, m.id) for m in plan.members}
    if not any(layouts.values()):
        return []
    ca_dir = plan.data_dir / "ca"
    made = [] if (ca_dir / "ca.crt").exists() else [f"the cluster CA in {ca_dir}"]
    ca = ClusterCA.load_or_create(ca_dir, plan.configs.cluster.name)
    for node_id, layout in layouts.items():
        for files in layout:
            if ca.member_is_current(node_id, files):
                continue
            if files.cert.exists() and not ca.issued(load_certificate(files.cert)):
                continue   # not ours: the node checks it at start
            ca.issue_member_files(node_id, files)
            made.append(f"node {node_id}'s certificate {files.cert}")
    return made


def ensure_client_credentials(plan: Plan) -> tuple[LocalCredentials | None, bool]:
    """The admin credential of a cluster whose faces speak TLS (see the module docstring), and whether it
    was made now; (None, False) for plaintext faces, whose stale credentials file is removed (a client
    would otherwise speak TLS to them)."""
    from epochlog.certs import ClusterCA, IssuedFiles

    directory = plan.data_dir / "client"
    clients = plan.clients
    if not clients.tls.enabled:
        (directory / FILE_NAME).unlink(missing_ok=True)
        (plan.data_dir / ENV_FILE_NAME).unlink(missing_ok=True)
        return None, False
    supers = clients.access.super_users
    name = supers[0] if supers else "admin"   # none: enforcement is off (make_plan refuses it on)
    ca = ClusterCA.load(plan.data_dir / "ca")   # ensure_certificates made it
    files = IssuedFiles(directory / f"{name}.crt", directory / f"{name}.key", directory / "ca.crt")
    made = not ca.client_is_current(name, files)
    if made:
        ca.issue_client(name, directory)
    members = plan.members
    found = LocalCredentials(plan.configs.cluster.name, name,
                             tuple(m.client_address for m in members if m.client_address),
                             tuple(m.kafka_address for m in members if m.kafka_address),
                             files.ca.resolve(), files.cert.resolve(), files.key.resolve())
    found.write(directory)   # every run: the addresses may have changed, and the newest file wins
    return found, made


def use_credentials(found: LocalCredentials | None) -> None:
    """Make `found` the credential of this process's own clients (the status poll, the demo load, the
    tour, and what they start: Spark's workers inherit it), through the SDK's variables."""
    for var in (CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV):
        os.environ.pop(var, None)
    if found is not None:
        os.environ.update(found.environment())


def found_by_clients(found: LocalCredentials) -> bool:
    """Whether a client given this cluster's addresses finds `found` with nothing set
    (epochlog/client/credentials.py: it is where the search looks, and the newest there)."""
    from epochlog.client.credentials import find

    match = find(found.client_addresses)
    return match is not None and match.cert_file == found.cert_file


def up(config_path: Path, *, nodes: int | None, data_dir: Path, seconds: float | None, demo_load: bool,
       live: bool | None = None, tour: bool = False) -> int:
    """Run the cluster until a signal (or `seconds` after every group has a leader, or the end of the
    tour); the exit code."""
    plan = make_plan(config_path, nodes, data_dir)
    make_data_dir(plan.data_dir)
    check_ports(plan)
    made = ensure_certificates(plan)
    if made and tour:
        print(f"peer TLS: made the cluster CA and {_count(len(made) - 1, 'member certificate')} "
              f"in {plan.data_dir}", flush=True)
    elif made:
        print(f"peer TLS: made {', '.join(made)}", flush=True)
    elif plan.configs.cluster.tls.insecure:
        print("peer TLS is OFF ([cluster.tls] insecure = true): the nodes log a warning", flush=True)
    credential, made_now = ensure_client_credentials(plan)
    use_credentials(credential)
    if credential is None:
        print("client faces are PLAINTEXT ([clients.tls] enabled = false): no authentication", flush=True)
    elif made_now:
        print(f"client TLS: made {credential.principal}'s certificate in {_relative(plan.data_dir / 'client')}",
              flush=True)
    if credential is not None and not found_by_clients(credential):
        print(f"client TLS: in another shell, `source {_relative(plan.data_dir / ENV_FILE_NAME)}` first "
              f"(the CLI and SDK look in data/*/client/ only)", flush=True)
    return asyncio.run(_run(plan, seconds=seconds, demo_load=demo_load, tour=tour,
                            live=sys.stdout.isatty() if live is None else live))


async def _run(plan: Plan, *, seconds: float | None, demo_load: bool, live: bool, tour: bool = False) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    force = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    nodes = [NodeProcess(m, plan, storage=storage_id(plan.node_dir(m.id))) for m in plan.members]
    guide = Tour(plan.members, plan.data_dir) if tour else None
    outcome = Outcome()
    began = time.monotonic()
    view = ClusterView(plan.configs.cluster.groups, [n.id for n in nodes])
    title = (f"epochlog up: cluster {plan.configs.cluster.name!r}, {_count(len(nodes), 'node')}, "
             f"data {plan.data_dir}, config {plan.config_path}")
    try:
        if plan.generated:
            print(f"generated {plan.config_path} for {len(nodes)} nodes", flush=True)
        hook = _parent_death_hook()
        # Every child is forked here, before any thread exists (preexec_fn is unsafe with threads).
        for n in nodes:
            n.start(hook)
        write_record(plan, nodes)
        if tour:
            print(f"epochlog up: {_count(len(nodes), 'node')} of cluster {plan.configs.cluster.name!r} "
                  f"(pids {', '.join(str(n.pid) for n in nodes)})", flush=True)
            print(f"their data and logs (node-N.log) are in {plan.data_dir}", flush=True)
        else:
            print(title, flush=True)
            for n in nodes:
                print(f"node {n.id}: pid {n.pid}, client {n.member.client_address}, "
                      f"admin {n.member.admin_address or '-'}, log {n.log_path}", flush=True)
        client = AsyncClient([n.member.client_address for n in nodes], timeout=STATUS_TIMEOUT_S,
                             name="epochlog-up")
        try:
            await _watch_cluster(nodes, view, client, stop, force, outcome, seconds=seconds,
                                 demo_load=demo_load, live=live, title=title, began=began, plan=plan,
                                 tour=guide)
        finally:
            await client.close()
        if not tour:
            for line in summary_lines(time.monotonic() - began, plan.configs.cluster.name, nodes, view.rows()):
                print(line, flush=True)
    finally:
        await _stop_nodes(nodes, force, outcome)
        write_record(plan, nodes)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    for reason in outcome.reasons:
        print(f"problem: {reason}", flush=True)
    verdict = "stopped cleanly" if outcome.code == 0 else "stopped with problems"
    if guide is not None:
        print(f"epochlog up: {verdict}; the data stays in {plan.data_dir}", flush=True)
        if outcome.code == 0:
            for line in guide.next_steps(*up_command(plan)):
                print(line, flush=True)
    else:
        print(f"epochlog up: {verdict}; the data stays in {plan.data_dir} (run the same command to resume)",
              flush=True)
    return outcome.code


async def _watch_cluster(nodes: list[NodeProcess], view: ClusterView, client: AsyncClient,
                         stop: asyncio.Event, force: asyncio.Event, outcome: Outcome, *,
                         seconds: float | None, demo_load: bool, live: bool, title: str, began: float,
                         plan: Plan, tour: Tour | None = None) -> None:
    """Poll, draw and (when bounded) decide when to stop; returns once the nodes should stop."""
    from contextlib import nullcontext

    from rich.console import Console
    from rich.live import Live

    console = Console()
    say: Callable[[str], None] = console.print if live else (lambda text: print(text, flush=True))
    interval = 0.5 if live else 1.0
    ready_at: float | None = None
    load_task: asyncio.Task[DemoReport] | None = None
    load_report: DemoReport | None = None
    load_failed = False
    load_stop = asyncio.Event()
    tour_task: asyncio.Task[Any] | None = None
    last_short = -TOUR_STATUS_EVERY_S
    cluster = plan.configs.cluster.name
    display = Live(console=console, auto_refresh=False) if live else nullcontext()
    with display as shown:
        while True:
            now = time.monotonic()
            answers = await _poll(client, nodes, cluster)
            view.observe(now, answers)
            rows = view.rows()
            for n in nodes:
                if n.foreign and not n.foreign_reported:
                    n.foreign_reported = True
                    outcome.fail(f"not this cluster's: {n.foreign} (its answers are ignored)")
                    say(f"node {n.id}: another cluster's {n.foreign}: ignored, not shown as node {n.id}")
                if n.exit_code() is not None and not n.stopping and not n.reported:
                    n.reported = True
                    why = describe_exit(n.exit_code() or 0)
                    outcome.fail(f"node {n.id} (pid {n.pid}) went down on its own ({why})")
                    if not live:
                        say(f"node {n.id} (pid {n.pid}) is down ({why}); last lines of {n.log_path}:")
                        for line in n.tail():
                            say(f"    {line}")
            if live:
                assert isinstance(shown, Live)
                shown.update(live_view(title, now - began, nodes, rows), refresh=True)
            elif tour is None:
                say(plain_line(now - began, nodes, rows))
            elif now - last_short >= TOUR_STATUS_EVERY_S:
                last_short = now
                say(short_line(now - began, nodes, rows))
            if ready_at is None and view.all_led():
                ready_at = now
                say(f"every group has a leader after {now - began:.1f} s")
                if tour is not None:
                    tour_task = asyncio.get_running_loop().create_task(tour.run(say))
                elif demo_load:
                    load = DemoLoad([n.member.client_address for n in nodes], say)
                    load_report = load.report
                    load_task = asyncio.get_running_loop().create_task(load.run(load_stop))
            if load_task is not None and load_task.done() and not load_failed and load_task.exception():
                load_failed = True   # the nodes go on; the load's failure is worth seeing now
                say(f"demo load failed: {load_task.exception()!r}")
                outcome.fail(f"demo load failed: {load_task.exception()!r}")
            if tour_task is not None and tour_task.done():
                if tour_task.cancelled() or tour_task.exception() is not None:
                    why = "cancelled" if tour_task.cancelled() else repr(tour_task.exception())
                    say(f"the tour failed: {why}"[:80])
                    outcome.fail(f"the tour failed: {why}")
                else:
                    for problem in tour_task.result().problems():
                        outcome.fail(problem)
                break
            if stop.is_set():
                break
            if ready_at is None and now - began > START_TIMEOUT_S:
                leaderless = [r.name for r in rows if r.leader is None]
                outcome.fail(f"no leader for {', '.join(leaderless)} within {START_TIMEOUT_S:.0f} s "
                             "of the launch")
                break
            if seconds is not None and ready_at is not None and now - ready_at >= seconds:
                break
            if all(n.exit_code() is not None for n in nodes):
                outcome.fail("every node exited")
                break
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - now)))
            except TimeoutError:
                pass
        if tour_task is not None and not tour_task.done():
            # Ctrl-C in the middle: the tour stops its brokers, consumer and load (a second one cuts it short).
            tour_task.cancel()
            forced = asyncio.ensure_future(force.wait())
            await asyncio.wait({tour_task, forced}, timeout=30.0, return_when=asyncio.FIRST_COMPLETED)
            forced.cancel()
            say("the tour was stopped before its end")
        if load_task is not None:
            # The load finishes its round and reports before the nodes stop (a second signal cuts it short).
            load_stop.set()
            forced = asyncio.ensure_future(force.wait())
            done, _ = await asyncio.wait({load_task, forced}, timeout=15.0,
                                         return_when=asyncio.FIRST_COMPLETED)
            forced.cancel()
            if load_task not in done:
                load_task.cancel()
                await asyncio.gather(load_task, return_exceptions=True)
                say("demo load cancelled (it did not finish within 15 s, or a second signal came)")
            elif load_task.exception() is not None and not load_failed:
                say(f"demo load failed: {load_task.exception()!r}")
                outcome.fail(f"demo load failed: {load_task.exception()!r}")
            elif load_task.exception() is None and load_report is not None:
                for problem in load_report.problems():
                    outcome.fail(problem)
        if tour is None and not force.is_set():
            await _settle(view, client, nodes, cluster, SUMMARY_SETTLE_S)   # the summary shows what the load wrote


async def _settle(view: ClusterView, client: AsyncClient, nodes: Sequence[NodeProcess], cluster: str,
                  within_s: float) -> None:
    """Poll again until every group has a leader, for at most `within_s`: a leadership move (leader
    balance's transfers come a couple of seconds after a start) leaves a group without one for an
    election, and the summary would show that moment as `leader -`."""
    deadline = time.monotonic() + within_s
    while True:
        view.observe(time.monotonic(), await _poll(client, nodes, cluster))
        if view.all_led() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.1)


async def _poll(client: AsyncClient, nodes: Sequence[NodeProcess], cluster: str
                ) -> dict[int, p.StatusInfo | None]:
    """Each node's status, None for a node that did not answer or whose address another cluster's node
    answers on (NodeProcess.judge); a node restarted by hand after its process ended is asked too."""
    async def one(n: NodeProcess) -> p.StatusInfo | None:
        n.answering = False
        if n.proc is None or (n.stopping and not n.running):
            return None
        try:
            status: p.StatusInfo = await asyncio.wait_for(client.status(n.member.client_address),
                                                          STATUS_TIMEOUT_S + 0.5)
        except (ClientError, OSError, TimeoutError):
            return None
        if not n.judge(status, cluster):
            return None
        n.answered = n.answering = True
        return status

    results = await asyncio.gather(*(one(n) for n in nodes))
    return {n.id: r for n, r in zip(nodes, results)}


async def _stop_nodes(nodes: Sequence[NodeProcess], force: asyncio.Event, outcome: Outcome) -> None:
    """SIGTERM every running node, wait (up to STOP_TIMEOUT_S, or until a second signal), SIGKILL the rest."""
    running = [n for n in nodes if n.running]
    if running:
        print(f"stopping {_count(len(running), 'node')} (SIGTERM)...", flush=True)
    for n in nodes:
        n.stopping = n.stopping or n.running
        n.signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(n.running for n in nodes) and time.monotonic() < deadline and not force.is_set():
        await asyncio.sleep(0.05)
    killed = set()
    for n in nodes:
        if n.running:
            n.signal(signal.SIGKILL)
            killed.add(n.id)
            outcome.fail(f"node {n.id} (pid {n.pid}) did not stop on SIGTERM within {STOP_TIMEOUT_S:.0f} s: "
                         "killed")
    for n in nodes:
        if n.proc is not None:
            n.proc.wait()
    for n in running:
        code = n.exit_code() or 0
        print(f"node {n.id} (pid {n.pid}): stopped, {describe_exit(code)}", flush=True)
        # -SIGTERM: the signal came before the node had installed its handler (still starting).
        if code not in (0, -signal.SIGTERM) and n.id not in killed:
            outcome.fail(f"node {n.id} stopped with {describe_exit(code)}; see {n.log_path}")
    for n in nodes:
        if n.by_hand:
            print(f"node {n.id} runs as pid {n.answer_pid}, started by hand: left running", flush=True)
    for n in nodes:   # went down between the last poll and the stop
        if n.proc is not None and not n.stopping and not n.reported:
            n.reported = True
            why = describe_exit(n.exit_code() or 0)
            outcome.fail(f"node {n.id} (pid {n.pid}) went down on its own ({why})")
