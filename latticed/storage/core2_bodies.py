"""A core-2 queue's head bodies in their rows (schema 7): whole, or as the steps that rebuild them.

A replica catching up on single offers holds one 232-byte body per record; it received them as ~3 bytes
of :mod:`latticed.crdt.leaf_codec` steps and rebuilt them from its records' chain values. Packing and
writing each body again was most of what storing a chunk cost, so a run of ``bodies2`` (keyed as in
:mod:`latticed.storage.core2_runs`) is a msgpack list of items, each either

* a body as stored (bytes: signed bytes, and the signature when there is one), or
* ``[anchor, steps, count, digest]``: ``count`` bodies that ``steps`` rebuild after the body just before
  this item in the run (``anchor`` nil) or after ``anchor`` (a stored body that is not one of the run's),
  reading the chain values of the records the queue holds; ``digest`` is the last one's leaf digest.

Loading rebuilds them as the replica did (:func:`latticed.crdt.leaf_bodies.decode_versions`, compiled
where built) and checks the last digest: every body's ``log`` folds the leaves before it, so a changed
step, record or stored body changes it. A run is written as steps only when that rebuild is certain: the
steps are the very ones the bodies came from (:mod:`latticed.crdt.steps_memo`, by identity), they read no
chain value below the records they came with, and the queue's chain at the last body's end is that body's
(a hash chain: every value below it is then the one the steps read). The lowest offset a run's steps
read is its row's ``steps_from``; before records below it go (truncation) or bodies leave a run, the run
is rewritten whole (:func:`expand`), while the records are still there.
"""

from __future__ import annotations

import functools
import operator
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from latticed.crdt import leaf_compiled, steps_memo
from latticed.crdt.core_errors import GapError
from latticed.crdt.head2 import HEAD2_BODY, HEAD2_NAMESPACE, HEAD2_SIZE, HeadV2
from latticed.crdt.lazy_bodies import StepRun
from latticed.crdt.leaf_bodies import decode_versions
from latticed.crdt.queue2 import QueueState2
from latticed.errors import MalformedError
from latticed.storage import core2_runs, segments
from latticed.storage.codec import pack, unpack

__all__ = [
    "Rebuilt",
    "Row",
    "Used",
    "UsedRuns",
    "appended",
    "before_write",
    "certain",
    "chain_window",
    "decode_body",
    "expand",
    "read_run",
    "reads_from",
    "rebuild",
    "runs",
    "stepped_rows",
]

_BODY_SIZE: Final = len(HEAD2_NAMESPACE) + HEAD2_BODY.size
#: ``(end_off, version, last_end, last_version, steps_from, run)``: a ``bodies2`` row less its queue.
Row = tuple[int, int, int, int, int | None, bytes]
#: The chain values at ``first .. first + len(chain)`` (``base``, then ``chain``'s), as the decode reads.
Window = tuple[int, bytes, list[bytes]]
#: The window of chain values from one offset to another (both held).
ChainWindow = Callable[[int, int], Window]
#: Bodies rebuilt by ``(the body before, steps)``: a queue's load decodes each run of steps once.
Rebuilt = dict[tuple[bytes, bytes], list[HeadV2]]
#: Runs of steps stored, each with the lowest offset it reads a chain value at.
Used = list[tuple[steps_memo.Stepped, int]]
#: The same, read only.
UsedRuns = Sequence[tuple[steps_memo.Stepped, int]]
#: ``(first index, steps or None: one body whole, how many bodies, the lowest offset the steps read)``.
_Piece = tuple[int, steps_memo.Stepped | None, int, int]
#: ``(rowid, steps_from, last_end, run)`` of a stored run holding steps.
StepRow = tuple[int, int, int, bytes]
_start = operator.attrgetter("start")


def decode_body(raw: bytes) -> HeadV2:
    """A stored body (signed bytes, with or without the signature), checked as a head is."""
    if len(raw) == HEAD2_SIZE:
        return HeadV2.from_bytes(raw)
    if len(raw) != _BODY_SIZE or not raw.startswith(HEAD2_NAMESPACE):
        raise MalformedError("a stored v2 head body of the wrong size")
    head = HeadV2(*HEAD2_BODY.unpack_from(raw, len(HEAD2_NAMESPACE)))
    head.check()
    return head


# ---------------------------------------------------------------------- writing
def runs(
    added: Sequence[HeadV2], chain_at: Callable[[int], bytes | None], used: Used | None = None
) -> list[Row]:
    """Rows for ``added`` (ordered by ``(end, version)``): runs of bodies as their steps where those are
    at hand and certain to rebuild them against the queue's chain (``chain_at``, as it will be stored),
    the rest whole, at most :data:`core2_runs.RUN_MAX` bodies a row (a run of steps is never split).
    The steps stored and the lowest offset each reads are added to ``used``."""
    pieces: list[_Piece] = []
    at = 0
    for i, entry in steps_memo.take(added):
        lowest = reads_from(entry)
        if i < at or not _certain(entry, lowest, chain_at):
            continue
        pieces += [(j, None, 1, 0) for j in range(at, i)]
        pieces.append((i, entry, len(entry.bodies), lowest))
        if used is not None:
            used.append((entry, lowest))
        at = i + len(entry.bodies)
    if not pieces:
        return _whole_rows(added)
    pieces += [(j, None, 1, 0) for j in range(at, len(added))]
    rows: list[Row] = []
    group: list[_Piece] = []
    size = 0
    for piece in pieces:
        if group and size + piece[2] > core2_runs.RUN_MAX:
            rows.append(_row(added, group))
            group, size = [], 0
        group.append(piece)
        size += piece[2]
    rows.append(_row(added, group))
    return rows


def certain(entry: steps_memo.Stepped, chain_at: Callable[[int], bytes | None]) -> bool:
    """Whether ``entry``'s steps read only chain values of the records they came with that the queue
    holds (from its start on), and the queue's chain at the last body's end is that body's."""
    return _certain(entry, reads_from(entry), chain_at)


def _certain(entry: steps_memo.Stepped, lowest: int, chain_at: Callable[[int], bytes | None]) -> bool:
    last = entry.bodies[-1]
    return lowest >= entry.first and chain_at(lowest) is not None and chain_at(last.end) == last.head_hash


def reads_from(entry: steps_memo.Stepped) -> int:
    """The lowest offset the steps read a chain value at: the first body's end, or a start they move to
    (counted whenever a start differs from the one the steps began with)."""
    if type(entry.bodies) is StepRun:  # plain steps: every start is the one they began with
        return entry.bodies.leaves[0][1]
    starts: list[int] = list(map(_start, entry.bodies))
    first_end = entry.bodies[0].end
    if starts.count(entry.prev.start) == len(starts):
        return first_end
    return min(first_end, *starts)


def _whole_rows(bodies: Sequence[HeadV2]) -> list[Row]:
    runs = core2_runs.body_runs(leaf_compiled.packed(list(bodies)))
    return [
        (end, version, last_end, last_version, None, raw)
        for end, version, last_end, last_version, raw in runs
    ]


def _row(added: Sequence[HeadV2], group: list[_Piece]) -> Row:
    items: list[Any] = []
    steps_from: int | None = None
    first, last = added[group[0][0]], added[group[-1][0] + group[-1][2] - 1]
    whole = leaf_compiled.packed([added[i] for i, entry, _, _ in group if entry is None])
    k = 0
    for i, entry, count, low in group:
        if entry is None:
            items.append(whole[k])
            k += 1
            continue
        anchor = None if items and added[i - 1] is entry.prev else entry.prev.to_bytes()
        items.append([anchor, entry.steps, count, entry.bodies[-1].leaf()[0]])
        steps_from = low if steps_from is None else min(steps_from, low)
    return first.end, first.version, last.end, last.version, steps_from, pack(items)


# ---------------------------------------------------------------------- reading
def read_run(raw: bytes, window: Callable[[], Window], memo: Rebuilt | None = None) -> list[HeadV2]:
    """The bodies of one stored run, rebuilding those stored as steps over the chain values ``window``
    gives (read once, when the run holds steps: its row's ``steps_from`` to its last end)."""
    items = unpack(raw)
    if not isinstance(items, list):
        raise MalformedError("a stored run of v2 head bodies that is not a list")
    out: list[HeadV2] = []
    chains: list[Window] = []
    for item in items:
        if isinstance(item, bytes):
            out.append(decode_body(item))
            continue
        if not chains:
            chains.append(window())
        out += rebuild(item, out[-1] if out else None, chains[0], memo)
    return out


def rebuild(item: object, before: HeadV2 | None, window: Window, memo: Rebuilt | None = None) -> list[HeadV2]:
    """The bodies a run item of steps rebuilds (after its anchor, else ``before``), checked against its
    count and last digest; ``memo`` shares one decode between a queue's runs of bodies and of leaves."""
    if not isinstance(item, list) or len(item) != 4:
        raise MalformedError("a stored run item that is neither a body nor steps")
    anchor, steps, count, digest = item
    prev = decode_body(anchor) if isinstance(anchor, bytes) else before
    if prev is None or not isinstance(steps, bytes) or type(count) is not int or count < 1:
        raise MalformedError("stored steps of v2 head bodies after no body")
    key = (prev.body(), steps)
    if memo is not None and key in memo:
        return _checked(memo[key], count, digest)
    first, base, chain = window

    def chain_at(offset: int) -> bytes | None:
        if offset == first:
            return base
        return chain[offset - first - 1] if first < offset <= first + len(chain) else None

    try:
        found = decode_versions(prev, steps, chain_at, window)
    except GapError as exc:
        raise MalformedError(f"stored steps of v2 head bodies over records not held: {exc}") from exc
    bodies = [b for b in found if isinstance(b, HeadV2)]
    if len(bodies) != len(found):
        raise MalformedError("stored steps of v2 head bodies do not rebuild the bodies stored")
    if memo is not None:
        memo[key] = bodies
    return _checked(bodies, count, digest)


def _checked(bodies: list[HeadV2], count: object, digest: object) -> list[HeadV2]:
    if len(bodies) != count or bodies[-1].leaf()[0] != digest:
        raise MalformedError("stored steps of v2 head bodies do not rebuild the bodies stored")
    return bodies


def stepped_rows(
    conn: sqlite3.Connection, q: int, below: int | None = None, keys: tuple[Any, ...] | None = None
) -> list[StepRow]:
    """:data:`StepRow` of queue ``q``'s runs that hold steps: those that read chain values below
    ``below``, or (``keys``: lowest and highest ``(end, version)``) may hold a body in that range, or
    (neither) all."""
    if keys is not None:
        (lo_end, lo_version), (hi_end, hi_version) = keys
        found = conn.execute(
            "SELECT rowid, steps_from, last_end, bodies FROM bodies2 WHERE q = ? AND steps_from IS NOT NULL "
            "AND (end_off, version) <= (?, ?) AND (last_end, last_version) >= (?, ?)",
            (q, hi_end, hi_version, lo_end, lo_version),
        ).fetchall()
    elif below is None:
        found = conn.execute(
            "SELECT rowid, steps_from, last_end, bodies FROM bodies2 WHERE q = ? AND steps_from IS NOT NULL",
            (q,),
        ).fetchall()
    else:
        found = conn.execute(
            "SELECT rowid, steps_from, last_end, bodies FROM bodies2 WHERE q = ? AND steps_from < ?",
            (q, below),
        ).fetchall()
    return [(rowid, lo, hi, bytes(raw)) for rowid, lo, hi, raw in found]


def expand(conn: sqlite3.Connection, q: int, rows: Iterable[StepRow], window: ChainWindow) -> None:
    """Rewrite ``rows`` (runs holding steps) with every body whole, while the records they read are
    still stored."""
    for rowid, steps_from, last_end, raw in rows:
        bodies = read_run(raw, functools.partial(window, steps_from, last_end))
        conn.execute("DELETE FROM bodies2 WHERE rowid = ?", (rowid,))
        conn.executemany(
            "INSERT INTO bodies2 (q, end_off, version, last_end, last_version, steps_from, bodies) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(q, *row) for row in _whole_rows(bodies)],
        )


def chain_window(conn: sqlite3.Connection, q: int, lo: int, base_hash: bytes) -> ChainWindow:
    """The stored chain values of queue ``q`` (held from ``lo``, whose chain value is ``base_hash``)
    from one offset to another, read a segment's ``chains`` column at a time."""

    def window(first: int, hi: int) -> Window:
        base = base_hash if first == lo else segments.chain_at(conn, q, first - 1) or b""
        chain: list[bytes] = []
        cursor = conn.execute(
            "SELECT first, count, chains FROM segments WHERE q = ?1 AND first < ?3 AND first >= "
            "coalesce((SELECT max(first) FROM segments WHERE q = ?1 AND first <= ?2), ?2) ORDER BY first",
            (q, first, hi),
        )
        for seg_first, count, chains in cursor:
            a, b = max(first, seg_first) - seg_first, min(hi, seg_first + count) - seg_first
            if a < b:
                raw = bytes(chains)
                chain += [
                    raw[i : i + segments.CHAIN_SIZE]
                    for i in range(a * segments.CHAIN_SIZE, b * segments.CHAIN_SIZE, segments.CHAIN_SIZE)
                ]
        return first, base, chain

    return window


def appended(old: QueueState2, new: QueueState2) -> bool:
    """Whether ``new``'s records are ``old``'s (from ``new``'s start on) with some appended."""
    hi, (new_lo, new_hi) = old.held[1], new.held
    return new_hi >= hi >= new_lo and new.chain_at(hi) == old.chain_at(hi)


def before_write(
    conn: sqlite3.Connection,
    q: int,
    old: QueueState2,
    new: QueueState2,
    gone: Sequence[HeadV2],
    *,
    kept: bool | None = None,
) -> None:
    """Rewrite whole, before ``new``'s records are written over ``old``'s, every run of steps that would
    no longer rebuild: one losing bodies (``gone``), one reading records below ``new``'s start, and,
    when ``new``'s records are not ``old``'s with some appended (``kept``: :func:`appended`, found if
    not given; a fork point, another epoch), all."""
    (lo, _), (new_lo, _) = old.held, new.held
    if not (appended(old, new) if kept is None else kept):
        found = stepped_rows(conn, q)
    else:
        found = stepped_rows(conn, q, below=new_lo) if new_lo > lo else []
        if gone:
            found += stepped_rows(conn, q, keys=(min(map(_key, gone)), max(map(_key, gone))))
    rows: dict[int, StepRow] = {}
    for row in found:
        rows[row[0]] = row
    if rows:
        expand(conn, q, rows.values(), chain_window(conn, q, lo, old.base_hash))


def _key(body: HeadV2) -> tuple[int, int]:
    return body.end, body.version
