"""Authentication (epochlog/authentication.py) against real client implementations: kafka-python's own
SCRAM client (SHA-256 and -512) for the exchange, RFC 4616 messages for PLAIN, bearer tokens with expiry;
wrong passwords, unknown users, replayed or forged proofs refused alike."""

from __future__ import annotations

import os
import secrets

import pytest
from kafka.net.sasl.scram import ScramClient

from epochlog.authentication import REFUSED, ScramServer, by_token, sasl_plain
from statemachines import credentials as cr
from statemachines.access import AuthenticationError
from statemachines.state import UserState

PASSWORD = "pa55, with=commas"


def user(name: str, password: str = PASSWORD, tokens: tuple[cr.BearerToken, ...] = ()) -> UserState:
    creds = tuple(cr.scram_credential(m, password, os.urandom(16)) for m in cr.MECHANISMS)
    return UserState(name=name, scram=creds, tokens=tokens, version=1, created=1)


USERS = {u.name: u for u in (user("alice"), user("bob", "other"))}


def exchange(mechanism: str, name: str, password: str) -> tuple[ScramServer, ScramClient]:
    client = ScramClient(name, password, mechanism)
    server = ScramServer(mechanism, USERS.get, secrets.token_urlsafe(18))
    client.process_server_first_message(server.first(client.first_message()))
    final = server.final(client.final_message())
    client.process_server_final_message(final)    # kafka-python checks the server's signature
    return server, client


@pytest.mark.parametrize("mechanism", sorted(cr.MECHANISMS))
def test_scram_with_kafka_pythons_client(mechanism: str) -> None:
    server, _ = exchange(mechanism, "alice", PASSWORD)
    assert server.principal == "alice"


@pytest.mark.parametrize("mechanism", sorted(cr.MECHANISMS))
def test_scram_refuses_a_wrong_password_and_an_unknown_user_alike(mechanism: str) -> None:
    with pytest.raises(AuthenticationError, match=REFUSED):
        exchange(mechanism, "alice", "wrong")
    with pytest.raises(AuthenticationError, match=REFUSED):
        exchange(mechanism, "mallory", PASSWORD)
    with pytest.raises(AuthenticationError, match=REFUSED):
        exchange(mechanism, "bob", PASSWORD)        # another user's password


def test_scram_refuses_a_replayed_proof_under_a_new_server_nonce() -> None:
    client = ScramClient("alice", PASSWORD, "SCRAM-SHA-256")
    first = client.first_message()
    old = ScramServer("SCRAM-SHA-256", USERS.get, "nonce1")
    client.process_server_first_message(old.first(first))
    recorded = client.final_message()
    old.final(recorded)
    fresh = ScramServer("SCRAM-SHA-256", USERS.get, "nonce2")
    fresh.first(first)
    with pytest.raises(AuthenticationError, match="nonce"):
        fresh.final(recorded)
    forged = recorded.replace(recorded.split(b"p=")[1], b"AAAA")   # a proof of the wrong length
    again = ScramServer("SCRAM-SHA-256", USERS.get, "nonce1")
    again.first(first)
    with pytest.raises(AuthenticationError):
        again.final(forged)
    assert fresh.principal is None and again.principal is None


def test_sasl_plain() -> None:
    assert sasl_plain(USERS.get, b"\x00alice\x00" + PASSWORD.encode()) == "alice"
    assert sasl_plain(USERS.get, b"alice\x00alice\x00" + PASSWORD.encode()) == "alice"
    for bad in (b"\x00alice\x00nope", b"\x00mallory\x00x", b"bob\x00alice\x00" + PASSWORD.encode(), b"alice"):
        with pytest.raises(AuthenticationError):
            sasl_plain(USERS.get, bad)


def test_bearer_tokens_expire_and_are_revoked_with_their_user() -> None:
    token = "eltok_" + secrets.token_urlsafe(32)
    t = cr.BearerToken(sha256=cr.token_digest(token), expires_ms=2_000)
    users = [USERS["alice"], user("carol", tokens=(t,))]
    assert by_token(users, token, now_ms=1_999) == "carol"
    for now, listed in ((2_000, users), (0, users[:1])):
        with pytest.raises(AuthenticationError, match=REFUSED):
            by_token(listed, token, now_ms=now)
    with pytest.raises(AuthenticationError):
        by_token(users, "", now_ms=0)
