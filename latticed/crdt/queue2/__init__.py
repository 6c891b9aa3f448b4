"""A queue of records on the v2 fork core (docs/lattice.md, "Forks under v2 heads"): a forked queue is
frozen at its fork point and its owner recovers it in a new epoch. Pure, and not on the daemon's paths
yet; it replaces the splicing join of :mod:`latticed.crdt.queue` once the ``heads-v2`` feature carries it.

The value and its join (:mod:`.state`), the owner's changes and recovery (:mod:`.commit`), and what
travels between replicas (:mod:`.deltas`). Import the names from here.
"""

from __future__ import annotations

from latticed.crdt.queue2.commit import commit, recover, truncate
from latticed.crdt.queue2.deltas import (
    Delta,
    Merged,
    Summary,
    Verified,
    delta,
    join_verified,
    summary,
    verify_delta,
)
from latticed.crdt.queue2.state import QueueState2, empty_state, join

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
