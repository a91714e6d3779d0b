"""``flightstore serve --workers N``: real worker processes on one machine, against one server.

Answers through any worker equal a single server's (lookups, prefix lookups, scans, SQL; writes
through any worker), a worker killed with -9 is restarted by worker 0 with its data, and SIGTERM
(or the death of worker 0) stops every worker."""

from __future__ import annotations

import os
import random
import signal
import socket
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyarrow import flight

import flightstore
from flightstore.bucketing import bucket_ids
from flightstore.cluster.local import ServerProcess
from flightstore.lookup_stream import LookupStream
from flightstore.wire import lookups as wire
from tests.cluster.conftest import describe
from tests.server.conftest import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(600)]

WORKERS = 3


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Group:
    """A ``serve --workers`` process group (worker 0 is the process started here)."""

    def __init__(self, root, workers: int = WORKERS) -> None:
        self.root = root
        self.process = ServerProcess(["--data-dir", str(root / "data"), "--port", "0", "--workers",
                                      str(workers), "--no-fsync"], stderr=root / "workers.log").start()
        self.uri = self.process.uri

    def status(self) -> dict:
        return describe(self.uri)

    def uris(self) -> dict[int, str]:
        return {int(i): s["uri"] for i, s in self.status()["servers"].items()}

    def children(self) -> dict[int, dict]:
        return {int(k): v for k, v in self.status()["processes"].items()}


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    running = Group(tmp_path_factory.mktemp("workers"))
    yield running
    running.process.kill()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("single") / "data")
    yield running
    running.stop()


DDL = ("CREATE TABLE {name} (a BIGINT, b STRING, v BIGINT, PRIMARY KEY (a, b) NOT ENFORCED) "
       "WITH ('bucket.num' = '5', 'bucket.key' = 'a')")
keys = st.tuples(st.integers(0, 12), st.sampled_from(["x", "y", "z"]))
batches = st.lists(st.tuples(st.sampled_from(["upsert", "delete"]),
                             st.lists(st.tuples(keys, st.one_of(st.none(), st.integers(-50, 50))),
                                      min_size=1, max_size=12)), min_size=1, max_size=5)


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: tuple((v is None, str(v)) for v in row.values()))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=batches, probes=st.lists(keys, min_size=1, max_size=8))
# Keys given twice, spread over every worker's buckets: each answers twice (once answered n x n).
@example(writes=[("upsert", [((k, "x"), k) for k in range(13)])], probes=[(k, "x") for k in range(13)] * 2)
def test_answers_through_any_worker_equal_a_single_servers(group, single, writes, probes):
    name = f"t_{uuid.uuid4().hex[:8]}"
    uris = list(group.uris().values())
    assert len(uris) == WORKERS
    with flightstore.connect(single.uri, timeout=60) as one:
        one.sql(DDL.format(name=name))
        connections = [flightstore.connect(uri, timeout=60) for uri in uris]
        try:
            connections[len(writes) % WORKERS].sql(DDL.format(name=name))
            for i, (op, rows) in enumerate(writes):  # each batch through another worker
                data = {"a": [k[0] for k, _ in rows], "b": [k[1] for k, _ in rows], "v": [v for _, v in rows]}
                if op == "delete":
                    data = {"a": data["a"], "b": data["b"]}
                getattr(one.table(name), op)(data)
                getattr(connections[i % WORKERS].table(name), op)(data)
            lookup = {"a": [k[0] for k in probes], "b": [k[1] for k in probes]}
            expected = {
                "lookup": one.table(name).lookup(lookup).to_pylist(),
                "prefix": _sorted(one.table(name).prefix_lookup({"a": lookup["a"][:2]})),
                "scan": _sorted(one.table(name).scan()),
                "rows": one.sql(f"SELECT * FROM {name} ORDER BY a, b").to_pylist(),
                "groups": one.sql(f"SELECT a, count(*) AS n, sum(v) AS s FROM {name} "
                                  "GROUP BY a ORDER BY a").to_pylist(),
                "point": one.sql(f"SELECT * FROM {name} WHERE a = {probes[0][0]} AND b = '{probes[0][1]}'").to_pylist(),
                "count": one.sql(f"SELECT count(*) AS n FROM {name}").to_pylist(),
            }
            for conn in connections:
                table = conn.table(name)
                assert table.lookup(lookup).to_pylist() == expected["lookup"]
                assert _sorted(table.prefix_lookup({"a": lookup["a"][:2]})) == expected["prefix"]
                assert _sorted(table.scan()) == expected["scan"]
                assert conn.sql(f"SELECT * FROM {name} ORDER BY a, b").to_pylist() == expected["rows"]
                assert conn.sql(f"SELECT a, count(*) AS n, sum(v) AS s FROM {name} GROUP BY a "
                                "ORDER BY a").to_pylist() == expected["groups"]
                assert conn.sql(f"SELECT * FROM {name} WHERE a = {probes[0][0]} AND b = "
                                f"'{probes[0][1]}'").to_pylist() == expected["point"]
                assert conn.sql(f"SELECT count(*) AS n FROM {name}").to_pylist() == expected["count"]
        finally:
            for conn in connections:
                conn.close()


@pytest.fixture(scope="module")
def routed(group):
    """A composite-key table in the group (bucket key ``a``, 5 buckets over every worker): keys
    ``(a, b)`` for a in 0..12, b in x, y (``z`` and other ``a`` are missing), NULLs in ``v``."""
    with flightstore.connect(group.uri, timeout=60) as conn:
        conn.sql(DDL.format(name="routed"))
        conn.table("routed").upsert({"a": [a for a in range(13) for _ in "xy"], "b": ["x", "y"] * 13,
                                     "v": [None if i % 4 == 0 else i for i in range(26)]})
        yield conn


def _served(group) -> dict[str, dict]:
    """Each worker's calls served so far (by URI)."""
    return {uri: describe(uri)["served"] for uri in group.uris().values()}


def _leaders_of(table, a_values: list[int]) -> set[str]:
    layout = table._locations()
    buckets = bucket_ids(pa.table({"a": pa.array(a_values, pa.int64())}), ["a"], layout["num_buckets"])
    return {layout["leaders"][b] for b in buckets.tolist()}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(probes=st.lists(st.tuples(st.integers(-1, 14), st.sampled_from(["x", "y", "z"])), min_size=1, max_size=10),
       prefixes=st.lists(st.integers(-1, 14), min_size=1, max_size=5),
       limit=st.one_of(st.none(), st.integers(0, 6)))
# Every worker's buckets, keys given twice, missing keys; prefixes over every worker, one twice.
@example(probes=[(a, "x") for a in range(13)] * 2 + [(13, "x"), (2, "z")], prefixes=[4, 1, 4, 2, 3, 14],
         limit=None)
@example(probes=[(0, "y")], prefixes=[4, 1, 4, 2, 3], limit=5)
def test_lookups_on_the_leaders_streams_equal_select_where(group, routed, probes, prefixes, limit):
    """Lookups and prefix lookups (with and without limit) through a connection to worker 0 are
    answered on each key's leader's lookup stream (no DoGet), in key order, exactly as
    SELECT ... WHERE answers each key."""
    conn = routed
    point = [conn.sql(f"SELECT a, b, v FROM routed WHERE a = {a} AND b = '{b}'") for a, b in probes]
    by_prefix = [conn.sql(f"SELECT a, b, v FROM routed WHERE a = {a} ORDER BY b") for a in prefixes]
    expected_prefix = pa.concat_tables(by_prefix)
    if limit is not None:
        expected_prefix = expected_prefix.slice(0, limit)
    table = conn.table("routed")
    before = _served(group)
    found = table.lookup({"a": [a for a, _ in probes], "b": [b for _, b in probes]})
    assert found.to_pylist() == pa.concat_tables(point).to_pylist()
    assert table.prefix_lookup({"a": prefixes}, limit=limit).to_pylist() == expected_prefix.to_pylist()
    after = _served(group)
    for uri in after:  # no DoGet anywhere: the leaders answered on their streams
        assert after[uri]["calls"].get("DoGet", 0) == before[uri]["calls"].get("DoGet", 0), uri
    for uri in _leaders_of(table, [a for a, _ in probes] + prefixes):
        assert after[uri]["stream_lookups"] > before[uri]["stream_lookups"], uri


def test_a_routed_request_to_a_worker_that_does_not_lead_gets_not_leader(group, routed):
    """At the wire: a routed handle's keys of another worker's bucket fail with NOT_LEADER (and
    keys of its own and another's bucket too: no partial answer); an unrouted handle's are
    forwarded. Through the client, a stale layout (every bucket at the wrong worker) or one naming
    a server that is not there is asked again and the lookup answered right."""
    table = routed.table("routed")
    layout = table._locations()
    uris = list(group.uris().values())
    mine, other = uris[0], layout["leaders"][1]  # bucket 0: worker 0's; bucket 1: another's
    assert other != mine
    a_of = {b: next(a for a in range(13) if bucket_ids(pa.table({"a": pa.array([a], pa.int64())}), ["a"], 5)[0] == b)
            for b in (0, 1)}
    stream = LookupStream(flight.FlightClient(mine), flight.FlightCallOptions(), mine)
    try:
        routed_spec = wire.HandleSpec("routed", routed=True)
        opened = stream.opened(routed_spec, 60)
        keys = pa.record_batch({"a": pa.array([a_of[1]], pa.int64()), "b": ["x"]})
        with pytest.raises(wire.NotLeaderError, match="does not lead"):
            stream.submit(opened, routed_spec, keys).result(60)
        both = pa.record_batch({"a": pa.array([a_of[0], a_of[1]], pa.int64()), "b": ["x", "x"]})
        with pytest.raises(wire.NotLeaderError):
            stream.submit(opened, routed_spec, both).result(60)
        own = stream.submit(opened, routed_spec, both.slice(0, 1)).result(60)
        assert own.to_pylist() == routed.sql(f"SELECT * FROM routed WHERE a = {a_of[0]} AND b = 'x'").to_pylist()
        plain = wire.HandleSpec("routed")
        forwarded = stream.submit(stream.opened(plain, 60), plain, both).result(60)
        assert forwarded.to_pylist() == routed.sql(
            f"SELECT * FROM routed WHERE b = 'x' AND a IN ({a_of[0]}, {a_of[1]}) "
            f"ORDER BY a = {a_of[1]}").to_pylist()
    finally:
        stream.close()
    probe = {"a": list(range(13)), "b": ["y"] * 13}
    expected = routed.sql("SELECT * FROM routed WHERE b = 'y' ORDER BY a").to_pylist()
    with flightstore.connect(group.uri, timeout=60) as conn:
        stale = conn.table("routed")
        truth = stale._locations()
        wrong = {u: uris[(uris.index(u) + 1) % len(uris)] for u in uris}
        with socket.socket() as sock:  # a port nobody serves
            sock.bind(("127.0.0.1", 0))
            nobody = f"grpc://127.0.0.1:{sock.getsockname()[1]}"
        calls = [(lambda: stale.lookup(probe), expected),
                 (lambda: stale.prefix_lookup({"a": [3, 1]}, limit=3),
                  routed.sql("SELECT * FROM routed WHERE a IN (3, 1) ORDER BY a = 1, b LIMIT 3").to_pylist())]
        for leaders in ([wrong[u] for u in truth["leaders"]], [nobody] * len(truth["leaders"])):
            for call, answer in calls:
                stale._layout = {**truth, "leaders": leaders}
                assert call().to_pylist() == answer
                assert stale._layout["leaders"] == truth["leaders"]  # asked again


def test_the_lookuper_sends_each_leaders_share_on_its_stream(group, routed):
    """The batched lookuper splits each batch by its keys' leaders: every future answers what
    SELECT ... WHERE answers for its key (missing keys, keys given twice, prefixes), each leader
    answers its share on its own stream (no DoGet anywhere: nothing was forwarded), and a stale
    layout (every bucket at the wrong worker, or at a port nobody serves) is asked again."""
    rows = {(r["a"], r["b"]): r for r in routed.sql("SELECT * FROM routed").to_pylist()}
    probes = [(a, b) for a in range(-1, 15) for b in "xyz"]
    random.Random(23).shuffle(probes)
    probes += probes[:7]
    by_a = {a: sorted((r for r in rows.values() if r["a"] == a), key=lambda r: r["b"]) for a in range(-1, 15)}
    uris = list(group.uris().values())
    with socket.socket() as sock:  # a port nobody serves
        sock.bind(("127.0.0.1", 0))
        nobody = f"grpc://127.0.0.1:{sock.getsockname()[1]}"
    with flightstore.connect(group.uri, timeout=60) as conn:
        table = conn.table("routed")
        truth = table._locations()
        wrong = {u: uris[(uris.index(u) + 1) % len(uris)] for u in uris}
        options = {"client.lookup.max-batch-size": 16, "client.lookup.batch-timeout": "20ms"}
        for leaders in (truth["leaders"], [wrong[u] for u in truth["leaders"]], [nobody] * len(truth["leaders"])):
            table._layout = {**truth, "leaders": leaders}
            before = _served(group)
            with table.lookuper(options=options) as lookuper:
                futures = [lookuper.lookup_async(key) for key in probes]
                found = [f.result(60).to_pylist() for f in futures]
            with table.lookuper(prefix=["a"], options=options) as lookuper:
                futures = [lookuper.lookup_async(a) for a in range(-1, 15)]
                prefixed = [f.result(60).to_pylist() for f in futures]
            after = _served(group)
            assert found == [[rows[key]] if key in rows else [] for key in probes]
            assert prefixed == [by_a[a] for a in range(-1, 15)]
            assert table._layout["leaders"] == truth["leaders"]  # asked again when stale
            for uri in after:  # no DoGet anywhere: no worker forwarded a key to another
                assert after[uri]["calls"].get("DoGet", 0) == before[uri]["calls"].get("DoGet", 0), uri
            for uri in set(truth["leaders"]):  # and every leader answered its share
                assert after[uri]["stream_lookups"] > before[uri]["stream_lookups"], uri


def test_single_integer_keys_are_answered_on_their_leaders_without_arrow(group):
    """A single key of integer columns on a routed handle takes each leader's point path
    (:mod:`flightstore.server.point_lookups`): the rows SELECT ... WHERE answers, every leader's
    ``point_lookups`` moves; a key of another worker's bucket still gets NOT_LEADER, not a row."""
    with flightstore.connect(group.uri, timeout=60) as conn:
        conn.sql("CREATE TABLE points (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '5')")
        conn.table("points").upsert({"k": list(range(30)), "v": [None if k % 4 == 0 else f"v{k}" for k in range(30)]})
        table = conn.table("points")
        layout = table._locations()
        before = _served(group)
        for k in [*range(-2, 32)]:
            assert table.lookup({"k": [k]}).to_pylist() == conn.sql(f"SELECT * FROM points WHERE k = {k}").to_pylist()
        after = _served(group)
        leaders = {layout["leaders"][b] for b in bucket_ids(pa.table({"k": pa.array(range(30), pa.int64())}), ["k"],
                                                             5).tolist()}
        for uri in leaders:
            assert after[uri]["point_lookups"] > before[uri]["point_lookups"], uri
        # each lookup went straight to its key's leader (the client places one integer key on
        # Python ints: routed_lookups.point_leader), answered there once: no NOT_LEADER detour
        assert sum(after[u]["point_lookups"] - before[u]["point_lookups"] for u in after) == 34
        mine = group.uri
        stranger = next(k for k in range(30) if layout["leaders"][
            bucket_ids(pa.table({"k": pa.array([k], pa.int64())}), ["k"], 5)[0]] != mine)
        stream = LookupStream(flight.FlightClient(mine), flight.FlightCallOptions(), mine)
        try:
            spec = wire.HandleSpec("points", routed=True)
            opened = stream.opened(spec, 60)
            with pytest.raises(wire.NotLeaderError, match="does not lead"):
                stream.submit(opened, spec, pa.record_batch({"k": pa.array([stranger], pa.int64())})).result(60)
        finally:
            stream.close()


def test_partitioned_lookups_in_workers_answer_what_select_where_answers(group):
    """A partitioned table's lookups are not routed (the DoGet way, forwarded): still exact."""
    with flightstore.connect(group.uri, timeout=60) as conn:
        conn.sql("CREATE TABLE parted (dt STRING, id BIGINT, v BIGINT, PRIMARY KEY (dt, id) NOT ENFORCED) "
                 "PARTITIONED BY (dt) WITH ('bucket.num' = '3')")
        days = ["2026-01-01", "2026-01-02"]
        conn.table("parted").upsert({"dt": [days[i % 2] for i in range(20)], "id": list(range(20)),
                                     "v": [None if i % 3 == 0 else i for i in range(20)]})
        probe = [(days[1], 3), (days[0], 4), (days[0], 3), ("2026-02-01", 1), (days[1], 19), (days[0], 4)]
        expected = [conn.sql(f"SELECT * FROM parted WHERE dt = '{d}' AND id = {i}") for d, i in probe]
        table = conn.table("parted")
        assert table.lookup({"dt": [d for d, _ in probe], "id": [i for _, i in probe]}).to_pylist() == \
            pa.concat_tables(expected).to_pylist()


def test_every_worker_leads_its_share_of_the_buckets(group):
    with flightstore.connect(group.uri, timeout=60) as conn:
        conn.sql(DDL.format(name="shares"))
        leaders = conn.table("shares")._locations()["leaders"]
    uris = group.uris()
    assert leaders == [uris[b % WORKERS] for b in range(5)]
    assert uris[0] == group.uri  # worker 0: the port the user gave


def test_a_worker_killed_with_minus_9_is_restarted_with_its_data(group):
    with flightstore.connect(group.uri, timeout=60) as conn:
        conn.sql("CREATE TABLE survives (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) "
                 "WITH ('bucket.num' = '6')")
        conn.table("survives").upsert({"k": list(range(60)), "v": [f"v{k}" for k in range(60)]})
        before = conn.sql("SELECT * FROM survives ORDER BY k")
    victim = group.children()[1]
    with flightstore.connect(group.uri, timeout=60) as conn:  # its layout names the killed worker
        cached = conn.table("survives")
        assert cached.lookup({"k": list(range(60))}).to_pylist() == before.to_pylist()
        os.kill(victim["pid"], signal.SIGKILL)
        # While worker 1 is down and restarted, lookups of every bucket answer right or fail
        # clearly: the client asks the locations again and resends, never answers in part.
        assert cached.lookup({"k": list(range(60))}).to_pylist() == before.to_pylist()
        assert cached.prefix_lookup({"k": [59, 0, 31]}).to_pylist() == before.take([59, 0, 31]).to_pylist()
        # So do the lookuper's futures: each answers its key's row, or fails (never wrong, never hangs).
        with cached.lookuper(options={"client.lookup.max-batch-size": 8}) as lookuper:
            futures = [lookuper.lookup_async(k) for k in range(60)]
            for k, future in enumerate(futures):
                try:
                    assert future.result(120).to_pylist() == before.slice(k, 1).to_pylist()
                except (flight.FlightUnavailableError, flight.FlightTimedOutError):
                    pass
    restarted = wait_until(lambda: (lambda c: c if c["alive"] and c["pid"] != victim["pid"]
                                    and group.uris().get(1) == c["uri"] else None)(group.children()[1]),
                           "worker 1 restarted")
    assert restarted["restarts"] == 1 and restarted["last_exit"] == -signal.SIGKILL
    with flightstore.connect(group.uri, timeout=60) as conn:
        assert conn.sql("SELECT * FROM survives ORDER BY k").equals(before)
        assert conn.table("survives").lookup({"k": [1, 7, 13]}).column("v").to_pylist() == ["v1", "v7", "v13"]
        conn.table("survives").upsert({"k": [1], "v": ["after"]})  # its buckets take writes again
        assert conn.table("survives").lookup({"k": [1]}).column("v").to_pylist() == ["after"]


def test_sigterm_stops_every_worker(group):
    children = [c["pid"] for c in group.children().values()]
    assert children and all(_alive(pid) for pid in children)
    assert group.process.stop(120) == 0
    wait_until(lambda: not any(_alive(pid) for pid in children), "every worker stopped", timeout=60)


@pytest.mark.slow
def test_workers_stop_when_worker_0_is_killed(tmp_path):
    running = Group(tmp_path, workers=2)
    try:
        child = running.children()[1]["pid"]
        running.process.kill()
        wait_until(lambda: not _alive(child), "worker 1 stopped after worker 0 died", timeout=60)
    finally:
        running.process.kill()


def test_a_data_directory_keeps_its_number_of_workers(tmp_path):
    running = Group(tmp_path, workers=2)
    running.process.stop(120)
    for args in (["--workers", "3"], []):
        process = ServerProcess(["--data-dir", str(tmp_path / "data"), "--port", "0", *args],
                                stderr=tmp_path / "again.log")
        with pytest.raises(Exception, match="did not start"):
            process.start(120)
    log = (tmp_path / "again.log").read_text()
    assert "serve it with --workers 2" in log
