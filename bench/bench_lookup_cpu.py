"""Server CPU per point lookup, by path, vs a bare ``pyarrow.flight`` server's CPU per DoGet.

Issue 15's goal: a literal point lookup (``SELECT * FROM t WHERE id = <literal>``, a distinct
literal each time, as BI tools send them) costs flightstore's server at most 3x the CPU a bare
Flight server (``bench/bare_flight.py lookup``: no SQL, no storage) spends serving a canned one-row
result. Both servers run in their own processes; the same client loop drives each (flightstore:
the Python client's ``sql()``, one DoGet of a ticket carrying the statement; bare: DoGet of the
canned row), and CPU is each server process's
user + system time from ``/proc/<pid>/stat`` over the loop, divided by the calls. Wall time does not
enter, so the figure holds on a busy machine.

Issue 23's goals, same method: a prepared lookup through ADBC (``SELECT * FROM t WHERE id = ?``,
what the driver sends per execute: DoPut of the parameters, GetFlightInfo, DoGet) costs the server
at most 2x the bare DoGet; a lookup of the Python client (``table.lookup``: one message each way on
its lookup stream) at most 1.5x. The driver's three calls each cost a Flight server its gRPC and
pyarrow.flight work whatever it answers, so the ADBC figure is also set beside a second floor:
``bench/bare_flight.py adbc``, a bare pyarrow.flight server answering the same three calls, driven
by the same driver, with canned replies.

    python -m bench lookup_cpu
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import flight

from bench.report import Row
from flightstore.server import protocol

ROWS = 100_000
LOOKUPS = 3_000
WARMUP = 300
HERE = Path(__file__).parent
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def lookup_rows(n: int) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": ids, "name": [f"name-{i}" for i in range(n)], "amount": ids * 0.25,
                     "qty": ids % 97})


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


def _start(command: list[str], ready: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, *command], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, cwd=HERE.parent)
    line = process.stdout.readline()
    if ready not in line or "grpc://" not in line:
        process.kill()
        raise RuntimeError(f"{' '.join(command)} did not start: {line!r}")
    return process, "grpc://" + line.split("grpc://", 1)[1].strip()


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def _server_cpu_per_call(pid: int, call, count: int) -> float:
    """Milliseconds of the server's CPU per ``call(i)``, over ``count`` calls after a warm-up."""
    for i in range(WARMUP):
        call(i)
    before = _cpu_s(pid)
    for i in range(count):
        call(WARMUP + i)
    return (_cpu_s(pid) - before) / count * 1000


def run() -> list[Row]:
    import flightstore

    work = Path(tempfile.mkdtemp(prefix="bench-lookup-cpu-"))
    ours, uri = _start(["-m", "flightstore", "serve", "--data-dir", str(work / "data"), "--port", "0",
                        "--no-fsync"], "flightstore serving")
    bare, bare_uri = _start(["-m", "bench.bare_flight", "lookup"], "bare Flight")
    bare_adbc, bare_adbc_uri = _start(["-m", "bench.bare_flight", "adbc"], "bare Flight")
    try:
        with flightstore.connect(uri, timeout=120) as conn:
            conn.sql("CREATE TABLE lookup_t (id BIGINT, name STRING, amount DOUBLE, qty BIGINT, "
                     "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '4')")
            conn.table("lookup_t").upsert(lookup_rows(ROWS))
            order = np.random.default_rng(5).permutation(ROWS)

            def sql_lookup(i: int) -> None:
                key = int(order[i % ROWS])
                got = conn.sql(f"SELECT * FROM lookup_t WHERE id = {key}")
                if got.num_rows != 1 or got.column("id")[0].as_py() != key:
                    raise AssertionError(f"lookup of {key} answered {got.to_pylist()}")
            ours_ms = _server_cpu_per_call(ours.pid, sql_lookup, LOOKUPS)

            def flight_sql_lookup(i: int) -> None:  # what ADBC and JDBC send: two RPCs
                key = int(order[(LOOKUPS + WARMUP + i) % ROWS])
                command = protocol.pack_any(protocol.CommandStatementQuery(
                    query=f"SELECT * FROM lookup_t WHERE id = {key}"))
                info = conn._client.get_flight_info(flight.FlightDescriptor.for_command(command))
                if conn._client.do_get(info.endpoints[0].ticket).read_all().num_rows != 1:
                    raise AssertionError(f"lookup of {key} did not answer one row")
            two_rpc_ms = _server_cpu_per_call(ours.pid, flight_sql_lookup, LOOKUPS)

            table = conn.table("lookup_t")

            def client_lookup(i: int) -> None:  # the Python client: one message each way, one stream
                key = int(order[(2 * (LOOKUPS + WARMUP) + i) % ROWS])
                if table.lookup({"id": [key]}).column("id").to_pylist() != [key]:
                    raise AssertionError(f"lookup of {key} did not answer its row")
            client_ms = _server_cpu_per_call(ours.pid, client_lookup, LOOKUPS)
        adbc_ms = _adbc_cpu_per_lookup(ours.pid, uri, order)
        adbc_floor_ms = _adbc_cpu_per_lookup(bare_adbc.pid, bare_adbc_uri, order, canned=True)
        client = flight.FlightClient(bare_uri)
        ticket = flight.Ticket(b"all")

        def canned(i: int) -> None:
            if client.do_get(ticket).read_all().num_rows != 1:
                raise AssertionError("the bare server did not answer its one row")
        bare_ms = _server_cpu_per_call(bare.pid, canned, LOOKUPS)
        client.close()
    finally:
        _stop(ours)
        _stop(bare)
        _stop(bare_adbc)
        shutil.rmtree(work, ignore_errors=True)
    bare = "bare pyarrow.flight DoGet of a canned row"
    return [Row("server CPU per literal SQL point lookup (Python client sql(): one DoGet)", ours_ms, bare_ms,
                "ms CPU", bare, higher_is_better=False, goal=">=0.33x"),
            Row("  the same over Flight SQL (GetFlightInfo + DoGet, as ADBC sends it)", two_rpc_ms, bare_ms,
                "ms CPU", bare, higher_is_better=False),
            Row("server CPU per ADBC prepared lookup (WHERE id = ?)", adbc_ms, bare_ms, "ms CPU", bare,
                higher_is_better=False, goal=">=0.5x"),
            Row("  the same vs a bare server answering ADBC's 3 calls", adbc_ms, adbc_floor_ms, "ms CPU",
                "bare pyarrow.flight DoPut + GetFlightInfo + DoGet, canned replies, same driver",
                higher_is_better=False),
            Row("  floor: bare server's 3 calls vs a bare DoGet", adbc_floor_ms, bare_ms, "ms CPU", bare,
                higher_is_better=False),
            Row("server CPU per Python-client lookup (lookup stream)", client_ms, bare_ms, "ms CPU", bare,
                higher_is_better=False, goal=">=0.67x")]


def _adbc_cpu_per_lookup(pid: int, uri: str, order: np.ndarray, canned: bool = False) -> float:
    """Server CPU (ms) per prepared lookup through ADBC's Flight SQL driver, one cursor.
    ``canned``: the server is ``bare_flight adbc``, whose answer is always its one canned row."""
    import warnings

    import adbc_driver_flightsql.dbapi as flightsql

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        connection = flightsql.connect(uri)
    cursor = connection.cursor()

    def adbc_lookup(i: int) -> None:
        key = int(order[(3 * (LOOKUPS + WARMUP) + i) % ROWS])
        cursor.execute("SELECT * FROM lookup_t WHERE id = ?", (key,))
        if [row[0] for row in cursor.fetchall()] != [0 if canned else key]:
            raise AssertionError(f"ADBC lookup of {key} did not answer its row")
    try:
        return _server_cpu_per_call(pid, adbc_lookup, LOOKUPS)
    finally:
        cursor.close()
        connection.close()
