"""A Flight SQL server with nothing behind it: the floor of a parameterized lookup through ADBC.

It is flightstore's own server (same pyarrow.flight transport, same protocol code, same metadata
answers for the driver's connect-time calls), except that the prepared lookup sequence the ADBC
driver sends (CreatePreparedStatement once, then per execute DoPut of the parameters,
GetFlightInfo, DoGet) is answered with canned replies: a fixed handle, a fixed FlightInfo and a
ready one-row table of the benchmark's lookup schema. No SQL, no RocksDB. Whatever latency the
benchmark measures against it belongs to the client driver and the Flight/gRPC transport, which is
the floor under any Python Flight SQL server on this machine.

    python -m bench.canned_flightsql ROWS   -> prints "canned Flight SQL at grpc://127.0.0.1:PORT"
"""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightstore.server import protocol
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store

HANDLE = b"canned"
TICKET = b"canned-answer"
PARAMETERS = pa.schema([pa.field("0", pa.int64())])


class CannedLookupServer(FlightSqlServer):
    def __init__(self, store: Store, answer: pa.Table) -> None:
        super().__init__(store, "grpc://127.0.0.1:0")
        self.answer = answer

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Any:
        if action.type == protocol.CREATE_PREPARED_STATEMENT:
            result = protocol.ActionCreatePreparedStatementResult(
                prepared_statement_handle=HANDLE,
                dataset_schema=self.answer.schema.serialize().to_pybytes(),
                parameter_schema=PARAMETERS.serialize().to_pybytes())
            return iter([protocol.encode_action_result(result)])
        if action.type == protocol.CLOSE_PREPARED_STATEMENT:
            return iter([])
        return super().do_action(context, action)

    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        reader.read_all()
        result = protocol.DoPutPreparedStatementResult(prepared_statement_handle=HANDLE)
        writer.write(pa.py_buffer(result.SerializeToString()))

    def get_flight_info(self, context: flight.ServerCallContext,
                        descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        if protocol.unpack_any(descriptor.command).DESCRIPTOR.name == "CommandPreparedStatementQuery":
            return flight.FlightInfo(self.answer.schema, descriptor,
                                     [flight.FlightEndpoint(TICKET, [])], self.answer.num_rows, -1)
        return super().get_flight_info(context, descriptor)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        if ticket.ticket == TICKET:
            return flight.RecordBatchStream(self.answer)
        return super().do_get(context, ticket)


def main() -> None:
    from bench.bench_server import _mixed

    answer = _mixed(int(sys.argv[1]), seed=3).slice(0, 1)
    with tempfile.TemporaryDirectory(prefix="canned-flightsql-") as root, Store(root) as store:
        server = CannedLookupServer(store, answer)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        print(f"canned Flight SQL at grpc://127.0.0.1:{server.port}", flush=True)
        server.serve()


if __name__ == "__main__":
    main()
