"""Remote storage (``remote.data.dir``): closed log segments and KV snapshots copied off the server,
old offsets read back from there, lost buckets rebuilt from there.

``storage`` holds the file system (a local path or ``s3://`` through pyarrow), the layout and the
checked transfers; ``manifest`` the per-bucket manifests, replaced atomically by versions;
``bucket`` one bucket (what its log asks: start offset, segments below the local ones, expiry);
``cache`` and ``reader`` the downloads a read of old offsets goes through; ``uploader`` the
server's background task (uploads, then local deletion under ``table.log.tiered.local-segments``);
``rebuild`` a bucket rebuilt into an empty directory.

Where it meets the rest: :class:`~flightstore.store.Store` makes the :class:`RemoteStorage` of its
options (``Store.remote``); a table hands each bucket's :class:`RemoteBucket` to its log
(``LogTablet.attach_remote``: ``start_offset``, ``read`` below the local segments,
``offset_for_timestamp``, ``lost_rows`` and the writers' state go through it); the server runs
:class:`RemoteLogManager`; retention (:mod:`flightstore.upkeep`) expires uploaded segments.
In a cluster (replication): one server uploads a bucket (its leader); every replica should read the
same bucket directory, so the namespace is the cluster's and the table id the cluster's table id
(``RemoteStorage(..., namespace=...)``, ``RemoteStorage.table(descriptor, table_id)``);
:func:`rebuild_bucket` is what a replica manager calls for a bucket whose replicas are all gone.
"""

from flightstore.remote.bucket import RemoteBucket
from flightstore.remote.rebuild import RebuiltBucket, rebuild_bucket, restore_missing_bucket
from flightstore.remote.storage import RemoteStorage, RemoteTable
from flightstore.remote.uploader import RemoteLogManager

__all__ = ["RebuiltBucket", "RemoteBucket", "RemoteLogManager", "RemoteStorage", "RemoteTable",
           "rebuild_bucket", "restore_missing_bucket"]
