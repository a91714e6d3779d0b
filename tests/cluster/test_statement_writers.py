"""Concurrent SQL statements through one server, retried at a new leader, are each applied once.

A server forwards a statement's rows to the bucket leaders under a writer id of its own, with a
sequence number per piece; a leader applies a batch once and answers a batch whose sequence is
not above what it applied from that writer as a duplicate (a retry). Statements in flight at the
same time therefore must not share a writer id: when a leader dies, their retries reach the new
leader in any order, and a lower sequence arriving after a higher one would be acknowledged as a
duplicate and never written (found by `make chaos`, seed 101: an acknowledged row lost).
"""

from __future__ import annotations

import threading

import pytest

import flightstore
from tests.cluster.conftest import Servers

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

IDS = (1, 2, 3)
REPLICATED = ("--option", "default.replication.factor=3",
              "--option", "log.replica.min-in-sync-replicas-number=2",
              "--option", "log.replica.max-lag-time=5s")
STATEMENTS = 8


def test_statements_retried_at_a_new_leader_are_each_applied_once(servers: Servers, observer):
    uris = {i: servers.start(i, *REPLICATED).uri for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:  # one bucket, no bucket key: every statement lands in it
        conn.sql("CREATE TABLE ev (k BIGINT) WITH ('bucket.num' = '1')")
        conn.sql("INSERT INTO ev VALUES (-1)")
    view = observer.wait(lambda v: len(v.tables) == 1 and all(len(b.isr) == 3 for r in v.tables.values()
                                                             for b in r.buckets), "ev in sync on three")
    leader = next(iter(view.tables.values())).buckets[0].leader
    entry = uris[next(i for i in IDS if i != leader)]
    servers.running[leader].kill()  # every statement below is first sent to the dead leader

    errors: list[BaseException] = []

    def insert(k: int) -> None:
        try:
            with flightstore.connect(entry, timeout=120) as c:
                c.execute(f"INSERT INTO ev VALUES ({k})")  # acknowledged, or raises
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=insert, args=(k,), daemon=True) for k in range(STATEMENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not any(t.is_alive() for t in threads), "a statement hung"
    assert errors == []
    with flightstore.connect(entry, timeout=120) as conn:
        rows = sorted(r["k"] for r in conn.sql("SELECT k FROM ev").to_pylist())
    assert rows == [-1, *range(STATEMENTS)]  # every acknowledged statement, once


def test_a_statements_pieces_reach_the_leaders_in_order_across_a_failover(servers: Servers, observer):
    """A statement cut into pieces (``write.chunk-rows`` = 1: a piece per row, numbered in order)
    round robin over three buckets, while one bucket's leader is dead: a piece after one that
    failed is not sent before it (applied first at the new leader, it would make the earlier
    piece a duplicate there)."""
    uris = {i: servers.start(i, *REPLICATED, "--option", "write.chunk-rows=1").uri for i in IDS}
    observer.wait(lambda v: set(v.servers) == set(IDS) and v.coordinator is not None, "three servers")
    with flightstore.connect(uris[1]) as conn:
        conn.sql("CREATE TABLE ev (k BIGINT) WITH ('bucket.num' = '3')")
        conn.sql("INSERT INTO ev VALUES (-1)")
    view = observer.wait(lambda v: len(v.tables) == 1 and all(len(b.isr) == 3 for r in v.tables.values()
                                                             for b in r.buckets), "ev in sync on three")
    leaders = [b.leader for b in next(iter(view.tables.values())).buckets]
    victim = leaders[0]
    entry = uris[next(i for i in IDS if i != victim)]
    servers.running[victim].kill()
    with flightstore.connect(entry, timeout=120) as conn:
        for start in range(0, 24, 6):
            conn.execute(f"INSERT INTO ev VALUES {', '.join(f'({k})' for k in range(start, start + 6))}")
        rows = sorted(r["k"] for r in conn.sql("SELECT k FROM ev").to_pylist())
    assert rows == [-1, *range(24)]
