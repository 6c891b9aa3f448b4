"""An immutable sequence that later, longer sequences extend in place: appending to a value's leaves or
bodies costs what is appended, not the whole queue.

A replica's :class:`~latticed.crdt.epochs.Chains` holds one leaf per head of the queue and its
:class:`~latticed.crdt.queue2.chain_state.QueueState2` one body per head it vouches with; a live push
makes a new value of each with one more, as does the owner's commit. Copied as tuples, each cost
O(queue). A :class:`Grown` is a length ``n`` over a list that only ever grows: the first ``n`` items
never change, so every view stays immutable, and a view that ends where the list ends (nobody extended
it yet, the usual case: each value is extended once, by the next push or commit) is extended by
appending to that same list. A view extended a second time (a value two different joins grew) copies
its items first, as a tuple did every time.

It compares, hashes, slices and concatenates as the tuple of its items does (slices and sums are
tuples), so code written for tuples reads it unchanged.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, TypeVar, overload

__all__ = ["Grown", "bisect_left", "bisect_right", "extends", "grown"]

T = TypeVar("T")


class Grown(Sequence[T]):
    """The first ``n`` items of an append-only list (see the module docstring); build with :func:`grown`."""

    __slots__ = ("_free", "_items", "_n")

    def __init__(self, items: list[T], n: int) -> None:
        self._items = items
        self._n = n
        #: Holds one item until a :func:`grown` claims the right to append to ``_items`` after this view:
        #: the claim is one ``list.pop``, atomic, so of the event loop and the storage thread extending
        #: one value at once (each may join the same push) one appends and the other copies.
        self._free = [True]

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: SupportsIndex) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> T | tuple[T, ...]:
        n = self._n
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return tuple(self._items[start:stop])
            items = self._items
            return tuple(items[i] for i in range(start, stop, step))  # (a negative stop means none here)
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("Grown index out of range")
        return self._items[i]

    def __iter__(self) -> Iterator[T]:
        return itertools.islice(self._items, self._n)

    def __reversed__(self) -> Iterator[T]:
        newest = reversed(self._items)  # from the list's end when made (it may grow after, never shrink)
        return itertools.islice(newest, operator.length_hint(newest) - self._n, None)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Grown):
            if other._items is self._items:
                return other._n == self._n
            return other._n == self._n and self._items[: self._n] == other._items[: other._n]
        if isinstance(other, tuple):
            return len(other) == self._n and tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Iterable[T]) -> tuple[T, ...]:
        if not isinstance(other, tuple | Grown):
            return NotImplemented
        return (*self, *other)

    def __radd__(self, other: Iterable[T]) -> tuple[T, ...]:
        if not isinstance(other, tuple):
            return NotImplemented
        return (*other, *self)

    def __repr__(self) -> str:
        return f"Grown({tuple(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        items = self._items[: self._n]
        return (Grown, (items, len(items)))


def grown(base: Sequence[T], *more: Iterable[T]) -> Grown[T]:
    """``base`` followed by each of ``more``: in ``base``'s own list when ``base`` is a :class:`Grown`
    that ends where its list does (nothing it holds changes: its length stays), else in a new one."""
    if type(base) is Grown and base._free:
        try:
            base._free.pop()
        except IndexError:
            pass  # claimed by another thread just now
        else:
            items = base._items
            if base._n == len(items):
                for part in more:
                    items.extend(part)
                return Grown(items, len(items))
    items = list(base)
    for part in more:
        items.extend(part)
    return Grown(items, len(items))


def extends(old: Sequence[T], new: Sequence[T]) -> bool:
    """Whether ``new`` is ``old`` with items appended, known without reading them: both views of one
    list, ``old`` the shorter (False says nothing: compare them). A writer diffing a value against the
    one it stored asks this first, so an append costs what it appends."""
    return type(new) is Grown and type(old) is Grown and old._items is new._items and old._n <= new._n


def bisect_left(seq: Sequence[T], x: Any, *, key: Callable[[T], Any]) -> int:
    """:func:`bisect.bisect_left` of ``seq`` by ``key``, over a :class:`Grown`'s list itself (its items
    read in C, not through :meth:`Grown.__getitem__`)."""
    if type(seq) is Grown:
        return bisect.bisect_left(seq._items, x, 0, seq._n, key=key)
    return bisect.bisect_left(seq, x, key=key)


def bisect_right(seq: Sequence[T], x: Any, *, key: Callable[[T], Any]) -> int:
    """:func:`bisect.bisect_right` as :func:`bisect_left` is :func:`bisect.bisect_left`."""
    if type(seq) is Grown:
        return bisect.bisect_right(seq._items, x, 0, seq._n, key=key)
    return bisect.bisect_right(seq, x, key=key)
