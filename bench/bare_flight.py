"""The scan peer: a bare ``pyarrow.flight`` server streaming one in-memory table, in its own process.

It runs apart from the benchmark's client, like flightstore's server and PostgreSQL do, so no peer
shares a process (or the GIL, or gRPC's threads) with the client that measures it. The table is
cut into the same messages as our server sends (``rechunk``), then served by ``RecordBatchStream``:
no SQL, no storage, nothing in Python per message.

    python -m bench.bare_flight scan|wide|narrow|lookup|adbc
        -> prints "bare Flight at grpc://127.0.0.1:PORT"

``scan`` is the full-scan table of ``bench_server``; ``wide`` its 100-column table; ``narrow`` the
first 10 columns of ``wide`` (what a pruned scan of it moves); ``lookup`` one row of the lookup
table of ``bench_lookup_cpu`` (a canned point-lookup answer). ``adbc`` serves that row as the
answer of the calls ADBC's Flight SQL driver makes for a prepared lookup
(:class:`CannedPreparedServer`): the floor of a Flight SQL server in Python that must answer
three calls per execute.
"""

from __future__ import annotations

import signal
import sys
import threading

import pyarrow as pa
import pyarrow.flight as flight

from flightstore.server.service import rechunk


class MemoryServer(flight.FlightServerBase):
    def __init__(self, table: pa.Table) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.table = pa.concat_tables(rechunk(iter([table])))

    def get_flight_info(self, context: flight.ServerCallContext,
                        descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        return flight.FlightInfo(self.table.schema, descriptor,
                                 [flight.FlightEndpoint(b"all", [])], self.table.num_rows, -1)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        return flight.RecordBatchStream(self.table)


class CannedPreparedServer(MemoryServer):
    """The calls ADBC's driver makes for ``cursor.execute(sql, params)``, answered from canned
    replies by a bare ``pyarrow.flight`` server (no middleware, no SQL, no storage):
    CreatePreparedStatement (once per statement), then per execute DoPut of the parameters (read,
    acknowledged with the handle), GetFlightInfo (a fixed FlightInfo) and DoGet (the canned row).
    The peer of flightstore's server CPU per ADBC lookup: what three Flight calls cost in
    pyarrow.flight and gRPC alone."""

    HANDLE = b"canned"

    def __init__(self, table: pa.Table) -> None:
        from flightstore.server import protocol
        super().__init__(table)
        self.protocol = protocol
        self.put_result = pa.py_buffer(protocol.DoPutPreparedStatementResult(
            prepared_statement_handle=self.HANDLE).SerializeToString())
        self.prepared = protocol.encode_action_result(protocol.ActionCreatePreparedStatementResult(
            prepared_statement_handle=self.HANDLE, dataset_schema=self.table.schema.serialize().to_pybytes(),
            parameter_schema=pa.schema([pa.field("0", pa.int64())]).serialize().to_pybytes()))

    def do_action(self, context: flight.ServerCallContext, action: flight.Action):
        if action.type == self.protocol.CREATE_PREPARED_STATEMENT:
            return iter([self.prepared])
        if action.type == self.protocol.CLOSE_PREPARED_STATEMENT:
            return iter([])
        raise NotImplementedError(f"the canned server answers no {action.type}")

    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        reader.read_all()
        writer.write(self.put_result)

    # The driver's connect-time GetSqlInfo (outside any measured loop) gets flightstore's answer.
    def get_flight_info(self, context: flight.ServerCallContext,
                        descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        if self.protocol.unpack_any(descriptor.command).DESCRIPTOR.name == "CommandGetSqlInfo":
            from flightstore.server import metadata
            return flight.FlightInfo(metadata.SQL_INFO_SCHEMA, descriptor,
                                     [flight.FlightEndpoint(descriptor.command, [])], -1, -1)
        return super().get_flight_info(context, descriptor)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        if ticket.ticket != b"all":
            from flightstore.server import metadata
            command = self.protocol.unpack_any(ticket.ticket)
            return flight.RecordBatchStream(metadata.sql_info_table(list(command.info)))
        return super().do_get(context, ticket)


def table(name: str) -> pa.Table:
    from bench.bench_server import NARROW_COLUMNS, SCAN_ROWS, WIDE_ROWS, _mixed, _wide

    if name == "scan":
        return _mixed(SCAN_ROWS)
    if name == "wide":
        return _wide(WIDE_ROWS)
    if name == "narrow":
        return _wide(WIDE_ROWS).select(NARROW_COLUMNS)
    if name in ("lookup", "adbc"):
        from bench.bench_lookup_cpu import lookup_rows
        return lookup_rows(1)
    raise SystemExit(f"unknown table {name!r}: scan, wide, narrow, lookup or adbc")


def main() -> None:
    server = (CannedPreparedServer if sys.argv[1] == "adbc" else MemoryServer)(table(sys.argv[1]))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"bare Flight at grpc://127.0.0.1:{server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
