"""Who a client is: a bearer token, a SASL/PLAIN password or a SCRAM exchange, checked against the users
of the metadata group (sans-IO: the faces feed bytes and a user lookup, and get a principal's name).

A verified client certificate names its principal without any of these (epochlog/face_tls.py). What
the principal may do is statemachines/access.py's. Every failure is one `AuthenticationError` whose
message does not tell an unknown user from a wrong password (Kafka's SASL_AUTHENTICATION_FAILED,
native `unauthenticated`, gRPC UNAUTHENTICATED).

SCRAM (RFC 5802, as Kafka's SCRAM-SHA-256/512): client-first `n,,n=<user>,r=<nonce>`, server-first
`r=<nonce+server nonce>,s=<salt>,i=<iterations>`, client-final `c=biws,r=...,p=<proof>`, server-final
`v=<server signature>`. The proof is checked against the stored key: ClientKey = proof XOR
HMAC(StoredKey, AuthMessage) must hash to StoredKey. Channel binding and authorization identities are
not supported (`n,,` only), as in Kafka.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Iterable

from statemachines.access import AuthenticationError
from statemachines import credentials as cr
from statemachines.state import UserState

UserLookup = Callable[[str], UserState | None]
REFUSED = "authentication failed: unknown user or wrong credentials"


def by_token(users: Iterable[UserState], token: str, now_ms: int) -> str:
    """The user a bearer token belongs to (not expired at `now_ms`); AuthenticationError otherwise."""
    if token:
        for user in users:
            if cr.token_matches(user.tokens, token, now_ms) is not None:
                return user.name
    raise AuthenticationError(REFUSED)


def by_password(lookup: UserLookup, name: str, password: str) -> str:
    """The user `name` when `password` matches one of its SCRAM credentials (SASL/PLAIN)."""
    user = lookup(name) if name else None
    if user is not None and any(cr.password_matches(c, password) for c in user.scram):
        return user.name
    raise AuthenticationError(REFUSED)


def sasl_plain(lookup: UserLookup, message: bytes) -> str:
    """SASL/PLAIN (RFC 4616): `[authzid] NUL authcid NUL passwd`; an authzid other than the user is refused."""
    parts = message.split(b"\x00")
    if len(parts) != 3:
        raise AuthenticationError("SASL/PLAIN: the message is authzid NUL user NUL password")
    try:
        authzid, name, password = (x.decode() for x in parts)
    except UnicodeDecodeError:
        raise AuthenticationError("SASL/PLAIN: not UTF-8") from None
    if authzid and authzid != name:
        raise AuthenticationError("SASL/PLAIN: acting for another identity is not supported")
    return by_password(lookup, name, password)


def _attributes(message: bytes) -> dict[str, str]:
    try:
        return dict(p.split("=", 1) for p in message.decode().split(","))
    except (UnicodeDecodeError, ValueError):
        raise AuthenticationError("SCRAM: a message is comma-separated key=value attributes") from None


class ScramServer:
    """One SCRAM exchange, server side: `first(client_first)` -> server-first, `final(client_final)` ->
    server-final, then `principal`. `nonce` is the caller's random part (printable, no comma)."""

    def __init__(self, mechanism: str, lookup: UserLookup, nonce: str) -> None:
        if mechanism not in cr.MECHANISMS:
            raise AuthenticationError(f"mechanism {mechanism!r} is not one of {', '.join(cr.MECHANISMS)}")
        assert nonce and "," not in nonce, nonce
        self.mechanism = mechanism
        self.lookup = lookup
        self.server_nonce = nonce
        self.principal: str | None = None
        self._credential: cr.ScramCredential | None = None
        self._user = ""
        self._nonce = ""
        self._auth_message = b""

    def first(self, client_first: bytes) -> bytes:
        if not client_first.startswith(b"n,,"):
            raise AuthenticationError("SCRAM: only 'n,,' is supported (no channel binding, no authzid)")
        bare = client_first[3:]
        attrs = _attributes(bare)
        name = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
        client_nonce = attrs.get("r", "")
        if not name or not client_nonce:
            raise AuthenticationError("SCRAM: client-first names a user (n=) and a nonce (r=)")
        user = self.lookup(name)
        credential = None if user is None else next((c for c in user.scram if c.mechanism == self.mechanism), None)
        if credential is None:
            raise AuthenticationError(REFUSED)
        self._credential, self._user = credential, user.name  # type: ignore[union-attr]
        self._nonce = client_nonce + self.server_nonce
        server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                        f"i={credential.iterations}").encode()
        self._auth_message = bare + b"," + server_first
        return server_first

    def final(self, client_final: bytes) -> bytes:
        credential = self._credential
        if credential is None:
            raise AuthenticationError("SCRAM: client-final before client-first")
        without_proof, sep, _ = client_final.rpartition(b",p=")
        attrs = _attributes(client_final)
        if not sep or attrs.get("c") != "biws" or attrs.get("r") != self._nonce:
            raise AuthenticationError("SCRAM: client-final must echo c=biws and the combined nonce")
        try:
            proof = base64.b64decode(attrs["p"], validate=True)
        except (KeyError, ValueError):
            raise AuthenticationError("SCRAM: the proof is not base64") from None
        auth_message = self._auth_message + b"," + without_proof
        digest = cr.hash_name(self.mechanism)
        signature = hmac.digest(credential.stored_key, auth_message, digest)
        if len(proof) != len(signature):
            raise AuthenticationError(REFUSED)
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
            raise AuthenticationError(REFUSED)
        self.principal = self._user
        server_signature = hmac.digest(credential.server_key, auth_message, digest)
        return b"v=" + base64.b64encode(server_signature)
