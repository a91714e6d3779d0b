"""A thin Python client over pyarrow.flight: SQL, and table handles for writes, lookups, scans and
changelog subscriptions. Arrow in, Arrow out.

Writes are idempotent: every :class:`TableClient` has a writer id and numbers its batches; a batch
whose acknowledgement was lost is retried with the same sequence and applied once. A write retries
(with a capped, doubling backoff) until the server acknowledges it or
``client.writer.delivery-timeout`` (default 2 minutes, so a server restart is covered) passes; after
a failed attempt it asks the server for the writer's last applied sequence and skips a batch that
landed. A batch whose outcome is still unknown at the timeout (:class:`DeliveryTimeout`) keeps its
sequence: the client delivers it again before its next write (or on :meth:`TableClient.flush`),
never giving its sequence to other rows. Client options: ``connect(uri, options={...})``
(:data:`flightstore.config.CLIENT_OPTIONS`).

Security: ``grpc+tls://`` URIs verify the server against ``tls_root_certs`` (PEM bytes or a file
path; default: the system's roots); ``cert_chain`` and ``private_key`` present a client certificate
for mutual TLS. With ``username`` the connection authenticates (HTTP Basic, once) and sends the
bearer token it gets; when the server says the token expired, it authenticates again and retries.

Cluster mode: a :class:`TableClient` asks once where the table's buckets live
(``flightstore.locations``) and sends each lookup, write and scan straight to the leaders of the
buckets it touches (it computes buckets as the servers do), over one connection per server with
the same credentials; what it cannot place (a log table without bucket key, counts,
subscriptions, a partitioned table's scans) goes to the server it is connected to, which forwards
per bucket. When a leader does not answer, the call goes through that server instead (which then
names the unavailable bucket and server), and the locations are asked again next time.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from pyarrow import flight

from flightstore.config import validate_client_options
from flightstore.errors import DeliveryTimeout, InvalidOption, Unavailable
from flightstore.expressions import Predicate
from flightstore.lookup_stream import KeysDoNotFit, LookupStream, LookupStreams
from flightstore.lookuper import Lookuper
from flightstore.routed_lookups import routed_lookup, split_by_leader
from flightstore.schema import TablePath, as_table
from flightstore.server import protocol, tickets
from flightstore.streams import BatchStream, read_batches
from flightstore.wire.lookups import HandleSpec

__all__ = ["Connection", "Subscription", "TableClient", "connect"]

MAX_SEND_BYTES = 4 * 1024 * 1024  # per Flight message, far below gRPC's 16 MiB limit
MAX_SEND_ROWS = 65_536
FIRST_BACKOFF_S = 0.05  # the first wait between two attempts of a write; it doubles up to the cap
# Failures after which a write's outcome is unknown (the server went away, restarts, is shutting
# down or answered UNAVAILABLE, the call timed out): worth another attempt under the same sequence.
_RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightCancelledError)
_TRANSPORT = ("socket closed", "connection reset", "rst_stream", "goaway", "broken pipe",
              "failed to connect", "stream removed", "end of tcp stream")
_CLOSED_POLL_S = 0.1  # how soon a subscription closed from another thread stops its consumer
T = TypeVar("T")
Pem = bytes | str | os.PathLike  # PEM bytes, or the path of a PEM file


def _pem(value: Pem | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as handle:
        return handle.read()


def connect(uri: str = "grpc://127.0.0.1:8815", *, username: str | None = None,
            password: str | None = None, timeout: float | None = None,
            tls_root_certs: Pem | None = None, cert_chain: Pem | None = None,
            private_key: Pem | None = None, override_hostname: str | None = None,
            options: Mapping[str, Any] | None = None) -> Connection:
    """Connect to a flightstore server (see the module doc for TLS and authentication; ``options``:
    client options such as ``client.writer.delivery-timeout``, checked at once)."""
    return Connection(uri, username=username, password=password, timeout=timeout,
                      tls_root_certs=tls_root_certs, cert_chain=cert_chain, private_key=private_key,
                      override_hostname=override_hostname, options=options)


class Connection:
    """A connection to a server (the first reachable one of a comma-separated list). Use as a
    context manager or call :meth:`close`."""

    def __init__(self, uri: str, *, username: str | None = None, password: str | None = None,
                 timeout: float | None = None, tls_root_certs: Pem | None = None,
                 cert_chain: Pem | None = None, private_key: Pem | None = None,
                 override_hostname: str | None = None, options: Mapping[str, Any] | None = None) -> None:
        # ``uri`` may list several servers of a cluster ("grpc://a:8815,grpc://b:8815"): the
        # connection uses the first, and moves to the next when one cannot be reached.
        self.uris = [part.strip() for part in str(uri).split(",") if part.strip()]
        self.uri = self.uris[0]
        self.options = validate_client_options(options)
        tls: dict[str, Any] = {}
        if tls_root_certs is not None:
            tls["tls_root_certs"] = _pem(tls_root_certs)
        if cert_chain is not None or private_key is not None:
            tls["cert_chain"], tls["private_key"] = _pem(cert_chain), _pem(private_key)
        if override_hostname is not None:
            tls["override_hostname"] = override_hostname
        # A restarted server is reconnected to within the retry backoff cap, not gRPC's own (which
        # grows to minutes after repeated failures).
        self._tls = tls
        self._client = self._flight_client(self.uri)
        self._peers: dict[str, Connection] = {}  # cluster mode: connections to other servers
        self._timeout = timeout
        self._credentials = (username, password or "") if username is not None else None
        self._options = flight.FlightCallOptions(timeout=timeout)
        self._per_bucket_endpoints = False  # the session option: read each bucket at its endpoint
        self._headers: list[tuple[bytes, bytes]] = []  # the bearer token, once authenticated
        if self._credentials is not None:
            self._retrying(self._authenticate)  # at the first server of uris that answers
        # Lookups: one long-lived stream (no deadline: each lookup has the timeout), see lookup_stream.
        self._lookups = self._lookup_streams()

    def _flight_client(self, uri: str) -> flight.FlightClient:
        backoff_ms = self.options["client.writer.retry-backoff.max"]
        # gRPC takes its minimum reconnect backoff as the time a connection attempt is given to
        # complete the handshake (its "min connect timeout"), not only as a wait between attempts.
        return flight.FlightClient(uri, **self._tls, generic_options=[
            ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", self.options["client.connect-timeout"]),
            ("grpc.max_reconnect_backoff_ms", backoff_ms)])

    def _lookup_streams(self) -> LookupStreams:
        return LookupStreams(
            lambda: LookupStream(self._client, flight.FlightCallOptions(headers=self._headers), self.uri),
            self._authenticate if self._credentials is not None else None, self._timeout)

    def _move_on(self) -> bool:
        """Move to the next server of :attr:`uris` (False when there is no other): the one in use
        cannot be reached. The session's settings (USE, session options) stay with the old one."""
        if len(self.uris) < 2:
            return False
        position = self.uris.index(self.uri)
        old_client, old_lookups = self._client, self._lookups
        self.uri = self.uris[(position + 1) % len(self.uris)]
        self._client = self._flight_client(self.uri)
        self._lookups = self._lookup_streams()
        old_lookups.close()
        old_client.close()
        if self._credentials is not None:
            try:
                self._authenticate()
            except flight.FlightError:
                pass  # this one is down too: the next attempt moves on again
        return True

    def _authenticate(self) -> None:
        header = self._client.authenticate_basic_token(*self._credentials,
                                                       flight.FlightCallOptions(timeout=self._timeout))
        self._headers = [header]
        self._options = flight.FlightCallOptions(timeout=self._timeout, headers=[header])

    def _retrying(self, call: Callable[[], T]) -> T:
        """``call()``, once more after authenticating again if the server refused the token, and
        at the next server of :attr:`uris` when this one cannot be reached (nothing was sent: any
        call may go elsewhere; a failure mid-call is left to the caller's own retries)."""
        moves = len(self.uris) - 1
        while True:
            try:
                return call()
            except flight.FlightUnauthenticatedError:
                if self._credentials is None:
                    raise
                self._authenticate()
                return call()
            except flight.FlightUnavailableError as exc:
                if moves <= 0 or not _unreachable(exc) or not self._move_on():
                    raise
                moves -= 1

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
        self._lookups.close()
        self._client.close()

    def _peer(self, uri: str) -> Connection:
        """The connection to another server of the cluster (same credentials and TLS settings)."""
        if uri == self.uri:
            return self
        peer = self._peers.get(uri)
        if peer is None:
            username, password = self._credentials or (None, None)
            peer = self._peers[uri] = Connection(uri, username=username, password=password,
                                                 timeout=self._timeout, options=self.options, **self._tls)
        return peer

    # ---- SQL ----------------------------------------------------------------------------------
    def sql(self, text: str) -> pa.Table:
        """Run one SQL statement; queries return their rows, statements ``rows_affected``.

        One round trip: a DoGet of a flightstore ``sql`` ticket carrying the statement, which the
        server plans, authorizes and answers in this connection's session (Flight SQL clients
        such as ADBC take two: GetFlightInfo, then DoGet of its ticket). A connection that set
        ``flightstore.per-bucket-endpoints`` takes that path too, reading each bucket's endpoint
        at the server it names."""
        if self._per_bucket_endpoints:  # the endpoints name each bucket's server: read them there
            command = protocol.pack_any(protocol.CommandStatementQuery(query=text))
            return self.read_info(self._retrying(lambda: self._client.get_flight_info(
                flight.FlightDescriptor.for_command(command), self._options)))
        ticket = flight.Ticket(tickets.encode_custom({"op": "sql", "sql": text}))
        return self._retrying(lambda: self._client.do_get(ticket, self._options).read_all())

    def sql_batches(self, text: str) -> BatchStream:
        """Run one SQL query and iterate over its record batches as they arrive: the client holds
        one batch at a time, whatever the size of the result (:meth:`sql` holds it all). The
        iterator's ``schema`` is the result's, known before the first batch."""
        command = protocol.pack_any(protocol.CommandStatementQuery(query=text))
        info = self._retrying(lambda: self._client.get_flight_info(
            flight.FlightDescriptor.for_command(command), self._options))
        return BatchStream(info.schema, self.iter_info(info))

    def iter_info(self, info: flight.FlightInfo) -> Iterator[pa.RecordBatch]:
        """The record batches of every endpoint of ``info`` (in order), read one at a time."""
        for endpoint in info.endpoints:  # each from the server its location names (a leader)
            server = self._peer(endpoint.locations[0].uri.decode()) if endpoint.locations else self
            yield from read_batches(server._retrying(lambda server=server, ticket=endpoint.ticket:
                                                     server._client.do_get(ticket, server._options)))

    def read_info(self, info: flight.FlightInfo) -> pa.Table:
        """Read every endpoint of ``info`` (in order) into one table, each from the server its
        location names (a bucket's leader in a cluster), else from this one."""
        parts = []
        for endpoint in info.endpoints:
            server = self._peer(endpoint.locations[0].uri.decode()) if endpoint.locations else self
            parts.append(server._retrying(
                lambda server=server, ticket=endpoint.ticket:
                    server._client.do_get(ticket, server._options).read_all()))
        if not parts:
            return info.schema.empty_table()
        return pa.concat_tables(parts)

    def execute(self, text: str) -> int:
        """Run a statement through the Flight SQL update path; returns the affected row count."""
        command = protocol.pack_any(protocol.CommandStatementUpdate(query=text))

        def put() -> bytes:
            writer, reader = self._client.do_put(flight.FlightDescriptor.for_command(command),
                                                 pa.schema([]), self._options)
            writer.done_writing()
            result = reader.read()
            writer.close()
            return result.to_pybytes()
        return protocol.parse("DoPutUpdateResult", self._retrying(put)).record_count

    def set_session_options(self, options: Mapping[str, Any]) -> None:
        """Set Flight session options of this connection (``schema``, ``catalog``,
        ``flightstore.per-bucket-endpoints``: see docs/options.md). Raises
        :class:`~flightstore.errors.InvalidOption` naming the refused ones (then none is set)."""
        request = protocol.SetSessionOptionsRequest()
        for key, value in options.items():
            kind = "bool_value" if isinstance(value, bool) else \
                "int64_value" if isinstance(value, int) else \
                "double_value" if isinstance(value, float) else "string_value"
            setattr(request.session_options[key], kind, value if kind != "string_value" else str(value))
        [answer] = self._client.do_action(
            flight.Action(protocol.SET_SESSION_OPTIONS, request.SerializeToString()), self._options)
        errors = protocol.parse("SetSessionOptionsResult", answer.body.to_pybytes()).errors
        if errors:
            raise InvalidOption("session options refused: " + ", ".join(sorted(errors)))
        if "flightstore.per-bucket-endpoints" in options:
            self._per_bucket_endpoints = bool(options["flightstore.per-bucket-endpoints"])

    def session_options(self) -> dict[str, Any]:
        """This connection's Flight session options and their current values."""
        [answer] = self._client.do_action(flight.Action(
            protocol.GET_SESSION_OPTIONS, protocol.GetSessionOptionsRequest().SerializeToString()),
            self._options)
        options = protocol.parse("GetSessionOptionsResult", answer.body.to_pybytes()).session_options
        return {key: getattr(value, value.WhichOneof("option_value")) for key, value in options.items()
                if value.WhichOneof("option_value") not in (None, "string_list_value")}

    def table(self, name: str, *, writer_id: str | None = None) -> TableClient:
        return TableClient(self, name, writer_id=writer_id)

    def add_user(self, name: str, password: str, *, replace: bool = False) -> None:
        """Add user ``name`` (``replace``: set a new password, ending its tokens) through the
        server: to its users file, or to a cluster's users, on every server when this returns.
        Needs ALTER on the cluster (super users)."""
        self._action("flightstore.user", {"action": "add", "name": name, "password": password,
                                          "replace": replace})

    def remove_user(self, name: str) -> None:
        """Remove user ``name`` (its tokens end) through the server; see :meth:`add_user`."""
        self._action("flightstore.user", {"action": "remove", "name": name})

    def lake_status(self, table: str | None = None) -> list[dict]:
        """Tiering status of ``table`` (default: every datalake-enabled table): per bucket the
        tiered offset, log end offset and lag, plus last commit time and last error."""
        return self._action("flightstore.lake-status", {"table": table})["tables"]

    # ---- plumbing for TableClient -------------------------------------------------------------
    def _get(self, payload: dict) -> flight.FlightStreamReader:
        ticket = flight.Ticket(tickets.encode_custom(payload))
        return self._retrying(lambda: self._client.do_get(ticket, self._options))

    def _get_planned(self, payload: dict) -> flight.FlightStreamReader:
        """DoGet of the ticket GetFlightInfo answers for ``payload``: positions the server
        resolves while planning (a subscription's "latest") hold from the moment this returns."""
        descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom(payload))
        info = self._retrying(lambda: self._client.get_flight_info(descriptor, self._options))
        ticket = info.endpoints[0].ticket
        return self._retrying(lambda: self._client.do_get(ticket, self._options))

    def _put(self, payload: dict, data: pa.Table) -> dict:
        descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom(payload))

        def put() -> bytes:
            writer, reader = self._client.do_put(descriptor, data.schema, self._options)
            writer.write_table(data, max_chunksize=_message_rows(data))
            writer.done_writing()
            answer = reader.read()
            writer.close()
            return answer.to_pybytes()
        return tickets.decode_custom(self._retrying(put))

    def _action(self, kind: str, payload: dict) -> dict:
        body = tickets.encode_custom({"op": kind, **payload})
        results = self._retrying(lambda: list(self._client.do_action(flight.Action(kind, body),
                                                                     self._options)))
        return tickets.decode_custom(results[0].body.to_pybytes())


def _message_rows(data: pa.Table) -> int:
    """Rows per Flight message of a write of ``data`` (messages stay below MAX_SEND_BYTES)."""
    per_row = max(1, data.nbytes // max(data.num_rows, 1))
    return max(1, min(MAX_SEND_ROWS, MAX_SEND_BYTES // per_row))


def _unreachable(exc: BaseException) -> bool:
    """Whether a call failed because the server could not be reached at all (so nothing of the
    call reached it)."""
    text = str(exc).lower()
    return "failed to connect" in text or "connection refused" in text or "dns resolution failed" in text


def _retryable(exc: BaseException) -> bool:
    """Whether a write failed in a way that leaves its outcome unknown (see _RETRYABLE)."""
    if isinstance(exc, _RETRYABLE):
        return True
    if isinstance(exc, flight.FlightError):
        return isinstance(exc, flight.FlightInternalError) and \
            any(marker in str(exc).lower() for marker in _TRANSPORT)
    return isinstance(exc, OSError)  # the stream broke under a write in progress


class Subscription:
    """An iterator over changelog batches as they are written; :meth:`close` ends it.

    The server sends an empty batch (a heartbeat) after each ``heartbeat_s`` without data, so a
    quiet server and a dead one look different: when neither data nor a heartbeat arrives within
    ``timeout_s`` (a server stopped, frozen or cut off), iterating raises
    :class:`~flightstore.errors.Unavailable` and the subscription is closed. ``timeout_s=None``
    waits forever. A server that shuts down ends the subscription with UNAVAILABLE too (a
    ``pyarrow.flight.FlightUnavailableError``), never as a normal end of stream; a subscription
    with ``until`` ends normally when it reached those offsets.
    """

    def __init__(self, reader: flight.FlightStreamReader, timeout_s: float | None = None) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise InvalidOption(f"a subscription's timeout_s must be a positive number of seconds, not {timeout_s!r}")
        self._reader = reader
        self._timeout_s = timeout_s
        self._messages: queue.Queue = queue.Queue(maxsize=2)  # (kind, value) from the reading thread
        self._closed = threading.Event()
        self._failures: list[BaseException] = []  # what ended the reading thread, if not the end
        self._thread: threading.Thread | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._timeout_s is None:
            while True:
                try:
                    chunk = self._reader.read_chunk()
                except StopIteration:
                    return
                if chunk.data is not None and chunk.data.num_rows:
                    yield chunk.data
        if self._thread is None:
            # The thread holds the stream's parts, not this object: a subscription dropped without
            # close() (a loop left with break) is collected, and __del__ ends the stream.
            thread = threading.Thread(target=_pump, args=(self._reader, self._messages, self._closed,
                                                          self._failures),
                                      name="flightstore-subscription", daemon=True)
            thread.start()
            self._thread = thread  # set once started: close() from another thread joins it
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                kind, value = self._messages.get(timeout=_CLOSED_POLL_S)
            except queue.Empty:
                if self._closed.is_set():  # close() from another thread: end as the reader ended
                    if self._failures:
                        raise self._failures[0] from None
                    return
                if time.monotonic() < deadline:
                    continue
                self.close()
                raise Unavailable(f"no data and no heartbeat from the server for {self._timeout_s:g} s: it "
                                  "is stopped or unreachable; subscribe again from the offsets read") from None
            deadline = time.monotonic() + self._timeout_s
            if kind == "end":
                return
            if kind == "error":
                raise value
            if value is not None and value.num_rows:
                yield value

    def close(self) -> None:
        self._closed.set()
        self._reader.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        closed = getattr(self, "_closed", None)
        if closed is not None and not closed.is_set():  # dropped unclosed: end the stream, no join
            closed.set()
            with contextlib.suppress(Exception):
                self._reader.cancel()


def _pump(reader: flight.FlightStreamReader, messages: queue.Queue, closed: threading.Event,
          failures: list[BaseException]) -> None:
    """A subscription's reading thread: every message (heartbeats included) into ``messages``,
    then the end, until ``closed``."""
    def put(message: tuple) -> None:
        while not closed.is_set():
            try:
                messages.put(message, timeout=0.1)
                return
            except queue.Full:
                continue

    try:
        while not closed.is_set():
            chunk = reader.read_chunk()
            put(("batch", chunk.data))
    except StopIteration:
        put(("end", None))
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer's thread, raised there
        failures.append(exc)
        put(("error", exc))


@dataclass
class _Batch:
    """A write on its way: its command (writer id, base sequence) and its parts by server URI."""

    payload: dict
    parts: list[tuple[str, pa.Table]]
    attempted: bool = False  # sent at least once: its outcome may be known to the server

    @property
    def sequence(self) -> int:
        return self.payload["sequence"]


class TableClient:
    """Writes and reads of one table through the server."""

    def __init__(self, connection: Connection, name: str, *, writer_id: str | None = None) -> None:
        TablePath.parse(name)  # a bad name fails here, before anything is sent
        self.connection = connection
        self.name = name
        self.writer_id = writer_id or uuid.uuid4().hex
        # A writer id made here is new everywhere: its first batch is 0, with no question to the
        # server (which, in a cluster, asks every leader and cannot answer while one is down).
        # A given id may have written before: ask where it stands before its first write.
        self._sequence: int | None = -1 if writer_id is None else None
        self._unsettled: _Batch | None = None  # a batch whose outcome a DeliveryTimeout left unknown
        self._layout: dict | None = None  # cluster mode: bucketing and leaders (flightstore.locations)
        self._single_server = False  # known to be one server (its answer to flightstore.locations)

    # ---- cluster mode: where buckets live --------------------------------------------------------
    def _locations(self) -> dict | None:
        """The table's bucketing and each bucket's leader URI; None on a single server (or when a
        bucket has no live leader: then the connected server answers, naming it)."""
        if self._layout is None:
            try:
                self._layout = self.connection._action("flightstore.locations", {"table": self.name})
                self._single_server = not self._layout.get("leaders")  # a cluster names its leaders
            except (flight.FlightError, pa.ArrowException):  # may not describe it, or no such table:
                self._layout = {"leaders": []}              # the connected server answers and says
        layout = self._layout
        if not layout.get("leaders") or None in layout["leaders"]:
            return None
        return layout

    def _by_leader(self, rows: pa.Table, key: Sequence[str] | None = None) -> list[tuple[str, pa.Table]] | None:
        """``rows`` split by the URI of their bucket's leader; None when the connected server
        should route them (single server, no bucket key, key columns missing)."""
        split = split_by_leader(self._locations(), rows, key)
        if split is None:
            return None
        if len(split) == 1:
            return [(split[0][0], rows)]
        return [(uri, rows.take(pa.array(at))) for uri, at in split]

    def _direct(self, uri: str, call: Callable[[Connection], T], fallback: Callable[[], T]) -> T:
        """``call`` on the leader at ``uri``; through the connected server if the leader does not
        answer (it forwards, or names the unavailable bucket), asking for locations again later."""
        try:
            return call(self.connection._peer(uri))
        except flight.FlightUnavailableError:
            self._layout = None
            return fallback()

    # ---- writes -------------------------------------------------------------------------------
    def _deadline(self) -> float:
        return time.monotonic() + self.connection.options["client.writer.delivery-timeout"] / 1000

    def _retry(self, call: Callable[[], T], deadline: float, what: Callable[[], str]) -> T:
        """``call()`` until it returns, a failure that is not worth retrying (raised as is), or
        ``deadline`` (DeliveryTimeout naming ``what()``), waiting a doubling, capped backoff."""
        backoff, cap = FIRST_BACKOFF_S, self.connection.options["client.writer.retry-backoff.max"] / 1000
        while True:
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - classified below, raised when not retryable
                if not _retryable(exc):
                    raise
                if time.monotonic() + backoff > deadline:
                    timeout = self.connection.options["client.writer.delivery-timeout"]
                    raise DeliveryTimeout(
                        f"{what()} was not acknowledged within client.writer.delivery-timeout "
                        f"({timeout} ms): {exc}; its outcome is unknown, so this client delivers it "
                        "again (same sequence, applied once) before its next write or on flush(): "
                        "do not send it again") from exc
                time.sleep(backoff)
                backoff = min(backoff * 2, cap)

    def _last_applied(self) -> int | None:
        """The server's last applied sequence of this writer (None: it never wrote)."""
        return self.connection._action("flightstore.writer", {"table": self.name,
                                                              "writer_id": self.writer_id})["sequence"]

    def _next_sequence(self, deadline: float | None = None) -> int:
        if self._sequence is None:
            last = self._retry(self._last_applied, self._deadline() if deadline is None else deadline,
                               lambda: f"the sequence of writer {self.writer_id!r} of {self.name}")
            self._sequence = -1 if last is None else last
        return self._sequence + 1

    def _write(self, op: str, data: Any, columns: Sequence[str] | None = None) -> dict:
        self.flush()  # an earlier batch whose outcome is unknown goes first, under its own sequence
        table = as_table(data)
        deadline = self._deadline()
        sequence = self._next_sequence(deadline)
        payload = {"op": op, "table": self.name, "columns": list(columns) if columns else None,
                   "writer_id": self.writer_id, "sequence": sequence}
        self._unsettled = _Batch(payload, self._by_leader(table) or [(self.connection.uri, table)])
        return self._deliver(deadline)

    def flush(self) -> dict | None:
        """Deliver the batch a :class:`~flightstore.errors.DeliveryTimeout` left unknown, under its
        own sequence (the server applies it once, or says it had it); returns its answer, None
        when there is none. Every write calls it first."""
        if self._unsettled is None:
            return None
        return self._deliver(self._deadline())

    def _deliver(self, deadline: float) -> dict:
        """Send the unsettled batch, each part to its leader with the same writer id and base
        sequence, retrying until acknowledged or ``deadline`` (the batch then stays unsettled)."""
        batch = self._unsettled
        results = []
        try:
            for uri, part in batch.parts:
                results.append(self._retry(lambda uri=uri, part=part: self._send(batch, uri, part),
                                           deadline, lambda: f"batch {batch.sequence} of writer "
                                                             f"{self.writer_id!r} to {self.name}"))
        except DeliveryTimeout:
            raise  # outcome unknown: the batch keeps its sequence
        except BaseException:
            # The server answered (a refusal): nothing is in flight. It applies a large write in
            # chunks (batches sequence, sequence + 1, ...): ask where this writer stands next time.
            self._unsettled = None
            self._sequence = None
            raise
        self._unsettled = None
        # Each leader numbered its chunks from ``sequence``: continue after the longest run.
        self._sequence = max(batch.sequence if r.get("sequence") is None else r["sequence"] for r in results)
        if len(results) == 1:
            return results[0]
        return {"op": "written", "rows": sum(r["rows"] for r in results),
                "duplicate": all(r["duplicate"] for r in results),
                "offsets": {k: v for r in results for k, v in r["offsets"].items()},
                "chunks": max(r.get("chunks", 1) for r in results), "sequence": self._sequence}

    def _send(self, batch: _Batch, uri: str, part: pa.Table) -> dict:
        """One attempt at one part. After a failed attempt the server is asked first whether the
        part landed (a part sent as one message is one server chunk: applied whole or not)."""
        attempted, batch.attempted = batch.attempted, True
        # Only a single server applies a batch all or nothing across its buckets; in a cluster each
        # leader applies its share, so the table's last sequence may be another leader's: the part
        # is sent again and each bucket that has it already skips it (same writer id and sequence).
        if attempted and len(batch.parts) == 1 and part.num_rows <= _message_rows(part) \
                and self._single_server:
            last = self._last_applied()
            if last is not None and last >= batch.sequence:
                return {"op": "written", "rows": part.num_rows, "duplicate": True, "offsets": {},
                        "chunks": 1, "sequence": batch.sequence}
        return self._direct(uri, lambda c: c._put(batch.payload, part),
                            lambda: self.connection._put(batch.payload, part))

    def append(self, data: Any) -> dict:
        """Append rows to a log table."""
        return self._write("append", data)

    def upsert(self, data: Any, columns: Sequence[str] | None = None) -> dict:
        """Insert or update rows of a primary-key table; ``columns`` = partial update."""
        return self._write("upsert", data, columns)

    def delete(self, keys: Any, columns: Sequence[str] | None = None) -> dict:
        """Delete rows by primary key (``columns``: null only those columns)."""
        return self._write("delete", keys, columns)

    def write_changelog(self, data: Any, columns: Sequence[str] | None = None) -> dict:
        """Write rows with a ``_change_type`` column (+I, -U, +U, -D)."""
        return self._write("write", data, columns)

    def undo(self, after_sequence: int) -> int:
        """Restart from a checkpoint: undo every batch this writer wrote after ``after_sequence``
        (the server restores the before-images from the changelog); the next write continues at
        ``after_sequence + 1``. Returns the rows restored."""
        answer = self.connection._action("flightstore.undo", {
            "table": self.name, "writer_id": self.writer_id, "after_sequence": after_sequence})
        self._sequence = after_sequence
        self._unsettled = None  # a batch after the checkpoint: undone, not to be delivered
        return answer["rows"]

    @property
    def sequence(self) -> int | None:
        """The last batch sequence this writer had acknowledged (its checkpoint position)."""
        return self._sequence

    def release(self) -> None:
        """Give up the columns this writer owns through its partial updates."""
        self.connection._action("flightstore.release", {"table": self.name, "writer_id": self.writer_id})

    # ---- reads --------------------------------------------------------------------------------
    @staticmethod
    def _keys(keys: Any) -> dict:
        table = as_table(keys)
        return {name: table.column(name).to_pylist() for name in table.column_names}

    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows with the given primary keys, in key order (missing keys answer no row). On one
        server: one message each way on the connection's lookup stream."""
        found = self._streamed("lookup", keys, columns, None)
        if found is not None:
            return found
        payload = {"op": "lookup", "table": self.name, "keys": self._keys(keys),
                   "columns": list(columns) if columns else None}
        return self._read_one(keys, payload)

    def _streamed(self, kind: str, keys: Any, columns: Sequence[str] | None, limit: int | None
                  ) -> pa.Table | None:
        """A lookup on the connection's lookup stream (:mod:`flightstore.lookup_stream`; in a
        cluster each key on its leader's stream, :mod:`flightstore.routed_lookups`), or None when
        it takes the DoGet way: keys that do not fit the key columns (the server then says what is
        wrong), or a cluster lookup that cannot be routed now."""
        if not isinstance(keys, dict):
            keys = as_table(keys)
        key_columns = (tuple(keys) if isinstance(keys, dict) else tuple(keys.column_names)) \
            if kind == "prefix" else None
        spec = HandleSpec(self.name, kind, tuple(columns) if columns else None, key_columns)
        self._locations()
        try:
            if self._layout.get("leaders"):  # a cluster (or workers): at the keys' leaders
                return routed_lookup(self, spec, keys, limit)
            return self.connection._lookups.call(spec, keys, limit)
        except KeysDoNotFit:
            return None

    def _read_one(self, keys: Any, payload: dict) -> pa.Table:
        """A lookup from the leader of its keys when they share one (the connected server
        otherwise: it splits them by leader and keeps the key order)."""
        parts = self._by_leader(as_table(keys))
        if parts is None or len(parts) != 1:
            return self.connection._get(payload).read_all()
        return self._direct(parts[0][0], lambda c: c._get(payload).read_all(),
                            lambda: self.connection._get(payload).read_all())

    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose leading primary-key columns equal a row of ``prefix`` (at most ``limit``)."""
        found = self._streamed("prefix", prefix, columns, limit)
        if found is not None:
            return found
        payload = {"op": "prefix_lookup", "table": self.name, "keys": self._keys(prefix),
                   "columns": list(columns) if columns else None, "limit": limit}
        return self._read_one(prefix, payload)

    def lookuper(self, *, columns: Sequence[str] | None = None, prefix: Sequence[str] | None = None,
                 options: Mapping[str, Any] | None = None) -> Lookuper:
        """Batched asynchronous lookups of this table (Fluss's ``Lookuper``): ``lookup_async(key)``
        returns a Future of the key's rows as a ``pyarrow.RecordBatch``, ``await lookup(key)`` is
        the asyncio flavour; concurrent keys travel
        together, bounded by the ``client.lookup.*`` ``options`` (:mod:`flightstore.lookuper`).
        ``prefix``: leading primary-key columns, for prefix lookups. Close it (or use ``with``)."""
        return Lookuper(self, columns=columns, prefix=prefix, options=options)

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None) -> pa.Table:
        """Current rows (only ``columns``, filtered on the server; ``buckets``: only those)."""
        payload = self._scan_payload(columns, filter, limit, buckets)
        layout = self._locations()
        if layout is None or layout["partitioned"] or limit is not None:
            return self.connection._get(payload).read_all()
        wanted = list(range(layout["num_buckets"])) if buckets is None else [int(b) for b in buckets]
        if not wanted or any(not 0 <= b < layout["num_buckets"] for b in wanted):
            return self.connection._get(payload).read_all()  # the server names the bad bucket
        by_uri: dict[str, list[int]] = {}
        for bucket in wanted:
            by_uri.setdefault(layout["leaders"][bucket], []).append(bucket)
        parts = []
        for uri, mine in by_uri.items():  # each leader streams its own buckets
            one = {**payload, "buckets": mine}
            parts.append(self._direct(uri, lambda c, one=one: c._get(one).read_all(),
                                      lambda one=one: self.connection._get(one).read_all()))
        return pa.concat_tables(parts) if len(parts) != 1 else parts[0]

    def scan_batches(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                     limit: int | None = None, buckets: Sequence[int] | None = None
                     ) -> Iterator[pa.RecordBatch]:
        """As :meth:`scan`, as an iterator of record batches read one at a time (bounded client
        memory for a scan of any size)."""
        payload = self._scan_payload(columns, filter, limit, buckets)
        return read_batches(self.connection._get(payload))

    def _scan_payload(self, columns: Sequence[str] | None, filter: Predicate | None, limit: int | None,
                      buckets: Sequence[int] | None) -> dict:
        return {"op": "scan", "table": self.name, "columns": list(columns) if columns else None,
                "filter": filter.to_dict() if filter is not None else None, "limit": limit,
                "buckets": list(buckets) if buckets is not None else None}

    def row_count(self) -> int:
        return self.connection._get({"op": "count", "table": self.name}).read_all().column(0)[0].as_py()

    def buckets(self, filter: Predicate | None = None) -> list[int]:
        """The table-wide numbers of the buckets a scan with ``filter`` reads: every bucket, or for
        a partitioned table those of the partitions ``filter`` cannot rule out. Scan one with
        ``scan(..., buckets=[b])``."""
        answer = self.connection._action("flightstore.buckets", {
            "table": self.name, "filter": filter.to_dict() if filter is not None else None})
        return [int(b) for b in answer["buckets"]]

    def snapshot(self, force: bool = False) -> dict[int, dict | None]:
        """Take a KV snapshot of every bucket of this primary-key table now (then apply
        ``table.log.ttl``, which the snapshot may let delete more of the changelog). Returns per
        bucket the newest snapshot ``{"id", "offset", "rows", "created_ms"}`` (None: never written)."""
        answer = self.connection._action("flightstore.snapshot", {"table": self.name, "force": force})
        return {int(k): v for k, v in answer["snapshots"].items()}

    def usage(self) -> dict:
        """Bytes the table holds on disk (``kv``, ``snapshots``, ``log``, ``total``) under ``bytes``,
        and its ``start_offsets``/``end_offsets`` per bucket; in a cluster ``bytes`` is one copy
        (each bucket at its leader) and ``servers`` each leader's share."""
        answer = self.connection._action("flightstore.usage", {"table": self.name})
        usage = {"bytes": answer["bytes"],
                 "start_offsets": {int(k): v for k, v in answer["start_offsets"].items()},
                 "end_offsets": {int(k): v for k, v in answer["end_offsets"].items()}}
        if "servers" in answer:  # a cluster: each leader's bytes of the buckets it leads
            usage["servers"] = {int(k): v for k, v in answer["servers"].items()}
        return usage

    def expire_writers(self) -> list[str]:
        """Forget this table's writers idle past ``table.writer-id.expiration`` now (the server
        does it on its own every ``log.retention.check-interval``); their ids."""
        return self.connection._action("flightstore.expire-writers", {"table": self.name})["writers"]

    def describe(self) -> dict:
        """The table's descriptor (``descriptor``: :meth:`TableDescriptor.to_json` text), its
        incarnation id (``table_id``, new when a table is dropped and created again) and its
        ``start_offsets``/``end_offsets`` per bucket: what a tiering job needs."""
        answer = self.connection._action("flightstore.describe", {"table": self.name})
        return {"descriptor": answer["descriptor"], "table_id": answer["table_id"],
                "start_offsets": {int(k): v for k, v in answer["start_offsets"].items()},
                "end_offsets": {int(k): v for k, v in answer["end_offsets"].items()}}

    def read_snapshot(self, bucket: int, at: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of ``bucket`` exactly at log offset ``at``, as ``+I`` changelog rows (null
        ``_log_offset``/``_commit_timestamp``); follow the changelog from ``at`` afterwards."""
        payload = {"op": "snapshot", "table": self.name, "bucket": bucket, "at": at,
                   "columns": list(columns) if columns else None}
        return self.connection._get(payload).read_all()

    def offsets(self, which: str = "end") -> dict[int, int]:
        answer = self.connection._action("flightstore.offsets", {"table": self.name, "which": which})
        return {int(k): v for k, v in answer["offsets"].items()}

    def subscribe(self, start: Any = "earliest", columns: Sequence[str] | None = None,
                  until: Mapping[int, int] | None = None, *, heartbeat_s: float = 1.0,
                  timeout_s: float | None = 30.0) -> Subscription:
        """Follow the changelog from ``start`` (earliest, latest, {"timestamp": ms} or
        {bucket: offset}); with ``until`` ({bucket: end offset}) the stream ends there. The server
        sends a heartbeat after ``heartbeat_s`` without data; iterating raises
        :class:`~flightstore.errors.Unavailable` when nothing arrives for ``timeout_s`` (None: wait
        forever). See :class:`Subscription`."""
        if timeout_s is not None and timeout_s <= heartbeat_s:
            raise InvalidOption(f"timeout_s ({timeout_s:g}) must be longer than heartbeat_s ({heartbeat_s:g}): "
                                "a quiet server sends only a heartbeat every heartbeat_s")
        payload = {"op": "subscribe", "table": self.name, "columns": list(columns) if columns else None,
                   "start": start if not isinstance(start, Mapping) else {str(k): v for k, v in start.items()},
                   "until": None if until is None else {str(k): v for k, v in until.items()},
                   "heartbeat_s": heartbeat_s}
        return Subscription(self.connection._get_planned(payload), timeout_s)
