"""Lake tiering speed (issue 14), against pyiceberg measured in the same run.

* Tiering throughput (rows/s) of one round over a 5M-row log table (4 buckets, bucket key ``id``):
  read every bucket's log, add ``__bucket``/``__offset``/``__timestamp``, append and commit one
  Iceberg snapshot, vs pyiceberg appending the same Arrow rows (already in memory, with the same
  columns) in one call to an identically laid out table. Goal >= 0.5x.

Each run of either side writes into a fresh sqlite catalog and local warehouse; the two alternate
(best of 2 each) so a busy moment on a shared machine slows one run of each, not all of one.
"""

from __future__ import annotations

import itertools
import tempfile
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


def run() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-lake-") as tmp:
        return bench_tiering(Path(tmp))
