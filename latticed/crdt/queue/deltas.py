"""Deltas and their verification: :func:`delta` cuts what a peer summarised by a :class:`Summary` lacks
as one piece that verifies on its own (ending at a signed head, bounded by records or bytes);
:func:`verify_delta` checks a piece's signatures and hash chain against nothing but the queue's owner
key, and returns the :class:`VerifiedDelta` the join takes, so a forged piece never reaches the join.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from latticed.crdt.core_errors import BadSignatureError, MalformedError, TamperedError, WrongOwnerError
from latticed.crdt.forks import ForkProof
from latticed.crdt.head import SignedHead, genesis_hash, meta_hash
from latticed.crdt.queue.state import QueueDelta, QueueState, Summary
from latticed.crdt.records import (
    MAX_OFFSET,
    Record,
    RecordRun,
    chain_extend,
    check_records,
)
from latticed.crdt.signing import HASH_SIZE

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
    if head is None or state.forked:
        # A forked queue stops where this replica stands: only its proof travels, so every replica that
        # meets the fork flags it, and nothing past any replica's visible end is served.
        return QueueDelta(state.owner, state.name, state.kind, None, fork=state.fork)
    from_offset = state.start
    end = state.held_end
    if (
        since is not None
        and state.start <= since.held_end <= state.held_end
        and state.chain_at(since.held_end) == since.held_hash
    ):
        from_offset = since.held_end
    elif since is not None and since.held_end > state.held_end and not since.forked:
        # The asker holds more records (we are a relay whose commit is behind what it passed on, or one
        # taking a backlog in chunks under the owner's newest head): none of our records is news to it
        # along one history, and the head is. Not the whole queue again: should its records be another
        # history, its own delta to us finds the fork (its summary is ahead of ours).
        from_offset = end
    elif since is not None and max_records is not None and state.start < since.held_end and state.tip:
        # The asker's records are another history (the owner forked): the chunk of ours that reaches
        # where its records end, from at most ``max_records`` below, so its join compares our chain value
        # there with its own and finds the fork (a chunk from our start might end before they part).
        return _probe(state, since, max_records, max_bytes, read)
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


def _probe(
    state: QueueState, since: Summary, max_records: int, max_bytes: int | None, read: RecordReader | None
) -> QueueDelta:
    """The chunk of ``state`` that ends at the first signed head at or past where ``since`` ends (or at
    our end), from as far below as that head vouches and ``max_records`` allows (``max_bytes`` may end
    it at an earlier head)."""
    head, start = state.head, state.start
    assert head is not None and state.tip is not None
    target = min(since.held_end, state.held_end)
    heads = (*state.checkpoints, state.tip)
    tip = min((h for h in heads if h.end >= target), key=lambda h: (h.end, h.sort_key))
    lo = max(tip.start, start, target - max_records)
    if read is None:
        entries = state.entries

        def read(a: int, b: int) -> Sequence[Record]:
            return tuple(entries.records(a - start, b - start))

    if max_bytes is None:
        records = read(lo, tip.end)
    else:
        records, cut = _read_within_bytes(state, lo, tip.end, max_bytes, read)
        tip = tip if cut is None else cut
    return QueueDelta(
        owner=state.owner,
        name=state.name,
        kind=state.kind,
        head=head,
        meta=state.meta if since.meta_version != head.meta_version else None,
        tip=tip,
        from_offset=lo,
        from_hash=state.chain_at(lo) or b"",
        records=records,
        checkpoints=tuple(c for c in state.checkpoints if lo < c.end <= tip.end and c != tip),
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


def _verify_vouching(head: SignedHead, d: QueueDelta, owner: bytes, qid: bytes, vouches: bool) -> None:
    """``head.verify``, except that a head whose hash the link rebuilt from the delta's records fails as
    the records' fault: the same verdict a full delta gets for records that do not fold to its hash."""
    try:
        head.verify(owner, qid)
    except BadSignatureError as exc:
        if vouches and d.tip_hash_from_records:
            raise TamperedError(
                "records do not hash to the signed head, or its signature is forged (the link left "
                "the head's hash out; rebuilt from the records, it is not what the owner signed)"
            ) from exc
        raise


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
    _verify_vouching(head, d, state.owner, qid, d.tip is head)
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
        _verify_vouching(tip, d, state.owner, qid, True)
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
