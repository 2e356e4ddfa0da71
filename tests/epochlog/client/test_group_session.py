"""The SDK's per-group session bookkeeping (epochlog/client/sessions.GroupSession): `answered_below` is always
the lowest sequence whose write has not been answered, whatever order the answers come in. It is what lets
the node forget outcomes, so one too high would let a late retry of an unanswered write apply twice."""

from __future__ import annotations

import os
import random

from epochlog.client.sessions import GroupSession


def test_answered_below_is_the_lowest_unanswered_sequence_in_any_answer_order() -> None:
    seed = int(os.environ.get("EPOCHLOG_SESSION_SEED", random.randrange(1 << 32)))
    print(f"EPOCHLOG_SESSION_SEED={seed}")
    rng = random.Random(seed)
    for _ in range(200):
        session = GroupSession("kv", 7)
        unanswered: set[int] = set()
        in_flight: list[range] = []
        taken: set[int] = set()
        for _ in range(rng.randrange(1, 60)):
            if in_flight and rng.random() < 0.45:
                seqs = in_flight.pop(rng.randrange(len(in_flight)))
                session.answered(seqs)
                unanswered -= set(seqs)
            else:
                seqs = session.take(rng.choice((1, 1, 3, 100)))
                assert not taken & set(seqs), seed   # a sequence is never given twice
                taken |= set(seqs)
                in_flight.append(seqs)
                unanswered |= set(seqs)
            assert session.answered_below == min(unanswered, default=session.next_seq), seed
