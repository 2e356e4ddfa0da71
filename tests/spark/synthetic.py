"""Offline group directories full of synthetic committed events (benchmarks and tests).

`write_group` writes batches of kv puts and deletes (and a Raft no-op control batch at each term
change, as a real leader would) straight into a segmented log with `eventlog.log.Log`, plus a
`quorum-state` whose commit index covers them all: the layout `OfflineSource` reads
(`<dir>/groups/<group>/log`, `<dir>/groups/<group>/quorum-state`). No cluster needed, so tens of
millions of events take minutes, not hours.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import msgspec

from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.raft.runtime.entries import NOOP_KEY
from eventlog.records import Record, encode_batch, encode_records
from statemachines import events as ev

BASE_TIMESTAMP_MS = 1_767_225_600_000   # 2026-01-01T00:00:00Z


def write_group(data_dir: str | Path, group: str, events: int, *, batch_records: int = 1000, keys: int = 10_000,
                seed: int = 0, ms_per_event: float = 1.0, terms: int = 3, value_bytes: int = 64,
                segment_bytes: int = 64 << 20, timestamp_ms: int = BASE_TIMESTAMP_MS, key_prefix: str = "k/",
                on_event: Callable[[int, int, ev.Event], None] | None = None) -> int:
    """Append `events` events to `<data_dir>/groups/<group>/log` (after what it holds); the last offset
    written, which quorum-state then records as committed. `on_event(offset, timestamp ms, event)` sees
    each one."""
    rng = random.Random(seed)
    group_dir = Path(data_dir) / "groups" / group
    config = LogConfig(segment_bytes=segment_bytes, flush_policy="interval", flush_interval_ms=1000,
                       max_batch_bytes=max(1 << 20, batch_records * (value_bytes + 200)))
    written = 0
    last = -1
    per_term = max(1, events // max(1, terms))
    pad = b"x" * max(0, value_bytes - 8)
    with Log.open(group_dir / "log", config) as log:
        first_term = (log.latest_epoch or 0) + 1
        term = first_term
        log.append(encode_records([Record(0, -1, NOOP_KEY, b"")], leader_epoch=term, control=True), epoch=term)
        while written < events:
            if written >= per_term * (term - first_term + 1) and term - first_term + 1 < terms:
                term += 1
                log.append(encode_records([Record(0, -1, NOOP_KEY, b"")], leader_epoch=term, control=True),
                           epoch=term)
            n = min(batch_records, events - written)
            entries = []
            for i in range(n):
                k = rng.randrange(keys)
                if rng.random() < 0.05:
                    event: ev.Event = ev.KvDeleted(name=f"{key_prefix}{k:08d}", actor="bench", request_id=f"r{seed}-{written + i}")
                else:
                    event = ev.KvPut(name=f"{key_prefix}{k:08d}", value=b"%08d" % (written + i) + pad, actor="bench",
                                     request_id=f"r{seed}-{written + i}")
                entries.append(ev.event_record(event))
            ts = timestamp_ms + int(written * ms_per_event)
            info = log.append(encode_batch(entries, timestamp_ms=ts, leader_epoch=term), epoch=term)
            last = info.last_offset
            if on_event is not None:
                for i, (_, value) in enumerate(entries):
                    on_event(info.base_offset + i, ts, ev.decode_event(value))
            written += n
        log.flush()
    state = {"version": 1, "term": term, "vote": 0, "commit": last, "conf_offsets": [], "conf_scanned_to": 0}
    (group_dir / "quorum-state").write_bytes(msgspec.json.encode(state))
    return last


def write_events(data_dir: str | Path, group: str, events: list[tuple[int, ev.Event]], *, term: int = 1,
                 segment_bytes: int = 64 << 20) -> list[int]:
    """Append `events` ((timestamp ms, event), one batch each) to `<data_dir>/groups/<group>/log` and
    mark them committed in quorum-state; the offset of each event."""
    group_dir = Path(data_dir) / "groups" / group
    config = LogConfig(segment_bytes=segment_bytes, flush_policy="interval", flush_interval_ms=1000)
    offsets = []
    with Log.open(group_dir / "log", config) as log:
        for ts, event in events:
            info = log.append(encode_batch([ev.event_record(event)], timestamp_ms=ts, leader_epoch=term), epoch=term)
            offsets.append(info.base_offset)
        log.flush()
    state = {"version": 1, "term": term, "vote": 0, "commit": offsets[-1] if offsets else -1, "conf_offsets": [],
             "conf_scanned_to": 0}
    (group_dir / "quorum-state").write_bytes(msgspec.json.encode(state))
    return offsets
