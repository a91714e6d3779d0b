"""The write RPC of the Flight SQL server: DoPut. Flight SQL updates, prepared-statement
parameter binding and bulk ingest, and flightstore's own write commands (appends, upserts, deletes
and changelog writes of the Python client and of the cluster's forwarded writes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore import changetype
from flightstore.acl import Operation, Permission, Resource
from flightstore.errors import FlightstoreError, InvalidInput, TableNotFound, Unsupported
from flightstore.schema import TableDescriptor, TablePath
from flightstore.server import protocol, tickets
from flightstore.server.peer import is_peer_call
from flightstore.server.rpc import _rpc
from flightstore.server.session import Session
from flightstore.server.upload import upload_chunks
from flightstore.sql import nodes
from flightstore.sql.ddl import TEMPORARY_REFUSED
from flightstore.sql.dml import parameter_columns
from flightstore.sql.execute import is_query
from flightstore.sql.parse import parse_statement
from flightstore.sql.resolve import resolve_column

__all__ = ["WriteRpcs"]


class WriteRpcs:
    """DoPut and the write commands of :class:`~flightstore.server.service.FlightSqlServer`
    (mixed into it: ``self`` is the server, with its store, executor, authorizer and metrics)."""

    # ---- DoPut --------------------------------------------------------------------------------
    @_rpc
    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise InvalidInput("flightstore answers command descriptors only")
        command_bytes = descriptor.command
        if tickets.is_custom(command_bytes):
            payload = tickets.decode_custom(command_bytes)
            result = (self._peer_put(payload, reader, context) if is_peer_call(payload)
                      else self._custom_put(payload, reader, context))
            writer.write(pa.py_buffer(tickets.encode_custom(result)))
            return
        command = protocol.unpack_any(command_bytes)
        name = command.DESCRIPTOR.name
        if name == "CommandStatementUpdate":
            count = self._run_update(command.query, None, self.session(context))
            writer.write(pa.py_buffer(protocol.DoPutUpdateResult(record_count=count).SerializeToString()))
        elif name == "CommandPreparedStatementQuery":
            prepared = self._prepared_statement(command.prepared_statement_handle)
            prepared.params = [row for chunk in self._chunks(reader, context) for row in _param_rows(chunk)]
            result = protocol.DoPutPreparedStatementResult(
                prepared_statement_handle=command.prepared_statement_handle)
            writer.write(pa.py_buffer(result.SerializeToString()))
        elif name == "CommandPreparedStatementUpdate":
            prepared = self._prepared_statement(command.prepared_statement_handle)
            count, bound = 0, False
            for chunk in self._chunks(reader, context):  # each chunk: one batch of rows
                count += self._run_updates(prepared.sql, _param_rows(chunk), prepared.database)
                bound = True
            if not bound:
                count = self._run_updates(prepared.sql, prepared.params or [None], prepared.database)
            writer.write(pa.py_buffer(protocol.DoPutUpdateResult(record_count=count).SerializeToString()))
        elif name == "CommandStatementIngest":
            count = self._ingest(command, reader, self.session(context).database, context)
            writer.write(pa.py_buffer(protocol.DoPutUpdateResult(record_count=count).SerializeToString()))
        else:
            raise Unsupported(f"{name} is not supported by DoPut")

    def _chunks(self, reader: flight.MetadataRecordBatchReader,
                context: flight.ServerCallContext | None) -> Iterator[pa.Table]:
        """The upload's chunks (:func:`~flightstore.server.upload.upload_chunks`); an upload whose
        call was cancelled does not count as finished."""
        return upload_chunks(reader, self.upload_limits, context.is_cancelled if context is not None else None)

    def _run_update(self, sql: str, params: list | None, session: Session) -> int:
        plan = self._plan(sql, params, session.database)
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
        plans = [self._plan(sql, row, database) for row in rows]
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

        The statement is planned once, with the first row (which validates it and names the
        table's columns and types); parameter ``i`` of every row then becomes the column the
        statement's column list puts it in (:func:`~flightstore.sql.dml.parameter_columns`: the
        list need not follow the table's order), cast and validated by the table as one write,
        instead of each row being planned on its own.
        """
        if len(rows) < 2 or rows[0] is None:
            return None
        try:
            targets = parameter_columns(parse_statement(sql))
        except FlightstoreError:
            return None  # the per-row planner reports it
        if targets is None:
            return None
        first = self._plan(sql, rows[0], database)
        if not isinstance(first, nodes.Insert) or first.data.num_rows != 1:
            return None
        schema = first.data.schema
        names = [resolve_column(schema, name, first.table) for name in targets] if targets \
            else schema.names
        if len(names) != len(rows[0]) or len(set(names)) != len(names):
            return None
        position = {name: i for i, name in enumerate(names)}
        count = len(rows)
        try:
            columns = [pa.array([row[position[field.name]] for row in rows]).cast(field.type)
                       if field.name in position else pa.nulls(count, field.type)  # a log table's unnamed
                       for field in schema]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, IndexError, KeyError):
            return None  # let the per-row planner report the offending value
        return nodes.Insert(table=first.table, data=pa.Table.from_arrays(columns, schema=schema),
                            columns=first.columns)

    def _ingest(self, command: Any, reader: flight.MetadataRecordBatchReader, default_database: str,
                context: flight.ServerCallContext | None = None) -> int:
        """Bulk ingest, applied chunk by chunk as the upload streams in (see :mod:`.upload`);
        a table the ingest created is dropped again if any chunk fails."""
        options = command.table_definition_options
        if command.temporary:  # ADBC adbc_ingest(..., temporary=True)
            raise Unsupported(f"bulk ingest with temporary=True: {TEMPORARY_REFUSED}")
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
            for chunk in self._chunks(reader, context):
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

    def _custom_put(self, payload: dict, reader: flight.MetadataRecordBatchReader,
                    context: flight.ServerCallContext | None = None) -> dict:
        op = payload["op"]
        table = self._visible_table(payload["table"])
        self._authorize_table(Operation.WRITE, table)
        if op not in ("append", "upsert", "delete", "write"):
            raise InvalidInput(f"unknown flightstore write command {op!r}")
        if op == "write" and changetype.CHANGE_TYPE_COLUMN not in reader.schema.names:
            raise InvalidInput("a changelog write needs a _change_type column")
        writer_id, base = payload.get("writer_id"), payload.get("sequence")
        columns = payload.get("columns")
        # Chunk k of a sequenced upload is batch ``base + k`` of its writer: a retried upload is
        # cut the same way, so the chunks applied before a lost acknowledgement are skipped.
        rows, duplicates, chunks, offsets = 0, 0, 0, {}
        for chunk in _at_least_one(self._chunks(reader, context), reader.schema):
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
