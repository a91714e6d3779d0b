"""The read RPCs of the Flight SQL server: GetFlightInfo, DoGet and the metadata commands.

GetFlightInfo plans a query and answers its exact schema with one endpoint that streams every
bucket (one endpoint per bucket when the session sets ``flightstore.per-bucket-endpoints``, as the
Spark connector does); statements (DDL, writes) arriving on the query path run once and answer a
``rows_affected`` row. DoGet re-plans from the stateless ticket and streams Arrow batches kept well
below gRPC's message limit (:mod:`.messages`). flightstore's own read commands (the Python client's
lookups, scans, subscriptions, changelogs and the cluster's forwarded reads) are served here too.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore import changetype
from flightstore.acl import Operation, Permission
from flightstore.errors import FlightstoreError, InvalidInput, NotFound, Unavailable, Unsupported
from flightstore.expressions import from_json
from flightstore.schema import TableDescriptor, TablePath
from flightstore.server import metadata, protocol, tickets
from flightstore.server.messages import _IPC_OPTIONS, _messages, rechunk
from flightstore.server.peer import is_peer_call
from flightstore.server.rpc import _CALLER, CallStop, _guarded, _in_call_context, _rpc
from flightstore.server.session import Session
from flightstore.sql import nodes
from flightstore.sql.execute import ROWS_AFFECTED_SCHEMA, is_query
from flightstore.sql.plan import is_union
from flightstore.sql.privileges import plan_resources, plan_tables, table_resource

__all__ = ["ReadRpcs"]

RESULT_TTL_S = 600


class ReadRpcs:
    """GetFlightInfo, DoGet and the read commands of :class:`~flightstore.server.service.FlightSqlServer`
    (mixed into it: ``self`` is the server, with its store, executor, authorizer and metrics)."""

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
        point = self._point_answer(sql, params, database)
        if point is not None:  # answered now, as below, without planning
            ticket = tickets.result_ticket(point, self._ticket_key, _CALLER.get()) or self._keep_result(point)
            return flight.FlightInfo(point.schema, descriptor, [flight.FlightEndpoint(ticket, [])],
                                     point.num_rows, -1)
        plan = self._plan(sql, params, database)
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
            ticket = tickets.result_ticket(result, self._ticket_key, _CALLER.get()) or self._keep_result(result)
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
        uri = self.store.table(plan.table).leader_uri(partition)
        return [uri if uri is not None else self.cluster.config.advertised_uri]

    def _point_answer(self, sql: str, params: list | None, database: str) -> pa.Table | None:
        """The answer of a point lookup by an integer primary key whose statement shape was
        planned before (``WHERE id = 42``, or ``WHERE id = ?`` with its parameters), read by its
        key without planning (:meth:`~flightstore.sql.execute.Executor.point_key`), authorized as
        its plan; None for anything else (the caller plans the statement)."""
        found = self.executor.point_key(sql, params, database)
        if found is None:
            return None
        template, values = found
        principal = _CALLER.get()
        if not self.authz.is_super(principal) and not self.authz.sees(principal, plan_resources(template)):
            return None  # what the caller may not see: planned in its view, as any statement
        self._authorize(template)
        answer = self.executor.point_row(template, values)
        if answer is None:
            return None
        self.metrics.sent_rows(str(template.table), 1 if answer[1] else 0, answer[1])
        return answer[0]

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
        if tickets.is_result(data):  # bound to the user it was issued to
            return flight.RecordBatchStream(_messages(tickets.decode_result(data, self._ticket_key, _CALLER.get()),
                                                      self.max_batch_rows),
                                            _IPC_OPTIONS)
        heartbeats = False  # a subscription's empty batches are heartbeats: they are sent
        if tickets.is_custom(data):
            payload = tickets.decode_custom(data)
            heartbeats = payload.get("op") == "subscribe"
            schema, batches = self._custom_get(payload, context)
        else:
            try:
                command = protocol.unpack_any(data)
            except (Unsupported, InvalidInput):  # garbage: one answer for every unknown ticket
                raise InvalidInput(tickets.UNKNOWN_TICKET) from None
            if command.DESCRIPTOR.name == "TicketStatementQuery":
                payload = tickets.decode_query_handle(command.statement_handle)
                plan = self._plan(payload["sql"], tickets.decode_params(payload.get("params")),
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
                batches = self._rechecked(plan, self.executor.execute(plan, payload.get("partition"), schema,
                                                                      control))
                batches = self.queries.stream(payload.get("query"), control,
                                              self.metrics.metered(_result_label(plan), batches),
                                              user=_CALLER.get(), sql=payload["sql"])
            else:
                table = self._metadata_table(command, self.session(context))
                schema, batches = table.schema, table
        if isinstance(batches, pa.Table):  # materialized (lookups, counts, metadata): C++ streams it
            return flight.RecordBatchStream(_messages(batches, self.max_batch_rows), _IPC_OPTIONS)
        return flight.GeneratorStream(schema, _in_call_context(_guarded(rechunk(batches, self.max_batch_rows,
                                                                                heartbeats),
                                                                        self._hidden_paths)))

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
            offsets = self._visible_table(payload["table"]).resolve_start(payload.get("start", "earliest"))
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
            if entry is None or entry[2] != _CALLER.get():  # absent, or bound to another user
                raise InvalidInput("this result expired or was already read")
            return entry[1].schema, entry[1]
        if is_peer_call(payload):  # a part of a call another server of the cluster split by leader
            return self._peer_get(payload, context)
        table = self._visible_table(payload["table"])
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
        if op in ("lookup", "prefix_lookup"):
            if payload.get("keys_ipc") is not None:
                keys = tickets.decode_table(payload["keys_ipc"])
            elif isinstance(payload.get("keys"), dict):
                keys = pa.table(payload["keys"])
            else:
                raise InvalidInput(f"a {op} needs 'keys' (column name -> list of values) or 'keys_ipc'")
            schema = table.projection(columns or table.schema.names)
            if plan_only:
                return schema, iter(())
            found = table.lookup(keys, columns) if op == "lookup" else \
                table.prefix_lookup(keys, columns, payload.get("limit"))
            self.metrics.sent(str(table.path), found)
            return schema, found
        if op == "scan":
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            schema = table.projection(columns or table.schema.names)
            buckets = payload.get("buckets")
            if buckets is not None and not set(buckets) <= set(table.bucket_ids()):
                raise InvalidInput(f"table {table.path} has no bucket "
                                   f"{min(set(buckets) - set(table.bucket_ids()))}")
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
            # Authorized once, but it may run for hours: the token and the grant are checked
            # again at every batch and every idle poll (heartbeats included).
            recheck = self._stream_recheck([Permission(Operation.READ, table_resource(table.path))])
            stop = threading.Event() if context is None else CallStop(context, self._stop, recheck)
            heartbeat_s = payload.get("heartbeat_s", 1.0)
            if heartbeat_s is None or heartbeat_s <= 0:
                raise InvalidInput(f"a subscription's heartbeat_s must be a positive number of seconds, "
                                   f"not {heartbeat_s!r}")
            if not plan_only:
                self.metrics.mark_subscription(context)
            rows = _unless_shut_down(table.subscribe(payload.get("start", "earliest"), columns=columns, stop=stop,
                                                     heartbeat_s=heartbeat_s, until=payload.get("until")),
                                     self._stop)
            if recheck is not None:
                rows = recheck.guard(rows)
            if isinstance(stop, CallStop):
                rows = stop.guard(rows)  # after it, the stop flag never asks the call's context again
            return schema, self.metrics.metered(str(table.path), rows)
        if op == "changelog":
            full = changetype.changelog_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            if plan_only:
                return schema, iter(())
            bucket = int(payload["bucket"])
            if bucket not in table.bucket_ids():
                raise InvalidInput(f"table {table.path} has no bucket {bucket}")
            return schema, self.metrics.metered(str(table.path), table.read_changelog(
                bucket, payload.get("from_offset"), columns=columns, to_offset=payload.get("to_offset"),
                max_rows=payload.get("max_rows")))
        if op == "snapshot":
            full = changetype.snapshot_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            if plan_only:
                return schema, iter(())
            return schema, self.metrics.metered(str(table.path), table.read_snapshot(
                int(payload["bucket"]), int(payload["at"]), columns))
        if op == "count":
            schema = pa.schema([pa.field("count", pa.int64(), nullable=False)])
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
        point = self._point_answer(sql, None, session.database)
        if point is not None:
            return point.schema, point
        plan = self._plan(sql, None, session.database)
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
        batches = self._rechecked(plan, self.executor.execute(plan, None, schema, control))
        return schema, self.queries.stream(None, control, self.metrics.metered(_result_label(plan), batches),
                                           user=_CALLER.get(), sql=sql)

    def _rechecked(self, plan: nodes.PlanNode, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """A query's stream, ending (UNAUTHENTICATED / PERMISSION_DENIED) when its caller's token
        or grants go while it runs."""
        recheck = self._stream_recheck(plan)
        return batches if recheck is None else recheck.guard(batches)


def _unless_shut_down(batches: Iterator[pa.RecordBatch], server_stop: threading.Event) -> Iterator[pa.RecordBatch]:
    """A subscription's batches; when the server's shutdown ended it, an UNAVAILABLE error rather
    than a normal end of stream, so a consumer does not take a stopped server for the end of the
    data (a subscription with ``until`` that reached its offsets before the shutdown ends normally)."""
    yield from batches
    if server_stop.is_set():
        raise Unavailable("the server is shutting down: the subscription ended; subscribe again from "
                          "the offsets you have read, once the server is back (or on another server)")


def _result_label(plan: nodes.PlanNode) -> str:
    """The ``table`` label of a query's rows in the metrics: the tables it reads."""
    if isinstance(plan, nodes.PointLookup):  # the lookup path: one table
        return str(plan.table)
    return ",".join(str(path) for path in plan_tables(plan))
