"""One client process of ``bench_cluster``: point lookups through the Python client until a deadline.

``python -m bench.cluster_client URI KEYS START_AT SECONDS SEED`` waits until ``START_AT`` (epoch
seconds, so every client starts together), looks up random keys in ``0..KEYS-1`` one at a time
until ``SECONDS`` later, and prints ``{"lookups", "cpu_s", "wall_s"}`` (its own CPU time).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import flightstore


def main() -> None:
    uri, keys, start_at, seconds, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
        float(sys.argv[4]), int(sys.argv[5])
    rng = np.random.default_rng(seed)
    with flightstore.connect(uri) as conn:
        table = conn.table("default.kv")
        for key in rng.integers(0, keys, 20).tolist():  # warm up: connections to every leader
            assert table.lookup({"id": [key]}).num_rows == 1
        time.sleep(max(0.0, start_at - time.time()))
        cpu, wall, done = time.process_time(), time.perf_counter(), 0
        deadline = start_at + seconds
        for key in rng.integers(0, keys, 10_000_000).tolist():
            if table.lookup({"id": [key]}).num_rows != 1:
                raise SystemExit(f"key {key} not found")
            done += 1
            if done % 16 == 0 and time.time() >= deadline:
                break
        print(json.dumps({"lookups": done, "cpu_s": time.process_time() - cpu,
                          "wall_s": time.perf_counter() - wall}))


if __name__ == "__main__":
    main()
