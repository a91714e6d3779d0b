"""Cluster mode: several flightstore servers coordinated through ZooKeeper.

``flightstore serve --zookeeper HOST:PORT[/chroot] --server-id N`` joins a cluster; without
``--zookeeper`` a server runs alone, exactly as before. One module per concept:

* ``layout``      the znode layout and payloads (read it first);
* ``view``        the immutable snapshot a server has of the cluster (servers, catalog, buckets);
* ``metadata``    the cache that follows ZooKeeper by watches and publishes views;
* ``member``      one server's membership: session, ephemeral registration, joining and leaving;
* ``coordinator`` election (kazoo's Election recipe) and the coordinator's work: DDL, assignment;
* ``assignment``  round-robin bucket assignment (pure);
* ``ddl``         the DDL request/response protocol over znodes;
* ``store``       the Store whose DDL goes through the coordinator;
* ``mirror``      the local data directory following the cluster catalog;
* ``table``       a table as one server serves it: each bucket from its leader (peer calls, retries);
* ``failover``    leader election, ISR changes and replica moves (pure decisions);
* ``identity``    the peer credential that internal calls carry;
* ``peers``       Flight calls between servers (the caller's token, errors mapped);
* ``zookeeper``   a local ZooKeeper process; ``local``: ``flightstore cluster`` (ZooKeeper + N servers).

Nothing here is imported by a single server: ``kazoo`` loads only in cluster mode.
"""

__all__: list[str] = []
