"""ADBC prepared lookup latency vs the canned-reply floor, without the load benchmark around it.

Issue 23's latency goal on its own: the p50 of ``SELECT * FROM kv WHERE id = ?`` through ADBC's
Flight SQL driver (one client, no load, 100k-row table) against the same driver and keys on
``bench/canned_flightsql.py`` (flightstore's server with canned replies for the prepared-lookup
calls: the floor of the driver and transport), interleaved in rounds
(:func:`bench.bench_lookups._adbc_p50`; ``python -m bench lookups`` measures the same beside its
PostgreSQL load runs). Goal: p50 <= 1.1x the floor.

    python -m bench adbc
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench.bench_lookups import ROWS, _adbc_p50
from bench.bench_server import _mixed, _start_server, _stop_server
from bench.report import Row
from flightstore.store import Store


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-adbc-"))
    try:
        rows = _mixed(ROWS, seed=3)
        with Store(root / "data") as store:  # built embedded; the server then opens the same data dir
            store.create_table("kv", rows.schema, primary_key=["id"], options={"bucket.num": 4}).upsert(rows)
        process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(root / "data"),
                                      "--host", "127.0.0.1", "--port", "0", "--no-fsync"], "flightstore serving")
        try:
            ours, floor = _adbc_p50(uri)
        finally:
            _stop_server(process)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [Row("ADBC prepared lookup p50 (no load)", ours, floor, "ms",
                "same driver, canned-reply Flight SQL server (floor)", higher_is_better=False, goal=">=0.91x")]
