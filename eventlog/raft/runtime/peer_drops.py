"""Peer messages dropped by the checks (eventlog/raft/peer_check.py): counted, and logged at a bounded rate.

One per node, shared by its groups. A flood of bad messages must not flood the log too: each reason
logs its first drop at once, then at most one WARNING per `log_interval_s`, saying how many of that
reason were dropped since its last line. The counts (by reason, since start) feed the metric
`epochlog_peer_messages_dropped_total{reason}`.

Call from the node's loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from eventlog.raft.peer_check import REASONS, Drop
from eventlog.raft.types import Message

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0


class PeerDrops:
    """Counts by reason; one WARNING per reason per `log_interval_s` at most."""

    def __init__(self, node_id: int, *, log_interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.counts: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._interval = log_interval_s
        self._clock = clock
        self._last_logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}     # drops since the reason's last line

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def dropped(self, group: str, peer: int, drop: Drop, msg: Message | None = None) -> None:
        reason = drop.reason
        self.counts[reason] += 1
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now = self._clock()
        last = self._last_logged.get(reason)
        if last is not None and now - last < self._interval:
            return
        n = self._unlogged.pop(reason)
        self._last_logged[reason] = now
        what = type(msg).__name__ if msg is not None else "message"
        more = f" ({n} dropped for this reason since the last such line)" if n > 1 else ""
        logger.warning("node %s: dropped a %s of group %r from peer %s: %s: %s%s", self.node_id, what,
                       group[:64], peer, reason, drop.detail[:300], more)
