"""``flightstore cluster`` (ZooKeeper + N servers on one machine) and ``serve``'s cluster flags."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter

import pytest

import flightstore
from tests.cluster.conftest import describe
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(600)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class _ClusterCommand:
    """``flightstore cluster`` as a child process, its printed lines collected."""

    def __init__(self, data_dir) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "flightstore", "cluster", "--servers", "3",
                                         "--data-dir", str(data_dir), "--port", "0"],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()
        wait_until(lambda: any(line.startswith("cluster running") for line in self.lines)
                   or self.process.poll() is not None, "the cluster command printing its URIs",
                   timeout=300, poll=0.1)
        assert self.process.poll() is None, "".join(self.lines)
        self.uris = {int(line.split()[1]): line.split()[2] for line in self.lines if line.startswith("server ")}
        self.zookeeper = next(line.split()[1] for line in self.lines if line.startswith("zookeeper "))

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=180)
        self.reader.join(timeout=30)
        return code


def test_cluster_command_runs_zookeeper_and_three_servers_until_sigterm(tmp_path):
    cluster = _ClusterCommand(tmp_path / "c")
    try:
        uris = cluster.uris
        assert sorted(uris) == [1, 2, 3] and all(uri.startswith("grpc://127.0.0.1:") for uri in uris.values())
        with flightstore.connect(uris[1]) as conn:
            conn.sql("CREATE TABLE t (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '6')")
        seen = describe(uris[3], "default.t")
        assert seen["cluster_id"] and seen["coordinator"] in uris
        assert {int(i): s["uri"] for i, s in seen["servers"].items()} == uris
        leaders = [b["leader"] for b in seen["tables"]["default.t"]["buckets"]]
        assert Counter(leaders) == {1: 2, 2: 2, 3: 2}
        pids = [s["pid"] for s in seen["servers"].values()]
        zk_host, zk_port = cluster.zookeeper.split("/")[0].split(":")
    finally:
        code = cluster.stop()
    assert code == 0 and cluster.lines[-1].strip() == "cluster stopped"
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(OSError):
        socket.create_connection((zk_host, int(zk_port)), timeout=5).close()  # ZooKeeper stopped too
    # Run again on the same directory: the same cluster comes back with its table and buckets.
    again = _ClusterCommand(tmp_path / "c")
    try:
        seen_again = describe(again.uris[2], "default.t")
        assert seen_again["cluster_id"] == seen["cluster_id"]
        assert [b["leader"] for b in seen_again["tables"]["default.t"]["buckets"]] == leaders
    finally:
        assert again.stop() == 0


@pytest.mark.parametrize("args, words", [
    (["--zookeeper", "127.0.0.1:2181"], "--zookeeper needs --server-id N"),
    (["--server-id", "1"], "--server-id and --advertised-uri need --zookeeper"),
    (["--zookeeper", "no-port", "--server-id", "1"], "--zookeeper expects HOST:PORT"),
    (["--zookeeper", "127.0.0.1:2181", "--server-id", "-1"], "server.id"),
    (["--zookeeper", "127.0.0.1:2181", "--server-id", "1", "--zookeeper-session-timeout", "soon"],
     "zookeeper.session-timeout"),
])
def test_serve_refuses_bad_cluster_flags(tmp_path, args, words):
    result = subprocess.run([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "d"),
                             "--port", "0", *args], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode != 0
    assert words in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()  # refused before the data directory was touched


def test_serve_joins_the_cluster_named_by_its_flags(tmp_path, servers, observer):
    process = servers.start(5, "--advertised-uri", "grpc://db5.example:7000")
    view = observer.wait(lambda v: 5 in v.servers, "server 5 registering")
    assert view.servers[5].uri == "grpc://db5.example:7000" and view.servers[5].pid == process.pid
    assert view.coordinator == 5
    assert describe(process.uri)["uri"] == "grpc://db5.example:7000"
    assert process.stop() == 0
    # SIGTERM is a clean leave: the server closed its session before exiting, so its registration
    # and its coordinator record are already gone (no session timeout to wait for).
    assert observer.client.exists(observer.paths.server(5)) is None
    assert observer.client.exists(observer.paths.active_coordinator) is None
