"""The callers an apply answers run before the leader's turn steps anything else.

One real `RaftGroup` (node 1, made leader by the test, which plays nodes 2 and 3; test_leader_sync.py's
`Leader`). A write is committed by node 2's acknowledgement; node 3's acknowledgement of the same entry
arrives while the leader applies it. The write's caller must resume (its reply would leave) before the
turn steps node 3's acknowledgement, which the caller does not wait for: stepping it first put its peer
checks and the core's step on every single client's path (bench/RESULTS.md issue-20-reply-first).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eventlog.raft.types import Entry
from tests.eventlog.raft.runtime.test_follower_sync import run, wait
from tests.eventlog.raft.runtime.test_leader_sync import Leader


def test_a_write_answered_by_an_apply_resumes_before_the_next_acknowledgement_is_stepped(tmp_path: Path) -> None:
    async def main() -> None:
        leader = Leader(tmp_path / "l")
        sm = leader.group.sm
        apply = sm.apply
        late_ack: list[int] = []   # the index node 3 acknowledges while the leader applies it

        def applying(entries: Sequence[Entry]) -> None:
            apply(entries)
            if late_ack and any(e.index <= late_ack[0] <= e.last_index for e in entries):
                leader.ack(3, late_ack.pop())

        sm.apply = applying  # type: ignore[method-assign]
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
