"""One client process of ``bench_cluster``: point lookups through the Python client for a while.

``python -m bench.cluster_client URI KEYS SECONDS SEED [TABLE]`` (TABLE: ``default.kv`` unless
given; its key column is ``id``) connects and warms up, prints ``ready``,
waits for a line on stdin (the parent starts every client together), looks up random keys in
``0..KEYS-1`` one at a time for ``SECONDS``, and prints ``{"lookups", "cpu_s", "wall_s"}`` (its
own CPU time over the measured part).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import flightstore


def main() -> None:
    uri, keys, seconds, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    name = sys.argv[5] if len(sys.argv) > 5 else "default.kv"
    rng = np.random.default_rng(seed)
    with flightstore.connect(uri) as conn:
        table = conn.table(name)
        for key in rng.integers(0, keys, 20).tolist():  # warm up: connections to every leader
            assert table.lookup({"id": [key]}).num_rows == 1
        print("ready", flush=True)
        sys.stdin.readline()
        cpu, wall, done = time.process_time(), time.perf_counter(), 0
        deadline = wall + seconds
        while time.perf_counter() < deadline:
            for key in rng.integers(0, keys, 16).tolist():
                if table.lookup({"id": [key]}).num_rows != 1:
                    raise SystemExit(f"key {key} not found")
            done += 16
        print(json.dumps({"lookups": done, "cpu_s": time.process_time() - cpu,
                          "wall_s": time.perf_counter() - wall}), flush=True)


if __name__ == "__main__":
    main()
