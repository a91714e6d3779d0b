"""The Flight SQL server: Flight RPCs -> planner/executor/store, errors -> Flight status codes.

GetFlightInfo plans a query and answers its exact schema with one endpoint that streams every
bucket (one endpoint per bucket when the session sets ``flightstore.per-bucket-endpoints``, as the
Spark connector does); statements (DDL, writes) arriving on the query path run once and answer a
``rows_affected`` row. DoGet re-plans from the stateless ticket and streams Arrow batches kept well
below gRPC's message limit. DoPut handles Flight SQL updates, prepared-statement parameter binding,
bulk ingest and flightstore's own write commands. Errors are translated in exactly one place,
:func:`_translate`.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import signal
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore import changetype
from flightstore.acl import CLUSTER, Operation, Permission, Resource
from flightstore.cache import LruCache
from flightstore.config import SERVER_OPTIONS, server_option, validate_server_options
from flightstore.errors import (
    DataDirectoryInUse,
    FlightstoreError,
    InvalidInput,
    NotFound,
    TableNotFound,
    Unsupported,
)
from flightstore.expressions import from_json
from flightstore.schema import TableDescriptor, TablePath
from flightstore.server import metadata, protocol, status, tickets
from flightstore.server.auth import (
    AUTH_MIDDLEWARE,
    CALLER_TOKEN,
    BasicAuthMiddlewareFactory,
    NoAuthHandler,
    principal_of,
    token_of,
)
from flightstore.server.authz import Authorizer
from flightstore.server.expiring import ExpiringSet
from flightstore.server.housekeeping import Housekeeping
from flightstore.server.metrics import METRICS_MIDDLEWARE, ServerMetrics
from flightstore.server.partition_manager import AutoPartitionManager
from flightstore.server.queries import RunningQueries
from flightstore.server.session import Session, apply_options, option_values
from flightstore.server.tls import TlsConfig
from flightstore.server.upload import UploadLimits, upload_chunks
from flightstore.server.users import UserStore
from flightstore.sql import nodes
from flightstore.sql.execute import ROWS_AFFECTED_SCHEMA, Executor, StoreCatalog, is_query
from flightstore.sql.plan import is_union, parameter_schema
from flightstore.sql.privileges import plan_tables, required_permissions, table_resource
from flightstore.sql.resolve import resolve_database
from flightstore.store import Store

__all__ = ["MAX_BATCH_BYTES", "FlightSqlServer", "rechunk", "serve"]

log = logging.getLogger("flightstore.server")
# Flight messages of at most 2 MiB: the client decodes one while the next is on the wire. A 24 MB
# (10-of-100 column) scan took 14-17 ms with 4 MiB messages, 8-13 ms with 2 MiB; 1 MiB was faster
# still for it but slowed the 130 MB full scan (python -m bench server, /tmp A/B runs).
MAX_BATCH_BYTES = 2 * 1024 * 1024
MAX_BATCH_ROWS = 65_536
HARD_EXIT_MARGIN_S = 5.0  # after the shutdown grace: stopped queries end, then the process exits
MAX_SESSIONS = 4096  # client connections whose USE / session options are remembered
_IPC_OPTIONS = pa.ipc.IpcWriteOptions()  # built once: the default reads os.environ each time
RESULT_TTL_S = 600
# The authenticated user of the RPC being served (set by _rpc; None without authentication).
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("flightstore_caller", default=None)


def _translate(exc: BaseException, hidden: tuple[str, ...] = ()) -> BaseException:
    """The Flight error a client sees for ``exc`` (one place for every RPC): a status and a
    message saying what is wrong; ``hidden`` paths (the data directory) never reach the client,
    nor do tracebacks (:mod:`.status`)."""
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, FlightstoreError):
        message = status.client_message(str(exc), hidden)
        code = exc.flight_status
        if code in ("invalid_argument", "already_exists"):
            return status.InvalidArgument(message)
        if code == "not_found":
            return status.NotFound(message)
        if code == "unimplemented":
            return status.Unimplemented(message)
        if code == "unauthenticated":
            return flight.FlightUnauthenticatedError(message)
        if code == "unauthorized":
            return flight.FlightUnauthorizedError(message)
        if code == "cancelled":
            return flight.FlightCancelledError(message)
        if code == "deadline_exceeded":
            return flight.FlightTimedOutError(message)
        if code == "resource_exhausted":
            return flight.FlightInternalError(f"RESOURCE_EXHAUSTED: {message}")
        if code == "unavailable":
            return flight.FlightUnavailableError(message)
        if code == "data_loss":
            return flight.FlightInternalError(f"DATA_LOSS: {message}")
        status.log_failure(f"failure: {message}", exc, logging.WARNING)
        return flight.FlightInternalError(message)
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError)):
        return status.InvalidArgument(status.client_message(str(exc), hidden))
    if isinstance(exc, RecursionError):  # a statement or payload nested beyond what we walk
        return status.InvalidArgument("the request is nested too deeply (for instance a SELECT of many nested "
                               "subqueries); flatten it")
    return status.internal_error(exc)


def _rpc(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        caller = _CALLER.set(principal_of(context))
        token = CALLER_TOKEN.set(token_of(context))
        try:
            return method(self, context, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error leaves through _translate
            raise _translate(exc, self._hidden_paths) from None
        finally:
            CALLER_TOKEN.reset(token)
            _CALLER.reset(caller)
    return wrapper


def _guarded(batches: Iterator[pa.RecordBatch | pa.Table],
             hidden: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch | pa.Table]:
    """Translate errors raised while a stream is being produced."""
    try:
        yield from batches
    except Exception as exc:  # noqa: BLE001 - a client that stops reading closes us (GeneratorExit)
        raise _translate(exc, hidden) from None


def _in_call_context(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``batches`` pulled in the context of the call that created the stream. gRPC pulls a DoGet
    stream from its own threads after the call returned (and :func:`_rpc` reset the caller): its
    forwarded calls (a cluster scan or partial aggregate opened lazily) must still carry the
    caller's token (:data:`CALLER_TOKEN`), and checks see the caller, on every pull. Nothing is
    set in the pulling thread's own context, so no later call served by that thread inherits it."""
    return _pulled_in(contextvars.copy_context(), batches)  # captured now, not at the first pull


def _pulled_in(context: contextvars.Context, batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
    try:
        while True:
            try:
                batch = context.run(next, batches)
            except StopIteration:
                return
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            context.run(close)


def rechunk(batches: Iterator[pa.RecordBatch | pa.Table]) -> Iterator[pa.Table]:
    """Cut batches into Flight messages of at most :data:`MAX_BATCH_BYTES` (far below gRPC's
    16 MiB limit). Each input batch comes out as one table of zero-copy slices: pyarrow streams a
    table's chunks from C++, so Python runs once per stored batch, not once per message."""
    for item in batches:
        for batch in (item.to_batches() if isinstance(item, pa.Table) else [item]):
            if batch.num_rows == 0:
                continue
            per_row = max(1, batch.nbytes // max(batch.num_rows, 1))
            step = max(1, min(MAX_BATCH_ROWS, MAX_BATCH_BYTES // per_row))
            yield pa.Table.from_batches([batch.slice(start, step)
                                         for start in range(0, batch.num_rows, step)], batch.schema)


def _messages(table: pa.Table) -> pa.Table:
    """``table`` with its chunks cut into Flight messages (as :func:`rechunk` does), zero-copy."""
    if table.num_rows <= MAX_BATCH_ROWS and table.get_total_buffer_size() <= MAX_BATCH_BYTES:
        return table  # small (a lookup's rows): every chunk is a message already
    return pa.Table.from_batches([batch for part in rechunk(iter([table])) for batch in part.to_batches()],
                                 table.schema)


def _peer(context: flight.ServerCallContext | None) -> str:
    """The key of a call's session: its connection's gRPC peer address ("" in process)."""
    return context.peer() if context is not None else ""


@dataclass
class PreparedStatement:
    sql: str
    database: str
    dataset_schema: pa.Schema | None
    parameter_schema: pa.Schema
    params: list[list[Any]] = field(default_factory=list)


class FlightSqlServer(flight.FlightServerBase):
    """flightstore's Flight SQL endpoint over one :class:`~flightstore.store.Store`."""

    def __init__(self, store: Store, location: str = "grpc://127.0.0.1:0", *,
                 users: UserStore | dict[str, str] | None = None, super_users: tuple[str, ...] = (),
                 tls: TlsConfig | None = None, token_ttl_ms: int | None = None,
                 max_tokens: int | None = None, lake: Any = None, retention_interval_s: float | None = None,
                 **kwargs: Any) -> None:
        """``users`` (a UserStore, or a dict of plain passwords for tests and embedded use) turns
        on authentication and authorization; ``tls`` serves ``grpc+tls://`` (``location`` may say
        ``grpc://``: the scheme follows ``tls``). ``lake`` (a :class:`flightstore.lake.LakeSettings`)
        starts the background tierer of datalake-enabled tables (which only follows the lake's
        commits for retention and status when its ``tiering_enabled`` is off).
        A background thread (:mod:`.housekeeping`) takes the KV snapshots ``kv.snapshot.interval``
        makes due and applies ``table.log.ttl`` every ``retention_interval_s`` (default: the
        ``log.retention.check-interval`` option); it stops with :meth:`shutdown`."""
        self.metrics = ServerMetrics(store)
        middleware = kwargs.setdefault("middleware", {})
        middleware[METRICS_MIDDLEWARE] = self.metrics.middleware()  # first: it times every call
        if isinstance(users, dict):
            users = UserStore.from_passwords(users)
        self.authenticator = None
        if users is not None:
            self.authenticator = BasicAuthMiddlewareFactory(users, token_ttl_ms=token_ttl_ms,
                                                            max_tokens=max_tokens,
                                                            on_refused=self.metrics.refused)
            middleware[AUTH_MIDDLEWARE] = self.authenticator
        self.tls = tls
        if tls is not None:
            location = location.replace("grpc://", "grpc+tls://", 1).replace("grpc+tcp://", "grpc+tls://", 1)
            kwargs.update(tls.server_kwargs())
        super().__init__(location, auth_handler=NoAuthHandler(), **kwargs)
        status.quiet_tracebacks()  # until shutdown: no traceback in any error a client gets
        self._quiet = True
        self.store = store
        self._hidden_paths = tuple({str(store.data_dir), os.path.abspath(store.data_dir),
                                    os.path.realpath(store.data_dir)})
        self.authz = Authorizer(store.data_dir, enabled=users is not None, super_users=super_users)
        self.executor = Executor(store)
        self.upload_limits = UploadLimits.from_options(store.options)
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # by gRPC peer, least recent first
        self._prepared: dict[bytes, PreparedStatement] = {}
        self._prepare_cache: LruCache[tuple, tuple] = LruCache(server_option(store.options, "sql.cache.entries"))
        self._results: dict[str, tuple[float, pa.Table, str | None]] = {}  # (kept at, rows, owner)
        self._cancelled = ExpiringSet()  # cancelled query tickets: bounded (size cap, time to live)
        self.queries = RunningQueries()  # DoGet streams of queries: CancelFlightInfo / shutdown stop them
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cluster: Any = None  # the ClusterMember in cluster mode (flightstore.cluster.member)
        self.partition_manager = AutoPartitionManager(store).start()
        self.tierer: Any = None  # the lake's LakeTierer when this server tiers (flightstore.lake)
        if lake is not None:  # with tiering off it follows what a tiering job commits (retention, status)
            from flightstore.lake.tierer import LakeTierer
            self.tierer = LakeTierer(store, lake).start()
        if lake is not None:  # SQL reads the lake too: union reads, t$lake, time travel
            from flightstore.lake.catalog import LakeCatalog
            self.executor.lake = self.tierer.catalog if self.tierer is not None else LakeCatalog(lake)
            self.executor.tierer = self.tierer
        if retention_interval_s is None:
            retention_interval_s = server_option({}, "log.retention.check-interval") / 1000
        self.housekeeping = Housekeeping(store, retention_interval_s).start()

    def session(self, context: flight.ServerCallContext | None) -> Session:
        """The session of the connection ``context`` arrived on, keyed by its gRPC peer address
        (each ADBC/JDBC connection has its own channel): ``USE`` and session options hold per
        connection, as in a SQL database. Calls without a context (in-process) share one session.
        At most :data:`MAX_SESSIONS` are kept; the least recently used is forgotten first."""
        peer = _peer(context)
        with self._lock:
            session = self._sessions.get(peer)
            if session is None:
                session = self._sessions[peer] = Session()
                if len(self._sessions) > MAX_SESSIONS:
                    self._sessions.popitem(last=False)
            else:
                self._sessions.move_to_end(peer)
            return session

    @property
    def uri(self) -> str:
        return f"{'grpc+tls' if self.tls is not None else 'grpc'}://127.0.0.1:{self.port}"

    def shutdown(self, grace_s: float | None = None) -> None:
        """Stop accepting calls and wait for the running ones; past ``grace_s`` (default: the
        ``server.shutdown-grace`` option) stop every running query (its client gets CANCELLED).
        Subscriptions end at once."""
        if grace_s is None:
            grace_s = server_option(self.store.options, "server.shutdown-grace") / 1000
        self._stop.set()
        if self._quiet:
            self._quiet = False
            status.loud_tracebacks()
        self.partition_manager.stop()
        self.housekeeping.stop()
        finished = threading.Event()

        def abort_after_grace() -> None:
            if not finished.wait(grace_s):
                stopped = self.queries.cancel_all("shutdown")
                log.warning("shutdown grace of %.1f s passed: stopping %d running queries", grace_s, stopped)

        grace = threading.Thread(target=abort_after_grace, name="flightstore-shutdown-grace", daemon=True)
        grace.start()
        super().shutdown()
        finished.set()
        grace.join()  # no thread of ours may be left waiting when the process exits
        if self.tierer is not None:
            self.tierer.stop()
        self.metrics.close()
        self.executor.close()

    # ---- authorization: the one check, fed by the plan's resources ----------------------------
    def _authorize(self, permissions: Any) -> None:
        """Raise Unauthorized unless the caller holds every permission (a plan's, or a list)."""
        if isinstance(permissions, nodes.PlanNode):
            permissions = required_permissions(permissions)
        self.authz.check(_CALLER.get(), permissions)

    def _authorize_table(self, operation: Operation, table: Any) -> None:
        self._authorize([Permission(operation, table_resource(table.path))])

    # ---- GetFlightInfo ------------------------------------------------------------------------
    @_rpc
    def get_flight_info(self, context: flight.ServerCallContext,
                        descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise InvalidInput("flightstore answers command descriptors only")
        command_bytes = descriptor.command
        if tickets.is_custom(command_bytes):
            return self._custom_info(descriptor, tickets.decode_custom(command_bytes))
        command = protocol.unpack_any(command_bytes)
        name = command.DESCRIPTOR.name
        if name == "CommandStatementQuery":
            session = self.session(context)
            return self._query_info(descriptor, command.query, None, session.database, session)
        if name == "CommandPreparedStatementQuery":
            prepared = self._prepared_statement(command.prepared_statement_handle)
            params = prepared.params[-1] if prepared.params else None
            return self._query_info(descriptor, prepared.sql, params, prepared.database,
                                    self.session(context))
        schema = self._metadata_schema(command)
        if schema is None:
            raise Unsupported(f"{name} is not supported by flightstore")
        return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(command_bytes, [])], -1, -1)

    def _query_info(self, descriptor: flight.FlightDescriptor, sql: str, params: list | None,
                    database: str, session: Session) -> flight.FlightInfo:
        plan = self.executor.plan(sql, params, database)
        self._authorize(plan)
        if not is_query(plan):
            rows = self._run_statement(plan, session)
            result = pa.table({"rows_affected": pa.array([rows], pa.int64())}, schema=ROWS_AFFECTED_SCHEMA)
            ticket = self._keep_result(result)
            return flight.FlightInfo(ROWS_AFFECTED_SCHEMA, descriptor,
                                     [flight.FlightEndpoint(ticket, [])], 1, -1)
        schema = self.executor.output_schema(plan)
        if self.executor.answers_at_once(plan):
            # Point lookups and counts cost less than the round trip: answer now, ship the result
            # in the ticket, and DoGet streams it without planning or looking up again.
            result = self._answer_now(plan, schema)
            ticket = tickets.result_ticket(result) or self._keep_result(result)
            return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(ticket, [])],
                                     result.num_rows, -1)
        # One endpoint streaming every bucket unless the session asked for one per bucket: clients
        # that read only endpoints[0] (flightsql-dbapi, Superset over it) must get whole answers.
        partitions = self.executor.partitions(plan) if session.per_bucket_endpoints else [None]
        endpoints = []
        query_id = uuid.uuid4().hex  # tickets of one FlightInfo only: CancelFlightInfo cancels just these
        for partition in partitions:
            payload = {"sql": sql, "params": tickets.encode_params(params), "db": database,
                       "partition": partition, "query": query_id}
            endpoints.append(flight.FlightEndpoint(tickets.query_ticket(payload),
                                                   self._bucket_locations(plan, partition)))
        return flight.FlightInfo(schema, descriptor, endpoints, -1, -1)

    def _bucket_locations(self, plan: nodes.PlanNode, partition: int | None) -> list[str]:
        """Where a per-bucket endpoint is served: in a cluster, the URI of the bucket's leader
        (UNAVAILABLE naming it when it is down: no client gets a partial answer)."""
        if partition is None or self.cluster is None:
            return []
        routed = self.store.table(plan.table)
        place = routed.location(partition) if hasattr(routed, "location") else None
        if place is None:
            return [self.cluster.config.advertised_uri]
        return [place.require().uri]

    def _answer_now(self, plan: nodes.PlanNode, schema: pa.Schema) -> pa.Table:
        """The whole result of a small query (GetFlightInfo ships it in the ticket): grants come
        from the authorizer, listings are cut to what the caller may describe."""
        if isinstance(plan, nodes.ShowGrants):
            return self.authz.show(_CALLER.get(), plan)
        result = self.authz.filter_listing(_CALLER.get(), plan, self.executor.execute_table(plan, schema))
        self.metrics.sent(_result_label(plan), result)
        return result

    def _run_statement(self, plan: nodes.PlanNode, session: Session) -> int:
        if isinstance(plan, (nodes.Grant, nodes.Revoke)):
            return self.authz.apply(plan)
        rows = self.executor.run_statement(plan)
        if isinstance(plan, nodes.Insert):
            self.metrics.written(plan.table, plan.data)
        if isinstance(plan, nodes.UseDatabase):  # checked by run_statement: it exists
            session.database = plan.name
        return rows

    def _keep_result(self, table: pa.Table) -> bytes:
        result_id = uuid.uuid4().hex
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (t, _, _) in self._results.items() if now - t > RESULT_TTL_S]:
                del self._results[key]
            self._results[result_id] = (now, table, _CALLER.get())
        return tickets.encode_custom({"op": "result", "id": result_id})

    # ---- DoGet --------------------------------------------------------------------------------
    @_rpc
    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        data = ticket.ticket
        if data in self._cancelled:
            raise flight.FlightCancelledError("this query was cancelled")
        if tickets.is_result(data):
            return flight.RecordBatchStream(tickets.decode_result(data), _IPC_OPTIONS)
        if tickets.is_custom(data):
            schema, batches = self._custom_get(tickets.decode_custom(data), context)
        else:
            try:
                command = protocol.unpack_any(data)
            except Unsupported:
                raise InvalidInput("this ticket was not issued by this server") from None
            if command.DESCRIPTOR.name == "TicketStatementQuery":
                payload = tickets.decode_query_handle(command.statement_handle)
                plan = self.executor.plan(payload["sql"], tickets.decode_params(payload.get("params")),
                                          payload.get("db", "default"))
                if not is_query(plan):
                    raise InvalidInput("statements run when their FlightInfo is requested")
                self._authorize(plan)  # tickets are bearer data: check whoever presents one
                if payload.get("partition") is not None and \
                        payload["partition"] not in self.executor.partitions(plan):
                    raise InvalidInput(f"this ticket names partition {payload['partition']}, which "
                                       "the query does not have")
                schema = self.executor.output_schema(plan)
                control = self.executor.control(context.is_cancelled if context is not None else None)
                batches = self.executor.execute(plan, payload.get("partition"), schema, control)
                batches = self.queries.stream(payload.get("query"), control,
                                              self.metrics.metered(_result_label(plan), batches))
            else:
                table = self._metadata_table(command, self.session(context))
                schema, batches = table.schema, table
        if isinstance(batches, pa.Table):  # materialized (lookups, counts, metadata): C++ streams it
            return flight.RecordBatchStream(_messages(batches), _IPC_OPTIONS)
        return flight.GeneratorStream(schema, _in_call_context(_guarded(rechunk(batches), self._hidden_paths)))

    # ---- metadata commands --------------------------------------------------------------------
    def _metadata_schema(self, command: Any) -> pa.Schema | None:
        name = command.DESCRIPTOR.name
        if name == "CommandGetTables":
            return metadata.TABLES_SCHEMA_WITH_SCHEMA if command.include_schema else metadata.TABLES_SCHEMA
        return {
            "CommandGetCatalogs": metadata.CATALOGS_SCHEMA,
            "CommandGetDbSchemas": metadata.DB_SCHEMAS_SCHEMA,
            "CommandGetTableTypes": metadata.TABLE_TYPES_SCHEMA,
            "CommandGetPrimaryKeys": metadata.PRIMARY_KEYS_SCHEMA,
            "CommandGetImportedKeys": metadata.IMPORTED_KEYS_SCHEMA,
            "CommandGetExportedKeys": metadata.IMPORTED_KEYS_SCHEMA,
            "CommandGetCrossReference": metadata.IMPORTED_KEYS_SCHEMA,
            "CommandGetSqlInfo": metadata.SQL_INFO_SCHEMA,
            "CommandGetXdbcTypeInfo": metadata.XDBC_TYPE_INFO_SCHEMA,
        }.get(name)

    def _descriptors(self) -> list[TableDescriptor]:
        found = []
        for path in self.authz.visible_tables(_CALLER.get(), self.store.catalog.all_tables()):
            try:
                found.append(self.store.catalog.get_table(path))
            except FlightstoreError:
                continue
        return found

    def _metadata_table(self, command: Any, session: Session) -> pa.Table:
        name = command.DESCRIPTOR.name

        def optional(field: str):
            return getattr(command, field) if command.HasField(field) else None

        if name == "CommandGetCatalogs":
            return metadata.catalogs_table()
        if name == "CommandGetDbSchemas":
            databases = self.authz.visible_databases(_CALLER.get(), self.store.list_databases())
            return metadata.db_schemas_table(databases, optional("catalog"),
                                             optional("db_schema_filter_pattern"))
        if name == "CommandGetTables":
            return metadata.tables_table(
                self._descriptors(), catalog=optional("catalog"),
                db_schema_filter_pattern=optional("db_schema_filter_pattern"),
                table_name_filter_pattern=optional("table_name_filter_pattern"),
                table_types=list(command.table_types), include_schema=command.include_schema)
        if name == "CommandGetTableTypes":
            return metadata.table_types_table()
        if name == "CommandGetPrimaryKeys":
            database = optional("db_schema") or session.database
            try:
                descriptor = self.store.catalog.get_table(TablePath(database, command.table))
            except NotFound:
                descriptor = None
            if descriptor is not None and not self.authz.visible_tables(_CALLER.get(), [descriptor.path]):
                descriptor = None  # what the caller may not describe does not exist for it
            return metadata.primary_keys_table(descriptor)
        if name in ("CommandGetImportedKeys", "CommandGetExportedKeys", "CommandGetCrossReference"):
            return metadata.IMPORTED_KEYS_SCHEMA.empty_table()
        if name == "CommandGetSqlInfo":
            return metadata.sql_info_table(list(command.info))
        if name == "CommandGetXdbcTypeInfo":
            return metadata.xdbc_type_info_table(optional("data_type"))
        raise Unsupported(f"{name} is not supported by flightstore")

    # ---- DoAction -----------------------------------------------------------------------------
    @_rpc
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[bytes]:
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        if kind.startswith("flightstore."):
            return iter([self._custom_action(kind, tickets.decode_custom(body))])
        request = protocol.decode_action(kind, body)
        if kind == protocol.CREATE_PREPARED_STATEMENT:
            result = self._prepare(request.query, self.session(context).database)
        elif kind == protocol.CLOSE_PREPARED_STATEMENT:
            with self._lock:
                self._prepared.pop(request.prepared_statement_handle, None)
            return iter([])
        elif kind == protocol.CANCEL_FLIGHT_INFO:
            try:
                info = flight.FlightInfo.deserialize(request.info)
            except pa.ArrowException as exc:
                raise InvalidInput(f"CancelFlightInfo: the FlightInfo does not parse ({exc})") from None
            queries = [e.ticket.ticket for e in info.endpoints if _is_query_ticket(e.ticket.ticket)]
            with self._lock:  # metadata tickets are the (shared) command bytes: never cancel those
                self._cancelled.update(queries)
            self.queries.cancel({query_id for query_id in map(_query_id, queries) if query_id})
            result = protocol.CancelFlightInfoResult(status=1)  # CANCEL_STATUS_CANCELLED
        elif kind == protocol.SET_SESSION_OPTIONS:
            session = self.session(context)
            catalog = StoreCatalog(self.store)
            with self._lock:
                errors = apply_options(session, request.session_options,
                                       lambda name: resolve_database(catalog, name))
            result = protocol.SetSessionOptionsResult()
            for key, value in errors.items():
                result.errors[key].value = value
        elif kind == protocol.GET_SESSION_OPTIONS:
            session = self.session(context)
            result = protocol.GetSessionOptionsResult()
            with self._lock:
                for key, value in option_values(session).items():
                    result.session_options[key].CopyFrom(value)
        elif kind == protocol.CLOSE_SESSION:
            with self._lock:
                self._sessions.pop(_peer(context), None)  # USE and options start over
            result = protocol.CloseSessionResult(status=1)  # CLOSED
        else:
            raise Unsupported(f"action {kind} is not supported by flightstore (no transactions, "
                              "savepoints or Substrait plans)")
        return iter([protocol.encode_action_result(result)])

    @_rpc
    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        raise Unsupported("ListFlights is not supported by flightstore; list tables with Flight SQL "
                          "CommandGetTables (or SHOW TABLES)")

    @_rpc
    def get_schema(self, context: flight.ServerCallContext,
                   descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        raise Unsupported("GetSchema is not supported by flightstore; GetFlightInfo answers the schema")

    @_rpc
    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        raise Unsupported("DoExchange is not supported by flightstore")

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(protocol.CREATE_PREPARED_STATEMENT, "prepare a SQL statement"),
                (protocol.CLOSE_PREPARED_STATEMENT, "close a prepared statement"),
                (protocol.CANCEL_FLIGHT_INFO, "cancel a query's endpoints"),
                (protocol.SET_SESSION_OPTIONS, "set session options"),
                (protocol.GET_SESSION_OPTIONS, "get session options"),
                (protocol.CLOSE_SESSION, "close the session"),
                ("flightstore.offsets", "log offsets of a table's buckets"),
                ("flightstore.cluster", "this server's view of its cluster (servers, bucket leaders)"),
                ("flightstore.locations", "a table's bucketing and the URI of each bucket's leader"),
                ("flightstore.writer", "the last batch sequence a writer applied"),
                ("flightstore.buckets", "the buckets a scan with a filter reads (partitions pruned)"),
                ("flightstore.undo", "undo a writer's batches after a checkpoint sequence"),
                ("flightstore.release", "release the columns a writer owns"),
                ("flightstore.snapshot", "take a KV snapshot of a primary-key table's buckets now"),
                ("flightstore.usage", "bytes a table holds on disk (KV, snapshots, log) and its offsets"),
                ("flightstore.describe", "a table's descriptor, incarnation id and offsets (tiering jobs)")]

    def _prepare(self, sql: str, database: str) -> Any:
        key = (sql, database, self.store.catalog.version)
        schemas = self._prepare_cache.get(key)
        if schemas is None:  # ADBC prepares again at every execute: plan each text once
            params_schema = parameter_schema(sql, StoreCatalog(self.store, database)) \
                if "?" in sql or "$" in sql else pa.schema([])  # no placeholder: skip a parse
            probe = [_probe_value(f.type) for f in params_schema] if len(params_schema) else None
            plan = self.executor.plan(sql, probe, database)
            permissions = required_permissions(plan)
            self._authorize(permissions)  # before the schema (it describes the tables)
            dataset_schema = self.executor.output_schema(plan) if is_query(plan) else None
            self._prepare_cache.put(key, (dataset_schema, params_schema, permissions))
        else:
            dataset_schema, params_schema, permissions = schemas
            self._authorize(permissions)
        handle = uuid.uuid4().hex.encode()
        with self._lock:
            self._prepared[handle] = PreparedStatement(sql, database, dataset_schema, params_schema)
        return protocol.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle,
            dataset_schema=dataset_schema.serialize().to_pybytes() if dataset_schema is not None else b"",
            parameter_schema=params_schema.serialize().to_pybytes())

    def _prepared_statement(self, handle: bytes) -> PreparedStatement:
        with self._lock:
            prepared = self._prepared.get(handle)
        if prepared is None:
            raise InvalidInput("unknown or closed prepared statement handle")
        return prepared

    # ---- DoPut --------------------------------------------------------------------------------
    @_rpc
    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise InvalidInput("flightstore answers command descriptors only")
        command_bytes = descriptor.command
        if tickets.is_custom(command_bytes):
            result = self._custom_put(tickets.decode_custom(command_bytes), reader)
            writer.write(pa.py_buffer(tickets.encode_custom(result)))
            return
        command = protocol.unpack_any(command_bytes)
        name = command.DESCRIPTOR.name
        if name == "CommandStatementUpdate":
            count = self._run_update(command.query, None, self.session(context))
            writer.write(pa.py_buffer(protocol.DoPutUpdateResult(record_count=count).SerializeToString()))
        elif name == "CommandPreparedStatementQuery":
            prepared = self._prepared_statement(command.prepared_statement_handle)
            prepared.params = [row for chunk in upload_chunks(reader, self.upload_limits)
                               for row in _param_rows(chunk)]
            result = protocol.DoPutPreparedStatementResult(
                prepared_statement_handle=command.prepared_statement_handle)
            writer.write(pa.py_buffer(result.SerializeToString()))
        elif name == "CommandPreparedStatementUpdate":
            prepared = self._prepared_statement(command.prepared_statement_handle)
            count, bound = 0, False
            for chunk in upload_chunks(reader, self.upload_limits):  # each chunk: one batch of rows
                count += self._run_updates(prepared.sql, _param_rows(chunk), prepared.database)
                bound = True
            if not bound:
                count = self._run_updates(prepared.sql, prepared.params or [None], prepared.database)
            writer.write(pa.py_buffer(protocol.DoPutUpdateResult(record_count=count).SerializeToString()))
        elif name == "CommandStatementIngest":
            count = self._ingest(command, reader, self.session(context).database)
            writer.write(pa.py_buffer(protocol.DoPutUpdateResult(record_count=count).SerializeToString()))
        else:
            raise Unsupported(f"{name} is not supported by DoPut")

    def _run_update(self, sql: str, params: list | None, session: Session) -> int:
        plan = self.executor.plan(sql, params, session.database)
        if is_query(plan):
            raise InvalidInput("a query was sent as an update; use a query command for SELECT")
        self._authorize(plan)
        return self._run_statement(plan, session)

    def _run_updates(self, sql: str, rows: list, database: str) -> int:
        """Run ``sql`` once per parameter row: every row is planned (validated) before any runs,
        and INSERT rows are written as one batch, so a bad row means nothing is written."""
        bulk = self._bulk_insert(sql, rows, database)
        if bulk is not None:
            self._authorize(bulk)
            count = self.executor.run_statement(bulk)
            self.metrics.written(bulk.table, bulk.data)
            return count
        plans = [self.executor.plan(sql, row, database) for row in rows]
        if any(is_query(plan) for plan in plans):
            raise InvalidInput("a query was sent as an update; use a query command for SELECT")
        for plan in plans:
            self._authorize(plan)
        if len(plans) > 1 and all(isinstance(p, nodes.Insert) and p.table == plans[0].table
                                  and p.columns == plans[0].columns for p in plans):
            data = pa.concat_tables([p.data for p in plans], promote_options="permissive")
            plans = [nodes.Insert(table=plans[0].table, data=data, columns=plans[0].columns)]
        count = sum(self.executor.run_statement(plan) for plan in plans)
        for plan in plans:
            if isinstance(plan, nodes.Insert):
                self.metrics.written(plan.table, plan.data)
        return count

    def _bulk_insert(self, sql: str, rows: list, database: str) -> nodes.Insert | None:
        """One Insert of every parameter row when ``sql`` is ``INSERT ... VALUES (?, ?, ...)``.

        The statement is planned once, with the first row; when its single VALUES row is exactly
        the parameters in order, the other rows become columns of the same batch (cast and
        validated by the table as one write) instead of being planned one by one.
        """
        if len(rows) < 2 or rows[0] is None:
            return None
        first = self.executor.plan(sql, rows[0], database)
        if not isinstance(first, nodes.Insert) or first.data.num_rows != 1 \
                or first.data.num_columns != len(rows[0]):
            return None
        probe = [_probe_value(f.type) for f in first.data.schema]
        if self.executor.plan(sql, probe, database).data.to_pylist()[0] != \
                dict(zip(first.data.column_names, probe)):
            return None  # the VALUES row is not just the parameters in order
        try:
            columns = [pa.array([row[i] for row in rows]).cast(field.type)
                       for i, field in enumerate(first.data.schema)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, IndexError):
            return None  # let the per-row planner report the offending value
        return nodes.Insert(table=first.table, data=pa.Table.from_arrays(columns, schema=first.data.schema),
                            columns=first.columns)

    def _ingest(self, command: Any, reader: flight.MetadataRecordBatchReader, default_database: str) -> int:
        """Bulk ingest, applied chunk by chunk as the upload streams in (see :mod:`.upload`);
        a table the ingest created is dropped again if any chunk fails."""
        options = command.table_definition_options
        database = command.schema if command.HasField("schema") and command.schema else default_database
        path = TablePath.checked(database, command.table)  # before anything is looked up or made
        create = options.if_not_exist  # 0 unspecified, 1 CREATE, 2 FAIL
        exists = options.if_exists      # 0 unspecified, 1 FAIL, 2 APPEND, 3 REPLACE
        self._authorize(_ingest_permissions(path, self.store.catalog.database_exists(path.database)
                                            and path.table in self.store.list_tables(path.database),
                                            exists))
        created = False
        try:
            table = self.store.table(path)
            if exists in (0, 1):
                raise InvalidInput(f"table {path} already exists (ingest mode 'create' fails on it)")
            if exists == 3:
                TableDescriptor.create(path, reader.schema)  # a schema that cannot be stored fails first
                self.store.drop_table(path)
                table, created = self.store.create_table(path, reader.schema), True
        except TableNotFound:
            if create == 2:
                raise TableNotFound(f"table {path} does not exist (ingest mode 'append' fails)") from None
            table, created = self.store.create_table(path, reader.schema), True
        rows = 0
        try:
            for chunk in upload_chunks(reader, self.upload_limits):
                if table.has_primary_key:
                    table.upsert(chunk)
                else:
                    table.append(chunk)
                self.metrics.written(path, chunk)
                rows += chunk.num_rows
        except BaseException:
            if created:  # create-then-ingest is one step: a failed ingest leaves no empty table
                self.store.drop_table(path, if_exists=True)
            raise
        return rows

    # ---- flightstore's own commands (Python client) -------------------------------------------
    def _custom_info(self, descriptor: flight.FlightDescriptor, payload: dict) -> flight.FlightInfo:
        if payload["op"] == "sql":
            raise InvalidInput("a flightstore 'sql' command is a DoGet ticket; send SQL to "
                               "GetFlightInfo as a Flight SQL CommandStatementQuery")
        schema, _ = self._custom_get(payload, None, plan_only=True)
        ticket = descriptor.command
        if payload["op"] == "subscribe":
            # The start position holds from now, not from whenever the client calls DoGet: the
            # ticket carries concrete per-bucket offsets, so a change written between the two
            # calls is delivered ("latest" resolved at DoGet would skip it).
            offsets = self.store.table(payload["table"]).resolve_start(payload.get("start", "earliest"))
            ticket = tickets.encode_custom({**payload, "start": {str(b): o for b, o in offsets.items()}})
        return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1)

    def _custom_get(self, payload: dict, context: Any, plan_only: bool = False
                    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch | pa.Table] | pa.Table]:
        """The schema and rows of a flightstore read command: an iterator for streamed reads,
        a Table for results that are complete already (lookups, counts, kept results)."""
        op = payload["op"]
        if op == "sql":
            return self._sql_get(payload, context)
        if op == "result":
            with self._lock:
                entry = self._results.get(payload["id"])
            if entry is None:
                raise InvalidInput("this result expired or was already read")
            if entry[2] is not None and entry[2] != _CALLER.get() and not self.authz.is_super(_CALLER.get()):
                raise InvalidInput("this result expired or was already read")  # another user's
            return entry[1].schema, entry[1]
        table = self.store.table(payload["table"])
        self._authorize_table(Operation.READ, table)
        columns = payload.get("columns")
        if columns:
            known = set(changetype.changelog_schema(table.schema).names
                        if op in ("subscribe", "snapshot", "changelog")
                        else table.schema.names) | set(changetype.snapshot_schema(table.schema).names
                                                       if op == "snapshot" else ())
            unknown = [c for c in columns if c not in known]
            if unknown:
                raise InvalidInput(f"table {table.path} has no column {unknown[0]!r}")
        forwarded = bool(payload.get("local")) and hasattr(table, "check_owned")  # from a cluster peer
        if op in ("lookup", "prefix_lookup"):
            keys = tickets.decode_table(payload["keys_ipc"]) if "keys_ipc" in payload \
                else pa.table(payload["keys"])
            schema = table.projection(columns or table.schema.names)
            if plan_only:
                return schema, iter(())
            if forwarded:
                table = table.owner_side_keys(keys)
            found = table.lookup(keys, columns) if op == "lookup" else \
                table.prefix_lookup(keys, columns, payload.get("limit"))
            self.metrics.sent(str(table.path), found)
            return schema, found
        if op == "partial":  # a cluster peer's partial aggregate over the buckets this server leads
            if not forwarded or not isinstance(payload.get("buckets"), list) or \
                    not isinstance(payload.get("partial"), str) or not isinstance(payload.get("name"), str):
                raise InvalidInput("a partial aggregate is a forwarded call naming its buckets, "
                                   "partial SQL and input name")
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            item = nodes.ResidualInput(payload["name"], table.path, "table", tuple(columns or table.schema.names),
                                 filter.bind(table.schema) if filter is not None else None,
                                 partial=payload["partial"])
            schema = self.executor._partial_schema(item)
            if plan_only:
                return schema, iter(())
            rows = self.executor.partial_rows(table.check_owned(payload["buckets"]), item, payload["buckets"])
            self.metrics.partials.inc()
            return schema, self.metrics.metered(str(table.path), iter([rows]))
        if op == "scan":
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            schema = table.projection(columns or table.schema.names)
            buckets = payload.get("buckets")
            if buckets is not None and not set(buckets) <= set(table.bucket_ids()):
                raise InvalidInput(f"table {table.path} has no bucket "
                                   f"{min(set(buckets) - set(table.bucket_ids()))}")
            if forwarded:
                if buckets is None:
                    raise InvalidInput("a forwarded scan names its buckets")
                table = table.check_owned(buckets)
            if is_union(table.descriptor):  # the lake below the tiered offsets, then the log
                from flightstore.lake.union import UnionSplit, read_union
                split = None
                if payload.get("log_from") is not None:  # a log-tail split of a planned union read
                    split = UnionSplit(None, None, {int(b): int(o) for b, o in payload["log_from"].items()})
                    buckets = [b for b in (buckets or split.offsets) if b in split.offsets]
                if filter is not None:
                    filter = filter.bind(table.schema)
                rows = read_union(self.executor.lake, table, columns or table.schema.names, filter=filter,
                                  limit=payload.get("limit"), buckets=buckets, split=split)
            else:
                rows = table.scan(columns, filter, payload.get("limit"), buckets,
                                  exact=bool(payload.get("exact", True)))
            return schema, self.metrics.metered(str(table.path), rows)
        if op == "subscribe":
            full = changetype.changelog_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            stop = threading.Event() if context is None else _CallStop(context, self._stop)
            if not plan_only:
                self.metrics.mark_subscription(context)
            if forwarded:
                table = table.local
            return schema, self.metrics.metered(str(table.path), table.subscribe(
                payload.get("start", "earliest"), columns=columns, stop=stop,
                heartbeat_s=payload.get("heartbeat_s", 1.0), until=payload.get("until")))
        if op == "changelog":
            full = changetype.changelog_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            if plan_only:
                return schema, iter(())
            bucket = int(payload["bucket"])
            if bucket not in table.bucket_ids():
                raise InvalidInput(f"table {table.path} has no bucket {bucket}")
            if forwarded:
                table = table.check_owned([bucket])
            return schema, self.metrics.metered(str(table.path), table.read_changelog(
                bucket, payload.get("from_offset"), columns=columns, to_offset=payload.get("to_offset"),
                max_rows=payload.get("max_rows")))
        if op == "snapshot":
            full = changetype.snapshot_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            if plan_only:
                return schema, iter(())
            if forwarded:
                table = table.check_owned([int(payload["bucket"])])
            return schema, self.metrics.metered(str(table.path), table.read_snapshot(
                int(payload["bucket"]), int(payload["at"]), columns))
        if op == "count":
            schema = pa.schema([pa.field("count", pa.int64(), nullable=False)])
            if forwarded:
                table = table.local
            if is_union(table.descriptor):
                from flightstore.lake.union import union_count
                return schema, pa.table({"count": [union_count(self.executor.lake, table)]}, schema=schema)
            partitions = payload.get("partitions")
            count = table.row_count() if partitions is None else table.row_count(partitions)
            return schema, pa.table({"count": [count]}, schema=schema)
        raise InvalidInput(f"unknown flightstore read command {op!r}")

    def _sql_get(self, payload: dict, context: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch] | pa.Table]:
        """One SQL statement in one DoGet (the Python client's ``sql()``): what GetFlightInfo of a
        ``CommandStatementQuery`` and DoGet of its ticket do together, in the caller's session and
        authorized the same way, without the second round trip. Statements run and answer
        ``rows_affected``; small queries answer at once; other queries stream every bucket."""
        sql = payload.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidInput("a flightstore 'sql' ticket needs the statement as a non-empty "
                               "string under 'sql'")
        session = self.session(context)
        plan = self.executor.plan(sql, None, session.database)
        self._authorize(plan)
        if not is_query(plan):
            rows = self._run_statement(plan, session)
            return ROWS_AFFECTED_SCHEMA, pa.table({"rows_affected": pa.array([rows], pa.int64())},
                                                  schema=ROWS_AFFECTED_SCHEMA)
        schema = self.executor.output_schema(plan)
        if self.executor.answers_at_once(plan):
            return schema, self._answer_now(plan, schema)
        # Streamed like a Flight SQL ticket's DoGet: the query timeout, the client going away and
        # shutdown stop it between batches (no query id: CancelFlightInfo needs a FlightInfo).
        control = self.executor.control(context.is_cancelled if context is not None else None)
        batches = self.executor.execute(plan, None, schema, control)
        return schema, self.queries.stream(None, control, self.metrics.metered(_result_label(plan), batches))

    def _custom_put(self, payload: dict, reader: flight.MetadataRecordBatchReader) -> dict:
        op = payload["op"]
        table = self.store.table(payload["table"])
        self._authorize_table(Operation.WRITE, table)
        if op not in ("append", "upsert", "delete", "write"):
            raise InvalidInput(f"unknown flightstore write command {op!r}")
        if op == "write" and changetype.CHANGE_TYPE_COLUMN not in reader.schema.names:
            raise InvalidInput("a changelog write needs a _change_type column")
        writer_id, base = payload.get("writer_id"), payload.get("sequence")
        columns = payload.get("columns")
        if payload.get("local") and hasattr(table, "owner_side"):
            # A part a cluster peer forwarded (at most one of its chunks): one batch, on this
            # server's own buckets only.
            data = reader.read_all()
            table.accept_gap(writer_id, base)
            result = _write_chunk(table.owner_side(data, columns, op), op, data, columns, writer_id, base)
            self.metrics.written(table.path, data)
            return {"op": "written", "rows": data.num_rows, "duplicate": bool(result.duplicate),
                    "offsets": {str(k): v for k, v in result.items()}, "chunks": 1, "sequence": base}
        # Chunk k of a sequenced upload is batch ``base + k`` of its writer: a retried upload is
        # cut the same way, so the chunks applied before a lost acknowledgement are skipped.
        rows, duplicates, chunks, offsets = 0, 0, 0, {}
        for chunk in _at_least_one(upload_chunks(reader, self.upload_limits), reader.schema):
            sequence = None if base is None else base + chunks
            result = _write_chunk(table, op, chunk, columns, writer_id, sequence)
            self.metrics.written(table.path, chunk)
            rows += chunk.num_rows
            duplicates += bool(result.duplicate)
            chunks += 1
            for bucket, offset in result.items():
                offsets.setdefault(str(bucket), offset)  # where the upload starts in each bucket
        return {"op": "written", "rows": rows, "duplicate": chunks > 0 and duplicates == chunks,
                "offsets": offsets, "chunks": chunks,
                "sequence": None if base is None else base + chunks - 1}

    def _custom_action(self, kind: str, payload: dict) -> bytes:
        if kind == "flightstore.offsets":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)  # as Fluss's LIST_OFFSETS
            if payload.get("local") and hasattr(table, "local"):  # a cluster peer: this server's buckets
                table = table.local
            which = payload.get("which", "end")
            if which not in ("end", "start", "timestamp"):
                raise InvalidInput(f"unknown offsets {which!r}: use end, start or timestamp")
            if which == "end":
                offsets = table.end_offsets()
            elif which == "start":
                offsets = table.start_offsets()
            else:
                offsets = table.offsets_for_timestamp(int(payload["timestamp_ms"]))
            return tickets.encode_custom({"op": "offsets", "offsets": {str(k): v for k, v in offsets.items()}})
        if kind == "flightstore.buckets":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            if filter is not None:
                filter = filter.bind(table.schema)
            return tickets.encode_custom({"op": "buckets", "buckets": _bucket_ids(table, filter)})
        if kind == "flightstore.lake-split":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.READ, table)
            if not is_union(table.descriptor):
                return tickets.encode_custom({"op": "lake-split", "union": False})
            from flightstore.lake.union import plan_split
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            planned = plan_split(self.executor.lake, table, filter, payload.get("snapshot_id"))
            return tickets.encode_custom({"op": "lake-split", "union": True, **planned})
        if kind == "flightstore.undo":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.WRITE, table)
            restored = table.undo(payload["writer_id"], int(payload["after_sequence"]))
            return tickets.encode_custom({"op": "undone", "rows": restored})
        if kind == "flightstore.release":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.WRITE, table)
            table.ownership.release(payload["writer_id"])
            return tickets.encode_custom({"op": "released"})
        if kind == "flightstore.snapshot":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.ALTER, table)  # storage upkeep of the table, like DDL
            taken = table.snapshot(force=bool(payload.get("force", False)))
            table.enforce_retention()  # the new snapshot may let the changelog shrink
            return tickets.encode_custom({"op": "snapshot", "snapshots": {
                str(bucket): None if info is None else {"id": info.id, "offset": info.offset,
                                                        "rows": info.rows, "created_ms": info.created_ms}
                for bucket, info in taken.items()}})
        if kind == "flightstore.usage":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)  # like the offsets
            start, end = table.start_offsets(), table.end_offsets()
            return tickets.encode_custom({"op": "usage", "bytes": table.disk_usage(),
                                          "start_offsets": {str(k): v for k, v in start.items()},
                                          "end_offsets": {str(k): v for k, v in end.items()}})
        if kind == "flightstore.describe":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            start, end = table.start_offsets(), table.end_offsets()
            return tickets.encode_custom({"op": "describe", "descriptor": table.descriptor.to_json(),
                                          "table_id": table.directory.name,
                                          "start_offsets": {str(k): v for k, v in start.items()},
                                          "end_offsets": {str(k): v for k, v in end.items()}})
        if kind == "flightstore.writer":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.WRITE, table)  # as Fluss's INIT_WRITER
            if payload.get("local") and hasattr(table, "local"):  # a cluster peer: this server's buckets
                table = table.local
            return tickets.encode_custom({"op": "writer",
                                          "sequence": table.writer_sequence(payload["writer_id"])})
        if kind == "flightstore.lake-status":
            if payload.get("table"):
                self._authorize_table(Operation.DESCRIBE, self.store.table(payload["table"]))
            else:
                self._authorize([Permission(Operation.DESCRIBE, CLUSTER)])
            if self.tierer is None:
                raise Unsupported("this server does not tier tables into the lake (cluster mode)")
            statuses = ([self.tierer.status(payload["table"])] if payload.get("table")
                        else self.tierer.statuses())
            return tickets.encode_custom({"op": "lake-status", "tables": [s.to_dict() for s in statuses]})
        if kind == "flightstore.locations":
            table = self.store.table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            descriptor = table.descriptor
            places = table.locations() if hasattr(table, "locations") else []
            return tickets.encode_custom({
                "op": "locations", "num_buckets": descriptor.num_buckets,
                "bucket_key": list(descriptor.bucket_key), "partitioned": descriptor.is_partitioned,
                "primary_key": list(descriptor.primary_key),
                "leaders": [p.server.uri if p.server is not None else None for p in places]})
        if kind == "flightstore.cluster":
            self._authorize([Permission(Operation.DESCRIBE, CLUSTER)])
            if self.cluster is None:
                raise Unsupported("this server is not part of a cluster (serve it with --zookeeper)")
            return tickets.encode_custom({"op": "cluster", **self.cluster.describe(payload.get("table")),
                                          "partial_aggregates": int(self.metrics.partials._value.get())})
        raise Unsupported(f"action {kind} is not supported by flightstore")


def _at_least_one(chunks: Iterator[pa.Table], schema: pa.Schema) -> Iterator[pa.Table]:
    """``chunks``, or one empty table when there are none (an empty write still takes its
    writer's sequence number, as any acknowledged batch does)."""
    empty = True
    for chunk in chunks:
        empty = False
        yield chunk
    if empty:
        yield schema.empty_table()


def _write_chunk(table: Any, op: str, data: pa.Table, columns: list | None, writer_id: str | None,
                 sequence: int | None) -> Any:
    """Apply one chunk of a flightstore write command (``op`` checked by the caller)."""
    if op == "append":
        return table.append(data, writer_id=writer_id, sequence=sequence)
    if op == "upsert":
        return table.upsert(data, columns, writer_id=writer_id, sequence=sequence)
    if op == "delete":
        return table.delete(data, columns, writer_id=writer_id, sequence=sequence)
    try:
        kinds = changetype.from_strings(data.column(changetype.CHANGE_TYPE_COLUMN).combine_chunks())
    except (ValueError, pa.ArrowException) as exc:
        raise InvalidInput(f"column {changetype.CHANGE_TYPE_COLUMN}: {exc}") from None
    rows = data.drop_columns([changetype.CHANGE_TYPE_COLUMN])
    if table.has_primary_key:
        return table.write(rows, kinds, columns, writer_id=writer_id, sequence=sequence)
    return table.append(rows, writer_id=writer_id, sequence=sequence)


class _CallStop:
    """A stop flag for a streaming DoGet: set when the client cancels or the server stops."""

    def __init__(self, context: flight.ServerCallContext, server_stop: threading.Event) -> None:
        self.context = context
        self.server_stop = server_stop

    def is_set(self) -> bool:
        return self.server_stop.is_set() or self.context.is_cancelled()


def _bucket_ids(table: Any, filter: Any) -> list[int]:
    """The buckets a scan with ``filter`` must read: of a partitioned table, those of the
    partitions the filter cannot rule out (table-wide numbers)."""
    if table.descriptor.is_partitioned:
        return table.bucket_ids(filter=filter)
    return table.bucket_ids()


def _is_query_ticket(data: bytes) -> bool:
    """Whether ``data`` names one query's result (unique per FlightInfo, so cancellable)."""
    if tickets.is_result(data):
        return True
    if tickets.is_custom(data):
        return tickets.decode_custom(data).get("op") == "result"
    try:
        return protocol.unpack_any(data).DESCRIPTOR.name == "TicketStatementQuery"
    except FlightstoreError:
        return False


def _query_id(data: bytes) -> str | None:
    """The query id a streamed query's ticket carries (one per FlightInfo), if any."""
    if tickets.is_result(data) or tickets.is_custom(data):
        return None
    command = protocol.unpack_any(data)
    return tickets.decode_query_handle(command.statement_handle).get("query")


def _result_label(plan: nodes.PlanNode) -> str:
    """The ``table`` label of a query's rows in the metrics: the tables it reads."""
    return ",".join(str(path) for path in plan_tables(plan))


def _ingest_permissions(path: TablePath, exists: bool, if_exists: int) -> list[Permission]:
    """What a bulk ingest needs: WRITE on the table, plus CREATE on its database when it creates
    the table, and DROP on the table when it replaces it."""
    needs = [Permission(Operation.WRITE, Resource.of_table(path.database, path.table))]
    if not exists:
        needs.append(Permission(Operation.CREATE, Resource.of_database(path.database)))
    elif if_exists == 3:
        needs += [Permission(Operation.DROP, Resource.of_table(path.database, path.table)),
                  Permission(Operation.CREATE, Resource.of_database(path.database))]
    return needs


def _probe_value(arrow_type: pa.DataType) -> Any:
    """A harmless typed value standing in for a parameter while preparing."""
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return 0
    if pa.types.is_boolean(arrow_type):
        return False
    if pa.types.is_binary(arrow_type):
        return b""
    if pa.types.is_timestamp(arrow_type):
        return "1970-01-01 00:00:00"
    if pa.types.is_date(arrow_type):
        return "1970-01-01"
    return ""


def _param_rows(table: pa.Table) -> list[list[Any]]:
    """Bound parameter rows (columns "0", "1", ... or any names, in column order)."""
    if table.num_columns == 0 or table.num_rows == 0:
        return []
    # to_pylist also reads the dense union a parameter arrives as from flightsql-dbapi.
    columns = [column.to_pylist() for column in table.columns]
    return [list(row) for row in zip(*columns)]


def _wait_for_signal(grace_s: float) -> None:
    """Return at SIGTERM/SIGINT. The server listens from its construction: the main thread waits
    here, in Python, where signal handlers run (Arrow's own ``serve()`` would shut the server down
    on the signal itself, waiting for running calls forever)."""
    requested = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not requested.is_set():
            log.info("signal %d: stopping (grace %.1f s)", signum, grace_s)
        requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not requested.wait(1.0):
        pass


def _exit_unless(finished: threading.Event, seconds: float) -> None:
    """Exit the process unless ``finished`` within ``seconds`` of the stop signal: calls that no
    query control reaches (a write in progress) do not keep it alive. Like a crash, this loses no
    acknowledged write."""
    if finished.wait(seconds):
        return
    log.error("calls still running %.1f s after the stop signal: exiting now", seconds)
    logging.shutdown()
    os._exit(1)


def serve(data_dir: str, host: str = "127.0.0.1", port: int = 8815, *,
          fsync: bool = SERVER_OPTIONS["log.fsync"].default,
          users: UserStore | dict[str, str] | None = None, cluster: Any = None,
          super_users: tuple[str, ...] = (), tls: TlsConfig | None = None,
          token_ttl_ms: int | None = None, max_tokens: int | None = None,
          metrics_port: int | None = None, options: Mapping[str, Any] | None = None) -> None:
    """Run the server until SIGTERM/SIGINT, then shut down cleanly and close the store.
    ``cluster`` (a :class:`flightstore.cluster.member.ClusterConfig`) joins a cluster first;
    ``metrics_port`` serves Prometheus metrics on ``host``; ``options`` are further server options
    (``serve --option``): retention, partitions and the lake."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    status.full_tracebacks_in_log()  # the server holds sys.tracebacklimit at 0 (see .status)
    from flightstore.lake.settings import LakeSettings
    try:
        options = validate_server_options(options or {})
        # Cluster mode tiers nothing yet: each server would have to tier only the buckets it leads.
        lake = None if cluster is not None else LakeSettings.from_options(data_dir, options)
    except FlightstoreError as exc:
        raise SystemExit(f"flightstore: {exc}") from None
    if cluster is not None:
        from flightstore.cluster.store import ClusterStore as store_class
    else:
        store_class = Store
    try:
        store = store_class(data_dir, fsync=fsync, options=options)
    except DataDirectoryInUse as exc:
        raise SystemExit(f"flightstore: {exc}") from None
    try:
        server = FlightSqlServer(store, f"grpc://{host}:{port}", users=users, super_users=super_users,
                                 tls=tls, token_ttl_ms=token_ttl_ms, max_tokens=max_tokens, lake=lake,
                                 retention_interval_s=server_option(
                                     options, "log.retention.check-interval") / 1000)
    except pa.ArrowException as exc:
        store.close()
        raise SystemExit(f"flightstore: cannot listen on {host}:{port} ({exc}); is the port in use?")
    if cluster is not None:
        from flightstore.cluster.member import join
        try:
            server.cluster = join(cluster, store, host, server.port)
            if server.authenticator is not None:  # tokens signed: every server of the cluster takes them
                server.authenticator.secret = server.cluster.secret
        except FlightstoreError as exc:
            server.shutdown()
            store.close()
            raise SystemExit(f"flightstore: {exc}") from None
    scheme = "grpc+tls" if tls is not None else "grpc"
    print(f"flightstore serving {data_dir} at {scheme}://{host}:{server.port}", flush=True)
    if metrics_port is not None:
        try:
            bound = server.metrics.serve(host, metrics_port)
        except OSError as exc:
            server.shutdown()
            store.close()
            raise SystemExit(f"flightstore: cannot serve metrics on {host}:{metrics_port} ({exc})") from None
        print(f"flightstore metrics at http://{host}:{bound}/metrics", flush=True)

    grace_s = server_option(options, "server.shutdown-grace") / 1000
    finished = threading.Event()
    guard = threading.Thread(target=_exit_unless, args=(finished, grace_s + HARD_EXIT_MARGIN_S),
                             name="flightstore-exit-guard", daemon=True)
    try:
        _wait_for_signal(grace_s)
        guard.start()
        server.shutdown(grace_s)  # stops accepting, waits grace_s, then stops running queries
    finally:
        if server.cluster is not None:
            server.cluster.stop()
        if server.tierer is not None:
            server.tierer.stop()
        store.close()
        finished.set()
        if guard.is_alive():
            guard.join()  # no thread of ours may be left running when the interpreter finalizes
        print("flightstore stopped", flush=True)
