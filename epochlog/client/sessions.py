"""The SDK's client sessions: every write is applied at most once, and the caller learns when it cannot know.

The node keeps, per client session, the outcome of each request until the client says it saw it
(statemachines/sessions.py). This side opens one session per group on the first write to it (a
`ClientSessionOpened` event; the session id is the offset it committed at), numbers the events of
every write (`seq`), and tells the node, with each write, the lowest sequence whose answer it has not
seen yet (`answered_below`). A retry re-sends the same (session, seq): it is answered with the first
outcome, however late it arrives.

A write is *in doubt* once an attempt may have been proposed without this side learning the outcome
(a timeout, a dropped connection, a leader that lost leadership after proposing it: retry.Attempts). If the node then
answers `session_expired` (or `request_expired`), the write may or may not have been applied:
`OutcomeUnknownError`, and the write is never re-sent under a new session. A write refused that way
while not in doubt was applied nowhere: it is re-sent under a new session.

Use on the client's asyncio loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class GroupSession:
    """This client's session in one group: its id, the next sequence, and the writes in flight."""

    group: str
    id: int
    next_seq: int = 1
    # The sequences of each write in flight, by its first one. A write takes the next sequences, so
    # insertion order is sequence order and the first key is the lowest sequence not answered.
    _in_flight: dict[int, range] = field(default_factory=dict)

    def take(self, n: int) -> range:
        """`n` new sequences for one write, in flight until `answered`."""
        seqs = range(self.next_seq, self.next_seq + n)
        self.next_seq += n
        if n:
            self._in_flight[seqs.start] = seqs
        return seqs

    def answered(self, seqs: range) -> None:
        """The write with these sequences (as `take` gave them) got its answer, or was given up: its fate
        no longer matters to the session, and a late copy of it is refused once `answered_below` passes it."""
        self._in_flight.pop(seqs.start, None)

    @property
    def answered_below(self) -> int:
        """Every sequence below this was answered: the node may forget their outcomes."""
        return next(iter(self._in_flight), self.next_seq)


Opener = Callable[[str, str], Awaitable[int]]
"""(group, client name) -> the id of a new session in that group (commits ClientSessionOpened)."""


class ClientSessions:
    """The sessions of one client, one per group, opened on first use."""

    def __init__(self, client_name: str, opener: Opener) -> None:
        self.client = f"{client_name}/{os.getpid()}-{os.urandom(6).hex()}"
        self._opener = opener
        self._sessions: dict[str, GroupSession] = {}
        self._opening: dict[str, asyncio.Future[GroupSession]] = {}

    def current(self, group: str) -> GroupSession | None:
        """The group's open session, if any (`get` opens one)."""
        return self._sessions.get(group)

    async def get(self, group: str) -> GroupSession:
        """The group's session, opening one (once, whoever asks meanwhile) when there is none."""
        session = self._sessions.get(group)
        if session is not None:
            return session
        pending = self._opening.get(group)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[GroupSession] = asyncio.get_running_loop().create_future()
        self._opening[group] = future
        try:
            session = GroupSession(group, await self._opener(group, self.client))
            self._sessions[group] = session
            future.set_result(session)
            return session
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()   # retrieved: waiters re-raise it
            raise
        finally:
            del self._opening[group]

    def expired(self, session: GroupSession) -> None:
        """The node no longer knows `session`: the next write of its group opens a new one."""
        if self._sessions.get(session.group) is session:
            del self._sessions[session.group]

    def open_sessions(self) -> list[GroupSession]:
        return list(self._sessions.values())

    def forget_all(self) -> None:
        self._sessions.clear()

