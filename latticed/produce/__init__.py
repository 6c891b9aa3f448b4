"""Many producers, one signer: other daemons offer into a queue, its owner signs and commits.

Its job is the offer path between a producer's daemon and a queue's owner, both sides of it:

* :mod:`.policy`: who may offer (the ``producers`` allow-list in the queue's signed metadata) and the
  header naming who offered each record.
* :mod:`.dedup`: the owner's idempotent append (producer id + sequence, remembered in the store).
* :mod:`.expiry`: idle producers' remembered sequences expire (a bounded step per retention tick).
* :mod:`.owner`: the owner answers ``produce`` requests of peers (over the lease-forwarding link).
* :mod:`.forward`: a producer's daemon forwards offers into another daemon's queue to its owner.

What it may import: the pure core (crdt), the store's jobs and sealer (through Protocols, never the engine
class), the peer links (:mod:`latticed.net.leasing`), process plumbing and errors. Never the API, the
services, groups, the composition root, Spark or the CLI: the API server and the root call into it. The
client library imports :mod:`.policy` alone (it has no I/O), to write an allow-list into metadata.
"""
