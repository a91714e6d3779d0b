"""The delta join's lookup caches (FLIP-486): with updates on both sides, the sink equals the batch
join after draining, caches on (tiny, so entries are evicted) and off, left and inner join.

The tasks run the pipeline's own code (``DeltaJoin.apply_task``, the caches, the batched lookups)
against a real server; what Spark adds is the scheduling, which is simulated faithfully: the
changelog is read in micro-batches while the tables have already moved on (lookups see newer rows
than the stream), each micro-batch's changes are sharded by the join key, and every shard's task
runs in one of two workers drawn at random, each with its own caches; the driver's owner map goes
from one micro-batch to the next as in ``DeltaJoin.foreach_batch``.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flightstore_spark.pipelines.delta_join import DeltaJoin
from flightstore_spark.pipelines.join_cache import CacheRegistry, CacheSettings, LookupCache
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from flightstore.client import connect

pytestmark = pytest.mark.slow

_names = itertools.count()

KEYS = st.integers(0, 3)
LEFT_OP = st.tuples(st.just("L"), KEYS, st.integers(0, 2), st.one_of(st.none(), st.integers(0, 99)))
RIGHT_OP = st.tuples(st.just("R"), KEYS, st.just(0), st.one_of(st.none(), st.integers(0, 99)))
ROUND = st.tuples(st.lists(st.one_of(LEFT_OP, RIGHT_OP), min_size=1, max_size=8),  # None: delete
                  st.floats(0, 1),  # how much of the pending changelog the round's micro-batch reads
                  st.lists(st.sampled_from("AB"), min_size=2, max_size=2))  # worker of each shard


def _create(conn, n: int) -> tuple[str, str, str]:
    left, right, sink = f"l{n}", f"r{n}", f"s{n}"
    conn.sql(f"CREATE TABLE {left} (k BIGINT, id BIGINT, a BIGINT, PRIMARY KEY (k, id) NOT ENFORCED) "
             "WITH ('bucket.num' = '2', 'bucket.key' = 'k')")
    conn.sql(f"CREATE TABLE {right} (k BIGINT, b BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2')")
    conn.sql(f"CREATE TABLE {sink} (k BIGINT, id BIGINT, a BIGINT, b BIGINT, PRIMARY KEY (k, id) NOT ENFORCED) "
             "WITH ('bucket.num' = '2', 'bucket.key' = 'k')")
    return left, right, sink


def _write(conn, left: str, right: str, ops) -> None:
    for side, k, id_, value in ops:
        if side == "L":
            table = conn.table(left)
            if value is None:
                table.delete({"k": [k], "id": [id_]})
            else:
                table.upsert({"k": [k], "id": [id_], "a": [value]})
        else:
            table = conn.table(right)
            if value is None:
                table.delete({"k": [k]})
            else:
                table.upsert({"k": [k], "b": [value]})


def _changes(conn, join: DeltaJoin, starts: dict, fraction: float) -> pa.Table:
    """The next micro-batch of both changelogs (``fraction`` of what is pending per bucket) as the
    streaming query hands it to ``foreach_batch``, advancing ``starts``."""
    parts = []
    for side, table, columns in (("L", join.left, join.left_columns), ("R", join.right, join.key + join.right_columns)):
        ends = conn.table(table).offsets("end")
        begin = starts.setdefault(table, conn.table(table).offsets("start"))
        until = {b: begin[b] + round((ends[b] - begin[b]) * fraction) for b in ends}
        moved = {b: o for b, o in until.items() if o > begin[b]}
        if moved:
            wanted = columns + ["_change_type", "_log_offset"]
            with conn.table(table).subscribe({b: begin[b] for b in moved}, columns=wanted, until=moved) as stream:
                batches = [b for b in stream if b.num_rows]
            if batches:
                rows = pa.Table.from_batches(batches)
                rows = rows.append_column("_side", pa.array([side] * rows.num_rows))
                parts.append(rows)
        starts[table] = {**begin, **until}
    if not parts:
        return pa.table({})
    wide = pa.concat_tables(parts, promote_options="default")
    # a shard per key, as Spark's pmod(hash(key), shards): any fixed function of the key will do
    shard = pc.bit_wise_and(wide.column("k"), pa.scalar(1, pa.int64()))
    return wide.append_column("_shard", pc.cast(shard, pa.int32()))


def _run_batch(join: DeltaJoin, changes: pa.Table, batch: int, owners: dict, workers: dict, placement) -> None:
    if changes.num_rows == 0:
        return
    for shard in sorted(set(changes.column("_shard").to_pylist())):
        worker = workers[placement[shard]]
        task_rows = changes.filter(pc.equal(changes.column("_shard"), shard))
        task_rows = task_rows.sort_by([("_side", "ascending"), ("_log_offset", "ascending")])
        for result in join.apply_task(iter(task_rows.to_batches()), f"t-{batch}", "run", dict(owners), worker):
            for row in result.to_pylist():
                owners[row["shard"]] = row["worker"]  # the driver's map after the micro-batch


def _batch_join(conn, join: DeltaJoin) -> list[tuple]:
    right = {r["k"]: r["b"] for r in conn.table(join.right).scan().to_pylist()}
    rows = []
    for r in conn.table(join.left).scan().to_pylist():
        if join.join_type == "inner" and r["k"] not in right:
            continue
        rows.append((r["k"], r["id"], r["a"], right.get(r["k"])))
    return sorted(rows)


def _sink(conn, sink: str) -> list[tuple]:
    return sorted((r["k"], r["id"], r["a"], r["b"]) for r in conn.table(sink).scan().to_pylist())


CACHES = [CacheSettings(False), CacheSettings(True, 1, 2), CacheSettings()]


@pytest.mark.parametrize("join_type", ["left", "inner"])
@pytest.mark.parametrize("cache", CACHES, ids=["off", "tiny", "default"])
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking:
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # 3 tables an example
@given(rounds=st.lists(ROUND, min_size=1, max_size=5))
def test_sink_equals_batch_join_after_draining(server, join_type, cache, rounds):
    conn = connect(server.uri)
    left, right, sink = _create(conn, next(_names))
    join = DeltaJoin.resolve(server.uri, left, right, sink, ["k"], join_type=join_type, cache=cache)
    workers = {"A": CacheRegistry("worker-a"), "B": CacheRegistry("worker-b")}
    owners: dict[int, str] = {}
    starts: dict = {}
    for batch, (ops, fraction, placement) in enumerate(rounds):
        _write(conn, left, right, ops)
        _run_batch(join, _changes(conn, join, starts, fraction), batch, owners, workers, placement)
    _run_batch(join, _changes(conn, join, starts, 1.0), len(rounds), owners, workers, ["B", "A"])  # drain
    assert _sink(conn, sink) == _batch_join(conn, join)
    conn.close()


def test_lookup_cache_evicts_the_least_recently_used_and_follows_changes():
    cache = LookupCache(["k"], ["k", "id"], capacity=2)
    cache.fill(pa.table({"k": [1, 2]}), pa.table({"k": [1, 1, 2], "id": [10, 11, 20]}))
    hit, missed = cache.split(pa.table({"k": [1, 3]}))
    assert hit.column("k").to_pylist() == [1] and missed.column("k").to_pylist() == [3]
    cache.fill(pa.table({"k": [3]}), pa.table({"k": [3], "id": [30]}))  # 2 was used least recently
    assert sorted(cache.entries.column("k").to_pylist()) == [1, 3]
    assert sorted(cache.rows.column("id").to_pylist()) == [10, 11, 30]
    cache.replace_rows(pa.table({"k": [1, 2], "id": [12, 21]}))  # 2 is not cached: stays uncached
    cache.remove_rows(pa.table({"k": [1], "id": [10]}))
    assert sorted(cache.rows_for(pa.table({"k": [1]})).column("id").to_pylist()) == [11, 12]
    assert cache.rows_for(pa.table({"k": [2]})).num_rows == 0
    assert (cache.hits, cache.misses) == (1, 1)


def test_a_worker_drops_a_shard_another_worker_changed_since():
    settings_ = CacheSettings(True, 5, 5)
    a, b = CacheRegistry("a"), CacheRegistry("b")
    first = a.shard("run", 0, None, ["k"], ["k", "id"], settings_)
    first.right.fill(pa.table({"k": [1]}), pa.table({"k": [1], "b": [7]}))
    assert a.shard("run", 0, "a", ["k"], ["k", "id"], settings_) is first and len(first.right) == 1
    assert len(a.shard("run", 0, "b", ["k"], ["k", "id"], settings_).right) == 0  # b applied changes since
    assert a.shard("run", 0, "a", ["k"], ["k", "id"], CacheSettings(False)) is None
    with pytest.raises(ValueError, match="positive"):
        CacheSettings(True, 0, 10)
    assert b.token == "b"
