"""`epochlog user ...` and `epochlog acl ...` as real processes against a real cluster: what reaches the
cluster is the derived credential (never the password or the token), and grants are listed now and as
they were at an earlier offset."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epochlog.client import Client
from statemachines import credentials as cr
from statemachines.state import UserState
from tests.epochlog.cli.test_cli import run
from tests.support.nodes import NodeCluster


@pytest.fixture(scope="module")
def cli(shared_cluster: NodeCluster) -> Any:
    def call(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Any:
        result = run(*args, "--endpoints", ",".join(shared_cluster.endpoints), "--json", stdin=stdin, env=env)
        assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        return json.loads(result.stdout)
    return call


def test_user_add_stores_scram_keys_and_a_token_hash(cli: Any, shared_cluster: NodeCluster) -> None:
    added = cli("user", "add", "alice", "--password-stdin", "--new-token", stdin="s3cret-pw\n")
    assert added["mechanisms"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"] and added["token"].startswith("eltok_")
    with Client(shared_cluster.endpoints) as c:
        stored = c.get_entity("user/alice")
        assert stored is not None and isinstance(stored.state, UserState)
        assert all(cr.password_matches(x, "s3cret-pw") for x in stored.state.scram)
        assert cr.token_matches(stored.state.tokens, added["token"], now_ms=0) is not None
        # the metadata log holds neither the password nor the token
        events = c.read_events("metadata", 0, max_events=10_000, max_bytes=16 << 20)
        blob = b"".join(e.value or b"" for e in events.events)
        assert b"s3cret-pw" not in blob and added["token"].encode() not in blob and b"UserAdded" in blob
    listed = {u["user"]: u for u in cli("user", "list")}
    assert listed["alice"]["tokens"] == 1 and listed["alice"]["mechanisms"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    # a new password from the environment revokes the token unless --keep-tokens
    again = cli("user", "add", "alice", "--mechanism", "SCRAM-SHA-512", env={"EPOCHLOG_NEW_PASSWORD": "other"})
    assert again["mechanisms"] == ["SCRAM-SHA-512"] and again["token"] is None
    assert {u["user"]: u for u in cli("user", "list")}["alice"]["tokens"] == 0
    cli("user", "remove", "alice")
    assert "alice" not in {u["user"] for u in cli("user", "list")}
    missing = run("user", "remove", "alice", "--endpoints", shared_cluster.endpoints[0])
    assert missing.returncode == 3 and "not_found" in missing.stderr


def test_acl_grant_revoke_list_and_as_of(cli: Any, shared_cluster: NodeCluster) -> None:
    first = cli("acl", "grant", "app", "writer", "kv:app/")
    cli("acl", "grant", "app", "reader", "topic:orders*")
    cli("acl", "grant", "app", "reader", "group:orders-*")
    cli("acl", "grant", "ops", "admin")
    revoked = cli("acl", "revoke", "app", "writer", "kv:app/")
    assert revoked["offset"] > first["offset"]
    now = cli("acl", "list", "app")
    assert sorted((g["role"], g["resource"]) for g in now) == [("reader", "group:orders-*"), ("reader", "topic:orders*")]
    then = cli("acl", "list", "app", "--as-of", str(first["offset"]))
    assert [(g["role"], g["resource"]) for g in then] == [("writer", "kv:app/")]
    assert {g["principal"] for g in cli("acl", "list")} >= {"app", "ops"}


@pytest.mark.parametrize("args, problem", [
    (("acl", "grant", "x", "controller"), "is not one of"),     # not a grantable role
    (("acl", "grant", "x", "writer", "app/"), "scoped"),
    (("acl", "grant", "x", "broker", "c/g"), "one broker"),
    (("acl", "grant", "x", "reader", "group:a/b"), "group"),
    (("acl", "grant", "a/b", "admin"), "principal"),
    (("user", "add", "a/b", "--no-password"), "principal"),
])
def test_bad_grants_and_names_are_usage_errors(args: tuple[str, ...], problem: str,
                                               shared_cluster: NodeCluster) -> None:
    result = run(*args, "--endpoints", shared_cluster.endpoints[0])
    assert result.returncode == 64 and problem in result.stderr, result   # usage errors: cli.EXIT_USAGE
