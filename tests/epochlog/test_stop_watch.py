"""A node's stop says where it waits: a slow step by name, and the stacks when the stop overruns."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from epochlog.stop_watch import StopWatch


async def _stuck_forever(never: asyncio.Future[None]) -> None:
    await never


def test_a_stop_that_overruns_names_its_step_and_writes_every_task_and_thread_stack(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="epochlog.stop_watch")
    dump = tmp_path / "stderr"

    async def main() -> None:
        with dump.open("w") as out:
            watch = StopWatch("node 7", slow_step_s=0.05, dump_after_s=0.3, out=out)
            watch.start()
            never = asyncio.get_running_loop().create_future()
            stuck = asyncio.get_running_loop().create_task(_stuck_forever(never), name="stuck-task")
            with watch.step("the digest check"):
                await asyncio.sleep(0.5)                       # past the dump, the loop turning
            with watch.step("group kv"):
                time.sleep(0.5)                                # past the thread dump, the loop held
            watch.close()
            stuck.cancel()

    asyncio.run(main())
    text = dump.read_text()
    assert "--- task stuck-task" in text and "_stuck_forever" in text, text
    assert "(most recent call first)" in text and "test_stop_watch.py" in text, text   # faulthandler's dump
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("node 7: still stopping after") and "at the digest check" in m for m in messages)
    assert any(m.startswith("node 7: stopping the digest check took") for m in messages), messages
    assert any(m.startswith("node 7: stopping group kv took") for m in messages), messages


def test_a_stop_within_its_bounds_logs_nothing_and_dumps_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="epochlog.stop_watch")
    dump = tmp_path / "stderr"

    async def main() -> None:
        with dump.open("w") as out:
            watch = StopWatch("node 7", slow_step_s=5.0, dump_after_s=0.2, out=out)
            watch.start()
            with watch.step("the client service"):
                await asyncio.sleep(0.01)
            watch.close()
            await asyncio.sleep(0.4)                           # past where the dumps were armed

    asyncio.run(main())
    assert dump.read_text() == ""
    assert not caplog.records
