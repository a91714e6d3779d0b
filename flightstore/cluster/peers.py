"""Flight calls from one server of a cluster to another (forwarding to bucket leaders).

One :class:`pyarrow.flight.FlightClient` per server URI, reused by every forwarded call (over TLS
when the cluster serves ``grpc+tls://``: the callee is verified against the cluster's CA and this
server presents its own certificate, for mutual TLS). Each call
carries the caller's bearer token (every server accepts it: tokens are signed with the cluster
secret), this server's peer credential (:mod:`flightstore.cluster.identity`) and ``"peer": true``
(the receiver serves it from the buckets it leads only, see :mod:`flightstore.cluster.table` and
:mod:`flightstore.server.peer`). Errors come back as flightstore errors: a leader that does not
answer is UNAVAILABLE naming the bucket and the server.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore.cluster.view import BucketLocation
from flightstore.errors import BucketUnavailable, FlightstoreError, InvalidInput, NotFound, Unavailable
from flightstore.server import tickets
from flightstore.streams import read_batches

__all__ = ["FORWARD_TIMEOUT_S", "Peers"]

FORWARD_TIMEOUT_S = 120.0
MESSAGE_BYTES = 4 * 1024 * 1024  # per forwarded Flight message, far below gRPC's limit


class Peers:
    """Flight clients to the other servers of the cluster (one per URI, reused), carrying the
    caller's bearer token. Remote errors come back as flightstore errors."""

    def __init__(self) -> None:
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        self.identity: Any = None  # this server's PeerIdentity, once it joined its cluster
        # FlightClient TLS arguments (root CA, this server's certificate and key) when the
        # cluster speaks grpc+tls (flightstore.server.tls.TlsConfig.client_kwargs)
        self.tls: dict[str, Any] = {}

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def client(self, uri: str) -> flight.FlightClient:
        """The shared client of the server at ``uri``."""
        return self._client(uri)

    def stream_options(self) -> flight.FlightCallOptions:
        """Options of this server's own long-lived calls (replication): its peer credential, no
        deadline (a watchdog cancels a stream whose answer is overdue)."""
        identity = self.identity
        return flight.FlightCallOptions(headers=identity.headers() if identity is not None else [])

    def _client(self, uri: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(uri)
            if client is None:
                tls = self.tls if uri.startswith("grpc+tls") else {}
                client = self._clients[uri] = flight.FlightClient(uri, **tls)
            return client

    def options(self, token: str | None) -> flight.FlightCallOptions:
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        if self.identity is not None:
            headers += self.identity.headers()
        return flight.FlightCallOptions(timeout=FORWARD_TIMEOUT_S, headers=headers)

    def get(self, target: BucketLocation, payload: dict, token: str | None) -> Iterator[pa.RecordBatch]:
        """The batches of the read command ``payload`` served by ``target``'s leader."""
        uri = target.require().uri
        ticket = flight.Ticket(tickets.encode_custom({**payload, "peer": True}))
        with _remote_errors(target):
            reader = self._client(uri).do_get(ticket, self.options(token))
        return read_batches(reader, keep_empty=True, map_error=lambda exc: _mapped(exc, target))

    def get_table(self, target: BucketLocation, payload: dict, token: str | None) -> pa.Table:
        uri = target.require().uri
        ticket = flight.Ticket(tickets.encode_custom({**payload, "peer": True}))
        with _remote_errors(target):
            return self._client(uri).do_get(ticket, self.options(token)).read_all()

    def put(self, target: BucketLocation, payload: dict, data: pa.Table, token: str | None) -> dict:
        uri = target.require().uri
        descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom({**payload, "peer": True}))
        with _remote_errors(target):
            writer, reader = self._client(uri).do_put(descriptor, data.schema, self.options(token))
            per_row = max(1, data.nbytes // max(data.num_rows, 1))  # messages of at most ~4 MiB
            writer.write_table(data, max_chunksize=max(1, min(65_536, MESSAGE_BYTES // per_row)))
            writer.done_writing()
            answer = reader.read()
            writer.close()
        return tickets.decode_custom(answer.to_pybytes())

    def action(self, target: BucketLocation, kind: str, payload: dict, token: str | None) -> dict:
        uri = target.require().uri
        body = tickets.encode_custom({"op": kind, **payload, "peer": True})
        with _remote_errors(target):
            results = list(self._client(uri).do_action(flight.Action(kind, body), self.options(token)))
        return tickets.decode_custom(results[0].body.to_pybytes())


@contextlib.contextmanager
def _remote_errors(target: BucketLocation) -> Iterator[None]:
    """Map a forwarded call's Flight errors to flightstore errors (a leader that does not answer
    is UNAVAILABLE naming it)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - mapped, then raised
        raise _mapped(exc, target) from None


def _mapped(exc: BaseException, target: BucketLocation) -> BaseException:
    server = target.server
    where = f"server {target.leader}" + (f" at {server.uri}" if server is not None else "")
    if isinstance(exc, FlightstoreError):
        return exc
    if isinstance(exc, flight.FlightUnavailableError):
        return BucketUnavailable(f"table {target.table}: the leader of bucket {target.bucket}, {where}, "
                                 f"is unavailable: {_first_line(exc)}")
    if isinstance(exc, flight.FlightTimedOutError):
        return Unavailable(f"table {target.table}: {where} did not answer in time: {_first_line(exc)}")
    if isinstance(exc, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError,
                        flight.FlightCancelledError)):
        return exc
    if isinstance(exc, pa.ArrowKeyError):
        return NotFound(_first_line(exc))
    if isinstance(exc, pa.ArrowInvalid):
        return InvalidInput(_first_line(exc))
    if isinstance(exc, flight.FlightError):
        return exc
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for marker in (". Detail:", "\nDetail:", ". gRPC client debug context"):
        text = text.split(marker)[0]
    return text.strip()
