"""flightstore: streaming storage (log and primary-key tables) served over Arrow Flight SQL.

``flightstore.connect(uri)`` talks to a server; ``flightstore.Store(path)`` is the embedded storage.
"""

from flightstore.client import Connection, Subscription, TableClient, connect
from flightstore.store import Store, Table

__all__ = ["connect", "Connection", "TableClient", "Subscription", "Store", "Table"]
__version__ = "0.1.0"
