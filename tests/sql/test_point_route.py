"""The executor's point route (:meth:`Executor.point_key` + :meth:`Executor.point_row`): a point
lookup by an integer primary key whose statement shape was learned is answered from its key
without planning, and exactly as the plan of the statement answers it (rows, NULLs, missing keys,
projections, schema); everything it does not cover is left to the plan."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.sql.execute import Executor, StoreCatalog
from flightstore.sql.plan import plan as plan_sql

KEY_TYPES = {"t8": pa.int8(), "t16": pa.int16(), "t32": pa.int32(), "t64": pa.int64(), "u32": pa.uint32()}
VALUES = [("s", pa.string()), ("d", pa.float64()), ("f", pa.bool_()), ("n", pa.int64())]
ROWS = 50


def _load(store) -> Executor:
    for name, t in KEY_TYPES.items():
        schema = pa.schema([("id", t), *VALUES])
        store.create_table(name, schema, primary_key=["id"], options={"bucket.num": "3"})
        store.table(name).upsert(pa.table({
            "id": pa.array(list(range(ROWS)), t), "s": [None if i % 3 == 0 else f"s{i}" for i in range(ROWS)],
            "d": [None if i % 4 == 0 else i / 4 for i in range(ROWS)],
            "f": [None if i % 5 == 0 else i % 2 == 0 for i in range(ROWS)],
            "n": [None if i % 2 == 0 else -i for i in range(ROWS)]}, schema=schema))
    pair = pa.schema([("g", pa.int32()), ("id", pa.int64()), ("s", pa.string())])
    store.create_table("pair", pair, primary_key=["g", "id"], options={"bucket.num": "2", "bucket.key": "g"})
    store.table("pair").upsert(pa.table({"g": pa.array([i % 4 for i in range(ROWS)], pa.int32()),
                                         "id": list(range(ROWS)), "s": [f"p{i}" for i in range(ROWS)]}, schema=pair))
    return Executor(store)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_point_route_answers_what_the_plan_answers(store, data):
    executor = getattr(store, "_route_executor", None) or _load(store)
    store._route_executor = executor
    name = data.draw(st.sampled_from([*KEY_TYPES, "pair"]))
    columns = data.draw(st.sampled_from(["*", "id", "s, id", "d, f, n"] if name != "pair" else ["*", "s", "id, g"]))
    key = data.draw(st.integers(-130, ROWS + 130))
    def statement(key: int) -> str:
        return f"SELECT {columns} FROM {name} WHERE " + (f"g = {key % 4} AND id = {key}" if name == "pair"
                                                         else f"id = {key}")
    sql = statement(key)
    executor.plan(statement(1))  # the shape is learned (the planner confirms it)
    expected = None
    try:
        expected = executor.execute_table(plan_sql(sql, StoreCatalog(store)))
    except Exception:  # noqa: BLE001 - a key out of its column's range: the planner's error stands
        pass
    found = executor.point_key(sql, None, "default")
    if expected is None:
        assert found is None  # the route never answers what the planner refuses
        return
    assert found is not None
    answer, nbytes = executor.point_row(*found)
    assert nbytes == (sum(b.size for column in expected.columns for chunk in column.chunks
                          for b in chunk.buffers() if b is not None) if expected.num_rows else 0)
    assert answer.schema.equals(expected.schema)
    assert answer.to_pylist() == expected.to_pylist()
    shape = f"SELECT {columns} FROM {name} WHERE " + ("g = ? AND id = ?" if name == "pair" else "id = ?")
    params = [key % 4, key] if name == "pair" else [key]
    executor.plan(shape, [1, 1] if name == "pair" else [1])  # the prepared shape is learned too
    prepared = executor.point_key(shape, params, "default")
    assert executor.point_row(*prepared)[0].to_pylist() == expected.to_pylist()


def test_what_the_route_leaves_to_the_plan(store):
    store.create_table("text", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
    store.create_table("part", pa.schema([("p", pa.int32()), ("id", pa.int64()), ("v", pa.int64())]),
                       primary_key=["p", "id"], partition_keys=["p"])
    store.create_table("kv", pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"])
    store.table("kv").upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}))
    store.table("part").upsert(pa.table({"p": pa.array([1], pa.int32()), "id": [1], "v": [5]}))
    executor = Executor(store)
    executor.plan("SELECT * FROM text WHERE k = 'a'")
    assert executor.point_key("SELECT * FROM text WHERE k = 'b'", None, "default") is None  # not integers
    executor.plan("SELECT * FROM part WHERE p = 1 AND id = 1")
    found = executor.point_key("SELECT * FROM part WHERE p = 1 AND id = 1", None, "default")
    assert found is not None and executor.point_row(*found) is None  # partitioned: the plan reads it
    executor.plan("SELECT * FROM kv WHERE id = 1")
    assert executor.point_key("SELECT * FROM kv WHERE id = 2 AND v = 'b'", None, "default") is None
    assert executor.point_key("SELECT * FROM kv WHERE id = ?", [True], "default") is None
    assert executor.point_key("SELECT * FROM kv WHERE id = ?", [None], "default") is None
    executor.run_statement(executor.plan("ALTER TABLE kv ADD COLUMN w BIGINT"))
    assert executor.point_key("SELECT * FROM kv WHERE id = 2", None, "default") is None  # a new catalog version
    executor.plan("SELECT * FROM kv WHERE id = 1")
    found = executor.point_key("SELECT * FROM kv WHERE id = 2", None, "default")
    assert found is not None and executor.point_row(*found) is None  # a value of the old schema version
    assert executor.execute_table(executor.plan("SELECT * FROM kv WHERE id = 2")).to_pylist() == \
        [{"id": 2, "v": "b", "w": None}]
