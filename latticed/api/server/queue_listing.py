"""``queue list`` in time and event-loop turns that stay small however many queues the daemon holds.

A daemon that holds tens of thousands of queues, while a catch-up changes thousands of them a second,
must still answer ``queue list`` within a second, and answering it must not starve the catch-up (both run
on the event loop). So each queue's entry is built and msgpack-encoded once per committed state (the
storage thread publishes a new :class:`QueueState` object per change, so identity says whether it
changed) and kept encoded; a listing joins the encoded entries into the reply, and checks in with trio
every :data:`CHUNK` queues so other requests and the replication links run in between. Queues on fork
core 2 are listed the same way (:class:`Listed`): a catch-up creates them by the thousand too. A queue's
place in the list (owned first, then owner and name) never changes, so the last listing's order is kept
and only queues new since are sorted into it: sorting every queue anew was half of a listing's time.

Even comparing every queue's state with its entry's costs O(queues) in Python per call, and a catch-up
is listed again and again while it runs (O(queues^2) over it). So a part whose commits the listing hears
of (:meth:`QueueListing.following`, :attr:`Listed.followed`: core 2, the part a catch-up grows) is
scanned once, and afterwards only the queues that committed since the last listing are looked at. The
encoded entries are kept in the list's order too: a changed entry is replaced where it stands, a few new
queues are put in their places by bisection, more are merged in. What remains per call is joining the
reply's bytes.

The reply on the wire is what it always was: a map with ``queues``, a list of maps (:class:`Packed`
only saves re-encoding).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Final, Generic, TypeVar

import trio

from latticed.api.messages import Packed, PackedArray, pack_array
from latticed.crdt.queue import QueueState
from latticed.errors import NotFoundError, OtherCoreError

#: Queues looked at between two checkpoints (a few ms of work on this box at most).
CHUNK: Final = 2000
#: Queues new to the list sorted in one by one at most (more: two sorted runs merged, entries joined anew).
_INSERTS: Final = 64

#: A queue's place in the list: owned first, then by owner and name (then by number: no two tie).
_Place = tuple[tuple[bool, str, str], int]
#: What is kept per queue: the state it was built from, its place and its encoded entry.
_Entry = tuple[object, _Place, bytes]
_NUMBER: Final = operator.itemgetter(1)
_ENCODED: Final = operator.itemgetter(2)

S = TypeVar("S")

#: What a part's getters raise for a queue to leave out of that part (:class:`Listed`).
_LEFT_OUT: Final = (KeyError, NotFoundError, OtherCoreError)


@dataclass(frozen=True, slots=True)
class Listed(Generic[S]):
    """Queues to list whose values are of one type (each fork core's): ``state`` gives a queue's
    committed value if at hand (None: ``load`` it), ``info`` its entry as a map; any of them raises
    KeyError or NotFoundError for a queue gone meanwhile, or OtherCoreError for one moved to another
    core's part (a core-1 queue converted to core 2 while the listing waited: that part lists it), and
    the queue is left out of this part. ``queues`` may be a callable,
    called only when the part is scanned. ``followed``: every commit of the part's queues (a new
    queue, a new value, a drop) reaches :meth:`QueueListing.changed` while
    :meth:`QueueListing.following` runs."""

    queues: Sequence[int] | Callable[[], Sequence[int]]
    state: Callable[[int], S | None]
    load: Callable[[int], Awaitable[S]] | None
    info: Callable[[int, S], dict[str, Any]]
    followed: bool = False


class QueueListing:
    """The encoded ``queue list`` entries of one daemon's queues, rebuilt only for queues that changed."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        #: The last listing's queues in their order, the set of them, and their encoded entries in
        #: that order (``_encoded`` None: to be joined anew from the entries).
        self._order: list[_Place] = []
        self._placed: set[int] = set()
        self._encoded: list[bytes] | None = None
        #: Queues whose entry was built anew since the last listing (their encoded entry to replace).
        self._rebuilt: list[int] = []
        #: The scanned parts' queues at the last listing (those gone since leave the list).
        self._scanned: set[int] = set()
        #: Entries built since start (tests count them: unchanged queues are not rebuilt).
        self.built = 0
        #: Queues whose state was read since start (tests count them: a followed part's unchanged
        #: queues are not read again once it was scanned).
        self.read = 0
        #: One listing at a time: a followed part's queues and changes are taken and put back whole.
        self._lock = trio.Lock()
        #: While following: the followed part's queues as of the last listing (None: scan it next),
        #: and the queues that committed since.
        self._following = False
        self._followed: set[int] | None = None
        self._changed: set[int] = set()
        #: Each owner's name once, so the places of its queues compare it by identity, not by its bytes.
        self._owners: dict[str, str] = {}

    def changed(self, q: int, _state: object = None) -> None:
        """A commit listener: ``q`` of the followed part committed (new, changed or dropped)."""
        if self._following:
            self._changed.add(q)

    @contextmanager
    def following(self) -> Iterator[None]:
        """While the block runs, the commits of the followed part reach :meth:`changed` (the caller
        subscribes it for as long), so the part is scanned only once; afterwards, scanned again."""
        self._following, self._followed = True, None
        try:
            yield
        finally:
            self._following, self._followed = False, None
            self._changed.clear()

    async def reply(
        self,
        queues: Sequence[int],
        state: Callable[[int], QueueState],
        info: Callable[[int, QueueState], dict[str, Any]],
        more: Sequence[Listed[Any]] = (),
    ) -> PackedArray:
        """The encoded list of every queue in ``queues`` and in each of ``more``: owned first, then by
        owner and name. ``state`` gives a queue's committed state, ``info`` its entry as a map."""
        async with self._lock:
            return await self._reply(queues, state, info, more)

    async def _reply(
        self,
        queues: Sequence[int],
        state: Callable[[int], QueueState],
        info: Callable[[int, QueueState], dict[str, Any]],
        more: Sequence[Listed[Any]],
    ) -> PackedArray:
        found: list[int] = []  # the scanned parts' queues
        parts: tuple[Listed[Any], ...] = (Listed(queues, state, None, info), *more)
        looked = 0
        followed: set[int] = set()
        news: list[int] = []  # the followed part's queues that committed since, held and gone
        gone: set[int] = set()
        whole = True  # every queue was looked at (not only the followed part's changes)
        for part in parts:
            if part.followed and self._following and self._followed is not None:
                looked, followed, news, gone = await self._follow(looked, part)
                whole = False
                continue
            if part.followed and self._following:
                self._changed = set()  # what commits while it is scanned: looked at next time
            numbers = part.queues() if callable(part.queues) else part.queues
            looked = await self._add(found, looked, replace(part, queues=numbers))
            if part.followed and self._following:  # from now on, only its changes are looked at
                self._followed = set(numbers) & set(found)
        scanned = set(found)
        placed = self._placed
        if whole:  # any queue listed before may be gone
            leaving = list(placed - scanned)
            joining = list(scanned - placed)
        else:
            leaving = [q for q in self._scanned - scanned if q not in followed]
            leaving += [q for q in gone if q not in scanned]
            joining = list(scanned - placed)
            joining += [q for q in news if q not in placed]
        self._scanned = scanned
        joined = self._place(leaving, joining)
        entries = self._entries
        if len(entries) > 2 * len(placed) + CHUNK:  # queues removed since: forget their entries
            for q in [q for q in entries if q not in placed]:
                del entries[q]
            self._owners.clear()  # owners gone too: the next entries name theirs again
        encoded = self._encoded
        if encoded is None:
            encoded = list(map(_ENCODED, map(entries.__getitem__, map(_NUMBER, self._order))))
            self._encoded = encoded
        else:
            order = self._order
            for q in self._rebuilt:
                if q in placed and q not in joined:  # those just placed went in as built
                    entry = entries[q]
                    encoded[bisect.bisect_left(order, entry[1])] = entry[2]
        self._rebuilt.clear()
        return pack_array(encoded)

    def _place(self, leaving: list[int], joining: list[int]) -> set[int]:
        """Take ``leaving`` out of the order and put ``joining`` into it; returns the joining queues whose
        encoded entries went in with them (none if the entries are to be joined anew).

        The kept order is never sorted again: each new place is found by bisection from the last one's
        (a catch-up's new queues mostly sort after the others, and then cost one bisection in all), a few
        inserted where they go, more merged by copying the runs between them as slices. Sorting every
        place again compared each pair of neighbours, O(queues) a call, and a catch-up lists again and
        again as it grows: O(queues^2) over it."""
        placed, order, entries = self._placed, self._order, self._entries
        if leaving:
            placed.difference_update(leaving)
            order = self._order = [place for place in order if place[1] in placed]
            self._encoded = None
        if not joining:
            return set()
        fresh = set(joining)
        placed.update(fresh)
        places = sorted(entries[q][1] for q in fresh)
        encoded = self._encoded
        if encoded is None:
            order += places
            order.sort()  # two sorted runs: merged in about one comparison per queue
            return set()
        if len(places) <= _INSERTS:
            at = 0
            for place in places:
                at = _after(order, place, at)
                order.insert(at, place)
                encoded.insert(at, entries[place[1]][2])
            return fresh
        merged: list[_Place] = []
        merged_encoded: list[bytes] = []
        at = 0
        for place in places:
            i = _after(order, place, at)
            if i > at:
                merged += order[at:i]
                merged_encoded += encoded[at:i]
                at = i
            merged.append(place)
            merged_encoded.append(entries[place[1]][2])
        merged += order[at:]
        merged_encoded += encoded[at:]
        self._order, self._encoded = merged, merged_encoded
        return fresh

    async def _follow(self, looked: int, part: Listed[Any]) -> tuple[int, set[int], list[int], set[int]]:
        """The followed part's queues now (kept for the next listing): the last ones with only those
        that committed since looked at; returns ``looked`` as :meth:`_add` does, the queues, and of
        those that committed since the ones held and the ones gone."""
        changed, self._changed = self._changed, set()  # what commits while this runs: next time
        followed, found = self._followed, list[int]()
        assert followed is not None
        try:
            looked = await self._add(found, looked, replace(part, queues=sorted(changed)))
        except BaseException:  # cancelled (the client left), say: looked at by the next listing
            self._changed |= changed
            raise
        gone = changed.difference(found)
        followed -= gone
        followed.update(found)
        return looked, followed, found, gone

    async def _add(self, found: list[int], looked: int, part: Listed[Any]) -> int:
        """Note the queues of ``part`` found (their entries built anew if their state changed); returns
        how many queues were looked at so far (``looked`` before), the count the checkpoints go by.

        Most queues did not change since the last listing, so each chunk is first compared whole (C
        loops over the chunk: a state getter that is a C function, such as ``dict.get``, costs no
        Python call a queue); only the queues that changed, or are gone, are then looked at one by one."""
        entries, queues = self._entries, part.queues
        assert not callable(queues)
        self.read += len(queues)
        for lo in range(0, len(queues), CHUNK):
            if looked:
                await trio.lowlevel.checkpoint()
            chunk = queues[lo : lo + CHUNK]
            looked += len(chunk)
            try:
                currents: list[Any] = list(map(part.state, chunk))
            except _LEFT_OUT:  # one is gone (or on the other core now): look at each
                currents = [_GONE] * len(chunk)
            cached = list(map(entries.get, chunk))
            stale = [
                i
                for i, (now, e) in enumerate(zip(currents, cached, strict=True))
                if e is None or e[0] is not now
            ]
            if not stale:
                found += chunk
                continue
            gone = set()
            for i in stale:
                q = chunk[i]
                if not await self._build(q, currents[i], part):
                    gone.add(q)
            found += [q for q in chunk if q not in gone] if gone else chunk
        return looked

    async def _build(self, q: int, current: Any, part: Listed[Any]) -> bool:
        """Build ``q``'s entry if its state changed (``current``: as read, or :data:`_GONE`); False if the
        queue is gone."""
        try:
            if current is _GONE:
                current = part.state(q)
            if current is None and part.load is not None:
                current = await part.load(q)
            entry = self._entries.get(q)
            if entry is not None and entry[0] is current:
                return True
            built = part.info(q, current)
        except _LEFT_OUT:  # gone (or converted) while we were away from the loop
            return False
        owner = self._owners.setdefault(built["owner"], built["owner"])  # one object: compared by identity
        place = ((not built["owned"], owner, built["name"]), q)
        if entry is not None and entry[1] != place:  # a number used again: place it anew
            self._placed.discard(q)
            self._order = [p for p in self._order if p[1] != q]
            self._encoded = None
        self._entries[q] = (current, place, Packed.of(built))
        self._rebuilt.append(q)
        self.built += 1
        return True


def _after(order: list[_Place], place: _Place, at: int) -> int:
    """Where ``place`` goes in ``order``, at ``at`` or after (the last place found for a smaller one):
    one comparison if it goes there too (new queues' places mostly come in runs), else a bisection."""
    if at == len(order) or not order[at] < place:
        return at
    return bisect.bisect_left(order, place, at + 1)


#: A state not read yet (its getter raised for another queue of the chunk).
_GONE: Final = object()


__all__ = ["CHUNK", "Listed", "QueueListing"]
