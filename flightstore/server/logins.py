"""Bounds on password checks, so that logging in cannot exhaust the server.

A password check is an Argon2id computation: with the users file's default profile about 64 MiB
of memory and tens of milliseconds of both cores. Without a bound, 48 concurrent wrong-password
calls took a server from 213 MB to 3.1 GB. :class:`LoginGate` runs checks on its own
``auth.max-concurrent-checks`` threads, at a lower CPU priority (nice +10, which Argon2's own
threads inherit): a flood of logins neither holds more than that many checks' memory nor takes
the CPU from the calls of users who are logged in. Up to ``auth.max-waiting-checks`` more wait
for a thread (at most ``auth.check-wait``), and any further one is refused at once with
UNAVAILABLE.

Repeated failures slow down: after ``auth.failed-logins.burst`` consecutive failed checks for one
user name, each further attempt for that name is refused at once (UNAVAILABLE, no check run, no
thread held) until a delay has passed that doubles with every further failure, from half a second
up to ``auth.failed-logins.max-delay``; a successful check clears it. Unknown names are tracked
like real ones (no difference tells whether a user exists); the table of names is bounded.

The delay is keyed by the user name the caller claims, not by its address: pyarrow's server
middleware (where credentials are checked) is told neither the peer address nor anything of the
connection (``CallInfo`` carries only the method, and the Handshake handler gets no call context).
The concurrency bound holds whatever the keys.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from flightstore.config import SERVER_OPTIONS, server_option
from flightstore.errors import Unavailable

__all__ = ["FIRST_DELAY_S", "LoginGate"]

T = TypeVar("T")
FIRST_DELAY_S = 0.5
MAX_TRACKED_NAMES = 10_000
NICENESS = 10  # added to the checking threads' nice value
log = logging.getLogger("flightstore.server.logins")


def _lower_priority() -> None:
    """Run this thread (and the threads it starts: Argon2's lanes) at a lower CPU priority."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + NICENESS))
    except (AttributeError, OSError):  # not Linux, or not allowed: checks run at normal priority
        log.debug("cannot lower the priority of password checks", exc_info=True)


class LoginGate:
    """Admission and failure backoff of password checks. Thread-safe."""

    def __init__(self, *, max_concurrent: int | None = None, max_waiting: int | None = None,
                 wait_s: float | None = None, failure_burst: int | None = None,
                 max_delay_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """Every bound defaults to its ``auth.*`` option's default."""
        def default(key: str):
            return SERVER_OPTIONS[key].default
        self.max_concurrent = max_concurrent if max_concurrent is not None else default("auth.max-concurrent-checks")
        self.max_waiting = max_waiting if max_waiting is not None else default("auth.max-waiting-checks")
        self.wait_s = wait_s if wait_s is not None else default("auth.check-wait") / 1000
        self.failure_burst = failure_burst if failure_burst is not None else default("auth.failed-logins.burst")
        self.max_delay_s = max_delay_s if max_delay_s is not None else \
            default("auth.failed-logins.max-delay") / 1000
        self.clock = clock
        self._checkers = concurrent.futures.ThreadPoolExecutor(
            self.max_concurrent, thread_name_prefix="flightstore-login", initializer=_lower_priority)
        self._lock = threading.Lock()
        self._admitted = 0  # checks running or waiting for a slot
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # name -> (count, blocked until)
        self.refused = 0  # attempts refused without a check (busy or delayed)

    @classmethod
    def from_options(cls, options: dict) -> LoginGate:
        """A gate with the ``auth.*`` server options of ``options`` (defaults for the others)."""
        return cls(max_concurrent=server_option(options, "auth.max-concurrent-checks"),
                   max_waiting=server_option(options, "auth.max-waiting-checks"),
                   wait_s=server_option(options, "auth.check-wait") / 1000,
                   failure_burst=server_option(options, "auth.failed-logins.burst"),
                   max_delay_s=server_option(options, "auth.failed-logins.max-delay") / 1000)

    def check(self, name: str, verify: Callable[[], T]) -> T:
        """Run ``verify()`` (the password check of user ``name``; a falsy result is a failure)
        within the bounds; Unavailable, without running it, when the server is busy checking or
        ``name`` failed too often lately."""
        now = self.clock()
        with self._lock:
            count, blocked_until = self._failures.get(name, (0, 0.0))
            if now < blocked_until:
                self.refused += 1
                raise Unavailable(f"too many failed logins for this user name; retry in "
                                  f"{blocked_until - now:.1f} s")
            if self._admitted >= self.max_concurrent + self.max_waiting:
                self.refused += 1
                raise Unavailable("too many logins in progress; retry shortly")
            self._admitted += 1
        try:
            future = self._checkers.submit(verify)
            try:
                result = future.result(timeout=self.wait_s)
            except concurrent.futures.TimeoutError:
                if future.cancel():  # still waiting for a thread: give up on it
                    with self._lock:
                        self.refused += 1
                    raise Unavailable("too many logins in progress; retry shortly") from None
                result = future.result()  # running already: it ends soon
        except (RuntimeError, concurrent.futures.CancelledError):  # closed: the server is stopping
            raise Unavailable("the server is stopping") from None
        finally:
            with self._lock:
                self._admitted -= 1
        self._record(name, bool(result))
        return result

    def close(self) -> None:
        """Stop the checking threads (checks still waiting are dropped)."""
        self._checkers.shutdown(wait=True, cancel_futures=True)

    def _record(self, name: str, succeeded: bool) -> None:
        with self._lock:
            if succeeded:
                self._failures.pop(name, None)
                return
            count = self._failures.get(name, (0, 0.0))[0] + 1
            blocked_until = 0.0
            if count >= self.failure_burst:
                delay = min(FIRST_DELAY_S * 2 ** min(count - self.failure_burst, 32), self.max_delay_s)
                blocked_until = self.clock() + delay
            self._failures[name] = (count, blocked_until)
            self._failures.move_to_end(name)
            while len(self._failures) > MAX_TRACKED_NAMES:
                self._failures.popitem(last=False)
