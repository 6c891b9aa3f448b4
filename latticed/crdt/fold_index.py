"""The fold of a log's first leaves without refolding them each time: a delta to a peer that knows ``n``
of our leaves needs ``fold(origin, leaves[:n])``, and folding from the origin on every delta makes a
delta's cost grow with the queue's versions.

Folds are remembered per origin (one per queue and epoch) every :data:`STRIDE` leaves, with the leaves
they cover: a call checks that the leaves it is given start with the remembered ones (a tuple
comparison in C, most items the same objects) and folds at most ``STRIDE - 1`` leaves past the nearest
remembered fold. Other leaves under the same origin (a forked history, another replica's) replace the
entry. The result is always exactly :func:`~latticed.crdt.head2.fold`'s; the memory is bounded by
:data:`MAX_LEAVES` leaves in all (a pointer each, and a fold per stride).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from latticed.crdt import fold_compiled
from latticed.crdt.head2 import Leaf, fold, fold_one

__all__ = ["MAX_LEAVES", "STRIDE", "folded_run", "prefix_fold"]

#: Leaves between two remembered folds.
STRIDE: Final = 32
#: Leaves remembered over all origins; past it the oldest entries go.
MAX_LEAVES: Final = 1 << 22

#: origin -> (the leaves covered, the fold after each STRIDE of them; [0] is the origin). Entries are
#: immutable and replaced whole (one dict operation each), so threads sharing it need no lock.
_folds: dict[bytes, tuple[tuple[Leaf, ...], tuple[bytes, ...]]] = {}
#: A run of leaves folded elsewhere: (the log it starts from, its leaves, the log after each).
_run: list[tuple[bytes, tuple[Leaf, ...], tuple[bytes, ...]] | None] = [None]


def prefix_fold(origin: bytes, leaves: Sequence[Leaf], n: int) -> bytes:
    """``fold(origin, leaves[:n])``."""
    n = max(0, min(n, len(leaves)))
    if n < STRIDE:
        return fold(origin, leaves[:n])
    known, folds = _folds.get(origin, ((), (origin,)))
    cover = min(len(known), n - n % STRIDE)
    if known[:cover] != leaves[:cover]:
        known, folds, cover = (), (origin,), 0
    log = folds[cover // STRIDE]
    more = _folded(log, leaves, cover, n - n % STRIDE)
    at = cover + len(more) * STRIDE
    log = more[-1] if more else log
    found = fold_compiled.fold(log, leaves[at : n - n % STRIDE], STRIDE) if n - at > STRIDE else None
    if found is not None:  # at is a multiple of STRIDE: the C pass's strides are ours
        log, extra = found
        more += extra
    else:
        for i in range(at, n - n % STRIDE):
            digest, end = leaves[i]
            log = fold_one(log, digest, end)
            if (i + 1) % STRIDE == 0:
                more.append(log)
    if more:
        _remember(origin, tuple(leaves[: n - n % STRIDE]), folds + tuple(more))
    return fold(log, leaves[n - n % STRIDE : n])


def folded_run(log: bytes, leaves: Sequence[Leaf], logs: Sequence[bytes]) -> None:
    """Keep that folding ``leaves`` from ``log`` gives ``logs[i]`` after ``leaves[i]``: a replica's decode
    of a catch-up's steps computed them building each body's ``log`` (the fold of the leaves before it),
    and verifying the chunk folds the same leaves again. One run is kept (the newest)."""
    if len(leaves) == len(logs) >= STRIDE:
        _run[0] = (log, tuple(leaves), tuple(logs))


def _folded(log: bytes, leaves: Sequence[Leaf], at: int, stop: int) -> list[bytes]:
    """The folds after each whole stride of ``leaves[at:stop]`` from ``log`` that the kept run already
    holds (it starts at ``log``, or within the first stride, and goes on with those very leaves), else
    none. A catch-up's run starts at the body its steps follow (version 2 on a fresh queue: one leaf in),
    so a run that starts a few leaves in is met by folding those few here and comparing with its start."""
    run = _run[0]
    if run is None:
        return []
    start, known, logs = run
    skip = 0
    if start != log:
        if not known:
            return []
        skip = next((k for k in range(1, STRIDE) if at + k < stop and leaves[at + k] == known[0]), 0)
        if not skip or fold(log, leaves[at : at + skip]) != start:
            return []
    usable = skip + min(len(known), stop - at - skip)  # leaves[at + skip + i] is the run's i-th
    usable -= usable % STRIDE
    if usable < STRIDE or leaves[at + skip : at + usable] != known[: usable - skip]:
        return []
    return list(logs[STRIDE - 1 - skip : usable - skip : STRIDE])


def _remember(origin: bytes, known: tuple[Leaf, ...], folds: tuple[bytes, ...]) -> None:
    """Keep ``origin``'s folds as the newest entry; drop the oldest others past :data:`MAX_LEAVES`."""
    _folds.pop(origin, None)
    _folds[origin] = (known, folds)
    entries = list(_folds.items())  # a snapshot: another thread may change the dict meanwhile
    held = sum(len(leaves) for _, (leaves, _) in entries)
    for key, (leaves, _) in entries:
        if held <= MAX_LEAVES or key == origin:
            break
        if _folds.pop(key, None) is not None:
            held -= len(leaves)
