"""The DoAction handlers of the Flight SQL server: Flight SQL's actions (prepared statements,
CancelFlightInfo, session options) and flightstore's own ``flightstore.*`` actions (offsets,
locations, writers, snapshots, lake status, the cluster's view...), listed by ListActions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore.acl import CLUSTER, Operation, Permission
from flightstore.errors import FlightstoreError, InvalidInput, Unsupported
from flightstore.expressions import from_json
from flightstore.server import protocol, tickets
from flightstore.server.rpc import _peer, _rpc
from flightstore.server.session import apply_options, option_values
from flightstore.server.writes import _probe_value
from flightstore.sql.execute import StoreCatalog, is_query
from flightstore.sql.plan import is_union, parameter_schema
from flightstore.sql.privileges import required_permissions
from flightstore.sql.resolve import resolve_database

__all__ = ["ActionRpcs", "PreparedStatement"]


class ActionRpcs:
    """DoAction and ListActions of :class:`~flightstore.server.service.FlightSqlServer`
    (mixed into it: ``self`` is the server, with its store, executor, authorizer and metrics)."""

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
            # ``lake_only``: a reader of the lake snapshot alone (a Spark backfill), which also
            # takes primary-key tables and applies their position delete files itself.
            lake_only = bool(payload.get("lake_only")) and bool(table.descriptor.option("table.datalake.enabled"))
            if not is_union(table.descriptor) and not lake_only:
                return tickets.encode_custom({"op": "lake-split", "union": False})
            from flightstore.lake.union import plan_split
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            planned = plan_split(self.executor.lake, table, filter, payload.get("snapshot_id"),
                                 with_deletes=lake_only)
            return tickets.encode_custom({"op": "lake-split", "union": is_union(table.descriptor), **planned})
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


@dataclass
class PreparedStatement:
    sql: str
    database: str
    dataset_schema: pa.Schema | None
    parameter_schema: pa.Schema
    params: list[list[Any]] = field(default_factory=list)


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

def _bucket_ids(table: Any, filter: Any) -> list[int]:
    """The buckets a scan with ``filter`` must read: of a partitioned table, those of the
    partitions the filter cannot rule out (table-wide numbers)."""
    if table.descriptor.is_partitioned:
        return table.bucket_ids(filter=filter)
    return table.bucket_ids()
