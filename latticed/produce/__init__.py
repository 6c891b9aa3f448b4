"""Many producers, one signer: other daemons offer into a queue, its owner signs and commits.

* :mod:`.policy`: who may offer (the ``producers`` allow-list in the queue's signed metadata) and the
  header naming who offered each record.
* :mod:`.dedup`: the owner's idempotent append (producer id + sequence, remembered in the store).
* :mod:`.owner`: the owner answers ``produce`` requests of peers (over the lease-forwarding link).
* :mod:`.forward`: a producer's daemon forwards offers into another daemon's queue to its owner.
"""
