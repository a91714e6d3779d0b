"""The aggregation merge engine: every function against a plain Python fold, plus its rules."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, BitMap64

from flightstore import changetype
from flightstore.errors import InvalidInput
from flightstore.kv.merge.aggregation import AggregationMerger
from flightstore.store import Store
from tests.kv.fold import fold_changelog, kv_contents

UP, UB, D = changetype.UPDATE_AFTER, changetype.UPDATE_BEFORE, changetype.DELETE
AGG = {"table.merge-engine": "aggregation"}

# ---- the reference: a sequential fold, one row at a time ------------------------------------------


def _add(v, x, op):
    return x if v is None else op(v, x)


def step(function: str, created: bool, v, kind: int, x, delimiter: str = ","):
    """The field value after one row (``created``: this upsert creates the key)."""
    if kind in (UB, D):
        if x is None:
            return v
        if function == "sum":
            return -x if v is None else v - x
        if function == "product":
            assert v is not None and v % x == 0 if isinstance(v, int) else True
            return v // x if isinstance(v, int) else v / x
        assert function in ("last_value", "last_value_ignore_nulls")
        return None if v == x else v
    if function == "last_value":
        return x
    if function == "first_value":
        return x if created else v
    if x is None:
        return v
    if function == "sum":
        return _add(v, x, lambda a, b: a + b)
    if function == "product":
        return _add(v, x, lambda a, b: a * b)
    if function == "max":
        return _add(v, x, max)
    if function == "min":
        return _add(v, x, min)
    if function == "last_value_ignore_nulls":
        return x
    if function == "first_value_ignore_nulls":
        return x if v is None else v
    if function in ("listagg", "string_agg"):
        return _add(v, x, lambda a, b: a + delimiter + b)
    if function == "bool_and":
        return _add(v, x, lambda a, b: a and b)
    if function == "bool_or":
        return _add(v, x, lambda a, b: a or b)
    if function in ("rbm32", "rbm64"):
        return _add(v, x, lambda a, b: a | b)
    raise AssertionError(function)


def fold(function: str, rows: list[tuple], delimiter: str = ",") -> dict:
    state: dict = {}
    for key, kind, x in rows:
        if kind in (UB, D) and key not in state:
            continue  # a retraction of a key that does not exist yet is dropped
        created = key not in state
        state[key] = step(function, created, state.get(key), kind, x, delimiter)
    return state


# ---- the cases: (function, Arrow type, value strategy, retractable) -----------------------------

def _bitmaps(cls):
    return st.frozensets(st.integers(0, 40), max_size=4).map(lambda s: frozenset(s))


SMALL_INT = st.integers(-20, 20)
CASES = {
    "sum-int64": ("sum", pa.int64(), SMALL_INT),
    "sum-int8": ("sum", pa.int8(), st.integers(-3, 3)),
    "sum-double": ("sum", pa.float64(), SMALL_INT.map(float)),
    "sum-decimal": ("sum", pa.decimal128(12, 2), st.integers(-999, 999).map(lambda i: Decimal(i) / 100)),
    "product-int64": ("product", pa.int64(), st.integers(-3, 3)),
    "product-double": ("product", pa.float64(), st.sampled_from([0.5, 2.0, -1.0, 4.0, 0.25, 0.0])),
    "max-int32": ("max", pa.int32(), SMALL_INT),
    "max-decimal": ("max", pa.decimal128(6, 1), st.integers(-99, 99).map(lambda i: Decimal(i) / 10)),
    "min-time": ("min", pa.time64("us"), st.times()),
    "max-string": ("max", pa.string(), st.text("abc", max_size=3)),
    "min-timestamp": ("min", pa.timestamp("ms", tz="UTC"),
                      st.integers(0, 10**6).map(lambda i: dt.datetime.fromtimestamp(i, dt.timezone.utc))),
    "min-date": ("min", pa.date32(), st.dates(dt.date(2000, 1, 1), dt.date(2001, 1, 1))),
    "last_value": ("last_value", pa.string(), st.sampled_from(["a", "b", "c"])),
    "last_value_ignore_nulls": ("last_value_ignore_nulls", pa.int64(), st.integers(0, 3)),
    "first_value": ("first_value", pa.int64(), SMALL_INT),
    "first_value_ignore_nulls": ("first_value_ignore_nulls", pa.string(), st.text("xy", max_size=2)),
    "listagg": ("listagg", pa.string(), st.text("ab", max_size=2)),
    "string_agg": ("string_agg", pa.string(), st.text("ab", max_size=2)),
    "bool_and": ("bool_and", pa.bool_(), st.booleans()),
    "bool_or": ("bool_or", pa.bool_(), st.booleans()),
    "rbm32": ("rbm32", pa.binary(), _bitmaps(BitMap)),
    "rbm64": ("rbm64", pa.binary(), _bitmaps(BitMap64)),
}
RETRACTABLE = {"sum", "product", "last_value", "last_value_ignore_nulls"}


def to_arrow(function: str, value):
    if value is None or function not in ("rbm32", "rbm64"):
        return value
    return (BitMap if function == "rbm32" else BitMap64)(value).serialize()


def from_arrow(function: str, value):
    if value is None or function not in ("rbm32", "rbm64"):
        return value
    return frozenset((BitMap if function == "rbm32" else BitMap64).deserialize(value))


@st.composite
def scenarios(draw, case: str):
    """Rows (key, kind, value) with valid retractions, plus batch split points and restarts."""
    function, _, values = CASES[case]
    retracts = function in RETRACTABLE
    contributed: dict[int, list] = {}  # product retracts only values the key holds
    rows = []
    for _ in range(draw(st.integers(0, 24))):
        key = draw(st.integers(0, 4))
        if retracts and draw(st.integers(0, 3)) == 0:
            kind = draw(st.sampled_from([UB, D]))
            if function == "product":
                held = [x for x in contributed.get(key, []) if x not in (None, 0)]
                x = draw(st.sampled_from(held)) if held else None
                if x is not None:
                    contributed[key].remove(x)
            else:
                x = draw(st.none() | values)
        else:
            kind = UP
            x = draw(st.none() | values)
            contributed.setdefault(key, []).append(x)
        rows.append((key, kind, x))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(rows) - 1)), max_size=4)))
    restart_after = draw(st.none() | st.integers(0, len(cuts)))  # reopen the store after that batch
    return rows, cuts, restart_after


def run_case(case: str, rows: list[tuple], cuts: list[int], restart_after: int | None,
             buckets: int = 2) -> None:
    function, arrow_type, _ = CASES[case]
    schema = pa.schema([("k", pa.int64()), ("v", arrow_type)])
    options = {**AGG, "fields.v.agg": function, "bucket.num": buckets}
    root = Path(tempfile.mkdtemp())
    try:
        store = Store(root)
        table = store.create_table("t", schema, primary_key=["k"], options=options)
        for number, (start, end) in enumerate(zip([0] + cuts, cuts + [len(rows)])):
            part = rows[start:end]
            data = pa.table({"k": pa.array([r[0] for r in part], pa.int64()),
                             "v": pa.array([to_arrow(function, r[2]) for r in part], arrow_type)})
            table.write(data, np.array([r[1] for r in part], dtype=np.int8))
            if number == restart_after:
                store.close()
                store = Store(root)
                table = store.table("t")
        stored = {r["k"]: from_arrow(function, r["v"]) for r in table.scan_table().to_pylist()}
        assert stored == fold(function, rows)
        assert kv_contents(table, ["k"]) == fold_changelog(table, ["k"])
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_function_equals_a_sequential_fold(case, data):
    rows, cuts, restart_after = data.draw(scenarios(case))
    run_case(case, rows, cuts, restart_after)


# ---- configuration ----------------------------------------------------------------------------

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("s", pa.string()), ("b", pa.bool_()),
                    ("raw", pa.binary())])


@pytest.mark.parametrize("options, message", [
    ({"fields.s.agg": "sum"}, "'s': aggregate function sum does not support type string"),
    ({"fields.n.agg": "listagg"}, "'n': aggregate function listagg does not support type int64"),
    ({"fields.b.agg": "max"}, "'b': aggregate function max does not support type bool"),
    ({"fields.n.agg": "bool_or"}, "'n': aggregate function bool_or"),
    ({"fields.s.agg": "rbm32"}, "'s': aggregate function rbm32"),
    ({"fields.raw.agg": "product"}, "'raw': aggregate function product"),
    ({"fields.n.agg": "median"}, "unknown aggregate function 'median'"),
    ({"fields.nope.agg": "sum"}, "'nope', which is not a column"),
    ({"fields.nope.listagg.delimiter": ";"}, "'nope', which is not a column"),
    ({"fields.k.agg": "sum"}, "'k' is a primary-key column"),
    ({"fields.s.agg": "listagg", "fields.s.listagg.sep": ";"}, "has no parameter 'sep'"),
    ({"fields.s.listagg.delimiter": ";"}, "but field 's' aggregates with last_value_ignore_nulls"),
])
def test_create_table_refuses_bad_aggregations(store, options, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(")):
        store.create_table("t", SCHEMA, primary_key=["k"], options={**AGG, **options})
    assert "t" not in store.list_tables()


def test_delimiter_parameter_and_default_function(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options={
        **AGG, "fields.s.agg": "listagg", "fields.s.listagg.delimiter": " | ", "fields.n.agg": "sum"})
    table.upsert(pa.table({"k": [1, 1], "n": [1, 2], "s": ["a", None], "b": [True, None],
                           "raw": [b"x", None]}))
    table.upsert(pa.table({"k": [1], "n": [None], "s": ["b"], "b": [None], "raw": [b"y"]}))
    # b and raw have no setting: last_value_ignore_nulls keeps the last non-null value.
    assert table.lookup({"k": [1]}).to_pylist() == [{"k": 1, "n": 3, "s": "a | b", "b": True, "raw": b"y"}]


def test_changelog_is_insert_then_update_pairs(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options={**AGG, "fields.n.agg": "sum"})
    table.upsert(pa.table({"k": [1], "n": [5]}), columns=["k", "n"])
    table.upsert(pa.table({"k": [1, 1], "n": [1, 2]}), columns=["k", "n"])
    table.upsert(pa.table({"k": [1], "n": [None]}), columns=["k", "n"])  # no change, no changelog
    kinds = [(changetype.SHORT_STRINGS[r["_change_type"]], r["n"])
             for log in table.logs for rec in log.read(0)
             for r in pa.Table.from_batches([rec.batch]).to_pylist()]
    assert kinds == [("+I", 5), ("-U", 5), ("+U", 8)]


# ---- retraction ----------------------------------------------------------------------------

RSCHEMA = pa.schema([("k", pa.int64()), ("total", pa.int64()), ("ratio", pa.float64()),
                     ("last", pa.string()), ("top", pa.int64())])
ROPTS = {**AGG, "fields.total.agg": "sum", "fields.ratio.agg": "product", "fields.last.agg": "last_value",
         "fields.top.agg": "max"}


def _write(table, rows, kinds, columns=None):
    data = pa.Table.from_pylist(rows, schema=pa.schema([RSCHEMA.field(c) for c in rows[0]]))
    return table.write(data, np.array(kinds, dtype=np.int8), columns)


def test_retraction_results_for_sum_product_and_last_value(store):
    table = store.create_table("t", RSCHEMA, primary_key=["k"], options=ROPTS)
    cols = ["k", "total", "ratio", "last"]
    _write(table, [{"k": 1, "total": 10, "ratio": 4.0, "last": "a"},
                   {"k": 1, "total": 5, "ratio": 0.5, "last": "b"}], [UP, UP], cols)
    _write(table, [{"k": 1, "total": 5, "ratio": 4.0, "last": "a"}], [UB], cols)  # "a" is not current
    assert table.lookup({"k": [1]}).to_pylist() == [{"k": 1, "total": 10, "ratio": 0.5, "last": "b", "top": None}]
    _write(table, [{"k": 1, "total": 10, "ratio": 0.5, "last": "b"},
                   {"k": 2, "total": 3, "ratio": 2.0, "last": "z"}], [D, D], cols)
    # The fully retracted row stays; the retraction of the missing key 2 is dropped.
    assert table.scan_table().to_pylist() == [{"k": 1, "total": 0, "ratio": 1.0, "last": None, "top": None}]


@pytest.mark.parametrize("function, column_type", [
    ("max", pa.int64()), ("min", pa.string()), ("first_value", pa.int64()),
    ("first_value_ignore_nulls", pa.int64()), ("listagg", pa.string()), ("bool_and", pa.bool_()),
    ("rbm64", pa.binary())])
def test_retraction_refused_for_functions_that_cannot_retract_and_nothing_written(store, function,
                                                                                column_type):
    schema = pa.schema([("k", pa.int64()), ("v", column_type), ("n", pa.int64())])
    table = store.create_table("t", schema, primary_key=["k"],
                               options={**AGG, "fields.v.agg": function, "fields.n.agg": "sum",
                                        "bucket.num": 2})
    table.upsert(pa.table({"k": [1, 2], "n": [1, 1]}), columns=["k", "n"])
    before, offsets = table.scan_table(), table.end_offsets()
    data = pa.table({"k": [3, 1], "v": pa.array([None, None], column_type), "n": [7, 1]})
    with pytest.raises(InvalidInput, match=f"field 'v' aggregates with {function}, which cannot retract"):
        table.write(data, np.array([UP, UB], dtype=np.int8))
    assert table.scan_table().equals(before) and table.end_offsets() == offsets
    # A partial update that leaves the field out may retract the others.
    table.write(data.select(["k", "n"]), np.array([UP, UB], dtype=np.int8), ["k", "n"])
    assert sorted((r["k"], r["n"]) for r in table.scan_table().to_pylist()) == [(1, 0), (2, 1), (3, 7)]


def test_product_refuses_to_retract_zero(store):
    table = store.create_table("t", RSCHEMA, primary_key=["k"], options=ROPTS)
    _write(table, [{"k": 1, "ratio": 0.0}], [UP], ["k", "ratio"])
    before, offsets = table.scan_table(), table.end_offsets()
    with pytest.raises(InvalidInput, match="product cannot retract a zero"):
        _write(table, [{"k": 1, "ratio": 0.0}], [UB], ["k", "ratio"])
    assert table.scan_table().equals(before) and table.end_offsets() == offsets
    merger = table.kvs[0].merger
    assert isinstance(merger, AggregationMerger)
    with pytest.raises(InvalidInput, match="zero"):  # the up-front check, given the batch
        merger.check_write(np.array([UB], np.int8), ("k", "ratio"),
                           pa.Table.from_pylist([{"k": 1, "ratio": 0.0}], schema=RSCHEMA))


def test_delete_behaviors(store):
    ignore = store.create_table("i", RSCHEMA, primary_key=["k"],
                                options={**ROPTS, "table.delete.behavior": "ignore"})
    _write(ignore, [{"k": 1, "total": 2, "top": 9}, {"k": 1, "total": 2, "top": 9}], [UP, UB],
           ["k", "total", "top"])
    assert ignore.lookup({"k": [1]}).to_pylist()[0]["total"] == 2  # the -U was dropped, max allowed
    disable = store.create_table("d", RSCHEMA, primary_key=["k"],
                                 options={**ROPTS, "table.delete.behavior": "disable"})
    with pytest.raises(InvalidInput, match="disables deletes"):
        _write(disable, [{"k": 1, "total": 2}], [D], ["k", "total"])
    assert disable.row_count() == 0
    allow = store.create_table("a", RSCHEMA, primary_key=["k"], options=ROPTS)
    _write(allow, [{"k": 1, "total": 2}, {"k": 1, "total": 2}], [UP, D], ["k", "total"])
    assert allow.lookup({"k": [1]}).to_pylist()[0]["total"] == 0
    with pytest.raises(InvalidInput, match="'top' aggregates with max"):
        allow.delete({"k": [1]})  # a key-only delete retracts every field, max included


def test_partial_updates_aggregate_only_written_fields(store):
    table = store.create_table("t", RSCHEMA, primary_key=["k"], options=ROPTS)
    _write(table, [{"k": 1, "total": 1, "ratio": 2.0, "last": "a", "top": 3}], [UP])
    _write(table, [{"k": 1, "total": 4}, {"k": 2, "total": 1}], [UP, UP], ["k", "total"])
    _write(table, [{"k": 1, "top": 1}], [UP], ["k", "top"])
    assert table.scan_table().to_pylist() == [
        {"k": 1, "total": 5, "ratio": 2.0, "last": "a", "top": 3},
        {"k": 2, "total": 1, "ratio": None, "last": None, "top": None}]


def test_key_only_delete_retracts_nulls_and_bad_bitmaps_are_refused(store):
    table = store.create_table("t", SCHEMA, primary_key=["k"], options={
        **AGG, "fields.n.agg": "sum", "fields.raw.agg": "rbm32", "table.delete.behavior": "allow"})
    table.upsert(pa.table({"k": [1], "n": [4], "raw": [BitMap([1, 2]).serialize()]}), columns=["k", "n", "raw"])
    table.delete(pa.table({"k": [1], "n": pa.array([None], pa.int64())}), columns=["k", "n"])  # retracts null
    assert table.lookup({"k": [1]}).to_pylist()[0]["n"] == 4
    with pytest.raises(InvalidInput, match="not a serialized rbm32 bitmap"):
        table.upsert(pa.table({"k": [1], "raw": [b"junk"]}), columns=["k", "raw"])
    assert set(BitMap.deserialize(table.lookup({"k": [1]}).to_pylist()[0]["raw"])) == {1, 2}
