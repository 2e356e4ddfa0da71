"""Request ids without a session: a retry gets the first outcome or a clear refusal, never a second apply.

A client that does not open a session (statemachines/sessions.py) may still make a write idempotent
with a request id. The applier remembers the outcome of each (actor, request id) in the `dedupe`
rows; the question is how long, since a retry can come arbitrarily late (a call stuck on a deposed
leader, retried once the partition heals). An id that carries the time it was made answers it:

- a time-ordered id (a UUIDv7: its first 48 bits are the client's clock in ms when it made the id)
  is remembered until the committed clock (sessions.Clock) passes its time + RETENTION_MS. A request
  whose id is older than that is refused with `request_expired`: it may have been applied, and it is
  not applied again. An id more than MAX_AHEAD_MS ahead of the committed clock is refused as
  invalid (it would be remembered for too long). Deterministic: only committed data decides.
- any other id is written by the node itself (a lease expiry's `expire/<lease>/<version>`, whose
  second application changes nothing anyway) or was written before this rule: the dedupe window
  of the applier (`dedupe_window_offsets`, and no further back than the history floor) applies.
  Client faces refuse such ids (`check_client_request_id`), so no client relies on the window.

Rows: `request_times` 8-byte time (ms) it is forgotten at + dedupe key -> b"" (statemachines/
deadlines.py; the `dedupe` row itself is the applier's). Pure functions over the applier's pending
writes.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Final

from eventlog.errors import INVALID_ARGUMENT, REQUEST_EXPIRED
from statemachines import events as ev
from statemachines.deadlines import Deadlines
from statemachines.state import Outcome

if TYPE_CHECKING:
    from statemachines.apply import Overlay

RETENTION_MS: Final = 3_600_000
"""How long past its time a time-ordered request id is remembered (committed time)."""
MAX_AHEAD_MS: Final = 3_600_000
"""How far ahead of the committed clock a request id's time may be."""
TIMES: Final = Deadlines("request_times", live=None, checked=b"request_times_checked_ms", per_entry=128)
"""When each time-ordered request id is forgotten: the first committed time `admit` refuses it."""


_RANDOM_POOL_BYTES: Final = 10 * 4096


class _RandomPool:
    """Random bytes read from the OS in bulk: one `urandom` per 4,096 ids instead of one per id (it was
    most of an id's cost, and a batched write makes one id per event). Emptied in a forked child, so
    parent and child never hand out the same bytes."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        at = self._at
        if at + n > len(self._pool):
            self._pool, at = os.urandom(max(n, _RANDOM_POOL_BYTES)), 0
        self._at = at + n
        return self._pool[at:at + n]

    def forget(self) -> None:
        self._pool, self._at = b"", 0


_random = _RandomPool()
os.register_at_fork(after_in_child=_random.forget)


def uuid7(at_ms: int | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48 bits of Unix time in ms (now, or `at_ms`), the version 7, 12 random bits,
    the variant 0b10, 62 random bits."""
    return uuid7s(1, at_ms)[0]


def uuid7s(count: int, at_ms: int | None = None) -> list[str]:
    """`count` UUIDv7s of one millisecond (now, or `at_ms`), laid out as `uuid7`'s. Made as text from one
    hex string of random bytes, 20 hex digits per id: the SDK stamps one per event of a write, and a
    hundred of them cost a third of what a hundred `uuid7` calls through bytes cost."""
    ms = time.time_ns() // 1_000_000 if at_ms is None else at_ms
    t = (ms & 0xFFFF_FFFF_FFFF).to_bytes(6, "big").hex()
    head = f"{t[:8]}-{t[8:12]}-7"
    r = _random.take(10 * count).hex()
    variant = _VARIANT_DIGIT
    # digits i..i+3: the 12 bits after the version; i+3: 2 bits under the variant; i+4..i+19: 60 bits
    return [f"{head}{r[i:i + 3]}-{variant[r[i + 3]]}{r[i + 4:i + 7]}-{r[i + 7:i + 19]}"
            for i in range(0, 20 * count, 20)]


_VARIANT_DIGIT: Final = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}
"""A random hex digit -> the hex digit holding the variant 0b10 and two of its random bits."""


def time_of(request_id: str) -> int | None:
    """The time (ms) a UUIDv7 request id was made, or None when the id is not a UUIDv7."""
    text = request_id.replace("-", "") if len(request_id) == 36 else request_id
    if len(text) != 32 or text[12] != "7" or text[16] not in "89abAB":
        return None
    try:
        return int(text[:12], 16)
    except ValueError:
        return None


def check_client_request_id(event: ev.Event) -> None:
    """A client's write: a request id without a session must be a UUIDv7 (EventError otherwise).

    Client faces call it before proposing; the node's own writes do not."""
    if event.request_id and not event.session_id and time_of(event.request_id) is None:
        raise ev.EventError(f"request id {event.request_id!r} is no UUIDv7: a request id without a client session "
                            f"must carry the time it was made (a UUIDv7), so that a late retry is refused rather "
                            f"than applied twice; or open a session (docs/protocol.md, exactly once)")


def admit(ov: Overlay, request_time: int, offset: int, now_ms: int) -> Outcome | None:
    """A refusal for a time-ordered request id outside its window at `now_ms`, else None (look it up)."""
    if request_time + RETENTION_MS < now_ms:
        return Outcome(False, offset, REQUEST_EXPIRED,
                       f"the request id was made {(now_ms - request_time) / 1000:.0f} s before the cluster's "
                       f"committed time, past the {RETENTION_MS // 1000} s it is remembered: the request may have "
                       f"been applied, and is not applied again (check the client's clock)")
    if request_time > now_ms + MAX_AHEAD_MS and now_ms > 0:
        return Outcome(False, offset, INVALID_ARGUMENT,
                       f"the request id's time is {(request_time - now_ms) / 1000:.0f} s ahead of the cluster's "
                       f"committed time (at most {MAX_AHEAD_MS // 1000} s): check the client's clock")
    return None


def remember(ov: Overlay, request_time: int, dedupe_key: bytes) -> None:
    """Index a time-ordered request id's dedupe row for forgetting (when `admit` starts refusing it)."""
    TIMES.add(ov, request_time + RETENTION_MS + 1, dedupe_key)


def forget(ov: Overlay, now_ms: int) -> None:
    """Forget time-ordered request ids past their window (a few per entry: statemachines/deadlines.py);
    call once per entry."""
    for deadline, dedupe_key in TIMES.due(ov, now_ms):
        TIMES.remove(ov, deadline, dedupe_key)
        ov.delete("dedupe", dedupe_key)
