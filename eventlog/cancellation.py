"""Stopping asyncio tasks so that a stop always ends: `cancel_and_wait`.

Cancelling a task once and awaiting it is not enough on Python 3.11. `asyncio.wait_for` returns its
inner result instead of raising `CancelledError` when the cancel arrives in the same loop turn as
that result (the inner future is done when the cancelled waiter wakes it; fixed in 3.12, whose
`wait_for` is built on `asyncio.timeout`). A periodic task (a check every few hundred ms around a
`wait_for`) then goes on to its next round as if nothing had happened, and a stop awaiting it waits
forever: a node asked to stop never exits. Every background task a node stops goes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

RECANCEL_S = 1.0   # a task still running this long after its cancel is cancelled again


async def cancel_and_wait(tasks: Iterable[asyncio.Future[object]], *, recancel_s: float = RECANCEL_S) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again each `recancel_s` those that
    swallowed it. A task's own exception is consumed (it is shutting down), never raised here."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_s)
    for task in tasks:
        if not task.cancelled():
            task.exception()   # retrieved: no "exception was never retrieved" at exit
