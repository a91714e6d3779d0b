"""flightstore.batches: the one LIMIT cut every reader applies (store, KV tablet, cluster scans)."""

from __future__ import annotations

import pyarrow as pa

from flightstore.batches import limited, limited_sources


def _batch(start: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(range(start, start + rows), pa.int64())})


def _counted(batches: list[pa.RecordBatch], pulled: list[int]):
    for batch in batches:
        pulled.append(batch.num_rows)
        yield batch


def test_limited_cuts_the_last_batch_and_pulls_no_further():
    pulled: list[int] = []
    source = [_batch(0, 3), _batch(3, 0), _batch(3, 4), _batch(7, 5)]
    out = list(limited(_counted(source, pulled), 5))
    assert [b.column(0).to_pylist() for b in out] == [[0, 1, 2], [3, 4]]
    assert pulled == [3, 0, 4]  # the fourth batch is never read


def test_limited_without_a_limit_drops_only_empty_batches():
    out = list(limited([_batch(0, 2), _batch(2, 0), _batch(2, 1)], None))
    assert [b.num_rows for b in out] == [2, 1]


def test_limited_at_zero_reads_nothing():
    pulled: list[int] = []
    assert list(limited(_counted([_batch(0, 1)], pulled), 0)) == []
    assert pulled == []


def test_limited_cuts_tables_too():
    out = list(limited([pa.table({"x": [1, 2, 3]}), pa.table({"x": [4]})], 2))
    assert [t.column(0).to_pylist() for t in out] == [[1, 2]]


def test_limited_sources_opens_each_with_the_rows_still_wanted():
    opened: list[int | None] = []

    def source(start: int, rows: int):
        def open_source(remaining: int | None):
            opened.append(remaining)
            return [_batch(start, rows)]  # answers more than asked: still cut
        return open_source

    out = list(limited_sources([source(0, 2), source(2, 4), source(6, 9)], 4))
    assert pa.Table.from_batches(out).column(0).to_pylist() == [0, 1, 2, 3]
    assert opened == [4, 2]  # the third source is never opened


def test_limited_sources_without_a_limit_reads_every_source():
    opened: list[int | None] = []

    def open_source(remaining: int | None):
        opened.append(remaining)
        return [_batch(0, 2)]

    assert sum(b.num_rows for b in limited_sources([open_source, open_source], None)) == 4
    assert opened == [None, None]
