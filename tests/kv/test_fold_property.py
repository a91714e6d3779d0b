"""KV == fold(changelog) == a sequential model, for random upserts, partial updates and deletes."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.store import Store
from tests.kv.fold import fold_changelog, kv_contents

SCHEMA = pa.schema([("k", pa.int64()), ("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
VALUE_COLUMNS = ("a", "b", "c")

row = st.fixed_dictionaries({
    "k": st.integers(0, 6),
    "a": st.none() | st.integers(-5, 5),
    "b": st.none() | st.sampled_from(["x", "y", "", "zz\x00"]),
    "c": st.none() | st.floats(-1, 1, allow_nan=False),
})
op = st.tuples(
    st.sampled_from(["upsert", "delete"]),
    st.none() | st.lists(st.sampled_from(VALUE_COLUMNS), min_size=1, max_size=2, unique=True),
    st.lists(row, min_size=1, max_size=8),
)


def apply_model(state: dict, kind: str, columns, rows: list[dict]) -> None:
    for r in rows:
        key = (r["k"],)
        if kind == "upsert":
            if columns is None:
                state[key] = dict(r)
            else:
                current = state.get(key, {"k": r["k"], **{c: None for c in VALUE_COLUMNS}})
                state[key] = {**current, **{c: r[c] for c in columns}}
        elif key in state:
            if columns is None:
                del state[key]
            else:
                current = {**state[key], **{c: None for c in columns}}
                if all(current[c] is None for c in VALUE_COLUMNS):
                    del state[key]
                else:
                    state[key] = current


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=8), buckets=st.sampled_from([1, 3]),
       image=st.sampled_from(["FULL", "WAL"]))
def test_kv_equals_fold_of_changelog_and_model(tmp_path_factory, ops, buckets, image):
    path = tmp_path_factory.mktemp("fold")
    model: dict = {}
    with Store(path) as store:
        table = store.create_table("default.t", SCHEMA, primary_key=["k"],
                                   options={"bucket.num": buckets, "table.changelog.image": image})
        for kind, columns, rows in ops:
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            target = None if columns is None else ["k", *columns]
            if kind == "upsert":
                table.upsert(data.select(target) if target else data, columns=target)
            else:
                table.delete(data.select(target) if target else data, columns=target)
            apply_model(model, kind, columns, rows)
        assert kv_contents(table, ["k"]) == model
        assert fold_changelog(table, ["k"]) == model
        assert table.row_count() == len(model)
    # Reopen: recovery keeps the state; rebuild from the log alone gives the same.
    with Store(path) as store:
        table = store.table("default.t")
        assert kv_contents(table, ["k"]) == model
        for kv in table.kvs:
            kv.rebuild()
        assert kv_contents(table, ["k"]) == model
        assert table.row_count() == len(model)
