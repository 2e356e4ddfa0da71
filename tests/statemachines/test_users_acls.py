"""Users and ACLs are events of the metadata group, applied like any event into the views (real
RocksDB): credentials stored salted, grants listed per principal, who could do what at any offset."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pytest

from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import credentials as cr
from statemachines import events as ev
from statemachines.access import Action, Operation, decide, principal_at
from statemachines.grants import Grant, Role
from statemachines.query import Query
from statemachines.state import Outcome, UserState
from statemachines.views import ViewsStateMachine


@pytest.fixture
def views(tmp_path: object) -> Iterator[ViewsStateMachine]:
    sm = ViewsStateMachine(str(tmp_path), name="metadata")
    try:
        yield sm
    finally:
        sm.close()


def apply(sm: ViewsStateMachine, events: Sequence[ev.Event]) -> list[Outcome]:
    """Each event as its own entry after the applied offset; the outcomes in order."""
    out = []
    for event in events:
        offset = sm.applied_index + 1
        data = bytearray(encode_batch([ev.event_record(event)], timestamp_ms=1))
        stamp(data, offset, 1)
        out.append(sm.apply([Entry(offset, 1, 1, EntryKind.NORMAL, bytes(data))])[offset])
    return out


def test_a_user_is_stored_with_salted_scram_keys_only(views: ViewsStateMachine) -> None:
    password = "correct horse battery staple"
    salt = os.urandom(16)
    creds = tuple(cr.scram_credential(m, password, salt) for m in cr.MECHANISMS)
    token = "tok-" + os.urandom(16).hex()
    (done,) = apply(views, [ev.UserAdded(name="alice", scram=creds,
                                         tokens=(cr.BearerToken(sha256=cr.token_digest(token)),))])
    assert done.ok
    item = Query(views.store).get("user/alice")
    assert item is not None and isinstance(item.state, UserState)
    stored = item.state
    assert {c.mechanism for c in stored.scram} == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    for c in stored.scram:
        assert cr.password_matches(c, password) and not cr.password_matches(c, password + "!")
    assert cr.token_matches(stored.tokens, token, now_ms=0) is not None
    assert cr.token_matches(stored.tokens, token + "x", now_ms=0) is None
    # neither the password nor the token is anywhere in the database files
    views.store.flush()
    blob = b"".join(p.read_bytes() for p in views.path.rglob("*") if p.is_file())
    assert password.encode() not in blob and token.encode() not in blob


def test_expired_tokens_are_refused() -> None:
    t = cr.BearerToken(sha256=cr.token_digest("abc"), expires_ms=1000)
    assert cr.token_matches((t,), "abc", now_ms=999) == t
    assert cr.token_matches((t,), "abc", now_ms=1000) is None


def test_scram_keys_follow_rfc_7677() -> None:
    """The SCRAM-SHA-256 test vector of RFC 7677 section 3 (user/pencil, its salt and 4096 iterations)."""
    import base64
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    salted = cr.salted_password("SCRAM-SHA-256", "pencil", salt, 4096)
    client_key = cr.client_key("SCRAM-SHA-256", salted)
    stored = cr.stored_key_of("SCRAM-SHA-256", client_key)
    # ClientProof of the RFC's exchange = ClientKey XOR HMAC(StoredKey, AuthMessage)
    import hmac
    auth = (b"n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
            b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    signature = hmac.digest(stored, auth, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    assert base64.b64encode(proof) == b"dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    server_signature = hmac.digest(cr.server_key_of("SCRAM-SHA-256", salted), auth, "sha256")
    assert base64.b64encode(server_signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.mark.parametrize("event, problem", [
    (ev.UserAdded(name="a/b"), "principal"),
    (ev.UserAdded(name="x", scram=(cr.ScramCredential(mechanism="MD5", salt=b"s" * 16, iterations=4096,
                                                      stored_key=b"", server_key=b""),)), "mechanism"),
    (ev.UserAdded(name="x", scram=(cr.scram_credential("SCRAM-SHA-256", "p", b"s" * 16, 100),)), "iterations"),
    (ev.UserAdded(name="x", scram=(cr.scram_credential("SCRAM-SHA-256", "p", b"s" * 4),)), "salt"),
    (ev.UserAdded(name="x", scram=(cr.scram_credential("SCRAM-SHA-256", "p", b"s" * 16),) * 2), "one SCRAM"),
    (ev.UserAdded(name="x", tokens=(cr.BearerToken(sha256=b"short"),)), "32-byte"),
    (ev.AclGranted(principal="x", role="controller"), "node's own"),
    (ev.AclGranted(principal="x", role="writer"), "scoped"),
    (ev.AclGranted(principal="x", role="broker", resource="c/g"), "one broker"),
])
def test_invalid_users_and_grants_are_refused_before_proposing(event: ev.Event, problem: str) -> None:
    with pytest.raises(ev.EventError, match=problem):
        ev.event_record(event)


def test_grants_are_applied_revoked_and_time_travelable(views: ViewsStateMachine) -> None:
    outcomes = apply(views, [
        ev.AclGranted(principal="app", role="writer", resource="kv:app/"),      # 0
        ev.AclGranted(principal="app", role="reader", resource="topic:orders"),  # 1
        ev.AclGranted(principal="other", role="admin"),                           # 2
        ev.AclGranted(principal="app", role="writer", resource="kv:app/"),       # 3: already there
        ev.AclRevoked(principal="app", role="writer", resource="kv:app/"),       # 4
        ev.AclRevoked(principal="app", role="writer", resource="kv:app/"),       # 5: not there any more
    ])
    assert [o.ok for o in outcomes] == [True, True, True, False, True, False]
    assert (outcomes[3].code, outcomes[5].code) == ("already_exists", "not_found")
    q = Query(views.store, "metadata")
    put = Action(Operation.WRITE, "kv/app/x")
    then = principal_at(q, "app", as_of=2)
    now = principal_at(q, "app")
    assert then.grants == {Grant(Role.WRITER, "kv:app/"), Grant(Role.READER, "topic:orders")}
    assert now.grants == {Grant(Role.READER, "topic:orders")}
    assert decide(then, put).allowed and not decide(now, put).allowed
    assert principal_at(q, "ap").grants == frozenset()       # a name is not a prefix of another
    assert [r.event for r in q.history("acl/app/writer:kv:app/")] == ["AclGranted", "AclRevoked"]


def test_user_removed_and_re_added(views: ViewsStateMachine) -> None:
    cred = cr.scram_credential("SCRAM-SHA-512", "one", os.urandom(16))
    new = cr.scram_credential("SCRAM-SHA-512", "two", os.urandom(16))
    outcomes = apply(views, [ev.UserAdded(name="bob", scram=(cred,)), ev.UserAdded(name="bob", scram=(new,)),
                             ev.UserRemoved(name="bob"), ev.UserRemoved(name="bob")])
    assert [o.ok for o in outcomes] == [True, True, True, False]
    q = Query(views.store, "metadata")
    assert q.get("user/bob") is None
    at1 = q.get("user/bob", as_of=1)
    assert at1 is not None and at1.state.created == 0 and cr.password_matches(at1.state.scram[0], "two")
