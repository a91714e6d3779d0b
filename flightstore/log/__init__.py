"""The Arrow IPC log: one :class:`LogTablet` per bucket, read by offset, followed by subscribers.

``segment`` holds the on-disk format, ``tablet`` the bucket's log, ``subscribe`` the streams that
wait for new data.
"""

from flightstore.log.subscribe import follow
from flightstore.log.tablet import LogBatch, LogTablet

__all__ = ["LogTablet", "LogBatch", "follow"]
