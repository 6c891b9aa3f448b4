"""The values :mod:`.replica_deltas` exchanges and returns (a summary, a delta, a checked delta, a
joined one), apart from the checks so the direct path (:mod:`.next_version`) can build a result too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from latticed.crdt.epoch_delta import LogDelta, LogSummary
from latticed.crdt.epochs import Chains
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue.state import Meta
from latticed.crdt.queue2.chain_state import QueueState2
from latticed.crdt.records import Record

__all__ = ["Delta", "Merged", "Summary", "Verified"]


@dataclass(frozen=True, slots=True)
class Summary:
    log: LogSummary
    held_end: int
    held_hash: bytes


@dataclass(frozen=True, slots=True)
class Delta:
    """Leaves a peer lacks, the start head's metadata, and records ``[from_offset, ...)`` with the
    unsigned bodies of the heads that end inside them (the last ends where they end). ``records`` is a
    tuple or a :class:`~latticed.crdt.records.RecordRun` (as the wire decodes it: checked a column at a
    time, once)."""

    owner: bytes
    name: str
    kind: int
    log: LogDelta | None = None
    meta: Meta | None = None
    from_offset: int = 0
    records: Sequence[Record] = ()
    #: A tuple, or a decode's run of them (``leaf_bodies.Decoded``, ``lazy_bodies.LazyDecoded``).
    bodies: Sequence[HeadV2] = ()


@dataclass(frozen=True, slots=True)
class Verified:
    """A delta checked against a state: the merged chains, and the records it adds with their chain
    values (none when it adds none)."""

    chains: Chains
    meta: Meta
    from_offset: int
    records: Sequence[Record]  #: a slice of the delta's records (a run stays a run)
    chain: tuple[bytes, ...]
    bodies: Sequence[HeadV2]


@dataclass(frozen=True, slots=True)
class Merged:
    """The joined state, and the records this replica held past the fork point it just learned of:
    evidence for the operator, not part of any value."""

    state: QueueState2
    evidence: tuple[Record, ...] = ()
