"""Chunked PK scans of RocksDB (flightstore/kv/scan.py): streamed in bounded chunks, in key order,
checked. (Full scans of a table fold the changelog instead while they can: ``KvTablet.full_scan``;
RocksDB is what range scans, and full scans the fold cannot serve, read.)

Corruption itself is tested through a server in tests/server/test_kv_corruption.py.
"""

from __future__ import annotations

import logging
import struct

import numpy as np
import pyarrow as pa

from flightstore.expressions import Comparison
from flightstore.kv.scan import FIRST_CHUNK_ROWS, MAX_CHUNK_ROWS

ROWS = 200_000


def _table(store, buckets: int = 1):
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())])
    table = store.create_table("t", schema, primary_key=["id"], options={"bucket.num": str(buckets)})
    ids = np.random.default_rng(0).permutation(ROWS) - ROWS // 2
    table.upsert(pa.table({"id": pa.array(ids, pa.int64()),
                           "name": pa.array([f"n{i}" for i in ids]),
                           "x": pa.array(ids * 0.5)}))
    return table


def test_a_full_scan_streams_bounded_chunks_in_key_order(store):
    table = _table(store)
    kv = table.kvs[0]
    batches = kv.scan(["id", "name"])
    first = next(batches)
    assert kv.io_stats()["rows_read"] <= FIRST_CHUNK_ROWS  # nothing read ahead of the consumer
    rest = list(batches)
    sizes = [b.num_rows for b in [first, *rest]]
    assert max(sizes) <= MAX_CHUNK_ROWS and sum(sizes) == ROWS
    assert kv.io_stats()["rows_read"] == ROWS
    ids = pa.concat_arrays([b.column("id") for b in [first, *rest]]).to_numpy()
    assert np.array_equal(ids, np.arange(ROWS) - ROWS // 2)  # key order, negatives first
    names = pa.concat_arrays([b.column("name") for b in [first, *rest]]).to_pylist()
    assert names[:2] == [f"n{-ROWS // 2}", f"n{-ROWS // 2 + 1}"]


def test_a_limit_and_a_filter_read_only_what_they_need(store):
    table = _table(store)
    kv = table.kvs[0]
    first_ids = list(range(-ROWS // 2, -ROWS // 2 + 10))
    assert pa.Table.from_batches(list(kv.scan(["id"], limit=10))).column("id").to_pylist() == first_ids
    assert kv.io_stats()["rows_read"] == 10
    # A filter that drops most rows: chunks grow until the limit is met, far short of the table.
    filter = (Comparison("x", ">", 0.0) & Comparison("name", ">=", "n5")).bind(table.schema)
    found = pa.Table.from_batches(list(kv.scan(["id"], filter, limit=20)))
    assert found.num_rows == 20
    assert kv.io_stats()["rows_read"] < ROWS


def test_a_row_count_that_disagrees_with_healthy_data_is_logged_not_an_error(store, caplog):
    table = _table(store)
    table.kvs[0].write_meta({b"row_count": struct.pack(">q", ROWS + 7)})
    with caplog.at_level(logging.WARNING, logger="flightstore.kv"):
        assert sum(b.num_rows for b in table.kvs[0].scan(["id"])) == ROWS
    assert "maintained row count is off" in caplog.text
