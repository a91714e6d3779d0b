"""Waiting on conditions in tests, never on fixed sleeps: a busy machine only makes a test slower.

``wait_until`` polls a predicate until it holds or a generous deadline passes (then fails naming
what never happened); ``distinct_millisecond`` returns a wall-clock millisecond strictly after every
commit made before the call and strictly before every commit made after it returns.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

__all__ = ["wait_until", "distinct_millisecond"]

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 120.0, poll: float = 0.02) -> T:
    """Return the first truthy ``predicate()``; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(poll)


def distinct_millisecond() -> int:
    """A millisecond timestamp no earlier commit shares and no later commit can have."""
    before = int(time.time() * 1000)
    wait_until(lambda: int(time.time() * 1000) > before, "the clock moving on", timeout=10, poll=0.0005)
    middle = int(time.time() * 1000)
    wait_until(lambda: int(time.time() * 1000) > middle, "the clock moving on", timeout=10, poll=0.0005)
    return middle
