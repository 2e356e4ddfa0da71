"""Waiting for what a test asserts: poll a check until it holds, within a bounded deadline.

The machine that runs the suite is shared and loaded, so a test never sleeps for a guessed time and then
asserts: it polls what it is about to assert, and fails with what it waited for once the deadline passes.
`wait_until` blocks (plain tests and the harnesses' own waits); `eventually` is the same wait inside a
coroutine, and takes a plain function or a coroutine function as its check.

A check holds when it returns anything but None or False; that value is returned, so a check can hand
back what it found (a leader, a reply, a time).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _polls(timeout: float, what: str) -> Iterator[None]:
    """One item per attempt; AssertionError naming `what` once an attempt ends past the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        yield
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")


def _holds(result: object) -> bool:
    return result is not None and result is not False


def wait_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call `check` every `interval` seconds until it holds; its result. Blocks the calling thread."""
    for _ in _polls(timeout, what):
        result = check()
        if _holds(result):
            return result  # type: ignore[return-value]
        time.sleep(interval)
    raise AssertionError("unreachable")


async def eventually(check: Callable[[], T | None | Awaitable[T | None]], timeout: float, what: str,
                     interval: float = 0.05) -> T:
    """`wait_until` for coroutines: the loop keeps running between attempts; `check` may be async."""
    for _ in _polls(timeout, what):
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if _holds(result):
            return result  # type: ignore[return-value]
        await asyncio.sleep(interval)
    raise AssertionError("unreachable")
