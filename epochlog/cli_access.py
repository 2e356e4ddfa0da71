"""`epochlog user ...` and `epochlog acl ...`: users and grants, written as events of the metadata group.

A password is turned into salted SCRAM keys here, on the operator's machine (statemachines/
credentials.py), and a bearer token is drawn here and shown once: what is sent, logged and stored is
their derived form only. Adding a user that exists replaces its credentials (a new password; its
tokens are revoked unless --keep-tokens). Grants are statemachines/grants.py's; `acl list --as-of N`
shows who held what at offset N.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from typing import Any

import click

from epochlog.cli_client import Target, _cluster_command, _table
from epochlog.client import AsyncClient
from statemachines import credentials as cr
from statemachines import events as ev
from statemachines.grants import GRANTABLE, GrantSyntaxError, check_principal, parse_grant
from statemachines.state import AclState, UserState

PASSWORD_ENV = "EPOCHLOG_NEW_PASSWORD"
TOKEN_PREFIX = "eltok_"


@click.group("user")
def user_group() -> None:
    """Users (SCRAM-SHA-256/512 passwords and bearer tokens) of the cluster's client faces."""


def _principal(name: str) -> str:
    try:
        check_principal(name)
    except GrantSyntaxError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    return name


def _password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
    if not password:
        raise click.BadParameter("the password is empty", param_hint="--password-stdin")
    return password


async def _all(client: AsyncClient, prefix: str, as_of: int | None = None) -> list[Any]:
    items: list[Any] = []
    after = None
    while True:
        page = await client.list_entities(prefix, limit=1000, after=after, as_of=as_of)
        items += page.items
        if page.next_after is None:
            return items
        after = page.next_after


@_cluster_command(user_group, "add")
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help=f"Read the password from the first line of stdin (else ${PASSWORD_ENV}, else a prompt).")
@click.option("--no-password", is_flag=True, help="No password: the user authenticates with tokens only.")
@click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice(sorted(cr.MECHANISMS)),
              help="SCRAM mechanism(s) to store (default: both).")
@click.option("--iterations", type=click.IntRange(cr.MIN_ITERATIONS, cr.MAX_ITERATIONS), default=cr.MIN_ITERATIONS,
              show_default=True, help="PBKDF2 iterations of the SCRAM keys.")
@click.option("--new-token", is_flag=True, help="Also make a bearer token; it is printed once.")
@click.option("--token-ttl", type=click.FloatRange(min=1), default=None,
              help="Seconds the new token is valid (default: until revoked).")
@click.option("--keep-tokens", is_flag=True, help="Keep the user's existing tokens (default: they are revoked).")
def user_add(target: Target, name: str, password_stdin: bool, no_password: bool, mechanisms: tuple[str, ...],
             iterations: int, new_token: bool, token_ttl: float | None, keep_tokens: bool) -> None:
    """Add user NAME, or replace its credentials."""
    _principal(name)
    scram: tuple[cr.ScramCredential, ...] = ()
    if not no_password:
        password = _password(password_stdin)
        scram = tuple(cr.scram_credential(m, password, os.urandom(32), iterations)
                      for m in (mechanisms or sorted(cr.MECHANISMS)))
    token = TOKEN_PREFIX + secrets.token_urlsafe(32) if new_token else None

    async def body(client: AsyncClient) -> Any:
        tokens: tuple[cr.BearerToken, ...] = ()
        if keep_tokens:
            current = await client.get_entity(f"user/{name}")
            if current is not None and isinstance(current.state, UserState):
                tokens = current.state.tokens
        if token is not None:
            expires = 0 if token_ttl is None else int(time.time() * 1000 + token_ttl * 1000)
            tokens = (*tokens, cr.BearerToken(sha256=cr.token_digest(token), expires_ms=expires))
        return await client.command(ev.UserAdded(name=name, scram=scram, tokens=tokens))

    result = target.run(body)
    document = {"user": name, "offset": result.offset, "mechanisms": [c.mechanism for c in scram], "token": token}

    def human() -> None:
        click.echo(f"user {name} stored at offset {result.offset} "
                   f"({', '.join(document['mechanisms']) or 'no password'})")
        if token is not None:
            click.echo(f"token (shown once, keep it secret): {token}")
    target.emit(document, human)


@_cluster_command(user_group, "remove")
@click.argument("name")
def user_remove(target: Target, name: str) -> None:
    """Remove user NAME: its password and tokens stop working at once; its grants stay (see `acl list`)."""
    _principal(name)
    result = target.run(lambda c: c.command(ev.UserRemoved(name=name)))
    target.emit({"user": name, "offset": result.offset},
                lambda: click.echo(f"user {name} removed at offset {result.offset}"))


@_cluster_command(user_group, "list")
def user_list(target: Target) -> None:
    """Every user: its SCRAM mechanisms and tokens (count and the soonest expiry); never a secret."""
    users = [i.state for i in target.run(lambda c: _all(c, "user/"))]
    documents = [{"user": u.name, "mechanisms": [c.mechanism for c in u.scram], "tokens": len(u.tokens),
                  "token_expiry_ms": [t.expires_ms for t in u.tokens], "offset": u.version, "created": u.created}
                 for u in users if isinstance(u, UserState)]
    target.emit(documents, lambda: _table(("USER", "SCRAM", "TOKENS", "OFFSET"), [
        (d["user"], ",".join(d["mechanisms"]) or "-", d["tokens"], d["offset"]) for d in documents]))


@click.group("acl")
def acl_group() -> None:
    """Grants: a principal (a user or a client certificate's name) holds roles, some scoped to a resource.

    \b
    admin | auditor                      (no resource)
    writer | reader  kv:<key prefix>     kv keys whose name starts with the prefix
    writer | reader  topic:<name>|<prefix>*|*
    writer | reader  group:<name>|<prefix>*|*  a Kafka consumer group: join it, commit and fetch its offsets
    broker           <cluster>/<group>/<name>
    """


def _grant(principal: str, role: str, resource: str) -> tuple[str, str, str]:
    _principal(principal)
    try:
        parse_grant(role, resource)
    except GrantSyntaxError as exc:
        raise click.BadParameter(str(exc), param_hint="ROLE RESOURCE") from None
    return principal, role, resource


_ROLE = click.Choice([r.value for r in GRANTABLE])


@_cluster_command(acl_group, "grant")
@click.argument("principal")
@click.argument("role", type=_ROLE)
@click.argument("resource", default="")
def acl_grant(target: Target, principal: str, role: str, resource: str) -> None:
    """Grant ROLE (scoped to RESOURCE) to PRINCIPAL."""
    who, role, resource = _grant(principal, role, resource)
    result = target.run(lambda c: c.command(ev.AclGranted(principal=who, role=role, resource=resource)))
    target.emit({"principal": who, "role": role, "resource": resource, "offset": result.offset},
                lambda: click.echo(f"{who}: {role} {resource} granted at offset {result.offset}".replace("  ", " ")))


@_cluster_command(acl_group, "revoke")
@click.argument("principal")
@click.argument("role", type=_ROLE)
@click.argument("resource", default="")
def acl_revoke(target: Target, principal: str, role: str, resource: str) -> None:
    """Revoke ROLE (scoped to RESOURCE) from PRINCIPAL."""
    who, role, resource = _grant(principal, role, resource)
    result = target.run(lambda c: c.command(ev.AclRevoked(principal=who, role=role, resource=resource)))
    target.emit({"principal": who, "role": role, "resource": resource, "offset": result.offset},
                lambda: click.echo(f"{who}: {role} {resource} revoked at offset {result.offset}".replace("  ", " ")))


@_cluster_command(acl_group, "list")
@click.argument("principal", required=False)
@click.option("--as-of", type=click.IntRange(min=0), default=None,
              help="The grants as they were at this offset of the metadata group.")
def acl_list(target: Target, principal: str | None, as_of: int | None) -> None:
    """Every grant (of PRINCIPAL, when given), now or at an offset."""
    prefix = f"acl/{_principal(principal)}/" if principal else "acl/"
    grants = [i.state for i in target.run(lambda c: _all(c, prefix, as_of))]
    documents = [{"principal": g.principal, "role": g.role, "resource": g.resource, "offset": g.version}
                 for g in grants if isinstance(g, AclState)]
    target.emit(documents, lambda: _table(("PRINCIPAL", "ROLE", "RESOURCE", "GRANTED AT"), [
        (d["principal"], d["role"], d["resource"] or "-", d["offset"]) for d in documents]))


def register(cli: click.Group) -> None:
    cli.add_command(user_group)
    cli.add_command(acl_group)
