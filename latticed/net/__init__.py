"""The trio shells of the peer protocols: the TCP transport and secure channel, the gossip links, mDNS
discovery, lease forwarding on the links and the replication service that drives them.

The rules (the replication session, the handshake, the peer book, lease forwarding's messages) are sans-IO
in :mod:`latticed.protocol`; this package feeds them sockets and the clock. It may import the pure floor
(``crdt``, ``protocol``), ``host``, ``process``, ``errors`` and the storage it replicates through
:class:`~latticed.net.ports.ReplicaStore` (never the engine class); never the API, groups, services,
produce, Spark, the root or the CLI, which use it.
"""
