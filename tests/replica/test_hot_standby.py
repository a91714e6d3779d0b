"""A primary-key follower is a hot standby: over a real fetch stream its KV takes every committed
change as the leader's high watermark reaches it (upserts, partial updates, deletes), equal to the
leader's KV at that offset, without a restart or a recovery in between. The follower skips reading
its KV's applied offset when an answer moves nothing; this test fails if that ever skips a move."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.cluster.store import ClusterStore
from flightstore.cluster.view import BucketAssignment, ClusterView, TableRecord
from flightstore.replica.fetcher import Fetcher
from flightstore.replica.manager import ReplicaManager
from flightstore.replica.replica import Leadership
from flightstore.schema import TablePath
from flightstore.store import new_table_descriptor
from tests.replica.leader_server import LeaderServer
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string()), ("n", pa.int64())])
PATH = TablePath.parse("default.kv")
TABLE_ID = "kv-1"
KEY = (TABLE_ID, -1, 0)


def _contents(table) -> dict:
    rows = [r for batch in table.kvs[0].scan() for r in batch.to_pylist()]
    return {r["k"]: (r["v"], r["n"]) for r in rows}


def test_a_followers_kv_follows_the_leaders_as_the_high_watermark_moves(tmp_path):
    descriptor = new_table_descriptor(PATH, SCHEMA, primary_key=["k"], options={"bucket.num": "1"})
    leader_store, follower_store = ClusterStore(tmp_path / "1", fsync=False), ClusterStore(tmp_path / "2", fsync=False)
    for store in (leader_store, follower_store):
        store.local_create_table(descriptor)
    manager = ReplicaManager(leader_store, 1, {}, uri_of=lambda _: None, connect=flight.connect,
                             call_options=flight.FlightCallOptions, adjust_isr=lambda *_: True)
    bucket = BucketAssignment(leader=1, leader_epoch=0, replicas=(1, 2), isr=(1, 2))
    manager.apply(ClusterView(version=1, tables={PATH: TableRecord(TABLE_ID, descriptor, (bucket,))}))
    leader, follower = leader_store.local_table(PATH), follower_store.local_table(PATH)
    follower.replicas[0].become_follower(Leadership(me=2, leader=1, epoch=0, replicas=(1, 2), isr=(1, 2),
                                                    replicated=True))
    server = LeaderServer(manager)
    clients: dict[str, flight.FlightClient] = {}
    fetcher = Fetcher(2, 1, lambda _: f"grpc://127.0.0.1:{server.port}",
                      lambda uri: clients.setdefault(uri, flight.connect(uri)),
                      lambda: flight.FlightCallOptions(timeout=30), max_bytes=1 << 20, backoff_s=0.05)
    try:
        fetcher.add(KEY, follower.replicas[0])
        writes = [
            lambda t: t.upsert({"k": [1, 2, 3], "v": ["a", "b", "c"], "n": [1, 2, 3]}),
            lambda t: t.upsert({"k": [2], "v": ["B"]}, columns=["k", "v"]),  # partial: n kept
            lambda t: t.delete({"k": [1]}),
            lambda t: t.upsert({"k": [4], "v": ["d"], "n": [4]}),
        ]
        for write in writes:
            write(leader)  # acknowledged: the follower holds it (acks = all)
            hw = leader.logs[0].high_watermark
            wait_until(lambda hw=hw: follower.kvs[0].applied_offset == hw, "the follower's KV at the leader's HW",
                       timeout=30)
            assert _contents(follower) == _contents(leader)
        assert _contents(follower) == {2: ("B", 2), 3: ("c", 3), 4: ("d", 4)}
    finally:
        fetcher.stop()
        for client in clients.values():
            client.close()
        server.shutdown()
        manager.close()
        leader_store.close()
        follower_store.close()
