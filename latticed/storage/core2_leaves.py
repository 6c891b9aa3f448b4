"""A core-2 queue's shared leaves in their rows (schema 8): whole, or as the steps of the bodies they are
the leaves of.

A replica catching up on single offers gains a 40-byte shared leaf a version: the leaf of a body it
rebuilt from ~3 bytes of :mod:`latticed.crdt.leaf_codec` steps. Those steps are stored for the bodies
(:mod:`latticed.storage.core2_bodies`); a run of ``leaves2`` (keyed ``(q, index of its first)``, as in
:mod:`latticed.storage.core2_runs`) may hold them too. With ``steps_from`` NULL a run is its leaves'
bytes; otherwise a msgpack list of items, each either

* bytes: leaves as stored whole (40 bytes each), or
* ``[anchor, steps, count, digest, n, last]``: ``n`` leaves of the ``count`` bodies that ``steps``
  rebuild after the stored body ``anchor`` (``digest``: the last body's leaf digest), from the one of
  the version whose leaf is next (version ``v``'s leaf is at shared index ``v - 1``: an epoch's log holds
  its versions from 1 on); ``last`` is the last of them's digest.

Loading rebuilds them as the bodies' runs are (the same decode, the last digest checked: each body's
``log`` folds every leaf before it, so a changed step, record or anchor is refused) and takes their
leaves, the last one's digest checked too (a changed count or position is refused). Steps are used only
where the same commit stores the bodies as them (so the bodies' rule holds: :func:`core2_bodies.certain`)
and the leaves they give are, compared one by one, the very leaves stored. Leaves outlive the records
their steps read (truncation keeps the log), so a run's row says the chain values it reads
(``steps_from`` to ``steps_to``) and :func:`before_write` rewrites it whole before any of those records
go, or before a fork point or another epoch replaces them, while they are still stored.
"""

from __future__ import annotations

import functools
import operator
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from latticed.crdt import shared_prefix, steps_memo
from latticed.crdt.epochs import Chains
from latticed.crdt.head2 import Leaf
from latticed.crdt.lazy_bodies import StepRun
from latticed.crdt.queue2 import QueueState2
from latticed.errors import MalformedError
from latticed.storage import core2_bodies, core2_runs
from latticed.storage.codec import pack, unpack

__all__ = ["Row", "before_write", "common", "load", "read", "rows"]

#: ``(idx, steps_from, steps_to, leaves)``: a ``leaves2`` row less its queue.
Row = tuple[int, int | None, int | None, bytes]
#: Fewer leaves than this from one run of steps are stored whole (the item carries a 232-byte anchor).
MIN_STEPPED: Final = 16
_leaf_slot = operator.attrgetter("_leaf")
#: ``(index in the leaves, how many, the steps, the lowest offset they read)``: leaves a run of steps gives.
_Piece = tuple[int, int, steps_memo.Stepped, int]


# ---------------------------------------------------------------------- writing
def common(a: Chains, b: Chains) -> int:
    """How many leading shared leaves ``a`` and ``b`` have in common (both verified)."""
    if a.epoch != b.epoch or a.queue_id != b.queue_id:
        return 0
    x, y = a.shared, b.shared
    n = min(len(x), len(y))
    if shared_prefix.extends(x, y) or shared_prefix.extends(y, x):
        return n  # one list: no leaf read
    if n == 0 or x[n - 1] == y[n - 1]:
        return n  # the usual case: one extends the other
    lo, hi = 0, n - 1  # x[:lo] == y[:lo]; x[hi] != y[hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if x[mid] == y[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def rows(first: int, leaves: Sequence[Leaf], used: core2_bodies.UsedRuns = ()) -> list[Row]:
    """Rows for ``leaves`` (shared index ``first`` on): the ones that are the leaves of bodies just
    stored as steps (``used``: steps certain over the queue's chain, each with the lowest offset it
    reads) as those steps, the rest whole; at most :data:`core2_runs.RUN_MAX` a row."""
    pieces = sorted(
        (p for p in (_piece(e, low, first, leaves) for e, low in used) if p is not None),
        key=operator.itemgetter(0),
    )
    if not pieces:
        return [(idx, None, None, raw) for idx, raw in core2_runs.leaf_runs(first, leaves)]
    out: list[Row] = []
    items: list[Any] = []
    size, at, row_first = 0, 0, first
    lows: list[int] = []
    highs: list[int] = []

    def flush() -> None:
        nonlocal items, size, lows, highs, row_first
        if items:
            stepped = bool(lows)
            raw = pack(items) if stepped else b"".join(items)
            out.append((row_first, min(lows) if stepped else None, max(highs) if stepped else None, raw))
        row_first, items, size, lows, highs = row_first + size, [], 0, [], []

    def whole(lo: int, hi: int) -> None:
        nonlocal size
        while lo < hi:
            if size == core2_runs.RUN_MAX:
                flush()
            take = min(hi - lo, core2_runs.RUN_MAX - size)
            items.extend(raw for _, raw in core2_runs.leaf_runs(0, leaves[lo : lo + take]))
            size, lo = size + take, lo + take

    for start, count, entry, low in pieces:
        if start < at:  # overlaps one taken (two remembered runs of the same versions)
            continue
        whole(at, start)
        if size + count > core2_runs.RUN_MAX:
            flush()
        digest = entry.bodies[-1].leaf()[0]
        last = leaves[start + count - 1][0]
        items.append([entry.prev.to_bytes(), entry.steps, len(entry.bodies), digest, count, last])
        lows.append(low)
        highs.append(entry.bodies[-1].end)
        size, at = size + count, start + count
    whole(at, len(leaves))
    flush()
    return out


def _piece(entry: steps_memo.Stepped, low: int, first: int, leaves: Sequence[Leaf]) -> _Piece | None:
    """Where ``entry``'s bodies' leaves are among ``leaves``, if enough are. A body of version ``v`` is
    looked for at shared index ``v - 1`` (an epoch's log holds its versions from 1 on); the leaves there
    are compared, so a guess that misses stores them whole."""
    bodies = entry.bodies
    at = bodies[0].version - 1 - first
    skip, stop = max(0, -at), min(len(bodies), len(leaves) - at)
    if stop - skip < MIN_STEPPED or stop - skip > core2_runs.RUN_MAX:
        return None
    # (a run not built as bodies: its leaves as the decode gave them)
    mine = bodies.leaves[skip:stop] if type(bodies) is StepRun else tuple(map(_leaf_slot, bodies[skip:stop]))
    if None in mine:
        mine = tuple(b.leaf() for b in bodies[skip:stop])
    if mine != tuple(leaves[at + skip : at + stop]):
        return None
    return at + skip, stop - skip, entry, low


# ---------------------------------------------------------------------- reading
def load(
    conn: sqlite3.Connection, q: int, window: core2_bodies.ChainWindow, memo: core2_bodies.Rebuilt
) -> tuple[Leaf, ...]:
    """Queue ``q``'s shared leaves as stored (see :func:`read`)."""
    found = conn.execute(
        "SELECT idx, leaves, steps_from, steps_to FROM leaves2 WHERE q = ? ORDER BY idx", (q,)
    ).fetchall()
    return read(((idx, bytes(raw), lo, hi) for idx, raw, lo, hi in found), window, memo)


def read(
    found: Iterable[tuple[int, bytes, int | None, int | None]],
    window: core2_bodies.ChainWindow,
    memo: core2_bodies.Rebuilt | None = None,
) -> tuple[Leaf, ...]:
    """The shared leaves of queue rows ``(idx, leaves, steps_from, steps_to)`` (ordered by index), checked
    to run on from index 0 without a gap; runs of steps rebuilt over the chain values ``window`` gives."""
    out: list[Leaf] = []
    for idx, raw, lo, hi in found:
        if idx != len(out):
            raise MalformedError(f"stored leaves from index {idx} do not follow the {len(out)} before them")
        if lo is None or hi is None:
            out += core2_runs.read_leaves([(0, raw)])
        else:
            out += read_run(raw, functools.partial(window, lo, hi), idx, memo)
    return tuple(out)


def read_run(
    raw: bytes,
    window: Callable[[], core2_bodies.Window],
    first: int,
    memo: core2_bodies.Rebuilt | None = None,
) -> list[Leaf]:
    """The leaves of one stored run holding steps, its first at shared index ``first`` (the chain values
    read once, from ``window``)."""
    items = unpack(raw)
    if not isinstance(items, list) or not items:
        raise MalformedError("a stored run of shared leaves that is not a list")
    out: list[Leaf] = []
    chains: list[core2_bodies.Window] = []
    for item in items:
        if isinstance(item, bytes):
            out += core2_runs.read_leaves([(0, item)])
            continue
        if not isinstance(item, list) or len(item) != 6 or not isinstance(item[0], bytes):
            raise MalformedError("a stored run item that is neither leaves nor steps")
        if not chains:
            chains.append(window())
        bodies, n = core2_bodies.rebuild(item[:4], None, chains[0], memo), item[4]
        skip = first + len(out) + 1 - bodies[0].version
        if type(n) is not int or n < 1 or skip < 0 or skip + n > len(bodies):
            raise MalformedError("stored steps of shared leaves do not rebuild the leaves stored there")
        taken = [b.leaf() for b in bodies[skip : skip + n]]
        if taken[-1][0] != item[5]:
            raise MalformedError("stored steps of shared leaves do not rebuild the leaves stored there")
        out += taken
    return out


def before_write(
    conn: sqlite3.Connection, q: int, old: QueueState2, new: QueueState2, common: int, *, kept: bool
) -> None:
    """Rewrite whole, before ``new``'s records are written over ``old``'s, every run of steps among the
    first ``common`` shared leaves (those that stay) that would no longer rebuild: one reading records
    below ``new``'s start, one the cut at ``common`` goes through, and, when ``new``'s records are not
    ``old``'s with some appended (``kept``: :func:`core2_bodies.appended`; a fork point, another epoch),
    all."""
    lo, new_lo = old.held[0], new.held[0]
    cut = common < len(old.chains.shared)
    if kept and new_lo <= lo and not cut:  # a commit or a merge appending: nothing read goes
        return
    select = "SELECT idx, leaves, steps_from, steps_to FROM leaves2 WHERE q = ? AND steps_from IS NOT NULL "
    found = []
    if not kept:
        found = conn.execute(select + "AND idx < ?", (q, common)).fetchall()
    elif new_lo > lo:
        found = conn.execute(select + "AND idx < ? AND steps_from < ?", (q, common, new_lo)).fetchall()
    if cut:  # the run holding the last kept leaf may be cut
        found += conn.execute(
            select + "AND idx = (SELECT max(idx) FROM leaves2 WHERE q = ? AND idx < ?)", (q, q, common)
        ).fetchall()
    if not found:
        return
    window = core2_bodies.chain_window(conn, q, lo, old.base_hash)
    for idx, raw, steps_from, steps_to in dict((row[0], row) for row in found).values():
        leaves = read_run(bytes(raw), functools.partial(window, steps_from, steps_to), idx)
        ((_, whole),) = core2_runs.leaf_runs(0, leaves)
        conn.execute(
            "UPDATE leaves2 SET leaves = ?, steps_from = NULL, steps_to = NULL WHERE q = ? AND idx = ?",
            (whole, q, idx),
        )
