"""Waiting for a condition, bounded: the one polling helper of the suite.

A test that waits for something to happen (a message to arrive, a count to
change, a process to come up) polls a condition with :func:`wait_until` (in
async tests) or :func:`wait_until_blocking` (elsewhere), never sleeps a fixed
time. The time-out is a guard against a hang, not a claim about speed: one
generous default for every test, so a loaded machine (CI's two cores, parallel
workers) makes a test slower, never red.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["WAIT_TIMEOUT", "wait_until", "wait_until_blocking"]

T = TypeVar("T")

#: Seconds a wait may take before it fails (every wait of the suite, unless it says otherwise).
WAIT_TIMEOUT = 60.0
#: Seconds between two polls.
INTERVAL = 0.05


@overload
async def wait_until(
    condition: Callable[[], Awaitable[T]],
    what: str,
    *,
    timeout: float = WAIT_TIMEOUT,
    interval: float = INTERVAL,
) -> T: ...
@overload
async def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float = WAIT_TIMEOUT,
    interval: float = INTERVAL,
) -> T: ...
async def wait_until(
    condition: Callable[[], Any],
    what: str,
    *,
    timeout: float = WAIT_TIMEOUT,
    interval: float = INTERVAL,
) -> Any:
    """Poll ``condition`` until it returns something true, and return that.

    Args:
        condition: called (and awaited, when it returns an awaitable) every
            ``interval`` seconds; an exception it raises ends the wait.
        what: what is awaited, for the failure's message.
        timeout: seconds before giving up.
        interval: seconds between two polls.

    Raises:
        AssertionError: ``condition`` was still false after ``timeout`` seconds
            (the message names ``what`` and the last value).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"never happened within {timeout} s: {what} (last: {value!r})")
        await asyncio.sleep(interval)


def wait_until_blocking(
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float = WAIT_TIMEOUT,
    interval: float = INTERVAL,
) -> T:
    """:func:`wait_until` for synchronous code: blocks the calling thread between polls.

    Raises:
        AssertionError: ``condition`` was still false after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout} s: {what} (last: {value!r})")
        time.sleep(interval)
