"""Who is asking the console: a login session (an HttpOnly cookie) or HTTP Basic credentials.

The console admits the users of the Flight endpoint, checked by the same authenticator
(:class:`~flightstore.server.auth.BasicAuthMiddlewareFactory`: its bounded, slowed-down password
checks). A login mints a random session token kept here with its user, its expiry
(``auth.token-ttl``) and the fingerprint of the password hash it was minted under, so a session
ends when it expires, when its user is removed or gets a new password, or at logout. At most
``auth.max-tokens`` sessions live at once (past it the oldest is forgotten). Scripts send Basic
credentials with every request instead (``curl -u``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from flightstore.errors import Unauthenticated
from flightstore.server.metrics_http import basic_credentials

__all__ = ["COOKIE", "Sessions", "basic_credentials"]

COOKIE = "flightstore_console"


class Sessions:
    """Session tokens of the console's logins. Thread-safe."""

    def __init__(self, authenticator: Any, *, ttl_s: float, max_sessions: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.authenticator = authenticator
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, tuple[str, float, str]] = OrderedDict()  # token -> user, expiry, fingerprint
        self._lock = threading.Lock()

    def check(self, user: str, password: str) -> str:
        """The fingerprint of ``user``'s password hash; Unauthenticated when the password is not
        theirs (Unavailable when the login gate turns the check away)."""
        fingerprint = self.authenticator.check_password(user, password)
        if fingerprint is None:
            raise Unauthenticated("wrong username or password")
        return fingerprint

    def login(self, user: str, password: str) -> str:
        """A new session token for ``user`` (see :meth:`check` for the errors)."""
        fingerprint = self.check(user, password)
        token = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            # Every session lives ttl_s: insertion order is expiry order (expired ones first).
            while self._sessions and (next(iter(self._sessions.values()))[1] <= now
                                      or len(self._sessions) >= self.max_sessions):
                self._sessions.popitem(last=False)
            self._sessions[token] = (user, now + self.ttl_s, fingerprint)
        return token

    def user(self, token: str) -> str:
        """The user of session ``token``; Unauthenticated when it is unknown, expired, logged
        out, or its user was removed or has a new password since the login."""
        with self._lock:
            entry = self._sessions.get(token)
            if entry is not None and entry[1] <= self.clock():
                del self._sessions[token]
                entry = None
        if entry is None:
            raise Unauthenticated("the session expired or is unknown; log in again")
        user, _, fingerprint = entry
        if self.authenticator.users.fingerprint(user) != fingerprint:
            self.logout(token)
            raise Unauthenticated(f"user {user!r} was removed or has a new password; log in again")
        return user

    def logout(self, token: str) -> None:
        with self._lock:
            self._sessions.pop(token, None)

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)
