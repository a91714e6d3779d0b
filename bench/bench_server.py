"""Flight SQL server speed, each figure against a peer measured in the same run.

1. DoGet full-scan throughput of a 2M-row x 10-column log table (``SELECT * FROM t``, every endpoint
   read with ``pyarrow.flight``) vs a bare ``pyarrow.flight`` server streaming the same ``pa.Table``
   from memory with ``RecordBatchStream`` (goal >= 0.7x).
2. Over Flight, a 10-of-100 column scan vs the full 100-column scan of 300k float64 rows (goal >= 8x).
3. Single primary-key lookup through ADBC (``SELECT * FROM t WHERE id = ?``, 2,000 random keys) p50
   and p99 (and p50 of the same lookups sent as literal SQL, as BI tools do) vs the same lookup
   through ``adbc-driver-postgresql`` on a local PostgreSQL started by
   ``bench/setup_postgres.sh`` (goal: our p50 <= 2x PostgreSQL's). Skipped, with the reason printed,
   when PostgreSQL or its driver is unavailable. Two more rows explain the figure: the same ADBC
   driver against ``bench/canned_flightsql.py``, a Flight SQL server answering from canned replies
   (the floor of driver + Flight transport: our p50 vs it is the cost of our server), and the
   client driver's own CPU time per lookup, Flight SQL vs PostgreSQL.
4. ``COUNT(*)`` through ADBC on a 10M-row log table vs a 10k-row one (goal within 2x: no scan).

Tables are built with the embedded Store (large appends) before the server opens the same data dir.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from bench.report import Row, best_interleaved
from flightstore.server import protocol
from flightstore.server.service import rechunk
from flightstore.store import Store

SCAN_ROWS = 2_000_000
WIDE_ROWS = 300_000
WIDE_COLUMNS = 100
NARROW_COLUMNS = [f"c{i}" for i in range(10)]  # the pruned scan's 10 of 100 columns
SCAN_ROUNDS = 7  # interleaved rounds of the scan rows; each figure is its best round
LOOKUP_ROWS = 100_000
LOOKUPS = 2_000
BIG_COUNT_ROWS = 10_000_000
SMALL_COUNT_ROWS = 10_000
COUNT_QUERIES = 200
APPEND_BATCH = 500_000
HERE = Path(__file__).parent


# ---- data --------------------------------------------------------------------------------------
def _mixed(n: int, seed: int = 0) -> pa.Table:
    """10 columns of mixed types (ints, floats, strings, bool, timestamp)."""
    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
    return pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "user_id": pa.array(rng.integers(0, 1_000_000, n), pa.int64()),
        "amount": pa.array(rng.random(n) * 100),
        "score": pa.array(rng.random(n).astype(np.float32)),
        "qty": pa.array(rng.integers(0, 1000, n).astype(np.int32)),
        "status": pa.array(words[rng.integers(0, 8, n)]),
        "country": pa.array(np.array(["fr", "de", "us", "jp", "br"])[rng.integers(0, 5, n)]),
        "flag": pa.array(rng.random(n) < 0.5),
        "ts": pa.array(rng.integers(1_600_000_000_000, 1_700_000_000_000, n), pa.int64()).cast(pa.timestamp("ms")),
        "note": pa.array(np.char.add("n", rng.integers(0, 100_000, n).astype(str))),
    })


def _wide(n: int) -> pa.Table:
    rng = np.random.default_rng(2)
    return pa.table({f"c{i}": pa.array(rng.random(n)) for i in range(WIDE_COLUMNS)})


def _append(table, data: pa.Table) -> None:
    for start in range(0, data.num_rows, APPEND_BATCH):
        table.append(data.slice(start, APPEND_BATCH))


def _build(data_dir: Path, scan: pa.Table, wide: pa.Table) -> None:
    with Store(data_dir) as store:
        _append(store.create_table("scan_t", scan.schema), scan)
        _append(store.create_table("wide_t", wide.schema), wide)
        lookup = _mixed(LOOKUP_ROWS, seed=3)
        store.create_table("lookup_t", lookup.schema, primary_key=["id"]).upsert(lookup)
        small = pa.table({"id": pa.array(np.arange(SMALL_COUNT_ROWS), pa.int64()),
                          "v": pa.array(np.zeros(SMALL_COUNT_ROWS))})
        _append(store.create_table("count_small", small.schema), small)
        big_schema = small.schema
        big = store.create_table("count_big", big_schema)
        chunk = pa.table({"id": pa.array(np.arange(1_000_000), pa.int64()), "v": pa.array(np.ones(1_000_000))})
        for _ in range(BIG_COUNT_ROWS // chunk.num_rows):
            big.append(chunk)


# ---- servers -----------------------------------------------------------------------------------
def _sql_read(client: flight.FlightClient, sql: str) -> int:
    """Rows read for ``sql`` through Flight SQL CommandStatementQuery, every endpoint."""
    command = protocol.pack_any(protocol.message_class("CommandStatementQuery")(query=sql))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
    rows = 0
    for endpoint in info.endpoints:
        for chunk in client.do_get(endpoint.ticket):
            rows += chunk.data.num_rows
    return rows


def _plain_read(client: flight.FlightClient) -> int:
    """Rows read from a ``bench.bare_flight`` server."""
    info = client.get_flight_info(flight.FlightDescriptor.for_command(b"all"))
    rows = 0
    for endpoint in info.endpoints:
        for chunk in client.do_get(endpoint.ticket):
            rows += chunk.data.num_rows
    return rows


@contextmanager
def _bare(name: str) -> Iterator[flight.FlightClient]:
    """A client of ``bench.bare_flight NAME``, a peer server in its own process."""
    process, uri = _start_server(["-m", "bench.bare_flight", name], "bare Flight")
    try:
        yield flight.FlightClient(uri)
    finally:
        _stop_server(process)


# ---- workloads ---------------------------------------------------------------------------------
def bench_full_scan(ours_uri: str, scan: pa.Table) -> list[Row]:
    # The peer streams the same rows cut into the same messages as our server's, from memory.
    ours_client = flight.FlightClient(ours_uri)
    with _bare("scan") as peer_client:
        reads = {"ours": lambda: _sql_read(ours_client, "SELECT * FROM scan_t"),
                 "peer": lambda: _plain_read(peer_client)}
        assert all(read() == SCAN_ROWS for read in reads.values())
        best = best_interleaved(reads, SCAN_ROUNDS)
    megabytes = scan.nbytes / 1e6
    return [Row("DoGet SELECT * 2M rows x 10 mixed cols (MB/s)", megabytes / best["ours"],
                megabytes / best["peer"], "MB/s", "bare pyarrow.flight RecordBatchStream (memory)",
                goal=">=0.7x")]


def bench_projection(ours_uri: str) -> list[Row]:
    client = flight.FlightClient(ours_uri)
    ten = ", ".join(NARROW_COLUMNS)
    with _bare("narrow") as bare_narrow, _bare("wide") as bare_wide:
        reads = {"narrow": lambda: _sql_read(client, f"SELECT {ten} FROM wide_t"),
                 "full": lambda: _sql_read(client, "SELECT * FROM wide_t"),
                 "bare narrow": lambda: _plain_read(bare_narrow),
                 "bare full": lambda: _plain_read(bare_wide)}
        assert all(read() == WIDE_ROWS for read in reads.values())
        best = best_interleaved(reads, SCAN_ROUNDS)
    rate = {name: WIDE_ROWS / seconds for name, seconds in best.items()}
    return [
        Row("Flight scan 10 of 100 float64 cols, 300k rows", rate["narrow"], rate["full"], "rows/s",
            "same server, SELECT * (100 cols)", goal=">=8x"),
        Row("  the same ratio on a bare pyarrow.flight server", rate["bare narrow"], rate["bare full"],
            "rows/s", "bare server of all 100 cols (transport's own ratio)"),
        Row("  10 of 100 cols: ours vs a bare server of those 10", rate["narrow"], rate["bare narrow"],
            "rows/s", "bare pyarrow.flight server, 10 cols from memory"),
    ]


def _latencies(cursor, sql: str, keys: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-lookup latencies (ms) of ``keys`` through ``cursor``, and the client's own CPU time per
    lookup (ms; the servers run in other processes, so this process's CPU is the driver's).
    ``sql`` has a parameter, or ``{key}`` for literal SQL (a new statement text per key)."""

    def run(key: int) -> list:
        if "{key}" in sql:
            cursor.execute(sql.format(key=key))
        else:
            cursor.execute(sql, (key,))
        return cursor.fetchall()

    run(int(keys[0]))
    out = np.empty(len(keys))
    cpu = time.process_time()
    for i, key in enumerate(keys):
        start = time.perf_counter()
        rows = run(int(key))
        out[i] = time.perf_counter() - start
        if len(rows) != 1:
            raise AssertionError(f"lookup of {key} returned {len(rows)} rows")
    return out * 1e3, (time.process_time() - cpu) / len(keys) * 1e3


def _start_server(args: list[str], marker: str) -> tuple[subprocess.Popen, str]:
    """Start a server in its own process (like PostgreSQL: no GIL shared with the client); its
    first output line is ``<marker> ... at grpc://HOST:PORT``."""
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=HERE.parent)
    line = process.stdout.readline()
    if not line.startswith(marker) or " at grpc://" not in line:
        process.kill()
        raise RuntimeError(f"{args} did not start: {line!r}")
    return process, line.split(" at ", 1)[1].strip()


def _stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def _start_postgres(root: Path) -> tuple[str | None, str]:
    """(uri, why-not). Runs bench/setup_postgres.sh."""
    try:
        import adbc_driver_postgresql.dbapi  # noqa: F401
    except ImportError:
        return None, "adbc-driver-postgresql is not installed (pip install adbc-driver-postgresql)"
    try:
        done = subprocess.run(["bash", str(HERE / "setup_postgres.sh"), "start", str(root / "pg")],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"setup_postgres.sh failed: {exc}"
    for line in done.stdout.splitlines():
        if line.startswith("URI="):
            return line[4:], ""
    return None, f"setup_postgres.sh exited {done.returncode}: {done.stderr.strip()[-800:]}"


def bench_lookup(ours_uri: str, root: Path) -> list[Row]:
    import adbc_driver_flightsql.dbapi as flightsql

    rng = np.random.default_rng(7)
    keys = rng.integers(0, LOOKUP_ROWS, LOOKUPS)
    sql = "SELECT * FROM lookup_t WHERE id = ?"
    literal = "SELECT * FROM lookup_t WHERE id = {key}"
    with flightsql.connect(ours_uri) as conn, conn.cursor() as cursor:
        ours, _ = _latencies(cursor, sql, keys)
        ours_literal, _ = _latencies(cursor, literal, keys)
    # The floor: the same driver and transport against a server that answers from a canned reply.
    process, canned_uri = _start_server(["-m", "bench.canned_flightsql", str(LOOKUP_ROWS)], "canned")
    try:
        with flightsql.connect(canned_uri) as conn, conn.cursor() as cursor:
            floor, floor_cpu = _latencies(cursor, sql, keys)
    finally:
        _stop_server(process)
    rows = [Row("ADBC lookup p50: ours vs canned-reply Flight SQL server", float(np.percentile(ours, 50)),
                float(np.percentile(floor, 50)), "ms", "same driver, server does no work (floor)",
                higher_is_better=False)]

    uri, why = _start_postgres(root)
    if uri is None:
        print(f"bench_server: PostgreSQL peer unavailable, skipping the lookup rows: {why}",
              file=sys.stderr, flush=True)
        return rows
    try:
        import adbc_driver_postgresql.dbapi as pgdbapi

        with pgdbapi.connect(uri) as conn:
            with conn.cursor() as cursor:
                cursor.adbc_ingest("lookup_t", _mixed(LOOKUP_ROWS, seed=3), mode="create")
                cursor.execute("ALTER TABLE lookup_t ADD PRIMARY KEY (id)")
                cursor.execute("ANALYZE lookup_t")
            conn.commit()
            with conn.cursor() as cursor:
                theirs, theirs_cpu = _latencies(cursor, "SELECT * FROM lookup_t WHERE id = $1", keys)
                theirs_literal, _ = _latencies(cursor, literal, keys)
    finally:
        subprocess.run(["bash", str(HERE / "setup_postgres.sh"), "stop", str(root / "pg")],
                       capture_output=True, timeout=120)
    pg = "PostgreSQL via adbc-driver-postgresql"
    return [
        Row("ADBC PK lookup p50, SELECT * WHERE id = ? (2,000 keys)", float(np.percentile(ours, 50)),
            float(np.percentile(theirs, 50)), "ms", pg, higher_is_better=False, goal=">=0.5x"),
        Row("ADBC PK lookup p99", float(np.percentile(ours, 99)), float(np.percentile(theirs, 99)),
            "ms", pg, higher_is_better=False),
        Row("ADBC PK lookup p50, literal SQL WHERE id = 42", float(np.percentile(ours_literal, 50)),
            float(np.percentile(theirs_literal, 50)), "ms", pg, higher_is_better=False),
        *rows,
        Row("ADBC lookup p50: canned-reply Flight SQL server (floor)", float(np.percentile(floor, 50)),
            float(np.percentile(theirs, 50)), "ms", pg, higher_is_better=False),
        Row("client CPU per lookup: Flight SQL driver (floor run)", floor_cpu, theirs_cpu, "ms",
            "adbc-driver-postgresql, same keys", higher_is_better=False),
    ]


def bench_count(ours_uri: str) -> list[Row]:
    import adbc_driver_flightsql.dbapi as flightsql

    def timed(cursor, table: str, expected: int) -> float:
        cursor.execute(f"SELECT COUNT(*) FROM {table}")
        assert cursor.fetchall() == [(expected,)]
        samples = []
        for _ in range(COUNT_QUERIES):
            start = time.perf_counter()
            cursor.execute(f"SELECT COUNT(*) FROM {table}")
            cursor.fetchall()
            samples.append(time.perf_counter() - start)
        return float(np.median(samples)) * 1e3

    with flightsql.connect(ours_uri) as conn, conn.cursor() as cursor:
        big = timed(cursor, "count_big", BIG_COUNT_ROWS)
        small = timed(cursor, "count_small", SMALL_COUNT_ROWS)
    return [Row("ADBC COUNT(*) 10M-row table, median latency", big, small, "ms",
                "same server, COUNT(*) of a 10k-row table", higher_is_better=False, goal=">=0.5x")]


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-server-"))
    try:
        scan = _mixed(SCAN_ROWS)
        wide = _wide(WIDE_ROWS)
        started = time.perf_counter()
        _build(root / "data", scan, wide)
        print(f"bench_server: tables built in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
        process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"),
                                      "--host", "127.0.0.1", "--port", "0"], "flightstore serving")
        try:
            rows = bench_full_scan(uri, scan)
            rows += bench_projection(uri)
            rows += bench_lookup(uri, root)
            rows += bench_count(uri)
        finally:
            _stop_server(process)
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
