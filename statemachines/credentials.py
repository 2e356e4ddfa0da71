"""Users' credentials as the metadata group stores them: SCRAM keys and bearer-token hashes, never secrets.

SCRAM (RFC 5802; SHA-256 and SHA-512 as in RFC 7677 and Kafka's KIP-84): from a password, a random
salt and an iteration count, SaltedPassword = PBKDF2-HMAC(password, salt, iterations); the server
keeps StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword,
"Server Key"). Those prove a client's SCRAM exchange, and a SASL/PLAIN password (recomputed with the
stored salt) without the password being stored anywhere; the CLI derives them on the operator's
machine, so the password is not sent or logged either. A bearer token is a random secret the CLI
shows once; the store keeps its SHA-256 (the token's entropy makes a salt unnecessary) and its expiry.

Pure functions: the salt and the token come from the caller (os.urandom / secrets in the CLI).
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096          # RFC 7677's minimum (and Kafka's default)
MAX_ITERATIONS = 1_000_000


class ScramCredential(msgspec.Struct, frozen=True, kw_only=True):
    mechanism: str             # SCRAM-SHA-256 | SCRAM-SHA-512
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class BearerToken(msgspec.Struct, frozen=True, kw_only=True):
    sha256: bytes              # SHA-256 of the token's UTF-8 bytes
    expires_ms: int = 0        # wall-clock ms since the epoch after which it is refused; 0: never


def hash_name(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ValueError(f"mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}") from None


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(hash_name(mechanism), password.encode(), salt, iterations)


def client_key(mechanism: str, salted: bytes) -> bytes:
    return hmac.digest(salted, b"Client Key", hash_name(mechanism))


def stored_key_of(mechanism: str, key: bytes) -> bytes:
    return hashlib.new(hash_name(mechanism), key).digest()


def server_key_of(mechanism: str, salted: bytes) -> bytes:
    return hmac.digest(salted, b"Server Key", hash_name(mechanism))


def scram_credential(mechanism: str, password: str, salt: bytes, iterations: int = MIN_ITERATIONS) -> ScramCredential:
    """What the store keeps for `password` under `mechanism` (the salt is the caller's random bytes)."""
    salted = salted_password(mechanism, password, salt, iterations)
    return ScramCredential(mechanism=mechanism, salt=salt, iterations=iterations,
                           stored_key=stored_key_of(mechanism, client_key(mechanism, salted)),
                           server_key=server_key_of(mechanism, salted))


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was derived from (SASL/PLAIN), in constant time."""
    again = scram_credential(credential.mechanism, password, credential.salt, credential.iterations)
    return hmac.compare_digest(again.stored_key, credential.stored_key)


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_matches(tokens: tuple[BearerToken, ...], token: str, now_ms: int) -> BearerToken | None:
    """The stored token `token` is, if it is one and has not expired at `now_ms`."""
    digest = token_digest(token)
    for t in tokens:
        if hmac.compare_digest(t.sha256, digest):
            return t if t.expires_ms == 0 or now_ms < t.expires_ms else None
    return None


def check_credential(c: ScramCredential) -> str | None:
    """Why `c` cannot be stored, or None."""
    if c.mechanism not in MECHANISMS:
        return f"mechanism {c.mechanism!r} is not one of {', '.join(MECHANISMS)}"
    if not MIN_ITERATIONS <= c.iterations <= MAX_ITERATIONS:
        return f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}"
    if not 16 <= len(c.salt) <= 64:
        return "a salt is 16 to 64 bytes"
    size = hashlib.new(hash_name(c.mechanism)).digest_size
    if len(c.stored_key) != size or len(c.server_key) != size:
        return f"{c.mechanism} keys are {size} bytes"
    return None
