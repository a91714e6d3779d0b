"""Futures completed a batch at a time (flightstore.batch_futures): still real Futures for wait,
as_completed, callbacks, cancel and asyncio, and a wake-up meant for a sibling future never ends
a wait early."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from flightstore.batch_futures import BatchFuture, complete, fail
from tests.waiting import wait_until

TIMEOUT = 30


def test_a_sibling_completing_does_not_end_a_wait():
    condition = threading.Condition()
    mine, sibling = BatchFuture(condition), BatchFuture(condition)
    got = []
    waiter = threading.Thread(target=lambda: got.append(mine.result(TIMEOUT)))
    waiter.start()
    wait_until(lambda: len(condition._waiters) == 1, "the waiter waits", timeout=TIMEOUT)
    complete(condition, [(sibling, "theirs")])  # wakes the waiter: it must wait on
    wait_until(lambda: len(condition._waiters) == 1, "the waiter waits again", timeout=10)
    assert got == [] and waiter.is_alive()
    complete(condition, [(mine, "mine")])
    waiter.join(TIMEOUT)
    assert got == ["mine"] and sibling.result(0) == "theirs"


def test_timeouts_and_failures():
    condition = threading.Condition()
    futures = [BatchFuture(condition) for _ in range(3)]
    with pytest.raises(concurrent.futures.TimeoutError):
        futures[0].result(0.05)
    with pytest.raises(concurrent.futures.TimeoutError):
        futures[0].exception(0.05)
    assert futures[1].cancel()
    fail(condition, futures, ValueError("gone"))
    with pytest.raises(ValueError, match="gone"):
        futures[0].result(0)
    assert isinstance(futures[2].exception(0), ValueError)
    assert futures[1].cancelled()  # a cancelled future stays cancelled
    complete(condition, [(futures[0], 1)])  # a done future is left as it is
    assert isinstance(futures[0].exception(0), ValueError)


def test_wait_as_completed_callbacks_and_asyncio():
    condition = threading.Condition()
    futures = [BatchFuture(condition) for _ in range(4)]
    called = []
    futures[0].add_done_callback(lambda f: called.append(f.result()))

    async def awaited():
        return await asyncio.wrap_future(futures[3])

    assert concurrent.futures.wait(futures, timeout=0).done == set()
    threading.Thread(target=complete, args=(condition, [(f, i) for i, f in enumerate(futures)])).start()
    done, pending = concurrent.futures.wait(futures[:3], timeout=TIMEOUT)
    assert len(done) == 3 and not pending
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=TIMEOUT)) == [0, 1, 2, 3]
    assert called == [0]
    assert asyncio.run(awaited()) == 3


def test_a_callback_runs_before_the_futures_after_it_are_done():
    """As set_result one by one: a slow callback holds back the later futures of the batch (so a
    caller adding a callback to one of them does not run it in its own thread)."""
    condition = threading.Condition()
    first, second = BatchFuture(condition), BatchFuture(condition)
    seen = []
    first.add_done_callback(lambda f: seen.append((f.result(), second.done())))
    complete(condition, [(first, 1), (second, 2)])
    assert seen == [(1, False)] and second.result(0) == 2
