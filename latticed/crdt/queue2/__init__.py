"""A queue of records on the v2 fork core (docs/lattice.md, "Forks under v2 heads"): a forked queue is
frozen at its fork point and its owner recovers it in a new epoch. Pure, and not on the daemon's paths
yet; it replaces the splicing join of :mod:`latticed.crdt.queue` once the ``heads-v2`` feature carries it.

The value and its join (:mod:`.chain_state`), the owner's changes and recovery
(:mod:`.owner_changes`), and what travels between replicas (:mod:`.replica_deltas`). Import the names
from here.
"""

from __future__ import annotations

from latticed.crdt.queue2.chain_state import QueueState2, empty_state, join
from latticed.crdt.queue2.owner_changes import commit, recover, truncate
from latticed.crdt.queue2.replica_deltas import (
    Delta,
    Merged,
    Summary,
    Verified,
    delta,
    join_verified,
    summary,
    verify_delta,
)

__all__ = [
    "Delta",
    "Merged",
    "QueueState2",
    "Summary",
    "Verified",
    "commit",
    "delta",
    "empty_state",
    "join",
    "join_verified",
    "recover",
    "summary",
    "truncate",
    "verify_delta",
]
