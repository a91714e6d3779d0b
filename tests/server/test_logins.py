"""Logging in cannot exhaust the server: password checks are bounded in number (queue, then refuse
with UNAVAILABLE) and a user name that keeps failing is slowed down; 64 concurrent wrong-password
logins against a real server process leave its memory and a logged-in user's latency bounded."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
import uuid

import pytest
from pyarrow import flight

import flightstore
from flightstore.errors import Unavailable
from flightstore.server.logins import FIRST_DELAY_S, LoginGate
from flightstore.server.service import FlightSqlServer
from flightstore.server.users import UserStore
from flightstore.store import Store
from tests.waiting import wait_until

TIMEOUT = 60


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_gate_runs_a_bounded_number_of_checks_queues_a_few_and_refuses_the_rest():
    gate = LoginGate(max_concurrent=1, max_waiting=1, wait_s=30, failure_burst=100, max_delay_s=1)
    release = threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()

    def verify() -> bool:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(30)
        with lock:
            running[0] -= 1
        return True

    results: list = []
    threads = [threading.Thread(target=lambda n=n: results.append(gate.check(f"u{n}", verify))) for n in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: gate._admitted == 2, "one check running and one waiting")
    with pytest.raises(Unavailable, match="too many logins in progress"):
        gate.check("u2", verify)  # the queue is full: refused at once, nothing run
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [True, True] and most[0] == 1 and gate.refused == 1


def test_a_name_that_keeps_failing_waits_longer_each_time_and_success_clears_it(tmp_path):
    store = Store(tmp_path / "data", options={"auth.failed-logins.burst": 3,
                                             "auth.failed-logins.max-delay": "2s"})
    server = FlightSqlServer(store, users={"alice": "s3cret", "bob": "b0b"})
    clock = server.authenticator.gate.clock = Clock()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(timeout=TIMEOUT)

    def login(user: str, password: str) -> str:
        try:
            client.authenticate_basic_token(user, password, options)
        except flight.FlightUnauthenticatedError:
            return "wrong"
        except flight.FlightUnavailableError as exc:
            assert "too many failed logins" in str(exc)
            return "wait"
        return "in"

    try:
        assert [login("alice", "guess") for _ in range(3)] == ["wrong"] * 3
        # The burst is spent: even the right password waits (no check is run meanwhile)...
        assert login("alice", "s3cret") == "wait"
        assert login("bob", "b0b") == "in"  # ... for that name only
        clock.now += FIRST_DELAY_S
        assert login("alice", "guess") == "wrong"
        clock.now += FIRST_DELAY_S  # the wait doubled
        assert login("alice", "s3cret") == "wait"
        clock.now += FIRST_DELAY_S
        assert login("alice", "s3cret") == "in"  # and a success clears the record
        assert login("alice", "guess") == "wrong"
        assert login("alice", "s3cret") == "in"
        # Unknown names are tracked like real ones (nothing tells which users exist), capped delay.
        assert [login("nobody", "x") for _ in range(4)] == ["wrong"] * 3 + ["wait"]
        for _ in range(10):
            clock.now += 3
            assert login("nobody", "x") == "wrong"
        assert login("nobody", "x") == "wait"
        clock.now += 2.0  # never more than auth.failed-logins.max-delay
        assert login("nobody", "x") == "wrong"
    finally:
        client.close()
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_64_concurrent_wrong_password_logins_keep_memory_and_latency_bounded(tmp_path):
    """The acceptance of issue 22: a real server process with a users file (Argon2id's default
    profile: 64 MiB per check) under 64 concurrent wrong-password logins stays under 500 MB of
    resident memory, and a logged-in user's SELECT 1 has a p99 under 200 ms meanwhile."""
    users_file = tmp_path / "users.json"
    UserStore.open(users_file, create=True).add("alice", "s3cret")
    server = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"),
                               "--port", "0", "--users-file", str(users_file), "--super-user", "alice"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        uri = server.stdout.readline().split(" at ", 1)[1].strip()
        conn = flightstore.connect(uri, username="alice", password="s3cret", timeout=TIMEOUT)
        for _ in range(20):  # warm up: plans cached, engine open
            conn.sql("SELECT 1 AS one")
        quiet = []  # the same calls without the attack, for the record (a busy shared machine)
        for _ in range(200):
            began = time.perf_counter()
            conn.sql("SELECT 1 AS one")
            quiet.append(time.perf_counter() - began)
        idle_rss = _rss_mb(server.pid)
        peak = [idle_rss]
        outcomes: dict[str, int] = {}
        attacking = threading.Event()
        attacking.set()
        start = threading.Barrier(65)

        def watch() -> None:
            while attacking.is_set():
                peak[0] = max(peak[0], _rss_mb(server.pid))
                time.sleep(0.01)

        def attack() -> None:
            client = flight.FlightClient(uri)
            name = f"mallory-{uuid.uuid4().hex[:8]}"  # a name of its own: only the gate bounds it
            start.wait()
            for _ in range(3):
                try:
                    client.authenticate_basic_token(name, "wrong", flight.FlightCallOptions(timeout=TIMEOUT))
                    kind = "in"
                except flight.FlightError as exc:
                    kind = type(exc).__name__
                outcomes[kind] = outcomes.get(kind, 0) + 1
            client.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        attackers = [threading.Thread(target=attack, daemon=True) for _ in range(64)]
        for attacker in attackers:
            attacker.start()
        start.wait()
        latencies = []
        while any(a.is_alive() for a in attackers) or len(latencies) < 100:
            began = time.perf_counter()
            assert conn.sql("SELECT 1 AS one").column(0).to_pylist() == [1]
            latencies.append(time.perf_counter() - began)
        for attacker in attackers:
            attacker.join(timeout=TIMEOUT)
        attacking.clear()
        watcher.join(timeout=10)
        conn.close()
        p99 = statistics.quantiles(latencies, n=100)[98]
        quiet_p99 = statistics.quantiles(quiet, n=100)[98]
        print(f"\nidle RSS {idle_rss:.0f} MB, peak RSS {peak[0]:.0f} MB; SELECT 1 over {len(latencies)} calls: "
              f"median {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
              f"max {max(latencies) * 1000:.1f} ms (without the attack: median "
              f"{statistics.median(quiet) * 1000:.1f} ms, p99 {quiet_p99 * 1000:.1f} ms); attempts {outcomes}")
        assert "in" not in outcomes and sum(outcomes.values()) == 64 * 3
        assert outcomes.get("FlightUnauthenticatedError", 0) > 0  # the checks did run, bounded
        assert peak[0] < 500, f"peak RSS {peak[0]:.0f} MB"
        assert p99 < 0.2, f"SELECT 1 p99 {p99 * 1000:.0f} ms"
    finally:
        server.terminate()
        server.wait(timeout=60)
