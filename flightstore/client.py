"""A thin Python client over pyarrow.flight: SQL, and table handles for writes, lookups, scans and
changelog subscriptions. Arrow in, Arrow out.

Writes are idempotent: every :class:`TableClient` has a writer id and numbers its batches; a batch
whose acknowledgement was lost is retried with the same sequence and applied once.

Security: ``grpc+tls://`` URIs verify the server against ``tls_root_certs`` (PEM bytes or a file
path; default: the system's roots); ``cert_chain`` and ``private_key`` present a client certificate
for mutual TLS. With ``username`` the connection authenticates (HTTP Basic, once) and sends the
bearer token it gets; when the server says the token expired, it authenticates again and retries.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from flightstore.errors import InvalidOption
from flightstore.expressions import Predicate
from flightstore.schema import as_table
from flightstore.server import protocol, tickets

__all__ = ["connect", "Connection", "TableClient", "Subscription"]

MAX_SEND_BYTES = 4 * 1024 * 1024  # per Flight message, far below gRPC's 16 MiB limit
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
            private_key: Pem | None = None, override_hostname: str | None = None) -> "Connection":
    """Connect to a flightstore server (see the module doc for TLS and authentication)."""
    return Connection(uri, username=username, password=password, timeout=timeout,
                      tls_root_certs=tls_root_certs, cert_chain=cert_chain, private_key=private_key,
                      override_hostname=override_hostname)


class Connection:
    """A connection to one server. Use as a context manager or call :meth:`close`."""

    def __init__(self, uri: str, *, username: str | None = None, password: str | None = None,
                 timeout: float | None = None, tls_root_certs: Pem | None = None,
                 cert_chain: Pem | None = None, private_key: Pem | None = None,
                 override_hostname: str | None = None) -> None:
        self.uri = uri
        tls: dict[str, Any] = {}
        if tls_root_certs is not None:
            tls["tls_root_certs"] = _pem(tls_root_certs)
        if cert_chain is not None or private_key is not None:
            tls["cert_chain"], tls["private_key"] = _pem(cert_chain), _pem(private_key)
        if override_hostname is not None:
            tls["override_hostname"] = override_hostname
        self._client = flight.FlightClient(uri, **tls)
        self._timeout = timeout
        self._credentials = (username, password or "") if username is not None else None
        self._options = flight.FlightCallOptions(timeout=timeout)
        if self._credentials is not None:
            self._authenticate()

    def _authenticate(self) -> None:
        header = self._client.authenticate_basic_token(*self._credentials,
                                                       flight.FlightCallOptions(timeout=self._timeout))
        self._options = flight.FlightCallOptions(timeout=self._timeout, headers=[header])

    def _retrying(self, call: Callable[[], T]) -> T:
        """``call()``, once more after authenticating again if the server refused the token."""
        try:
            return call()
        except flight.FlightUnauthenticatedError:
            if self._credentials is None:
                raise
            self._authenticate()
            return call()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    # ---- SQL ----------------------------------------------------------------------------------
    def sql(self, text: str) -> pa.Table:
        """Run one SQL statement; queries return their rows, statements ``rows_affected``.

        One round trip: a DoGet of a flightstore ``sql`` ticket carrying the statement, which the
        server plans, authorizes and answers in this connection's session (Flight SQL clients
        such as ADBC take two: GetFlightInfo, then DoGet of its ticket)."""
        ticket = flight.Ticket(tickets.encode_custom({"op": "sql", "sql": text}))
        return self._retrying(lambda: self._client.do_get(ticket, self._options).read_all())

    def sql_batches(self, text: str) -> Iterator[pa.RecordBatch]:
        """Run one SQL query and iterate over its record batches as they arrive: the client holds
        one batch at a time, whatever the size of the result (:meth:`sql` holds it all)."""
        command = protocol.pack_any(protocol.CommandStatementQuery(query=text))
        info = self._retrying(lambda: self._client.get_flight_info(
            flight.FlightDescriptor.for_command(command), self._options))
        return self.iter_info(info)

    def iter_info(self, info: flight.FlightInfo) -> Iterator[pa.RecordBatch]:
        """The record batches of every endpoint of ``info`` (in order), read one at a time."""
        for endpoint in info.endpoints:
            yield from _batches(self._retrying(lambda ticket=endpoint.ticket: self._client.do_get(
                ticket, self._options)))

    def read_info(self, info: flight.FlightInfo) -> pa.Table:
        """Read every endpoint of ``info`` (in order) into one table."""
        parts = [self._retrying(lambda ticket=endpoint.ticket: self._client.do_get(ticket, self._options).read_all())
                 for endpoint in info.endpoints]
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
        ``flightstore.per-bucket-endpoints``: see the README option table). Raises
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

    def session_options(self) -> dict[str, Any]:
        """This connection's Flight session options and their current values."""
        [answer] = self._client.do_action(flight.Action(
            protocol.GET_SESSION_OPTIONS, protocol.GetSessionOptionsRequest().SerializeToString()),
            self._options)
        options = protocol.parse("GetSessionOptionsResult", answer.body.to_pybytes()).session_options
        return {key: getattr(value, value.WhichOneof("option_value")) for key, value in options.items()
                if value.WhichOneof("option_value") not in (None, "string_list_value")}

    def table(self, name: str, *, writer_id: str | None = None) -> "TableClient":
        return TableClient(self, name, writer_id=writer_id)

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
            per_row = max(1, data.nbytes // max(data.num_rows, 1))
            writer.write_table(data, max_chunksize=max(1, min(65_536, MAX_SEND_BYTES // per_row)))
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


def _batches(reader: flight.FlightStreamReader) -> Iterator[pa.RecordBatch]:
    """The non-empty batches of a DoGet stream, one at a time; the stream is cancelled when the
    caller stops iterating early."""
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            if chunk.data is not None and chunk.data.num_rows:
                yield chunk.data
    except GeneratorExit:
        reader.cancel()
        raise


class Subscription:
    """An iterator over changelog batches as they are written; :meth:`close` ends it."""

    def __init__(self, reader: flight.FlightStreamReader) -> None:
        self._reader = reader

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                chunk = self._reader.read_chunk()
            except StopIteration:
                return
            if chunk.data is not None and chunk.data.num_rows:
                yield chunk.data

    def close(self) -> None:
        self._reader.cancel()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TableClient:
    """Writes and reads of one table through the server."""

    RETRIES = 3

    def __init__(self, connection: Connection, name: str, *, writer_id: str | None = None) -> None:
        self.connection = connection
        self.name = name
        self.writer_id = writer_id or uuid.uuid4().hex
        self._sequence = None

    # ---- writes -------------------------------------------------------------------------------
    def _next_sequence(self) -> int:
        if self._sequence is None:
            last = self.connection._action("flightstore.writer", {"table": self.name,
                                                                  "writer_id": self.writer_id})["sequence"]
            self._sequence = -1 if last is None else last
        return self._sequence + 1

    def _write(self, op: str, data: Any, columns: Sequence[str] | None = None) -> dict:
        table = as_table(data)
        sequence = self._next_sequence()
        payload = {"op": op, "table": self.name, "columns": list(columns) if columns else None,
                   "writer_id": self.writer_id, "sequence": sequence}
        try:
            for attempt in range(self.RETRIES):
                try:
                    result = self.connection._put(payload, table)
                    break
                except flight.FlightUnavailableError:
                    if attempt == self.RETRIES - 1:
                        raise
                    time.sleep(0.2 * (attempt + 1))
        except BaseException:
            # The server applies a large write in chunks (batches sequence, sequence + 1, ...):
            # after a failure ask it where this writer stands before the next write.
            self._sequence = None
            raise
        self._sequence = result.get("sequence", sequence)
        return result

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
        payload = {"op": "lookup", "table": self.name, "keys": self._keys(keys),
                   "columns": list(columns) if columns else None}
        return self.connection._get(payload).read_all()

    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        payload = {"op": "prefix_lookup", "table": self.name, "keys": self._keys(prefix),
                   "columns": list(columns) if columns else None, "limit": limit}
        return self.connection._get(payload).read_all()

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None) -> pa.Table:
        """Current rows (only ``columns``, filtered on the server; ``buckets``: only those)."""
        return self.connection._get(self._scan_payload(columns, filter, limit, buckets)).read_all()

    def scan_batches(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                     limit: int | None = None, buckets: Sequence[int] | None = None
                     ) -> Iterator[pa.RecordBatch]:
        """As :meth:`scan`, as an iterator of record batches read one at a time (bounded client
        memory for a scan of any size)."""
        payload = self._scan_payload(columns, filter, limit, buckets)
        return _batches(self.connection._get(payload))

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
        and its ``start_offsets``/``end_offsets`` per bucket."""
        answer = self.connection._action("flightstore.usage", {"table": self.name})
        return {"bytes": answer["bytes"],
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
                  until: Mapping[int, int] | None = None) -> Subscription:
        """Follow the changelog from ``start`` (earliest, latest, {"timestamp": ms} or
        {bucket: offset}); with ``until`` ({bucket: end offset}) the stream ends there."""
        payload = {"op": "subscribe", "table": self.name, "columns": list(columns) if columns else None,
                   "start": start if not isinstance(start, Mapping) else {str(k): v for k, v in start.items()},
                   "until": None if until is None else {str(k): v for k, v in until.items()}}
        return Subscription(self.connection._get_planned(payload))
