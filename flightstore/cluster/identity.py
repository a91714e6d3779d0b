"""Peer identity: a server proves to another one that it is server N of the same cluster.

Calls only a peer may make (replication fetch streams, and the forwarded calls of
:mod:`flightstore.cluster.table`) carry the header :data:`PEER_HEADER`:
``<server id>.<expiry ms>.<HMAC-SHA256 of both under the cluster secret>``. The secret lives in
ZooKeeper and never travels on the data path; a credential names the server it was minted for and
expires after :data:`PEER_TTL_S`, so a captured header is of no use for long and is of no use as
another server. :class:`PeerMiddlewareFactory` checks the header on every call (an absent header
is simply no peer; a wrong or expired one is refused), and :func:`peer_of` tells the call's peer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable

from pyarrow import flight

__all__ = ["PEER_HEADER", "PEER_MIDDLEWARE", "PeerIdentity", "PeerMiddlewareFactory", "peer_of"]

PEER_HEADER = "x-flightstore-peer"
PEER_MIDDLEWARE = "peer"
PEER_TTL_S = 300.0


def _signature(secret: bytes, body: str) -> str:
    digest = hmac.new(secret, b"peer:" + body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class PeerIdentity:
    """Mints and checks peer credentials with the cluster ``secret`` for server ``server_id``."""

    def __init__(self, secret: bytes, server_id: int, clock: Callable[[], float] = time.time) -> None:
        self.secret = secret
        self.server_id = server_id
        self._clock = clock

    def credential(self) -> str:
        body = f"{self.server_id}.{int((self._clock() + PEER_TTL_S) * 1000)}"
        return f"{body}.{_signature(self.secret, body)}"

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(PEER_HEADER.encode(), self.credential().encode())]

    def verify(self, value: str) -> int | None:
        """The server id a credential proves, or None when it is forged, malformed or expired."""
        body, _, signature = value.strip().rpartition(".")
        if not body or not hmac.compare_digest(_signature(self.secret, body), signature):
            return None
        try:
            server, expiry = body.split(".")
            server_id, expires_ms = int(server), int(expiry)
        except ValueError:
            return None
        if expires_ms <= self._clock() * 1000:
            return None
        return server_id


class PeerMiddleware(flight.ServerMiddleware):
    def __init__(self, server_id: int) -> None:
        self.server_id = server_id


class PeerMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Recognizes calls from peers (see the module docstring); ``identity`` is set once the
    server joined its cluster (before that, and on a single server, nobody is a peer)."""

    def __init__(self) -> None:
        super().__init__()
        self.identity: PeerIdentity | None = None

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> flight.ServerMiddleware | None:
        values = headers.get(PEER_HEADER) or []
        if not values:
            return None
        identity = self.identity
        server_id = identity.verify(values[0]) if identity is not None else None
        if server_id is None:
            raise flight.FlightUnauthenticatedError("invalid or expired peer credential")
        return PeerMiddleware(server_id)


def peer_of(context: flight.ServerCallContext | None) -> int | None:
    """The id of the peer server making this call (None: a client)."""
    if context is None:
        return None
    middleware = context.get_middleware(PEER_MIDDLEWARE)
    return middleware.server_id if middleware is not None else None
