"""Each member's data directory follows the cluster catalog, also across its own downtime, and a
directory that belongs elsewhere is refused before it could lose data."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from flightstore.cluster.mirror import IDENTITY_FILE
from flightstore.errors import InvalidInput, ServerIdInUse
from flightstore.store import Store

pytestmark = pytest.mark.timeout(300)

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
ROWS = pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]})


def test_changes_made_while_a_member_was_down_are_applied_when_it_returns(members, tmp_path, observer):
    second = members.start(2)  # alone: it leads every bucket of the tables created now
    second.store.create_database("shop")
    for name in ("kept", "dropped", "recreated"):
        second.store.create_table(f"shop.{name}", SCHEMA, primary_key=["id"], options={"bucket.num": "2"})
        second.store.local_table(f"shop.{name}").upsert(ROWS)  # members serve no client calls
    first = members.start(1)
    members.stop(2)
    first.store.drop_table("shop.dropped")
    first.store.drop_table("shop.recreated")
    first.store.create_table("shop.recreated", SCHEMA, primary_key=["id"])
    first.store.create_table("shop.added", SCHEMA)
    second = members.start(2, data_dir=tmp_path / "member-2")
    local = second.store
    assert local.list_tables("shop") == ["added", "kept", "recreated"]
    assert local.local_table("shop.kept").row_count() == 3          # its data survived the downtime
    assert local.local_table("shop.recreated").row_count() == 0     # a new table of the same name
    assert local.local_table("shop.recreated").num_buckets == 1
    assert local.local_table("shop.added").num_buckets == 1
    identity = json.loads((tmp_path / "member-2" / IDENTITY_FILE).read_text())
    view = observer.wait(lambda v: v.version == second.mirror.applied_version, "the observer catching up")
    assert identity["server_id"] == 2 and identity["cluster_id"] == view.cluster_id
    assert identity["tables"] == {str(p): r.table_id for p, r in view.tables.items()}


def test_a_data_directory_of_another_server_or_cluster_is_refused(members, tmp_path, zookeeper, observer):
    members.start(1).store.create_database("shop")
    members.stop(1)
    with pytest.raises(InvalidInput, match="belongs to server 1 of its cluster; start it with --server-id 1"):
        members.start(2, data_dir=tmp_path / "member-1")
    other = type(members)(tmp_path, f"{zookeeper.address}/another-cluster")
    with pytest.raises(InvalidInput, match="ZooKeeper holds no flightstore cluster there"):
        other.start(1, data_dir=tmp_path / "member-1")
    with Store(tmp_path / "single") as single:  # a single server's directory, with a table
        single.create_table("local_only", SCHEMA)
    with pytest.raises(InvalidInput, match=r"made outside a cluster \(default.local_only\)"):
        members.start(3, data_dir=tmp_path / "single")
    # None of the refused starts registered, and the refused directories are untouched.
    assert observer.client.get_children(observer.paths.servers) == []
    with Store(tmp_path / "single") as single:
        assert single.list_tables() == ["local_only"]
    assert members.start(1, data_dir=tmp_path / "member-1").store.list_databases() == ["default", "shop"]


def test_a_second_live_server_with_the_same_id_is_refused(members, tmp_path, observer):
    members.start(1)
    with pytest.raises(ServerIdInUse, match="server id 1 is registered by a live server at "
                                            r"grpc://127.0.0.1:9001 \(pid \d+\)"):
        members.start(1, data_dir=tmp_path / "twin", uri="grpc://127.0.0.1:9999", start_timeout=3)
    assert observer.wait(lambda v: 1 in v.servers, "server 1").servers[1].uri == "grpc://127.0.0.1:9001"
    assert members.running[1].store.list_databases() == ["default"]
