"""Every core of one machine: ``flightstore serve --workers N`` runs N server processes.

A server process is one core for Python work (the GIL), so one machine's cores are used by
several processes that each lead a share of the buckets: bucket *b* of every table is led by worker
``b % N``. Clients find them as in cluster mode: the ``flightstore.locations`` action and the
per-bucket endpoints name each bucket's worker, and any worker forwards what it does not lead.

Why this design (rather than, say, processes behind a port-sharing socket): a lookup, a write
or a scan of one bucket must reach the one process that holds that bucket's RocksDB and log, which
is exactly what cluster mode already does between servers. So a worker is a cluster member without
ZooKeeper, and everything above the membership is the cluster's own code: the
:class:`~flightstore.cluster.store.ClusterStore` and its catalog mirror,
:class:`~flightstore.cluster.table.ClusterTable` (routing, forwarding, retries), the replica manager
(solo leaders), peer credentials (:mod:`flightstore.cluster.identity`). What ZooKeeper and the
coordinator give a cluster is replaced by what one machine can do more simply:

* **membership** is static: workers 0..N-1, the number fixed at a data directory's first start
  (``<data-dir>/workers.json``); a live worker is one that joined worker 0 and has not exited;
* **the catalog** lives in worker 0 (:mod:`.catalog`): DDL through any worker is applied there, and
  announced, versioned, to every live worker (:mod:`.member`) before it is answered;
* **processes**: worker 0 is the process the user started, on the port the user gave; it starts
  the others as children, each on ``<data-dir>/worker-<k>`` and a free port, restarts one that
  dies, and stops them all on SIGTERM (:mod:`.supervisor`); its own data is ``<data-dir>/worker-0``;
* **peers** authenticate with a secret worker 0 makes at start and hands to its children.

Replication factor is 1 (a machine's disk is one failure domain): a killed worker's buckets are
unavailable (calls wait for it, then answer UNAVAILABLE naming it) until worker 0 restarted it.
"""

__all__: list[str] = []
