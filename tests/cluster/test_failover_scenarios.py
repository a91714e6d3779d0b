"""Issue 21's failover scenarios over three real server processes and a real ZooKeeper
(replication factor 3, min in-sync replicas 2):

* **disk gone**: kill -9 a server and delete its data directory; every bucket keeps answering
  through the others at once (each read waits for the failover, within the retry time, instead of
  failing or answering short); restarted empty, it catches up; answers and replicas equal.
* **stale follower**: a server that missed writes restarts with its old data directory while no
  in-sync replica is alive: it must never serve a read (reads through it answer UNAVAILABLE, never a
  short answer), nor lead (no unclean election); once the others are back it catches up, and
  reads through every server, it included, are whole all along.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.store import Store
from tests.cluster.conftest import Servers, in_sync
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

IDS = (1, 2, 3)
REPLICATED = ("--option", "default.replication.factor=3",
              "--option", "log.replica.min-in-sync-replicas-number=2",
              "--option", "log.replica.max-lag-time=5s")


def _start(servers: Servers, server_id: int) -> str:
    return servers.start(server_id, *REPLICATED).uri


def _cluster(servers: Servers, observer) -> dict[int, str]:
    uris = {i: _start(servers, i) for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
        conn.sql("CREATE TABLE ev (k BIGINT, v STRING) WITH ('bucket.num' = '3', 'bucket.key' = 'k')")
    return uris


def _write(uri: str, keys: range, version: str) -> None:
    with flightstore.connect(uri, timeout=120) as conn:
        rows = {"k": pa.array(list(keys), pa.int64()), "v": [f"{version}{k}" for k in keys]}
        conn.table("kv").upsert(rows)
        conn.table("ev").append(rows)


def _answers(uri: str) -> tuple[dict, int, list, int]:
    """What a server answers: the kv table by key, ev's count, a lookup, kv's changelog length."""
    with flightstore.connect(uri, timeout=120) as conn:
        kv = {r["k"]: r["v"] for r in conn.sql("SELECT k, v FROM kv").to_pylist()}
        count = conn.sql("SELECT COUNT(*) AS n FROM ev").to_pylist()[0]["n"]
        lookup = conn.table("kv").lookup({"k": pa.array([0, 1, 2, 9999], pa.int64())}).to_pylist()
        changes = conn.sql("SELECT k FROM kv$changelog").num_rows
    return kv, count, lookup, changes


def _replicas(data_dir) -> dict:
    with Store(data_dir) as store:
        out = {}
        for name in ("kv", "ev"):
            local = store.local_table(f"default.{name}")
            for bucket, log in enumerate(local.logs):
                out[(name, bucket)] = [(r.base_offset, r.writer_id, r.sequence, r.batch.to_pylist())
                                       for r in log.read(0)]
            for bucket, kv in enumerate(local.kvs or []):
                out[(name, bucket, "kv")] = [row for batch in kv.scan() for row in batch.to_pylist()]
        return out


def _all_in_sync(uris: dict[int, str]) -> bool:
    try:
        return all(in_sync(uris, f"default.{t}", set(IDS)) for t in ("kv", "ev"))
    except flight.FlightError:
        return False


def test_disk_gone_every_bucket_answers_through_the_others_and_the_empty_server_catches_up(servers, observer):
    uris = _cluster(servers, observer)
    _write(uris[1], range(0, 300), "a")
    wait_until(lambda: _all_in_sync(uris), "replicated everywhere")
    expected = ({k: f"a{k}" for k in range(300)}, 300,
                [{"k": k, "v": f"a{k}"} for k in (0, 1, 2)], 300)
    servers.running[2].kill()
    shutil.rmtree(servers.root / "server-2")
    # At once, without waiting for the cluster to notice: every bucket (server 2 led a third of
    # them) answers through each survivor, whole; reads wait for the failover instead of failing.
    for survivor in (1, 3):
        assert _answers(uris[survivor]) == expected
    _write(uris[3], range(300, 400), "b")  # acknowledged by the two survivors
    uris[2] = _start(servers, 2)  # an empty data directory
    expected = ({**expected[0], **{k: f"b{k}" for k in range(300, 400)}}, 400, expected[2], 400)
    for server in (2, 1, 3, 2):  # while it catches up, through every server: whole
        assert _answers(uris[server]) == expected
    wait_until(lambda: _all_in_sync(uris), "server 2 caught up")
    for server in IDS:
        assert _answers(uris[server]) == expected
    for server in IDS:
        servers.running[server].stop()
    replicas = {server: _replicas(servers.root / f"server-{server}") for server in IDS}
    assert replicas[1] == replicas[2] == replicas[3]  # the rebuilt replica: same records, same KV


def test_a_stale_follower_never_serves_a_read_nor_leads(servers, observer):
    uris = _cluster(servers, observer)
    _write(uris[1], range(0, 200), "a")
    wait_until(lambda: _all_in_sync(uris), "replicated everywhere")
    servers.running[3].kill()
    observer.wait(lambda v: all(3 not in b.isr for r in v.tables.values() for b in r.buckets),
                  "server 3 leaving every ISR")
    _write(uris[1], range(200, 300), "b")  # server 3 misses these
    _write(uris[2], range(0, 50), "c")
    for server in (1, 2):  # no in-sync replica alive; server 3 is stale
        servers.running[server].kill()
    uris[3] = _start(servers, 3)  # its old data directory, behind
    view = observer.wait(lambda v: set(v.servers) == {3} and v.coordinator == 3, "server 3 alone, coordinating")
    assert all(b.leader != 3 for r in view.tables.values() for b in r.buckets)  # no unclean election
    with flightstore.connect(uris[3], timeout=120) as conn:
        for query in ("SELECT k, v FROM kv", "SELECT COUNT(*) FROM ev", "SELECT k FROM kv$changelog"):
            with pytest.raises(flight.FlightUnavailableError):
                conn.sql(query)
        with pytest.raises(flight.FlightUnavailableError):
            conn.table("kv").lookup({"k": pa.array([250], pa.int64())})
    expected = ({**{k: f"c{k}" for k in range(50)}, **{k: f"a{k}" for k in range(50, 200)},
                 **{k: f"b{k}" for k in range(200, 300)}}, 350, [{"k": k, "v": f"c{k}"} for k in (0, 1, 2)],
                300 + 2 * 50)  # kv's changelog: 300 inserts, 50 updates (-U, +U)
    uris[1] = _start(servers, 1)
    uris[2] = _start(servers, 2)
    for server in (3, 1, 2, 3, 3):  # while server 3 catches up, reads through it are whole
        assert _answers(uris[server]) == expected
    wait_until(lambda: _all_in_sync(uris), "server 3 caught up")
    for server in IDS:
        assert _answers(uris[server]) == expected
