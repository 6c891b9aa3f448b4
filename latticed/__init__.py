"""latticed: signed single-writer lattice queues and KV state, replicated peer to peer.

The public library surface is re-exported here; everything else is internal. The re-exports load on
first use: every ``import latticed.…`` runs this file, and a process that only talks to the daemon (the
CLI, Spark's per-query source process) should not pay ~45 ms for the lattice core and libsodium.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The errors load with anything that imports latticed (every layer raises them), so only the rest is lazy.
from latticed.crdt.core_errors import (
    BadSignatureError,
    EquivocationError,
    GapError,
    IntegrityError,
    LatticedError,
    MalformedError,
    NotOwnerError,
    TamperedError,
    WrongOwnerError,
    WrongTypeError,
)

if TYPE_CHECKING:
    from latticed.crdt.forks import ForkProof
    from latticed.crdt.queue import QueueDelta, QueueState, Summary
    from latticed.crdt.records import Record
    from latticed.crdt.signing import Identity
    from latticed.facades.lattice_queue import LatticeQueue

#: Public name -> the module that defines it.
_EXPORTS = {
    "ForkProof": "latticed.crdt.forks",
    "QueueDelta": "latticed.crdt.queue",
    "QueueState": "latticed.crdt.queue",
    "Summary": "latticed.crdt.queue",
    "Record": "latticed.crdt.records",
    "Identity": "latticed.crdt.signing",
    "LatticeQueue": "latticed.facades.lattice_queue",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'latticed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


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
    "WrongTypeError",
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
