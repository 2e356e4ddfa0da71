"""UUIDv7 request ids (statemachines/request_ids.py): the layout RFC 9562 gives (made one at a time or a
write's worth at once), unique ids, and a forked child that never repeats its parent's ids (the random
bytes come from a pool read in bulk)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest

from statemachines import request_ids

T0 = 1_764_300_000_000


def _one_at_a_time(count: int) -> list[str]:
    return [request_ids.uuid7(T0 + i) for i in range(count)]


def _in_batches(count: int) -> list[str]:   # as the SDK stamps a write's events: one call per write
    return [text for i in range(0, count, 100) for text in request_ids.uuid7s(min(100, count - i), T0 + i)]


@pytest.mark.parametrize("make", [_one_at_a_time, _in_batches])
def test_ids_have_the_rfc_layout_and_carry_their_time(make: Callable[[int], list[str]]) -> None:
    ids = make(5000)
    for i, text in enumerate(ids):
        parsed = uuid.UUID(text)
        assert str(parsed) == text   # lower-case hex, dashes at 8-4-4-4-12
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert request_ids.time_of(text) == T0 + (i if make is _one_at_a_time else i - i % 100)
    assert len(set(ids)) == len(ids)
    # The random part is random: each of its 74 bits (62 below the variant, 12 after the version) is set in
    # some id and clear in another.
    bits = [uuid.UUID(text).int for text in ids]
    assert all(any(b >> k & 1 for b in bits) and not all(b >> k & 1 for b in bits)
               for k in [*range(62), *range(64, 76)])


def test_a_forked_child_makes_other_ids_than_its_parent() -> None:
    request_ids.uuid7(T0)   # the pool holds bytes the parent has not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its next ids, to the parent
        try:
            os.write(write, "\n".join(request_ids.uuid7(T0) for _ in range(100)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split("\n"))
    os.waitpid(pid, 0)
    parent = {request_ids.uuid7(T0) for _ in range(100)}
    assert len(child) == 100 and not child & parent
