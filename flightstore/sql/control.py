"""The stop conditions of one running query: its deadline, an explicit cancel, a caller gone.

A :class:`QueryControl` travels with a query from the server (which knows the caller's gRPC
context and the CancelFlightInfo requests) down to the executor (which checks it between batches)
and the embedded engine (whose watchdog interrupts DuckDB mid-batch when it says stop). It holds no
I/O of its own: ``caller_gone`` is a callable the server supplies (``context.is_cancelled``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from flightstore.errors import Cancelled, DeadlineExceeded, Unavailable

__all__ = ["QueryControl"]


class QueryControl:
    """Whether a query must stop, and why. Thread-safe: the watchdog, a CancelFlightInfo call and
    the query's own thread all read and set it."""

    def __init__(self, timeout_s: float | None = None,
                 caller_gone: Callable[[], bool] | None = None) -> None:
        """``timeout_s`` (``None`` or 0: none) starts counting now; ``caller_gone`` says whether
        whoever asked has cancelled or disconnected."""
        self.timeout_s = timeout_s or None
        self.deadline = None if not timeout_s else time.monotonic() + timeout_s
        self._caller_gone = caller_gone
        self._reason: str | None = None
        self._lock = threading.Lock()

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the query to stop (the first reason given is kept)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason

    @property
    def reason(self) -> str | None:
        """Why the query must stop (``"cancelled"``, ``"disconnected"``, ``"timeout"``,
        ``"shutdown"``), or ``None`` while it may run on."""
        with self._lock:
            if self._reason is None:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self._reason = "timeout"
                elif self._caller_gone is not None and self._caller_gone():
                    self._reason = "disconnected"
            return self._reason

    def detach(self) -> None:
        """Forget ``caller_gone`` (the call it asks about is ending: its context must not be
        touched afterwards, e.g. by a watchdog thread)."""
        with self._lock:
            self._caller_gone = None

    def check(self) -> None:
        """Raise the error the caller should see if the query must stop."""
        reason = self.reason
        if reason is None:
            return
        if reason == "timeout":
            raise DeadlineExceeded(f"the query ran longer than its timeout of {self.timeout_s:g} s "
                                   "(server option query.timeout) and was stopped")
        if reason == "shutdown":  # UNAVAILABLE, not CANCELLED: pyarrow raises KeyboardInterrupt for that
            raise Unavailable("the server is shutting down: the query was stopped; run it again once the "
                              "server is back (or on another server)")
        raise Cancelled(f"the query was stopped: {reason}")
