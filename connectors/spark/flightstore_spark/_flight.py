"""The connector's only door to flightstore: the public Flight protocol via :mod:`flightstore.client`.

Everything here runs on the driver (planning) or on executors (reading, writing); nothing touches
the store directly. Helpers are small and stateless so Spark can pickle whatever holds their inputs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyarrow import flight

from flightstore.client import Connection, _unreachable, connect
from flightstore.server import protocol, tickets
from flightstore.streams import read_batches

__all__ = [
    "Options",
    "TableInfo",
    "custom_schema",
    "endpoint_uri",
    "lake_split",
    "leaders",
    "open_connection",
    "put_once",
    "query_endpoints",
    "read_lake_file_rows",
    "read_payload",
    "read_ticket",
    "shared_connection",
    "table_info",
]


class Options:
    """The connector options every part needs, parsed once (picklable)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.raw = {str(k).lower(): v for k, v in dict(options).items()}
        self.uri = options.get("uri") or "grpc://127.0.0.1:8815"
        self.table = options.get("table")
        self.query = options.get("query")
        self.username = options.get("username")
        self.password = options.get("password")
        # TLS: PEM file paths readable on the driver and every executor.
        self.tls = {key: options.get(name) for key, name in (("tls_root_certs", "tls.root.certs"),
                                                             ("cert_chain", "tls.cert.chain"),
                                                             ("private_key", "tls.private.key"))
                    if options.get(name)}
        columns = options.get("columns")
        self.columns = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
        if not self.table and not self.query:
            raise ValueError("the flightstore data source needs option('table', 'db.t') or option('query', ...)")

    def get(self, name: str, default: Any = None) -> Any:
        """Any option, case-insensitively (Spark lower-cases option names)."""
        return self.raw.get(name.lower(), default)

    def connect(self, uri: str | None = None) -> Connection:
        """A connection to the configured server, or to ``uri`` (a bucket's leader in a cluster)."""
        return open_connection(uri or self.uri, self.username, self.password, **self.tls)

    def shared(self, uri: str | None = None) -> Connection:
        """This process's connection to the configured server, or to ``uri``, kept for the next
        call (:func:`shared_connection`): never close it."""
        return shared_connection(uri or self.uri, self.username, self.password, **self.tls)


def open_connection(uri: str, username: str | None = None, password: str | None = None,
                    **tls: str) -> Connection:
    """A client connection; ``tls`` holds :func:`flightstore.connect`'s TLS arguments (PEM paths)."""
    return connect(uri, username=username, password=password, **tls)


# Spark reuses its Python workers (task workers and the schema/partition planners alike) across
# tasks and queries. A connection per call paid a new gRPC channel (TCP and HTTP/2 set-up, on the
# server too) and, with credentials, an authentication handshake, for each partition and each
# planning step; one connection per process and server is kept instead. Keyed by the process id:
# a forked child never uses its parent's gRPC channel. Bounded: a worker that met many servers
# (tests start one each) closes the least recently used.
SHARED_CONNECTIONS = 8
_shared: OrderedDict[tuple, Connection] = OrderedDict()
_shared_lock = threading.Lock()


def shared_connection(uri: str, username: str | None = None, password: str | None = None,
                      **tls: str) -> Connection:
    """The connection this process keeps to ``uri`` with these credentials and TLS files (opened on
    first use). Callers must not close it; a server that restarted is reconnected to by gRPC, and
    an expired token is renewed by the connection's own retry."""
    key = (os.getpid(), uri, username, password, tuple(sorted(tls.items())))
    with _shared_lock:
        if _shared and next(iter(_shared))[0] != key[0]:
            _shared.clear()  # a forked child: the parent's channels are not ours to use or close
        conn = _shared.get(key)
        if conn is not None:
            _shared.move_to_end(key)
            return conn
    conn = open_connection(uri, username, password, **tls)
    with _shared_lock:
        kept = _shared.setdefault(key, conn)
        _shared.move_to_end(key)
        evicted = [_shared.popitem(last=False)[1] for _ in range(len(_shared) - SHARED_CONNECTIONS)]
    for old in evicted + ([conn] if kept is not conn else []):  # ours too when another call kept one first
        old.close()
    return kept


class TableInfo:
    """What the connector needs to know about a table: schema, buckets, primary key."""

    def __init__(self, schema: pa.Schema, num_buckets: int, primary_key: list[str]) -> None:
        self.schema = schema
        self.num_buckets = num_buckets
        self.primary_key = primary_key

    @property
    def has_primary_key(self) -> bool:
        return bool(self.primary_key)


def custom_schema(conn: Connection, payload: dict) -> pa.Schema:
    """The schema the server answers for one of flightstore's own read commands (GetFlightInfo)."""
    descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom(payload))
    return conn._retrying(lambda: conn._client.get_flight_info(descriptor, conn._options)).schema


def _split_name(name: str) -> tuple[str | None, str]:
    if "." in name:
        database, table = name.split(".", 1)
        return database, table
    return None, name


def primary_key(conn: Connection, name: str) -> list[str]:
    """Primary-key columns in key order (Flight SQL GetPrimaryKeys); [] for a log table."""
    database, table = _split_name(name)
    command = protocol.CommandGetPrimaryKeys(table=table)
    if database:
        command.db_schema = database
    info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(protocol.pack_any(command)),
                                        conn._options)
    result = conn.read_info(info)
    if result.num_rows == 0:
        return []
    rows = sorted(zip(result.column("key_sequence").to_pylist(), result.column("column_name").to_pylist()))
    return [name for _, name in rows]


def leaders(conn: Connection, name: str) -> list[str | None]:
    """The URI of each bucket's leader (by bucket number within a partition); [] on a single
    server or when a leader is down (then the configured server answers, naming it)."""
    layout = conn.table(name)._locations()
    return list(layout["leaders"]) if layout is not None else []


def endpoint_uri(endpoint: flight.FlightEndpoint) -> str | None:
    """The location an endpoint names (a bucket's leader in a cluster), or None: the same server."""
    return endpoint.locations[0].uri.decode() if endpoint.locations else None


def table_info(conn: Connection, name: str) -> TableInfo:
    schema = custom_schema(conn, {"op": "scan", "table": name})
    offsets = conn.table(name).offsets("end")
    return TableInfo(schema, len(offsets), primary_key(conn, name))


def query_endpoints(conn: Connection, query: str) -> flight.FlightInfo:
    """The FlightInfo of a pushed query with one endpoint per bucket for scans: Spark reads each
    endpoint as its own partition, in parallel (the server's default is a single endpoint)."""
    conn.set_session_options({"flightstore.per-bucket-endpoints": True})
    command = protocol.pack_any(protocol.CommandStatementQuery(query=query))
    descriptor = flight.FlightDescriptor.for_command(command)
    return conn._retrying(lambda: conn._client.get_flight_info(descriptor, conn._options))


def lake_split(conn: Connection, table: str, filter: Any = None, snapshot_id: int | None = None, *,
               lake_only: bool = False) -> dict:
    """The server's plan of a read in one round trip. Of a table that is not a union read
    (``union`` False): ``buckets``, those a scan with ``filter`` reads, and ``rows``, each one's rows
    in its log (an upper bound: a primary-key table's changelog; the filter not applied). Of a union
    read of a datalake-enabled log table: lake snapshot id, per-bucket log offsets the log part
    starts at, the pruned data files with their Arrow schema (hex IPC), and the lake's file-IO
    properties (no credentials).
    ``lake_only``: the plan of the lake snapshot alone, of any datalake-enabled table (a
    primary-key table's data files name their position delete files under ``deletes``)."""
    return conn._action("flightstore.lake-split", {
        "table": table, "filter": filter.to_dict() if filter is not None else None,
        "snapshot_id": snapshot_id, "lake_only": lake_only})


def lake_io(options: Options, planned: dict) -> dict[str, str]:
    """The file-IO properties executors read the lake with: the server's, then the connector's
    ``lake.<property>`` options (credentials: ``lake.s3.access-key-id`` ...)."""
    own = {key[len("lake."):]: str(value) for key, value in options.raw.items() if key.startswith("lake.")}
    return {**planned.get("io", {}), **own}


def read_lake_files(files: Sequence[str | dict], io: dict[str, str], schema_hex: str,
                    columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """Lake data files read on an executor straight from the warehouse (no server in the path);
    files planned by the server (dicts with size and CRC-32) are checked before they are decoded,
    and a planned file naming its position delete files (``deletes``, a primary-key table's lake
    snapshot) loses the rows they delete. Only pyarrow is imported (:mod:`flightstore.lake.direct`):
    a fresh Python worker does not pay for pyiceberg."""
    from flightstore.lake.direct import read_data_files, read_live_rows
    schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(schema_hex)))
    for planned in files:
        deletes = planned.get("deletes") if isinstance(planned, Mapping) else None
        if deletes:
            yield from read_live_rows(planned, deletes, io, schema, columns)
        else:
            yield from read_data_files([planned], io, schema, columns)


def read_lake_file_rows(path: str, io: dict[str, str], schema_hex: str, columns: Sequence[str],
                        first: int, stop: int) -> Iterator[pa.RecordBatch]:
    """Rows ``[first, stop)`` of one lake data file read on an executor straight from the
    warehouse: only the Parquet row groups holding them are read."""
    import pyarrow.dataset as pads
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from flightstore.lake.catalog import lake_failures

    schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(schema_hex)))
    fields = pa.schema([schema.field(c) for c in columns])
    file_io = PyArrowFileIO(dict(io))
    scheme, netloc, local = file_io.parse_location(path, file_io.properties)
    with lake_failures(f"reading rows [{first}, {stop}) of lake data file {path}"):
        dataset = pads.dataset([local], schema=fields, format="parquet",
                               filesystem=file_io.fs_by_scheme(scheme, netloc))
        fragment = next(iter(dataset.get_fragments()))
        groups, position, at = [], 0, None
        for group in fragment.row_groups:
            if position + group.num_rows > first and position < stop:
                groups.append(group.id)
                at = position if at is None else at
            position += group.num_rows
        if not groups:
            return
        batches = fragment.subset(row_group_ids=groups).to_batches(schema=fields, columns=list(columns),
                                                                   use_threads=False)
        for batch in batches:
            low, high = max(first - at, 0), min(stop - at, batch.num_rows)
            if high > low:
                yield batch.slice(low, high - low)
            at += batch.num_rows
            if at >= stop:
                return


CONNECT_RETRY_S = 20.0  # how long a read or write task keeps trying a server it could not connect to
T = TypeVar("T")


def read_payload(conn: Connection, payload: dict) -> Iterator[pa.RecordBatch]:
    """DoGet of one of flightstore's own read commands, batch by batch (empty batches skipped).

    A DoGet that could not connect at all (nothing was sent: a server restarting, or a connection
    handshake that timed out on a loaded machine) is tried again, backing off, for up to
    :data:`CONNECT_RETRY_S`, so one refused connection does not fail the Spark task; a read is
    safe to send again. Failures after the call started are raised as they are."""
    yield from read_batches(_connecting(lambda: conn._get(payload)))


def _connecting(call: Callable[[], T]) -> T:
    """``call()`` (a request that is safe to send again), tried again, backing off, for up to
    :data:`CONNECT_RETRY_S` while it cannot connect (nothing was sent)."""
    deadline = time.monotonic() + CONNECT_RETRY_S
    pause = 0.1
    while True:
        try:
            return call()
        except flight.FlightUnavailableError as exc:
            if not _unreachable(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 2.0)


def read_ticket(conn: Connection, ticket: bytes) -> Iterator[pa.RecordBatch]:
    """DoGet of a Flight SQL endpoint ticket."""
    yield from read_batches(conn._retrying(lambda: conn._client.do_get(flight.Ticket(ticket), conn._options)))


def put_once(conn: Connection, op: str, table: str, data: pa.Table, *, writer_id: str, sequence: int,
             columns: Sequence[str] | None = None, retries: int = 3,
             conflict_wait_s: float = 45.0, check_applied: bool = False) -> dict[str, Any]:
    """One idempotent write (DoPut): a retry with the same writer id and sequence is applied once.

    A partial update (``columns``) claims its columns on the server while its writer lives; the
    connector's writers are short-lived (one per task or micro-batch), so the claim is released right
    after the write, and a write meeting another task's live claim waits for it (a crashed task's
    claim expires after the server's ownership TTL).

    A write that cannot connect (nothing sent: a server restarting, a handshake that timed out on
    a loaded machine) is tried again, backing off, for up to :data:`CONNECT_RETRY_S`, like a read.

    ``check_applied`` first asks the server for the writer's last applied sequence and skips a batch
    already applied. The server's own duplicate check is per bucket, which misses a retry of a write
    to a log table without bucket key: round-robin sends the retry to another bucket.
    """
    if check_applied:
        last = _connecting(lambda: conn._action("flightstore.writer", {"table": table, "writer_id": writer_id}))
        if last["sequence"] is not None and last["sequence"] >= sequence:
            return {"op": "written", "rows": 0, "duplicate": True, "offsets": {}}
    payload = {"op": op, "table": table, "columns": list(columns) if columns else None,
               "writer_id": writer_id, "sequence": sequence}
    attempt, deadline = 0, time.monotonic() + conflict_wait_s
    connect_deadline = time.monotonic() + CONNECT_RETRY_S
    # In a cluster each part goes to its bucket's leader (one part, to ``conn``, on a single server).
    parts = _connecting(lambda: conn.table(table)._by_leader(data)) or [(conn.uri, data)]
    while True:
        try:
            results = [conn._peer(uri)._put(payload, part) for uri, part in parts]
            result = results[0] if len(results) == 1 else {
                "op": "written", "rows": sum(r["rows"] for r in results),
                "duplicate": all(r["duplicate"] for r in results),
                "offsets": {k: v for r in results for k, v in r["offsets"].items()},
                # each leader numbered its chunks from ``sequence``: the longest run counts
                "sequence": max(sequence if r.get("sequence") is None else r["sequence"] for r in results)}
            break
        except flight.FlightUnavailableError as exc:
            attempt += 1
            if _unreachable(exc) and time.monotonic() < connect_deadline:  # nothing sent: again, later
                attempt = min(attempt, retries - 1)
            elif attempt >= retries:
                raise
            parts = [(conn.uri, data)]  # through the configured server: it names what is down
            time.sleep(min(0.2 * attempt, 2.0))
        except pa.ArrowInvalid as exc:
            if "owned by live writer" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    if columns:
        release(conn, table, writer_id)
    return result


def release(conn: Connection, table: str, writer_id: str) -> None:
    """Give up the columns ``writer_id`` claimed with partial updates."""
    _connecting(lambda: conn._action("flightstore.release", {"table": table, "writer_id": writer_id}))
