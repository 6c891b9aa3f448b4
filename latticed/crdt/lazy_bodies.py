"""Head bodies of a catch-up of single offers kept as the decode's compact run, built one at a time when
read.

A replica catching up on single offers rebuilds one 232-byte body per record from ~3 bytes of steps
(``core2_steps.unpack_steps``). It needs each one's leaf and log to verify the chunk (it keeps those
anyway: the log's shared leaves, the fold index), but of the body itself it reads only a few: the first
and last (verification, the next chunk's steps, the store's run), the odd one a peer's chunk ends at.
Built and kept, the bodies were ~210 bytes a version of fresh memory (a ``HeadV2`` and its version and
timestamp ints), most of what the clock saw of core 2's catch-up beside core 1's (bench/RESULTS.md,
catchup20). So the compiled decode hands back the timestamps only (:func:`leaf_compiled.decode_compact`)
and a :class:`StepRun` holds them with the leaves, the logs and the chain values they were hashed from:
its item ``i`` is the very ``HeadV2`` the full decode gives (the same fields, its leaf the same object),
built on first read and kept, so two reads are one object (the store finds a run by identity).

A :class:`Runs` is a queue's bodies made of such runs and plain bodies, as ``QueueState2.bodies``: it
reads as the tuple of its bodies, slices without building them, and grows as a ``Grown`` does. Pure.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

from latticed.crdt.head2 import HeadV2, Leaf
from latticed.crdt.shared_prefix import Grown, grown
from latticed.crdt.shared_prefix import extends as list_extends

__all__ = ["LazyDecoded", "Runs", "StepRun", "appended", "extends", "is_lazy"]


class _Bodies(Sequence[HeadV2]):
    """Reads as the tuple of its bodies: equal to it, hashed as it, slices (step > 1) are tuples."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple | Grown | _Bodies):
            return len(other) == len(self) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Iterable[HeadV2]) -> tuple[HeadV2, ...]:
        return (*self, *other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({tuple(self)!r})"


class StepRun(_Bodies):
    """The bodies of consecutive versions after ``prev`` that plain steps (no start, metadata or leaf
    step) rebuilt: version ``prev.version + 1 + i`` has leaf ``leaves[i]``, log ``logs[i]``, timestamp
    ``stamps[i]`` and head hash the chain value at its end in ``window`` (``(first, base, chain)``); the
    rest is ``prev``'s."""

    __slots__ = ("_logs", "_made", "_stamps", "_window", "leaves", "prev")

    def __init__(
        self,
        prev: HeadV2,
        leaves: tuple[Leaf, ...],
        logs: Sequence[bytes],
        stamps: bytes,
        window: tuple[int, bytes, Sequence[bytes]],
    ) -> None:
        if len(stamps) != 8 * len(leaves) or len(logs) < len(leaves):
            raise ValueError("a run's timestamps, leaves and logs of different lengths")
        self.prev = prev
        self.leaves = leaves
        self._logs = logs
        self._stamps = memoryview(stamps).cast("Q")
        self._window = window
        self._made: dict[int, HeadV2] = {}

    def __len__(self) -> int:
        return len(self.leaves)

    @overload
    def __getitem__(self, index: SupportsIndex) -> HeadV2: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[HeadV2, ...]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> HeadV2 | tuple[HeadV2, ...]:
        n = len(self.leaves)
        if isinstance(index, slice):
            return tuple(map(self._body, range(*index.indices(n))))
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("StepRun index out of range")
        return self._body(i)

    def __iter__(self) -> Iterator[HeadV2]:
        return map(self._body, range(len(self.leaves)))

    def __reversed__(self) -> Iterator[HeadV2]:
        return map(self._body, reversed(range(len(self.leaves))))

    def _body(self, i: int) -> HeadV2:
        made = self._made.get(i)
        if made is not None:
            return made
        p, leaf = self.prev, self.leaves[i]
        end = leaf[1]
        first, base, chain = self._window
        top = base if end == first else chain[end - first - 1]
        head = HeadV2(
            p.queue_id,
            p.epoch,
            p.version + 1 + i,
            self._logs[i],
            p.start,
            end,
            p.base_hash,
            top,
            p.meta_version,
            p.meta_hash,
            self._stamps[i],
        )
        object.__setattr__(head, "_leaf", leaf)
        return self._made.setdefault(i, head)  # two threads reading one: one object kept


class LazyDecoded(_Bodies):
    """``leaf_bodies.Decoded`` with its run kept as a :class:`StepRun`: ``head`` (the body the steps
    follow when the delta carried it alone, else nothing) then ``run``'s bodies, and the same claims
    (``leaves``: each one's leaf, ``first``, ``base``, ``records``) that ``queue2.verify_delta`` checks."""

    __slots__ = ("base", "first", "head", "leaves", "records", "run")

    def __init__(
        self,
        head: tuple[HeadV2, ...],
        run: StepRun,
        leaves: tuple[Leaf, ...],
        *,
        first: int,
        base: bytes,
        records: object,
    ) -> None:
        self.head, self.run = head, run
        self.leaves, self.first, self.base, self.records = leaves, first, base, records

    def __len__(self) -> int:
        return len(self.head) + len(self.run)

    @overload
    def __getitem__(self, index: SupportsIndex) -> HeadV2: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[HeadV2, ...]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> HeadV2 | tuple[HeadV2, ...]:
        if isinstance(index, slice):  # (only those read are built: a tip's body past the log's leaves)
            return tuple(map(self._item, range(*index.indices(len(self)))))
        return self._item(index.__index__())

    def _item(self, i: int) -> HeadV2:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("LazyDecoded index out of range")
        k = len(self.head)
        return self.head[i] if i < k else self.run[i - k]

    def __iter__(self) -> Iterator[HeadV2]:
        return itertools.chain(self.head, self.run)

    def __reversed__(self) -> Iterator[HeadV2]:
        return itertools.chain(reversed(self.run), reversed(self.head))

    def parts(self) -> tuple[Sequence[HeadV2], ...]:
        return (self.head, self.run) if self.head else (self.run,)


class Runs(_Bodies):
    """Bodies sorted by ``(end, version)`` as consecutive parts, each plain (a tuple or ``Grown``) or a
    :class:`StepRun`, none empty. A slice (step 1) is a ``Runs`` of the parts it covers, a part covered
    whole kept as that very object (the store finds a run of steps by it).

    The parts are the first ``n`` of an append-only list, as a :class:`~latticed.crdt.shared_prefix.Grown`
    holds its items: a relay's live pushes each append a one-body run, so a value built by copying the
    parts cost O(pushes since the start) a push (~350 µs at 1,000, the relay's largest non-essential
    stage: bench/RESULTS.md, relay22); :func:`appended` extends the very list instead, and the offsets
    and an index of the parts by identity grow with it, so the store finds a run in O(1)."""

    __slots__ = ("_free", "_ids", "_n", "_parts", "_starts")

    def __init__(self, parts: Iterable[Sequence[HeadV2]]) -> None:
        self._parts: list[Sequence[HeadV2]] = [p for p in parts if len(p)]
        self._n = len(self._parts)
        self._starts = list(itertools.accumulate(map(len, self._parts), initial=0))
        self._ids = {id(p): k for k, p in enumerate(self._parts)}
        #: Holds one item until an :func:`appended` claims the right to extend the lists after this view
        #: (one atomic ``list.pop``, as ``Grown``: of two threads extending one value, one copies).
        self._free = [True]

    @property
    def parts(self) -> tuple[Sequence[HeadV2], ...]:
        """The parts, oldest first."""
        return tuple(self._parts[: self._n])

    def __len__(self) -> int:
        return self._starts[self._n]

    @overload
    def __getitem__(self, index: SupportsIndex) -> HeadV2: ...

    @overload
    def __getitem__(self, index: slice) -> Runs | tuple[HeadV2, ...]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> HeadV2 | Runs | tuple[HeadV2, ...]:
        n = len(self)
        if isinstance(index, slice):
            lo, hi, step = index.indices(n)
            if step != 1:
                return tuple(self)[index]
            return Runs(self._cut(lo, hi))
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("Runs index out of range")
        k = bisect.bisect_right(self._starts, i, 0, self._n + 1) - 1
        return self._parts[k][i - self._starts[k]]

    def _cut(self, lo: int, hi: int) -> Iterator[Sequence[HeadV2]]:
        """The parts covering ``[lo, hi)``, cut at the ends: found by bisection, so a slice of the newest
        bodies (what a commit writes) reads only the parts it covers."""
        if lo >= hi:
            return
        starts, parts = self._starts, self._parts
        for k in range(bisect.bisect_right(starts, lo, 0, self._n + 1) - 1, self._n):
            at = starts[k]
            if at >= hi:
                return
            part = parts[k]
            a, b = max(lo, at) - at, min(hi, at + len(part)) - at
            if a < b:
                yield part if (a, b) == (0, len(part)) else part[a:b]

    def __iter__(self) -> Iterator[HeadV2]:
        return itertools.chain.from_iterable(itertools.islice(self._parts, self._n))

    def __reversed__(self) -> Iterator[HeadV2]:
        newest = reversed(self._parts)  # from the list's end when made (it may grow after, never shrink)
        mine = itertools.islice(newest, operator.length_hint(newest) - self._n, None)
        return itertools.chain.from_iterable(map(reversed, mine))

    def start_of(self, part: Sequence[HeadV2]) -> int:
        """The index of the first body of ``part`` if it is one of :attr:`parts` (that very object),
        else -1."""
        k = self._ids.get(id(part))
        if k is None or k >= self._n or self._parts[k] is not part:
            return -1
        return self._starts[k]

    def _extended(self, more: list[Sequence[HeadV2]]) -> Runs | None:
        """This view with ``more`` (non-empty parts) after it, in its own lists when it ends where they
        do and nobody extended it before (None: copy)."""
        try:
            self._free.pop()
        except IndexError:
            return None
        parts, starts, ids = self._parts, self._starts, self._ids
        if self._n != len(parts):
            return None
        for part in more:
            ids[id(part)] = len(parts)
            parts.append(part)
            starts.append(starts[-1] + len(part))
        view = Runs.__new__(Runs)
        view._parts, view._starts, view._ids, view._n = parts, starts, ids, len(parts)
        view._free = [True]
        return view

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (tuple(self),))


def is_lazy(bodies: Sequence[HeadV2]) -> bool:
    """Whether ``bodies`` are (or hold) a run not built as objects."""
    return type(bodies) in (StepRun, LazyDecoded, Runs)


def appended(base: Sequence[HeadV2], more: Sequence[HeadV2]) -> Sequence[HeadV2]:
    """``base`` followed by ``more`` (both sorted, ``more`` after): :func:`shared_prefix.grown` unless
    either holds a run not built, whose parts are then kept as they are (plain bodies after plain ones
    are grown into them). A ``Runs`` base is extended in its own lists where it can be (the usual live
    push: a run after a run), so an append costs the parts it adds."""
    if not is_lazy(base) and not is_lazy(more):
        return grown(base, more)
    new: Iterable[Sequence[HeadV2]]
    if type(more) is Runs:
        new = more.parts
    elif type(more) is LazyDecoded:
        new = more.parts()
    else:
        new = (more,)
    add: list[Sequence[HeadV2]] = []
    for part in new:
        if not len(part):
            continue
        if type(part) is not StepRun and add and type(add[-1]) is not StepRun:
            add[-1] = grown(add[-1], part)
        else:
            add.append(part)
    if type(base) is Runs:
        last = base._parts[base._n - 1] if base._n else None
        if not add:
            return base
        if last is None or type(last) is StepRun or type(add[0]) is StepRun:  # nothing of base's regrown
            view = base._extended(add)
            if view is not None:
                return view
        parts = list(base.parts)
    else:
        parts = [base]
    for part in add:
        if type(part) is not StepRun and parts and len(parts[-1]) and type(parts[-1]) is not StepRun:
            parts[-1] = grown(parts[-1], part)
        else:
            parts.append(part)
    return Runs(parts)


def extends(old: Sequence[HeadV2], new: Sequence[HeadV2]) -> bool:
    """Whether ``new`` is ``old`` with bodies appended, known without reading them (False says
    nothing), as :func:`shared_prefix.extends` for values holding runs (:func:`appended`'s)."""
    if type(new) is not Runs:
        return list_extends(old, new)
    if not len(old):
        return True
    if type(old) is Runs and old._parts is new._parts:  # views of one list of parts: a prefix
        return old._n <= new._n
    ours = old.parts if type(old) is Runs else (old,)
    theirs = new.parts
    k = len(ours)
    if len(theirs) < k or any(a is not b for a, b in zip(ours[:-1], theirs, strict=False)):
        return False
    last, grew = ours[-1], theirs[k - 1]
    return last is grew or list_extends(last, grew)
