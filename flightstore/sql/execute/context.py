"""What every part of the executor runs with: the store, the embedded engine, the lake, the limits.

One :class:`ExecutionContext` per :class:`~flightstore.sql.execute.Executor`, shared by its parts
(planning cache, lookups, statements, system views, residual SQL, the cluster fan-out). The server
sets ``lake`` and ``tierer`` after construction, so parts read them from here at run time, never
copy them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flightstore.cache import LruCache
from flightstore.config import server_option
from flightstore.sql.engine import SqlEngine
from flightstore.store import Store

__all__ = ["ExecutionContext"]


class ExecutionContext:
    """The store, the DuckDB engine, the lake (and the tierer, when this process tiers), the
    ``query.*`` limits, and the cache of result schemas DuckDB binds (residual SQL, partials)."""

    def __init__(self, store: Store, lake: Any = None, tierer: Any = None,
                 cache_entries: int | None = None) -> None:
        options = store.options
        if cache_entries is None:
            cache_entries = server_option(options, "sql.cache.entries")
        self.store = store
        self.lake = lake
        self.tierer = tierer
        self.cache_entries = cache_entries
        self.engine = SqlEngine(server_option(options, "query.memory-limit"), store.data_dir / ".spill",
                                server_option(options, "query.spill-limit"))
        self.query_timeout_s = server_option(options, "query.timeout") / 1000
        self.max_result_rows = server_option(options, "query.max-result-rows")
        self.materialize_limit = min(server_option(options, "query.materialize-input-limit"),
                                     server_option(options, "query.memory-limit") // 4)
        self.engine_schemas: LruCache[tuple, pa.Schema] = LruCache(cache_entries)

