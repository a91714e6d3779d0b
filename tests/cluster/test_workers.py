"""``flightstore serve --workers N``: real worker processes on one machine, against one server.

Answers through any worker equal a single server's (lookups, prefix lookups, scans, SQL; writes
through any worker), a worker killed with -9 is restarted by worker 0 with its data, and SIGTERM
(or the death of worker 0) stops every worker."""

from __future__ import annotations

import os
import signal
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flightstore
from flightstore.cluster.local import ServerProcess
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
    os.kill(victim["pid"], signal.SIGKILL)
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
