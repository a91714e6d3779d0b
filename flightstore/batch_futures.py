"""Futures completed a batch at a time: the lookuper's answers (:mod:`flightstore.lookuper`).

A :class:`concurrent.futures.Future` makes a ``threading.Condition`` of its own and, on
``set_result``, takes its lock and notifies it: per key of a batched lookup that cost as much as
the lookup's share of the server's work. A :class:`BatchFuture` is a real ``Future`` (``wait``,
``as_completed``, ``add_done_callback``, ``cancel`` and ``asyncio.wrap_future`` work on it) whose
condition is shared by the futures of one owner, and :func:`complete` / :func:`fail` finish many of
them under that lock once, with one ``notify_all`` (a future with done callbacks ends such a run:
its callbacks run before the futures after it are finished, as with ``set_result`` one by one).
Because one notification may wake a thread
waiting on another future of the owner, :meth:`BatchFuture.result` and
:meth:`BatchFuture.exception` wait in a loop until their own future is done or their timeout has
passed (the stock methods wait once); a done future answers without taking the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, PENDING, RUNNING
from typing import Any

__all__ = ["BatchFuture", "complete", "fail"]

_UNDONE = (PENDING, RUNNING)


class BatchFuture(Future):
    """A Future whose condition is ``condition`` (shared; see the module doc)."""

    def __init__(self, condition: threading.Condition) -> None:  # noqa: D107 - no super().__init__:
        # it would make the Condition this class exists to share
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []

    def _wait_done(self, timeout: float | None) -> None:
        """Wait (under the condition) until this future is done; TimeoutError past ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._state in _UNDONE:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError()
            self._condition.wait(left)

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED and self._exception is None:  # done: no lock to take
            return self._result
        with self._condition:
            self._wait_done(timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        with self._condition:
            self._wait_done(timeout)
        return super().exception(0)


def complete(condition: threading.Condition, answers: Iterable[tuple[BatchFuture, Any]]) -> None:
    """Set each future's result (futures of ``condition``), in order: one lock and one notification
    per run of futures without done callbacks; callbacks run in this thread, as ``set_result``
    runs them. A future already done (cancelled, failed by a timeout) is left as it is."""
    _finish(condition, answers, exception=False)


def fail(condition: threading.Condition, futures: Iterable[BatchFuture], error: BaseException) -> None:
    """Fail each future (of ``condition``) with ``error``, as :func:`complete` sets results."""
    _finish(condition, ((future, error) for future in futures), exception=True)


def _finish(condition: threading.Condition, outcomes: Iterable[tuple[BatchFuture, Any]], exception: bool) -> None:
    """Finish the futures in order, under one lock for each run of futures without done callbacks;
    a future with callbacks ends its run, and its callbacks run (outside the lock) before the next
    future is finished, as ``set_result`` one by one does: a slow callback holds back the futures
    after it (a caller adding a callback to one of those does not find it done and run the
    callback in its own thread)."""
    outcomes = iter(outcomes)
    while True:
        called = None
        with condition:
            for future, value in outcomes:
                if future._state not in _UNDONE:
                    continue
                if exception:
                    future._exception = value
                else:
                    future._result = value
                future._state = FINISHED
                for waiter in future._waiters:  # concurrent.futures.wait / as_completed
                    if exception:
                        waiter.add_exception(future)
                    else:
                        waiter.add_result(future)
                if future._done_callbacks:
                    called = future
                    break
            condition.notify_all()
        if called is None:
            return
        called._invoke_callbacks()
