"""Authentication of the Flight server.

A no-op handshake handler is always installed: pyarrow refuses the handshake ADBC sends when a server
has none. With users configured, :class:`BasicAuthMiddlewareFactory` checks every call's
``authorization`` header: HTTP Basic credentials are answered with a bearer token (in the response's
``authorization`` header, as pyarrow's ``authenticate_basic_token`` and ADBC expect); later calls
carry ``Bearer <token>``. Anything else is refused as UNAUTHENTICATED.
"""

from __future__ import annotations

import base64
import hmac
import secrets
import threading

import pyarrow.flight as flight

__all__ = ["NoAuthHandler", "BasicAuthMiddlewareFactory"]


class NoAuthHandler(flight.ServerAuthHandler):
    """Accept every handshake (authentication, if any, happens in the middleware)."""

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


class _BearerToken(flight.ServerMiddleware):
    def __init__(self, token: str | None) -> None:
        self.token = token

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}


class BasicAuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Username/password from a dict; issues random bearer tokens kept in memory."""

    def __init__(self, users: dict[str, str]) -> None:
        super().__init__()
        self.users = dict(users)
        self._tokens: dict[str, str] = {}
        self._lock = threading.Lock()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> flight.ServerMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            raise flight.FlightUnauthenticatedError("authentication required: send Basic credentials")
        scheme, _, credentials = values[0].partition(" ")
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(credentials).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise flight.FlightUnauthenticatedError("malformed Basic credentials") from None
            expected = self.users.get(user)
            if expected is None or not hmac.compare_digest(expected, password):
                raise flight.FlightUnauthenticatedError("wrong username or password")
            token = secrets.token_hex(16)
            with self._lock:
                self._tokens[token] = user
            return _BearerToken(token)
        if scheme.lower() == "bearer":
            with self._lock:
                known = credentials in self._tokens
            if not known:
                raise flight.FlightUnauthenticatedError("invalid or expired token")
            return _BearerToken(None)
        raise flight.FlightUnauthenticatedError(f"unsupported authorization scheme {scheme!r}")
