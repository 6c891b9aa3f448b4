"""A queue's records on the v2 fork core: :class:`QueueState2` is the :class:`~latticed.crdt.epochs.Chains`
value of its heads plus the records it vouches for, and :func:`join` is the lattice join of two of them.

The records held are exactly ``Chains.held``: ``[start, held_end)``, cut at the fork point once the
queue is forked. Below the fork point every branch vouches for the same records, so which replica they
came from does not matter, and the join of two states is the join of their chains with the records
taken from whichever side holds that range. Nothing past the fork point is part of the value.

``bodies`` are unsigned heads on the verified log whose end lies in the held range (the owner's own, or
the ones a delta carried): a chunk of records ends at one of them, whose ``head_hash`` vouches for it
(:func:`latticed.crdt.epoch_delta.vouches`). They depend on what arrived, so equality ignores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from latticed.crdt import epochs, shared_prefix
from latticed.crdt.core_errors import MalformedError, WrongOwnerError
from latticed.crdt.epoch_delta import vouches
from latticed.crdt.epochs import Chains
from latticed.crdt.head import KIND_QUEUE, check_name, genesis_hash, queue_id
from latticed.crdt.head2 import HeadV2
from latticed.crdt.queue.state import EntryView, Meta, empty_entries
from latticed.crdt.records import Record

__all__ = ["QueueState2", "empty_state", "join", "keep_bodies", "nothing_at"]

_END = attrgetter("end")


@dataclass(frozen=True, slots=True)
class QueueState2:
    """One holder's verified replica of a queue under v2 heads (see the module docstring)."""

    owner: bytes
    name: str
    kind: int
    chains: Chains  #: its ``held_end`` is the end of :attr:`entries`
    meta: Meta = ()  #: the metadata ``chains.start_head`` signs
    entries: EntryView = field(default_factory=empty_entries)  #: the records ``chains.held``
    bodies: Sequence[HeadV2] = field(default=(), compare=False)  #: sorted by (end, version)
    #: What a link computed of this very value (its summary): a value is immutable, so once per object
    #: (a relay summarises a push's value up to three times). Not an argument: ``replace`` starts afresh.
    memo: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def queue_id(self) -> bytes:
        return self.chains.queue_id

    @property
    def held(self) -> tuple[int, int]:
        return self.chains.held

    @property
    def forked(self) -> bool:
        return self.chains.forked

    @property
    def base_hash(self) -> bytes:
        """The chain value at the start: the start head's base, or the genesis before any head."""
        head = self.chains.start_head
        return genesis_hash(self.queue_id) if head is None else head.base_hash

    def chain_at(self, offset: int) -> bytes | None:
        """The chain value at ``offset`` if held (``start <= offset <= held_end``)."""
        lo, hi = self.held
        if offset == lo:
            return self.base_hash
        if lo < offset <= hi:
            return self.entries.chain(offset - lo - 1)
        return None

    def record_at(self, offset: int) -> Record | None:
        lo, hi = self.held
        return self.entries.record(offset - lo) if lo <= offset < hi else None

    def records(self) -> list[Record]:
        return self.entries.records()


def empty_state(owner: bytes, name: str, kind: int = KIND_QUEUE) -> QueueState2:
    check_name(name)
    if not isinstance(owner, bytes) or len(owner) != 32:
        raise MalformedError("owner must be a 32-byte Ed25519 public key")
    return QueueState2(owner, name, kind, epochs.empty(owner, queue_id(owner, name, kind)))


def keep_bodies(chains: Chains, bodies: Iterable[HeadV2], *, check: bool = True) -> tuple[HeadV2, ...]:
    """The bodies (sorted, one per leaf) that end in ``chains``' held range and, with ``check``, are
    still on its log (a fork or a new epoch drops some)."""
    lo, hi = chains.held
    seen = {(b.end, b.version, b.leaf()): b for b in bodies if lo < b.end <= hi}
    kept = (seen[key] for key in sorted(seen))
    return tuple(b for b in kept if not check or vouches(chains, b))


def bodies_between(bodies: Sequence[HeadV2], lo: int, hi: int) -> tuple[HeadV2, ...]:
    """The bodies with ``lo < end <= hi`` (``bodies`` sorted by end)."""
    first = shared_prefix.bisect_right(bodies, lo, key=_END)
    last = shared_prefix.bisect_right(bodies, hi, key=_END)
    return tuple(bodies[first:last])  # a tuple's slice is one already: no copy


def cut(state: QueueState2, chains: Chains) -> QueueState2:
    """``state``'s records restricted to ``chains.held`` (a range they cover, of the same epoch), under
    ``chains`` with its ``held_end`` set to the end of what is held."""
    lo, hi = chains.held
    own_lo, own_hi = state.held
    if hi > lo and (state.chains.epoch != chains.epoch or not own_lo <= lo <= hi <= own_hi):
        raise AssertionError("a cut to records this state does not hold")
    entries = state.entries.drop(lo - own_lo).take(hi - lo) if hi > lo else nothing_at(state, lo)
    return replace(state, chains=replace(chains, held_end=hi), entries=entries)


def nothing_at(state: QueueState2, lo: int) -> EntryView:
    """No records, from offset ``lo``: ``state``'s own empty entries when they start there (a store's
    empty run keeps a run appended to it as columns, where a new in-memory view builds a Record per
    row), else a new empty view."""
    entries = state.entries
    return entries if not len(entries) and state.held[0] == lo else empty_entries()


def join(a: QueueState2, b: QueueState2) -> QueueState2:
    """The least state above both (both verified, of one queue): the join of their chains, with the
    records from a side that holds the joined range and the metadata of the joined start head."""
    if (a.owner, a.name, a.kind) != (b.owner, b.name, b.kind):
        raise WrongOwnerError("joining states of two queues")
    chains = epochs.join(a.chains, b.chains)
    lo, hi = chains.held
    source = a
    if hi > lo:
        source = next(
            x for x in (a, b) if x.chains.epoch == chains.epoch and x.held[0] <= lo and x.held[1] >= hi
        )
    meta = a.meta if a.chains.start_head == chains.start_head else b.meta
    joined = cut(source, chains)
    return replace(joined, meta=meta, bodies=keep_bodies(joined.chains, (*a.bodies, *b.bodies)))
