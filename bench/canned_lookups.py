"""A lookup-stream server with nothing behind its lookups: the floor of a single-key lookup over
the lookup stream (:mod:`flightstore.server.exchange`).

It is flightstore's own server (same pyarrow.flight transport, same OPEN handling, so the real
Python client connects and opens its handle as usual), except that each LOOKUP is answered by the
smallest loop pyarrow.flight allows: read the message, unpack its header, write a ready ROWS reply
(the first row of the table). No table, no RocksDB, no coalescing, no metrics. Whatever
lookups/s and server CPU per lookup the load measures against it belong to the Python client, the
transport and pyarrow.flight's thread-per-stream DoExchange: the floor under any lookup server
written in Python on this machine.

    python -m bench.canned_lookups DATA_DIR   -> prints "canned lookups at grpc://127.0.0.1:PORT"

``python -m bench.canned_lookups DATA_DIR arrow N`` makes each answer also run N one-element
pyarrow compute calls (each releases and takes back the GIL, as every pyarrow call of a real
lookup does), ``python N`` N microseconds of Python holding the GIL: ``bench/gil_handoffs.py``
compares what each costs the server under the benchmark's load.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import flight

from flightstore.server.exchange import ServedLookupStream
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from flightstore.wire import lookups as wire


def extra_work(kind: str, amount: int):
    """The work added to each answer (see the module doc): a function, or None for none."""
    if kind == "arrow":
        one = pa.array([1], pa.int64())

        def calls() -> None:
            for _ in range(amount):
                pc.add(one, 1)
        return calls
    if kind == "python":
        def python() -> None:
            end = time.thread_time() + amount / 1e6
            while time.thread_time() < end:
                pass
        return python
    return None


class CannedLookupServer(FlightSqlServer):
    work = None  # extra work per answer (extra_work)

    def _lookup_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                         reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        stream = ServedLookupStream(self, writer)
        body: bytes | None = None
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            kind, handle_id, request_id, _, message = wire.decode_request(chunk.app_metadata)
            if kind == wire.OPEN:
                reply = stream._open(handle_id, request_id, message)
                handle = stream.handles[handle_id]
                row = self.store.table(handle.path).scan_table(list(handle.columns), limit=1)
                if row.num_rows != 1:
                    raise RuntimeError(f"canned lookups: table {handle.path} holds no row to answer with")
                body = bytes(wire.encode_batch(row.cast(handle.row_schema).to_batches()[0]))
            else:
                if self.work is not None:
                    self.work()
                reply = wire.encode_reply(wire.ROWS, handle_id, request_id, body)
            writer.write_metadata(pa.py_buffer(reply))


def main() -> None:
    with Store(sys.argv[1]) as store:
        server: Any = CannedLookupServer(store, "grpc://127.0.0.1:0")
        if len(sys.argv) > 3:
            server.work = extra_work(sys.argv[2], int(sys.argv[3]))
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        print(f"canned lookups at grpc://127.0.0.1:{server.port}", flush=True)
        server.serve()


if __name__ == "__main__":
    main()
