"""The Arrow IPC log: one :class:`LogTablet` per bucket, read by offset, followed by subscribers.

``record`` holds the record format, ``segment`` a segment file (``index`` its sidecars, ``walk``
its recovery scan, ``payload`` its checked reads), ``durability`` the group commit, ``tablet`` the
bucket's log, ``subscribe`` the streams that wait for new data, ``integrity`` the offline checks and
repairs of ``flightstore verify`` / ``repair``.
"""

from flightstore.log.subscribe import follow
from flightstore.log.tablet import LogBatch, LogTablet

__all__ = ["LogTablet", "LogBatch", "follow"]
