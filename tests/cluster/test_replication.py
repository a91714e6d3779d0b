"""Replication over three real server processes and a real ZooKeeper: every bucket on three
servers, acks from every in-sync replica, failover to an in-sync follower, followers whose KV
equals their leader's, and a server that lost its disk rejoining as a follower."""

from __future__ import annotations

import shutil
import threading
import time

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

import flightstore
from flightstore.errors import DeliveryTimeout
from flightstore.store import Store
from tests.cluster.conftest import Servers, describe, in_sync
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

IDS = (1, 2, 3)
REPLICATED = ("--option", "default.replication.factor=3",
              "--option", "log.replica.min-in-sync-replicas-number=2",
              "--option", "log.replica.max-lag-time=5s")


def _start(servers: Servers, server_id: int) -> str:
    return servers.start(server_id, *REPLICATED).uri


def _kv_contents(data_dir, table: str) -> dict[int, list[dict]]:
    """Every bucket's KV rows (key order), read from a stopped server's data directory."""
    with Store(data_dir) as store:
        local = store.local_table(table)
        return {b: [row for batch in kv.scan() for row in batch.to_pylist()] for b, kv in enumerate(local.kvs)}


def _log_contents(data_dir, table: str) -> dict[int, list[tuple]]:
    with Store(data_dir) as store:
        local = store.local_table(table)
        return {b: [(r.base_offset, r.writer_id, r.sequence, tuple(r.batch.column(0).to_pylist()))
                    for r in log.read(0)] for b, log in enumerate(local.logs)}


def test_a_replicated_cluster_survives_a_dead_leader_and_followers_match_it(servers, observer):
    uris = {i: _start(servers, i) for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, n BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
                 "WITH ('bucket.num' = '3')")
        conn.sql("CREATE TABLE ev (k BIGINT, v STRING) WITH ('bucket.num' = '3', 'bucket.key' = 'k')")
        kv, ev = conn.table("kv", writer_id="w"), conn.table("ev", writer_id="e")
        for start in range(0, 300, 50):
            keys = list(range(start, start + 50))
            kv.upsert({"k": keys, "v": [f"v{k}" for k in keys], "n": keys})
            ev.append({"k": keys, "v": [f"e{k}" for k in keys]})
        kv.upsert({"k": [1, 2], "v": ["partial", "partial"]}, columns=["k", "v"])
        kv.delete({"k": [3]})
    view = observer.wait(lambda v: len(v.tables) == 2, "two tables")
    for record in view.tables.values():
        for bucket in record.buckets:
            assert len(set(bucket.replicas)) == 3 and set(bucket.isr) == set(IDS)
    assert sorted({b.leader for r in view.tables.values() for b in r.buckets}) == [1, 2, 3]  # spread
    for table in ("kv", "ev"):
        wait_until(lambda t=table: in_sync(uris, f"default.{t}", set(IDS)), f"{table} replicated everywhere")

    # kill -9 the leader of kv's bucket 0; its buckets move to an in-sync follower.
    victim = view.tables[next(p for p in view.tables if p.table == "kv")].buckets[0].leader
    servers.running[victim].kill()
    live = {i: uris[i] for i in IDS if i != victim}
    started = time.monotonic()
    moved = observer.wait(lambda v: all(b.leader != victim and b.leader in live for r in v.tables.values()
                                        for b in r.buckets), "leaders moving off the dead server")
    assert all(b.leader_epoch >= 1 for r in moved.tables.values() for b in r.buckets if victim in b.replicas
               and b.replicas[0] == victim)
    entry = next(iter(live.values()))
    with flightstore.connect(entry) as conn:  # writes through a survivor: acknowledged by 2 of 3
        keys = list(range(300, 350))
        conn.table("kv").upsert({"k": keys, "v": [f"v{k}" for k in keys], "n": keys})
        conn.table("ev").append({"k": keys, "v": [f"e{k}" for k in keys]})
    failover_s = time.monotonic() - started
    expected = {k: ("partial" if k in (1, 2) else f"v{k}") for k in range(350) if k != 3}
    for uri in live.values():  # every survivor answers the whole table
        with flightstore.connect(uri) as conn:
            rows = conn.sql("SELECT k, v FROM kv").to_pylist()
            assert {r["k"]: r["v"] for r in rows} == expected
            assert conn.sql("SELECT COUNT(*) AS n FROM ev").to_pylist() == [{"n": 350}]
            assert conn.table("kv").lookup({"k": [1, 3, 349]}).to_pylist() == [
                {"k": 1, "v": "partial", "n": 1}, {"k": 349, "v": "v349", "n": 349}]
    assert failover_s < 60

    # The dead server comes back, catches up as a follower and rejoins every ISR.
    uris[victim] = _start(servers, victim)
    for table in ("kv", "ev"):
        wait_until(lambda t=table: in_sync(uris, f"default.{t}", set(IDS)), f"{table} caught up")
    # A leader stopped (SIGTERM) while its followers are up stops cleanly within its shutdown
    # grace: their fetch streams end once they hold every record (exit 1: the hard exit, the
    # shutdown still waiting for them).
    for server in IDS:
        assert servers.running[server].stop() == 0, servers.running[server].lines[-5:]
    kvs = {i: _kv_contents(servers.root / f"server-{i}", "kv") for i in IDS}
    logs = {i: _log_contents(servers.root / f"server-{i}", "ev") for i in IDS}
    assert kvs[1] == kvs[2] == kvs[3]  # followers' KV: the same fold as the leader's
    assert logs[1] == logs[2] == logs[3]  # the same records at the same offsets
    assert {r["k"]: r["v"] for rows in kvs[1].values() for r in rows} == expected


def test_a_server_that_lost_its_disk_rejoins_empty_and_never_answers_from_it(servers, observer):
    uris = {i: _start(servers, i) for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
        conn.table("kv").upsert({"k": list(range(200)), "v": [f"v{k}" for k in range(200)]})
    wait_until(lambda: in_sync(uris, "default.kv", set(IDS)), "replicated everywhere")
    servers.running[2].kill()
    shutil.rmtree(servers.root / "server-2")
    observer.wait(lambda v: all(b.leader != 2 for r in v.tables.values() for b in r.buckets), "failover")
    with flightstore.connect(uris[3]) as conn:  # written while server 2 is gone
        conn.table("kv").upsert({"k": list(range(200, 260)), "v": [f"v{k}" for k in range(200, 260)]})
    uris[2] = _start(servers, 2)  # an empty data directory
    expected = {k: f"v{k}" for k in range(260)}
    # While it catches up, reads through every server (server 2 included) are whole.
    for _ in range(5):
        for uri in uris.values():
            with flightstore.connect(uri) as conn:
                assert {r["k"]: r["v"] for r in conn.sql("SELECT k, v FROM kv").to_pylist()} == expected
    wait_until(lambda: in_sync(uris, "default.kv", set(IDS)), "server 2 caught up")
    for uri in uris.values():
        with flightstore.connect(uri) as conn:
            assert conn.sql("SELECT COUNT(*) AS n FROM kv").to_pylist() == [{"n": 260}]


def _crash(members, server_id: int) -> KazooClient:
    """What kill -9 leaves behind: the member does nothing any more, but ZooKeeper keeps its
    session (and so its registration, its leaderships) until the session expires. Returns the
    session's client: closing it is the expiry."""
    member = members.running.pop(server_id)
    member._stop.set()
    member._reregister.set()
    member.coordinator.stop()
    member.metadata.stop()
    member.replicas.close()
    member.store.close()
    return member.client


def test_a_member_restarted_on_an_empty_disk_never_leads_from_it(members, observer):
    """Jepsen seed 2: a server killed and wiped restarted before its session expired, so ZooKeeper
    still named it leader; it took that role from its empty log (and recorded the epoch at offset
    0) before leaving the ISR. It must leave first: never lead, not even for a moment."""
    first = members.start(1)
    members.start(2)
    first.store.create_table("default.t", pa.schema([("k", pa.int64())]),
                             options={"bucket.num": "2", "table.replication.factor": "2", "bucket.key": "k"})
    view = observer.wait(lambda v: len(v.tables) == 1, "the table")
    buckets = next(iter(view.tables.values())).buckets
    victim = buckets[0].leader
    led = [b for b, a in enumerate(buckets) if a.leader == victim]
    assert all(buckets[b].isr == (1, 2) for b in led)
    session = _crash(members, victim)
    shutil.rmtree(members.root / f"member-{victim}")
    restarted: list = []
    starting = threading.Thread(target=lambda: restarted.append(members.start(victim)), daemon=True)
    starting.start()  # it waits for its old registration to expire before registering
    observer.wait(lambda v: all(victim not in b.isr and b.leader != victim
                                        for r in v.tables.values() for b in (r.buckets[i] for i in led)),
                          "the wiped server leaving the ISR of the buckets it led")
    session.stop()
    session.close()
    starting.join(60)
    assert restarted, "the wiped server did not start"
    local = restarted[0].store.local_table("default.t")
    for bucket in led:  # it never took office: no epoch recorded, and a follower now
        assert local.replicas[bucket].epochs.entries == []
        assert local.replicas[bucket].leadership.leader != victim


def test_writes_wait_for_enough_in_sync_replicas(servers, observer):
    uris = {i: _start(servers, i) for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE ev (k BIGINT) WITH ('bucket.num' = '1', 'bucket.key' = 'k')")
    view = observer.wait(lambda v: len(v.tables) == 1, "the table")
    leader = next(iter(view.tables.values())).buckets[0].leader
    others = [i for i in IDS if i != leader]
    for server in others:  # both followers die: the ISR shrinks to the leader alone
        servers.running[server].kill()
    observer.wait(lambda v: next(iter(v.tables.values())).buckets[0].isr == (leader,), "the ISR shrinking")
    # ... and the leader applied it (the coordinator may drop a dead follower before the leader's
    # view has it: a write appended then is refused after the append, and its row stays in the log;
    # tests/replica/test_deposed_leader.py covers that case)
    wait_until(lambda: [r["isr"] for r in describe(uris[leader], "default.ev")["replicas"]] == [[leader]],
               "the leader seeing the ISR shrink", timeout=60)
    # Not enough replicas is retried (a follower may come back) for the client's delivery timeout.
    with flightstore.connect(uris[leader], options={"client.writer.delivery-timeout": "8s"}) as conn:
        with pytest.raises(DeliveryTimeout, match="min-in-sync-replicas"):
            conn.table("ev").append(pa.table({"k": pa.array([1], pa.int64())}))
        assert conn.sql("SELECT COUNT(*) AS n FROM ev").to_pylist() == [{"n": 0}]  # nothing written


def test_a_client_given_every_server_moves_on_when_its_server_dies(servers, observer):
    uris = {i: _start(servers, i) for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(",".join(uris[i] for i in IDS)) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
        table = conn.table("kv", writer_id="mover")
        table.upsert({"k": [1, 2, 3], "v": ["a", "b", "c"]})
        assert conn.uri == uris[1]
        servers.running[1].kill()  # the server the connection uses, and a leader
        table.upsert({"k": [4], "v": ["d"]})  # the write moves on, and rides over the failover
        assert conn.uri != uris[1]
        rows = conn.sql("SELECT k, v FROM kv ORDER BY k").to_pylist()
        assert rows == [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 4, "v": "d"}]
        assert table.lookup({"k": [4]}).column("v").to_pylist() == ["d"]
