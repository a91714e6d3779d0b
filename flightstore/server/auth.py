"""Authentication of the Flight server: who is calling.

A no-op handshake handler is always installed: pyarrow refuses the handshake ADBC sends when a server
has none. With users configured (:class:`~flightstore.server.users.UserStore`),
:class:`BasicAuthMiddlewareFactory` checks every call's ``authorization`` header: HTTP Basic
credentials are answered with a bearer token (in the response's ``authorization`` header, as
pyarrow's ``authenticate_basic_token`` and ADBC expect); later calls carry ``Bearer <token>``.
Anything else is refused as UNAUTHENTICATED before the call reaches the service.

Tokens are bounded: each expires ``auth.token-ttl`` after it was minted (the client authenticates
again), at most ``auth.max-tokens`` live at once (minting past the cap forgets the oldest), and a
token stops working as soon as its user is removed from the users file or gets a new password
(it carries the fingerprint of the password hash it was minted under,
:meth:`~flightstore.server.users.UserStore.fingerprint`). Password checks go through a
:class:`~flightstore.server.logins.LoginGate`: bounded in number, slowed down after failures.
:meth:`BasicAuthMiddlewareFactory.stream_check` checks a token again while a long stream runs.

The authenticated user name is the call's principal for authorization
(:func:`principal_of`); without authentication there is none and every caller is a super user.

In cluster mode every server holds the cluster secret (derived from the cluster secret file, never
stored: :mod:`flightstore.cluster.security`) and tokens are signed with it instead of remembered:
``fs2.<user>.<expiry ms>.<fingerprint>.<HMAC-SHA256>``. Any server of the cluster accepts a
token another one minted, so a client follows per-bucket endpoints to other servers with its
token, and a server forwarding a call to a bucket's leader sends the caller's token
(:data:`CALLER_TOKEN`): the leader authorizes the original caller. Signed tokens expire after
``auth.token-ttl`` like the others and stop working when their user is removed or gets a new
password (the cluster's users live in ZooKeeper, the same for every server); ``auth.max-tokens``
does not bound them (nothing is kept per token). A cluster without users does not authenticate.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pyarrow import flight

from flightstore.cluster.identity import PEER_HEADER
from flightstore.config import SERVER_OPTIONS
from flightstore.errors import Unavailable
from flightstore.server.logins import LoginGate
from flightstore.server.users import UserStore

__all__ = ["AUTH_MIDDLEWARE", "CALLER_TOKEN", "BasicAuthMiddlewareFactory", "NoAuthHandler",
           "principal_of", "token_of"]

AUTH_MIDDLEWARE = "auth"  # the key of the middleware in the server's middleware dict
SIGNED_PREFIX = "fs2."
# The bearer token of the call being served (set by the server for each RPC): what a server
# forwarding the call to another one sends on the caller's behalf.
CALLER_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("flightstore_token", default=None)


class NoAuthHandler(flight.ServerAuthHandler):
    """Accept every handshake (authentication, if any, happens in the middleware)."""

    def authenticate(self, outgoing: flight.ServerAuthSender, incoming: flight.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


class Authenticated(flight.ServerMiddleware):
    """The middleware of an authenticated call: its user, and the token to send back (if new)."""

    def __init__(self, user: str, token: str | None, credential: str | None = None) -> None:
        self.user = user
        self.token = token  # a newly minted token, sent back to the client
        self.credential = credential or token  # the bearer token this call is authenticated by

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}


def principal_of(context: flight.ServerCallContext | None) -> str | None:
    """The authenticated user of a call; None when the server has no authentication (or in-process
    calls without a context)."""
    if context is None:
        return None
    middleware = context.get_middleware(AUTH_MIDDLEWARE)
    return middleware.user if middleware is not None else None


def token_of(context: flight.ServerCallContext | None) -> str | None:
    """The bearer token a call is authenticated by (minted for it when it sent Basic credentials)."""
    if context is None:
        return None
    middleware = context.get_middleware(AUTH_MIDDLEWARE)
    return middleware.credential if middleware is not None else None


class BasicAuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Basic credentials checked against a :class:`UserStore`; bounded, expiring bearer tokens.

    ``on_refused(method, error)`` is told of every call refused here (the metrics count them: a
    refused call never reaches the service or the other middleware's completion hooks).
    """

    def __init__(self, users: UserStore, *, token_ttl_ms: int | None = None, max_tokens: int | None = None,
                 on_refused: Callable[[flight.FlightMethod, flight.FlightError], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, gate: LoginGate | None = None) -> None:
        super().__init__()
        self.users = users
        self.token_ttl_s = (token_ttl_ms if token_ttl_ms is not None
                            else SERVER_OPTIONS["auth.token-ttl"].default) / 1000
        self.max_tokens = max_tokens if max_tokens is not None else SERVER_OPTIONS["auth.max-tokens"].default
        self.on_refused = on_refused
        self.clock = clock
        self.gate = gate if gate is not None else LoginGate()
        # token -> (user, expiry, fingerprint of the password hash it was minted under)
        self._tokens: OrderedDict[str, tuple[str, float, str]] = OrderedDict()
        self._lock = threading.Lock()
        self.secret: bytes | None = None  # the cluster secret: tokens are signed, not remembered
        self.peer_identity: Any = None  # cluster mode: checks the peer credential of internal calls

    def live_tokens(self) -> int:
        """How many tokens are held (expired ones are dropped as new ones are minted)."""
        with self._lock:
            return len(self._tokens)

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> flight.ServerMiddleware | None:
        if getattr(self.users, "is_open", False):  # a cluster without users: no authentication (yet)
            return None
        try:
            try:
                return self._authenticate(headers)
            except Unavailable as exc:  # the users cannot be read (a cluster member not joined yet)
                raise flight.FlightUnavailableError(str(exc)) from None
        except flight.FlightError as exc:
            if self.on_refused is not None:
                self.on_refused(info.method, exc)
            raise

    def check_password(self, user: str, password: str) -> str | None:
        """The fingerprint of ``user``'s password hash when ``password`` is theirs, else None;
        bounded by the login gate (:class:`~flightstore.errors.Unavailable` when it refuses)."""
        return self.gate.check(user, lambda: self.users.authenticate(user, password))

    def _authenticate(self, headers: dict[str, list[str]]) -> Authenticated:
        peer = headers.get(PEER_HEADER) or []
        if peer and not headers.get("authorization"):  # a cluster peer's own call (replication)
            server_id = self.peer_identity.verify(peer[0]) if self.peer_identity is not None else None
            if server_id is None:
                raise flight.FlightUnauthenticatedError("invalid or expired peer credential")
            return Authenticated(f"<server {server_id}>", None)
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
            if not sep:
                raise flight.FlightUnauthenticatedError("wrong username or password")
            try:
                fingerprint = self.check_password(user, password)
            except Unavailable as exc:
                raise flight.FlightUnavailableError(str(exc)) from None
            if fingerprint is None:
                raise flight.FlightUnauthenticatedError("wrong username or password")
            return Authenticated(user, self._mint(user, fingerprint))
        if scheme.lower() == "bearer":
            token = credentials.strip()
            return Authenticated(self.validate(token), None, token)
        raise flight.FlightUnauthenticatedError(f"unsupported authorization scheme {scheme!r}")

    def validate(self, token: str) -> str:
        """The user of bearer ``token``; FlightUnauthenticatedError when it is unknown, expired,
        or its user was removed or has a new password since it was minted."""
        if token.startswith(SIGNED_PREFIX):
            user, fingerprint = self._verify_signed(token)
        else:
            now = self.clock()
            with self._lock:
                entry = self._tokens.get(token)
                if entry is not None and entry[1] <= now:
                    del self._tokens[token]
                    raise flight.FlightUnauthenticatedError("the token expired; authenticate again")
            if entry is None:
                raise flight.FlightUnauthenticatedError("invalid or expired token; authenticate again")
            user, fingerprint = entry[0], entry[2]
        try:
            self._check_user(user, fingerprint)
        except flight.FlightUnauthenticatedError:
            with self._lock:
                self._tokens.pop(token, None)
            raise
        return user

    def stream_check(self, token: str) -> Callable[[], None]:
        """A check a long stream opened with ``token`` repeats: it raises
        FlightUnauthenticatedError once the token expired or its user was removed or has a new
        password. Checked against what the token said when the stream began, so a stream does
        not end because minting past ``auth.max-tokens`` forgot its (still valid) token."""
        user = self.validate(token)
        if token.startswith(SIGNED_PREFIX):
            expires_ms = int(token.rpartition(".")[0].split(".")[2])
            fingerprint = self._verify_signed(token)[1]

            def expired() -> bool:
                return expires_ms <= time.time() * 1000
        else:
            with self._lock:
                _, expires_at, fingerprint = self._tokens.get(token) or (user, 0.0, "")

            def expired() -> bool:
                return expires_at <= self.clock()

        def check() -> None:
            if expired():
                raise flight.FlightUnauthenticatedError("the token expired; authenticate again")
            self._check_user(user, fingerprint)
        return check

    def _check_user(self, user: str, fingerprint: str) -> None:
        """FlightUnauthenticatedError unless ``user`` exists with the password hash ``fingerprint``."""
        current = self.users.fingerprint(user)
        if current == fingerprint:
            return
        if current is None:
            raise flight.FlightUnauthenticatedError(f"user {user!r} no longer exists")
        raise flight.FlightUnauthenticatedError(f"the password of user {user!r} changed since this "
                                                "token was issued; authenticate again")

    def _signature(self, body: str) -> str:
        digest = hmac.new(self.secret or b"", body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def _verify_signed(self, token: str) -> tuple[str, str]:
        body, _, signature = token.rpartition(".")
        if self.secret is None or not hmac.compare_digest(self._signature(body), signature):
            raise flight.FlightUnauthenticatedError("invalid or expired token; authenticate again")
        try:
            _, user_b64, expiry, fingerprint = body.split(".")
            user = base64.urlsafe_b64decode(user_b64 + "=" * (-len(user_b64) % 4)).decode()
            expires_ms = int(expiry)
        except (ValueError, UnicodeDecodeError, binascii.Error):
            raise flight.FlightUnauthenticatedError("malformed token; authenticate again") from None
        if expires_ms <= time.time() * 1000:
            raise flight.FlightUnauthenticatedError("the token expired; authenticate again")
        return user, fingerprint

    def _mint(self, user: str, fingerprint: str) -> str:
        if self.secret is not None:
            user_b64 = base64.urlsafe_b64encode(user.encode()).decode().rstrip("=")
            expiry_ms = int(time.time() * 1000 + self.token_ttl_s * 1000)
            body = f"{SIGNED_PREFIX}{user_b64}.{expiry_ms}.{fingerprint}"
            return f"{body}.{self._signature(body)}"
        token = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            # Every token lives token_ttl_s, so insertion order is expiry order: expired ones sit
            # at the front, and past the cap the oldest goes first.
            while self._tokens and (next(iter(self._tokens.values()))[1] <= now
                                    or len(self._tokens) >= self.max_tokens):
                self._tokens.popitem(last=False)
            self._tokens[token] = (user, now + self.token_ttl_s, fingerprint)
        return token
