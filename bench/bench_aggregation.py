"""Aggregation merge engine speed (issue: FIP-21), against the last-row engine in the same run.

500k events over 50k keys in batches of 50k into a table with 4 aggregated fields (sum, max, min,
last_value) vs the same rows into a last-row table (goal >= 0.5x): both do the same multi-get,
changelog and RocksDB write; the difference is the per-field aggregation.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.report import Row, best_of
from flightstore.store import Store

__all__ = ["run"]

EVENTS = 500_000
KEYS = 50_000
BATCH = 50_000
AGG_OPTIONS = {"table.merge-engine": "aggregation", "fields.amount.agg": "sum",
               "fields.peak.agg": "max", "fields.low.agg": "min", "fields.status.agg": "last_value"}


def _events(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    amount = rng.random(EVENTS)
    return pa.table({
        "user": pa.array(rng.integers(0, KEYS, EVENTS), pa.int64()),
        "amount": pa.array(amount),
        "peak": pa.array(rng.integers(0, 10**9, EVENTS), pa.int64()),
        "low": pa.array(rng.integers(0, 10**9, EVENTS), pa.int64()),
        "status": pa.array(np.array(["new", "paid", "shipped", "done"])[rng.integers(0, 4, EVENTS)]),
    })


def run() -> list[Row]:
    events = _events()
    batches = [events.slice(i, BATCH) for i in range(0, EVENTS, BATCH)]
    counter = iter(range(100))

    def load(root: Path, options: dict) -> None:
        with Store(root / str(next(counter))) as store:
            table = store.create_table("t", events.schema, primary_key=["user"], options=options)
            for batch in batches:
                table.upsert(batch)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ours = best_of(lambda: load(root, AGG_OPTIONS), 2)
        peer = best_of(lambda: load(root, {}), 2)
    return [Row("aggregation upserts (sum,max,min,last_value), 500k ev/50k keys", EVENTS / ours,
                EVENTS / peer, "rows/s", "same rows into a last-row table", goal=">= 0.5x")]
