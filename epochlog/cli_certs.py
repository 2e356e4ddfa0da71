"""`epochlog certs`: the cluster CA and the certificates of members and clients (epochlog/certs.py).

    epochlog certs init   [--dir data/ca] (--cluster NAME | --config FILE) [--days 3650]
    epochlog certs member [--dir data/ca] --node-id N [--out data/node-N/tls] [--days 825]
    epochlog certs client [--dir data/ca] --name NAME [--out data/clients] [--days 825]
    epochlog certs show FILE...

`member`'s default `--out` is where `epochlog serve --node-id N` (data dir data/node-N) looks by
default ([cluster.tls]); `epochlog up` does all of this by itself for a local cluster. Errors exit 3.
"""

from __future__ import annotations

from pathlib import Path

import click

from epochlog.certs import CA_DAYS, LEAF_DAYS, CertsError, ClusterCA, describe_certificate

_ca_dir = click.option("--dir", "ca_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data/ca"),
                       show_default=True, help="The CA's directory (ca.crt, ca.key).")


@click.group("certs")
def certs_group() -> None:
    """The cluster CA and its certificates: mutual TLS between members (docs/security.md)."""


@certs_group.command("init")
@_ca_dir
@click.option("--cluster", default=None, help="The cluster's name ([cluster] name of its config).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Take the cluster's name from this config instead.")
@click.option("--days", type=click.IntRange(min=1), default=CA_DAYS, show_default=True, help="Validity of the CA.")
def init_command(ca_dir: Path, cluster: str | None, config_path: Path | None, days: int) -> None:
    """Create the cluster's CA in --dir (refused when one is there)."""
    if (cluster is None) == (config_path is None):
        raise click.UsageError("give the cluster's name: --cluster NAME or --config FILE")
    if config_path is not None:
        from eventlog.raft.runtime.config import load_node_configs

        cluster = load_node_configs(config_path).cluster.name
    assert cluster is not None
    ca = ClusterCA.create(ca_dir, cluster, days=days)
    click.echo(f"created the CA of cluster {cluster!r}: {ca.directory / 'ca.crt'}, {ca.directory / 'ca.key'} (0600)")


@certs_group.command("member")
@_ca_dir
@click.option("--node-id", type=click.IntRange(min=1), required=True, help="The member's node id.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where node.crt, node.key and ca.crt go [default: data/node-N/tls].")
@click.option("--days", type=click.IntRange(min=1), default=LEAF_DAYS, show_default=True)
def member_command(ca_dir: Path, node_id: int, out: Path | None, days: int) -> None:
    """Issue (or re-issue) node N's certificate and key."""
    ca = ClusterCA.load(ca_dir)
    files = ca.issue_member(node_id, out or Path(f"data/node-{node_id}/tls"), days=days)
    click.echo(f"node {node_id} of cluster {ca.cluster!r}: {files.cert}, {files.key} (0600), {files.ca}")


@certs_group.command("client")
@_ca_dir
@click.option("--name", required=True, help="The client's name (its certificate names it).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("data/clients"),
              show_default=True, help="Where NAME.crt, NAME.key and ca.crt go.")
@click.option("--days", type=click.IntRange(min=1), default=LEAF_DAYS, show_default=True)
def client_command(ca_dir: Path, name: str, out: Path, days: int) -> None:
    """Issue a client certificate (for the client faces; the peer port refuses it)."""
    ca = ClusterCA.load(ca_dir)
    files = ca.issue_client(name, out, days=days)
    click.echo(f"client {name!r} of cluster {ca.cluster!r}: {files.cert}, {files.key} (0600), {files.ca}")


@certs_group.command("show")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def show_command(files: tuple[Path, ...]) -> None:
    """Who each certificate names, its issuer and validity."""
    for path in files:
        for line in describe_certificate(path):
            click.echo(line)


def register(cli: click.Group) -> None:
    cli.add_command(certs_group)


__all__ = ["CertsError", "register"]
