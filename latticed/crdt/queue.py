"""The signed single-writer queue lattice (CAD040 + CAD038, single writer).

A :class:`QueueState` is an immutable value:

* ``head``: the newest owner-signed head we know; it vouches for ``start`` (truncation), metadata and
  the queue's true end.
* the entries we hold, ``[start, held_end)``, whose chain value at ``held_end`` is vouched by ``tip``
  (a signed head ending there). A replica that is mid-catch-up holds a verified prefix (``tip`` older than
  ``head``); an owner or a caught-up replica has ``tip == head``.
* ``checkpoints``: older signed heads inside the held range, kept so a backlog can be cut into chunks that
  each verify on their own.
* ``fork``: a proof that the owner signed two histories, once one is seen.
* ``floor``: a replica's own low-watermark (0: none). A replica that keeps less than the owner drops its
  oldest records locally (:func:`drop_local`); it then holds ``[floor, held_end)``, which still verifies
  on its own: the chain value at ``floor`` (``floor_hash``) folds through the kept records to the signed
  head at ``held_end``. The floor is this replica's choice, not the owner's: no head says it, no delta
  carries it, and a join never brings back records below it. A delta cut from such a replica never
  passes the kept suffix off as the whole queue: it starts at the floor, and a peer it cannot extend gets
  the head without records (it must find them where they are whole). Summaries say where the records
  start (``Summary.floor``).

The join takes the newest head (by version, signature as tie-break), the longest verified prefix, and the
union of checkpoints; it is commutative, associative and idempotent for every honest history (property
tested). When the owner equivocates, the join still terminates deterministically (the higher head wins),
flags the queue forked and keeps a :class:`ForkProof` anyone can check.

Every function here is pure: clocks come in as ``now_ms`` arguments.

Why one module: the lattice's value (:class:`QueueState`), commit, delta, verify and join all keep the same
invariants (``start``/``held_end``/``tip``/``head``, chain checkpoints, fork proofs), and the join's
correctness argument runs through all of them; the record and chain primitives they build on are
:mod:`latticed.crdt.records`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from latticed.crdt.core_errors import GapError, MalformedError, NotOwnerError, TamperedError, WrongOwnerError
from latticed.crdt.forks import Bridge, ForkProof, better_proof, heads_conflict, two_head_proof
from latticed.crdt.head import KIND_QUEUE, SignedHead, check_name, genesis_hash, meta_hash, queue_id
from latticed.crdt.records import (
    MAX_OFFSET,
    Record,
    RecordRun,
    blake2b_skip,
    chain_extend,
    check_records,
    record_digest,
)
from latticed.crdt.signing import HASH_SIZE, Identity

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


class _DeltaEntries:
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


def _empty_entries() -> EntryView:
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
    entries: Entries = field(default_factory=_empty_entries)
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


# ---------------------------------------------------------------------------------------------- owner ops


#: The owner signs a head at least every this many payload bytes, so catch-up chunks (which end at signed
#: heads) stay small enough for bounded frames even when one batch is huge.
CHECKPOINT_BYTES = 1 << 20


def commit(
    state: QueueState,
    identity: Identity,
    *,
    now_ms: int,
    records: Sequence[Record] = (),
    new_start: int | None = None,
    meta_updates: Mapping[str, str | None] | None = None,
    checkpoint_bytes: int = CHECKPOINT_BYTES,
) -> QueueState:
    """Apply the owner's changes and sign one head over them (one signature per batch; a batch larger
    than ``checkpoint_bytes`` gets a signed head per slice of that size).

    Everything is checked before anything is computed from the records (their sizes cut the slices),
    so bad input is a :class:`MalformedError`, never some other exception."""
    check_records(records)
    if state.held_end + len(records) > MAX_OFFSET or (new_start is not None and new_start > MAX_OFFSET):
        raise MalformedError(f"offsets stop at {MAX_OFFSET}")
    first = 0
    for cut in _checkpoint_cuts(records, checkpoint_bytes):
        state = _commit_once(state, identity, now_ms=now_ms, records=records[first:cut])
        first = cut
    return _commit_once(
        state,
        identity,
        now_ms=now_ms,
        records=records[first:],
        new_start=new_start,
        meta_updates=meta_updates,
    )


def _checkpoint_cuts(records: Sequence[Record], checkpoint_bytes: int) -> list[int]:
    """Where to end a signed slice of ``records``: after each ``checkpoint_bytes`` of payload."""
    if type(records) is RecordRun:
        if records.payload_bytes() < checkpoint_bytes:
            return []
        sizes = list(map(len, records.values))
        if records.keys.count(None) != len(sizes):
            sizes = [size + (len(key) if key else 0) for size, key in zip(sizes, records.keys, strict=True)]
    else:
        sizes = [len(r.value) + (len(r.key) if r.key else 0) for r in records]
    if sum(sizes) < checkpoint_bytes:
        return []
    cuts: list[int] = []
    size = 0
    last = len(sizes) - 1
    for index, record_size in enumerate(sizes):
        size += record_size
        if size >= checkpoint_bytes and index < last:
            cuts.append(index + 1)
            size = 0
    return cuts


def _commit_once(
    state: QueueState,
    identity: Identity,
    *,
    now_ms: int,
    records: Sequence[Record] = (),
    new_start: int | None = None,
    meta_updates: Mapping[str, str | None] | None = None,
) -> QueueState:
    """One signed head over ``records`` (checked by :func:`commit`) and the other changes."""
    if identity.public_key != state.owner:
        raise NotOwnerError(f"not the owner of {state.owner.hex()}/{state.name}")
    if not state.complete:
        raise GapError("owner state is missing records; it cannot sign a new head")
    qid = state.queue_id
    version = state.version + 1
    start, end = state.start, state.held_end
    entries = state.entries
    base_hash = state.base_hash
    head_hash = state.chain_at(end) or base_hash
    if records:
        chains = chain_extend(head_hash, end, records)
        entries = entries.extend(records, chains)
        end += len(records)
        head_hash = chains[-1]
    if new_start is not None and new_start > start:
        if new_start >= end:
            if new_start > end:
                # Offsets in [end, new_start) are never assigned; the chain records the jump explicitly.
                head_hash = blake2b_skip(head_hash, new_start)
                end = new_start
            entries = _empty_entries()
            base_hash = head_hash
        else:
            base_hash = entries.chain(new_start - start - 1)
            entries = entries.drop(new_start - start)
        start = new_start
    meta = state.meta
    meta_version = state.head.meta_version if state.head else 0
    if meta_updates:
        merged = dict(meta)
        for key, value in meta_updates.items():
            if not isinstance(key, str) or not key:
                raise MalformedError("metadata keys are non-empty strings")
            if value is None:
                merged.pop(key, None)
            elif isinstance(value, str):
                merged[key] = value
            else:  # never converted: a 5 stored as "5" would come back as another type
                raise MalformedError(
                    f"metadata values are strings (or None to delete), not {type(value).__name__}"
                )
        new_meta = tuple(sorted(merged.items()))
        if new_meta != meta:
            meta, meta_version = new_meta, version
    head = SignedHead.sign(
        identity,
        queue_id=qid,
        version=version,
        start=start,
        end=end,
        base_hash=base_hash,
        head_hash=head_hash,
        meta_version=meta_version,
        meta_hash=meta_hash(dict(meta)),
        timestamp=max(now_ms, state.head.timestamp if state.head else 0),
    )
    checkpoints = state.checkpoints
    if checkpoints and checkpoints[0].end <= start:
        # Checkpoints are sorted by end, so only a truncation (past the first one) drops any.
        checkpoints = tuple(c for c in checkpoints if c.end > start)
    if records:
        checkpoints += (head,)
    return QueueState(
        owner=state.owner,
        name=state.name,
        kind=state.kind,
        head=head,
        tip=head if len(entries) else None,
        entries=entries,
        meta=meta,
        checkpoints=checkpoints,
        forked=state.forked,
        fork=state.fork,
    )


# ------------------------------------------------------------------------------------------- local drops


def drop_local(state: QueueState, floor: int) -> QueueState:
    """This replica's records below ``floor`` dropped (it keeps less than the owner), leaving a suffix that
    still verifies on its own; the newest record is always kept, so a signed head (``tip``) vouches for
    the kept run and ``floor_hash`` stays provable.

    Nothing is signed and nothing travels: the owner's head and ``start`` are unchanged, and later joins
    never bring the dropped records back (see :func:`join_verified`). A floor at or below what is held
    already changes nothing (the same value is returned)."""
    if state.head is None or state.tip is None:
        return state
    floor = min(floor, state.held_end - 1)
    if floor <= state.start:
        return state
    floor_hash = state.chain_at(floor)
    assert floor_hash is not None
    checkpoints = state.checkpoints
    if checkpoints and checkpoints[0].end <= floor:
        checkpoints = tuple(c for c in checkpoints if c.end > floor)
    return QueueState(
        state.owner,
        state.name,
        state.kind,
        state.head,
        state.tip,
        state.entries.drop(floor - state.start),
        state.meta,
        checkpoints,
        state.forked,
        state.fork,
        floor,
        floor_hash,
    )


# ------------------------------------------------------------------------------------------------ deltas


#: Reads the records ``[lo, hi)`` (absolute offsets) of the state a delta is cut from.
RecordReader = Callable[[int, int], Sequence[Record]]


def delta(
    state: QueueState,
    since: Summary | None = None,
    max_records: int | None = None,
    max_bytes: int | None = None,
    *,
    read: RecordReader | None = None,
) -> QueueDelta:
    """What a replica summarised by ``since`` lacks, as one verifiable piece.

    With ``max_records`` / ``max_bytes`` the piece ends at a signed checkpoint within those bounds (or the
    first one, if even that is larger), so a long backlog streams in chunks that each verify and can be
    stored on their own; call again with the new summary to resume. ``read`` reads records (default: from
    ``state.entries``); under ``max_bytes`` only about what fits is read, never the whole backlog.
    """
    head = state.head
    if head is None:
        return QueueDelta(state.owner, state.name, state.kind, None, fork=state.fork)
    from_offset = state.start
    end = state.held_end
    if (
        since is not None
        and state.start <= since.held_end <= state.held_end
        and state.chain_at(since.held_end) == since.held_hash
    ):
        from_offset = since.held_end
    elif (
        since is not None
        and since.held_end > state.held_end
        and since.version >= head.version
        and state.fork is None
    ):
        # The asker holds more records, under a head as new as ours (we are a relay whose commit is
        # behind what it passed on): none of our records is news to it. Not the whole queue again.
        from_offset = end
    elif state.floor:
        # We dropped the records below our floor: a peer we cannot extend could not use our suffix (a run
        # must reach back to the signed start), so it gets the head and finds the records elsewhere.
        end = from_offset
    tip = state.tip
    if max_records is not None and end - from_offset > max_records:
        cut = _checkpoint_for_chunk(state, from_offset, max_records)
        if cut is not None:
            tip, end = cut, cut.end
    if tip is not None and tip.start > from_offset and end > from_offset:
        tip, end = _voucher_from(state, from_offset, end, tip)
    send_meta = since is None or since.meta_version != head.meta_version
    records: Sequence[Record] = ()
    checkpoints: tuple[SignedHead, ...] = ()
    if end > from_offset:
        if read is None:
            entries, start = state.entries, state.start

            def read(lo: int, hi: int) -> Sequence[Record]:
                return tuple(entries.records(lo - start, hi - start))

        if max_bytes is None:
            records = read(from_offset, end)
        else:
            records, cut = _read_within_bytes(state, from_offset, end, max_bytes, read)
            if cut is not None:
                tip, end = cut, cut.end
        checkpoints = tuple(c for c in state.checkpoints if from_offset < c.end <= end and c != tip)
    else:
        tip = None
    return QueueDelta(
        owner=state.owner,
        name=state.name,
        kind=state.kind,
        head=head,
        meta=state.meta if send_meta else None,
        tip=tip,
        from_offset=from_offset,
        from_hash=state.chain_at(from_offset) or b"",
        records=records,
        checkpoints=checkpoints,
        fork=state.fork,
    )


def payload_bytes(records: Sequence[Record]) -> int:
    """Bytes of values and keys of ``records`` (what delta sizes are bounded by)."""
    if type(records) is RecordRun:
        return records.payload_bytes()
    return sum(len(r.value) + (len(r.key) if r.key else 0) for r in records)


def _payload_sizes(records: Sequence[Record]) -> list[int]:
    if type(records) is RecordRun:
        sizes = list(map(len, records.values))
        if records.keys.count(None) != len(sizes):
            sizes = [size + (len(k) if k else 0) for size, k in zip(sizes, records.keys, strict=True)]
        return sizes
    return [len(r.value) + (len(r.key) if r.key else 0) for r in records]


def _read_within_bytes(
    state: QueueState, from_offset: int, end: int, max_bytes: int, read: RecordReader
) -> tuple[Sequence[Record], SignedHead | None]:
    """Records from ``from_offset`` up to the last checkpoint (or ``end``) whose payload fits in
    ``max_bytes``; the first checkpoint when even that is larger. Returns them and the checkpoint they
    end at (None: they end at ``end``).

    Reads piece by piece between checkpoints, guessing from the sizes seen so far how many pieces still
    fit, so a long backlog of big records costs about one chunk of reading, not the whole backlog."""
    by_end = {c.end: c for c in state.checkpoints if from_offset < c.end < end and c.start <= from_offset}
    bounds = [*sorted(by_end), end]
    pieces: list[Sequence[Record]] = []
    total = 0
    pos = from_offset
    index = 0
    while index < len(bounds):
        target = index
        if total:
            room = (max_bytes - total) * (pos - from_offset) // total  # records that likely still fit
            while target + 1 < len(bounds) and bounds[target + 1] - pos <= room:
                target += 1
        piece = read(pos, bounds[target])
        size = payload_bytes(piece)
        if total + size <= max_bytes:
            pieces.append(piece)
            total += size
            pos = bounds[target]
            index = target + 1
            continue
        # Over budget inside this piece: keep its longest prefix that ends at a boundary and fits.
        cumulative = total
        sizes = _payload_sizes(piece)
        fit = None
        k = index
        for i, record_size in enumerate(sizes, pos + 1):
            cumulative += record_size
            if cumulative > max_bytes:
                break
            while k <= target and bounds[k] < i:
                k += 1
            if k <= target and bounds[k] == i:
                fit = i
        if fit is None and not pieces:
            fit = bounds[index]  # not even the first checkpoint fits: send up to it anyway
        if fit is not None:
            pieces.append(piece[: fit - pos])
            pos = fit
        break
    if len(pieces) == 1:
        records = pieces[0]
    elif all(type(p) is RecordRun for p in pieces):
        records = RecordRun.join(pieces)  # type: ignore[arg-type]
    else:
        records = tuple(r for p in pieces for r in p)
    return records, (None if pos == end else by_end[pos])


def _voucher_from(state: QueueState, from_offset: int, end: int, tip: SignedHead) -> tuple[SignedHead, int]:
    """A head that vouches for a chunk from ``from_offset``, for a ``tip`` that starts past it: a head
    vouches for records from its own start on (:func:`verify_delta` insists), and a forked queue's run
    can end at a head of the other history that starts higher (its records joined onto ours). Another
    head at ``end`` that starts low enough, else the chunk ends at the last one before it (the next
    chunk starts there); none: ``tip`` as it is."""
    fits = [c for c in state.checkpoints if c.start <= from_offset < c.end <= end]
    if not fits:
        return tip, end
    best = max(fits, key=lambda c: (c.end, c.sort_key))
    return best, best.end


def _checkpoint_for_chunk(state: QueueState, from_offset: int, max_records: int) -> SignedHead | None:
    """The checkpoint a chunk from ``from_offset`` ends at. Only one that starts at or before it: a head
    vouches for records from its own start on (:func:`verify_delta` insists), and a forked queue can hold
    a truncation head of one history inside a run that the other history's head starts lower."""
    best: SignedHead | None = None
    for checkpoint in state.checkpoints:
        if checkpoint.end <= from_offset or checkpoint.start > from_offset:
            continue
        if checkpoint.end - from_offset > max_records and best is not None:
            break
        best = checkpoint
    if best is not None and best.end >= state.held_end:
        return None
    return best


# ------------------------------------------------------------------------------------------------- merge


@dataclass(frozen=True, slots=True)
class VerifiedDelta:
    """A delta whose signatures and hash chain were checked; ``chains`` is our own recomputation."""

    delta: QueueDelta
    chains: tuple[bytes, ...]


def _is_kind(kind: object) -> bool:
    """An int (a :class:`~latticed.crdt.head.QueueKind` or one a newer peer uses), never a bool."""
    return isinstance(kind, int) and not isinstance(kind, bool)


def _check_shape(d: QueueDelta) -> None:
    """Types and layouts first, so that nothing below can fail with anything but a typed error."""
    if not isinstance(d, QueueDelta):
        raise MalformedError(f"not a queue delta or state: {type(d).__name__}")
    if not isinstance(d.owner, bytes) or not isinstance(d.name, str) or not _is_kind(d.kind):
        raise MalformedError("a delta names its queue by owner key, name and kind")
    if any(h is not None and not isinstance(h, SignedHead) for h in (d.head, d.tip)):
        raise MalformedError("a delta's head and tip are signed heads")
    if not isinstance(d.checkpoints, tuple) or not all(isinstance(c, SignedHead) for c in d.checkpoints):
        raise MalformedError("a delta's checkpoints are signed heads")
    if not isinstance(d.records, tuple) and type(d.records) is not RecordRun:
        raise MalformedError("a delta's records are a tuple or a record run")
    if d.fork is not None and not isinstance(d.fork, ForkProof):
        raise MalformedError("a delta's fork proof is a ForkProof")
    if type(d.from_offset) is not int or not 0 <= d.from_offset <= MAX_OFFSET:
        raise MalformedError(f"a delta's first offset is an integer from 0 to {MAX_OFFSET}")
    if d.records and (not isinstance(d.from_hash, bytes) or len(d.from_hash) != HASH_SIZE):
        raise MalformedError("a delta's starting chain value is a 32-byte hash")
    if d.meta is not None:
        if not isinstance(d.meta, tuple) or not all(
            type(item) is tuple and len(item) == 2 and all(isinstance(x, str) for x in item)
            for item in d.meta
        ):
            raise MalformedError("metadata is a tuple of (str, str) pairs")
        keys = [key for key, _ in d.meta]
        if keys != sorted(set(keys)):
            raise MalformedError("metadata must be sorted by key, each key once")


def verify_delta(state: QueueState, d: QueueDelta) -> VerifiedDelta:
    """Check everything a delta claims before any of it touches the state."""
    _check_shape(d)
    if d.owner != state.owner or d.name != state.name or d.kind != state.kind:
        raise WrongOwnerError("delta belongs to another queue (another owner, name or kind)")
    qid = state.queue_id
    if d.fork is not None:
        d.fork.verify()
        if (d.fork.owner, d.fork.name, d.fork.kind) != (state.owner, state.name, state.kind):
            raise WrongOwnerError("fork proof is about another queue")
    head = d.head
    if head is None:
        if d.records or d.tip is not None or d.checkpoints or d.meta is not None:
            raise MalformedError("records or metadata without a signed head")
        return VerifiedDelta(d, ())
    head.verify(state.owner, qid)
    genesis = genesis_hash(qid)
    if head.start == 0 and head.base_hash != genesis:
        raise TamperedError("head's chain does not start at the queue's genesis")
    if d.meta is not None and meta_hash(dict(d.meta)) != head.meta_hash:
        raise TamperedError("metadata does not match the signed head")
    if not d.records:
        if d.tip is not None or d.checkpoints:
            raise MalformedError("a vouching head without records")
        return VerifiedDelta(d, ())
    tip = d.tip
    if tip is None:
        raise MalformedError("records without the head that vouches for them")
    if tip != head:
        tip.verify(state.owner, qid)
    if d.from_offset + len(d.records) != tip.end or d.from_offset < tip.start:
        raise TamperedError("records do not span the head that vouches for them")
    check_records(d.records)
    if d.from_offset == tip.start and d.from_hash != tip.base_hash:
        raise TamperedError("chunk start does not match the signed base hash")
    if d.from_offset == 0 and d.from_hash != genesis:
        raise TamperedError("chunk start does not match the queue's genesis")
    chains = chain_extend(d.from_hash, d.from_offset, d.records)
    if chains[-1] != tip.head_hash:
        raise TamperedError("records do not hash to the signed head")
    for checkpoint in d.checkpoints:
        checkpoint.verify(state.owner, qid)
        index = checkpoint.end - d.from_offset - 1
        if not 0 <= index < len(chains) or chains[index] != checkpoint.head_hash:
            raise TamperedError("checkpoint does not match the records")
    return VerifiedDelta(d, tuple(chains))


def merge(state: QueueState, incoming: QueueDelta | QueueState) -> QueueState:
    """Verify, then join. Anything forged raises an :class:`IntegrityError` and leaves ``state`` as it was;
    an older but valid state joins as a no-op."""
    if isinstance(incoming, QueueState):
        for h in (incoming.head, incoming.tip, *incoming.checkpoints):
            if h is None:
                continue
            if not isinstance(h, SignedHead):
                raise MalformedError("a queue state's heads are signed heads")
            h.check()
        d = delta(incoming)
        joined = join_verified(state, verify_delta(state, d))
        # A fork's run spliced from two histories: no one head vouches for it from its start, so one
        # delta carries a prefix only, and a merge of the whole state hung on which side came as the
        # state. The rest follows piece by piece, each from as low as its head vouches (where our
        # records may still agree with it), so a whole state joins whole.
        covered = d.end_offset if d.records else incoming.held_end
        while (piece := _piece(incoming, covered)) is not None:
            joined = join_verified(joined, verify_delta(joined, piece))
            covered = piece.end_offset
        return joined
    return join_verified(state, verify_delta(state, incoming))


def _piece(state: QueueState, covered: int) -> QueueDelta | None:
    """The longest piece of ``state``'s run that one head vouches for and that reaches past ``covered``
    from at or below it (None: the run is covered, or no head does)."""
    heads = [h for h in (*state.checkpoints, state.tip) if h is not None and h.start <= covered < h.end]
    if not heads or covered >= state.held_end:
        return None
    tip = max(heads, key=lambda h: (h.end, h.sort_key))
    lo, start = max(tip.start, state.start), state.start
    return QueueDelta(
        owner=state.owner,
        name=state.name,
        kind=state.kind,
        head=state.head,
        meta=state.meta,
        tip=tip,
        from_offset=lo,
        from_hash=state.chain_at(lo) or b"",
        records=tuple(state.entries.records(lo - start, tip.end - start)),
        checkpoints=tuple(c for c in state.checkpoints if lo < c.end <= tip.end and c != tip),
        fork=state.fork,
    )


@dataclass(slots=True)
class _Run:
    """A contiguous verified run of records ``[start, end)``: chain value ``base`` at ``start``, and ``tip``
    (when there are records) the signed head that vouches for the chain value at ``end``."""

    start: int
    base: bytes
    entries: Entries
    tip: SignedHead | None
    checkpoints: tuple[SignedHead, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.entries)

    def chain_at(self, offset: int) -> bytes | None:
        if offset == self.start:
            return self.base
        if self.start < offset <= self.end:
            return self.entries.chain(offset - self.start - 1)
        return None

    def witness(self, offset: int, fallback: SignedHead) -> tuple[SignedHead, Bridge | None]:
        """A signed head and, if needed, a bridge proving this run's chain value at ``offset``."""
        if self.tip is None:
            return fallback, None
        if offset == self.end:
            return self.tip, None
        records = self.entries.records(offset - self.start)
        digests = tuple(record_digest(r, offset + i) for i, r in enumerate(records))
        start_hash = self.chain_at(offset)
        assert start_hash is not None
        return self.tip, Bridge(start_hash, digests)


def join_verified(state: QueueState, verified: VerifiedDelta) -> QueueState:
    """The lattice join of a state and a verified delta."""
    d = verified.delta
    proof = better_proof(state.fork, d.fork)
    if d.head is None:
        return _replace_fork(state, state.forked or proof is not None, proof)
    owner, name, kind = state.owner, state.name, state.kind

    # 1. Heads: the newest wins; any contradiction between two heads is a fork.
    ours = [h for h in (state.head, state.tip) if h is not None]
    theirs = [h for h in (d.head, d.tip, *d.checkpoints) if h is not None]
    for x in ours:
        for y in theirs:
            if heads_conflict(x, y):
                proof = better_proof(proof, two_head_proof(owner, name, kind, x, y))
    ours_head = state.head
    if ours_head is not None and (d.head.sort_key <= ours_head.sort_key or _withheld_meta(ours_head, d)):
        head, meta = ours_head, state.meta
    else:
        if d.meta is None and (ours_head is None or d.head.meta_version != ours_head.meta_version):
            raise GapError("delta lacks metadata this replica does not have")
        head = d.head
        meta = d.meta if d.meta is not None else state.meta

    # 2. Runs of records: ours, theirs, and both joined where they meet and agree.
    runs: list[_Run] = []
    local = None
    if state.head is not None:
        local = _Run(state.start, state.base_hash, state.entries, state.tip, state.checkpoints)
        runs.append(local)
    if d.records:
        chains = list(verified.chains)
        incoming = _Run(d.from_offset, d.from_hash, _DeltaEntries(d.records, chains), d.tip, d.checkpoints)
        runs.append(incoming)
        if local is not None and state.head is not None and local.start <= d.from_offset <= local.end:
            meet = min(local.end, incoming.end)
            if local.chain_at(meet) == incoming.chain_at(meet):
                both = state.checkpoints + d.checkpoints
                if incoming.end > local.end:
                    skip = local.end - d.from_offset
                    # The delta's records as they came (a run stays columnar into the store).
                    joined = local.entries.extend(d.records[skip:] if skip else d.records, chains[skip:])
                    runs.append(_Run(local.start, local.base, joined, d.tip, both))
                else:
                    local.checkpoints = both
            else:
                a, bridge_a = local.witness(meet, state.head)
                b, bridge_b = incoming.witness(meet, d.head)
                proof = better_proof(proof, ForkProof(owner, name, kind, a, b, meet, bridge_a, bridge_b))
                spliced = _spliced(local, d, chains)
                if spliced is not None:
                    runs.append(spliced)
        elif (
            state.head is not None
            and local is not None
            and state.floor
            and d.from_offset < local.start <= incoming.end
        ):
            # Records from below our floor (a peer that holds more than we keep): they may only decide
            # what we hold from the floor on, and only if they pass through our chain value there.
            meet = min(local.end, incoming.end)
            if local.chain_at(meet) != incoming.chain_at(meet):
                a, bridge_a = local.witness(meet, state.head)
                b, bridge_b = incoming.witness(meet, d.head)
                proof = better_proof(proof, ForkProof(owner, name, kind, a, b, meet, bridge_a, bridge_b))
        elif local is not None and d.from_offset < local.start <= incoming.end and head.start < local.start:
            spliced = _spliced_below(local, d, chains)
            if spliced is not None:
                runs.append(spliced)

    # 3. Keep the longest run through the newest head's start, with the chain value that head signs
    #    there, or through our own floor above it: a join never brings back what this replica dropped. A
    #    run past that start with another value there is another history: a proof of the fork, never a
    #    reason to keep fewer records than either side held. Two histories of one length: the higher chain
    #    value at their end, which the records alone decide. Not the higher tip: which head vouches for
    #    the same records differs between replicas (the owner's truncation head, a replica's older one),
    #    so replicas holding one value would keep different histories (the tip only breaks exact ties).
    start = head.start
    floor = state.floor if state.floor > start else 0
    through: list[_Run] = []
    if floor:
        start = floor
        through = [r for r in runs if r.start <= floor < r.end and r.chain_at(floor) == state.floor_hash]
    else:
        for run in runs:
            if run.start <= start < run.end:
                if run.chain_at(start) == head.base_hash:
                    through.append(run)
                else:
                    b, bridge_b = run.witness(start, head)
                    proof = better_proof(proof, ForkProof(owner, name, kind, head, b, start, None, bridge_b))
    entries: Entries = _empty_entries()
    tip: SignedHead | None = None
    checkpoints: tuple[SignedHead, ...] = ()
    if through:
        longest = max(r.end for r in through)
        tied = [r for r in through if r.end == longest]
        # The chain value is only looked at when two runs tie on length (it may cost hashing a run).
        best = (
            tied[0]
            if len(tied) == 1
            else max(tied, key=lambda r: (r.chain_at(r.end) or b"", r.tip.sort_key if r.tip else (-1, b"")))
        )
        entries, tip = best.entries.drop(start - best.start), best.tip
        checkpoints = _checkpoints(best, start, start + len(entries))
    return QueueState(
        owner,
        name,
        kind,
        head,
        tip,
        entries,
        meta,
        checkpoints,
        state.forked or proof is not None,
        proof,
        floor,
        state.floor_hash if floor else b"",
    )


def _spliced(local: _Run, d: QueueDelta, chains: list[bytes]) -> _Run | None:
    """Our records up to where the delta starts, then the delta's: the other history's run, when the delta
    passes through our chain value there and reaches at least our end (else ours is longer). A peer
    relays such a run in chunks (no single head need vouch for it from its start), so a join that only
    compared whole runs kept ours where the peer that assembled that run kept it, for good.

    Only a run this replica can serve again: a head of the delta must vouch from one of our heads at or
    below the junction (or our start) on, since our heads past it vouch for the other history."""
    tip = d.tip
    if tip is None or d.end_offset < local.end or local.chain_at(d.from_offset) != d.from_hash:
        return None
    kept = tuple(c for c in local.checkpoints if c.end <= d.from_offset)
    anchor = max((c.end for c in kept), default=local.start)
    if min(h.start for h in (tip, *d.checkpoints)) > anchor:
        return None
    entries = local.entries.take(d.from_offset - local.start).extend(d.records, chains)
    return _Run(local.start, local.base, entries, tip, kept + d.checkpoints)


def _spliced_below(local: _Run, d: QueueDelta, chains: list[bytes]) -> _Run | None:
    """The delta's records up to where ours start, then ours: the mirror of :func:`_spliced` (a join may
    not hang on which side's records came as the delta), when the delta passes through our chain value
    at our start and we reach at least its end. Only needed when the newest head starts below ours (else
    our own run is this one from there), so only a forked queue gets here; our run is read whole."""
    junction, tip = local.start, local.tip
    cut = junction - d.from_offset
    if tip is None or local.end < d.end_offset or chains[cut - 1] != local.base:
        return None
    if local.end == d.end_offset and local.chain_at(local.end) == chains[-1]:
        return None  # the delta's own run holds the same records
    kept = tuple(c for c in (*d.checkpoints, d.tip) if c is not None and c.end <= junction)
    anchor = max((c.end for c in kept), default=d.from_offset)
    if min(h.start for h in (tip, *local.checkpoints)) > anchor:
        return None  # a peer could not be served our part: no head of ours vouches from the delta's on
    ours = local.entries.records()
    entries = EntryView([*d.records[:cut], *ours], [*chains[:cut], *chain_extend(local.base, junction, ours)])
    return _Run(d.from_offset, d.from_hash, entries, tip, kept + local.checkpoints)


def _withheld_meta(ours: SignedHead, d: QueueDelta) -> bool:
    """A newer head whose metadata the delta left out though ours is not it: the other history's metadata
    of the same version, left out by a sender that took ours for its own (a summary names the version,
    not the hash). A head whose metadata we lack is not ours to keep: the join keeps our head, the two
    heads prove the fork, and the sender then offers its head with its metadata (replication.py: an
    unsettled fork, or its whole run once a delta changed nothing)."""
    assert d.head is not None
    return d.meta is None and d.head.meta_version == ours.meta_version and d.head.meta_hash != ours.meta_hash


def _checkpoints(run: _Run, start: int, held_end: int) -> tuple[SignedHead, ...]:
    """Checkpoints inside the held range. Each run's checkpoints agree with its records by construction
    (ours were checked when they arrived, the delta's against its recomputed chain), so only the range
    needs filtering: no chain lookups, which matters when entries live on disk."""
    seen: dict[bytes, SignedHead] = {}
    for checkpoint in (*run.checkpoints, *((run.tip,) if run.tip else ())):
        if start < checkpoint.end <= held_end:
            seen[checkpoint.signature] = checkpoint
    return tuple(sorted(seen.values(), key=lambda c: (c.end, c.sort_key)))


def _replace_fork(state: QueueState, forked: bool, proof: ForkProof | None) -> QueueState:
    if forked == state.forked and proof is state.fork:
        return state
    return QueueState(
        state.owner,
        state.name,
        state.kind,
        state.head,
        state.tip,
        state.entries,
        state.meta,
        state.checkpoints,
        forked,
        proof,
        state.floor,
        state.floor_hash,
    )
