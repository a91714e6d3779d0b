"""Replicas moving between servers: decommission, a server dead past its timeout, a new replica
copying its leader's KV snapshot, and ``flightstore cluster status`` / metrics saying so."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import flightstore
from tests.cluster.conftest import describe, in_sync
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

IDS = (1, 2, 3)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightstore", "cluster", *args], capture_output=True,
                          text=True, timeout=300)


def _holders(uri: str, table: str) -> list[tuple[int, ...]]:
    return [tuple(b["replicas"]) for b in describe(uri, table)["tables"][table]["buckets"]]


def test_decommission_moves_every_replica_away_and_the_server_stops(servers, observer):
    uris = {i: servers.start(i, "--option", "default.replication.factor=2").uri for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
        conn.table("kv").upsert({"k": list(range(300)), "v": [f"v{k}" for k in range(300)]})
    wait_until(lambda: all(len(isr) == 2 for isr in (b["isr"] for b in describe(uris[1], "default.kv")["tables"]
                                                     ["default.kv"]["buckets"])), "every bucket in sync")
    status = _cli("status", "--uri", uris[1])
    assert status.returncode == 0, status.stdout + status.stderr
    assert "3 buckets, 0 under-replicated or unavailable" in status.stdout
    assert any(3 in holders for holders in _holders(uris[1], "default.kv"))

    done = _cli("decommission", "--uri", uris[1], "--server-id", "3", "--timeout", "240")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(3 not in holders and len(holders) == 2 for holders in _holders(uris[1], "default.kv"))
    assert servers.running[3].wait(120) is not None  # it stopped by itself
    observer.wait(lambda v: 3 not in v.servers, "server 3 gone")
    for uri in (uris[1], uris[2]):
        with flightstore.connect(uri) as conn:
            assert conn.sql("SELECT COUNT(*) AS n FROM kv").to_pylist() == [{"n": 300}]
            assert conn.table("kv").lookup({"k": [0, 299]}).column("v").to_pylist() == ["v0", "v299"]
    after = _cli("status", "--uri", uris[1])
    assert after.returncode == 0 and "0 under-replicated" in after.stdout


def test_a_server_dead_past_its_timeout_is_replaced_from_the_leaders_snapshot(servers, observer):
    options = ("--option", "default.replication.factor=2", "--option", "cluster.replica.dead-timeout=3s",
               "--option", "log.retention.check-interval=500ms", "--option", "log.replica.max-lag-time=3s")
    uris = {i: servers.start(i, *options).uri for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        # Small segments, a KV snapshot every 200 ms and a tiny TTL: the leaders' logs soon start
        # after offset 0, so a new replica cannot catch up from the log alone.
        conn.sql("CREATE TABLE kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '1', "
                 "'table.log.segment.bytes' = '1024', 'kv.snapshot.interval' = '200ms', 'table.log.ttl' = '1ms')")
        table = conn.table("kv")
        for start in range(0, 400, 20):
            table.upsert({"k": list(range(start, start + 20)), "v": [f"v{k}" for k in range(start, start + 20)]})
    view = observer.wait(lambda v: len(v.tables) == 1, "the table")
    bucket = next(iter(view.tables.values())).buckets[0]
    follower = next(r for r in bucket.replicas if r != bucket.leader)
    spare = next(i for i in IDS if i not in bucket.replicas)
    wait_until(lambda: next(r for r in describe(uris[bucket.leader], "default.kv")["replicas"]
                            if r["role"] == "leader")["high_watermark"] > 0, "writes committed")
    servers.running[follower].kill()
    live = {i: uris[i] for i in IDS if i != follower}
    # Past the dead timeout the coordinator adds a replica on the spare server; it copies the
    # leader's newest KV snapshot (the log no longer starts at 0) and catches up, then the dead
    # server's replica is dropped.
    observer.wait(lambda v: set(next(iter(v.tables.values())).buckets[0].replicas) == {bucket.leader, spare}
                  and set(next(iter(v.tables.values())).buckets[0].isr) == {bucket.leader, spare},
                  "the replica moving to the spare server", timeout=240)
    wait_until(lambda: in_sync(live, "default.kv", {bucket.leader, spare}), "the new replica in sync")
    spare_status = next(r for r in describe(uris[spare], "default.kv")["replicas"])
    assert spare_status["role"] == "follower" and spare_status["rows"] == 400
    assert spare_status["log_start"] > 0  # it started from the leader's snapshot, not its log
    with flightstore.connect(uris[spare]) as conn:
        assert conn.sql("SELECT COUNT(*) AS n FROM kv").to_pylist() == [{"n": 400}]
    # The leader dies too: the new replica, caught up from the snapshot, takes over with every row.
    servers.running[bucket.leader].kill()
    observer.wait(lambda v: next(iter(v.tables.values())).buckets[0].leader == spare, "failover to the spare")
    with flightstore.connect(uris[spare]) as conn:
        rows = conn.sql("SELECT k, v FROM kv").to_pylist()
        assert {r["k"]: r["v"] for r in rows} == {k: f"v{k}" for k in range(400)}


def test_replica_metrics_name_the_leader_and_the_in_sync_replicas(servers, observer):
    uris = {i: servers.start(i, "--option", "default.replication.factor=3", "--metrics-port", "0").uri
            for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE ev (k BIGINT) WITH ('bucket.num' = '1', 'bucket.key' = 'k')")
        conn.table("ev").append({"k": [1, 2, 3]})
    view = observer.wait(lambda v: len(v.tables) == 1, "the table")
    leader = next(iter(view.tables.values())).buckets[0].leader
    wait_until(lambda: in_sync(uris, "default.ev", set(IDS)), "in sync")
    import urllib.request
    metrics_uri = next(line.split(" at ", 1)[1].strip() for line in servers.running[leader].lines
                       if line.startswith("flightstore metrics at"))
    body = urllib.request.urlopen(metrics_uri, timeout=30).read().decode()
    assert 'flightstore_replica_leader{bucket="0",table="default.ev"} 1.0' in body
    assert 'flightstore_replica_in_sync{bucket="0",table="default.ev"} 3.0' in body
    assert 'flightstore_replica_under_replicated{bucket="0",table="default.ev"} 0.0' in body
    assert 'flightstore_replica_high_watermark{bucket="0",table="default.ev"} 3.0' in body


def test_a_bucket_whose_replicas_all_lost_their_disks_is_rebuilt_from_remote_storage(servers, observer, tmp_path):
    remote = tmp_path / "remote"
    options = ("--option", "default.replication.factor=2", "--option", f"remote.data.dir={remote}",
               "--option", "remote.log.task-interval-duration=200ms")
    uris = {i: servers.start(i, *options).uri for i in (1, 2)}
    observer.wait(lambda v: set(v.servers) == {1, 2} and v.coordinator is not None, "two servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE ev (k BIGINT, v STRING) WITH ('bucket.num' = '1', 'bucket.key' = 'k', "
                 "'table.log.segment.bytes' = '1024')")
        for start in range(0, 200, 10):  # about one segment per batch: closed segments get uploaded
            keys = list(range(start, start + 10))
            conn.table("ev").append({"k": keys, "v": [f"v{k}" for k in keys]})
    leader = observer.wait(lambda v: len(v.tables) == 1, "the table").tables[
        next(iter(observer.cache.view().tables))].buckets[0].leader
    uploaded = wait_until(lambda: _uploaded_end(remote), "segments uploaded", timeout=120)
    with flightstore.connect(uris[1]) as conn:  # acknowledged, but in the active segment: never uploaded
        conn.table("ev").append({"k": [1000], "v": ["late"]})
    for server in (1, 2):  # both replicas lose their disks
        servers.running[server].kill()
        shutil.rmtree(servers.root / f"server-{server}")
    uploaded = _uploaded_end(remote)  # uploads went on until the kills: what the remote holds now
    uris = {i: servers.start(i, *options).uri for i in (1, 2)}
    rebuilt = wait_until(lambda: [r for i in (1, 2) for r in describe(uris[i], "default.ev")["replicas"]
                                  if r["role"] == "leader" and r.get("rebuilt_from_remote")], "the rebuild")
    assert rebuilt[0]["rebuilt_from_remote"][0]["offset"] == uploaded  # says where it stopped
    with flightstore.connect(uris[leader]) as conn:
        rows = conn.sql("SELECT k FROM ev ORDER BY k").column("k").to_pylist()
    assert rows == list(range(uploaded))  # what was uploaded, whole; the rest reported lost


def _uploaded_end(remote) -> int:
    """The end offset of the newest log manifest in remote storage (0: nothing uploaded yet)."""
    import json
    ends = [0]
    for path in remote.rglob("log/manifest/*.json"):
        body = json.loads(path.read_bytes().rstrip(b"\n").rpartition(b"\n")[0])
        ends += [s["next"] for s in body["segments"]]
    return max(ends)
