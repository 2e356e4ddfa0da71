"""Who a caller is and whether it may make a call: the node's side of issue 21, shared by every face.

The rule itself is statemachines/access.py (sans-IO, pure); this module feeds it what a node knows:

- a caller's credentials as its face read them (`Caller`: the name a verified client certificate
  gives, a bearer token, a SASL identity, or a member certificate: another node of the cluster);
- users and grants from the metadata group's views (statemachines/access.principal_at), cached per
  principal and per token, and dropped whole whenever the views apply a user or ACL event
  (`Applier.access_changes`) or are restored from a snapshot (a new Applier);
- the configured super users (`[clients.access] super_users`): principals that hold admin without an
  ACL event, so that the first admin can grant everything else (the bootstrap);
- a denial: counted by principal, operation and resource kind (`epochlog_access_denied_total`) and
  logged, then raised as the face's `permission_denied` / `unauthenticated` row.

Enforcement is on wherever the faces speak TLS unless the config says `enforce = false`
(ClientServiceConfig resolves the default). Without it every call is allowed and the actor of a
client's event is the one it claims, as before issue 21.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import msgspec
from prometheus_client import CollectorRegistry, Counter

from eventlog.configuration import doc
from eventlog.errors import AuthenticationError, PermissionDeniedError
from statemachines import credentials as cr
from statemachines import events as ev
from statemachines.access import Action, Principal, decide, principal_at
from statemachines.grants import Grant, Role
from statemachines.query import MAX_LIMIT, Query
from statemachines.state import UserState
from statemachines.views import ViewsStateMachine

logger = logging.getLogger(__name__)

METADATA = "metadata"
NODE_PREFIX = "epochlog/node/"
NODE_GRANTS = frozenset({Grant(Role.ADMIN), Grant(Role.NODE)})
"""Another node's calls (membership changes it forwards, the Kafka face's writes through a group's
leader, status for the digest check): an admin's, and the node's own records."""


@dataclass(frozen=True, slots=True)
class AccessConfig:
    """Enforcement of the access rule on every client face (`[clients.access]`)."""

    enforce: bool | None = field(default=None, metadata=doc(
        "Authenticate every client call and authorize it by the ACLs of the metadata group (issue 21). "
        "Needs [clients.tls] enabled: the nodes authenticate each other's forwarded calls by their member "
        "certificates. Default: on when [clients.tls] is enabled, off when it is not."))
    super_users: tuple[str, ...] = field(default=(), metadata=doc(
        "Principals that hold the admin role without an ACL event (the first admin, who grants the rest)."))


@dataclass(frozen=True, slots=True)
class Caller:
    """What a connection said about who it is, as its face read it (nothing verified against users yet,
    except a certificate, which the TLS handshake verified)."""

    certificate: str | None = None     # the client name of a verified client certificate
    node: int | None = None            # the node id of a verified member certificate
    token: str = ""                    # a bearer token (native hello, gRPC metadata)
    authenticated: str | None = None   # a name a face authenticated itself (Kafka SASL)


ANONYMOUS_CALLER = Caller()


class AccessMetrics:
    """The denial counter, in the node's registry when it has one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.denied = Counter("epochlog_access_denied", "Client calls refused by authentication or authorization, "
                              "by principal, operation and resource kind.", ["principal", "op", "resource"],
                              registry=registry)


class AccessControl:
    """The node's access state for every face. Use on the node's loop."""

    def __init__(self, config: AccessConfig, views: Callable[[], ViewsStateMachine | None],
                 metrics: AccessMetrics | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.enforce = bool(config.enforce)   # None (not resolved by ClientServiceConfig): off
        self._views = views
        self.metrics = metrics
        self._clock = clock
        self._super = frozenset(config.super_users)
        self._seen: tuple[object, int] | None = None          # (applier, its access_changes) the caches hold
        self._principals: dict[str, Principal] = {}
        self._tokens: dict[str, tuple[str, int]] = {}         # token -> (user, expires_ms; 0: never)
        self._users: dict[str, bool] = {}                     # SASL name -> whether it is a user

    # --- who ------------------------------------------------------------------------------------

    def principal(self, caller: Caller) -> Principal:
        """The principal `caller` authenticates as, with its current grants; AuthenticationError when it
        shows no credential, or a token that is no user's (or expired)."""
        if caller.node is not None:
            return Principal(f"{NODE_PREFIX}{caller.node}", NODE_GRANTS)
        name = caller.authenticated or caller.certificate
        if caller.authenticated is not None and not self._is_user(caller.authenticated):
            # SASL authenticates a connection once: a user removed since ends it at its next request.
            raise AuthenticationError(f"authentication failed: user {caller.authenticated} was removed")
        if name is None and caller.token:
            name = self._token_user(caller.token)
        if name is None:
            raise AuthenticationError("no credential: present a client certificate, a bearer token or SASL "
                                      "credentials")
        return self._grants(name)

    def _fresh(self) -> ViewsStateMachine | None:
        views = self._views()
        seen = None if views is None else (views.applier, views.applier.access_changes)
        if seen != self._seen:
            self._principals.clear()
            self._tokens.clear()
            self._users.clear()
            self._seen = seen
        return views

    def _grants(self, name: str) -> Principal:
        views = self._fresh()
        principal = self._principals.get(name)
        if principal is None:
            grants: frozenset[Grant] = frozenset()
            if views is not None:
                grants = principal_at(Query(views.store, METADATA), name).grants
            if name in self._super:
                grants |= {Grant(Role.ADMIN)}
            principal = self._principals[name] = Principal(name, grants)
        return principal

    def _is_user(self, name: str) -> bool:
        self._fresh()
        known = self._users.get(name)
        if known is None:
            known = self._users[name] = self.user(name) is not None
        return known

    def _token_user(self, token: str) -> str:
        views = self._fresh()
        now_ms = int(self._clock() * 1000)
        hit = self._tokens.get(token)
        if hit is None and views is not None:
            for user in self.users(views):
                found = cr.token_matches(user.tokens, token, 0)   # expiry is checked below, cached or not
                if found is not None:
                    hit = self._tokens[token] = (user.name, found.expires_ms)
                    break
        if hit is None or (hit[1] and now_ms >= hit[1]):
            raise AuthenticationError("authentication failed: unknown, revoked or expired token")
        return hit[0]

    @staticmethod
    def users(views: ViewsStateMachine) -> list[UserState]:
        items = []
        after = None
        query = Query(views.store, METADATA)
        while True:
            page = query.list("user/", limit=MAX_LIMIT, after=after)
            items.extend(i.state for i in page.items if isinstance(i.state, UserState))
            if page.next is None:
                return items
            after = page.next

    def user(self, name: str) -> UserState | None:
        """User `name` as the metadata views hold it (the SASL lookups)."""
        views = self._views()
        item = None if views is None else Query(views.store, METADATA).get(f"user/{name}")
        return item.state if item is not None and isinstance(item.state, UserState) else None

    # --- may it -----------------------------------------------------------------------------------

    def check(self, principal: Principal, op: str, actions: Sequence[Action]) -> None:
        """PermissionDeniedError (counted and logged) at the first action `principal` may not do."""
        for action in actions:
            decision = decide(principal, action)
            if not decision.allowed:
                self.denied(principal.name or "anonymous", op, action.resource.partition("/")[0] or action.resource,
                            f"may not {action}: {decision.reason}")
                raise PermissionDeniedError(f"{principal} may not {action}: {decision.reason}")

    def denied(self, principal: str, op: str, resource: str, why: str) -> None:
        logger.warning("access denied: %s %s: %s", principal, op, why)
        if self.metrics is not None:
            self.metrics.denied.labels(principal, op, resource).inc()

    def authenticate(self, caller: Caller, op: str) -> Principal:
        """`principal(caller)`, a refusal counted and logged like a denial."""
        try:
            return self.principal(caller)
        except AuthenticationError as exc:
            self.denied("anonymous", op, "authentication", str(exc))
            raise


def stamped(events: Sequence[ev.Event], actor: str) -> list[ev.Event]:
    """`events` with `actor` as their actor (a Txn's operations too): a client cannot claim another's."""
    out: list[ev.Event] = []
    for event in events:
        if isinstance(event, ev.Txn):
            ops = tuple(op if op.actor == actor else msgspec.structs.replace(op, actor=actor) for op in event.ops)
            event = msgspec.structs.replace(event, ops=ops)
        out.append(event if event.actor == actor else msgspec.structs.replace(event, actor=actor))
    return out


__all__ = ["ANONYMOUS_CALLER", "AccessConfig", "AccessControl", "AccessMetrics", "Caller", "stamped"]
