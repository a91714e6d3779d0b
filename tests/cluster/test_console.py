"""The console of a cluster member (two real server processes, a real ZooKeeper): its cluster page
(servers, coordinator, unavailable buckets) and a table page's per-bucket leader, replicas and
in-sync replicas equal what ``flightstore cluster status`` and the cluster's own metadata (the
``flightstore.cluster`` action) say, before and after a server stops: the stopped server's
replicated buckets are then led by the other, its unreplicated ones shown unavailable."""

from __future__ import annotations

import json
import socket
import urllib.request

import pyarrow as pa
import pytest

import flightstore
from flightstore.cluster.admin import bucket_status
from tests.cluster.conftest import describe, in_sync
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

TABLES = ("default.rep", "default.solo")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=60) as answer:
        return json.loads(answer.read())


def _console(base: str) -> tuple[dict, dict]:
    """(the cluster page, every table's buckets as (leader, replicas, isr, available))."""
    page = _get(base, "/api/cluster")
    placement = {}
    for table in TABLES:
        for b in _get(base, f"/api/table?name={table}")["bucket_list"]:
            placement[(table, b["bucket"])] = (b["leader"], b["replicas"], b["isr"], b["available"])
    return page, placement


def _cli(uri: str) -> dict:
    """What ``flightstore cluster status`` prints, per bucket, in the console's terms."""
    return {(r["table"], r["bucket"]): (r["leader"], [int(s) for s in r["replicas"].split(",") if s],
                                        [int(s) for s in r["isr"].split(",") if s], r["state"] != "unavailable")
            for r in bucket_status(uri) if r["table"] in TABLES}


def _agrees(page: dict, placement: dict, uri: str) -> bool:
    """The console (its ``page`` and ``placement``) says what the CLI and the cluster action say
    (each reads the cluster's metadata on its own: they agree once every server's view caught up)."""
    described = describe(uri)
    cli = _cli(uri)
    servers = {int(i): s["uri"] for i, s in described["servers"].items()}
    return (placement == cli
            and {s["id"]: s["uri"] for s in page["servers"]} == servers
            and page["coordinator"] == described["coordinator"]
            and sorted((u["table"], u["bucket"]) for u in page["unavailable"])
            == sorted(key for key, (_, _, _, available) in cli.items() if not available))


def _replicated(placement: dict, servers: set[int]) -> bool:
    """Every bucket of ``default.rep`` led by one of ``servers``, available, in sync on all of them."""
    return all(leader in servers and available and set(isr) == servers
               for (table, _), (leader, _, isr, available) in placement.items() if table == "default.rep")


def _settled(base: str, uri: str, servers: set[int]) -> tuple[dict, dict] | None:
    """The console's (page, placement) once one reading of it agrees with the CLI and the action
    and shows ``default.rep`` replicated on ``servers``; None before. The checks that follow use
    that reading: a second one may already show a later state (on a busy machine a live server's
    ZooKeeper session can lapse and come back, and the console shows that too)."""
    page, placement = _console(base)
    if _replicated(placement, servers) and _agrees(page, placement, uri):
        return page, placement
    return None


def test_the_console_shows_the_clusters_placement_before_and_after_a_server_stops(servers, observer):
    console_port = _free_port()
    uri = servers.start(1, "--console-port", str(console_port)).uri
    servers.start(2)
    base = f"http://127.0.0.1:{console_port}"
    observer.wait(lambda v: set(v.servers) == {1, 2} and v.coordinator is not None, "two servers and a coordinator")
    with flightstore.connect(uri, timeout=60) as conn:
        conn.sql("CREATE TABLE rep (id BIGINT, v STRING) WITH ('bucket.num' = '4', 'bucket.key' = 'id', "
                 "'table.replication.factor' = '2')")
        conn.sql("CREATE TABLE solo (id BIGINT) WITH ('bucket.num' = '2', 'bucket.key' = 'id', "
                 "'table.replication.factor' = '1')")
        conn.table("rep").append(pa.table({"id": pa.array(range(20), pa.int64()), "v": [str(i) for i in range(20)]}))
    uris = {i: servers.running[i].uri for i in (1, 2)}
    wait_until(lambda: in_sync(uris, "default.rep", {1, 2}), "both replicas of rep in sync", timeout=60)
    # (the console, the CLI and the action all read server 1's view of ZooKeeper, which may lag
    # the observer's: wait for that view to show the state, not only to agree with itself)
    page, placement = wait_until(lambda: _settled(base, uri, {1, 2}), "the console agreeing with cluster status",
                                 timeout=60)
    assert page["mode"] == "cluster" and page["server_id"] == 1 and page["unavailable"] == []
    assert {leader for (table, _), (leader, *_) in placement.items() if table == "default.rep"} == {1, 2}
    assert all(sorted(isr) == [1, 2] for (table, _), (_, _, isr, _) in placement.items() if table == "default.rep")
    solo_on_2 = sorted(key for key, (leader, *_) in placement.items() if key[0] == "default.solo" and leader == 2)
    assert solo_on_2, placement  # (two buckets over two servers: one each)

    servers.running[2].kill()  # a crash: its ZooKeeper session expires, the coordinator moves its buckets
    observer.wait(lambda v: set(v.servers) == {1} and 2 not in {
        a.leader for path, record in v.tables.items() if str(path) == "default.rep" for a in record.buckets},
        "server 2 gone and rep led by server 1", timeout=60)
    page, placement = wait_until(lambda: _settled(base, uri, {1}),
                                 "the console agreeing with cluster status after the stop", timeout=60)
    assert [s["id"] for s in page["servers"]] == [1]
    assert all(leader == 1 and available and isr == [1]
               for (table, _), (leader, _, isr, available) in placement.items() if table == "default.rep"), placement
    assert sorted((u["table"], u["bucket"]) for u in page["unavailable"]) == solo_on_2
    assert all(not placement[key][3] for key in solo_on_2)
    # The table with a bucket whose only replica is down has no count and no offsets meanwhile
    # (they need every bucket's leader); the replicated one still has all of them.
    solo = _get(base, "/api/table?name=default.solo")
    assert solo["row_count"] is None and solo["unavailable_buckets"] == [b for _, b in solo_on_2]
    assert all(b["log_end"] is None for b in solo["bucket_list"])
    rep = _get(base, "/api/table?name=default.rep")
    with flightstore.connect(uri, timeout=60) as conn:
        assert rep["row_count"] == conn.sql("SELECT COUNT(*) AS n FROM rep").column("n")[0].as_py() == 20
        assert {b["bucket"]: b["log_end"] for b in rep["bucket_list"]} == conn.table("rep").offsets("end")
    assert rep["unavailable_buckets"] == []
