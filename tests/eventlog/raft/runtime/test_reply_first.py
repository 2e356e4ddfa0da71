"""The callers an apply answers run before the leader's turn steps anything else; a told write's
waiter (`RaftGroup.submit_told`) runs in the apply's turn itself.

One real `RaftGroup` (node 1, made leader by the test, which plays nodes 2 and 3; test_leader_sync.py's
`Leader`). A write is committed by node 2's acknowledgement; node 3's acknowledgement of the same entry
arrives while the leader applies it. The write's caller must resume (its reply would leave) before the
turn steps node 3's acknowledgement, which the caller does not wait for: stepping it first put its peer
checks and the core's step on every single client's path (bench/RESULTS.md issue-20-reply-first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from eventlog.raft.errors import NotLeaderError
from eventlog.raft.runtime.proposals import Committed, Told
from eventlog.raft.types import Entry
from tests.eventlog.raft.runtime.test_follower_sync import run, wait
from tests.eventlog.raft.runtime.test_leader_sync import Leader


def _acking_late(tmp_path: Path) -> tuple[Leader, list[int]]:
    """A leader (not started) and the list to put an index in: node 3 acknowledges that index while the
    leader applies the entry holding it."""
    leader = Leader(tmp_path / "l")
    sm = leader.group.sm
    apply = sm.apply
    late_ack: list[int] = []

    def applying(entries: Sequence[Entry]) -> None:
        apply(entries)
        if late_ack and any(e.index <= late_ack[0] <= e.last_index for e in entries):
            leader.ack(3, late_ack.pop())

    sm.apply = applying  # type: ignore[method-assign]
    return leader, late_ack


def test_a_write_answered_by_an_apply_resumes_before_the_next_acknowledgement_is_stepped(tmp_path: Path) -> None:
    async def main() -> None:
        leader, late_ack = _acking_late(tmp_path)
        leader.group.start()
        try:
            await leader.elect()
            for _ in range(3):
                sent = len(leader.appends_to(2))
                seen: list[int] = []   # node 3's match index as the write's caller resumes

                async def write() -> int:
                    done = await leader.group.submit([(b"k", b"v")])
                    seen.append(leader.group.node.progress[3].match)
                    return done.offset

                task = leader.group.loop.create_task(write())
                await wait(lambda sent=sent: len(leader.appends_to(2)) > sent, "the write's append to node 2")
                index = leader.appends_to(2)[-1].entries[-1].last_index
                late_ack.append(index)
                leader.ack(2, index)
                assert await task == index
                assert seen and seen[0] < index, (
                    f"node 3's acknowledgement of {index} was stepped before the write's caller resumed")
                await wait(lambda index=index: leader.group.node.progress[3].match == index,
                           "node 3's acknowledgement stepped after")
        finally:
            await leader.group.close()

    run(main)


def test_a_told_write_is_told_in_the_turn_that_applies_it_after_the_views_have_it(tmp_path: Path) -> None:
    """`RaftGroup.submit_told`: `then` runs inside the apply's turn (before node 3's acknowledgement,
    which arrives during the apply, is stepped), once the state machine applied the entry (a reply sent
    from there is never ahead of a read). A cancelled waiter is never told; a waiter that raises is logged
    and the group goes on."""
    async def main() -> None:
        leader, late_ack = _acking_late(tmp_path)
        sm = leader.group.sm
        leader.group.start()
        try:
            await leader.elect()
            told: list[tuple[object, int, int]] = []   # (outcome, node 3's match, applied) as told

            def then(outcome: object) -> None:
                told.append((outcome, leader.group.node.progress[3].match, sm.applied_index))

            async def commit(then: Callable[[object], None]) -> tuple[Told, int]:
                sent = len(leader.appends_to(2))
                waiter = leader.group.submit_told([(b"k", b"v")], then)
                await wait(lambda: len(leader.appends_to(2)) > sent, "the write's append to node 2")
                return waiter, leader.appends_to(2)[-1].entries[-1].last_index

            _, index = await commit(then)
            late_ack.append(index)
            leader.ack(2, index)
            await wait(lambda: bool(told), "the write told")
            ((outcome, node3_match, applied),) = told
            assert isinstance(outcome, Committed) and outcome.offset == index
            assert node3_match < index, "node 3's acknowledgement was stepped before the write was told"
            assert applied >= index, "told before the state machine applied the entry"

            waiter, index = await commit(then)
            assert waiter.cancel()   # its caller went (a deadline, a lost connection)
            leader.ack(2, index)
            await wait(lambda: sm.applied_index >= index, "the cancelled write applied")

            def broken(outcome: object) -> None:
                raise RuntimeError("a face's bug")

            _, index = await commit(broken)
            leader.ack(2, index)
            await wait(lambda: sm.applied_index >= index, "the write whose waiter raises applied")
            _, index = await commit(then)
            leader.ack(2, index)
            await wait(lambda: len(told) == 2, "the next write told")
            assert isinstance(told[1][0], Committed) and told[1][0].offset == index
            assert not leader.group.stopped
        finally:
            await leader.group.close()

    run(main)


def test_a_told_write_is_refused_at_once_on_a_follower(tmp_path: Path) -> None:
    async def main() -> None:
        leader = Leader(tmp_path / "l")
        leader.group.start()
        try:
            with pytest.raises(NotLeaderError):
                leader.group.submit_told([(b"k", b"v")], lambda outcome: None)
        finally:
            await leader.group.close()

    run(main)
