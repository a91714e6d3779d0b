"""The scan peer: a bare ``pyarrow.flight`` server streaming one in-memory table, in its own process.

It runs apart from the benchmark's client, like flightstore's server and PostgreSQL do, so no peer
shares a process (or the GIL, or gRPC's threads) with the client that measures it. The table is
cut into the same messages as our server sends (``rechunk``), then served by ``RecordBatchStream``:
no SQL, no storage, nothing in Python per message.

    python -m bench.bare_flight scan|wide|narrow|lookup
        -> prints "bare Flight at grpc://127.0.0.1:PORT"

``scan`` is the full-scan table of ``bench_server``; ``wide`` its 100-column table; ``narrow`` the
first 10 columns of ``wide`` (what a pruned scan of it moves); ``lookup`` one row of the lookup
table of ``bench_lookup_cpu`` (a canned point-lookup answer).
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


def table(name: str) -> pa.Table:
    from bench.bench_server import NARROW_COLUMNS, SCAN_ROWS, WIDE_ROWS, _mixed, _wide

    if name == "scan":
        return _mixed(SCAN_ROWS)
    if name == "wide":
        return _wide(WIDE_ROWS)
    if name == "narrow":
        return _wide(WIDE_ROWS).select(NARROW_COLUMNS)
    if name == "lookup":
        from bench.bench_lookup_cpu import lookup_rows
        return lookup_rows(1)
    raise SystemExit(f"unknown table {name!r}: scan, wide, narrow or lookup")


def main() -> None:
    server = MemoryServer(table(sys.argv[1]))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"bare Flight at grpc://127.0.0.1:{server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
