"""Authentication of the Flight server.

With auth off, a no-op handshake handler is still installed: pyarrow refuses the handshake ADBC
always sends when a server has no handler. With auth on, HTTP Basic credentials are checked once
and answered with a bearer token that later calls carry.
"""

from __future__ import annotations

import secrets
import threading

import pyarrow.flight as flight

__all__ = ["NoAuthHandler", "BasicAuthHandler"]


class NoAuthHandler(flight.ServerAuthHandler):
    """Accept every peer (the default)."""

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


class BasicAuthHandler(flight.ServerAuthHandler):
    """Username/password from a dict; issues random tokens kept in memory."""

    def __init__(self, users: dict[str, str]) -> None:
        super().__init__()
        self.users = dict(users)
        self._tokens: dict[bytes, str] = {}
        self._lock = threading.Lock()

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader) -> None:
        auth = flight.BasicAuth.deserialize(incoming.read())
        user = auth.username.decode() if isinstance(auth.username, bytes) else auth.username
        password = auth.password.decode() if isinstance(auth.password, bytes) else auth.password
        if self.users.get(user) != password:
            raise flight.FlightUnauthenticatedError("wrong username or password")
        token = secrets.token_hex(16).encode()
        with self._lock:
            self._tokens[token] = user
        outgoing.write(token)

    def is_valid(self, token: bytes) -> str:
        with self._lock:
            user = self._tokens.get(token)
        if user is None:
            raise flight.FlightUnauthenticatedError("invalid or expired token")
        return user
