"""The queue lattice's value: :class:`QueueState` (what one holder knows of one queue), the runs of
entries it holds (:class:`EntryView` in memory, or the store's lazy view, both :class:`Entries`), the
:class:`Summary` a peer sends to say what it holds, and the :class:`QueueDelta` that travels between them.

The invariants every operation keeps are stated on :class:`QueueState`: ``start <= held_end <=
known_end``, ``tip`` vouches for the chain value at ``held_end``, ``checkpoints`` are signed heads inside
the held range, ``floor`` is a replica's own low-watermark. The package docstring says what each field
means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.forks import ForkProof, shared_points
from latticed.crdt.head import KIND_QUEUE, SignedHead, check_name, genesis_hash, queue_id
from latticed.crdt.records import (
    Record,
)

Meta = tuple[tuple[str, str], ...]


class Entries(Protocol):
    """What the lattice needs from a run of entries; in memory (:class:`EntryView`) or on disk (the
    store's view reads rows lazily and keeps appended ones in an overlay until they are written)."""

    def __len__(self) -> int: ...
    def record(self, index: int) -> Record: ...
    def chain(self, index: int) -> bytes: ...
    def records(self, lo: int = 0, hi: int | None = None) -> list[Record]: ...
    def extend(self, records: Sequence[Record], chains: Sequence[bytes]) -> Entries: ...
    def drop(self, count: int) -> Entries: ...
    def take(self, count: int) -> Entries: ...


class EntryView:
    """An immutable window onto append-only shared lists.

    Appending to the newest view extends the shared lists in place (no other view can see past its own
    end), so a log of n records costs O(n) to build instead of the O(n^2) of copying tuples; appending to
    an older view copies first, as a forked Go slice would.
    """

    __slots__ = ("_chains", "_hi", "_lo", "_records")

    def __init__(self, records: list[Record], chains: list[bytes], lo: int = 0, hi: int | None = None):
        self._records = records
        self._chains = chains
        self._lo = lo
        self._hi = len(records) if hi is None else hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def record(self, index: int) -> Record:
        return self._records[self._lo + index]

    def chain(self, index: int) -> bytes:
        return self._chains[self._lo + index]

    def records(self, lo: int = 0, hi: int | None = None) -> list[Record]:
        end = self._hi if hi is None else self._lo + hi
        return self._records[self._lo + lo : end]

    def extend(self, records: Sequence[Record], chains: Sequence[bytes]) -> EntryView:
        if self._hi != len(self._records) or (self._lo > 4096 and self._lo > self._hi - self._lo):
            base_records = self._records[self._lo : self._hi]
            base_chains = self._chains[self._lo : self._hi]
            base_records.extend(records)
            base_chains.extend(chains)
            return EntryView(base_records, base_chains)
        self._records.extend(records)
        self._chains.extend(chains)
        return EntryView(self._records, self._chains, self._lo, self._hi + len(records))

    def drop(self, count: int) -> EntryView:
        """Forget the first ``count`` entries (truncation)."""
        count = min(max(count, 0), len(self))
        return EntryView(self._records, self._chains, self._lo + count, self._hi)

    def take(self, count: int) -> EntryView:
        return EntryView(self._records, self._chains, self._lo, self._lo + min(count, len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EntryView):
            return _entries_equal(self, other) if hasattr(other, "records") else NotImplemented
        if len(self) != len(other):
            return False
        if self._records is other._records and self._lo == other._lo:
            return True
        return self.records() == other.records()

    def __hash__(self) -> int:
        return hash((len(self), self.chain(len(self) - 1) if len(self) else b""))

    def __repr__(self) -> str:
        return f"EntryView({len(self)} entries)"


def _entries_equal(a: Entries, b: object) -> bool:
    other: Entries = b  # type: ignore[assignment]
    return len(a) == len(other) and a.records() == other.records()


class DeltaEntries:
    """A verified delta's records and chain values as :class:`Entries`, without building a Record per
    entry: the join only reads chain values and slices of it, unless it keeps this run as the new state
    (then :meth:`extend` / :meth:`drop` turn it into an :class:`EntryView`)."""

    __slots__ = ("_chains", "_records")

    def __init__(self, records: Sequence[Record], chains: list[bytes]) -> None:
        self._records = records
        self._chains = chains

    def __len__(self) -> int:
        return len(self._records)

    def record(self, index: int) -> Record:
        return self._records[index]

    def chain(self, index: int) -> bytes:
        return self._chains[index]

    def records(self, lo: int = 0, hi: int | None = None) -> list[Record]:
        return list(self._records[lo:hi])

    def _view(self) -> EntryView:
        return EntryView(list(self._records), self._chains)

    def extend(self, records: Sequence[Record], chains: Sequence[bytes]) -> EntryView:
        return self._view().extend(records, chains)

    def drop(self, count: int) -> EntryView:
        return self._view().drop(count)

    def take(self, count: int) -> EntryView:
        return self._view().take(count)


def empty_entries() -> EntryView:
    return EntryView([], [])


@dataclass(frozen=True, slots=True)
class Summary:
    """What a replica holds, in a few dozen bytes: enough for a peer to compute the delta it lacks."""

    version: int = 0
    start: int = 0
    held_end: int = 0
    held_hash: bytes = b""
    meta_version: int = -1  # -1: holds no metadata yet
    forked: bool = False
    #: This replica dropped the records below this offset by its own choice (0: it dropped none); it
    #: holds ``[held_start, held_end)``.
    floor: int = 0

    @property
    def held_start(self) -> int:
        """Where the records this replica holds begin (the owner's start, or its own floor above it)."""
        return self.floor if self.floor > self.start else self.start


@dataclass(frozen=True, slots=True)
class QueueDelta:
    """A verifiable piece of a queue: the newest head, plus records ``[from_offset, tip.end)`` that fold
    from ``from_hash`` to ``tip.head_hash``. Joining a delta equals joining the full state it came from."""

    owner: bytes
    name: str
    kind: int
    head: SignedHead | None
    meta: Meta | None = None
    tip: SignedHead | None = None
    from_offset: int = 0
    from_hash: bytes = b""
    #: A tuple of records, or a :class:`RecordRun` (how deltas are read from the store and off the wire).
    records: Sequence[Record] = ()
    checkpoints: tuple[SignedHead, ...] = ()
    fork: ForkProof | None = None
    #: The vouching head's ``head_hash`` was not sent but rebuilt from these records (a compact link):
    #: a signature that then fails says the records were changed, and :func:`verify_delta` says so.
    tip_hash_from_records: bool = field(default=False, compare=False)

    @property
    def end_offset(self) -> int:
        return self.from_offset + len(self.records)


@dataclass(frozen=True, slots=True)
class QueueState:
    """An immutable, verified replica of one queue (see the module docstring for the fields' roles)."""

    owner: bytes
    name: str
    kind: int = KIND_QUEUE
    head: SignedHead | None = None
    #: Vouchers (the head at ``held_end`` and older heads inside the held range) are transport aids that
    #: depend on which deltas arrived; they are not part of the lattice value, so equality ignores them.
    tip: SignedHead | None = field(default=None, compare=False)
    entries: Entries = field(default_factory=empty_entries)
    meta: Meta = ()
    checkpoints: tuple[SignedHead, ...] = field(default=(), compare=False)
    forked: bool = False
    #: Which proof a replica keeps depends on the evidence it saw first; ``forked`` is what converges.
    fork: ForkProof | None = field(default=None, compare=False)
    #: This replica's own low-watermark (see the module docstring): 0, or above the signed start with at
    #: least one record held; ``floor_hash`` is the chain value there (a function of the history).
    floor: int = 0
    floor_hash: bytes = field(default=b"", compare=False)

    @property
    def queue_id(self) -> bytes:
        return queue_id(self.owner, self.name, self.kind)

    @property
    def start(self) -> int:
        """The first offset held: the owner's signed start, or this replica's floor above it."""
        if self.floor:
            return self.floor
        return self.head.start if self.head else 0

    @property
    def held_end(self) -> int:
        return self.start + len(self.entries)

    @property
    def known_end(self) -> int:
        """The end the owner has signed; ``known_end - held_end`` is replication lag."""
        return self.head.end if self.head else 0

    @property
    def version(self) -> int:
        return self.head.version if self.head else 0

    @property
    def meta_dict(self) -> dict[str, str]:
        return dict(self.meta)

    @property
    def base_hash(self) -> bytes:
        """The chain value at :attr:`start`."""
        if self.floor:
            return self.floor_hash
        return self.head.base_hash if self.head else genesis_hash(self.queue_id)

    @property
    def complete(self) -> bool:
        return self.head is None or self.held_end == self.head.end

    @property
    def visible_end(self) -> int:
        """Where reads, serving and replication of this queue stop: ``held_end``, or for a forked queue
        the highest offset up to it at which this replica's chain value is one the proof shows both
        histories hold (:func:`~latticed.crdt.forks.shared_points`), so what any replica shows is a
        prefix of what the histories share; the signed start when there is none (nothing is shown).
        Only chain values known without reading a record count (its start, the ends of the heads it
        keeps): any thread may ask, and the store's records are read on its own."""
        if not self.forked:
            return self.held_end
        if self.fork is not None:
            known = {h.end: h.head_hash for h in (*self.checkpoints, self.tip) if h is not None}
            known[self.start] = self.base_hash
            for offset, value in shared_points(self.fork):
                if self.start <= offset <= self.held_end and known.get(offset) == value:
                    return offset
        return self.start

    def chain_at(self, offset: int) -> bytes | None:
        """The chain value at ``offset`` if we hold it (``start <= offset <= held_end``)."""
        if offset == self.start:
            return self.base_hash
        if self.start < offset <= self.held_end:
            return self.entries.chain(offset - self.start - 1)
        return None

    def record_at(self, offset: int) -> Record | None:
        if self.start <= offset < self.held_end:
            return self.entries.record(offset - self.start)
        return None

    def summary(self) -> Summary:
        return Summary(
            version=self.version,
            start=self.head.start if self.head else 0,
            held_end=self.held_end,
            held_hash=self.chain_at(self.held_end) or b"",
            meta_version=self.head.meta_version if self.head else -1,
            forked=self.forked,
            floor=self.floor,
        )


def empty_state(owner: bytes, name: str, kind: int = KIND_QUEUE) -> QueueState:
    check_name(name)
    if not isinstance(owner, bytes) or len(owner) != 32:
        raise MalformedError("owner must be a 32-byte Ed25519 public key")
    return QueueState(owner=owner, name=name, kind=kind)
