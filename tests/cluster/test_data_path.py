"""The owner-only data path over three real server processes and a real ZooKeeper.

One cluster for the module (tables with 6 buckets, two per server). Each bucket's rows live only on
its leader; writes, lookups and scans sent to any server are forwarded per bucket; per-bucket
endpoints name the leaders; ADBC, flightsql-dbapi and the Python client, through any server, get
the answers a single server gives for the same scenario.
"""

from __future__ import annotations

import uuid
import warnings
from collections import Counter

import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.bucketing import bucket_ids
from flightstore.expressions import Comparison
from flightstore.server import protocol, tickets
from tests.cluster.conftest import CALL, Observer, Servers, describe
from tests.server.conftest import RunningServer
from tests.server.test_flightsql_dbapi import DBAPI_SCRIPT, port_of, run_client

pytestmark = pytest.mark.timeout(900)

SERVER_IDS = (1, 2, 3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper):
    address = f"{zookeeper.address}/t-{uuid.uuid4().hex[:10]}"
    running = Servers(tmp_path_factory.mktemp("cluster"), address)
    watching = Observer(address)
    try:
        # Small write chunks: an upload is applied as several batches (sequences) per leader.
        uris = {i: running.start(i, "--option", "write.chunk-rows=2000").uri for i in SERVER_IDS}
        watching.wait(lambda v: set(v.servers) == set(SERVER_IDS) and v.coordinator is not None,
                      "three servers and a coordinator")
        yield uris
    finally:
        running.stop_all()
        watching.close()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    server = RunningServer(tmp_path_factory.mktemp("single") / "data")
    yield server
    server.stop()


def _adbc(uri: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(uri, autocommit=True)


def _rows(conn, sql: str) -> list[dict]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table().to_pylist()


def _local_count(uri: str, table: str) -> int:
    """Rows of the buckets ``uri``'s server leads (its replica status)."""
    return sum(r["rows"] for r in describe(uri, table)["replicas"] if r["role"] == "leader")


DDL = [
    "CREATE DATABASE shop",
    ("CREATE TABLE shop.users (id BIGINT, name STRING, score DOUBLE, PRIMARY KEY (id) NOT ENFORCED) "
     "WITH ('bucket.num' = '6')"),
    ("CREATE TABLE shop.orders (oid BIGINT, user_id BIGINT, amount DOUBLE, PRIMARY KEY (oid) NOT ENFORCED) "
     "WITH ('bucket.num' = '6')"),
    "CREATE TABLE shop.clicks (id BIGINT, page STRING) WITH ('bucket.num' = '6', 'bucket.key' = 'id')",
    ("CREATE TABLE shop.visits (dt STRING, user_id BIGINT, url STRING, PRIMARY KEY (dt, user_id) NOT ENFORCED) "
     "PARTITIONED BY (dt) WITH ('bucket.num' = '3')"),
]
WRITES = [
    "INSERT INTO shop.users VALUES " + ", ".join(f"({i}, 'u{i}', {i}.5)" for i in range(1, 41)),
    "INSERT INTO shop.orders VALUES " + ", ".join(f"({i}, {i % 7 + 1}, {i * 2}.0)" for i in range(1, 61)),
    "INSERT INTO shop.clicks VALUES " + ", ".join(f"({i}, 'p{i % 3}')" for i in range(100)),
    "INSERT INTO shop.users VALUES (2, 'bb', 22.0)",          # upsert
    "INSERT INTO shop.users (id, score) VALUES (3, 33.0)",    # partial update
    "DELETE FROM shop.users WHERE id = 1",
    "DELETE FROM shop.users WHERE id > 35",
    "UPDATE shop.orders SET amount = 0.0 WHERE user_id = 3",
    "INSERT INTO shop.visits VALUES " + ", ".join(f"('d{i % 2}', {i}, '/p{i}')" for i in range(30)),
    "DELETE FROM shop.visits WHERE dt = 'd1' AND user_id = 7",
]
QUERIES = [
    "SELECT * FROM shop.users WHERE id = 2",
    "SELECT name FROM shop.users WHERE id IN (3, 1, 99, 17, 5, 30)",
    "SELECT COUNT(*) AS n FROM shop.users",
    "SELECT COUNT(*) AS n FROM shop.clicks",
    "SELECT * FROM shop.users ORDER BY id",
    "SELECT id FROM shop.users WHERE score > 20 ORDER BY id",
    "SELECT page, COUNT(*) AS n, SUM(id) AS s FROM shop.clicks GROUP BY page ORDER BY page",
    ("SELECT u.name, SUM(o.amount) AS total FROM shop.orders o JOIN shop.users u ON o.user_id = u.id "
     "GROUP BY u.name ORDER BY u.name"),
    "SELECT id, _change_type FROM shop.users$changelog ORDER BY id, _log_offset",
    "SELECT * FROM shop.clicks WHERE id = 42",
    "SELECT dt, COUNT(*) AS n, MAX(url) AS m FROM shop.visits GROUP BY dt ORDER BY dt",
    "SELECT url FROM shop.visits WHERE dt = 'd0' AND user_id = 4",
    "SELECT user_id FROM shop.visits WHERE dt = 'd1' ORDER BY user_id",
]


def _scenario(connect, uris: list[str]) -> list:
    """DDL, writes and queries, each statement through the next URI (one URI: a single server)."""
    answers = []
    statements = DDL + WRITES
    for i, sql in enumerate(statements):
        conn = connect(uris[i % len(uris)])
        try:
            _rows(conn, sql)
        finally:
            conn.close()
    for i, sql in enumerate(QUERIES):
        conn = connect(uris[i % len(uris)])
        try:
            rows = _rows(conn, sql)
        finally:
            conn.close()
        answers.append(sorted(rows, key=repr) if "ORDER BY" not in sql else rows)
    return answers


def test_data_lives_on_leaders_and_any_server_answers_like_one(cluster, single, tmp_path):
    uris = cluster
    cluster_answers = _scenario(_adbc, [uris[i] for i in SERVER_IDS])
    single_answers = _scenario(_adbc, [single.uri])
    for sql, got, want in zip(QUERIES, cluster_answers, single_answers):
        assert got == want, sql
    assert cluster_answers[2] == [{"n": 34}]

    # Buckets on all three servers; each holds exactly the rows of the buckets it leads.
    for table, key in (("shop.users", "id"), ("shop.clicks", "id"), ("shop.orders", "oid"),
                       ("shop.visits", "user_id")):  # a partitioned table: by bucket within partitions
        buckets = describe(uris[1], table)["tables"][table]["buckets"]
        leaders = [b["leader"] for b in buckets]
        assert Counter(leaders) == dict.fromkeys(SERVER_IDS, len(leaders) // 3)
        reference = _adbc(single.uri)
        try:
            ids = pa.table({key: pa.array([r[key] for r in _rows(reference, f"SELECT {key} FROM {table}")],
                                          pa.int64())})
        finally:
            reference.close()
        expected = Counter(leaders[b] for b in bucket_ids(ids, [key], len(leaders)))
        held = {i: _local_count(uris[i], table) for i in SERVER_IDS}
        assert held == {i: expected[i] for i in SERVER_IDS}, (table, held)
        assert all(n > 0 for n in held.values()), (table, held)
    # A client cannot send what only a peer may: a call marked as forwarded is refused.
    keys = pa.table({"id": pa.array(list(range(1, 41)), pa.int64())})
    client = flight.FlightClient(uris[1])
    try:
        ticket = flight.Ticket(tickets.encode_custom({"op": "lookup", "table": "shop.users", "peer": True,
                                                      "table_id": "x", "buckets": [0],
                                                      "keys_ipc": tickets.encode_table(keys)}))
        with pytest.raises(flight.FlightUnauthorizedError, match="cluster's servers only"):
            client.do_get(ticket, CALL).read_all()
    finally:
        client.close()


def test_per_bucket_endpoints_name_every_leader(cluster):
    uris = cluster
    client = flight.FlightClient(uris[2])
    try:
        request = protocol.SetSessionOptionsRequest()
        request.session_options["flightstore.per-bucket-endpoints"].bool_value = True
        list(client.do_action(flight.Action(protocol.SET_SESSION_OPTIONS, request.SerializeToString()), CALL))
        command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT id FROM shop.clicks"))
        info = client.get_flight_info(flight.FlightDescriptor.for_command(command), CALL)
        assert len(info.endpoints) == 6
        named = [e.locations[0].uri.decode() for e in info.endpoints]
        assert set(named) == set(uris.values())
        ids = []
        for endpoint in info.endpoints:  # each read from the leader it names
            owner = flight.FlightClient(endpoint.locations[0])
            try:
                ids += owner.do_get(endpoint.ticket, CALL).read_all().column("id").to_pylist()
            finally:
                owner.close()
        assert sorted(ids) == list(range(100))
    finally:
        client.close()
    with flightstore.connect(uris[3]) as conn:  # the Python client reads each endpoint at its leader
        conn.set_session_options({"flightstore.per-bucket-endpoints": True})
        assert sorted(conn.sql("SELECT id FROM shop.clicks").column("id").to_pylist()) == list(range(100))
        assert sorted(conn._peers) == sorted([uris[1], uris[2]])


def _client_scenario(uri: str) -> dict:
    """The Python client's writes and reads (each bucket's from its leader in a cluster)."""
    with flightstore.connect(uri) as conn:
        conn.sql("CREATE TABLE shop.kv (k BIGINT, v STRING, n BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
                 "WITH ('bucket.num' = '6')")
        kv = conn.table("shop.kv")
        kv.upsert(pa.table({"k": pa.array(range(50), pa.int64()), "v": [f"v{i}" for i in range(50)],
                            "n": pa.array(range(50), pa.int64())}))
        kv.upsert(pa.table({"k": pa.array([3, 4], pa.int64()), "n": pa.array([300, 400], pa.int64())}),
                  columns=["k", "n"])
        kv.delete(pa.table({"k": pa.array([5, 6, 7], pa.int64())}))
        many = pa.table({"k": pa.array(range(1000, 13_000), pa.int64()), "v": ["x"] * 12_000,
                         "n": pa.array([1] * 12_000, pa.int64())})
        kv.upsert(many)  # chunks of 2000 rows: each leader numbers its own run of batches
        kv.upsert(pa.table({"k": pa.array([1000], pa.int64()), "n": pa.array([2], pa.int64())}), columns=["k", "n"])
        ends = kv.offsets("end")
        with kv.subscribe("earliest", until=ends) as subscription:
            changes = pa.Table.from_batches(list(subscription))
        answers = {
            "one": kv.lookup({"k": [4]}).to_pylist(),
            "many": kv.lookup({"k": [9, 3, 77, 5, 20]}).to_pylist(),
            "count": kv.row_count(),
            "scan": sorted(kv.scan(columns=["k", "n"]).to_pylist(), key=lambda r: r["k"]),
            "filtered": sorted(kv.scan(filter=Comparison("n", ">", 45)).column("k").to_pylist()),
            "changes": Counter(changes.column("_change_type").to_pylist()),
            "sql": conn.sql("SELECT SUM(n) AS s, COUNT(*) AS c FROM shop.kv").to_pylist(),
            "direct": sorted(conn._peers),
        }
        return answers


def test_python_client_reads_and_writes_leaders_directly(cluster, single):
    uris = cluster
    got = _client_scenario(uris[1])
    want = _client_scenario(single.uri)
    assert want.pop("direct") == []
    assert got.pop("direct") == sorted([uris[2], uris[3]])  # it talked to the other leaders itself
    assert got == want
    assert got["one"] == [{"k": 4, "v": "v4", "n": 400}] and got["count"] == 12_047
    held = {i: _local_count(uris[i], "shop.kv") for i in SERVER_IDS}
    assert sum(held.values()) == 12_047 and all(held.values())


def test_lookups_travel_on_each_leaders_stream(cluster):
    """The Python client's lookups and prefix lookups (with and without limit) of keys of every
    server's buckets, missing keys and keys given twice, answer what SELECT ... WHERE answers, in
    key order, each key on its leader's lookup stream: no DoGet is served for them. So do the
    batched lookuper's."""
    uris = cluster
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE DATABASE IF NOT EXISTS routed")
        try:
            conn.sql("CREATE TABLE routed.kv (g INT, k BIGINT, v STRING, PRIMARY KEY (g, k) NOT ENFORCED) "
                     "WITH ('bucket.num' = '6', 'bucket.key' = 'g')")
            kv = conn.table("routed.kv")
            kv.upsert(pa.table({"g": pa.array([i % 9 for i in range(40)], pa.int32()),
                                "k": pa.array(range(40), pa.int64()),
                                "v": [None if i % 5 == 0 else f"v{i}" for i in range(40)]}))
            keys = [(g, k) for g, k in [(1, 10), (8, 17), (0, 0), (3, 3), (9, 9), (2, 2), (5, 14), (1, 10),
                                         (4, 99), (7, 7), (6, 33), (0, 36)]]
            groups, limit = [5, 0, 9, 5, 2, 7, 3], 6
            point = pa.concat_tables([conn.sql(f"SELECT * FROM routed.kv WHERE g = {g} AND k = {k}")
                                      for g, k in keys]).to_pylist()
            by_group = pa.concat_tables([conn.sql(f"SELECT * FROM routed.kv WHERE g = {g} ORDER BY k")
                                         for g in groups]).to_pylist()
            layout = kv._locations()
            g_column = pa.table({"g": pa.array([g for g, _ in keys] + groups, pa.int32())})
            leaders = {layout["leaders"][b] for b in bucket_ids(g_column, ["g"], 6).tolist()}
            assert leaders == set(uris.values())  # keys of every server's buckets
            before = {uri: describe(uri)["served"] for uri in uris.values()}
            assert kv.lookup({"g": [g for g, _ in keys], "k": [k for _, k in keys]}).to_pylist() == point
            assert kv.prefix_lookup({"g": groups}).to_pylist() == by_group
            assert kv.prefix_lookup({"g": groups}, limit=limit).to_pylist() == by_group[:limit]
            with kv.lookuper(options={"client.lookup.batch-timeout": "20ms"}) as lookuper:  # batched
                futures = [lookuper.lookup_async(key) for key in keys]
                assert [row for f in futures for row in f.result(60).to_pylist()] == point
            after = {uri: describe(uri)["served"] for uri in uris.values()}
            for uri in uris.values():
                assert after[uri]["calls"].get("DoGet", 0) == before[uri]["calls"].get("DoGet", 0), uri
                assert after[uri]["stream_lookups"] > before[uri]["stream_lookups"], uri
        finally:  # the module's other tests compare listings with a single server
            conn.sql("DROP TABLE IF EXISTS routed.kv")
            conn.sql("DROP DATABASE IF EXISTS routed")


@pytest.mark.slow
def test_spark_reads_and_writes_through_any_server(cluster, spark):
    uris = cluster
    with flightstore.connect(uris[3]) as conn:
        conn.sql("CREATE DATABASE IF NOT EXISTS sparkdb")
        conn.sql("CREATE TABLE sparkdb.sk (k BIGINT, a STRING, b BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
                 "WITH ('bucket.num' = '6')")
    frame = spark.range(0, 300).selectExpr("id AS k", "concat('a', id) AS a", "id * 2 AS b")
    frame.write.format("flightstore").option("uri", uris[2]).option("table", "sparkdb.sk").mode("append").save()
    held = {i: _local_count(uris[i], "sparkdb.sk") for i in SERVER_IDS}
    assert sum(held.values()) == 300 and all(held.values())
    def reader():
        return spark.read.format("flightstore").option("uri", uris[1]).option("table", "sparkdb.sk")
    # By default at most the session's 2 cores' worth of partitions, but a partition never mixes two
    # leaders' buckets: one per leader here; asked for 6, one per bucket.
    for partitions, read in ((3, reader().load()), (6, reader().option("partitions", "6").load())):
        assert read.rdd.getNumPartitions() == partitions
        rows = {r["k"]: (r["a"], r["b"]) for r in read.collect()}
        assert rows == {k: (f"a{k}", 2 * k) for k in range(300)}
    with flightstore.connect(uris[1]) as conn:  # the module's other tests compare listings with a single server
        conn.sql("DROP TABLE sparkdb.sk")
        conn.sql("DROP DATABASE sparkdb")


def test_flightsql_dbapi_through_a_server_that_leads_few_buckets(cluster, single, dbapi_python, tmp_path):
    """flightsql-dbapi's whole script (DDL, DML, lookups, GROUP BY, joins, prepared statements,
    metadata) through server 2 answers what it answers on a single server."""
    uris = cluster
    got = run_client(dbapi_python, tmp_path, DBAPI_SCRIPT, int(uris[2].rsplit(":", 1)[1]))
    want = run_client(dbapi_python, tmp_path, DBAPI_SCRIPT, port_of(single))
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], name


def test_group_by_runs_its_partial_on_each_leader(cluster, single):
    """A GROUP BY through any server: every other leader runs the partial aggregate over its own
    buckets (its counter moves) and the answer equals a single server's."""
    uris = [cluster[i] for i in SERVER_IDS]
    ddl = ("CREATE TABLE agg.sales (id BIGINT, region STRING, amount DOUBLE) "
           "WITH ('bucket.num' = '6', 'bucket.key' = 'id')")
    insert = "INSERT INTO agg.sales VALUES " + ", ".join(
        f"({i}, 'r{i % 4}', {i % 17}.25)" for i in range(600))
    query = ("SELECT region, SUM(amount) AS s, AVG(amount) AS a, COUNT(*) AS n, MIN(id) AS lo, "
             "MAX(amount) AS hi FROM agg.sales WHERE id >= 10 GROUP BY region ORDER BY region")
    conn = _adbc(single.uri)
    try:
        _rows(conn, "CREATE DATABASE agg")
        _rows(conn, ddl)
        _rows(conn, insert)
        expected = _rows(conn, query)
    finally:
        conn.close()
    conn = _adbc(uris[0])
    try:
        _rows(conn, "CREATE DATABASE agg")
        _rows(conn, ddl)
        _rows(conn, insert)
    finally:
        conn.close()
    assert len(expected) == 4 and sum(r["n"] for r in expected) == 590
    for i, uri in enumerate(uris):
        before = {s: describe(cluster[s])["partial_aggregates"] for s in SERVER_IDS}
        conn = _adbc(uri)
        try:
            got = _rows(conn, query)
        finally:
            conn.close()
        assert [{**r, "a": round(r["a"], 9)} for r in got] == \
            [{**r, "a": round(r["a"], 9)} for r in expected]
        after = {s: describe(cluster[s])["partial_aggregates"] for s in SERVER_IDS}
        asked = SERVER_IDS[i]
        assert after[asked] == before[asked]  # its own partial runs in-process
        assert all(after[s] == before[s] + 1 for s in SERVER_IDS if s != asked), (before, after)

    # The leader-side op is no client command: a client sending it is refused before anything runs.
    client = flight.FlightClient(uris[0])
    try:
        ticket = flight.Ticket(tickets.encode_custom({"op": "partial", "table": "agg.sales",
                                                      "partial": "SELECT 1", "name": "t"}))
        with pytest.raises(flight.FlightUnauthorizedError, match="cluster's servers only"):
            client.do_get(ticket, CALL).read_all()
    finally:
        client.close()
