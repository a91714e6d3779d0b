"""Replication speed (issue 21), on one cluster of 3 local servers with a real ZooKeeper.

The peer is the same cluster at replication factor 1 (the issue defines the ratios that way):
every table exists twice, ``table.replication.factor`` 3 (acks from every in-sync replica, min
in-sync replicas 2) and 1, and rounds of the two alternate so a busy moment of a shared machine
slows one round of each.

* **write throughput**: one producer (the Python client, batches of :data:`BATCH` rows, each
  waiting for its acknowledgement, Kafka's "single producer, synchronous" figure) appending to a
  log table and upserting into a primary-key table; rows/s RF 3 vs RF 1 in :data:`WRITE_ROUNDS`
  short rounds (the factors in alternating order), reported at the round of the median ratio.
  Goal >= 0.6x.
* **reads**: point lookups/s from :data:`CLIENTS` client processes (``bench.cluster_client``) and
  full-scan rows/s (``SELECT *``) of a primary-key and a log table, RF 3 vs RF 1. Goal >= 0.9x.
* **failover**: :data:`KILLS` times, kill -9 the leader of a bucket and time until a write to that
  bucket, sent through a surviving server, is acknowledged by the new leader; p50 and max against
  ``zookeeper.session-timeout`` + 2 s (the goal; the ratio is goal / measured, >= 1 meets it).
  The killed server is restarted and every ISR is full again before the next kill.

``BENCH_REPLICATION_PARTS=writes python -m bench replication`` runs only the named parts (writes,
reads, failover).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import flight

import flightstore
from bench.report import Row
from flightstore.bucketing import bucket_ids
from flightstore.cluster.local import LocalCluster
from flightstore.server import tickets

SESSION_TIMEOUT_S = 6.0
BUCKETS = 3
BATCH = 1_000
WRITE_SECONDS = 2.0
WRITE_ROUNDS = 5  # odd: the median round is one of them
ROUNDS = 2
KEYS = 60_000
CLIENTS = 4
LOOKUP_SECONDS = 6.0
SCANS = 5
KILLS = 10
OPTIONS = ["--zookeeper-session-timeout", f"{SESSION_TIMEOUT_S:g}s",
           "--option", "log.replica.min-in-sync-replicas-number=2", "--option", "log.replica.max-lag-time=5s"]


def _describe(uri: str, table: str | None = None) -> dict:
    client = flight.FlightClient(uri)
    try:
        body = tickets.encode_custom({"op": "flightstore.cluster", **({"table": table} if table else {})})
        results = list(client.do_action(flight.Action("flightstore.cluster", body),
                                        flight.FlightCallOptions(timeout=30)))
        return tickets.decode_custom(results[0].body.to_pybytes())
    finally:
        client.close()


def _in_sync(uris: list[str], tables: list[str]) -> bool:
    """Every replicated bucket of ``tables`` has its full ISR and every follower its leader's log end."""
    try:
        status = [_describe(uri, f"default.{t}")["replicas"] for uri in uris for t in tables]
    except flight.FlightError:
        return False
    rows = [r for answer in status for r in answer]
    leaders = {(r["table"], r["bucket"]): r for r in rows if r["role"] == "leader"}
    for r in rows:
        lead = leaders.get((r["table"], r["bucket"]))
        if lead is None or len(lead["isr"]) != len(lead["replicas"]) or r["log_end"] != lead["log_end"]:
            return False
    return True


def _wait(predicate, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.2)


def _create(uri: str) -> None:
    """``ev<rf>`` / ``kv<rf>`` for the reads (loaded alike), ``wev<rf>`` / ``wkv<rf>`` for the writes
    (the faster factor writes more rows: reads of those would compare tables of different sizes)."""
    with flightstore.connect(uri, timeout=120) as conn:
        for prefix in ("", "w"):
            for rf in (3, 1):
                conn.sql(f"CREATE TABLE {prefix}ev{rf} (id BIGINT, v STRING, n BIGINT) WITH ('bucket.num' = "
                         f"'{BUCKETS}', 'bucket.key' = 'id', 'table.replication.factor' = '{rf}')")
                conn.sql(f"CREATE TABLE {prefix}kv{rf} (id BIGINT, v STRING, n BIGINT, PRIMARY KEY (id) NOT "
                         f"ENFORCED) WITH ('bucket.num' = '{BUCKETS}', 'table.replication.factor' = '{rf}')")


def _batch(first: int, n: int = BATCH) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table({"id": ids, "v": pa.array([f"value-{i}" for i in ids.tolist()]), "n": ids * 3})


# ---- writes ---------------------------------------------------------------------------------
def _write_rate(uri: str, table: str, op: str, start: int) -> tuple[float, int]:
    """Rows/s of one synchronous producer for WRITE_SECONDS; the next free id."""
    with flightstore.connect(uri, timeout=120) as conn:
        client = conn.table(table)
        write = client.append if op == "append" else client.upsert
        write(_batch(start, 10))  # warm: locations, connections to every leader
        start += 10
        rows, began = 0, time.perf_counter()
        while time.perf_counter() - began < WRITE_SECONDS:
            write(_batch(start + rows))
            rows += BATCH
        return rows / (time.perf_counter() - began), start + rows


def bench_writes(uri: str) -> list[Row]:
    """:data:`WRITE_ROUNDS` short rounds, each writing every table once (the two factors in
    alternating order), the ratio taken per round; the row shows the round of the median ratio.
    On a shared machine a busy moment then spoils one round's ratio, which the median drops,
    instead of the one long run of an arm."""
    next_id = {(kind, rf): 10_000_000 for kind in ("ev", "kv") for rf in (3, 1)}
    rounds: dict[str, list[tuple[float, float]]] = {"ev": [], "kv": []}
    for round_no in range(WRITE_ROUNDS):
        for kind in ("ev", "kv"):
            rate = {}
            for rf in (3, 1) if round_no % 2 == 0 else (1, 3):
                rate[rf], next_id[(kind, rf)] = _write_rate(uri, f"w{kind}{rf}", "append" if kind == "ev" else
                                                            "upsert", next_id[(kind, rf)])
            rounds[kind].append((rate[3], rate[1]))
            print(f"  writes round {round_no + 1}/{WRITE_ROUNDS} {kind}: RF 3 {rate[3]:,.0f} rows/s, RF 1 "
                  f"{rate[1]:,.0f} rows/s, {rate[3] / rate[1]:.2f}x", file=sys.stderr, flush=True)
    median = {kind: sorted(pairs, key=lambda p: p[0] / p[1])[len(pairs) // 2] for kind, pairs in rounds.items()}
    return [
        Row(f"log append rows/s, 1 sync producer, {BATCH}-row batches, RF 3 acks=all (median of "
            f"{WRITE_ROUNDS} rounds)", median["ev"][0], median["ev"][1], "rows/s",
            "the same table at RF 1, same 3 servers", goal=">= 0.6x"),
        Row(f"PK upsert rows/s, 1 sync producer, {BATCH}-row batches, RF 3 acks=all (median of "
            f"{WRITE_ROUNDS} rounds)", median["kv"][0], median["kv"][1], "rows/s",
            "the same table at RF 1, same 3 servers", goal=">= 0.6x"),
    ]


# ---- reads ----------------------------------------------------------------------------------
def _load(uri: str) -> None:
    with flightstore.connect(uri, timeout=120) as conn:
        for rf in (3, 1):
            for first in range(0, KEYS, 10_000):
                conn.table(f"kv{rf}").upsert(_batch(first, 10_000))
                conn.table(f"ev{rf}").append(_batch(first, 10_000))


def _lookups(uri: str, table: str, seed: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    clients = [subprocess.Popen([sys.executable, "-m", "bench.cluster_client", uri, str(KEYS), str(LOOKUP_SECONDS),
                                 str(seed * 100 + i), f"default.{table}"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env) for i in range(CLIENTS)]
    try:
        for client in clients:
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a benchmark client failed (exit {client.wait(60)})")
        for client in clients:
            client.stdin.write("go\n")
            client.stdin.flush()
        results = []
        for client in clients:
            out, _ = client.communicate(timeout=LOOKUP_SECONDS + 120)
            if client.returncode != 0:
                raise RuntimeError(f"a benchmark client failed (exit {client.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
    return sum(r["lookups"] for r in results) / max(r["wall_s"] for r in results)


def _scan_rate(uri: str, table: str) -> float:
    with flightstore.connect(uri, timeout=120) as conn:
        began = time.perf_counter()
        rows = conn.sql(f"SELECT * FROM {table}").num_rows
        elapsed = time.perf_counter() - began
    if rows != KEYS:
        raise RuntimeError(f"a scan of {table} returned {rows} rows, not the {KEYS} loaded")
    return rows / elapsed


def bench_reads(uri: str) -> list[Row]:
    lookups = {3: 0.0, 1: 0.0}
    scans = {(kind, rf): 0.0 for kind in ("kv", "ev") for rf in (3, 1)}
    for round_no in range(ROUNDS):
        for rf in (3, 1):
            lookups[rf] = max(lookups[rf], _lookups(uri, f"kv{rf}", round_no))
        for _ in range(SCANS):  # interleaved, best of: a scan is short and the machine may be shared
            for kind in ("kv", "ev"):
                for rf in (3, 1):
                    scans[(kind, rf)] = max(scans[(kind, rf)], _scan_rate(uri, f"{kind}{rf}"))
    return [
        Row(f"point lookups/s, {CLIENTS} client processes, RF 3", lookups[3], lookups[1], "lookups/s",
            "the same table at RF 1, same 3 servers", goal=">= 0.9x"),
        Row("PK table full scan rows/s (SELECT *), RF 3", scans[("kv", 3)], scans[("kv", 1)], "rows/s",
            "the same table at RF 1, same 3 servers", goal=">= 0.9x"),
        Row("log table full scan rows/s (SELECT *), RF 3", scans[("ev", 3)], scans[("ev", 1)], "rows/s",
            "the same table at RF 1, same 3 servers", goal=">= 0.9x"),
    ]


# ---- failover -------------------------------------------------------------------------------
def _key_in_bucket(bucket: int) -> int:
    ids = np.arange(0, 1000, dtype=np.int64)
    found = bucket_ids(pa.table({"id": ids}), ["id"], BUCKETS)
    return int(ids[found == bucket][0])


def bench_failover(cluster: LocalCluster) -> list[Row]:
    times = []
    key = _key_in_bucket(0)
    for kill in range(KILLS):
        uris = {i: s.uri for i, s in cluster.servers.items()}
        _wait(lambda: _in_sync(list(uris.values()), ["kv3"]), "every ISR full")
        place = _describe(uris[1], "default.kv3")["tables"]["default.kv3"]["buckets"][0]
        victim = int(place["leader"])
        survivor = next(i for i in uris if i != victim)
        with flightstore.connect(uris[survivor], timeout=60) as conn:
            client = conn.table("kv3", writer_id=f"failover-{kill}")
            client.upsert({"id": [key], "v": ["before"], "n": [kill]})  # warm: locations, connections
            cluster.servers[victim].kill()
            began = time.perf_counter()
            while True:
                try:
                    client.upsert({"id": [key], "v": ["after"], "n": [kill]})
                    break
                except flight.FlightError:
                    if time.perf_counter() - began > 120:
                        raise
                    time.sleep(0.02)
            times.append(time.perf_counter() - began)
            print(f"  failover {kill + 1}/{KILLS}: server {victim} killed, write acknowledged after "
                  f"{times[-1]:.2f} s", file=sys.stderr, flush=True)
        cluster.servers[victim].start()
    goal = SESSION_TIMEOUT_S + 2.0
    return [
        Row(f"failover p50: kill -9 of a leader -> first acked write ({KILLS} kills)", statistics.median(times),
            goal, "s", f"goal: zookeeper.session-timeout ({SESSION_TIMEOUT_S:g} s) + 2 s",
            higher_is_better=False, goal=">= 1x"),
        Row(f"failover max ({KILLS} kills)", max(times), goal, "s",
            f"goal: zookeeper.session-timeout ({SESSION_TIMEOUT_S:g} s) + 2 s", higher_is_better=False,
            goal=">= 1x"),
    ]


PARTS = ("writes", "reads", "failover")


def run() -> list[Row]:
    """Every part, or those ``BENCH_REPLICATION_PARTS`` names (comma-separated: writes, reads, failover)."""
    wanted = [p.strip() for p in os.environ.get("BENCH_REPLICATION_PARTS", ",".join(PARTS)).split(",")
              if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        raise SystemExit(f"BENCH_REPLICATION_PARTS: unknown part(s) {', '.join(unknown)}; use {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as tmp:
        cluster = LocalCluster(Path(tmp), servers=3, port=0, extra_args=OPTIONS)
        cluster.start()
        try:
            uri = cluster.servers[1].uri
            _create(uri)
            uris = [s.uri for s in cluster.servers.values()]
            rows = bench_writes(uri) if "writes" in wanted else []
            if "reads" in wanted:
                _load(uri)
                _wait(lambda: _in_sync(uris, ["kv3", "ev3"]), "the loaded tables in sync")
                rows += bench_reads(uri)
            if "failover" in wanted:
                rows += bench_failover(cluster)
        finally:
            cluster.stop()
    return rows
