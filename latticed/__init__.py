"""latticed: signed single-writer lattice queues and KV state, replicated peer to peer.

The public library surface is re-exported here; everything else is internal.
"""

from latticed.crdt.errors import (
    BadSignatureError,
    EquivocationError,
    GapError,
    IntegrityError,
    LatticedError,
    MalformedError,
    NotOwnerError,
    TamperedError,
    WrongOwnerError,
)
from latticed.crdt.forks import ForkProof
from latticed.crdt.queue import QueueDelta, QueueState, Summary
from latticed.crdt.records import Record
from latticed.crdt.signing import Identity
from latticed.queue import LatticeQueue

__all__ = [
    "BadSignatureError",
    "EquivocationError",
    "ForkProof",
    "GapError",
    "Identity",
    "IntegrityError",
    "LatticeQueue",
    "LatticedError",
    "MalformedError",
    "NotOwnerError",
    "QueueDelta",
    "QueueState",
    "Record",
    "Summary",
    "TamperedError",
    "WrongOwnerError",
]
