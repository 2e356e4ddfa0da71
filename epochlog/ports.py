"""Whether a member's addresses can be listened on, checked before anything starts.

`epochlog serve` checks its own member's addresses, `epochlog up` every member's before it starts a
process: a port another process listens on is refused in one line naming the address, instead of a
traceback from deep inside a server's start (or, for `up`, a status view of whatever answers there).
"""

from __future__ import annotations

import dataclasses
import errno
import socket
from collections.abc import Iterator

from eventlog.raft.runtime.config import MemberConfig, parse_address

# Every address a member listens on (peer, client, admin, grpc, kafka).
ADDRESS_KINDS = tuple(f.name for f in dataclasses.fields(MemberConfig) if f.name.endswith("_address"))


def addresses(member: MemberConfig) -> Iterator[tuple[str, str]]:
    """(kind, address) of every address the member listens on."""
    for kind in ADDRESS_KINDS:
        address = getattr(member, kind)
        if address:
            yield kind, address


def address_taken(address: str, kind: str) -> str | None:
    """Why `address` cannot be listened on now (None: it can). Bound as the node's servers bind
    (SO_REUSEADDR), so a port a stopped node left in TIME_WAIT counts as free, a listener as taken."""
    host, port = parse_address(address, kind)
    if port == 0:
        return None
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use by another process"
            return exc.strerror or type(exc).__name__
    return None


def taken_addresses(member: MemberConfig) -> list[tuple[str, str, str]]:
    """(kind, address, why) of each of the member's addresses that cannot be listened on."""
    out = []
    for kind, address in addresses(member):
        why = address_taken(address, f"cluster.members[{member.id}].{kind}")
        if why is not None:
            out.append((kind, address, why))
    return out
