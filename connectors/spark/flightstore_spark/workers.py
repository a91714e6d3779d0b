"""What the connector does about living in Spark's Python workers.

Spark's daemon runs a full ``gc.collect()`` in a reused worker after every task and every planner
call. Everything a worker imports is long-lived (it lives as long as the worker), so the connector
freezes those objects (``gc.freeze``) and every later collection walks only what the tasks made.
Only worker processes are touched, never a driver or a user's process.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["freeze_imports", "in_spark_worker"]

_frozen_modules = 0  # len(sys.modules) at this process's last freeze


def in_spark_worker() -> bool:
    """Whether this process is one of Spark's Python workers (forked by ``pyspark.daemon``, which
    names the worker module in its arguments): task workers and the planners (schema, partitions)."""
    return len(sys.argv) > 1 and sys.argv[0].endswith("daemon.py") and sys.argv[1].startswith("pyspark")


def freeze_imports() -> None:
    """In a Spark worker, freeze every object alive when modules were imported since the last freeze.

    Freezing once at the connector's import left out what a worker imports after it (in the
    bench's read workers pandas and dateutil: ~350 modules, ~27,700 objects), which Spark's
    collection after each task walked again: 11-16 ms of CPU each (25-140 ms of wall on a busy
    2-core machine), ~30 ms of CPU per 2-task read, <0.1 ms once frozen.
    Called at the end of the reader's entry points it costs one ``len(sys.modules)`` once the
    worker has imported everything; when there is something new to freeze, garbage is collected
    first, so no unreachable cycle is frozen for good."""
    global _frozen_modules
    if len(sys.modules) == _frozen_modules or not in_spark_worker():
        return
    gc.collect()
    gc.freeze()
    _frozen_modules = len(sys.modules)
