"""Authentication of the Flight server: who is calling.

A no-op handshake handler is always installed: pyarrow refuses the handshake ADBC sends when a server
has none. With users configured (:class:`~flightstore.server.users.UserStore`),
:class:`BasicAuthMiddlewareFactory` checks every call's ``authorization`` header: HTTP Basic
credentials are answered with a bearer token (in the response's ``authorization`` header, as
pyarrow's ``authenticate_basic_token`` and ADBC expect); later calls carry ``Bearer <token>``.
Anything else is refused as UNAUTHENTICATED before the call reaches the service.

Tokens are bounded: each expires ``auth.token-ttl`` after it was minted (the client authenticates
again), at most ``auth.max-tokens`` live at once (minting past the cap forgets the oldest), and a
token stops working as soon as its user is removed from the users file.

The authenticated user name is the call's principal for authorization
(:func:`principal_of`); without authentication there is none and every caller is a super user.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from pyarrow import flight

from flightstore.config import SERVER_OPTIONS
from flightstore.server.users import UserStore

__all__ = ["AUTH_MIDDLEWARE", "BasicAuthMiddlewareFactory", "NoAuthHandler", "principal_of"]

AUTH_MIDDLEWARE = "auth"  # the key of the middleware in the server's middleware dict


class NoAuthHandler(flight.ServerAuthHandler):
    """Accept every handshake (authentication, if any, happens in the middleware)."""

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


class Authenticated(flight.ServerMiddleware):
    """The middleware of an authenticated call: its user, and the token to send back (if new)."""

    def __init__(self, user: str, token: str | None) -> None:
        self.user = user
        self.token = token

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}


def principal_of(context: flight.ServerCallContext | None) -> str | None:
    """The authenticated user of a call; None when the server has no authentication (or in-process
    calls without a context)."""
    if context is None:
        return None
    middleware = context.get_middleware(AUTH_MIDDLEWARE)
    return middleware.user if middleware is not None else None


class BasicAuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Basic credentials checked against a :class:`UserStore`; bounded, expiring bearer tokens.

    ``on_refused(method)`` is told of every call refused here (the metrics count them: a refused
    call never reaches the service or the other middleware's completion hooks).
    """

    def __init__(self, users: UserStore, *, token_ttl_ms: int | None = None, max_tokens: int | None = None,
                 on_refused: Callable[[flight.FlightMethod], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.users = users
        self.token_ttl_s = (token_ttl_ms if token_ttl_ms is not None
                            else SERVER_OPTIONS["auth.token-ttl"].default) / 1000
        self.max_tokens = max_tokens if max_tokens is not None else SERVER_OPTIONS["auth.max-tokens"].default
        self.on_refused = on_refused
        self.clock = clock
        self._tokens: OrderedDict[str, tuple[str, float]] = OrderedDict()  # token -> (user, expiry)
        self._lock = threading.Lock()

    def live_tokens(self) -> int:
        """How many tokens are held (expired ones are dropped as new ones are minted)."""
        with self._lock:
            return len(self._tokens)

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> flight.ServerMiddleware:
        try:
            return self._authenticate(headers)
        except flight.FlightUnauthenticatedError:
            if self.on_refused is not None:
                self.on_refused(info.method)
            raise

    def _authenticate(self, headers: dict[str, list[str]]) -> Authenticated:
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            raise flight.FlightUnauthenticatedError("authentication required: send Basic credentials")
        scheme, _, credentials = values[0].partition(" ")
        if scheme.lower() == "basic":
            credentials = credentials.strip()
            credentials += "=" * (-len(credentials) % 4)  # ADBC (Go) sends base64 without padding
            try:
                user, sep, password = base64.b64decode(credentials, validate=True).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError, binascii.Error):
                raise flight.FlightUnauthenticatedError("malformed Basic credentials") from None
            if not sep or not self.users.verify(user, password):
                raise flight.FlightUnauthenticatedError("wrong username or password")
            return Authenticated(user, self._mint(user))
        if scheme.lower() == "bearer":
            now = self.clock()
            with self._lock:
                entry = self._tokens.get(credentials.strip())
                if entry is not None and entry[1] <= now:
                    del self._tokens[credentials.strip()]
                    raise flight.FlightUnauthenticatedError("the token expired; authenticate again")
            if entry is None:
                raise flight.FlightUnauthenticatedError("invalid or expired token; authenticate again")
            if not self.users.exists(entry[0]):
                with self._lock:
                    self._tokens.pop(credentials.strip(), None)
                raise flight.FlightUnauthenticatedError(f"user {entry[0]!r} no longer exists")
            return Authenticated(entry[0], None)
        raise flight.FlightUnauthenticatedError(f"unsupported authorization scheme {scheme!r}")

    def _mint(self, user: str) -> str:
        token = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            # Every token lives token_ttl_s, so insertion order is expiry order: expired ones sit
            # at the front, and past the cap the oldest goes first.
            while self._tokens and (next(iter(self._tokens.values()))[1] <= now
                                    or len(self._tokens) >= self.max_tokens):
                self._tokens.popitem(last=False)
            self._tokens[token] = (user, now + self.token_ttl_s)
        return token
