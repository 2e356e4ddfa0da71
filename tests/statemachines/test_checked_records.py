"""`checked_records` (the leader's check of a write's events in one decode call) against `checked_record`,
the one-by-one check it stands for: the same keys, values and decoded events when every event passes,
and None (so that `Node.write` checks one by one and raises the refusal at its event) when any does not."""

from __future__ import annotations

import random
from typing import Any

import pytest

from statemachines import events as ev


def _event(rng: random.Random, i: int) -> tuple[ev.Event, bool]:
    """A random event and whether `checked_record` should refuse it."""
    kind = rng.randrange(12)
    if kind == 0:
        return ev.KvPut(name="", value=b"x"), True                        # invalid: validate refuses it
    if kind == 1:
        return ev.KvPut(name=f"app/{i}", value=b"x", v=99), True          # a newer version than this code
    if kind == 2:
        bad: Any = i                                                      # encodes, but does not decode as a str
        return ev.KvPut(name=bad, value=b"x"), True
    if kind == 3:
        return ev.KvPut(name=f"app/{i}", value=b"x", lease=1 << 70), True   # does not encode
    if kind == 4:
        ops = [ev.KvPut(name=f"app/t{i}/{j}", value=rng.randbytes(rng.randrange(40))) for j in range(rng.randrange(1, 4))]
        return ev.Txn(ops=ops), False
    if kind == 5:
        return ev.KvDeleted(name=f"app/{i}"), False
    if kind == 6:
        return ev.KvPut(name=f"app/{i}", value=b"v", v=2, session_id=7, seq=i + 1, answered_below=1), False
    return ev.KvPut(name=f"app/{'é' * rng.randrange(3)}{i}", value=rng.randbytes(rng.randrange(300))), False


def _one_by_one(events: list[ev.Event]) -> list[tuple[bytes, bytes, ev.Event]] | None:
    try:
        return [ev.checked_record(e) for e in events]
    except (ev.EventError, OverflowError):
        return None


@pytest.mark.parametrize("seed", range(6))
def test_checked_records_is_checked_record_of_each_or_none(seed: int) -> None:
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(300):
        count = rng.choice([1, 2, 15, 16, 17, 100, 256, rng.randrange(1, 300)])
        bad = rng.randrange(count) if rng.random() < 0.3 else -1   # the one event refused, if any
        events: list[ev.Event] = []
        for i in range(count):
            while True:
                e, refused = _event(rng, i)
                if refused == (i == bad):
                    break
            events.append(e)
        expected = _one_by_one(events)
        assert ev.checked_records(events) == expected
        assert (expected is None) == (bad >= 0)


def test_a_count_past_every_array_header_size_decodes_whole() -> None:
    for count in (15, 16, 65535, 65536):
        events: list[ev.Event] = [ev.KvPut(name=f"k{i}", value=b"") for i in range(count)]
        checked = ev.checked_records(events)
        assert checked is not None and len(checked) == count
        assert checked[-1] == ev.checked_record(events[-1])
