"""Lake tiering speed (issue 14), against pyiceberg measured in the same run.

* Tiering throughput (rows/s) of one round over a 5M-row log table (4 buckets, bucket key ``id``):
  read every bucket's log, add ``__bucket``/``__offset``/``__timestamp``, append and commit one
  Iceberg snapshot, vs pyiceberg appending the same Arrow rows (already in memory, with the same
  columns) in one call to an identically laid out table with the same Parquet codec (the lake's
  default, :data:`~flightstore.lake.catalog.DEFAULT_TABLE_PROPERTIES`). Goal >= 0.5x.
* Union read (``SELECT *`` over Flight SQL) of a 5M-row datalake-enabled log table, 90% of it in
  the lake (Parquet files planned by pyiceberg) and 10% in the log, vs the same ``SELECT *`` of a
  plain log table holding the same 5M rows in its log. Both tables live in one server (its own
  process, as a deployment runs it; the lake read-only: tiering off) and are read by one client.
  The server's read cache (``datalake.read-cache.size``, decoded data files as Arrow IPC) is
  emptied before each COLD read (the Parquet files are decoded, and written to the cache) and
  full for each WARM read (its files memory-mapped); both are reported, and the cache's disk bytes
  beside the lake's Parquet bytes. Goal >= 0.7x (warm).
* Changed-row cost: a 5M-row primary-key table (16 buckets) is tiered, then 1,000 upserts are
  tiered, merge-on-read (one position delete file per changed bucket + the upserts appended):
  bytes written by that round (data AND delete files: the snapshot summary's ``added-files-size``,
  the delete files' share reported beside it), vs the table's data bytes (what rewriting the table
  costs). Goal: <= 2/bucket.num of the table's bytes, i.e. a ratio >= bucket.num/2, both for keys
  of one bucket (a hot key range) and for random keys (every bucket changes). The one-bucket rows
  upserted by pyiceberg's own ``Table.upsert`` (copy-on-write) into an identical copy of the lake
  table are reported beside it.

Each run of either side writes into a fresh sqlite catalog and local warehouse; the two alternate
(best of 2 each) so a busy moment on a shared machine slows one run of each, not all of one.

``BENCH_LAKE_PARTS=union python -m bench lake`` runs only the named parts (tiering, union, changed).
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
import pyarrow.compute as pc
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

from bench.report import Row, best_interleaved
from flightstore.bucketing import bucket_ids
from flightstore.lake import LakeCatalog, LakeSettings, read_lake, tier_log_round, tier_round
from flightstore.lake.catalog import DEFAULT_TABLE_PROPERTIES
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
                                    sort_order=sort_order(schema), properties=DEFAULT_TABLE_PROPERTIES)
        peer.append(everything)
        assert peer.current_snapshot().summary["added-records"] == str(ROWS)

    assert everything.schema == lake_schema(descriptor) and everything.num_rows == ROWS
    best = best_interleaved({"ours": ours, "peer": pyiceberg_append}, rounds=2)
    store.close()
    return [Row(f"tiering round, {ROWS // 1_000_000}M-row log table ({BUCKETS} buckets)",
                ROWS / best["ours"], ROWS / best["peer"], "rows/s",
                "pyiceberg append of the same rows (one call, same codec)", goal=">= 0.5x")]


PK_BUCKETS = 16
CHANGED = 1_000


def _data_bytes(lake_table) -> int:
    return sum(task.file.file_size_in_bytes for task in lake_table.scan().plan_files())


def _added_bytes(lake_table, after_snapshot_id: int) -> int:
    """Bytes of the data and delete files the snapshots after ``after_snapshot_id`` added."""
    total, seen = 0, False
    for entry in lake_table.snapshots():
        if seen:
            total += int(entry.summary.additional_properties.get("added-files-size", 0))
        seen = seen or entry.snapshot_id == after_snapshot_id
    return total


def _added_delete_bytes(lake_table, snapshot_id: int) -> tuple[int, int]:
    """(count, bytes) of the position delete files snapshot ``snapshot_id`` added."""
    snapshot = lake_table.snapshot_by_id(snapshot_id)
    files = [entry.data_file for manifest in snapshot.manifests(lake_table.io)
             if manifest.content == ManifestContent.DELETES and manifest.added_snapshot_id == snapshot_id
             for entry in manifest.fetch_manifest_entry(lake_table.io)
             if entry.status == ManifestEntryStatus.ADDED]
    assert all(f.content == DataFileContent.POSITION_DELETES for f in files)
    return len(files), sum(f.file_size_in_bytes for f in files)


def bench_changed_rows(root: Path) -> list[Row]:
    store = Store(root / "pk-data")
    schema = _rows(0, 1).schema
    table = store.create_table("default.accounts", schema, primary_key=["id"], options={
        "bucket.num": PK_BUCKETS, "table.datalake.enabled": "true"})
    step = min(ROWS, 500_000)
    for first in range(0, ROWS, step):
        table.upsert(_rows(first, step))
    table.snapshot(force=True)
    catalog = _lake(root, "pk")
    lake_table = catalog.ensure_table(table.descriptor, table.directory.name)
    assert tier_round(table, lake_table).rows == ROWS
    lake_table = lake_table.refresh()
    table_bytes = _data_bytes(lake_table)
    base = lake_table.current_snapshot().snapshot_id
    # The peer: an identical lake table holding the same files' rows, upserted by pyiceberg.
    peer_catalog = _lake(root, "pk-peer").catalog
    peer_catalog.create_namespace_if_not_exists("default")
    peer = peer_catalog.create_table("default.accounts", lake_table.schema(), partition_spec=lake_table.spec(),
                                     sort_order=lake_table.sort_order())
    peer.append(read_lake(catalog, table.descriptor).cast(lake_table.schema().as_arrow()))
    peer_base = peer.current_snapshot().snapshot_id
    peer_bytes = _data_bytes(peer)

    rng = np.random.default_rng(5)
    ids = np.arange(ROWS, dtype=np.int64)
    hot = ids[bucket_ids(pa.table({"id": ids}), ["id"], PK_BUCKETS) == 3]
    changed = _rows(0, CHANGED).set_column(0, "id", pa.array(rng.choice(hot, CHANGED, replace=False)))
    table.upsert(changed)
    result = tier_round(table, lake_table)
    assert result.rows == CHANGED and result.delete_files == 1 and result.position_deletes == CHANGED, result
    ours = _added_bytes(lake_table.refresh(), base)
    assert ours == result.bytes_written
    one_deletes = _added_delete_bytes(lake_table.refresh(), result.snapshot_id)
    lake = read_lake(catalog, table.descriptor)
    assert lake.num_rows == ROWS
    upserted = lake.filter(pc.is_in(lake.column("id"), value_set=changed.column("id")))
    peer.upsert(upserted.cast(peer.schema().as_arrow()), join_cols=["id"])
    peer_written = _added_bytes(peer.refresh(), peer_base)

    spread = _rows(0, CHANGED).set_column(0, "id", pa.array(rng.choice(ids, CHANGED, replace=False)))
    table.upsert(spread)
    before_spread = lake_table.refresh().current_snapshot().snapshot_id
    spread_result = tier_round(table, lake_table)
    assert spread_result.delete_files == PK_BUCKETS and not spread_result.compacted, spread_result
    spread_bytes = _added_bytes(lake_table.refresh(), before_spread)
    assert spread_bytes == spread_result.bytes_written
    spread_deletes = _added_delete_bytes(lake_table.refresh(), spread_result.snapshot_id)
    lake = read_lake(catalog, table.descriptor, columns=["id", "amount"])
    assert lake.num_rows == ROWS and len(pc.unique(lake.column("id"))) == ROWS
    store.close()
    label = f"{CHANGED:,} upserts into a {ROWS // 1_000_000}M-row PK table ({PK_BUCKETS} buckets)"
    return [
        Row(f"changed-row cost: {label}, one bucket", ours, table_bytes, "bytes",
            f"the table's data bytes (a full rewrite); ours: data + {one_deletes[0]} delete file "
            f"({one_deletes[1]:,} bytes)", higher_is_better=False, goal=f">= {PK_BUCKETS / 2:g}x"),
        Row(f"changed-row cost: {label}, one bucket", ours, peer_written, "bytes",
            f"pyiceberg Table.upsert of the same rows ({peer_bytes:,} table bytes)", higher_is_better=False),
        Row(f"changed-row cost: {label}, random keys", spread_bytes, table_bytes, "bytes",
            f"the table's data bytes (a full rewrite); ours: data + {spread_deletes[0]} delete files "
            f"({spread_deletes[1]:,} bytes)", higher_is_better=False, goal=f">= {PK_BUCKETS / 2:g}x"),
    ]


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
    cache_dir = LakeSettings.from_options(data_dir, lake_options).read_cache_dir
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

            def read(name: str) -> float:
                start = time.perf_counter()
                got = conn.sql(f"SELECT * FROM {name}")
                seconds = time.perf_counter() - start
                assert got.num_rows == ROWS, (name, got.num_rows)
                return seconds

            # Each round: the union read with the read cache emptied first (cold: the lake's Parquet
            # files decoded, and written to the cache), again (warm: the cache's files mapped), and
            # the log table's read, side by side.
            best = dict.fromkeys(("cold", "warm", "peer"), float("inf"))
            for _ in range(3):
                for entry in cache_dir.glob("*.arrow"):
                    entry.unlink()
                best["cold"] = min(best["cold"], read("unioned"))
                best["warm"] = min(best["warm"], read("unioned"))
                best["peer"] = min(best["peer"], read("logged"))
            cache_bytes = sum(entry.stat().st_size for entry in cache_dir.glob("*.arrow"))
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=60)
    lake_bytes = sum(f.stat().st_size for f in (data_dir / "lake" / "warehouse").rglob("*.parquet"))
    label = f"union read over Flight SQL, {ROWS // 1_000_000}M rows (90% in the lake)"
    peer = "SELECT * of the same rows from a log table"
    return [Row(f"{label}, warm read cache", ROWS / best["warm"], ROWS / best["peer"], "rows/s", peer,
                goal=">= 0.7x"),
            Row(f"{label}, cold read cache", ROWS / best["cold"], ROWS / best["peer"], "rows/s", peer),
            Row("union read: read cache disk bytes", cache_bytes, lake_bytes, "bytes",
                "the lake's Parquet data files", higher_is_better=False)]


PARTS = {"tiering": bench_tiering, "union": bench_union_read, "changed": bench_changed_rows}


def run() -> list[Row]:
    """Every part, or those ``BENCH_LAKE_PARTS`` names (comma-separated: tiering, union, changed)."""
    wanted = [p.strip() for p in os.environ.get("BENCH_LAKE_PARTS", ",".join(PARTS)).split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        raise SystemExit(f"BENCH_LAKE_PARTS: unknown part(s) {', '.join(unknown)}; use {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory(prefix="bench-lake-") as tmp:
        return [row for part in wanted for row in PARTS[part](Path(tmp))]
