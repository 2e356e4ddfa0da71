"""Who a Kafka connection is, and what it may do: SaslHandshake/SaslAuthenticate and the face's permissions.

A connection's state (`KafkaSession`) lives in a context variable of the task that serves it
(epochlog/kafka/server.py runs one task per connection), so the handlers, shared by every
connection, read the caller of the request they serve without a parameter through every API.

SASL (KIP-152: SaslHandshake v1, then SaslAuthenticate frames): PLAIN and SCRAM-SHA-256/512 against the
metadata group's users (epochlog/authentication.py); a verified client certificate (SSL listener)
authenticates a connection without SASL. With enforcement on, a connection that has not
authenticated may only ask ApiVersions and the SASL APIs; anything else closes it, as Kafka does.

What each request asks permission for is the rule's (statemachines/access.py): a group's own topic
`__<group>` is its log (READ_LOG / APPEND_LOG, and each produced record's event on its own, so a
controller decision or `__metadata` is refused whoever sends it), a hosted topic is `kafka-topic/<name>`,
a consumer group `kafka-group/<id>`, a producer id IDEMPOTENT_WRITE. A refusal is answered with the
code of what was refused (TOPIC_, GROUP_ or CLUSTER_AUTHORIZATION_FAILED), counted and logged as on
every face (AccessControl.check).
"""

from __future__ import annotations

import contextvars
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from eventlog import kafka_codes as ke
from eventlog.errors import AuthenticationError, EpochlogError, KafkaError, PermissionDeniedError
from epochlog.access_control import AccessControl, Caller
from epochlog.authentication import ScramServer, sasl_plain
from statemachines.access import Action, Principal, decide
from statemachines import credentials as cr

MECHANISMS = ("PLAIN", *sorted(cr.MECHANISMS))
OPEN_APIS = frozenset({17, 18, 36})     # SaslHandshake, ApiVersions, SaslAuthenticate: before authenticating


@dataclass(slots=True)
class KafkaSession:
    """One connection's authentication state."""

    caller: Caller = field(default_factory=Caller)
    mechanism: str | None = None        # chosen by SaslHandshake
    scram: ScramServer | None = None    # an exchange under way
    authenticated: bool = False         # by a certificate or a completed SASL exchange


SESSION: contextvars.ContextVar[KafkaSession] = contextvars.ContextVar("kafka_session")


def current() -> KafkaSession:
    return SESSION.get()


class KafkaAccess:
    """The face's side of the access rule; `access` None or not enforcing: everything is allowed."""

    def __init__(self, access: AccessControl | None) -> None:
        self.access = access

    @property
    def enforce(self) -> bool:
        return self.access is not None and self.access.enforce

    def may_serve(self, api_key: int) -> bool:
        """Whether the connection may ask `api_key`: the SASL APIs always; the others once it authenticated
        and while its user exists (a removal ends the connection at its next request, counted and logged)."""
        if not self.enforce or api_key in OPEN_APIS:
            return True
        session = current()
        if not session.authenticated:
            return False
        assert self.access is not None
        try:
            self.access.authenticate(session.caller, f"api_{api_key}")
        except AuthenticationError:
            session.authenticated = False
            return False
        return True

    def principal(self, op: str) -> Principal | None:
        if not self.enforce:
            return None
        assert self.access is not None
        return self.access.authenticate(current().caller, op)

    def check(self, op: str, actions: Sequence[Action], denied: int = ke.TOPIC_AUTHORIZATION_FAILED, *,
              principal: Principal | None = None) -> None:
        """Unless the connection's principal (`principal`, when the caller already has it: a batch's
        records) may do `actions`: a denial counted and logged, raised as PermissionDeniedError
        (TOPIC_AUTHORIZATION_FAILED), or as a KafkaError with code `denied`."""
        if not self.enforce:
            return
        assert self.access is not None
        if principal is None:
            principal = self.access.authenticate(current().caller, op)
        try:
            self.access.check(principal, op, actions)
        except PermissionDeniedError as exc:
            if denied == ke.TOPIC_AUTHORIZATION_FAILED:
                raise
            raise KafkaError(denied, str(exc)) from None

    def may_any(self, principal: Principal | None, op: str, actions: Sequence[Action], *, report: bool) -> bool:
        """Whether `principal` (`principal(op)`: None when not enforcing) may do one of `actions` (Kafka's
        Describe: a Read or a Write). `report`: a refusal is counted and logged (a topic named in a
        Metadata request); else it is silent (a topic left out of the list of every topic)."""
        if principal is None:
            return True
        decisions = [decide(principal, a) for a in actions]
        if any(d.allowed for d in decisions):
            return True
        if report:
            assert self.access is not None
            action, decision = actions[0], decisions[0]
            self.access.denied(str(principal), op, action.resource.partition("/")[0],
                               f"may not {action}: {decision.reason}")
        return False

    # --- SASL ---------------------------------------------------------------------------------

    def handshake(self, mechanism: str) -> int:
        session = current()
        if mechanism not in MECHANISMS:
            return ke.UNSUPPORTED_SASL_MECHANISM
        session.mechanism, session.scram = mechanism, None
        return ke.NONE

    def authenticate(self, auth_bytes: bytes) -> tuple[int, str | None, bytes]:
        """One SaslAuthenticate: (error code, error message, server bytes)."""
        session = current()
        access = self.access
        lookup = (lambda name: None) if access is None else access.user
        try:
            if session.mechanism is None:
                raise AuthenticationError("SaslHandshake first")
            if session.mechanism == "PLAIN":
                self._done(session, sasl_plain(lookup, auth_bytes))
                return ke.NONE, None, b""
            if session.scram is None:
                session.scram = ScramServer(session.mechanism, lookup, secrets.token_urlsafe(18))
                return ke.NONE, None, session.scram.first(auth_bytes)
            final = session.scram.final(auth_bytes)
            assert session.scram.principal is not None
            self._done(session, session.scram.principal)
            return ke.NONE, None, final
        except EpochlogError as exc:
            session.scram = None
            if access is not None:
                access.denied("anonymous", "sasl_authenticate", "authentication", str(exc))
            return ke.SASL_AUTHENTICATION_FAILED, str(exc), b""

    @staticmethod
    def _done(session: KafkaSession, name: str) -> None:
        session.caller = Caller(authenticated=name)
        session.authenticated = True
        session.scram = None
