"""Point lookups under load: flightstore vs PostgreSQL, each measured in the same run.

Issue 23's goals. :data:`CLIENTS` client processes look up random keys of a 100k-row table
(``bench_server._mixed``, primary key ``id``), each system on its own, for :data:`SECONDS` per
round, in :data:`ROUNDS` interleaved rounds (each figure: its best round):

* PostgreSQL (Debian's, started by ``bench/setup_postgres.sh`` in a temp dir on a free port; it
  is installed with apt-get when missing) through psycopg, ``SELECT * FROM kv WHERE id = %s``
  prepared: single-key lookups/s and latency under that load. It is the peer: if it cannot be
  started, or psycopg is missing, the benchmark fails (a missing peer fails loudly).
* flightstore's Python client, ``table.lookup({"id": [k]})`` (one message each way on the
  connection's lookup stream): lookups/s (goal >= 0.5x PostgreSQL's) and p99 beside PostgreSQL's.
* the same single-key lookups against ``serve --workers 2`` (a server process per core, each
  leading half of the buckets; the client sends each key to its bucket's worker): lookups/s.
* flightstore's batched lookuper, :data:`IN_FLIGHT` keys in flight per process: keys/s (goal >= 2x
  PostgreSQL's single-key lookups/s); and deep, :data:`DEEP_IN_FLIGHT` keys in flight per process
  in batches of 128 (Fluss's default ``client.lookup.max-batch-size``).
* the same single-key lookups against ``bench/canned_lookups.py``, a lookup-stream server that
  answers every lookup with a ready row (no storage): the floor of the Python client and the
  pyarrow.flight transport on this machine, and the server CPU per lookup beside ours.
* ADBC prepared lookup p50 (one client, no load) vs the same driver against
  ``bench/canned_flightsql.py``, a Flight SQL server answering from canned replies (goal <= 1.1x).

The machine is shared: only ratios measured in the same run mean anything.

    python -m bench lookups
"""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.bench_lookup_cpu import _cpu_s
from bench.bench_server import HERE, _mixed, _start_server, _stop_server
from bench.report import Row
from flightstore.store import Store

ROWS = 100_000
CLIENTS = 8
SECONDS = 8.0
ROUNDS = 2
IN_FLIGHT = 64  # keys in flight per process with the batched lookuper
DEEP_IN_FLIGHT = 512  # ... and in its deep configuration, with Fluss's default batch size
WORKERS = 2  # server processes of ``serve --workers`` (this machine's cores)
LOOKUPER_OPTIONS = {"client.lookup.max-batch-size": 32, "client.lookup.batch-timeout": "5ms"}
DEEP_OPTIONS = {"client.lookup.max-batch-size": 128, "client.lookup.batch-timeout": "5ms"}
ADBC_LOOKUPS = 1_000
ADBC_ROUNDS = 4
PG_COLUMNS = ("id bigint primary key, user_id bigint, amount double precision, score real, qty integer, "
              "status text, country text, flag boolean, ts timestamp, note text")


# ---- the peer ----------------------------------------------------------------------------------------
def _start_postgres(root: Path) -> str:
    """Start PostgreSQL (setup_postgres.sh) and load the table; its URI. Fails loudly."""
    try:
        import psycopg
    except ImportError:
        raise RuntimeError("bench_lookups: psycopg is not installed (pip install -e '.[bench]'): "
                           "the PostgreSQL peer is required") from None
    done = subprocess.run(["bash", str(HERE / "setup_postgres.sh"), "start", str(root / "pg")],
                          capture_output=True, text=True, timeout=600)
    uri = next((line[4:] for line in done.stdout.splitlines() if line.startswith("URI=")), None)
    if uri is None:
        raise RuntimeError(f"bench_lookups: the PostgreSQL peer did not start (setup_postgres.sh exited "
                           f"{done.returncode}): {done.stderr.strip()[-800:]}")
    rows = _mixed(ROWS, seed=3)
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE kv ({PG_COLUMNS})")
        with conn.cursor().copy(f"COPY kv ({', '.join(rows.column_names)}) FROM STDIN") as copy:
            for row in zip(*(rows.column(c).to_pylist() for c in rows.column_names)):
                copy.write_row(row)
        conn.execute("ANALYZE kv")
    return uri


def _stop_postgres(root: Path) -> None:
    subprocess.run(["bash", str(HERE / "setup_postgres.sh"), "stop", str(root / "pg")],
                   capture_output=True, timeout=120)


def _start_workers(data_dir: Path, rows) -> tuple[subprocess.Popen, str]:
    """``serve --workers WORKERS`` (one process per core, each leading a share of the buckets),
    loaded through its client with the same table: its process (worker 0) and URI."""
    import flightstore
    process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(data_dir), "--host",
                                  "127.0.0.1", "--port", "0", "--no-fsync", "--workers", str(WORKERS)],
                                 "flightstore serving")
    with flightstore.connect(uri, timeout=120) as conn:
        conn.sql("CREATE TABLE kv (id BIGINT, user_id BIGINT, amount DOUBLE, score FLOAT, qty INT, status STRING, "
                 "country STRING, flag BOOLEAN, ts TIMESTAMP(3), note STRING, PRIMARY KEY (id) NOT ENFORCED) "
                 "WITH ('bucket.num' = '4')")
        conn.table("kv").upsert(rows)
    return process, uri


# ---- one client process ------------------------------------------------------------------------------
def _client(kind: str, uri: str, seed: int, start_at: float, seconds: float, out) -> None:
    """Look up random keys from ``start_at`` for ``seconds``; put (lookups, seconds, latencies,
    this process's CPU seconds meanwhile)."""
    keys = np.random.default_rng(seed).integers(0, ROWS, 2_000_000).tolist()
    if kind == "pg":
        import psycopg
        conn = psycopg.connect(uri, autocommit=True)
        cursor = conn.cursor()

        def one(key: int) -> int:
            cursor.execute("SELECT * FROM kv WHERE id = %s", (key,), prepare=True)
            return len(cursor.fetchall())
    else:
        import flightstore
        conn = flightstore.connect(uri, timeout=120)
        table = conn.table("kv")

        def one(key: int) -> int:
            return table.lookup({"id": [key]}).num_rows
    if kind == "batched":
        return out.put(_batched(table, keys, start_at, seconds, IN_FLIGHT, LOOKUPER_OPTIONS))
    if kind == "deep":
        return out.put(_batched(table, keys, start_at, seconds, DEEP_IN_FLIGHT, DEEP_OPTIONS))
    for key in keys[:200]:
        one(key)
    while time.time() < start_at:
        time.sleep(0.001)
    latencies = []
    cpu = time.process_time()
    started = time.perf_counter()
    done = 0
    while time.perf_counter() - started < seconds:
        begin = time.perf_counter()
        if one(keys[done]) != 1:
            raise AssertionError(f"{kind}: lookup of {keys[done]} did not find its row")
        latencies.append(time.perf_counter() - begin)
        done += 1
    out.put((done, time.perf_counter() - started, np.array(latencies), time.process_time() - cpu))
    conn.close()


def _batched(table, keys: list[int], start_at: float, seconds: float, in_flight: int, options: dict) -> tuple:
    """Keep ``in_flight`` keys in flight on one lookuper; count the keys answered."""
    import collections
    with table.lookuper(options=options) as lookuper:
        for future in [lookuper.lookup_async(k) for k in keys[:in_flight]]:
            future.result()
        while time.time() < start_at:
            time.sleep(0.001)
        window: collections.deque = collections.deque()
        cpu = time.process_time()  # every thread of the process: the lookuper's, gRPC's
        started = time.perf_counter()
        done = 0
        at = 0
        while time.perf_counter() - started < seconds:
            while len(window) < in_flight:
                window.append(lookuper.lookup_async(keys[at]))
                at += 1
            if window.popleft().result().num_rows != 1:
                raise AssertionError("batched: a key did not find its row")
            done += 1
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        for future in window:
            future.result()
    table.connection.close()
    return done, elapsed, np.array([]), cpu


def _load(kind: str, uri: str, server_pid: int | None) -> tuple[float, np.ndarray, float, float]:
    """(lookups/s, latencies, server CPU ms per lookup or nan, client CPU ms per lookup) of
    :data:`CLIENTS` processes."""
    context = multiprocessing.get_context("spawn")  # no gRPC or libpq state forked
    out = context.Queue()
    start_at = time.time() + 6.0  # every process connected and warm by then
    processes = [context.Process(target=_client, args=(kind, uri, seed, start_at, SECONDS, out))
                 for seed in range(CLIENTS)]
    for process in processes:
        process.start()
    while time.time() < start_at:
        time.sleep(0.01)
    cpu_before = _cpu_s(server_pid) if server_pid else 0.0
    results = [out.get(timeout=SECONDS + 300) for _ in processes]
    cpu = _cpu_s(server_pid) - cpu_before if server_pid else float("nan")
    for process in processes:
        process.join(timeout=60)
        if process.exitcode != 0:
            raise RuntimeError(f"bench_lookups: a {kind} client failed (exit {process.exitcode})")
    total = sum(r[0] for r in results)
    rate = total / max(r[1] for r in results)
    client_cpu = sum(r[3] for r in results)
    return rate, np.concatenate([r[2] for r in results]), cpu / total * 1e3, client_cpu / total * 1e3


# ---- ADBC latency vs the canned floor ---------------------------------------------------------------
def _adbc_p50(ours_uri: str) -> tuple[float, float]:
    import adbc_driver_flightsql.dbapi as flightsql

    process, canned_uri = _start_server(["-m", "bench.canned_flightsql", str(ROWS)], "canned")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours, floor = flightsql.connect(ours_uri), flightsql.connect(canned_uri)
        cursors = {"ours": ours.cursor(), "floor": floor.cursor()}
        keys = np.random.default_rng(11).integers(0, ROWS, ADBC_LOOKUPS).tolist()
        times: dict[str, list[float]] = {name: [] for name in cursors}
        for cursor in cursors.values():
            cursor.execute("SELECT * FROM kv WHERE id = ?", (keys[0],))
            cursor.fetchall()
        for chunk in np.array_split(np.array(keys), ADBC_ROUNDS):
            for name, cursor in cursors.items():
                for key in chunk.tolist():
                    begin = time.perf_counter()
                    cursor.execute("SELECT * FROM kv WHERE id = ?", (key,))
                    if len(cursor.fetchall()) != 1:
                        raise AssertionError(f"ADBC {name}: lookup of {key} did not answer one row")
                    times[name].append(time.perf_counter() - begin)
        for cursor in cursors.values():
            cursor.close()
        ours.close()
        floor.close()
    finally:
        _stop_server(process)
    return float(np.median(times["ours"])) * 1e3, float(np.median(times["floor"])) * 1e3


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-lookups-"))
    try:
        pg_uri = _start_postgres(root)
        rows = _mixed(ROWS, seed=3)
        with Store(root / "data") as store:  # built embedded; the server then opens the same data dir
            store.create_table("kv", rows.schema, primary_key=["id"], options={"bucket.num": 4}).upsert(rows)
        with Store(root / "data-floor") as store:  # the canned server answers one ready row
            store.create_table("kv", rows.schema, primary_key=["id"], options={"bucket.num": 4}).upsert(
                rows.slice(0, 1))
        process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"),
                                      "--host", "127.0.0.1", "--port", "0", "--no-fsync"], "flightstore serving")
        workers, workers_uri = _start_workers(root / "data-workers", rows)
        floor, floor_uri = _start_server(["-m", "bench.canned_lookups", str(root / "data-floor")], "canned")
        try:
            best: dict[str, tuple] = {}
            pids = {"ours": process.pid, "batched": process.pid, "deep": process.pid, "floor": floor.pid}
            for round_ in range(ROUNDS):
                for kind, target in (("pg", pg_uri), ("ours", uri), ("batched", uri), ("deep", uri),
                                     ("workers", workers_uri), ("floor", floor_uri)):
                    measured = _load(kind, target, pids.get(kind))
                    print(f"bench_lookups: round {round_ + 1} {kind}: {measured[0]:,.0f}/s, CPU per lookup: "
                          f"server {measured[2]:.3f} ms, clients {measured[3]:.3f} ms", file=sys.stderr, flush=True)
                    if kind not in best or measured[0] > best[kind][0]:
                        best[kind] = measured
            adbc_ours, adbc_floor = _adbc_p50(uri)
        finally:
            _stop_server(process)
            _stop_server(workers)
            _stop_server(floor)
    finally:
        _stop_postgres(root)
        shutil.rmtree(root, ignore_errors=True)
    pg_rate, pg_latency, _, pg_client_cpu = best["pg"]
    ours_rate, ours_latency, ours_cpu, _ = best["ours"]
    batched_rate, _, batched_cpu, batched_client_cpu = best["batched"]
    pg_name = f"PostgreSQL (Debian) via psycopg, prepared, {CLIENTS} processes"
    return [
        Row(f"single-key lookups/s, Python client, {CLIENTS} processes", ours_rate, pg_rate, "lookups/s",
            pg_name, goal=">=0.5x"),
        Row(f"single-key lookups/s, Python client, serve --workers {WORKERS}", best["workers"][0], pg_rate,
            "lookups/s", pg_name, goal=">=0.5x"),
        Row(f"keys/s, batched lookuper ({IN_FLIGHT} in flight per process)", batched_rate, pg_rate,
            "keys/s", "PostgreSQL single-key lookups/s", goal=">=2x"),
        Row("single-key lookup p50 under that load", float(np.percentile(ours_latency, 50)) * 1e3,
            float(np.percentile(pg_latency, 50)) * 1e3, "ms", pg_name, higher_is_better=False),
        Row("single-key lookup p99 under that load", float(np.percentile(ours_latency, 99)) * 1e3,
            float(np.percentile(pg_latency, 99)) * 1e3, "ms", pg_name, higher_is_better=False),
        Row("  single-key lookups/s vs the canned lookup server (client + transport floor)", ours_rate,
            best["floor"][0], "lookups/s", "same clients, bench/canned_lookups.py"),
        Row("  server CPU per single-key lookup vs the canned lookup server", ours_cpu, best["floor"][2],
            "ms CPU", "same load, bench/canned_lookups.py", higher_is_better=False),
        Row(f"keys/s, batched lookuper ({DEEP_IN_FLIGHT} in flight per process, batches of 128)", best["deep"][0],
            pg_rate, "keys/s", "PostgreSQL single-key lookups/s", goal=">=2x"),
        Row("  server CPU per key: batched vs single-key lookups", batched_cpu, ours_cpu, "ms CPU",
            "same server, single-key lookups under load", higher_is_better=False),
        Row("  client CPU per key: batched lookuper vs psycopg per lookup", batched_client_cpu, pg_client_cpu,
            "ms CPU", "PostgreSQL's client processes, same load", higher_is_better=False),
        Row("ADBC prepared lookup p50 (no load)", adbc_ours, adbc_floor, "ms",
            "same driver, canned-reply Flight SQL server (floor)", higher_is_better=False, goal=">=0.91x"),
    ]
