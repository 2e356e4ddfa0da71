"""The client commands of the `epochlog` command line: talk to a running cluster through the SDK.

Every command names the cluster with `--endpoints host:port,...`, `--config FILE` (the client
address of every member of a cluster config such as configs/local-3.toml) or the environment
variable EPOCHLOG_ENDPOINTS, in that order of precedence; with none of them, the client addresses of
the config `epochlog up` runs by default (configs/local-3.toml: 127.0.0.1:7201-7203), and an error
that says so when nothing answers there.
Credentials for a cluster whose faces speak TLS (docs/security.md): `--tls-ca`, `--cert`, `--key` and
`--token` on every client command, with the SDK's meaning and environment variables (EPOCHLOG_TLS_CA,
EPOCHLOG_TLS_CERT, EPOCHLOG_TLS_KEY, EPOCHLOG_TOKEN; an option wins over its variable).
Output is a plain table for people, or with `--json` one JSON document (one per line for the
streaming commands) whose field names are stable: docs/cli.md lists them.

Keys are written one way on every command (epochlog/api/routing.py): `app/x` is a kv entry,
`topic/orders`, `broker/...`, `lease/...` other entities (watch and txn --if take both); `kv/app/x`
and kv names starting with an entity kind are refused, naming the spelling to use. Values are given as UTF-8 text (or base64
with `--base64`, or `-` for stdin) and printed as UTF-8 when they decode to printable text, else
as base64 with `encoding: "base64"`. A write prints the offset it committed at (a read-your-writes
token for `get --consistency local --min-offset`). Errors are EpochlogErrors: `error: <message>`,
exit 3; a rejected compare-and-set is one too, its message starting with the reason
(version_mismatch...). Ctrl-C ends `watch`, `events tail --follow` and `lease keep-alive` with exit 0.
`status` exits 1 when a member does not answer (after printing what the others said).

Lease ids are printed in hex (`0x3da0cc191a4c29fb`) and accepted in hex (with or without `0x`, as
etcdctl prints them) or decimal (`LEASE_ID`): digits only is decimal, anything with a-f is hex.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from epochlog.api import messages as p
from epochlog.client import (AsyncClient, ClientError, DeadlineExceededError, InvalidArgumentError, KeyValue,
                             NotFoundError, UnavailableError, WatchedEvent)
from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, ClientTls
from statemachines import events as ev
from statemachines.state import KvState

T = TypeVar("T")

ENDPOINTS_ENV = "EPOCHLOG_ENDPOINTS"
DEFAULT_TIMEOUT_S = 10.0
FOLLOW_POLL_S = 0.2
STOP_GRACE_S = 2.0     # how long a stream may take to wind down after Ctrl-C


# --- naming the cluster ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Target:
    """The cluster a command talks to, and how long each call may take."""

    endpoints: tuple[str, ...]
    timeout: float
    as_json: bool
    default_from: Path | None = None   # no cluster was named: these are this config's addresses
    tls: ClientTls | None = None       # None: the SDK reads the environment
    token: str | None = None           # None: the SDK reads the environment

    @classmethod
    def resolve(cls, endpoints: str | None, config_path: Path | None, timeout: float, as_json: bool) -> Target:
        """--endpoints, else --config, else $EPOCHLOG_ENDPOINTS, else `epochlog up`'s default config."""
        from eventlog.configuration import parse_address

        if endpoints and config_path is not None:
            raise click.UsageError("give the cluster with --endpoints or --config, not both")
        source = "--endpoints"
        if not endpoints and config_path is not None:
            from eventlog.raft.runtime.config import load_node_configs

            members = load_node_configs(config_path).cluster.members
            listed = [m.client_address for m in members if m.client_address]
            if not listed:
                raise click.UsageError(f"{config_path}: no member has a client_address")
            return cls(tuple(listed), timeout, as_json)
        if not endpoints:
            endpoints, source = os.environ.get(ENDPOINTS_ENV, ""), ENDPOINTS_ENV
        listed = [e.strip() for e in (endpoints or "").split(",") if e.strip()]
        if not listed and source == ENDPOINTS_ENV and ENDPOINTS_ENV not in os.environ:
            from epochlog.up import default_config
            from eventlog.raft.runtime.config import load_node_configs

            default = default_config()
            members = load_node_configs(default).cluster.members
            return cls(tuple(m.client_address for m in members if m.client_address), timeout, as_json, default)
        if not listed:
            raise click.UsageError(f"no cluster given: pass --endpoints host:port,..., --config FILE "
                                   f"or set {ENDPOINTS_ENV}")
        for address in listed:
            try:
                parse_address(address, source)
            except Exception as exc:
                raise click.UsageError(f"{source}: {address!r} is not host:port ({exc})") from None
        return cls(tuple(listed), timeout, as_json)

    def with_credentials(self, tls_ca: Path | None, cert: Path | None, key: Path | None, token: str | None) -> Target:
        """This target with the credential options (click has already put their variables in their place)."""
        if (cert is None) != (key is None):
            raise click.UsageError("give --cert and --key together")
        if cert is not None and tls_ca is None:
            raise click.UsageError(f"--cert needs --tls-ca (or {CA_ENV}): the CA that verifies the nodes")
        tls = None if tls_ca is None else ClientTls(str(tls_ca), None if cert is None else str(cert),
                                                    None if key is None else str(key))
        return replace(self, tls=tls, token=token)

    def client(self) -> AsyncClient:
        return AsyncClient(list(self.endpoints), timeout=self.timeout, name="epochlog-cli", sessions=False,
                           tls=self.tls, token=self.token)

    def run(self, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
        """Run `body` with a client of the cluster on a fresh event loop; the client is closed after."""
        async def main() -> T:
            async with self.client() as client:
                try:
                    return await body(client)
                except TimeoutError:   # a call straight to one node (status, snapshot --node) got no reply
                    raise DeadlineExceededError(f"no reply within {self.timeout:.1f} s") from None
        with self._explained():
            return asyncio.run(main())

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        """With the default endpoints, an unreachable cluster's error says which were tried and how to
        name another."""
        try:
            yield
        except (UnavailableError, DeadlineExceededError) as exc:
            if self.default_from is None:
                raise
            raise type(exc)(f"{exc} (no cluster named: tried {', '.join(self.endpoints)}, the addresses of "
                            f"{self.default_from}, which `epochlog up` runs; name another with --endpoints, "
                            f"--config or {ENDPOINTS_ENV})") from None

    def stream(self, body: Callable[[AsyncClient, asyncio.Event], Awaitable[None]]) -> None:
        """Run a streaming `body(client, stop)` until it returns or Ctrl-C sets `stop` (then exit 0).

        Ctrl-C is the way a stream is meant to end, so it is a signal handler setting `stop`, which the
        body checks between events, rather than asyncio.run's cancellation of the main task: a
        cancellation can be lost (asyncio.wait_for before Python 3.12 may swallow one that races with
        a reply), which would leave the stream running; one such hang was seen in testing."""
        async def main() -> None:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            loop.add_signal_handler(signal.SIGINT, stop.set)
            try:
                async with self.client() as client:
                    work = asyncio.ensure_future(body(client, stop))
                    stopped = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    stopped.cancel()
                    if not work.done():   # blocked waiting for an event: nothing to lose by cancelling
                        work.cancel()
                        await asyncio.wait({work}, timeout=STOP_GRACE_S)
                    elif not work.cancelled():
                        work.result()     # its error, if any
            finally:
                loop.remove_signal_handler(signal.SIGINT)
        try:
            with self._explained():
                asyncio.run(main())
        except BrokenPipeError:           # e.g. `| head`: the reader is gone, nothing more to say
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush is silent

    def emit(self, document: Any, human: Callable[[], None]) -> None:
        """Print `document` as one line of JSON with --json, else call `human`."""
        if self.as_json:
            click.echo(json.dumps(document))
        else:
            human()


def _cluster_command(group: click.Group, name: str,
                     **settings: Any) -> Callable[[Callable[..., None]], click.Command]:
    """A command of `group` with the cluster options; the function receives `target: Target` instead."""
    def decorate(f: Callable[..., None]) -> click.Command:
        @functools.wraps(f)
        def command(endpoints: str | None, config_path: Path | None, timeout: float, as_json: bool,
                    tls_ca: Path | None, client_cert: Path | None, client_key: Path | None,
                    bearer_token: str | None, **kwargs: Any) -> None:
            target = Target.resolve(endpoints, config_path, timeout, as_json)
            f(target.with_credentials(tls_ca, client_cert, client_key, bearer_token), **kwargs)

        for option in reversed(_CLUSTER_OPTIONS):
            command = option(command)
        return group.command(name, **settings)(command)
    return decorate


_CLUSTER_OPTIONS = [
    click.option("--endpoints", metavar="HOST:PORT,...",
                 help=f"Client addresses of some nodes of the cluster [env {ENDPOINTS_ENV}]."),
    click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="A cluster config (e.g. configs/local-3.toml): use every member's client_address."),
    click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True,
                 help="Seconds each call may take, retries and leader changes included."),
    click.option("--json", "as_json", is_flag=True,
                 help="Print JSON (field names are stable) instead of a table."),
    click.option("--tls-ca", "tls_ca", envvar=CA_ENV, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help=f"Speak TLS, verifying the nodes against this CA (the cluster's ca.crt) [env {CA_ENV}]."),
    click.option("--cert", "client_cert", envvar=CERT_ENV, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help=f"A client certificate of the CA: the principal is its name [env {CERT_ENV}]."),
    click.option("--key", "client_key", envvar=KEY_ENV, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help=f"The client certificate's private key [env {KEY_ENV}]."),
    click.option("--token", "bearer_token", envvar=TOKEN_ENV, metavar="TOKEN",
                 help=f"A bearer token (`epochlog user add --new-token`); prefer the variable, which `ps` does "
                      f"not show [env {TOKEN_ENV}]."),
]


# --- values and tables -------------------------------------------------------------------------------

def _value_fields(value: bytes | None) -> dict[str, Any]:
    """`value` and its `encoding`: UTF-8 text when it decodes to printable text, else base64 (control
    characters other than tab and newlines count as binary: they would garble a terminal)."""
    if value is None:
        return {"value": None, "encoding": None}
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and (text.isprintable() or all(c.isprintable() or c in "\t\r\n" for c in text)):
        return {"value": text, "encoding": "utf-8"}
    return {"value": base64.b64encode(value).decode("ascii"), "encoding": "base64"}


def _shown(fields: dict[str, Any]) -> str:
    if fields["value"] is None:
        return "-"
    return fields["value"] if fields["encoding"] == "utf-8" else f"base64:{fields['value']}"


def _kv_document(kv: KeyValue) -> dict[str, Any]:
    return {"key": kv.name, **_value_fields(kv.value), "offset": kv.version, "created": kv.created,
            "lease": kv.lease}


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Plain columns, left-aligned, two spaces apart (easy to read and to `awk`)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _parse_value(value: str, as_base64: bool) -> bytes:
    raw = sys.stdin.buffer.read() if value == "-" else None
    if as_base64:
        try:
            return base64.b64decode(raw if raw is not None else value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise click.BadParameter(f"not base64: {exc}", param_hint="VALUE") from None
    return raw if raw is not None else value.encode("utf-8")


def _written(target: Target, result: p.WriteResult) -> None:
    target.emit({"offset": result.offset, "group": result.group},
                lambda: click.echo(f"offset {result.offset} (group {result.group})"))


class LeaseId(click.ParamType):
    """A lease id: decimal (digits only) or hex (`0x...`, or digits with a-f as etcdctl prints them)."""

    name = "LEASE_ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        try:
            lease = int(text, 16) if text.startswith("0x") or any(c in "abcdef" for c in text) else int(text)
        except ValueError:
            self.fail(f"{value!r} is not a lease id (decimal, or hex like 0x3da0cc191a4c29fb)", param, ctx)
        if lease <= 0:
            self.fail(f"{value!r}: lease ids are positive", param, ctx)
        return lease


LEASE_ID = LeaseId()


def _hex(lease: int) -> str:
    return f"{lease:#x}" if lease else "0"


def _duration(ms: int) -> str:
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s" if ms % 1000 else f"{ms // 1000} s"


# --- the commands ------------------------------------------------------------------------------------

def register(cli: click.Group) -> None:
    """Add the client commands to the `epochlog` group (cli.py calls this once)."""
    for command in _COMMANDS.commands.values():
        cli.add_command(command)


# A holder group: the commands are defined on it and then added to the real `epochlog` group.
_COMMANDS = click.Group("client-commands")


@_cluster_command(_COMMANDS, "status")
def status_command(target: Target) -> None:
    """Every group's leader, term and commit offset; each member's role, applied offset, LAG (the
    leader's commit offset minus the member's own applied offset) and HEARD (how long ago the leader
    last heard from it); then each node's process (pid, instance). Asked of every member, so each
    reports its own. Exit 1 when a member does not answer."""
    statuses, members = target.run(_gather_status)
    document = _status_document(statuses, members)

    def human() -> None:
        rows = []
        for g in document["groups"]:
            for m in g["members"]:
                mark = "*" if m["id"] == g["leader"] else ""
                heard = "-" if m["heard_ms"] is None else _duration(m["heard_ms"])
                rows.append((g["group"], g["leader"] or "-", g["term"], g["commit_offset"], f"{m['id']}{mark}",
                             m["role"], m["applied_offset"], m["match_offset"], m["lag"], heard))
        _table(("GROUP", "LEADER", "TERM", "COMMIT", "NODE", "ROLE", "APPLIED", "MATCH", "LAG", "HEARD"), rows)
        click.echo()
        _table(("NODE", "CLIENT ADDRESS", "PID", "INSTANCE", "STATE"),
               [(n["id"], n["client_address"], n["pid"], n["instance"],
                 "up" if n["reachable"] else f"unreachable: {n['error']}") for n in document["nodes"]])
        formats = {f"{g['group']} {m['views_format']}" for g in document["groups"] for m in g["members"]
                   if m["views_format"] is not None}
        if formats:
            click.echo("views format (group level): " + ", ".join(sorted(formats)))
        for g in document["groups"]:
            for m in g["members"]:
                if m["halted"] is not None:
                    h = m["halted"]
                    click.echo(f"group {g['group']} HALTED on node {m['id']} at offset {h['offset']}: "
                               f"{h['reason']}; {h['fix']}")
    target.emit(document, human)
    if not all(n["reachable"] for n in document["nodes"]):
        sys.exit(1)


async def _ask_each_member(client: AsyncClient, ask: Callable[[str], Awaitable[T]]
                           ) -> tuple[list[T | ClientError], list[p.MemberInfo]]:
    """`ask(address)` of every member a reachable node lists, concurrently; each reply (or the error
    that stood in for it) stays with the member it came from."""
    first = await client.status()
    members = [m for m in first.members if m.client_address]

    async def one(address: str) -> T | ClientError:
        try:
            return await ask(address)
        except ClientError as exc:
            return exc
        except TimeoutError:
            return UnavailableError(f"{address} did not answer within {client.timeout:.1f} s")

    return list(await asyncio.gather(*(one(m.client_address) for m in members))), members


async def _gather_status(client: AsyncClient) -> tuple[list[p.StatusInfo | ClientError], list[p.MemberInfo]]:
    """Each member's own status (as AsyncClient.cluster_status asks them), paired with the member."""
    return await _ask_each_member(client, client.status)


def _status_document(statuses: Sequence[p.StatusInfo | ClientError],
                     members: Sequence[p.MemberInfo]) -> dict[str, Any]:
    """The `status --json` document, from each member's own status (`statuses[i]` is `members[i]`'s)."""
    nodes = []
    reports: dict[int, p.StatusInfo] = {}
    for member, reply in zip(members, statuses):
        reachable = isinstance(reply, p.StatusInfo)
        if reachable:
            reports[member.id] = reply
        nodes.append({"id": member.id, "client_address": member.client_address,
                      "peer_address": member.peer_address, "reachable": reachable,
                      "error": None if reachable else str(reply),
                      "pid": reply.pid or None if isinstance(reply, p.StatusInfo) else None,
                      "instance": reply.instance or None if isinstance(reply, p.StatusInfo) else None})
    group_names: list[str] = []
    for info in reports.values():
        group_names += [g.group for g in info.groups if g.group not in group_names]
    groups = []
    for name in group_names:
        own = {node: next(g for g in info.groups if g.group == name)
               for node, info in reports.items() if any(g.group == name for g in info.groups)}
        leaders = [g for g in own.values() if g.role == "leader"]
        leader = max(leaders, key=lambda g: g.term) if leaders else None
        top = max(own.values(), key=lambda g: g.term)
        peers = {peer.id: peer for peer in (leader or top).peers}
        ids = list(dict.fromkeys([*peers, *(m.id for m in members)]))
        commit = leader.commit_offset if leader else max(g.commit_offset for g in own.values())
        group_members = []
        for node in ids:
            g = own.get(node)
            peer = peers.get(node)
            heard = None if leader is None or peer is None or node == leader.node or peer.heard_ms < 0 \
                else peer.heard_ms
            group_members.append({
                "id": node, "role": g.role if g is not None else "unreachable",
                "voter": None if peer is None else peer.role == "voter",
                "term": None if g is None else g.term,
                "commit_offset": None if g is None else g.commit_offset,
                "applied_offset": None if g is None else g.applied_offset,
                "log_start": None if g is None else g.log_start,
                "snapshot_offset": None if g is None else g.snapshot_offset,
                "match_offset": (None if leader is None or peer is None or peer.match_offset < 0
                                 else peer.match_offset),
                "halted": (None if g is None or g.halted is None
                           else {"offset": g.halted.offset, "reason": g.halted.reason, "fix": g.halted.fix}),
                "skipped": None if g is None else list(g.skipped),
                "views_format": None if g is None or not g.views_format else g.views_format,
                # Its own applied offset; for a member that did not answer, what the leader knows it holds.
                "lag": (max(0, commit - g.applied_offset) if g is not None
                        else None if leader is None or peer is None or peer.match_offset < 0
                        else max(0, commit - peer.match_offset)),
                "heard_ms": heard,
            })
        groups.append({"group": name, "leader": leader.node if leader else (top.leader or None),
                       "term": (leader or top).term, "commit_offset": commit, "members": group_members})
    return {"groups": groups, "nodes": nodes}


@_cluster_command(_COMMANDS, "put")
@click.argument("key")
@click.argument("value")
@click.option("--lease", type=LEASE_ID, default=None,
              help="Attach the key to this lease (hex as `lease grant` prints it, or decimal).")
@click.option("--expected-version", type=click.IntRange(min=0), default=None,
              help="Compare-and-set: the offset that last modified the key (0: it must not exist).")
@click.option("--base64", "as_base64", is_flag=True, help="VALUE is base64 (binary values).")
def put_command(target: Target, key: str, value: str, lease: int | None, expected_version: int | None,
                as_base64: bool) -> None:
    """Set KEY to VALUE ('-' reads it from stdin); prints the offset it committed at."""
    data = _parse_value(value, as_base64)
    result = target.run(lambda c: c.put(key, data, lease=lease or 0, expected_version=expected_version))
    _written(target, result)


@_cluster_command(_COMMANDS, "get")
@click.argument("key")
@click.option("--as-of", type=click.IntRange(min=0), default=None, help="The value as it was at this offset.")
@click.option("--consistency", type=click.Choice(p.CONSISTENCY), default="linearizable", show_default=True,
              help="linearizable and lease read on the leader; local on any node.")
@click.option("--min-offset", type=click.IntRange(min=0), default=None,
              help="Wait until the node applied this offset (a write's offset: read your writes).")
def get_command(target: Target, key: str, as_of: int | None, consistency: str, min_offset: int | None) -> None:
    """KEY's value and the offset that last modified it (exit 3 if it does not exist)."""
    kv = target.run(lambda c: c.get(key, consistency=consistency, as_of=as_of,
                                    min_offset=-1 if min_offset is None else min_offset))
    if kv is None:
        at = "" if as_of is None else f" at offset {as_of}"
        raise NotFoundError(f"no key {key!r}{at}")
    document = _kv_document(kv)

    def human() -> None:
        for field in ("key", "value", "offset", "created", "lease"):
            shown = (_shown(document) if field == "value" else _hex(document[field]) if field == "lease"
                     else document[field])
            click.echo(f"{field:<8}{shown}")
    target.emit(document, human)


@_cluster_command(_COMMANDS, "ls")
@click.argument("prefix", default="")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most this many keys [default: all].")
@click.option("--as-of", type=click.IntRange(min=0), default=None, help="The keys as they were at this offset.")
@click.option("--consistency", type=click.Choice(p.CONSISTENCY), default="linearizable", show_default=True)
def ls_command(target: Target, prefix: str, limit: int | None, as_of: int | None, consistency: str) -> None:
    """Keys starting with PREFIX, in key order, with their values (follows pages)."""
    async def body(client: AsyncClient) -> list[KeyValue]:
        items: list[KeyValue] = []
        after = None
        while limit is None or len(items) < limit:
            page_size = 1000 if limit is None else min(1000, limit - len(items))
            page = await client.list(prefix, limit=page_size, after=after, as_of=as_of, consistency=consistency)
            items += page.items
            if page.next_after is None:
                break
            after = page.next_after
        return items
    items = target.run(body)
    documents = [_kv_document(kv) for kv in items]
    target.emit(documents, lambda: _table(("KEY", "VALUE", "OFFSET"),
                                          [(d["key"], _shown(d), d["offset"]) for d in documents]))


@_cluster_command(_COMMANDS, "del")
@click.argument("key")
@click.option("--expected-version", type=click.IntRange(min=0), default=None,
              help="Delete only if this offset last modified the key.")
def del_command(target: Target, key: str, expected_version: int | None) -> None:
    """Delete KEY; prints the offset the deletion committed at."""
    _written(target, target.run(lambda c: c.delete(key, expected_version=expected_version)))


@_cluster_command(_COMMANDS, "txn")
@click.argument("ops", nargs=-1)
@click.option("--if", "conditions", multiple=True, metavar="KEY=VERSION",
              help="A condition: KEY was last modified at offset VERSION (0: KEY must not exist); repeatable.")
@click.option("--file", "json_file", type=click.File("r"), default=None, metavar="FILE|-",
              help='Conditions and operations as JSON (- for stdin): {"conditions": [{"key": K, "version": V}], '
                   '"ops": [{"op": "put", "key": K, "value": V, "lease": ID}, {"op": "del", "key": K}]}.')
@click.option("--base64", "as_base64", is_flag=True, help="Values are base64 (binary values).")
def txn_command(target: Target, ops: tuple[str, ...], conditions: tuple[str, ...], json_file: Any,
                as_base64: bool) -> None:
    """Apply OPS all or nothing if every condition holds; prints the offset it committed at.

    OPS from the arguments: `put KEY VALUE` and `del KEY`, in order (`--` before them if a value
    starts with -), e.g. `epochlog txn --if app/x=0 put app/x 1 del app/y`. A failed condition is
    an error (exit 3) naming the condition; nothing is applied."""
    events, guards = _txn_from_args(ops, conditions, as_base64)
    if json_file is not None:
        more_events, more_guards = _txn_from_json(json_file.read(), as_base64)
        events += more_events
        guards += more_guards
    if not events:
        raise click.UsageError("no operation: give put KEY VALUE / del KEY, or --file")
    _written(target, target.run(lambda c: c.txn(events, guards)))


def _txn_from_args(words: Sequence[str], conditions: Sequence[str], as_base64: bool
                   ) -> tuple[list[ev.Event], list[tuple[str, int]]]:
    guards = []
    for condition in conditions:
        key, sep, version = condition.rpartition("=")
        if not sep or not key or not version.isdigit():
            raise click.BadParameter(f"{condition!r} is not KEY=VERSION (VERSION: an offset, 0 for absent)",
                                     param_hint="--if")
        guards.append((key, int(version)))
    events: list[ev.Event] = []
    i = 0
    while i < len(words):
        op = words[i]
        if op == "put" and i + 2 < len(words):
            events.append(ev.KvPut(name=words[i + 1], value=_parse_value(words[i + 2], as_base64)))
            i += 3
        elif op == "del" and i + 1 < len(words):
            events.append(ev.KvDeleted(name=words[i + 1]))
            i += 2
        else:
            raise click.BadParameter(f"at {' '.join(words[i:i + 3])!r}: operations are `put KEY VALUE` and "
                                     f"`del KEY`", param_hint="OPS")
    return events, guards


def _txn_from_json(text: str, as_base64: bool) -> tuple[list[ev.Event], list[tuple[str, int]]]:
    try:
        doc = json.loads(text)
        guards = [(str(c["key"]), int(c["version"])) for c in doc.get("conditions", [])]
        events: list[ev.Event] = []
        for op in doc.get("ops", []):
            if op.get("op") == "put":
                lease = LEASE_ID.convert(op["lease"], None, None) if op.get("lease") else 0
                events.append(ev.KvPut(name=str(op["key"]), value=_parse_value(str(op["value"]), as_base64),
                                       lease=lease))
            elif op.get("op") == "del":
                events.append(ev.KvDeleted(name=str(op["key"])))
            else:
                raise ValueError(f"op {op.get('op')!r}: put or del")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise click.BadParameter(f"not a transaction document: {exc}", param_hint="--file") from None
    return events, guards


@click.group("lease")
def lease_group() -> None:
    """Leases: a key put with --lease is deleted when its lease ends (revoked, or not kept alive for its TTL)."""


@_cluster_command(lease_group, "grant")
@click.argument("ttl", type=click.FloatRange(min=0.1, max=7 * 24 * 3600))
def lease_grant(target: Target, ttl: float) -> None:
    """Grant a lease of TTL seconds; prints its id (hex; put --lease takes it as printed)."""
    lease = target.run(lambda c: c.lease_grant(round(ttl * 1000)))
    target.emit({"id": lease.lease_id, "id_hex": _hex(lease.lease_id), "ttl_ms": lease.ttl_ms,
                 "offset": lease.offset},
                lambda: click.echo(f"lease {_hex(lease.lease_id)} granted with TTL {_duration(lease.ttl_ms)} "
                                   f"(offset {lease.offset})"))


@_cluster_command(lease_group, "revoke")
@click.argument("lease_id", type=LEASE_ID)
def lease_revoke(target: Target, lease_id: int) -> None:
    """End the lease now: the keys attached to it are deleted."""
    result = target.run(lambda c: c.lease_revoke(lease_id))
    target.emit({"id": lease_id, "id_hex": _hex(lease_id), "offset": result.offset, "group": result.group},
                lambda: click.echo(f"lease {_hex(lease_id)} revoked (offset {result.offset})"))


@_cluster_command(lease_group, "keep-alive")
@click.argument("lease_id", type=LEASE_ID)
@click.option("--once", is_flag=True, help="Keep it alive once and exit (default: every TTL/3 until Ctrl-C).")
def lease_keep_alive(target: Target, lease_id: int, once: bool) -> None:
    """Restart the lease's clock (every third of its TTL until Ctrl-C, or --once); a lease that
    ended is an error (exit 3)."""
    def show(ttl_ms: int) -> None:
        target.emit({"id": lease_id, "id_hex": _hex(lease_id), "ttl_ms": ttl_ms},
                    lambda: click.echo(f"lease {_hex(lease_id)} kept alive with TTL {_duration(ttl_ms)}"))

    async def body(client: AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ttl_ms = await client.lease_keepalive(lease_id)
            show(ttl_ms)
            if once:
                return
            try:
                await asyncio.wait_for(stop.wait(), max(0.05, ttl_ms / 3000))
            except TimeoutError:
                pass
    target.stream(body)


@_cluster_command(lease_group, "list")
def lease_list(target: Target) -> None:
    """Every live lease: id, TTL and the offset that granted it."""
    async def body(client: AsyncClient) -> list[Any]:
        items: list[Any] = []
        after = None
        while True:
            page = await client.list_entities("lease/", limit=1000, after=after)
            items += page.items
            if page.next_after is None:
                return items
            after = page.next_after
    leases = [e.state for e in target.run(body)]
    documents = [{"id": x.lease_id, "id_hex": _hex(x.lease_id), "ttl_ms": x.ttl_ms, "offset": x.created}
                 for x in leases]
    target.emit(documents, lambda: _table(("ID", "TTL", "GRANTED AT"),
                                          [(d["id_hex"], _duration(d["ttl_ms"]), d["offset"]) for d in documents]))


@_cluster_command(_COMMANDS, "history")
@click.argument("key")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--after", "after_offset", type=click.IntRange(min=-1), default=-1,
              help="Only changes after this offset.")
def history_command(target: Target, key: str, limit: int, after_offset: int) -> None:
    """Every change of KEY, oldest first: offset, event and the value it left (none: deleted). History
    starts at the group's history floor (docs/compaction.md); earlier changes are in the archive."""
    changes = target.run(lambda c: c.history(key, limit=limit, after_offset=after_offset))
    documents = []
    for change in changes:
        state = change.state
        value = state.value if isinstance(state, KvState) else None
        documents.append({"offset": change.offset, "event": change.event, "deleted": state is None,
                          **_value_fields(value)})

    def human() -> None:
        _table(("OFFSET", "EVENT", "VALUE"), [(d["offset"], d["event"], "(deleted)" if d["deleted"] else _shown(d))
                                              for d in documents])
        if changes.floor > 0:
            click.echo(f"history starts at the history floor {changes.floor}: earlier changes are in the export "
                       f"archive (epochlog audit history {key} --table PATH)", err=True)
    target.emit(documents, human)


@_cluster_command(_COMMANDS, "watch")
@click.argument("prefix", default="")
@click.option("--from", "from_offset", type=click.IntRange(min=0), default=None,
              help="First offset to stream [default: the next write].")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Stop after printing this many events (with --all, those that changed nothing count too).")
@click.option("--all", "show_all", is_flag=True,
              help="Also print the committed writes that changed nothing (rejected, retried, skipped), marked.")
def watch_command(target: Target, prefix: str, from_offset: int | None, count: int | None, show_all: bool) -> None:
    """Stream the changes of keys starting with PREFIX until Ctrl-C (or --count events): `app/` for kv
    entries (the default, '': all of them), `broker/`, `topic/`... for other entities.

    Only writes that changed a key are printed, unless --all: then every committed write, and the
    APPLIED column (`applied` in --json) tells which changed nothing (a failed compare-and-set, a
    retried request, a record the operator skipped)."""
    if not target.as_json:
        click.echo(f"{'OFFSET':<10}{'TERM':<6}{'APPLIED  ' if show_all else ''}{'EVENT':<12}{'KEY':<24}VALUE")

    async def body(client: AsyncClient, stop: asyncio.Event) -> None:
        seen = 0
        stream = client.watch(prefix, from_offset=-1 if from_offset is None else from_offset)
        try:
            async for watched in stream:
                if stop.is_set():
                    return
                if watched.applied is False and not show_all:
                    continue
                document = _event_document(watched)
                if target.as_json:
                    click.echo(json.dumps(document))
                else:
                    shown = "" if document["value"] is None else _shown(document)
                    marker = f"{_applied_marker(watched.applied):<9}" if show_all else ""
                    click.echo(f"{document['offset']:<10}{document['term']:<6}{marker}{document['event']:<12}"
                               f"{document['key']:<24}{shown}")
                seen += 1
                if count is not None and seen >= count:
                    return
        finally:
            await stream.aclose()
    target.stream(body)


def _event_document(watched: WatchedEvent) -> dict[str, Any]:
    """A watched event: its key (as every command writes it), the event type, the value a put wrote, and whether it
    changed anything (`applied`: false for a rejected, retried or skipped write; null: unknown)."""
    event = watched.event
    value = event.value if isinstance(event, ev.KvPut) else None
    return {"offset": watched.offset, "key": watched.key,
            "event": type(event).__name__ if event is not None else None, "timestamp": watched.timestamp,
            **_value_fields(value), "term": watched.term, "applied": watched.applied}


def _applied_marker(applied: bool | None) -> str:
    """The APPLIED column: yes, no (the write changed nothing) or ? (the node could not tell)."""
    return "?" if applied is None else "yes" if applied else "no"


@click.group("events")
def events_group() -> None:
    """The committed events of a group's log."""


@_cluster_command(events_group, "tail")
@click.option("--group", default="kv", show_default=True, help="Which group's log.")
@click.option("--from", "from_offset", type=click.IntRange(min=0), default=None,
              help="First offset [default: the log start, or --last].")
@click.option("--last", type=click.IntRange(min=1), default=None,
              help="Start this many offsets before the commit.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they commit, until Ctrl-C.")
@click.option("--max-events", type=click.IntRange(min=1), default=None, help="Stop after this many events.")
def events_tail(target: Target, group: str, from_offset: int | None, last: int | None, follow: bool,
                max_events: int | None) -> None:
    """Print the committed events of GROUP from an offset (read from the leader, so none is missed)."""
    if not target.as_json:
        click.echo(f"{'OFFSET':<10}{'TIMESTAMP':<15}{'TERM':<6}{'APPLIED':<9}{'KEY':<32}EVENT")

    async def body(client: AsyncClient, stop: asyncio.Event) -> None:
        offset = from_offset
        if offset is None:
            probe = await client.read_events(group, 1 << 62, max_events=1)
            offset = probe.log_start if last is None else max(probe.log_start, probe.commit_offset + 1 - last)
        printed = 0
        while (max_events is None or printed < max_events) and not stop.is_set():
            batch = await client.read_events(group, offset, max_events=1000)
            for record in batch.events:
                _print_record(target, group, record)
                printed += 1
                if max_events is not None and printed >= max_events:
                    return
            caught_up = batch.next_offset <= offset   # nothing past what the leader applied
            offset = max(offset, batch.next_offset)
            if caught_up:
                if not follow:
                    return
                try:
                    await asyncio.wait_for(stop.wait(), FOLLOW_POLL_S)
                except TimeoutError:
                    pass
    target.stream(body)


def _print_record(target: Target, group: str, record: p.EventRecord) -> None:
    event = None if record.value is None else ev.decode_event(record.value)
    fields = None if event is None else msgspec.to_builtins(event)
    if target.as_json:
        click.echo(json.dumps({"group": group, "offset": record.offset, "key": record.key,
                               "timestamp": record.timestamp,
                               "type": None if event is None else type(event).__name__, "event": fields,
                               "term": record.term, "applied": record.applied}))
        return
    summary = "-" if fields is None else " ".join(f"{k}={v}" for k, v in fields.items()
                                                  if v not in ("", None) and k not in ("request_id",))
    click.echo(f"{record.offset:<10}{record.timestamp:<15}{record.term:<6}{_applied_marker(record.applied):<9}"
               f"{record.key:<32}{summary}")


@click.group("leader")
def leader_group() -> None:
    """Leadership of the groups."""


@_cluster_command(leader_group, "transfer")
@click.option("--group", required=True, help="The group whose leadership moves.")
@click.option("--to", "to", type=click.IntRange(min=0), default=0,
              help="The node to hand it to [default: the most caught-up follower].")
def leader_transfer(target: Target, group: str, to: int) -> None:
    """Hand GROUP's leadership to another voter and wait until it has moved."""
    async def body(client: AsyncClient) -> dict[str, Any]:
        before = _group_view(await client.cluster_status(), group)
        if before is not None and before[0] == to:
            return {"group": group, "leader": to, "term": before[1], "previous_leader": to}
        await client.transfer_leader(group, to)
        deadline = time.monotonic() + target.timeout
        while True:
            now = _group_view(await client.cluster_status(), group)
            if now is not None and before is not None and now[1] > before[1] and (to in (0, now[0])):
                return {"group": group, "leader": now[0], "term": now[1], "previous_leader": before[0]}
            if time.monotonic() > deadline:
                raise DeadlineExceededError(f"leadership of {group} did not move within {target.timeout:.1f} s "
                                            f"(before: {before}, now: {now}; as (leader, term))")
            await asyncio.sleep(0.05)
    moved = target.run(body)
    target.emit(moved, lambda: click.echo(f"group {group}: leader {moved['leader']} in term {moved['term']} "
                                          f"(was {moved['previous_leader']})"))


def _group_view(statuses: Sequence[p.StatusInfo | ClientError], group: str) -> tuple[int, int] | None:
    """(leader, term) of `group` as the node leading it in the highest term says, or None."""
    leaders = [(g.node, g.term) for s in statuses if isinstance(s, p.StatusInfo)
               for g in s.groups if g.group == group and g.role == "leader"]
    return max(leaders, key=lambda lt: lt[1]) if leaders else None


@_cluster_command(_COMMANDS, "snapshot")
@click.option("--group", required=True, help="The group to snapshot.")
@click.option("--node", "node_id", type=click.IntRange(min=1), default=None,
              help="Snapshot on this node [default: the group's leader].")
def snapshot_command(target: Target, group: str, node_id: int | None) -> None:
    """Snapshot GROUP's views at its applied offset and drop the log below (a key-compacted group: its
    cleaner compacts it instead); prints the offset."""
    async def body(client: AsyncClient) -> int:
        if node_id is None:
            return await client.snapshot(group)
        members = {m.id: m.client_address for m in (await client.status()).members}
        if not members.get(node_id):
            raise click.BadParameter(f"no member {node_id} with a client address (members: {sorted(members)})",
                                     param_hint="--node")
        return await client.snapshot(group, members[node_id])
    offset = target.run(body)
    target.emit({"group": group, "offset": offset},
                lambda: click.echo(f"group {group}: snapshot at offset {offset}"))


@click.group("compaction")
def compaction_group() -> None:
    """Retention: what each group's log and views keep, and why."""


@_cluster_command(compaction_group, "status")
def compaction_status(target: Target) -> None:
    """Per group and node: log offsets, segments and bytes, snapshot, the horizon and what bounds it, key compaction,
    the history floor and pruning, views size, the last retention run, capped export pins, disk."""
    async def body(client: AsyncClient) -> list[tuple[p.MemberInfo, p.CompactionInfo | ClientError]]:
        replies, members = await _ask_each_member(client, client.compaction_status)
        return list(zip(members, replies))

    replies = target.run(body)
    groups: list[dict[str, Any]] = []
    nodes = []
    for member, reply in replies:
        reachable = isinstance(reply, p.CompactionInfo)
        nodes.append({"id": member.id, "client_address": member.client_address, "reachable": reachable,
                      "free_disk_bytes": reply.free_disk_bytes if reachable else None,
                      "error": None if reachable else str(reply)})
        if reachable:
            for g in reply.groups:
                doc = {"node": member.id, **msgspec.structs.asdict(g)}
                doc["pins"] = [msgspec.structs.asdict(x) for x in g.pins]
                doc["last_clean"] = None if g.last_clean is None else msgspec.structs.asdict(g.last_clean)
                groups.append(doc)
    groups.sort(key=lambda d: (d["group"], d["node"]))
    document = {"groups": groups, "nodes": nodes}

    def human() -> None:
        def mb(n: int) -> str:
            return f"{n / 1e6:.1f}"
        def floor(g: dict[str, Any]) -> str:
            if g["cleanup_policy"] == "compact":
                return f"compact below {g['clean_below']} (cleaned to {g['clean_end_offset']})"
            return f"{g['log_floor']} ({g['log_bound']})"
        rows = [(g["group"], g["node"], g["role"], f"{g['log_start']}..{g['log_end']}", g["segments"],
                 mb(g["log_bytes"]), g["snapshot_offset"], f"{g['horizon']} ({g['horizon_bound']})",
                 floor(g), g["history_floor"], g["pruned_floor"],
                 mb(g["views_bytes"]), f"{g['last_run_ms']}ms") for g in groups]
        _table(("GROUP", "NODE", "ROLE", "LOG", "SEGS", "LOG_MB", "SNAPSHOT", "HORIZON (BOUND)",
                "LOG_FLOOR (BOUND) / KEY COMPACTION", "HISTORY_FLOOR", "PRUNED", "VIEWS_MB", "LAST_RUN"), rows)
        for g in groups:
            if g["cleanup_policy"] == "compact":
                last = g["last_clean"]
                where = f"group {g['group']} node {g['node']}: key compaction"
                state = ("a pass is running" if g["clean_running"] else
                         f"waiting: {g['clean_waiting']}" if g["clean_waiting"] else "a pass is due")
                click.echo(f"{where}: {g['cleaned_segments']} cleaned segments, {g['clean_passes']} passes, "
                           f"{mb(g['clean_bytes_reclaimed'])} MB reclaimed since start; {state}")
                if last is not None:
                    click.echo(f"{where}: last pass below {last['clean_below']}: {last['segments_before']} -> "
                               f"{last['segments_after']} segments, {mb(last['bytes_before'])} -> "
                               f"{mb(last['bytes_after'])} MB, {last['records_kept']} records kept, "
                               f"{last['records_dropped']} dropped ({last['tombstones_dropped']} tombstones, "
                               f"{last['noops_dropped']} no-ops) in {last['seconds']:.2f}s"
                               + (f"; stopped early: {last['aborted']}" if last["aborted"] else ""))
                if g["clean_error"]:
                    click.echo(f"{where}: last pass failed: {g['clean_error']}")
            for pin in g["pins"]:
                if pin["capped_by"]:
                    click.echo(f"group {g['group']} node {g['node']}: export {pin['table']} (watermark "
                               f"{pin['watermark']}) is capped by {pin['capped_by']}: the log keeps from "
                               f"{pin['floor']}")
            if g["disk_full"]:
                click.echo(f"group {g['group']} node {g['node']}: refusing writes: {g['disk_full']}")
            if g["snapshot_error"]:
                click.echo(f"group {g['group']} node {g['node']}: last snapshot failed: {g['snapshot_error']}")
        for n in nodes:
            if not n["reachable"]:
                click.echo(f"node {n['id']} ({n['client_address']}): unreachable: {n['error']}")
    target.emit(document, human)


@click.group("member")
def member_group() -> None:
    """Members of the cluster: list, add (as a learner), promote, remove."""


def _members(target: Target, members: p.Members) -> None:
    def role(node: int) -> str:
        return "voter" if node in members.voters else "learner" if node in members.learners else "-"
    documents = [{"id": m.id, "peer_address": m.peer_address, "client_address": m.client_address,
                  "role": role(m.id)} for m in members.members]
    target.emit({"members": documents, "voters": members.voters, "learners": members.learners},
                lambda: _table(("ID", "ROLE", "PEER ADDRESS", "CLIENT ADDRESS"),
                               [(d["id"], d["role"], d["peer_address"], d["client_address"] or "-")
                                for d in documents]))


@_cluster_command(member_group, "list")
def member_list(target: Target) -> None:
    """Every member with its addresses and role (voter or learner)."""
    _members(target, target.run(lambda c: c.members()))


_member_group_option = click.option("--group", default=None,
                                    help="Change this group only [default: every group].")


def _only(group: str | None) -> dict[str, str]:
    return {} if group is None else {"group": group}


@_cluster_command(member_group, "add")
@click.argument("node_id", type=click.IntRange(min=1))
@click.argument("peer_address")
@click.option("--client-address", default="", help="Where the new node serves clients.")
@click.option("--no-auto-promote", is_flag=True, help="Leave it a learner (promote it with `member promote`).")
@_member_group_option
def member_add(target: Target, node_id: int, peer_address: str, client_address: str, no_auto_promote: bool,
               group: str | None) -> None:
    """Add NODE_ID (started with `epochlog serve --peer-address PEER_ADDRESS ...`) as a learner of every
    group; it becomes a voter once caught up unless --no-auto-promote."""
    _members(target, target.run(lambda c: c.member_add(node_id, peer_address, client_address,
                                                       auto_promote=not no_auto_promote, **_only(group))))


@_cluster_command(member_group, "promote")
@click.argument("node_id", type=click.IntRange(min=1))
@_member_group_option
def member_promote(target: Target, node_id: int, group: str | None) -> None:
    """Make learner NODE_ID a voter of every group."""
    _members(target, target.run(lambda c: c.member_promote(node_id, **_only(group))))


@_cluster_command(member_group, "remove")
@click.argument("node_id", type=click.IntRange(min=1))
@_member_group_option
def member_remove(target: Target, node_id: int, group: str | None) -> None:
    """Remove NODE_ID from every group, then forget its addresses."""
    _members(target, target.run(lambda c: c.member_remove(node_id, **_only(group))))


@click.group("group")
def group_group() -> None:
    """Operator recovery of a group halted at a record no node can apply."""


@_cluster_command(group_group, "skip")
@click.option("--group", required=True, help="The halted group.")
@click.option("--offset", type=click.IntRange(min=0), required=True,
              help="The offset it halted at (as `epochlog status` shows it).")
def group_skip(target: Target, group: str, offset: int) -> None:
    """Skip the record at OFFSET of GROUP on every member halted there, and apply on.

    Only for a record no Epochlog version can apply (e.g. one a node without the leader's check
    accepted): a newer schema version is applied by upgrading the nodes instead. Refused unless every
    member answers and each is halted at OFFSET or skipped it already, so no member applied it: the
    record is then `skipped` (it changes nothing) on every replica alike."""
    async def body(client: AsyncClient) -> dict[str, Any]:
        statuses, members = await _gather_status(client)
        halted: list[p.MemberInfo] = []
        for member, reply in zip(members, statuses):
            if not isinstance(reply, p.StatusInfo):
                raise UnavailableError(f"node {member.id} did not answer ({reply}): every member must be halted "
                                       f"at offset {offset} before it is skipped")
            info = next((g for g in reply.groups if g.group == group), None)
            if info is None:
                raise InvalidArgumentError(f"node {member.id} has no group {group!r}")
            if info.halted is not None and info.halted.offset == offset:
                halted.append(member)
            elif offset not in info.skipped:
                state = (f"is halted at offset {info.halted.offset}" if info.halted is not None
                         else f"is not halted (applied offset {info.applied_offset})")
                raise InvalidArgumentError(f"node {member.id} {state}: skip only a record every member is halted "
                                           f"at (one that applied it would diverge from those that skip it; "
                                           f"upgrade the halted nodes instead)")
        applied = {m.id: await client.group_skip(group, offset, m.client_address) for m in halted}
        return {"group": group, "offset": offset, "skipped_on": sorted(applied), "applied": applied}

    done = target.run(body)
    target.emit(done, lambda: click.echo(
        f"group {group}: offset {offset} skipped on node(s) {', '.join(map(str, done['skipped_on'])) or '-'}; "
        + ", ".join(f"node {n} applied through {a}" for n, a in done["applied"].items())))


for _group in (events_group, leader_group, member_group, group_group, compaction_group, lease_group):
    _COMMANDS.add_command(_group)
