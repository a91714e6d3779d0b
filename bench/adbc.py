"""The ADBC timing harness of the SQL benchmarks: a flightstore server in its own process over a
data directory, queried through ADBC's Flight SQL driver (``fetch_arrow_table``), as a client
application would. Used by ``bench_groupby`` and ``bench_tpch``."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa

from bench.bench_server import _start_server, _stop_server

__all__ = ["adbc_queries"]


@contextlib.contextmanager
def adbc_queries(data_dir: Path) -> Iterator[Callable[[str], Callable[[], pa.Table]]]:
    """Serve ``data_dir`` and yield ``ours``: ``ours(sql)`` is a function that runs ``sql`` through
    one ADBC connection and answers its rows (a thing to time). The server stops on exit."""
    from adbc_driver_flightsql import dbapi

    process, uri = _start_server(["-m", "flightstore", "serve", "--data-dir", str(data_dir),
                                  "--host", "127.0.0.1", "--port", "0"], "flightstore serving")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(uri, autocommit=True)
        cursor = conn.cursor()

        def ours(sql: str) -> Callable[[], pa.Table]:
            def query() -> pa.Table:
                cursor.execute(sql)
                return cursor.fetch_arrow_table()
            return query

        try:
            yield ours
        finally:
            conn.close()
    finally:
        _stop_server(process)
