"""The stream writer's fold of an aggregation table's rows (one row per key before the DoPut):
numpy for integer and floating-point fields, the same answer as Arrow's hash aggregation (nulls
skipped, all-null keys null, overflow of the field's type refused), and no Acero in the worker
(``Table.group_by`` imports ``pyarrow.dataset``, which imports pandas: seconds per fresh worker)
and no pandas at all on the writer's path (pyarrow imports it at its first numpy conversion)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from flightstore_spark.arrays import from_numpy, to_numpy, valid_mask
from flightstore_spark.writer import _fold_hash, fold_aggregation
from hypothesis import given, settings
from hypothesis import strategies as st

from flightstore.client import connect

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64()]


def _rows(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), rows=st.integers(2, 60), two_keys=st.booleans(),
       kinds=st.tuples(st.sampled_from(TYPES), st.sampled_from(TYPES)),
       functions=st.tuples(st.sampled_from(["sum", "max", "min"]), st.sampled_from(["sum", "max", "min"])))
def test_numpy_fold_equals_arrows_hash_aggregation(data, rows, two_keys, kinds, functions):
    columns = {"k": pa.array(data.draw(st.lists(st.integers(0, 5), min_size=rows, max_size=rows)), pa.int64())}
    if two_keys:
        columns["s"] = pa.array(data.draw(st.lists(st.sampled_from(["a", "b"]), min_size=rows, max_size=rows)))
    for name, kind in zip(("x", "y"), kinds):
        small = st.integers(-20, 20) if pa.types.is_signed_integer(kind) or pa.types.is_floating(kind) \
            else st.integers(0, 20)
        values = data.draw(st.lists(st.one_of(st.none(), small), min_size=rows, max_size=rows))
        columns[name] = pa.array(values, kind)
    table = pa.table(columns)
    key = ["k", "s"] if two_keys else ["k"]
    folded = fold_aggregation(table, key, dict(zip(("x", "y"), functions)))
    expected = _fold_hash(table, key, ["x", "y"], dict(zip(("x", "y"), functions)))
    assert folded.schema == table.schema
    assert _rows(folded) == _rows(expected)


def test_nulls_are_skipped_and_an_all_null_key_folds_to_null():
    table = pa.table({"k": [1, 1, 2, 2, 1], "c": pa.array([3, None, None, None, 4], pa.int64()),
                      "m": pa.array([1.5, None, None, 2.5, -1.0])})
    folded = fold_aggregation(table, ["k"], {"c": "sum", "m": "max"})
    assert _rows(folded) == [(1, 7, 1.5), (2, None, 2.5)]


def test_a_sum_past_the_fields_type_is_refused_as_before():
    table = pa.table({"k": [1, 1], "c": pa.array([100, 100], pa.int8())})
    with pytest.raises(pa.ArrowInvalid):
        fold_aggregation(table, ["k"], {"c": "sum"})


def test_nan_under_max_and_other_types_fold_with_arrow():
    table = pa.table({"k": [1, 1, 1], "m": pa.array([1.0, float("nan"), 2.0]),
                      "d": pa.array([1, 2, 3], pa.decimal128(5, 0))})
    assert _rows(fold_aggregation(table, ["k"], {"m": "max", "d": "sum"})) == _rows(
        _fold_hash(table, ["k"], ["m", "d"], {"m": "max", "d": "sum"}))


def test_the_numpy_fold_does_not_import_acero():
    code = ("import sys, numpy as np, pyarrow as pa\n"
            "from flightstore_spark.writer import fold_aggregation\n"
            "t = pa.table({'k': np.arange(1000) % 7, 'c': np.ones(1000, np.int64), 'a': np.ones(1000)})\n"
            "assert fold_aggregation(t, ['k'], {'c': 'sum', 'a': 'max'}).num_rows == 7\n"
            "print('pyarrow.acero' in sys.modules, 'pyarrow.dataset' in sys.modules)\n")
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert answer.stdout.split() == ["False", "False"]


def test_a_large_fold_counts_every_event():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 1000, 50_000)
    folded = fold_aggregation(pa.table({"k": keys, "c": np.ones(50_000, np.int64)}), ["k"], {"c": "sum"})
    counts = np.bincount(keys, minlength=1000)
    assert dict(zip(folded.column("k").to_pylist(), folded.column("c").to_pylist())) == \
        {k: int(c) for k, c in enumerate(counts) if c}


def test_the_writers_fold_and_put_do_not_import_pandas(tmp_path, server):
    """pyarrow imports pandas at its first numpy or Python-object conversion: about half a second
    of CPU in each fresh Spark Python worker that writes an aggregation table's micro-batch."""
    conn = connect(server.uri)
    conn.sql("CREATE TABLE fold_no_pandas (k BIGINT, s STRING, c BIGINT, a DOUBLE, "
             "PRIMARY KEY (k, s) NOT ENFORCED) WITH ('bucket.num' = '2', 'table.merge-engine' = 'aggregation', "
             "'fields.c.agg' = 'sum', 'fields.a.agg' = 'max')")
    rows = pa.table({"k": np.arange(1000) % 7, "s": pa.array(["x", "y"] * 500),
                     "c": pa.array([None if i % 5 == 0 else 1 for i in range(1000)], pa.int64()),
                     "a": np.arange(1000, dtype=np.float64)}).slice(3)  # offsets into the buffers too
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_stream(sink, rows.schema) as out:
        out.write_table(rows)
    code = ("import sys, pyarrow as pa\n"
            "from flightstore_spark.writer import FlightstoreStreamWriter\n"
            f"rows = pa.ipc.open_stream(pa.OSFile({str(tmp_path / 'rows.arrow')!r})).read_all()\n"
            f"writer = FlightstoreStreamWriter({{'uri': {server.uri!r}, 'table': 'fold_no_pandas'}}, None, False)\n"
            "with writer.options.connect() as conn:\n"
            "    print(writer._send(conn, rows, 'w-no-pandas', 0, check_applied=True)['rows'])\n"
            "print('pandas' in sys.modules)\n")
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.split() == ["14", "False"]
    stored = conn.sql("SELECT k, s, c, a FROM fold_no_pandas")
    expected = _fold_hash(rows, ["k", "s"], ["c", "a"], {"c": "sum", "a": "max"})
    assert _rows(stored.select(["k", "s", "c", "a"])) == _rows(expected)
    conn.close()


def test_numpy_through_the_buffers_keeps_offsets_and_nulls():
    array = pa.array([5, None, 7, 8, None, 10], pa.int16()).slice(1, 4)
    assert to_numpy(array)[[1, 2]].tolist() == [7, 8]
    assert valid_mask(array).tolist() == [False, True, True, False]
    back = from_numpy(np.array([1.5, 2.5, 3.5]), valid=np.array([True, False, True]))
    assert back.to_pylist() == [1.5, None, 3.5]
    assert from_numpy(to_numpy(array).astype(np.int64)).type == pa.int64()
    with pytest.raises(TypeError):
        to_numpy(pa.array(["a"]))
