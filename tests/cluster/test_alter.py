"""ALTER TABLE and partitions in cluster mode: changes go through the coordinator (applied to the
descriptor it holds) and every member's data directory follows, data kept (each member's own table:
these members serve no Flight calls, so nothing is forwarded between them)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightstore.alter import AddColumns, AddPartition, DropPartition, RenameTable, SetOptions
from flightstore.errors import AlreadyExists, InvalidInput, Unsupported
from flightstore.schema import TablePath
from tests.cluster.test_coordinator import _version

pytestmark = pytest.mark.timeout(300)

SCHEMA = pa.schema([("dt", pa.string()), ("id", pa.int64()), ("v", pa.float64())])


def test_alter_and_partitions_go_through_the_coordinator(members, observer):
    first, second = members.start(1), members.start(2)
    store = second.store  # not the coordinator: its DDL travels to server 1
    assert first.is_coordinator and not second.is_coordinator
    store.create_database("shop")
    store.create_table("shop.ev", SCHEMA, primary_key=["dt", "id"], partition_keys=["dt"],
                       options={"bucket.num": "1"})
    # Writes go to the bucket's leader's own table (in-process members serve no Flight calls).
    leader = observer.wait(lambda v: TablePath("shop", "ev") in v.tables, "the table").tables[
        TablePath("shop", "ev")].buckets[0].leader
    store = {1: first, 2: second}[leader].store
    store.local_table("shop.ev").upsert({"dt": ["d1", "d2"], "id": [1, 2], "v": [1.0, 2.0]})  # creates d1, d2
    store.alter_table("shop.ev", [AddColumns((pa.field("note", pa.string()),)),
                                  SetOptions((("table.auto-partition.num-retention", "3"),))])
    store.local_table("shop.ev").upsert({"dt": ["d1"], "id": [3], "v": [3.0], "note": ["new"]})
    for member in (first, second):  # both catalogs hold the coordinator's descriptor
        descriptor = member.store.catalog.get_table(TablePath("shop", "ev"))
        assert descriptor.schema.names == ["dt", "id", "v", "note"] and descriptor.version == 2
        assert [p.name for p in descriptor.partitions] == ["d1", "d2"]
        assert descriptor.options["table.auto-partition.num-retention"] == "3"
    rows = sorted(store.local_table("shop.ev").scan_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"dt": "d1", "id": 1, "v": 1.0, "note": None}, {"dt": "d2", "id": 2, "v": 2.0, "note": None},
                    {"dt": "d1", "id": 3, "v": 3.0, "note": "new"}]

    before = _version(observer)
    for call, error in [
        (lambda: store.alter_table("shop.ev", [AddColumns((pa.field("note", pa.int32()),))]), AlreadyExists),
        (lambda: store.alter_table("shop.ev", [SetOptions((("bucket.num", "4"),))]), Unsupported),
        (lambda: store.alter_table("shop.ev", [AddPartition(("d1",))]), AlreadyExists),
        (lambda: store.alter_table("shop.ev", [DropPartition(("d9",))]), Exception),
    ]:
        with pytest.raises(error):
            call()
    assert _version(observer) == before  # refusals commit nothing

    store.alter_table("shop.ev", [DropPartition(("d2",))])
    store.alter_table("shop.ev", [RenameTable(TablePath("shop", "events"))])
    for member in (first, second):
        assert member.store.list_tables("shop") == ["events"]
        assert [p.name for p in member.store.catalog.get_table(TablePath("shop", "events")).partitions] == ["d1"]
    renamed = store.local_table("shop.events")  # the writing member kept its rows through the rename
    assert sorted(r["id"] for r in renamed.scan_table(["id"]).to_pylist()) == [1, 3]
    with pytest.raises(InvalidInput, match="max.partition.num"):
        first.store.alter_table("shop.events", [AddPartition((f"x{i}",)) for i in range(1001)])
