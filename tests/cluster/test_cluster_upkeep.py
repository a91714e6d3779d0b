"""Upkeep through any server of a cluster (three real server processes, a real ZooKeeper): undo,
release (the Spark connector's too), KV snapshots, disk usage and writer expiry act on every
leader of the table over the buckets it leads, and the answers say which server did what. And a
writer created while a leader is down writes the rows of the live buckets, as SQL INSERT does.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import flightstore
from flightstore.bucketing import bucket_ids
from flightstore.errors import DeliveryTimeout
from tests.cluster.conftest import Observer, Servers, describe
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(900)

SERVER_IDS = (1, 2, 3)
KEYS = list(range(30))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper):
    address = f"{zookeeper.address}/t-{uuid.uuid4().hex[:10]}"
    running = Servers(tmp_path_factory.mktemp("upkeep"), address)
    watching = Observer(address)
    try:
        uris = {i: running.start(i).uri for i in SERVER_IDS}
        watching.wait(lambda v: set(v.servers) == set(SERVER_IDS) and v.coordinator is not None,
                      "three servers and a coordinator")
        yield running, watching, uris
    finally:
        running.stop_all()
        watching.close()


def _leaders(uri: str, table: str) -> dict[int, int]:
    return {b["bucket"]: b["leader"] for b in describe(uri, table)["tables"][table]["buckets"]}


def _rows(values: list[int], value: int) -> pa.Table:
    return pa.table({"k": pa.array(values, pa.int64()), "v": pa.array([value] * len(values), pa.int64())})


def test_upkeep_through_any_server_acts_on_every_leader(cluster):
    _, _, uris = cluster
    with flightstore.connect(uris[1], timeout=60) as conn:
        conn.sql("CREATE DATABASE up")
        conn.sql("CREATE TABLE up.kv (k BIGINT, v BIGINT, w BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
                 "WITH ('bucket.num' = '6', 'table.replication.factor' = '2')")
        job = conn.table("up.kv", writer_id="job")
        job.upsert(_rows(KEYS, 0), columns=["k", "v"])
        checkpoint = job.sequence
        job.upsert(_rows(KEYS, 1), columns=["k", "v"])  # after the checkpoint: undone below
        job.upsert(_rows(KEYS, 2), columns=["k", "v"])
    leaders = _leaders(uris[1], "up.kv")
    assert set(leaders.values()) == set(SERVER_IDS)
    led = {s: sorted(b for b, leader in leaders.items() if leader == s) for s in SERVER_IDS}

    with flightstore.connect(uris[2], timeout=60) as conn:  # undo through server 2: every leader undoes
        undone = conn._action("flightstore.undo", {"table": "up.kv", "writer_id": "job",
                                                   "after_sequence": checkpoint})
        assert set(undone["servers"]) == {"1", "2", "3"} and all(n > 0 for n in undone["servers"].values())
        assert undone["rows"] == sum(undone["servers"].values())
        assert conn.sql("SELECT v, COUNT(*) AS n FROM up.kv GROUP BY v").to_pylist() == [{"v": 0, "n": len(KEYS)}]

    with flightstore.connect(uris[3], timeout=60) as conn:  # KV snapshots through server 3
        taken = conn._action("flightstore.snapshot", {"table": "up.kv", "force": True})
        assert sorted(int(b) for b in taken["snapshots"]) == list(range(6))
        assert all(info is not None and info["rows"] > 0 for info in taken["snapshots"].values())
        assert {int(s): sorted(int(b) for b in found) for s, found in taken["servers"].items()} == led
        usage = conn.table("up.kv").usage()  # one copy of the table: each leader's share
        assert set(usage["servers"]) == set(SERVER_IDS)
        assert usage["bytes"]["total"] == sum(u["total"] for u in usage["servers"].values()) > 0
        assert all(u["snapshots"] > 0 for u in usage["servers"].values())
        expired = conn._action("flightstore.expire-writers", {"table": "up.kv"})
        assert set(expired["servers"]) == {"1", "2", "3"} and expired["writers"] == []

    # Column ownership: writer "a" claims w on every leader; "b" is refused there until "a" is
    # released through another server by the Spark connector's release, which reaches every leader.
    from flightstore_spark._flight import release
    with flightstore.connect(uris[1], timeout=60) as conn:
        conn.table("up.kv", writer_id="a").upsert(pa.table({"k": pa.array(KEYS, pa.int64()), "w": [7] * 30}),
                                                  columns=["k", "w"])
        other = conn.table("up.kv", writer_id="b")
        with pytest.raises(pa.ArrowInvalid, match="owned by live writer 'a'"):
            other.upsert(pa.table({"k": pa.array(KEYS, pa.int64()), "w": [8] * 30}), columns=["k", "w"])
    with flightstore.connect(uris[3], timeout=60) as conn:
        release(conn, "up.kv", "a")
    with flightstore.connect(uris[1], timeout=60) as conn:
        conn.table("up.kv", writer_id="b").upsert(pa.table({"k": pa.array(KEYS, pa.int64()), "w": [8] * 30}),
                                                  columns=["k", "w"])
        assert conn.sql("SELECT w, COUNT(*) AS n FROM up.kv GROUP BY w").to_pylist() == [{"w": 8, "n": 30}]


def test_a_writer_created_while_a_leader_is_down_writes_the_live_buckets(cluster):
    servers, observer, uris = cluster
    with flightstore.connect(uris[1], timeout=60) as conn:
        conn.sql("CREATE DATABASE IF NOT EXISTS up")
        conn.sql("CREATE TABLE up.live (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
    leaders = _leaders(uris[1], "up.live")
    assert set(leaders.values()) == set(SERVER_IDS)
    buckets = bucket_ids(pa.table({"k": pa.array(KEYS, pa.int64())}), ["k"], 3)
    live = [k for k, b in zip(KEYS, buckets) if leaders[int(b)] != 3]
    dead = [k for k, b in zip(KEYS, buckets) if leaders[int(b)] == 3]
    servers.running[3].kill()  # its buckets have no other replica: they stay unavailable
    observer.wait(lambda v: set(v.servers) == {1, 2}, "server 3's registration expiring")
    with flightstore.connect(uris[1], timeout=60) as conn:
        writer = conn.table("up.live")  # created now, while bucket 2's leader is down
        written = writer.upsert(_rows(live, 1))
        assert written["rows"] == len(live)
        assert writer.lookup({"k": live})["v"].to_pylist() == [1] * len(live)
    # A bucket with no replica left: the client retries for its delivery timeout (the leader may
    # come back), then gives up naming the dead leader.
    with flightstore.connect(uris[1], timeout=60, options={"client.writer.delivery-timeout": "3s"}) as brief:
        with pytest.raises(DeliveryTimeout, match="server 3"):
            brief.table("up.live").upsert(_rows(dead[:1], 1))
    with flightstore.connect(uris[1], timeout=60) as conn:
        assert conn.sql("INSERT INTO up.live VALUES " + ", ".join(f"({k}, 2)" for k in live)).to_pylist() == \
            [{"rows_affected": len(live)}]
        wait_until(lambda: conn.table("up.live").lookup({"k": live})["v"].to_pylist() == [2] * len(live),
                   "the INSERT's rows")
