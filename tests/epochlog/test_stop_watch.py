"""A node's stop says where it waits: a slow step by name, and the stacks when the stop overruns."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from epochlog.stop_watch import StopWatch
from tests.support.wait import eventually

WAIT_S = 30.0


async def _stuck_forever(never: asyncio.Future[None]) -> None:
    await never


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "epochlog.stop_watch"]


def _stop(dump: Path, body: Callable[[StopWatch], object], **bounds: float) -> None:
    """Run `body(watch)` as a stop timed by a StopWatch writing its dumps to `dump`."""
    async def main() -> None:
        with dump.open("w") as out:
            watch = StopWatch("node 7", out=out, **bounds)
            watch.start()
            try:
                await body(watch)   # type: ignore[misc]
            finally:
                watch.close()

    asyncio.run(main())


def test_a_stop_that_overruns_names_its_step_and_writes_every_task_and_thread_stack(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="epochlog.stop_watch")
    dump = tmp_path / "stderr"

    async def body(watch: StopWatch) -> None:
        never = asyncio.get_running_loop().create_future()
        stuck = asyncio.get_running_loop().create_task(_stuck_forever(never), name="stuck-task")
        with watch.step("the digest check"):     # the loop turns, the step does not end: the task dump
            await eventually(lambda: "--- task stuck-task" in dump.read_text(), WAIT_S, "the tasks' stacks")
        with watch.step("group kv"):              # the loop held: the thread dump, from its own thread
            time.sleep(0.2)
        await eventually(lambda: "--- thread MainThread" in dump.read_text(), WAIT_S, "the threads' stacks")
        stuck.cancel()

    _stop(dump, body, slow_step_s=0.1, dump_after_s=0.3)
    text = dump.read_text()
    assert "_stuck_forever" in text, text
    assert "node 7: still stopping after" in text and "test_stop_watch.py" in text, text
    messages = _messages(caplog)
    assert any(m.startswith("node 7: still stopping after") and "at the digest check" in m for m in messages)
    assert any(m.startswith("node 7: stopping the digest check took") for m in messages), messages
    assert any(m.startswith("node 7: stopping group kv took") for m in messages), messages


def test_a_stop_within_its_bounds_logs_nothing_and_dumps_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="epochlog.stop_watch")
    dump = tmp_path / "stderr"

    async def body(watch: StopWatch) -> None:
        with watch.step("the client service"):
            await asyncio.sleep(0)
        watch.close()                          # in the turn that armed the dumps: well within 2 s
        await asyncio.sleep(2.5)               # past where they were due

    _stop(dump, body, slow_step_s=30.0, dump_after_s=2.0)
    assert dump.read_text() == ""
    assert not _messages(caplog)
