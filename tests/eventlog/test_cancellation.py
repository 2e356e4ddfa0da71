"""`cancel_and_wait` ends a periodic task whose cancel `asyncio.wait_for` swallowed (Python 3.11).

The shape is the views digest check's (epochlog/integrity.py): a round every interval, each around a
`wait_for` on a peer's answer. When the answer lands in the same loop turn as the stop's cancel, 3.11's
`wait_for` returns the answer and the task goes on to its next round: a node waiting for it once never
stopped (a CI run: "node 2 did not stop within 10.0s of SIGTERM", the digest check's leader).
"""

from __future__ import annotations

import asyncio
import sys

from eventlog.cancellation import cancel_and_wait


class PeriodicCheck:
    """A round per loop turn, each waiting up to `timeout` for an answer the test gives (`answers`)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.rounds = 0
        self.asked: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0)
            answer: asyncio.Future[None] = loop.create_future()
            self.asked.put_nowait(answer)
            try:
                await asyncio.wait_for(answer, self.timeout)
            except TimeoutError:
                pass
            self.rounds += 1


async def _answer_and_cancel_in_one_turn(check: PeriodicCheck, task: asyncio.Task[None]) -> None:
    answer = await check.asked.get()
    await asyncio.sleep(0)          # the task is parked in wait_for
    answer.set_result(None)         # the answer lands...
    task.cancel()                   # ...in the same turn as the cancel


def test_one_cancel_is_swallowed_by_wait_for_on_this_python() -> None:
    """The hazard itself, so the helper's reason stays visible: on 3.11 the task survives its cancel."""
    async def main() -> tuple[bool, int]:
        check = PeriodicCheck()
        task = asyncio.get_running_loop().create_task(check.run())
        await _answer_and_cancel_in_one_turn(check, task)
        done, _ = await asyncio.wait({task}, timeout=0.5)
        survived = not done
        await cancel_and_wait([task], recancel_s=0.05)
        return survived, check.rounds

    survived, rounds = asyncio.run(main())
    if sys.version_info < (3, 12):
        assert survived and rounds >= 1, "3.11's wait_for returned the answer and the task went on"
    else:
        assert not survived


def test_cancel_and_wait_ends_a_task_whose_first_cancel_was_swallowed() -> None:
    async def main() -> tuple[asyncio.Task[None], int]:
        check = PeriodicCheck()
        task = asyncio.get_running_loop().create_task(check.run())
        answer = await check.asked.get()
        await asyncio.sleep(0)
        answer.set_result(None)     # lands in the turn of cancel_and_wait's first cancel
        await asyncio.wait_for(cancel_and_wait([task], recancel_s=0.05), 10.0)
        return task, check.rounds

    task, rounds = asyncio.run(main())
    assert task.cancelled()
    if sys.version_info < (3, 12):
        assert rounds >= 1, "the first cancel was swallowed: the task went on to a second round"


def test_cancel_and_wait_consumes_a_tasks_failure_and_returns_at_once_for_ended_tasks() -> None:
    async def fails() -> None:
        raise OSError("a peer hung up")

    async def main() -> list[asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        failed = loop.create_task(fails())
        await asyncio.sleep(0)
        sleeping = loop.create_task(asyncio.sleep(60))
        await asyncio.wait_for(cancel_and_wait([failed, sleeping]), 10.0)
        await cancel_and_wait([])
        return [failed, sleeping]

    failed, sleeping = asyncio.run(main())
    assert isinstance(failed.exception(), OSError)
    assert sleeping.cancelled()
