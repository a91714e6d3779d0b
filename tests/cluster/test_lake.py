"""The lake in cluster mode, over three real server processes and a real ZooKeeper: one server
tiers every bucket under the cluster's lease, every server reads the lake (``t$lake``, union
reads, time travel, status), TTL deletes tiered segments on leaders and followers, another server
takes over when the tierer dies, and lake options are honoured or refused, never ignored."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

import flightstore
from flightstore.errors import FlightstoreError, InvalidOption
from flightstore.lake.cluster import check_cluster_lake, cluster_lake_settings
from flightstore.lake.settings import LakeSettings
from tests.cluster.conftest import Servers, describe
from tests.forked_server import ForkedServerProcess
from tests.lake.test_pk_tiering import DUCKDB_PK_QUERY
from tests.lake.test_read import _duckdb_rows, duckdb_python  # noqa: F401 - a fixture
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(600)

IDS = (1, 2, 3)
EVENTS_QUERY = "SELECT seq, k, s, __bucket, __offset FROM iceberg_scan('{location}') ORDER BY __bucket, __offset"


def _lake_options(root) -> list[str]:
    return ["--option", f"datalake.iceberg.uri=sqlite:///{root / 'lake' / 'catalog.db'}",
            "--option", f"datalake.iceberg.warehouse={root / 'lake' / 'warehouse'}"]


def _cluster_args(root, replication: int, *extra: str) -> list[str]:
    return ["--option", f"default.replication.factor={replication}",
            "--option", "log.retention.check-interval=300ms",
            "--option", "datalake.tiering.retry-backoff.max=1s", *_lake_options(root), *extra]


def _start_all(servers: Servers, observer, replication: int = 2, *extra: str) -> dict[int, str]:
    uris = {i: servers.start(i, *_cluster_args(servers.root, replication, *extra)).uri for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    return uris


def _events(first: int, count: int) -> pa.Table:
    seq = list(range(first, first + count))
    return pa.table({"k": [s * 7 % 1000 for s in seq], "seq": seq, "s": [f"v{s}" for s in seq]})


EVENTS_DDL = ("CREATE TABLE ev (k BIGINT, seq BIGINT, s STRING) WITH ('bucket.num' = '3', 'bucket.key' = 'k', "
              "'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1s', 'table.log.ttl' = '1ms', "
              "'table.log.segment.bytes' = '2048')")
USERS_DDL = ("CREATE TABLE users (id BIGINT, name STRING, score BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH "
             "('bucket.num' = '3', 'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1s', "
             "'table.log.ttl' = '1ms', 'table.log.segment.bytes' = '2048', 'kv.snapshot.interval' = '1s')")


def _caught_up(uri: str, table: str) -> bool:
    """The tierer's status (asked through ``uri``): every bucket tiered up to its log end."""
    with flightstore.connect(uri) as conn:
        status = conn.lake_status(table)[0]
    return all(b["tiered_offset"] == b["log_end_offset"] for b in status["buckets"])


def _log_starts(uris: dict[int, str], table: str) -> dict[tuple[int, int], int]:
    """Every replica's log start offset, by (server, bucket)."""
    return {(server, r["bucket"]): r["log_start"] for server, uri in uris.items()
            for r in describe(uri, table)["replicas"]}


def _seqs(table: pa.Table) -> list[int]:
    return sorted(table.column("seq").to_pylist())


def _lake_catalog(root):
    return load_catalog("flightstore", type="sql", uri=f"sqlite:///{root / 'lake' / 'catalog.db'}",
                        warehouse=(root / "lake" / "warehouse").as_uri())


@pytest.mark.slow
def test_log_and_pk_tables_tier_in_a_cluster_and_every_server_reads_the_lake(
        servers, observer, duckdb_python, tmp_path):  # noqa: F811 - a fixture
    uris = _start_all(servers, observer)
    with flightstore.connect(uris[1]) as conn:
        conn.sql(EVENTS_DDL)
        conn.sql(USERS_DDL)
        ev, users = conn.table("ev", writer_id="w"), conn.table("users", writer_id="u")
        for first in range(0, 600, 60):  # several segments per bucket
            ev.append(_events(first, 60))
        ids = list(range(90))
        for version in range(4):  # several records, so segments roll, in every bucket
            users.upsert({"id": ids, "name": [f"n{i}" for i in ids], "score": [i + version for i in ids]})
        users.upsert({"id": [1, 2, 200], "name": ["one", "two", "new"], "score": [-1, -2, 200]})
        users.delete({"id": [3, 4]})
    view = observer.wait(lambda v: len(v.tables) == 2, "two tables")
    assert all(len(b.replicas) == 2 for r in view.tables.values() for b in r.buckets)
    assert sorted({b.leader for r in view.tables.values() for b in r.buckets}) == [1, 2, 3]  # spread
    for table in ("default.ev", "default.users"):  # the status through any server is the tierer's
        wait_until(lambda t=table: _caught_up(uris[3], t), f"{table} tiered", timeout=120)

    # TTL deletes tiered segments on every replica, leaders and followers alike.
    wait_until(lambda: all(start > 0 for start in _log_starts(uris, "default.ev").values()),
               "retention to delete tiered segments of every replica of ev", timeout=120)
    wait_until(lambda: all(start > 0 for start in _log_starts(uris, "default.users").values()),
               "retention to delete tiered segments of every replica of users", timeout=120)

    with flightstore.connect(uris[2]) as conn:
        conn.table("ev", writer_id="w2").append(_events(600, 9))  # a log tail not in the lake yet
    everything = list(range(609))
    catalog = _lake_catalog(servers.root)
    for server, uri in uris.items():
        with flightstore.connect(uri) as conn:
            # The union read: the lake below each bucket's tiered offset, each log tail at its leader.
            assert _seqs(conn.sql("SELECT seq FROM ev")) == everything, server
            assert conn.sql("SELECT COUNT(*) AS n FROM ev").to_pylist() == [{"n": 609}]
            assert _seqs(conn.sql("SELECT seq FROM ev WHERE k < 300")) == \
                [s for s in everything if s * 7 % 1000 < 300]
            kv = conn.sql("SELECT id, name, score FROM users ORDER BY id").to_pylist()
            assert conn.sql("SELECT id, name, score FROM users$lake ORDER BY id").to_pylist() == kv
            lake_seqs = _seqs(conn.sql("SELECT seq FROM ev$lake"))
            assert set(lake_seqs) >= set(range(600)) and len(lake_seqs) == len(set(lake_seqs))
            tierer = conn.lake_status("default.ev")[0]["tierer"]
            assert tierer is not None and tierer.startswith("server ")
    assert {r["id"] for r in kv} == (set(range(90)) - {3, 4}) | {200}

    # Time travel and other engines: DuckDB's iceberg_scan reads the same rows as t$lake.
    lake_ev = catalog.load_table("default.ev")
    snapshot = lake_ev.current_snapshot().snapshot_id
    key = [("__bucket", "ascending"), ("__offset", "ascending")]
    with flightstore.connect(uris[3]) as conn:
        at = conn.sql(f"SELECT seq, k, s, __bucket, __offset FROM ev$lake FOR SYSTEM_TIME AS OF {snapshot}")
        first_commit = conn.sql("SELECT snapshot_id FROM ev$lake$snapshots ORDER BY committed_at LIMIT 1")
        oldest = conn.sql(f"SELECT seq FROM ev$lake FOR SYSTEM_TIME AS OF {first_commit.column(0)[0]}")
    assert 0 < oldest.num_rows <= at.num_rows
    assert _duckdb_rows(duckdb_python, tmp_path, lake_ev.metadata_location, query=EVENTS_QUERY) == \
        [list(r.values()) for r in at.sort_by(key).to_pylist()]
    lake_users = catalog.load_table("default.users")
    duck = _duckdb_rows(duckdb_python, tmp_path, lake_users.metadata_location, query=DUCKDB_PK_QUERY)
    assert duck == [[r["id"], r["name"], r["score"]] for r in kv]


@pytest.mark.slow
def test_another_server_takes_over_tiering_when_the_tierer_dies(servers, observer):
    # Replication factor 2: a bucket whose leader dies is led by its only in-sync replica left,
    # which must still commit writes alone (min in-sync 1).
    uris = _start_all(servers, observer)
    with flightstore.connect(uris[1]) as conn:
        conn.sql(EVENTS_DDL.replace("'table.log.ttl' = '1ms', ", ""))
        conn.table("ev", writer_id="w").append(_events(0, 300))
    wait_until(lambda: _caught_up(uris[2], "default.ev"), "ev tiered", timeout=120)
    victim = json.loads(observer.client.get(f"{observer.paths.root}/lake/tierer")[0])["server_id"]
    servers.running[victim].kill()  # kill -9: its lease goes with its ZooKeeper session
    live = {i: u for i, u in uris.items() if i != victim}
    observer.wait(lambda v: all(b.leader in live for r in v.tables.values() for b in r.buckets),
                  "leaders moving off the dead server")
    entry = next(iter(live.values()))
    with flightstore.connect(entry) as conn:  # writes go on through the survivors (failover)
        conn.table("ev", writer_id="w2").append(_events(300, 200))

    def taken_over() -> bool:
        with flightstore.connect(entry) as conn:
            status = conn.lake_status("default.ev")[0]
        return status["tierer"] is not None and not status["tierer"].startswith(f"server {victim} ") and \
            all(b["tiered_offset"] == b["log_end_offset"] for b in status["buckets"])
    wait_until(taken_over, "another server to take over tiering", timeout=180)
    for uri in live.values():
        with flightstore.connect(uri) as conn:
            # No duplicate, no gap: every row in the lake exactly once.
            assert _seqs(conn.sql("SELECT seq FROM ev$lake")) == list(range(500))
            assert _seqs(conn.sql("SELECT seq FROM ev")) == list(range(500))
    lake = _lake_catalog(servers.root).load_table("default.ev")
    from flightstore.lake.offsets import committed_offsets
    with flightstore.connect(entry) as conn:
        ends = {int(b): o for b, o in conn.table("ev").describe()["end_offsets"].items()}
    assert committed_offsets(lake) == ends


@pytest.mark.slow
def test_the_spark_tiering_job_tiers_a_cluster_through_any_server(servers, observer, spark):
    from flightstore_spark.pipelines.tiering import tier_tables
    # The servers only follow what the job commits (retention, status).
    uris = _start_all(servers, observer, 2, "--option", "datalake.tiering.enabled=false")
    with flightstore.connect(uris[1]) as conn:
        conn.sql(EVENTS_DDL)
        conn.sql(USERS_DDL)
        for first in range(0, 400, 50):
            conn.table("ev", writer_id="w").append(_events(first, 50))
        ids = list(range(60))
        for version in range(3):
            conn.table("users", writer_id="u").upsert({"id": ids, "name": [f"n{i}" for i in ids],
                                                      "score": [i * version for i in ids]})
        conn.table("users", writer_id="u").delete({"id": [5]})
    settings = LakeSettings.from_options(servers.root, {
        "datalake.iceberg.uri": f"sqlite:///{servers.root / 'lake' / 'catalog.db'}",
        "datalake.iceberg.warehouse": str(servers.root / "lake" / "warehouse")})
    outcome = tier_tables(spark, uris[2], settings)  # any server: each bucket is read at its leader
    assert sum(r.rows for r in outcome["default.ev"]) == 400
    with flightstore.connect(uris[3]) as conn:
        assert _seqs(conn.sql("SELECT seq FROM ev$lake")) == list(range(400))
        kv = conn.sql("SELECT id, name, score FROM users ORDER BY id").to_pylist()
        assert conn.sql("SELECT id, name, score FROM users$lake ORDER BY id").to_pylist() == kv
        assert len(kv) == 59
        for table in ("default.ev", "default.users"):
            status = conn.lake_status(table)[0]
            assert all(b["tiered_offset"] == b["log_end_offset"] for b in status["buckets"])
    # Every server follows the job's commits: TTL deletes the tiered segments of every replica.
    for table in ("default.ev", "default.users"):
        wait_until(lambda t=table: all(start > 0 for start in _log_starts(uris, t).values()),
                   f"retention to delete tiered segments of every replica of {table}", timeout=120)
    with flightstore.connect(uris[1]) as conn:
        assert _seqs(conn.sql("SELECT seq FROM ev")) == list(range(400))  # the lake answers the rest


@pytest.mark.slow
def test_a_cluster_without_a_lake_refuses_lake_options_and_datalake_tables(servers, observer):
    # A lake option without the shared catalog and warehouse: refused at start, naming them.
    process = ForkedServerProcess(servers.args(2, "--option", "datalake.tiering.lease=10s"),
                                  log=servers.root / "refused.log")
    with pytest.raises(FlightstoreError, match="datalake.iceberg.uri and datalake.iceberg.warehouse"):
        process.start(timeout=120)
    # A cluster without a lake refuses datalake-enabled tables instead of never tiering them.
    uri = servers.start(1).uri
    observer.wait(lambda v: 1 in v.servers and v.coordinator is not None, "server 1")
    with flightstore.connect(uri) as conn:
        with pytest.raises(Exception, match="needs the cluster's lake"):
            conn.sql(EVENTS_DDL)
        assert conn.sql("SHOW TABLES").num_rows == 0


def test_every_member_must_name_the_clusters_lake(members, tmp_path):
    lake = LakeSettings.from_options(tmp_path, {"datalake.iceberg.uri": "postgresql://tierer:s3cret@db/lake",
                                                "datalake.iceberg.warehouse": str(tmp_path / "warehouse")})
    first = members.start(1)
    check_cluster_lake(first, None)  # no lake in the cluster, none here: fine
    check_cluster_lake(first, lake)  # the first member with a lake records it...
    check_cluster_lake(members.start(2), lake)  # ...the same lake is welcome...
    recorded = first.client.get(first.paths.lake_settings)[0].decode()
    assert "s3cret" not in recorded and "tierer:***@db" in recorded  # no credentials in ZooKeeper
    elsewhere = LakeSettings.from_options(tmp_path, {"datalake.iceberg.uri": "postgresql://tierer:s3cret@db/lake",
                                                     "datalake.iceberg.warehouse": str(tmp_path / "other")})
    third = members.start(3)
    with pytest.raises(InvalidOption, match="is not the cluster's"):  # ...another is not,
        check_cluster_lake(third, elsewhere)
    with pytest.raises(InvalidOption, match="this cluster's lake is catalog postgresql://tierer:\\*\\*\\*@db"):
        check_cluster_lake(third, None)  # ...nor none at all


def test_lake_options_of_a_cluster_member():
    assert cluster_lake_settings("/srv/data", {"log.fsync": True}) is None  # no lake at all
    for partial in ({"datalake.tiering.enabled": False}, {"datalake.iceberg.uri": "sqlite:////lake/c.db"}):
        with pytest.raises(InvalidOption, match="set datalake.iceberg"):
            cluster_lake_settings("/srv/data", partial)
    shared = cluster_lake_settings("/srv/data", {"datalake.iceberg.uri": "sqlite:////lake/c.db",
                                                 "datalake.iceberg.warehouse": "/lake/warehouse",
                                                 "datalake.tiering.max-round-rows": 1000})
    assert (shared.catalog_uri, shared.warehouse, shared.max_round_rows) == \
        ("sqlite:////lake/c.db", "file:///lake/warehouse", 1000)
