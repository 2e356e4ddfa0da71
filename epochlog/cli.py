"""The `epochlog` command line.

Offline tools (`log dump|verify|clean`, `demo`), `serve` (run a node), `up` (a local cluster), `certs`
(the cluster CA and its certificates: epochlog/cli_certs.py), and the
client commands of a running cluster (`status`, `put`, `get`, `ls`, `del`, `watch`, `history`,
`events tail`, `leader transfer`, `snapshot`, `member ...`: epochlog/cli_client.py).

Exit codes: 0 success (a stream ended by Ctrl-C included); `log verify` uses 1 (recovery would
repair: cut a torn tail, finish or undo an interrupted cleaner swap) and 2 (mid-log corruption), `up` 1 (a node went down on its own or no leader
came up); 3 an Epochlog error, printed as `error: <message>` (a rejected compare-and-set, a
missing key, an unreachable cluster, a bad config...: the `exit_code` of its row of the error table,
eventlog/errors.py); 64 a usage error (bad option or argument,
no cluster named); 130 interrupted (Ctrl-C outside a stream).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from eventlog.errors import EXIT_ERROR, EpochlogError
from epochlog import startup_gc

EXIT_USAGE = 64

Register = Callable[[click.Group], None]
"""A module's `register(cli)`: adds its commands to the `epochlog` group."""


def _client_commands() -> Register:
    from epochlog.cli_client import register

    return register


def _controller_commands() -> Register:
    from epochlog.cli_brokers import register

    return register


def _certs_commands() -> Register:
    from epochlog.cli_certs import register

    return register


def _access_commands() -> Register:
    from epochlog.cli_access import register

    return register


def _spark_commands() -> Register:
    from spark.cli import register

    return register


LAZY_COMMANDS: dict[str, Callable[[], Register]] = {
    # The client commands of a running cluster (status, put, get, lease, txn, member...).
    **dict.fromkeys(("compaction", "del", "events", "get", "group", "history", "leader", "lease", "ls", "member",
                     "put", "snapshot", "status", "txn", "watch"), _client_commands),
    # The controller: brokers, routes, topic create, broker run, sim brokers.
    **dict.fromkeys(("broker", "brokers", "routes", "sim", "topic"), _controller_commands),
    "certs": _certs_commands,                                         # the cluster CA: init|member|client|show
    **dict.fromkeys(("acl", "user"), _access_commands),               # users and grants (issue 21)
    **dict.fromkeys(("audit", "export", "table"), _spark_commands),   # the export to Delta and its audit
}
"""The commands defined in other modules, by name -> how to import the `register(cli)` that adds them.
A module is imported when one of its commands runs (or `--help` lists them), so a command loads only
what it uses: `get` no certificate tooling, `serve` no client commands, no command but these Spark."""


class _Commands(click.Group):
    """The `epochlog` group, with the commands of LAZY_COMMANDS added on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        loader = LAZY_COMMANDS.get(cmd_name)
        if loader is not None and cmd_name not in self.commands:
            loader()(self)
        if loader is _spark_commands:
            from spark import cli as spark_cli

            ctx.meta[spark_cli.COMMAND_LINE] = spark_cli.CommandLine(endpoints=_endpoints, print_table=_print_table)
        return super().get_command(ctx, cmd_name)


def _endpoints(endpoints: str | None, config_path: Path | None) -> tuple[str, ...]:
    """The client addresses --endpoints or --config name, as every client command resolves them."""
    from epochlog.cli_client import Target

    return Target.resolve(endpoints, config_path, 0.0, False).endpoints


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from epochlog.cli_client import _table

    _table(headers, rows)


_dir_argument = click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path))


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="epochlog")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Epochlog: a log-structured, event-sourced metadata store for message-queue clusters."""
    if ctx.invoked_subcommand != "serve":   # serve resumes it once its node serves (epochlog/serve.py)
        startup_gc.resume()
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@cli.group("log")
def log_group() -> None:
    """Offline tools for a log directory: dump and verify are read-only (safe on a running node or a
    backup); clean rewrites it and takes its lock (a stopped node only)."""


@log_group.command("dump")
@_dir_argument
@click.option("--from", "start_offset", type=click.IntRange(min=0), default=0, show_default=True,
              help="First offset to show.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most this many batches.")
@click.option("--keys", "max_keys", type=click.IntRange(min=0), default=3, show_default=True,
              help="Record keys shown per batch.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per batch.")
def log_dump(directory: Path, start_offset: int, limit: int | None, max_keys: int, as_json: bool) -> None:
    """List the batches of the log in DIRECTORY: offsets, epoch, timestamp, records, CRC, keys.

    A segment name marked * is a cleaned segment (key compaction): its offsets have gaps."""
    from eventlog.offline import dump_log_dir

    if not as_json:
        click.echo(f"{'segment':<24} {'position':>10} {'offsets':>23} {'epoch':>6} {'max timestamp':>14} "
                   f"{'records':>7} {'bytes':>8}  crc  keys")
    for i, row in enumerate(dump_log_dir(directory, start_offset=start_offset, max_keys=max_keys)):
        if limit is not None and i >= limit:
            break
        keys = [None if k is None else k.decode("utf-8", "backslashreplace") for k in row.keys]
        if as_json:
            click.echo(json.dumps({
                "segment": row.segment, "position": row.position, "base_offset": row.base_offset,
                "last_offset": row.last_offset, "epoch": row.epoch, "max_timestamp": row.max_timestamp,
                "records": row.records, "bytes": row.size, "crc_ok": row.crc_ok, "problem": row.problem,
                "keys": keys, "cleaned": row.cleaned}))
            continue
        offsets = f"{row.base_offset}..{row.last_offset}"
        segment = row.segment + ("*" if row.cleaned else "")
        status = "ok " if row.crc_ok else click.style("BAD", fg="red")
        shown = ", ".join("<null>" if k is None else k for k in keys)
        if row.records > len(keys) and keys:
            shown += ", ..."
        click.echo(f"{segment:<24} {row.position:>10} {offsets:>23} {row.epoch:>6} {row.max_timestamp:>14} "
                   f"{row.records:>7} {row.size:>8}  {status}  {shown}")
        if row.problem:
            click.echo(f"    {row.problem}")


@log_group.command("verify")
@_dir_argument
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def log_verify(directory: Path, as_json: bool) -> None:
    """Check every batch CRC in DIRECTORY. Exit 0 clean, 1 recovery would repair something (cut a
    torn tail, finish or undo an interrupted cleaner swap), 2 mid-log corruption (recovery would
    refuse to open) or no log in DIRECTORY (one line naming the logs below it)."""
    from eventlog.offline import NotALogError, verify_log_dir

    try:
        report = verify_log_dir(directory)
    except NotALogError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    if as_json:
        click.echo(json.dumps({
            "directory": str(report.directory), "verdict": report.verdict_name,
            "interrupted_swap": report.interrupted_swap,
            "log_start_offset": report.log_start_offset, "recovery_point": report.recovery_point,
            "epochs": report.epochs, "problems": report.problems,
            "segments": [{"file": s.path.name, "base_offset": s.base_offset, "next_offset": s.next_offset,
                          "batches": s.batches, "records": s.records, "valid_bytes": s.valid_bytes,
                          "file_bytes": s.file_bytes, "status": s.status.value,
                          "bytes_to_cut": s.bytes_to_cut, "problem": s.problem, "cleaned": s.cleaned}
                         for s in report.segments]}))
    else:
        for s in report.segments:
            cleaned = " (cleaned)" if s.cleaned else ""
            click.echo(f"{s.path.name}: offsets {s.base_offset}..{s.next_offset - 1}{cleaned}, {s.batches} batches, "
                       f"{s.records} records, {s.valid_bytes} bytes: {s.status.value}")
        for problem in report.problems:
            click.echo(f"problem: {problem}", err=True)
        click.echo(f"verdict: {report.verdict_name.replace('_', ' ')}")
    sys.exit(int(report.verdict))


@log_group.command("clean")
@_dir_argument
@click.option("--below", "below", type=click.IntRange(min=0), required=True,
              help="The horizon: only sealed segments wholly below this offset are cleaned.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A node config: [log] for the segment size, [compaction.cleaner] for the cleaner.")
@click.option("--force/--no-force", default=True, show_default=True,
              help="Clean even when the dirty ratio is below min_cleanable_dirty_ratio.")
@click.option("--passes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run up to this many passes (each continues where a full offset map stopped the last).")
@click.option("--json", "as_json", is_flag=True, help="Print each pass's result as JSON.")
def log_clean(directory: Path, below: int, config_path: Path | None, force: bool, passes: int,
              as_json: bool) -> None:
    """Key-compact the log in DIRECTORY below offset BELOW: keep each record key's latest record
    (offsets preserved), drop superseded records and expired tombstones (null values).

    Takes the log's lock: refused while a node has the log open. For a Raft group's log, BELOW must
    not exceed its latest snapshot index + 1 (followers that need older entries get the snapshot).
    """
    from compaction.cleaner import clean_log
    from compaction.config import CleanerConfig, cleaner_config
    from eventlog.config import LogConfig
    from eventlog.configuration import load_toml
    from eventlog.log import Log

    log_config, cleaner = LogConfig(), CleanerConfig()
    if config_path is not None:
        document = load_toml(config_path)
        log_config = LogConfig.from_toml(config_path)
        cleaner = cleaner_config((document.get("compaction") or {}).get("cleaner"))
    with Log.open(directory, log_config) as log:
        if log.recovery is not None and (log.recovery.bytes_truncated or log.recovery.repaired):
            click.echo(f"recovery: {log.recovery.summary()}", err=True)
        for n in range(passes):
            result = clean_log(log, below, cleaner, force=force)
            if as_json:
                click.echo(json.dumps({"pass": n + 1, **{k: getattr(result, k) for k in result.__slots__}}))
            else:
                click.echo(f"pass {n + 1}: {result.summary()}")
            if result.skipped or not result.offset_map_full:
                break


@cli.command("demo")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data/demo"),
              show_default=True, help="Where the demo log lives (emptied first).")
@click.option("--seconds", type=click.FloatRange(min=0.2, max=60), default=2.0, show_default=True,
              help="How long the writer runs before it is killed.")
@click.option("--seed", type=int, default=None, help="Seed for the crash moment and the torn write.")
def demo(data_dir: Path, seconds: float, seed: int | None) -> None:
    """Append, crash (kill -9), tear the tail, recover, verify and dump a log."""
    from epochlog.demo import run_demo

    sys.exit(run_demo(data_dir, seconds=seconds, seed=seed))


@cli.command("up")
@click.option("--config", "config_path", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The cluster's TOML file [default: configs/local-3.toml].")
@click.option("--nodes", type=click.IntRange(min=1, max=15), default=None,
              help="Run N nodes; other than the config's member count, <data-dir>/cluster.toml is generated "
                   "with ports following the config's scheme (port = base + node id).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data/local"),
              show_default=True,
              help="Node N keeps its data in <data-dir>/node-N and its log in <data-dir>/node-N.log.")
@click.option("--seconds", type=click.FloatRange(min=0), default=None,
              help="Stop S seconds after every group has a leader, printing a final status summary.")
@click.option("--once", is_flag=True, help="Stop as soon as every group has a leader (--seconds 0).")
@click.option("--demo-load", is_flag=True,
              help="Write puts, offset commits, a topic, a lease and a watch through the SDK.")
@click.option("--tour", is_flag=True,
              help="What `make run` runs: a tour of the mission (SDK writes, brokers and a failover, a Kafka "
                   "consumer, an export to Delta and an audit answer), then stop.")
def up_command(config_path: Path | None, nodes: int | None, data_dir: Path, seconds: float | None, once: bool,
               demo_load: bool, tour: bool) -> None:
    """Run a local cluster in the foreground with a live status view; Ctrl-C stops every node (data stays).

    Exit 0 after a clean run and stop, 1 if a node went down on its own or no leader came up, 3 on a
    configuration error (checked before any node starts)."""
    from epochlog.up import default_config, up

    if tour and (demo_load or seconds is not None or once):
        raise click.UsageError("--tour runs its own load and stops at its end: no --demo-load, --seconds or --once")
    sys.exit(up(config_path or default_config(), nodes=nodes, data_dir=data_dir,
                seconds=0.0 if once else seconds, demo_load=demo_load, tour=tour))


@cli.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The cluster's TOML file (e.g. configs/local-3.toml).")
@click.option("--node-id", required=True, type=click.IntRange(min=1), help="Which member of the cluster to run.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the node keeps its data [default: data/node-N].")
@click.option("--seed", type=int, default=None, help="Seed for election timeouts (tests).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Log lines on stderr: text, or one JSON object per line (ts, level, node, group, term, "
                   "logger, msg).")
@click.option("--peer-address", default="", help="A node joining at runtime (not in the config's members): "
              "host:port for its peers. Remembered in the data dir; then add it with `member add`.")
@click.option("--client-address", default="", help="A joining node: host:port for clients.")
@click.option("--admin-address", default="", help="A joining node: host:port of its admin endpoint.")
def serve_command(config_path: Path, node_id: int, data_dir: Path | None, seed: int | None,
                  log_format: str, peer_address: str, client_address: str, admin_address: str) -> None:
    """Run node N of the cluster described in the config, with all its groups, until SIGTERM/SIGINT."""
    import asyncio

    from epochlog.identity import resolve_member
    from epochlog.logs import configure
    from epochlog.serve import serve
    from eventlog import fault_injection as faults
    from eventlog.raft.runtime.config import load_node_configs

    configure("json" if log_format == "json" else "text", node_id)
    try:
        faults.install_from_env()   # test-only disk faults; a no-op unless EPOCHLOG_FAULTS is set
    except ValueError as exc:
        raise EpochlogError(str(exc)) from None
    configs = load_node_configs(config_path)
    data_dir = data_dir or Path(f"data/node-{node_id}")
    member = resolve_member(configs, node_id, data_dir, peer_address=peer_address, client_address=client_address,
                            admin_address=admin_address)
    _use_uvloop()
    sys.exit(asyncio.run(serve(configs, node_id, data_dir, seed=seed, member=member)))


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    import asyncio

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps errors to exit codes (see the module docstring)."""
    try:
        cli.main(args=argv, prog_name="epochlog", standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_ERROR)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except EpochlogError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)   # its row of the error table


if __name__ == "__main__":
    main()
