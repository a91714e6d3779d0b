"""Lake tiering speed (issue 14), against pyiceberg measured in the same run.

* Tiering throughput (rows/s) of one round over a 5M-row log table (4 buckets, bucket key ``id``):
  read every bucket's log, add ``__bucket``/``__offset``/``__timestamp``, append and commit one
  Iceberg snapshot, vs pyiceberg appending the same Arrow rows (already in memory, with the same
  columns) in one call to an identically laid out table. Goal >= 0.5x.
* Union read (``SELECT *`` over Flight SQL) of a 5M-row datalake-enabled log table, 90% of it in
  the lake (Parquet files read by pyiceberg) and 10% in the log, vs the same ``SELECT *`` of a
  plain log table holding the same 5M rows in its log. Both tables live in one server (its own
  process, as a deployment runs it; the lake read-only: tiering off) and are read by one client.
  Goal >= 0.7x.

Each run of either side writes into a fresh sqlite catalog and local warehouse; the two alternate
(best of 2 each) so a busy moment on a shared machine slows one run of each, not all of one.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.report import Row, best_interleaved
from flightstore.lake import LakeCatalog, LakeSettings, tier_log_round
from flightstore.lake.layout import iceberg_schema, lake_schema, partition_spec, sort_order
from flightstore.lake.tiering import read_backlog
from flightstore.store import Store

ROWS = 5_000_000
BATCH = 100_000
BUCKETS = 4


def _rows(first: int, n: int) -> pa.Table:
    rng = np.random.default_rng(first)
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table({
        "id": ids,
        "user": pa.array(rng.integers(0, 100_000, n), pa.int64()),
        "amount": pa.array(rng.random(n)),
        "status": pa.array(np.array(["new", "paid", "shipped", "done"])[rng.integers(0, 4, n)]),
        "ts": pa.array(rng.integers(0, 2**40, n), pa.int64()).cast(pa.timestamp("ms")),
    })


def _lake(root: Path, tag: str) -> LakeCatalog:
    return LakeCatalog(LakeSettings.from_options(root, {
        "datalake.iceberg.uri": f"sqlite:///{root / f'catalog-{tag}.db'}",
        "datalake.iceberg.warehouse": str(root / f"warehouse-{tag}")}))


def bench_tiering(root: Path) -> list[Row]:
    store = Store(root / "data")
    table = store.create_table("default.orders", _rows(0, 1).schema, options={
        "bucket.num": BUCKETS, "bucket.key": "id", "table.datalake.enabled": "true"})
    for first in range(0, ROWS, BATCH):
        table.append(_rows(first, BATCH))
    # The peer appends exactly the rows a round commits, already in memory.
    everything, _ = read_backlog(table, table.start_offsets(), table.end_offsets(), None)
    descriptor = table.descriptor
    runs = itertools.count()

    def ours() -> None:
        catalog = _lake(root, f"ours-{next(runs)}")
        lake_table = catalog.ensure_table(descriptor, table.directory.name)
        result = tier_log_round(table, lake_table)
        assert result.rows == ROWS, result

    def pyiceberg_append() -> None:
        catalog = _lake(root, f"peer-{next(runs)}").catalog
        catalog.create_namespace_if_not_exists("default")
        schema = iceberg_schema(descriptor)
        peer = catalog.create_table("default.orders", schema, partition_spec=partition_spec(descriptor, schema),
                                    sort_order=sort_order(schema))
        peer.append(everything)
        assert peer.current_snapshot().summary["added-records"] == str(ROWS)

    assert everything.schema == lake_schema(descriptor) and everything.num_rows == ROWS
    best = best_interleaved({"ours": ours, "peer": pyiceberg_append}, rounds=2)
    store.close()
    return [Row(f"tiering round, {ROWS // 1_000_000}M-row log table ({BUCKETS} buckets)",
                ROWS / best["ours"], ROWS / best["peer"], "rows/s",
                "pyiceberg append of the same rows (one call)", goal=">= 0.5x")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_union_read(root: Path) -> list[Row]:
    import flightstore

    data_dir = root / "union"
    lake_options = {"datalake.tiering.enabled": "false"}  # the bench decides what is tiered
    with Store(data_dir) as store:
        options = {"bucket.num": BUCKETS, "bucket.key": "id"}
        union = store.create_table("default.unioned", _rows(0, 1).schema,
                                   options={**options, "table.datalake.enabled": "true"})
        plain = store.create_table("default.logged", _rows(0, 1).schema, options=options)
        in_lake = ROWS * 9 // 10
        for first in range(0, ROWS, BATCH):
            if first == in_lake:
                catalog = LakeCatalog(LakeSettings.from_options(data_dir, lake_options))
                result = tier_log_round(union, catalog.ensure_table(union.descriptor, union.directory.name))
                assert result.rows == in_lake, result
                catalog.reset()
            batch = _rows(first, BATCH)
            union.append(batch)
            plain.append(batch)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "flightstore", "serve", "--data-dir", str(data_dir), "--host", "127.0.0.1",
         "--port", str(port), "--no-fsync", *[f"-o{k}={v}" for k, v in lake_options.items()]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the bench server did not start (exit code {server.poll()})")
            time.sleep(0.05)
        with flightstore.connect(f"grpc://127.0.0.1:{port}", timeout=600) as conn:
            explained = conn.sql("EXPLAIN SELECT * FROM unioned").column("plan").to_pylist()[0]
            assert explained.startswith("UnionScan("), explained
            status = conn.sql("SELECT SUM(lag_records) AS lag FROM unioned$lake$status")
            assert status.column("lag").to_pylist() == [ROWS - in_lake], status

            def read(name: str):
                def run_query() -> None:
                    got = conn.sql(f"SELECT * FROM {name}")
                    assert got.num_rows == ROWS, (name, got.num_rows)
                return run_query

            best = best_interleaved({"ours": read("unioned"), "peer": read("logged")}, rounds=3)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=60)
    return [Row(f"union read over Flight SQL, {ROWS // 1_000_000}M rows (90% in the lake)",
                ROWS / best["ours"], ROWS / best["peer"], "rows/s",
                "SELECT * of the same rows from a log table", goal=">= 0.7x")]


def run() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-lake-") as tmp:
        return bench_tiering(Path(tmp)) + bench_union_read(Path(tmp))
