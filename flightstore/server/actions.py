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
from flightstore.errors import FlightstoreError, InvalidInput, Unavailable, Unsupported
from flightstore.expressions import from_json
from flightstore.server import protocol, tickets
from flightstore.server.peer import is_peer_call
from flightstore.server.rpc import _CALLER, _peer, _rpc
from flightstore.server.session import apply_options, option_values
from flightstore.server.writes import _probe_value
from flightstore.sql.execute import is_query
from flightstore.sql.plan import is_union, parameter_schema
from flightstore.sql.privileges import plan_resources, required_permissions
from flightstore.sql.resolve import resolve_database
from flightstore.table.upkeep import TASKS, merged

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
            payload = tickets.decode_custom(body)
            if is_peer_call(payload):  # a part of a call another server of the cluster split by leader
                return iter([self._peer_action(kind, payload, context)])
            return iter([self._custom_action(kind, payload)])
        request = protocol.decode_action(kind, body)
        if kind == protocol.CREATE_PREPARED_STATEMENT:
            result = self._prepare(request.query, self.session(context).database)
        elif kind == protocol.CLOSE_PREPARED_STATEMENT:
            with self._lock:
                prepared = self._prepared.get(request.prepared_statement_handle)
                if prepared is not None and prepared.owner == _CALLER.get():  # another user's: unknown
                    del self._prepared[request.prepared_statement_handle]
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
            catalog = self._catalog(session.database)  # as USE: a database the caller does not see is absent
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
                ("flightstore.expire-writers", "forget a table's writers idle past table.writer-id.expiration"),
                ("flightstore.describe", "a table's descriptor, incarnation id and offsets (tiering jobs)"),
                ("flightstore.user", "add or remove a user (the users file, or a cluster's users)")]

    def _prepare(self, sql: str, database: str) -> Any:
        key = (sql, database, self.store.catalog.version)
        schemas = self._prepare_cache.get(key)
        if schemas is not None and not self.authz.sees(_CALLER.get(), schemas[3]):
            schemas = None  # names what this caller does not see: prepare it in the caller's view
        if schemas is None:  # ADBC prepares again at every execute: plan each text once
            params_schema = parameter_schema(sql, self._catalog(database)) \
                if "?" in sql or "$" in sql else pa.schema([])  # no placeholder: skip a parse
            probe = [_probe_value(f.type) for f in params_schema] if len(params_schema) else None
            plan = self._plan(sql, probe, database)
            permissions = required_permissions(plan)
            self._authorize(permissions)  # before the schema (it describes the tables)
            dataset_schema = self.executor.output_schema(plan) if is_query(plan) else None
            self._prepare_cache.put(key, (dataset_schema, params_schema, permissions, plan_resources(plan)))
        else:
            dataset_schema, params_schema, permissions, _ = schemas
            self._authorize(permissions)
        handle = uuid.uuid4().hex.encode()
        with self._lock:
            self._prepared[handle] = PreparedStatement(sql, database, dataset_schema, params_schema,
                                                       owner=_CALLER.get())
        return protocol.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle,
            dataset_schema=dataset_schema.serialize().to_pybytes() if dataset_schema is not None else b"",
            parameter_schema=params_schema.serialize().to_pybytes())

    def _prepared_statement(self, handle: bytes) -> PreparedStatement:
        with self._lock:
            prepared = self._prepared.get(handle)
        if prepared is None or prepared.owner != _CALLER.get():  # bound to its user, as tickets are
            raise InvalidInput("unknown or closed prepared statement handle")
        return prepared

    def _custom_action(self, kind: str, payload: dict) -> bytes:
        if kind == "flightstore.offsets":
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)  # as Fluss's LIST_OFFSETS
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
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            return tickets.encode_custom({"op": "buckets", "buckets": _bucket_ids(table, filter)})
        if kind == "flightstore.lake-split":
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.READ, table)
            # ``lake_only``: a reader of the lake snapshot alone (a Spark backfill), which also
            # takes primary-key tables and applies their position delete files itself.
            lake_only = bool(payload.get("lake_only")) and bool(table.descriptor.option("table.datalake.enabled"))
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            if not is_union(table.descriptor) and not lake_only:
                # A reader's plan in this one round trip: the buckets a scan with the filter reads
                # and the rows each holds in its log (an upper bound of a primary-key table's
                # rows), by which a reader sizes its partitions.
                buckets = _bucket_ids(table, filter)
                start, end = table.start_offsets(), table.end_offsets()
                return tickets.encode_custom({"op": "lake-split", "union": False, "buckets": buckets,
                                              "rows": {str(b): end.get(b, 0) - start.get(b, 0) for b in buckets}})
            from flightstore.lake.union import plan_split
            planned = plan_split(self.executor.lake, table, filter, payload.get("snapshot_id"),
                                 with_deletes=lake_only)
            return tickets.encode_custom({"op": "lake-split", "union": is_union(table.descriptor), **planned})
        # Upkeep (each task needs what TASKS says): on one server here; in a cluster on every leader of
        # the table over the buckets it leads, and the answer says what each server did ("servers").
        if kind == "flightstore.undo":
            done = self._upkeep(payload, "undo", writer_id=payload["writer_id"],
                                after_sequence=int(payload["after_sequence"]))
            return tickets.encode_custom({"op": "undone", "rows": merged("undo", done), **_servers(done)})
        if kind == "flightstore.release":
            done = self._upkeep(payload, "release", writer_id=payload["writer_id"])
            return tickets.encode_custom({"op": "released", **_servers(done)})
        if kind == "flightstore.snapshot":
            done = self._upkeep(payload, "snapshot", force=bool(payload.get("force", False)))
            self._upkeep(payload, "retention")  # the new snapshot may let the changelog shrink
            return tickets.encode_custom({"op": "snapshot", "snapshots": merged("snapshot", done), **_servers(done)})
        if kind == "flightstore.usage":
            done = self._upkeep(payload, "usage")
            table = self._visible_table(payload["table"])
            start, end = table.start_offsets(), table.end_offsets()
            return tickets.encode_custom({"op": "usage", "bytes": merged("usage", done),
                                          "start_offsets": {str(k): v for k, v in start.items()},
                                          "end_offsets": {str(k): v for k, v in end.items()}, **_servers(done)})
        if kind == "flightstore.expire-writers":
            done = self._upkeep(payload, "expire_writers")
            return tickets.encode_custom({"op": "expired", "writers": merged("expire_writers", done),
                                          **_servers(done)})
        if kind == "flightstore.describe":
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            start, end = table.start_offsets(), table.end_offsets()
            return tickets.encode_custom({"op": "describe", "descriptor": table.descriptor.to_json(),
                                          "table_id": table.table_id,
                                          "start_offsets": {str(k): v for k, v in start.items()},
                                          "end_offsets": {str(k): v for k, v in end.items()}})
        if kind == "flightstore.writer":
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.WRITE, table)  # as Fluss's INIT_WRITER
            return tickets.encode_custom({"op": "writer",
                                          "sequence": table.writer_sequence(payload["writer_id"])})
        if kind == "flightstore.lake-status":
            if payload.get("table"):
                self._authorize_table(Operation.DESCRIBE, self._visible_table(payload["table"]))
            else:
                self._authorize([Permission(Operation.DESCRIBE, CLUSTER)])
            if self.tierer is None:
                raise Unsupported("this server has no lake (a cluster member started without the "
                                  "datalake.iceberg.uri and datalake.iceberg.warehouse options)")
            statuses = ([self.tierer.status(payload["table"])] if payload.get("table")
                        else self.tierer.statuses())
            return tickets.encode_custom({"op": "lake-status", "tables": [s.to_dict() for s in statuses]})
        if kind == "flightstore.locations":
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            descriptor = table.descriptor
            leaders = []
            if table.distributed:
                for bucket in range(descriptor.num_buckets):
                    try:
                        leaders.append(table.leader_uri(bucket))
                    except Unavailable:
                        leaders.append(None)
            return tickets.encode_custom({
                "op": "locations", "num_buckets": descriptor.num_buckets,
                "bucket_key": list(descriptor.bucket_key), "partitioned": descriptor.is_partitioned,
                "primary_key": list(descriptor.primary_key), "leaders": leaders})
        if kind == "flightstore.user":
            return self._user_action(payload)
        if kind == "flightstore.decommission":
            self._authorize([Permission(Operation.ALTER, CLUSTER)])
            if self.cluster is None:
                raise Unsupported("this server is not part of a cluster (serve it with --zookeeper)")
            self.cluster.decommission(int(payload["server_id"]))
            return tickets.encode_custom({"op": "decommission", "server_id": int(payload["server_id"])})
        if kind == "flightstore.cluster":
            self._authorize([Permission(Operation.DESCRIBE, CLUSTER)])
            if self.cluster is None:
                raise Unsupported("this server is not part of a cluster (serve it with --zookeeper)")
            return tickets.encode_custom({"op": "cluster", **self.cluster.describe(payload.get("table")),
                                          "partial_aggregates": int(self.metrics.partials._value.get()),
                                          "served": self.metrics.served()})
        raise Unsupported(f"action {kind} is not supported by flightstore")


    def _upkeep(self, payload: dict, task: str, **args: Any) -> dict:
        """Upkeep ``task`` of the table ``payload`` names, for a caller allowed what it needs."""
        table = self._visible_table(payload["table"])
        self._authorize_table(TASKS[task], table)
        return table.run_upkeep(task, **args)

    def _user_action(self, payload: dict) -> bytes:
        """Add a user (or set its password: ``replace``) or remove one, for a caller allowed ALTER
        on the cluster: in the users file of a single server, or the cluster's users in
        ZooKeeper (returns once every live server applied it)."""
        self._authorize([Permission(Operation.ALTER, CLUSTER)])
        if self.authenticator is None:
            raise Unsupported("this server has no users (start it with --users-file, or in a cluster)")
        action, name = payload.get("action"), payload.get("name")
        if not isinstance(name, str):
            raise InvalidInput("flightstore.user names the user under 'name'")
        users = self.authenticator.users
        if action == "add":
            password = payload.get("password")
            if not isinstance(password, str):
                raise InvalidInput("flightstore.user add needs the password under 'password'")
            users.add(name, password, replace=bool(payload.get("replace")))
        elif action == "remove":
            users.remove(name)
        else:
            raise InvalidInput(f"unknown flightstore.user action {action!r}: use add or remove")
        return tickets.encode_custom({"op": "user", "action": action, "name": name})


@dataclass
class PreparedStatement:
    sql: str
    database: str
    dataset_schema: pa.Schema | None
    parameter_schema: pa.Schema
    params: list[list[Any]] = field(default_factory=list)
    owner: str | None = None  # the user who prepared it: no one else may bind, run or close it


def _servers(done: dict) -> dict:
    """``{"servers": {id: answer}}`` when a cluster's leaders did the work (nothing on one server)."""
    by_server = {str(k): v for k, v in done.items() if k is not None}
    return {"servers": by_server} if by_server else {}


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
    """The buckets a scan with ``filter`` (unbound, or None) must read: of a partitioned table,
    those of the partitions the filter cannot rule out (table-wide numbers). A filter that does
    not bind to the table's schema is refused, whatever the table."""
    if filter is not None:
        filter = filter.bind(table.schema)
    if table.descriptor.is_partitioned:
        return table.bucket_ids(filter=filter)
    return table.bucket_ids()
