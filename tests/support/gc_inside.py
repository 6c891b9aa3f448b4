"""A garbage collection due inside a compiled pass over a list, whose finalizer empties that list.

The compiled passes in latticed/crdt/_columns.c allocate tracked objects while they walk a list; such an
allocation may collect garbage and so run Python (a finalizer) that changes the list under them. Tests of
``compact_rows``, ``offered``, ``packed_bodies``, ``unvouched``, ``fold`` and ``versions`` share this one
way to provoke that. The finalizer also refills the memory it freed with other bytes, so a pass that kept
a freed item's address reads those (a wrong answer or a crash) instead of failing only under
.ci/sanitize.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: One try per position of the collection among the pass's first allocations of tracked objects.
DUES = range(1, 9)


@dataclass(frozen=True)
class Inside:
    """One call in which the finalizer ran inside the pass."""

    #: ``len(victim)`` each time the finalizer ran inside the call, before it emptied it.
    sizes: list[int]
    #: What the pass answered.
    answer: Any
    #: The list the finalizer emptied, as the pass left it.
    victim: list[Any]


def collected_inside(
    read: Callable[..., Any],
    make: Callable[[], tuple[tuple[Any, ...], list[Any]]],
    dues: Sequence[int] = DUES,
) -> list[Inside]:
    """``read(*args)`` for each of ``dues``, ``make()`` giving fresh ``(args, victim)`` each time, with a
    garbage collection due at that tracked allocation whose finalizer empties ``victim`` (then allocates
    bytes into the memory it freed). Returns the calls in which the finalizer ran inside the pass."""
    here, found = sys._getframe().f_code, []
    keep: list[list[bytes]] = []
    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    try:
        for due in dues:
            args, victim = make()
            sizes: list[int] = []

            class Finalized:
                def __del__(self) -> None:
                    caller = sys._getframe(1)
                    if caller.f_code is here and caller.f_lineno == line:
                        sizes.append(len(victim))
                    victim.clear()
                    keep.append([os.urandom(32) for _ in range(512)])

            bomb = Finalized()
            bomb.cycle = bomb  # type: ignore[attr-defined]
            del bomb
            gc.set_threshold(gc.get_count()[0] + due)
            gc.enable()
            line = sys._getframe().f_lineno + 1
            answer = read(*args)  # an exact tuple: passed on as it is, nothing allocated before the pass
            gc.disable()
            gc.set_threshold(*threshold)
            gc.collect()  # the bomb, if it was not collected inside
            if sizes:
                found.append(Inside(sizes, answer, victim))
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
    return found
