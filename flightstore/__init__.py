"""flightstore: streaming storage (log and primary-key tables) served over Arrow Flight SQL.

``flightstore.connect(uri)`` talks to a server; ``flightstore.Store(path)`` is the embedded storage.

The embedded storage is imported on first use (``flightstore.Store``), not with the package: a
client (a Spark planning or task worker, which imports the connector afresh per process) then
loads only the Flight client, not RocksDB, pandas and the whole storage stack.
"""

from typing import Any

from flightstore.client import Connection, Subscription, TableClient, connect

__all__ = ["connect", "Connection", "TableClient", "Subscription", "Store", "Table"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("Store", "Table"):
        from flightstore import store
        return getattr(store, name)
    raise AttributeError(f"module 'flightstore' has no attribute {name!r}")
