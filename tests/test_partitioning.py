"""Partition values, names, row routing and pruning (flightstore/partitioning.py), and the property
that pruning never changes an answer: for random predicates over partition and other columns, the
pruned scan (storage and SQL) equals the unpruned scan filtered."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightstore.errors import InvalidInput
from flightstore.expressions import And, Comparison, In, IsNotNull, IsNull, Not, Or, Predicate
from flightstore.partitioning import (
    Partition,
    bucket_id,
    check_partition_type,
    flink_name,
    partition_values,
    prune,
    row_partition_names,
    split_bucket_id,
)
from flightstore.sql.execute import Executor
from flightstore.store import Store

SCHEMA = pa.schema([pa.field("day", pa.date32(), False), pa.field("region", pa.string(), False),
                    pa.field("hour", pa.int32(), False), pa.field("v", pa.int64())])
KEYS = ("day", "region", "hour")


def test_canonical_values_and_names():
    assert partition_values(KEYS, SCHEMA, {"DAY": dt.date(2026, 11, 23), "region": "eu", "hour": 7},
                            "t") == ("2026-11-23", "eu", "7")
    assert partition_values(KEYS, SCHEMA, {"day": "2026-11-23", "region": "eu", "hour": -3.0},
                            "t") == ("2026-11-23", "eu", "-3")
    assert flink_name(KEYS, ("2026-11-23", "eu", "7")) == "day=2026-11-23/region=eu/hour=7"
    for spec, words in [({"day": "2026-13-01", "region": "eu", "hour": 1}, "not a date"),
                        ({"day": "2026-01-01", "region": "eu", "hour": "x"}, "not an integer"),
                        ({"day": "2026-01-01", "region": "eu", "hour": 2 ** 40}, "does not fit"),
                        ({"day": "2026-01-01", "region": "a$b", "hour": 1}, "separator"),
                        ({"day": "2026-01-01", "region": "", "hour": 1}, "empty"),
                        ({"day": "2026-01-01", "region": None, "hour": 1}, "NULL"),
                        ({"day": "2026-01-01", "hour": 1}, "missing region"),
                        ({"day": "2026-01-01", "region": "eu", "hour": 1, "v": 2}, "not a partition key")]:
        with pytest.raises(InvalidInput, match=words):
            partition_values(KEYS, SCHEMA, spec, "t")
    for arrow_type in (pa.float64(), pa.bool_(), pa.timestamp("ms"), pa.binary(), pa.uint32()):
        with pytest.raises(InvalidInput, match="partition columns must be"):
            check_partition_type("c", arrow_type, "t")


def test_row_names_are_vectorized_and_refuse_bad_values():
    data = pa.table({"day": pa.array([dt.date(2026, 1, 2), dt.date(2026, 1, 3)], pa.date32()),
                     "region": ["eu", "us"], "hour": pa.array([0, 23], pa.int32())})
    assert row_partition_names(data, KEYS, "w").to_pylist() == ["2026-01-02$eu$0", "2026-01-03$us$23"]
    with pytest.raises(InvalidInput, match="'region' must not be NULL"):
        row_partition_names(data.set_column(1, "region", pa.array(["eu", None])), KEYS, "w")
    with pytest.raises(InvalidInput, match="contains '\\$'"):
        row_partition_names(data.set_column(1, "region", pa.array(["eu", "u$s"])), KEYS, "w")
    with pytest.raises(InvalidInput, match="empty string"):
        row_partition_names(data.set_column(1, "region", pa.array(["eu", ""])), KEYS, "w")


def test_bucket_numbers_are_unique_per_partition_and_bucket():
    numbers = {bucket_id(p, b, 3) for p in range(50) for b in range(3)}
    assert len(numbers) == 150
    assert all(split_bucket_id(bucket_id(p, b, 3), 3) == (p, b) for p in range(50) for b in range(3))


PARTITIONS = [Partition(i, "$".join(v), v) for i, v in enumerate([
    ("2026-01-01", "eu", "0"), ("2026-01-01", "us", "12"), ("2026-01-02", "eu", "5"),
    ("2026-01-03", "apac", "23"), ("2026-01-03", "eu", "-1")])]


def _names(predicate: Predicate | None) -> list[str]:
    return [p.name for p in prune(PARTITIONS, KEYS, SCHEMA, predicate)]


def test_prune_is_exact_on_partition_columns_and_conservative_elsewhere():
    day = dt.date(2026, 1, 3)
    assert _names(Comparison("day", "=", day)) == ["2026-01-03$apac$23", "2026-01-03$eu$-1"]
    assert _names(And(Comparison("region", "=", "eu"), Comparison("hour", ">", 0))) == ["2026-01-02$eu$5"]
    assert _names(In("region", ("us", "mars"))) == ["2026-01-01$us$12"]
    assert _names(Not(Comparison("region", "=", "eu"))) == ["2026-01-01$us$12", "2026-01-03$apac$23"]
    assert _names(IsNull("region")) == []  # partition values are never NULL
    assert len(_names(Comparison("v", "=", 1))) == 5  # not a partition column: might match anywhere
    assert len(_names(Or(Comparison("hour", "=", 5), Comparison("v", "=", 1)))) == 5
    assert _names(And(Comparison("hour", "=", 5), Comparison("v", "=", 1))) == ["2026-01-02$eu$5"]
    assert len(_names(Not(And(Comparison("hour", "=", 5), Comparison("v", "=", 1))))) == 5
    assert _names(None) == sorted(p.name for p in PARTITIONS)


# ---- the property: pruning never changes the answer --------------------------------------------------

DAYS = [dt.date(2026, 1, d) for d in (1, 2, 3, 4)]
REGIONS = ["eu", "us", "apac"]
HOURS = [-1, 0, 5, 12, 23]


def _leaf() -> st.SearchStrategy[Predicate]:
    ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
    return st.one_of(
        st.builds(Comparison, st.just("day"), ops, st.sampled_from(DAYS + [dt.date(2025, 12, 31)])),
        st.builds(Comparison, st.just("region"), ops, st.sampled_from(REGIONS + ["a", "zz"])),
        st.builds(Comparison, st.just("hour"), ops, st.sampled_from(HOURS + [3, 99])),
        st.builds(Comparison, st.just("v"), ops, st.integers(-5, 60)),
        st.builds(In, st.just("region"), st.lists(st.sampled_from(REGIONS + ["x"]), min_size=1, max_size=3)
                  .map(tuple)),
        st.builds(In, st.just("hour"), st.lists(st.sampled_from(HOURS), min_size=1, max_size=3).map(tuple)),
        st.builds(IsNull, st.sampled_from(["v", "region"])),
        st.builds(IsNotNull, st.sampled_from(["v", "hour"])),
    )


PREDICATES = st.recursive(_leaf(), lambda inner: st.one_of(
    st.builds(And, inner, inner), st.builds(Or, inner, inner), st.builds(Not, inner)), max_leaves=6)


def _sql_value(value) -> str:
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _sql(predicate: Predicate) -> str:
    if isinstance(predicate, Comparison):
        op = "<>" if predicate.op == "!=" else predicate.op
        return f"{predicate.column} {op} {_sql_value(predicate.value)}"
    if isinstance(predicate, In):
        return f"{predicate.column} IN ({', '.join(_sql_value(v) for v in predicate.values)})"
    if isinstance(predicate, IsNull):
        return f"{predicate.column} IS NULL"
    if isinstance(predicate, IsNotNull):
        return f"{predicate.column} IS NOT NULL"
    if isinstance(predicate, (And, Or)):
        word = "AND" if isinstance(predicate, And) else "OR"
        return f"({_sql(predicate.left)} {word} {_sql(predicate.right)})"
    return f"(NOT {_sql(predicate.child)})"


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A log table and a primary-key table over the same rows in 4 x 3 x 5 partitions."""
    rows = [{"day": d, "region": r, "hour": h, "v": (i * 7) % 61 if i % 9 else None}
            for i, (d, r, h) in enumerate((d, r, h) for d in DAYS for r in REGIONS for h in HOURS)
            if (i % 4) != 3]  # some combinations stay without partition
    data = pa.Table.from_pylist(rows * 2, schema=SCHEMA)
    data = data.append_column("id", pa.array(range(data.num_rows), pa.int64()))
    store = Store(tmp_path_factory.mktemp("prune") / "data")
    schema = SCHEMA.append(pa.field("id", pa.int64(), False))
    log = store.create_table("default.lg", schema, partition_keys=KEYS, options={"bucket.num": "2"})
    log.append(data)
    pk = store.create_table("default.pk", schema, primary_key=("day", "region", "hour", "id"),
                            partition_keys=KEYS, options={"bucket.num": "3"})
    pk.upsert(data)
    yield store, data
    store.close()


def _sorted(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(predicate=PREDICATES)
def test_pruned_answers_equal_the_unpruned_scan_filtered(filled, predicate):
    store, data = filled
    bound = predicate.bind(data.schema)
    expected = _sorted(data.filter(bound.to_arrow()))
    executor = Executor(store)
    for name in ("lg", "pk"):
        table = store.table(f"default.{name}")
        full = table.scan_table()  # every partition, nothing pruned
        assert _sorted(full.filter(bound.to_arrow())) == expected
        assert _sorted(table.scan_table(filter=bound)) == expected  # storage prunes by the filter
        kept = {p.name for p in prune(table.descriptor.partitions, KEYS, table.schema, bound)}
        for partition in table.descriptor.partitions:  # a pruned partition holds no matching row
            if partition.name not in kept:
                rows = pa.Table.from_batches(list(table.scan(buckets=table.bucket_ids([partition.name]))),
                                             schema=table.schema)
                assert rows.num_rows > 0 and rows.filter(bound.to_arrow()).num_rows == 0
        plan = executor.plan(f"SELECT day, region, hour, v, id FROM {name} WHERE {_sql(predicate)}")
        assert set(getattr(plan, "partitions", None) or ()) <= {p.name for p in table.descriptor.partitions}
        assert _sorted(executor.execute_table(plan)) == expected, plan.explain()
