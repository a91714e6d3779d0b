"""A leader's fetch answers: the followers in sync ask for the same newest records, which are
read and encoded once for all of them; an answer is never reused for records a truncation replaced
at the same offsets. Driven through the production :class:`ReplicaManager` of a real store."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.cluster.store import ClusterStore
from flightstore.cluster.view import BucketAssignment, ClusterView, TableRecord
from flightstore.replica import protocol
from flightstore.replica.manager import ReplicaManager
from flightstore.schema import TablePath
from flightstore.store import new_table_descriptor

pytestmark = pytest.mark.timeout(60)

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
PATH = TablePath.parse("default.t")
TABLE_ID = "t-1"
KEY = (TABLE_ID, -1, 0)


@pytest.fixture
def leader(tmp_path):
    """Server 1 leading the one bucket of default.t, followed by servers 2 and 3."""
    store = ClusterStore(tmp_path / "leader", fsync=False)
    descriptor = new_table_descriptor(PATH, SCHEMA, options={"bucket.num": "1"})
    store.local_create_table(descriptor)
    manager = ReplicaManager(store, 1, {}, uri_of=lambda _: None, connect=flight.connect,
                             call_options=flight.FlightCallOptions, adjust_isr=lambda *_: True)
    bucket = BucketAssignment(leader=1, leader_epoch=0, replicas=(1, 2, 3), isr=(1, 2, 3))
    manager.apply(ClusterView(version=1, tables={PATH: TableRecord(TABLE_ID, descriptor, (bucket,))}))
    yield store.local_table(PATH).replicas[0], manager
    manager.close()
    store.close()


def _fetch(manager: ReplicaManager, follower: int, offset: int) -> bytes:
    request = {"fetch": [{"key": list(KEY), "offset": offset, "epoch": 0}], "wait_ms": 0}
    batch, meta = manager._fetch_answer(follower, request, lambda: False)
    assert [m["key"] for m in meta["replicas"]] == [list(KEY)] and "error" not in meta["replicas"][0]
    return batch


def _rows(first: int, n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(first, first + n), pa.int64()), "v": [f"v{i}" for i in range(n)]})


def test_followers_asking_for_the_same_records_share_one_encoded_answer(leader):
    replica, manager = leader
    replica.log.append(_rows(0, 5))
    first = _fetch(manager, 2, 0)
    second = _fetch(manager, 3, 0)
    assert second is first  # encoded once for both followers
    records = protocol.decode_records(second)[KEY]
    assert [(r.base_offset, r.num_rows) for _, r in records] == [(0, 5)]
    assert bytes(records[0][1].payload) == bytes(replica.log.read_raw(0, 1 << 20)[0].payload)
    replica.log.append(_rows(5, 2))  # the next write: a new answer, again shared
    third = _fetch(manager, 2, 5)
    assert third is not first and _fetch(manager, 3, 5) is third
    assert [(r.base_offset, r.num_rows) for _, r in protocol.decode_records(third)[KEY]] == [(5, 2)]
    assert _fetch(manager, 2, 7) == b""  # caught up: nothing new, nothing read


def test_records_replaced_at_the_same_offsets_are_encoded_anew(leader):
    """A leader deposed and elected again may have cut its tail and appended other records at the
    same offsets (here: the same rows, written at another time): the old answer must not be sent."""
    replica, manager = leader
    replica.log.append(_rows(0, 3), timestamp_ms=1_000)
    assert protocol.decode_records(_fetch(manager, 2, 0))[KEY][0][1].timestamp_ms == 1_000
    replica.log.truncate_to(0)
    replica.log.append(_rows(0, 3), timestamp_ms=2_000)
    assert protocol.decode_records(_fetch(manager, 3, 0))[KEY][0][1].timestamp_ms == 2_000
