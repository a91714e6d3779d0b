"""Partitioned tables in the embedded store (flightstore/partitioned.py): rows routed by partition
then bucket, reads unioned over partitions, table-wide bucket numbers, one intent for a write
spanning partitions, writer sequences and undo across partitions, partition directories that follow
the catalog, and subscriptions that pick up partitions created while they run."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pyarrow as pa
import pytest

from flightstore import changetype
from flightstore.alter import AddPartition, DropPartition
from flightstore.errors import InvalidInput, PartitionNotFound
from flightstore.partitioned import PartitionedTable, partition_directory
from flightstore.store import Store
from tests.waiting import wait_until

SCHEMA = pa.schema([("dt", pa.string()), ("user", pa.int64()), ("item", pa.int64()), ("qty", pa.int64())])


@pytest.fixture
def pk(store):
    return store.create_table("default.orders", SCHEMA, primary_key=["dt", "user", "item"],
                              partition_keys=["dt"],
                              options={"bucket.num": "3", "bucket.key": "user",
                                       "table.changelog.image": "FULL"})


def _rows(table) -> list[dict]:
    return sorted(table.scan_table().to_pylist(), key=lambda r: (r["dt"], r["user"], r["item"]))


def test_rows_route_by_partition_then_bucket_and_reads_union(store, pk):
    result = pk.upsert({"dt": ["a", "b", "a", "c"], "user": [1, 1, 2, 1], "item": [1, 1, 1, 2],
                        "qty": [5, 6, 7, 8]})
    assert isinstance(pk, PartitionedTable) and sorted(p.name for p in pk.descriptor.partitions) == ["a", "b", "c"]
    assert set(result) <= set(pk.bucket_ids()) and len(pk.bucket_ids()) == 9
    assert pk.row_count() == 4 and pk.row_count(["a"]) == 2
    keys = {"dt": ["c", "zz", "a", "b", "a"], "user": [1, 1, 2, 1, 9], "item": [2, 1, 1, 1, 9]}
    assert pk.lookup(keys, ["dt", "qty"]).to_pylist() == [  # key order, missing keys dropped
        {"dt": "c", "qty": 8}, {"dt": "a", "qty": 7}, {"dt": "b", "qty": 6}]
    assert pk.prefix_lookup({"dt": ["a"], "user": [1]}).to_pylist() == [
        {"dt": "a", "user": 1, "item": 1, "qty": 5}]
    with pytest.raises(InvalidInput, match="partition key column"):
        pk.prefix_lookup({"user": [1]})
    partition_a = pk.descriptor.partition("a").id
    assert {b // 3 for b, o in pk.end_offsets().items() if o} == {p.id for p in pk.descriptor.partitions}
    only_a = [r for b in pk.bucket_ids(["a"]) for batch in pk.scan(buckets=[b]) for r in batch.to_pylist()]
    assert sorted(r["qty"] for r in only_a) == [5, 7] and all(b // 3 == partition_a for b in pk.bucket_ids(["a"]))
    changes = [r for b in pk.bucket_ids() for batch in pk.read_changelog(b) for r in batch.to_pylist()]
    assert sorted(r["qty"] for r in changes) == [5, 6, 7, 8] and {r["_change_type"] for r in changes} == {"+I"}


def test_a_retried_write_spanning_partitions_applies_once_and_undo_spans_them(pk):
    data = {"dt": ["a", "b", "c"], "user": [1, 2, 3], "item": [1, 1, 1], "qty": [1, 1, 1]}
    pk.upsert(data, writer_id="job", sequence=0)
    bump = {**data, "qty": [2, 2, 2]}
    pk.upsert(bump, writer_id="job", sequence=1)
    assert pk.upsert(bump, writer_id="job", sequence=1).duplicate  # the retry of an applied batch
    pk.upsert({**data, "qty": [3, 3, 3]}, writer_id="job", sequence=2)
    assert [r["qty"] for r in _rows(pk)] == [3, 3, 3] and pk.writer_sequence("job") == 2
    with pytest.raises(Exception, match="batches in between were lost"):
        pk.upsert(bump, writer_id="job", sequence=9)
    assert pk.undo("job", 0) > 0  # back to the checkpoint after batch 0, in every partition
    assert [r["qty"] for r in _rows(pk)] == [1, 1, 1] and pk.writer_sequence("job") == 0
    pk.upsert(bump, writer_id="job", sequence=1)  # the replay is accepted again
    assert [r["qty"] for r in _rows(pk)] == [2, 2, 2]


def test_an_interrupted_write_spanning_partitions_completes_on_open(tmp_path):
    with Store(tmp_path / "data") as store:
        table = store.create_table("default.ev", SCHEMA, partition_keys=["dt"], options={"bucket.num": "2"})
        table.append({"dt": ["a", "b"], "user": [0, 0], "item": [0, 0], "qty": [0, 0]})
        # What a crash between the two partitions leaves: the intent begun, partition a applied.
        record = pa.table({"dt": ["a", "b", "b"], "user": [1, 2, 3], "item": [1, 1, 1], "qty": [1, 1, 1]})
        table._intents.begin({"target": None, "overwrite": False, "kv": False, "writer_id": "w",
                              "sequence": 0}, record)
        unit = table.units[table.descriptor.partition("a").id]
        unit.logs[int(unit.buckets_of(record.slice(0, 1))[0])].append(record.slice(0, 1), writer_id="w",
                                                                      sequence=0)
    with Store(tmp_path / "data") as store:
        table = store.table("default.ev")
        assert sorted(r["user"] for r in table.scan_table().to_pylist()) == [0, 0, 1, 2, 3]  # once each
        assert table.writer_sequence("w") == 0


def test_partition_directories_follow_the_catalog(tmp_path):
    with Store(tmp_path / "data") as store:
        table = store.create_table("default.ev", SCHEMA, partition_keys=["dt"])
        table.append({"dt": ["a", "b"], "user": [1, 2], "item": [1, 1], "qty": [1, 1]})
        directory = table.directory
        b_dir = partition_directory(directory, table.descriptor.partition("b").id)
        assert b_dir.is_dir()
        store.alter_table("default.ev", [DropPartition(("b",))])
        assert not b_dir.exists()  # dropped: gone at once
        assert [r["dt"] for r in table.scan_table().to_pylist()] == ["a"]
        store.alter_table("default.ev", [AddPartition(("b",))])  # a new partition, a new id and directory
        assert table.descriptor.partition("b").id == 2 and table.scan_table(["dt"]).num_rows == 1
        a_dir = partition_directory(directory, table.descriptor.partition("a").id)
    shutil.copytree(a_dir, partition_directory(directory, 7))  # a crash between a drop's commit and rmtree
    with Store(tmp_path / "data") as store:
        table = store.table("default.ev")
        assert not partition_directory(directory, 7).exists()  # swept when the table opens
        assert table.scan_table(["dt"]).to_pylist() == [{"dt": "a"}]
        store.alter_table("default.ev", [DropPartition(("a",))])
    with Store(tmp_path / "data") as store:  # dropped while the table was not open
        assert not a_dir.exists()


def test_a_live_subscription_reads_partitions_created_after_it_started(store):
    table = store.create_table("default.ev", SCHEMA, partition_keys=["dt"], options={"bucket.num": "2",
                                                                                        "bucket.key": "user"})
    table.append({"dt": ["a"], "user": [1], "item": [1], "qty": [1]})
    stop = threading.Event()
    seen: list = []

    def follow() -> None:
        for batch in table.subscribe("latest", stop=stop, heartbeat_s=None):
            seen.extend(batch.to_pylist())

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        table.append({"dt": ["a", "new"], "user": [2, 3], "item": [1, 1], "qty": [2, 3]})
        store.alter_table("default.ev", [DropPartition(("a",))])
        table.append({"dt": ["newer"], "user": [4], "item": [1], "qty": [4]})
        wait_until(lambda: {r["user"] for r in seen} >= {3, 4}, "rows of partitions created while subscribed")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert {r["dt"] for r in seen if r["user"] in (3, 4)} == {"new", "newer"}
    assert all(r[changetype.CHANGE_TYPE_COLUMN] == "+A" for r in seen)


def test_a_subscription_goes_on_past_a_partition_dropped_during_its_pass(store):
    """A pass over the partitions' logs that reaches a partition dropped since the pass began (its
    log closed) skips it, and the subscription reads the other partitions on: the race above, made
    deterministic by pausing the stream inside a pass."""
    table = store.create_table("default.ev", SCHEMA, partition_keys=["dt"], options={"bucket.num": "1"})
    table.append({"dt": ["first"], "user": [1], "item": [1], "qty": [1]})  # the pass reads it first
    table.append({"dt": ["dropped"], "user": [2], "item": [1], "qty": [2]})
    stream = table.subscribe("earliest", heartbeat_s=None)
    assert [r["user"] for r in next(stream).to_pylist()] == [1]  # paused inside the pass
    store.alter_table("default.ev", [DropPartition(("dropped",))])
    table.append({"dt": ["later"], "user": [3], "item": [1], "qty": [3]})
    assert [r["user"] for r in next(stream).to_pylist()] == [3]
    stream.close()


def test_writes_outside_the_limits_or_without_partitions_change_nothing(tmp_path):
    with Store(tmp_path / "data", options={"max.partition.num": "2"}) as store:
        table = store.create_table("default.ev", SCHEMA, partition_keys=["dt"])
        table.append({"dt": ["a"], "user": [1], "item": [1], "qty": [1]})
        before = (store.catalog.version, table.end_offsets())
        with pytest.raises(InvalidInput, match="max.partition.num"):
            table.append({"dt": ["a", "b", "c"], "user": [2, 3, 4], "item": [1, 1, 1], "qty": [1, 1, 1]})
        with pytest.raises(InvalidInput, match="must not be null"):
            table.append({"dt": ["a", None], "user": [2, 3], "item": [1, 1], "qty": [1, 1]})
        assert (store.catalog.version, table.end_offsets()) == before
    with Store(tmp_path / "data", options={"client.writer.dynamic-create-partition.enabled": "false"}) as store:
        table = store.table("default.ev")
        with pytest.raises(PartitionNotFound, match="dynamic partition creation is off"):
            table.append({"dt": ["a", "b"], "user": [2, 3], "item": [1, 1], "qty": [1, 1]})
        assert table.row_count() == 1
        assert np.array_equal(sorted(table.end_offsets()), sorted(table.bucket_ids()))


def test_a_partition_dropped_between_its_creation_and_the_write_is_created_again(store):
    table = store.create_table("default.ev", SCHEMA, partition_keys=["dt"])
    create = table._create_partitions
    calls: list = []

    def create_then_lose(path, values):  # retention dropping the new partition at the worst moment
        create(path, values)
        calls.append(values)
        if len(calls) == 1:
            store.alter_table(path, [DropPartition(v) for v in values])

    table._create_partitions = create_then_lose
    table.append({"dt": ["x", "y"], "user": [1, 2], "item": [1, 1], "qty": [1, 1]})
    assert len(calls) == 2 and sorted(r["dt"] for r in table.scan_table(["dt"]).to_pylist()) == ["x", "y"]

    def always_lose(path, values):
        create(path, values)
        store.alter_table(path, [DropPartition(v) for v in values])

    table._create_partitions = always_lose
    with pytest.raises(PartitionNotFound, match="dropped 3 times while the write ran; nothing was written"):
        table.append({"dt": ["z"], "user": [3], "item": [1], "qty": [1]})
    assert table.row_count() == 2


def test_verify_and_repair_see_every_partition_bucket(tmp_path):
    from flightstore.maintenance import repair, verify
    with Store(tmp_path / "data") as store:
        table = store.create_table("default.pk", SCHEMA, primary_key=["dt", "user", "item"],
                                   partition_keys=["dt"], options={"bucket.num": "2"})
        table.upsert({"dt": ["a", "b"], "user": [1, 2], "item": [1, 1], "qty": [1, 1]})
        store.close()
    with Store(tmp_path / "data") as store:  # added while the table is not open: no directory yet
        store.alter_table("default.pk", [AddPartition(("c",))])
    report = verify(tmp_path / "data")
    assert report.ok, report.findings
    labels = {f.where for f in report.findings}
    assert "table default.pk partition c bucket 0" in labels  # the warning: no directory yet
    assert repair(tmp_path / "data").ok
    with Store(tmp_path / "data") as store:
        assert store.table("default.pk").row_count() == 2
    assert all(f.severity == "note" for f in verify(tmp_path / "data").findings)

