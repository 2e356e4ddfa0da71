"""Roles and grants: what an ACL entry says a principal may be (value types and their syntax only).

A grant is a role and, for the scoped roles, the one resource it is scoped to:

    admin                         everything a client may do (never a controller decision or a node's record)
    auditor                       read-only: every entity, history, whole logs, the nodes' operational state
    writer    kv:<prefix>         write and read kv keys whose name starts with <prefix> ("" = every key)
              topic:<name>        produce to and read the Kafka topic <name>, commit and read its consumer
              topic:<prefix>*     offsets, read its route; "topic:*" = every topic
              group:<id>          be a member of the Kafka consumer group <id> (join, sync, heartbeat, leave,
              group:<prefix>*     commit and fetch its offsets: Kafka's Read on a group); "group:*" = every
                                  group. Committing a topic's offsets also needs reading the topic.
    reader    kv:<prefix>         read those kv keys
              topic:<name>        read those topics, commit and read their consumer offsets
              group:<id>          as for writer: a consumer needs its group as much as its topics
    broker    <cluster>/<group>/<name>
                                  act as that one broker: its registration, heartbeats, SyncStateSet reports
                                  and controlled shutdown, nothing of another broker's
    controller, node              internal: the controller's decisions and the node's own records. Never
                                  granted (an ACL event naming them is invalid), never the principal of a
                                  client connection: statemachines/access.py keeps those events to the
                                  node's own code paths.

Imports nothing of Epochlog's, so events (statemachines/events.py) and the rule
(statemachines/access.py) share it without a cycle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

MAX_PRINCIPAL = 256
MAX_RESOURCE = 1024
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@=, +-]{0,255}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_TOPIC = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:-]{0,127}$")


class Role(StrEnum):
    ADMIN = "admin"
    AUDITOR = "auditor"
    WRITER = "writer"
    READER = "reader"
    BROKER = "broker"
    CONTROLLER = "controller"
    NODE = "node"


GRANTABLE = (Role.ADMIN, Role.AUDITOR, Role.WRITER, Role.READER, Role.BROKER)
"""The roles an ACL entry may grant; CONTROLLER and NODE belong to the node's own code only."""


class GrantSyntaxError(ValueError):
    """A principal name, role or resource an ACL entry cannot hold (the message says the syntax)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One role, scoped to `resource` for writer, reader and broker (see the module doc)."""

    role: Role
    resource: str = ""

    def kv_prefix(self) -> str | None:
        """The kv name prefix a writer or reader grant covers, or None when it is not a kv grant."""
        return self.resource[3:] if self.resource.startswith("kv:") else None

    def covers_topic(self, topic: str) -> bool:
        """Whether this (writer or reader) grant is scoped to the topic `topic`."""
        return self._covers("topic:", topic)

    def covers_group(self, group_id: str) -> bool:
        """Whether this (writer or reader) grant is scoped to the Kafka consumer group `group_id`."""
        return self._covers("group:", group_id)

    def _covers(self, kind: str, name: str) -> bool:
        if not self.resource.startswith(kind):
            return False
        pattern = self.resource[len(kind):]
        return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern

    def __str__(self) -> str:
        return f"{self.role.value}:{self.resource}" if self.resource else self.role.value


def check_principal(name: str) -> None:
    """GrantSyntaxError unless `name` can name a principal (a user, a certificate's name)."""
    if not _PRINCIPAL.match(name):
        raise GrantSyntaxError(f"principal {name!r} must be 1-{MAX_PRINCIPAL} characters of letters, digits and "
                               f"._:@=, +- starting with a letter or digit")


def parse_grant(role: str, resource: str = "") -> Grant:
    """The grant an ACL entry names, checked: GrantSyntaxError says what is wrong."""
    try:
        r = Role(role)
    except ValueError:
        raise GrantSyntaxError(f"role {role!r} is not one of {', '.join(g.value for g in GRANTABLE)}") from None
    if r not in GRANTABLE:
        raise GrantSyntaxError(f"role {role!r} is the node's own and cannot be granted")
    if len(resource.encode()) > MAX_RESOURCE or "\x00" in resource:
        raise GrantSyntaxError(f"a resource is at most {MAX_RESOURCE} bytes of UTF-8 without NUL")
    if r in (Role.ADMIN, Role.AUDITOR):
        if resource:
            raise GrantSyntaxError(f"role {r.value} covers everything it may do: it takes no resource")
    elif r in (Role.WRITER, Role.READER):
        kind, sep, pattern = resource.partition(":")
        if kind in ("topic", "group"):
            name = pattern[:-1] if pattern.endswith("*") else pattern
            if pattern != "*" and not (_TOPIC if kind == "topic" else _NAME).match(name):
                raise GrantSyntaxError(f"{kind} {pattern!r}: a {kind} name, a name prefix ending in '*', or '*'")
        elif kind != "kv" or not sep:
            raise GrantSyntaxError(f"role {r.value} is scoped: kv:<key prefix>, topic:<name>|<prefix>*|* or "
                                   f"group:<consumer group>|<prefix>*|*")
    else:   # broker
        parts = resource.split("/")
        if len(parts) != 3 or not all(_NAME.match(x) for x in parts):
            raise GrantSyntaxError("role broker is bound to one broker: <cluster>/<group>/<name>")
    return Grant(r, resource)
