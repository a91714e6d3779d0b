"""Flight SQL server speed, each figure against a peer measured in the same run.

Every peer runs in its own process, like our server (no shared GIL or gRPC threads with the
measuring client), and peers are measured side by side: interleaved rounds, so a busy spell on a
shared machine hits one round of each instead of all runs of one.

1. DoGet full-scan throughput of a 2M-row x 10-column log table (``SELECT * FROM t``, every endpoint
   read with ``pyarrow.flight``) vs ``bench/bare_flight.py``, a bare ``pyarrow.flight`` server
   streaming the same table, cut into the same messages, from memory (goal >= 0.7x).
2. Over Flight, a 10-of-100 column scan vs the full 100-column scan of 300k float64 rows (goal >= 8x).
   Two rows explain it: the same ratio between bare servers of the 10 and the 100 columns (what
   the transport itself allows), and our 10-column scan vs the bare server of those 10 columns.
3. Single primary-key lookup through ADBC (``SELECT * FROM t WHERE id = ?``, 2,000 random keys) p50
   and p99 (and p50 of the same lookups sent as literal SQL, as BI tools do) vs the same lookup
   through ``adbc-driver-postgresql`` on a local PostgreSQL started by
   ``bench/setup_postgres.sh`` (goal: our p50 <= 2x PostgreSQL's). Skipped, with the reason printed,
   when PostgreSQL or its driver is unavailable. More rows explain the figure: the same ADBC
   driver against ``bench/canned_flightsql.py``, a Flight SQL server answering from canned replies
   (the floor of driver + Flight transport: our p50 vs it is the cost of our server), the client
   driver's own CPU time per lookup (Flight SQL vs PostgreSQL), and the same lookups through
   flightstore's own Python client (one DoGet per lookup instead of ADBC's three RPCs).
4. ``COUNT(*)`` through ADBC on a 10M-row log table vs a 10k-row one (goal within 2x: no scan).

Tables are built with the embedded Store (large appends) before the server opens the same data dir.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from bench.report import Row, best_interleaved
from flightstore.server import protocol
from flightstore.store import Store

SCAN_ROWS = 2_000_000
WIDE_ROWS = 300_000
WIDE_COLUMNS = 100
NARROW_COLUMNS = [f"c{i}" for i in range(10)]  # the pruned scan's 10 of 100 columns
SCAN_ROUNDS = 7  # interleaved rounds of the scan rows; each figure is its best round
LOOKUP_ROWS = 100_000
LOOKUPS = 2_000
LOOKUP_ROUNDS = 4  # the keys are split into rounds; each round runs every client in turn
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
def _read(client: flight.FlightClient, command: bytes) -> int:
    """Rows read for a command descriptor: GetFlightInfo, then DoGet of every endpoint."""
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
    rows = 0
    for endpoint in info.endpoints:
        for chunk in client.do_get(endpoint.ticket):
            rows += chunk.data.num_rows
    return rows


def _sql_read(client: flight.FlightClient, sql: str) -> int:
    """Rows read for ``sql`` through Flight SQL CommandStatementQuery, every endpoint."""
    return _read(client, protocol.pack_any(protocol.message_class("CommandStatementQuery")(query=sql)))


def _plain_read(client: flight.FlightClient) -> int:
    """Rows read from a ``bench.bare_flight`` server."""
    return _read(client, b"all")


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


def _latencies(run: Callable[[int], int], keys: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-lookup latencies (ms) of ``run(key)`` (which returns the rows it found, always 1 here)
    over ``keys``, and this process's CPU time per lookup (ms; the servers run in other
    processes, so that is the client driver's own cost)."""
    out = np.empty(len(keys))
    cpu = time.process_time()
    for i, key in enumerate(keys):
        start = time.perf_counter()
        found = run(int(key))
        out[i] = time.perf_counter() - start
        if found != 1:
            raise AssertionError(f"lookup of {key} returned {found} rows")
    return out * 1e3, (time.process_time() - cpu) / len(keys) * 1e3


def _dbapi_lookup(cursor, sql: str) -> Callable[[int], int]:
    """A lookup through a DB-API cursor: ``sql`` has one parameter, or ``{key}`` for literal SQL
    (a new statement text per key, as BI tools send)."""
    def run(key: int) -> int:
        if "{key}" in sql:
            cursor.execute(sql.format(key=key))
        else:
            cursor.execute(sql, (key,))
        return len(cursor.fetchall())
    return run


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
    """The lookup rows. Every client runs in each of :data:`LOOKUP_ROUNDS` rounds, in turn, so
    all of them see the same machine (a busy spell hits one round of each, not one client)."""
    import adbc_driver_flightsql.dbapi as flightsql

    import flightstore

    keys = np.random.default_rng(7).integers(0, LOOKUP_ROWS, LOOKUPS)
    with ExitStack() as stack:
        def cursor(connection):
            return stack.enter_context(stack.enter_context(connection).cursor())

        ours = cursor(flightsql.connect(ours_uri))
        # The floor: the same driver and transport against a server answering from canned replies.
        process, canned_uri = _start_server(["-m", "bench.canned_flightsql", str(LOOKUP_ROWS)], "canned")
        stack.callback(_stop_server, process)
        native = stack.enter_context(flightstore.connect(ours_uri)).table("lookup_t")
        runs = {
            "ours": _dbapi_lookup(ours, "SELECT * FROM lookup_t WHERE id = ?"),
            "ours literal": _dbapi_lookup(ours, "SELECT * FROM lookup_t WHERE id = {key}"),
            "floor": _dbapi_lookup(cursor(flightsql.connect(canned_uri)),
                                   "SELECT * FROM lookup_t WHERE id = ?"),
            "native": lambda key: native.lookup({"id": [key]}).num_rows,
        }
        uri, why = _start_postgres(root)
        if uri is None:
            print(f"bench_server: PostgreSQL peer unavailable, skipping its rows: {why}",
                  file=sys.stderr, flush=True)
        else:
            stack.callback(subprocess.run,
                           ["bash", str(HERE / "setup_postgres.sh"), "stop", str(root / "pg")],
                           capture_output=True, timeout=120)
            pg = cursor(_postgres_lookup_table(uri))
            runs["pg"] = _dbapi_lookup(pg, "SELECT * FROM lookup_t WHERE id = $1")
            runs["pg literal"] = _dbapi_lookup(pg, "SELECT * FROM lookup_t WHERE id = {key}")
        for run in runs.values():
            run(int(keys[0]))  # warm up: prepare, plan, first connection use
        latency = {name: [] for name in runs}
        cpu = {name: [] for name in runs}
        for chunk in np.array_split(keys, LOOKUP_ROUNDS):
            for name, run in runs.items():
                times, cpu_ms = _latencies(run, chunk)
                latency[name].append(times)
                cpu[name].append(cpu_ms)
    p = {name: (float(np.percentile(np.concatenate(t), 50)), float(np.percentile(np.concatenate(t), 99)))
         for name, t in latency.items()}
    cpu_ms = {name: float(np.mean(c)) for name, c in cpu.items()}
    floor = Row("ADBC lookup p50: ours vs canned-reply Flight SQL server", p["ours"][0], p["floor"][0],
                "ms", "same driver, server does no work (floor)", higher_is_better=False)
    if "pg" not in p:
        return [floor]
    pg_name = "PostgreSQL via adbc-driver-postgresql"
    return [
        Row("ADBC PK lookup p50, SELECT * WHERE id = ? (2,000 keys)", p["ours"][0], p["pg"][0], "ms",
            pg_name, higher_is_better=False, goal=">=0.5x"),
        Row("ADBC PK lookup p99", p["ours"][1], p["pg"][1], "ms", pg_name, higher_is_better=False),
        Row("ADBC PK lookup p50, literal SQL WHERE id = 42", p["ours literal"][0], p["pg literal"][0],
            "ms", pg_name, higher_is_better=False),
        floor,
        Row("ADBC lookup p50: canned-reply Flight SQL server (floor)", p["floor"][0], p["pg"][0], "ms",
            pg_name, higher_is_better=False),
        Row("client CPU per lookup: Flight SQL driver (floor run)", cpu_ms["floor"], cpu_ms["pg"], "ms",
            "adbc-driver-postgresql, same keys", higher_is_better=False),
        Row("PK lookup p50, flightstore Python client (1 DoGet)", p["native"][0], p["pg"][0], "ms",
            pg_name, higher_is_better=False),
        Row("PK lookup p99, flightstore Python client", p["native"][1], p["pg"][1], "ms", pg_name,
            higher_is_better=False),
    ]


def _postgres_lookup_table(uri: str):
    """A connection to the PostgreSQL peer, holding ``lookup_t`` (same rows, primary key ``id``)."""
    import adbc_driver_postgresql.dbapi as pgdbapi

    conn = pgdbapi.connect(uri)
    with conn.cursor() as cursor:
        cursor.adbc_ingest("lookup_t", _mixed(LOOKUP_ROWS, seed=3), mode="create")
        cursor.execute("ALTER TABLE lookup_t ADD PRIMARY KEY (id)")
        cursor.execute("ANALYZE lookup_t")
    conn.commit()
    return conn


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
