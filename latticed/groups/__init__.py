"""Work queues (consumer groups) as a daemon service: the trio half.

:mod:`.service` runs every group this daemon owns on the engine, with :mod:`.runtime` per group and
:mod:`.committer` for group commits of its progress. The lease rules they drive are sans-IO and live in
:mod:`latticed.leases`; the replicated half (progress lattice, ops, definition, dead letters) in
:mod:`latticed.crdt.group`, :mod:`~latticed.crdt.group_spec` and :mod:`~latticed.crdt.attempts`.
See docs/workqueues.md.
"""
