"""Three real ``flightstore serve --zookeeper`` processes and a real ZooKeeper: registration, one
coordinator, round-robin buckets, kill -9 of a server (its buckets unavailable, naming it; the
others fine; back after a restart with its data) and of the coordinator (re-election, DDL works,
a DDL sent meanwhile is answered by the new coordinator)."""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.bucketing import bucket_ids
from flightstore.errors import BucketUnavailable
from flightstore.routed_lookups import RETRY_S
from flightstore.schema import TablePath
from tests.cluster.conftest import describe

pytestmark = pytest.mark.timeout(600)

ORDERS = TablePath("shop", "orders")


def _sql(uri: str, *statements: str):
    with flightstore.connect(uri) as conn:
        result = None
        for statement in statements:
            result = conn.sql(statement)
        return result


def test_three_servers_assign_survive_kills_and_reelect(servers, observer):
    uris = {server_id: servers.start(server_id).uri for server_id in (1, 2, 3)}
    view = observer.wait(lambda v: set(v.servers) == {1, 2, 3} and v.coordinator is not None,
                         "three registered servers and a coordinator")
    assert {i: s.uri for i, s in view.servers.items()} == uris
    coordinator = view.coordinator
    # Exactly one server says it coordinates; all three agree on which.
    views = {server_id: describe(uri) for server_id, uri in uris.items()}
    assert [i for i, v in views.items() if v["is_coordinator"]] == [coordinator]
    assert {v["coordinator"] for v in views.values()} == {coordinator}

    # DDL sent to a server that is not the coordinator goes through the coordinator; once it
    # returns, every server has the table (no waiting).
    other = next(i for i in uris if i != coordinator)
    _sql(uris[other], "CREATE DATABASE shop",
         "CREATE TABLE shop.orders (id BIGINT, amount DOUBLE, PRIMARY KEY (id) NOT ENFORCED) "
         "WITH ('bucket.num' = '6')")
    for server_id, uri in uris.items():
        seen = describe(uri, "shop.orders")
        leaders = [b["leader"] for b in seen["tables"]["shop.orders"]["buckets"]]
        assert Counter(leaders) == {1: 2, 2: 2, 3: 2}, (server_id, leaders)  # round-robin over all 3
        assert _sql(uri, "SELECT COUNT(*) AS n FROM shop.orders").to_pylist() == [{"n": 0}]
    locations = observer.wait(lambda v: ORDERS in v.tables, "the table in the observer's view") \
        .locations(ORDERS)
    assert all(loc.available and loc.server.uri == uris[loc.leader] for loc in locations)

    # Rows written through server 3 go to their buckets' leaders.
    _sql(uris[3], "INSERT INTO shop.orders VALUES " + ", ".join(f"({i}, {i}.5)" for i in range(1, 31)))
    leader_of = [loc.leader for loc in locations]
    on = {i: [k for k, b in zip(range(1, 101), bucket_ids(pa.table({"id": pa.array(range(1, 101), pa.int64())}),
                                                           ["id"], 6)) if leader_of[b] == i]
          for i in (1, 2, 3)}

    # kill -9 server 3: its registration expires, its buckets are unavailable naming it, the
    # others stay available, and the survivors' own caches say the same.
    servers.running[3].kill()
    view = observer.wait(lambda v: set(v.servers) == {1, 2}, "server 3's registration expiring")
    down = [loc for loc in view.locations(ORDERS) if loc.leader == 3]
    assert len(down) == 2 and not any(loc.available for loc in down)
    for loc in down:
        with pytest.raises(BucketUnavailable, match=rf"bucket {loc.bucket} of table shop.orders .*server 3"):
            loc.require()
    assert all(loc.available for loc in view.locations(ORDERS) if loc.leader != 3)
    for server_id in (1, 2):
        seen = observer_wait_remote(uris[server_id], lambda d: "3" not in d["servers"])
        buckets = seen["tables"]["shop.orders"]["buckets"]
        assert [b["available"] for b in buckets] == [b["leader"] != 3 for b in buckets]
        assert all("server 3" in b["reason"] for b in buckets if b["leader"] == 3)

    # Its buckets' reads and writes fail with UNAVAILABLE naming it, through any server; nothing
    # of a refused write is applied; the other buckets keep serving reads and writes.
    with pytest.raises(flight.FlightUnavailableError, match="server 3"):
        _sql(uris[1], "SELECT * FROM shop.orders")
    with pytest.raises(flight.FlightUnavailableError, match="server 3"):
        _sql(uris[2], f"SELECT * FROM shop.orders WHERE id = {on[3][0]}")
    live_new = [k for k in on[1] + on[2] if k > 30]
    with pytest.raises(flight.FlightUnavailableError, match="server 3"):
        _sql(uris[1], f"INSERT INTO shop.orders VALUES ({live_new[0]}, 0.25), ({on[3][-1]}, 0.25)")
    assert _sql(uris[2], f"SELECT * FROM shop.orders WHERE id = {live_new[0]}").num_rows == 0
    assert _sql(uris[1], f"SELECT id FROM shop.orders WHERE id = {on[1][0]}").to_pylist() == [{"id": on[1][0]}]
    _sql(uris[2], "INSERT INTO shop.orders VALUES " + ", ".join(f"({k}, 100.0)" for k in live_new))
    with flightstore.connect(uris[1]) as conn:  # the Python client too: live leaders answer
        asked = time.monotonic()
        found = conn.table("shop.orders").lookup({"id": live_new})
        assert sorted(found.column("id").to_pylist()) == sorted(live_new)
        # at once: keys on live leaders do not wait for a leader of server 3's buckets (RETRY_S)
        assert time.monotonic() - asked < RETRY_S / 2
        with pytest.raises(flight.FlightUnavailableError, match="server 3"):
            conn.table("shop.orders").lookup({"id": [on[3][0]]})

    # Restart server 3 with the same id and data directory: it resumes its buckets, its rows are there.
    uris[3] = servers.start(3).uri
    view = observer.wait(lambda v: set(v.servers) == {1, 2, 3}, "server 3 registering again")
    assert all(loc.available for loc in view.locations(ORDERS))
    assert [loc.leader for loc in view.locations(ORDERS)] == [loc.leader for loc in locations]
    # Each server's own cache follows ZooKeeper by watches: wait until both see server 3 back.
    def all_available(d: dict) -> bool:
        return all(b["available"] for b in d["tables"]["shop.orders"]["buckets"])
    assert observer_wait_remote(uris[3], all_available)["tables"]["shop.orders"]["buckets"] == \
        observer_wait_remote(uris[1], all_available)["tables"]["shop.orders"]["buckets"]
    # Every acknowledged write is there, read through the restarted server.
    expected = {i: i + 0.5 for i in range(1, 31)} | {k: 100.0 for k in live_new}
    rows = _sql(uris[3], "SELECT id, amount FROM shop.orders").to_pylist()
    assert {r["id"]: r["amount"] for r in rows} == expected

    # kill -9 the coordinator. A DDL sent right away waits for the re-election and is answered
    # by the new coordinator; the new table's buckets go to the live servers only.
    coordinator = observer.cache.view().coordinator
    survivor = next(i for i in uris if i != coordinator)
    servers.running[coordinator].kill()
    _sql(uris[survivor], "CREATE TABLE shop.events (id BIGINT, kind STRING) WITH ('bucket.num' = '4')")
    view = observer.wait(lambda v: v.coordinator not in (None, coordinator)
                         and coordinator not in v.servers
                         and TablePath("shop", "events") in v.tables, "a new coordinator")
    live = set(uris) - {coordinator}
    assert view.coordinator in live
    assert {loc.leader for loc in view.locations(TablePath("shop", "events"))} == live
    # DDL works again, through either survivor, and reaches the other one.
    for server_id in sorted(live):
        _sql(uris[server_id], f"CREATE TABLE shop.t{server_id} (a BIGINT)")
    for server_id in sorted(live):
        tables = _sql(uris[server_id], "SHOW TABLES IN shop").column(0).to_pylist()
        assert {"orders", "events", *(f"t{i}" for i in live)} <= set(tables)
    assert [i for i in sorted(live) if describe(uris[i])["is_coordinator"]] == [view.coordinator]


def observer_wait_remote(uri: str, predicate, timeout: float = 120) -> dict:
    """Poll a server's own view (Flight action) until ``predicate`` holds."""
    from tests.waiting import wait_until
    holder = {}

    def check():
        holder["view"] = describe(uri, "shop.orders")
        return predicate(holder["view"])

    wait_until(check, f"{uri}'s view to change", timeout=timeout, poll=0.1)
    return holder["view"]
