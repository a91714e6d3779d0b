"""A thin Python client over pyarrow.flight: SQL, and table handles for writes, lookups, scans and
changelog subscriptions. Arrow in, Arrow out.

Writes are idempotent: every :class:`TableClient` has a writer id and numbers its batches; a batch
whose acknowledgement was lost is retried with the same sequence and applied once.

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

import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyarrow import flight

from flightstore.errors import InvalidOption
from flightstore.expressions import Predicate
from flightstore.schema import TablePath, as_table
from flightstore.server import protocol, tickets
from flightstore.streams import read_batches

__all__ = ["Connection", "Subscription", "TableClient", "connect"]

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
            private_key: Pem | None = None, override_hostname: str | None = None) -> Connection:
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
        self._tls = tls
        self._peers: dict[str, Connection] = {}  # cluster mode: connections to other servers
        self._timeout = timeout
        self._credentials = (username, password or "") if username is not None else None
        self._options = flight.FlightCallOptions(timeout=timeout)
        self._per_bucket_endpoints = False  # the session option: read each bucket at its endpoint
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

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
        self._client.close()

    def _peer(self, uri: str) -> Connection:
        """The connection to another server of the cluster (same credentials and TLS settings)."""
        if uri == self.uri:
            return self
        peer = self._peers.get(uri)
        if peer is None:
            username, password = self._credentials or (None, None)
            peer = self._peers[uri] = Connection(uri, username=username, password=password,
                                                 timeout=self._timeout, **self._tls)
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

    def sql_batches(self, text: str) -> Iterator[pa.RecordBatch]:
        """Run one SQL query and iterate over its record batches as they arrive: the client holds
        one batch at a time, whatever the size of the result (:meth:`sql` holds it all)."""
        command = protocol.pack_any(protocol.CommandStatementQuery(query=text))
        info = self._retrying(lambda: self._client.get_flight_info(
            flight.FlightDescriptor.for_command(command), self._options))
        return self.iter_info(info)

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

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TableClient:
    """Writes and reads of one table through the server."""

    RETRIES = 3

    def __init__(self, connection: Connection, name: str, *, writer_id: str | None = None) -> None:
        TablePath.parse(name)  # a bad name fails here, before anything is sent
        self.connection = connection
        self.name = name
        self.writer_id = writer_id or uuid.uuid4().hex
        # A writer id made here is new everywhere: its first batch is 0, with no question to the
        # server (which, in a cluster, asks every leader and cannot answer while one is down).
        # A given id may have written before: ask where it stands before its first write.
        self._sequence: int | None = -1 if writer_id is None else None
        self._layout: dict | None = None  # cluster mode: bucketing and leaders (flightstore.locations)

    # ---- cluster mode: where buckets live --------------------------------------------------------
    def _locations(self) -> dict | None:
        """The table's bucketing and each bucket's leader URI; None on a single server (or when a
        bucket has no live leader: then the connected server answers, naming it)."""
        if self._layout is None:
            try:
                self._layout = self.connection._action("flightstore.locations", {"table": self.name})
            except (flight.FlightError, pa.ArrowException):  # may not describe it, or no such table:
                self._layout = {"leaders": []}              # the connected server answers and says
        layout = self._layout
        if not layout.get("leaders") or None in layout["leaders"]:
            return None
        return layout

    def _by_leader(self, rows: pa.Table, key: Sequence[str] | None = None) -> list[tuple[str, pa.Table]] | None:
        """``rows`` split by the URI of their bucket's leader; None when the connected server
        should route them (single server, no bucket key, key columns missing)."""
        layout = self._locations()
        if layout is None or layout["partitioned"]:
            return None
        key = list(key or layout["bucket_key"])
        if not key or any(c not in rows.column_names for c in key) or rows.num_rows == 0:
            return None
        from flightstore.bucketing import bucket_ids  # numpy: only in cluster mode
        try:
            buckets = bucket_ids(rows.select(key), key, layout["num_buckets"])
        except (pa.ArrowException, TypeError, ValueError):
            return None
        leaders = [layout["leaders"][b] for b in buckets.tolist()]
        uris = list(dict.fromkeys(leaders))
        if len(uris) == 1:
            return [(uris[0], rows)]
        import numpy as np
        marks = np.array(leaders)
        return [(uri, rows.filter(pa.array(marks == uri))) for uri in uris]

    def _direct(self, uri: str, call: Callable[[Connection], T], fallback: Callable[[], T]) -> T:
        """``call`` on the leader at ``uri``; through the connected server if the leader does not
        answer (it forwards, or names the unavailable bucket), asking for locations again later."""
        try:
            return call(self.connection._peer(uri))
        except flight.FlightUnavailableError:
            self._layout = None
            return fallback()

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
        parts = self._by_leader(table) or [(self.connection.uri, table)]
        results = []
        try:
            for uri, part in parts:  # each part to its leader, same writer id and base sequence
                for attempt in range(self.RETRIES):
                    try:
                        results.append(self._direct(uri, lambda c, part=part: c._put(payload, part),
                                                    lambda part=part: self.connection._put(payload, part)))
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
        # Each leader numbered its chunks from ``sequence``: continue after the longest run.
        self._sequence = max(sequence if r.get("sequence") is None else r["sequence"] for r in results)
        if len(results) == 1:
            return results[0]
        return {"op": "written", "rows": sum(r["rows"] for r in results),
                "duplicate": all(r["duplicate"] for r in results),
                "offsets": {k: v for r in results for k, v in r["offsets"].items()},
                "chunks": max(r.get("chunks", 1) for r in results), "sequence": self._sequence}

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
        return self._read_one(keys, payload)

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
        payload = {"op": "prefix_lookup", "table": self.name, "keys": self._keys(prefix),
                   "columns": list(columns) if columns else None, "limit": limit}
        return self._read_one(prefix, payload)

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
                  until: Mapping[int, int] | None = None) -> Subscription:
        """Follow the changelog from ``start`` (earliest, latest, {"timestamp": ms} or
        {bucket: offset}); with ``until`` ({bucket: end offset}) the stream ends there."""
        payload = {"op": "subscribe", "table": self.name, "columns": list(columns) if columns else None,
                   "start": start if not isinstance(start, Mapping) else {str(k): v for k, v in start.items()},
                   "until": None if until is None else {str(k): v for k, v in until.items()}}
        return Subscription(self.connection._get_planned(payload))
