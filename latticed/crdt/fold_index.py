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

from typing import Final

from latticed.crdt import fold_compiled
from latticed.crdt.head2 import Leaf, fold, fold_one

__all__ = ["MAX_LEAVES", "STRIDE", "prefix_fold"]

#: Leaves between two remembered folds.
STRIDE: Final = 32
#: Leaves remembered over all origins; past it the oldest entries go.
MAX_LEAVES: Final = 1 << 22

#: origin -> (the leaves covered, the fold after each STRIDE of them; [0] is the origin). Entries are
#: immutable and replaced whole (one dict operation each), so threads sharing it need no lock.
_folds: dict[bytes, tuple[tuple[Leaf, ...], tuple[bytes, ...]]] = {}


def prefix_fold(origin: bytes, leaves: tuple[Leaf, ...], n: int) -> bytes:
    """``fold(origin, leaves[:n])``."""
    n = max(0, min(n, len(leaves)))
    if n < STRIDE:
        return fold(origin, leaves[:n])
    known, folds = _folds.get(origin, ((), (origin,)))
    cover = min(len(known), n - n % STRIDE)
    if known[:cover] != leaves[:cover]:
        known, folds, cover = (), (origin,), 0
    log = folds[cover // STRIDE]
    more: list[bytes] = []
    found = fold_compiled.fold(log, leaves[cover : n - n % STRIDE], STRIDE) if n - cover > STRIDE else None
    if found is not None:  # cover is a multiple of STRIDE: the C pass's strides are ours
        log, more = found
    else:
        for i in range(cover, n - n % STRIDE):
            digest, end = leaves[i]
            log = fold_one(log, digest, end)
            if (i + 1) % STRIDE == 0:
                more.append(log)
    if more:
        _remember(origin, leaves[: n - n % STRIDE], folds + tuple(more))
    return fold(log, leaves[n - n % STRIDE : n])


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
