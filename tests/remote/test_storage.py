"""Remote storage options are checked, never accepted and ignored; the layout names tables by
their id, so a dropped and re-created table never mixes with the old one (whose remote data goes
with it) and a renamed one keeps its directory; partitions tier, and a dropped one's remote data
goes with it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.alter import DropPartition, RenameTable
from flightstore.errors import InvalidOption
from flightstore.remote import RemoteLogManager
from flightstore.schema import TablePath
from flightstore.store import Store
from tests.remote.tables import EVENTS, TIERED, events


@pytest.mark.parametrize("options, refused", [
    ({"remote.s3.endpoint": "http://127.0.0.1:9"}, "'remote.s3.endpoint' needs 'remote.data.dir'"),
    ({"remote.log.cache-size": "1GB"}, "'remote.log.cache-size' needs 'remote.data.dir'"),
    ({"remote.data.dir": "/tmp/x", "remote.s3.region": "eu"}, "'remote.s3.region' needs an s3://"),
    ({"remote.data.dir": "s3://b/p", "remote.s3.access-key-id": "k"}, "go together"),
    ({"remote.data.dir": "s3://"}, "names no bucket"),
    ({"remote.data.dir": "/tmp/x", "remote.log.task-interval-duration": "soon"}, "not a duration"),
    ({"remote.data.dir": "/tmp/x", "remote.log.tiered.local-segments": "1"}, "unknown server option"),
])
def test_bad_remote_options_are_refused_and_leave_the_directory_free(tmp_path, options, refused):
    with pytest.raises(InvalidOption, match=refused):
        Store(tmp_path / "data", options=options)
    Store(tmp_path / "data").close()  # the failed open left no lock behind


def test_tiered_local_segments_must_be_positive(tmp_path, local_remote):
    with Store(tmp_path / "data", options=local_remote) as store:
        with pytest.raises(InvalidOption, match="table.log.tiered.local-segments"):
            store.create_table("default.ev", EVENTS, options={"table.log.tiered.local-segments": "0"})


def test_tables_are_found_by_id_across_drop_and_rename(tmp_path, local_remote):
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        manager = RemoteLogManager(store, 1000)
        old = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for i in range(4):
            old.write(events(i * 10, 10))
        manager.run_once()
        store.drop_table("default.ev")
        new = store.create_table("default.ev", EVENTS, options={"bucket.num": "1", **TIERED})
        for i in range(4):
            new.write(events(1000 + i * 10, 10))
        manager.run_once()
        remote = Path(local_remote["remote.data.dir"]) / "standalone" / "default"
        assert [p.name for p in remote.iterdir()] == [f"ev-{new.directory.name}"]  # old: deleted
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        store.alter_table("default.ev", [RenameTable(TablePath("default", "renamed"))])
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.table("default.renamed")
        log = table.logs[0]
        assert log.local_start_offset > 0 and log.start_offset == 0
        assert log.remote.path.endswith(f"default/ev-{table.directory.name}/bucket-0")
        assert table.scan_table().column("seq").to_pylist() == list(range(1000, 1040))


def test_partitions_tier_and_a_dropped_one_leaves_remote_storage(tmp_path, local_remote):
    schema = pa.schema([("day", pa.string()), ("seq", pa.int64())])
    with Store(tmp_path / "data", fsync=False, options=local_remote) as store:
        table = store.create_table("default.pt", schema, partition_keys=["day"],
                                   options={"bucket.num": "1", **TIERED})
        for i in range(5):
            table.append(pa.table({"day": ["a"] * 5 + ["b"] * 5,
                                   "seq": list(range(i * 10, i * 10 + 10))}, schema=schema))
        RemoteLogManager(store, 1000).run_once()
        units = {p.name: table.units[p.id] for p in table.descriptor.partitions}
        assert all(unit.logs[0].local_start_offset > 0 for unit in units.values())
        assert sorted(table.scan_table().column("seq").to_pylist()) == list(range(50))
        remote = Path(units["a"].logs[0].remote.path).parent.parent
        assert sorted(p.name for p in remote.iterdir()) == sorted(f"p-{p.id}" for p in
                                                                  table.descriptor.partitions)
        kept = table.descriptor.partition("b").id
        store.alter_table("default.pt", [DropPartition(("a",))])
        assert [p.name for p in remote.iterdir()] == [f"p-{kept}"]
        assert sorted(table.scan_table().column("seq").to_pylist()) == \
            [s for i in range(5) for s in range(i * 10 + 5, i * 10 + 10)]
