"""The steps a run of head bodies was rebuilt from, handed from the replica's decode to the store.

A catch-up of single offers brings one head body per record as ~3 bytes of steps
(:mod:`latticed.crdt.leaf_codec`), rebuilt into 232-byte bodies (``core2_steps.unpack_steps``). The
store keeps bodies as those same steps (:mod:`latticed.storage.core2_bodies`), rebuilt on load, instead
of packing and writing every body again: this hands it the steps of bodies it is about to store.

An entry is the body the steps start after, the steps, the chain offset they start from and the bodies
they gave (kept alive, so an identity is never another run's). The store finds a run by the identity of
its bodies and takes the entry (:func:`take`): steps are a pure function of the body before them and the
chain values they read, so a found run is exactly what a rebuild from the same records gives. A few
entries are kept (the newest), so chunks joined ahead of their commit still find theirs.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from latticed.crdt.head2 import HeadV2
from latticed.crdt.lazy_bodies import Runs, StepRun

__all__ = ["Stepped", "remember", "take"]

#: Entries kept at most (chunks verified ahead of their durable commit).
KEEP: Final = 8


@dataclass(frozen=True, slots=True)
class Stepped:
    """``bodies``: what ``steps`` rebuild after ``prev``, reading chain values at ``first`` and after."""

    prev: HeadV2
    steps: bytes
    first: int
    bodies: Sequence[HeadV2]  #: a tuple, or the decode's :class:`~latticed.crdt.lazy_bodies.StepRun`


#: The entries, read and replaced whole (threads may share them: a lost entry only means bodies stored
#: whole, never a wrong one).
_slot: list[tuple[Stepped, ...]] = [()]


def remember(prev: HeadV2, steps: bytes, first: int, bodies: Sequence[HeadV2]) -> None:
    """Keep that ``steps`` after ``prev`` rebuild ``bodies`` (every one a body, none a leaf)."""
    if bodies and type(steps) is bytes:
        kept = bodies if type(bodies) is StepRun else tuple(bodies)  # a run is not built to be kept
        _slot[0] = (*_slot[0], Stepped(prev, steps, first, kept))[-KEEP:]


def take(bodies: Sequence[HeadV2]) -> list[tuple[int, Stepped]]:
    """The remembered runs found in ``bodies`` (by identity, each whole and in order), with the index
    of each one's first body, in index order; they are forgotten."""
    entries = _slot[0]
    if not entries or not bodies:
        return []
    if type(bodies) is Runs:  # a value's bodies holding runs not built: found as those very runs
        return _taken([(bodies.start_of(e.bodies), e) for e in entries if bodies.start_of(e.bodies) >= 0])
    ids = list(map(id, bodies))
    found: list[tuple[int, Stepped]] = []
    for entry in entries:
        run = entry.bodies
        try:
            at = ids.index(id(run[0]))
        except ValueError:
            continue
        if len(run) <= len(bodies) - at and all(map(operator.is_, bodies[at : at + len(run)], run)):
            found.append((at, entry))
    return _taken(found)


def _taken(found: list[tuple[int, Stepped]]) -> list[tuple[int, Stepped]]:
    """``found`` in index order, forgotten."""
    if found:
        taken = {id(entry) for _, entry in found}
        _slot[0] = tuple(e for e in _slot[0] if id(e) not in taken)
    found.sort(key=lambda item: item[0])
    return found
