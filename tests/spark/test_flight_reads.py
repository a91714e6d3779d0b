"""The connector's reads and writes (``flightstore_spark._flight``) outside Spark: a read or write
task that starts while its server cannot be reached yet (restarting, or a handshake that timed out
on a loaded machine) tries again instead of failing the Spark task."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
from flightstore_spark import _flight
from pyarrow import flight

import flightstore
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.lake.conftest import free_port


def test_a_read_waits_for_a_server_it_cannot_connect_to_yet(tmp_path):
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        store.create_table("t", pa.schema([("a", pa.int64())]), options={"bucket.num": "2"})
        store.table("t").append(pa.table({"a": list(range(1000))}))
    uri = f"grpc://127.0.0.1:{free_port()}"
    with flightstore.connect(uri, timeout=30) as conn:
        # Nobody listens yet: a plain DoGet fails at once, nothing sent ...
        try:
            conn._get({"op": "scan", "table": "t"})
            raise AssertionError("a DoGet to a port nobody listens on answered")
        except flight.FlightUnavailableError as exc:
            assert "failed to connect" in str(exc).lower() or "connection refused" in str(exc).lower()
        started: dict = {}

        def start() -> None:
            started["store"] = Store(data_dir, fsync=False)
            started["server"] = FlightSqlServer(started["store"], uri)
            started["server"].serve()
        # ... the read task starts now and the server a moment later (if the machine stalls past it,
        # the read merely finds the server up): the task answers every row once it can connect.
        later = threading.Timer(1.0, start)
        later.daemon = True
        later.start()
        try:
            batches = list(_flight.read_payload(conn, {"op": "scan", "table": "t", "columns": ["a"]}))
            column = pa.Table.from_batches(batches).column("a")
            assert (len(column), pc.sum(column).as_py()) == (1000, sum(range(1000)))
        finally:
            later.cancel()
            if "server" in started:
                started["server"].shutdown()  # serve() returns: the timer's thread ends
            later.join(timeout=30)
            if "store" in started:
                started["store"].close()


def test_a_streaming_write_waits_for_a_server_it_cannot_connect_to_yet(tmp_path):
    data_dir = tmp_path / "data"
    with Store(data_dir, fsync=False) as store:
        store.create_table("kv", pa.schema([("k", pa.int64()), ("v", pa.int64())]), primary_key=["k"],
                           options={"bucket.num": "2"})
    uri = f"grpc://127.0.0.1:{free_port()}"
    started: dict = {}

    def start() -> None:
        started["store"] = Store(data_dir, fsync=False)
        started["server"] = FlightSqlServer(started["store"], uri)
        started["server"].serve()
    with flightstore.connect(uri, timeout=30) as conn:
        later = threading.Timer(1.0, start)  # the write task starts first, the server a moment later
        later.daemon = True
        later.start()
        try:
            rows = pa.table({"k": list(range(100)), "v": list(range(100))})
            # check_applied: the stream writer's first call is an action, then the DoPut
            result = _flight.put_once(conn, "upsert", "kv", rows, writer_id="w-late", sequence=0,
                                      check_applied=True)
            assert result["rows"] == 100 and not result["duplicate"]
            again = _flight.put_once(conn, "upsert", "kv", rows, writer_id="w-late", sequence=0,
                                     check_applied=True)
            assert again["duplicate"] and started["store"].table("kv").row_count() == 100
        finally:
            later.cancel()
            if "server" in started:
                started["server"].shutdown()
            later.join(timeout=30)
            if "store" in started:
                started["store"].close()
