"""``flightstore cluster status`` and ``flightstore cluster decommission``: an operator's view of
replication and the way to take a server out of service without losing a replica.

Both talk to any server over Flight (the ``flightstore.cluster`` and ``flightstore.decommission``
actions) and gather what every live server reports of the buckets it holds.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pyarrow as pa

import flightstore
from flightstore.display import format_table
from flightstore.errors import FlightstoreError

__all__ = ["bucket_status", "decommission", "status"]


def _describe(conn: Any, table: str | None = None) -> dict:
    return conn._action("flightstore.cluster", {"table": table} if table else {})


def bucket_status(uri: str, table: str | None = None, **credentials: Any) -> list[dict]:
    """One row per bucket: its leader and epoch, replicas, in-sync replicas, the largest follower
    lag the leader reports, and whether it is under-replicated or unavailable."""
    with flightstore.connect(uri, **credentials) as conn:
        view = _describe(conn, table)
        reports = []
        for server in view["servers"].values():
            try:
                reports.append(_describe(conn._peer(server["uri"]), table))
            except (pa.ArrowException, FlightstoreError, OSError):
                continue  # a server going away: the view says what it led
    lags: dict[tuple[str, int], dict] = {}
    for report in reports:
        for entry in report.get("replicas", []):
            if entry["role"] == "leader":
                lags[(entry["table"], entry["bucket"])] = entry.get("lag", {})
    rows = []
    for name, record in sorted(view["tables"].items()):
        for bucket in record["buckets"]:
            lag = lags.get((name, bucket["bucket"]), {})
            known = [v for v in lag.values() if v is not None]
            state = ("unavailable" if not bucket["available"]
                     else "under-replicated" if len(bucket["isr"]) < len(bucket["replicas"]) else "ok")
            rows.append({"table": name, "bucket": bucket["bucket"], "leader": bucket["leader"],
                         "epoch": bucket["leader_epoch"], "replicas": ",".join(map(str, bucket["replicas"])),
                         "isr": ",".join(map(str, bucket["isr"])), "max_lag": max(known) if known else 0,
                         "state": state})
    return rows


def status(uri: str, table: str | None = None, **credentials: Any) -> int:
    """Print :func:`bucket_status`; exit 0 when every bucket is fully in sync, 1 otherwise."""
    try:
        rows = bucket_status(uri, table, **credentials)
    except (pa.ArrowException, FlightstoreError, OSError) as exc:
        print(f"flightstore cluster status: {exc}", file=sys.stderr)
        return 2
    print(format_table(pa.Table.from_pylist(rows) if rows else pa.table({"table": pa.array([], pa.string())})))
    troubled = [r for r in rows if r["state"] != "ok"]
    print(f"{len(rows)} buckets, {len(troubled)} under-replicated or unavailable")
    return 1 if troubled else 0


def decommission(uri: str, server_id: int, timeout: float = 600.0, **credentials: Any) -> int:
    """Mark ``server_id`` for decommission, wait until no bucket has a replica on it (the
    coordinator adds a replacement, lets it catch up, then drops the old one), and report; the
    server then stops by itself."""
    try:
        with flightstore.connect(uri, **credentials) as conn:
            conn._action("flightstore.decommission", {"server_id": int(server_id)})
            deadline = time.monotonic() + timeout
            while True:
                view = _describe(conn)
                held = [(name, b["bucket"]) for name, t in view["tables"].items() for b in t["buckets"]
                        if server_id in b["replicas"]]
                if not held:
                    break
                if time.monotonic() > deadline:
                    print(f"flightstore cluster decommission: server {server_id} still holds {len(held)} "
                          f"replica(s) after {timeout:g} s (e.g. {held[0][0]} bucket {held[0][1]})",
                          file=sys.stderr)
                    return 1
                time.sleep(0.5)
    except (pa.ArrowException, FlightstoreError, OSError) as exc:
        print(f"flightstore cluster decommission: {exc}", file=sys.stderr)
        return 2
    print(f"server {server_id} holds no replica any more; it stops by itself")
    return 0
