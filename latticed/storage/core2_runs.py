"""How a core-2 queue's shared leaves and head bodies are laid out in rows (schema 6): runs of up to
:data:`RUN_MAX` per row instead of one row per version.

A replica catching up on single offers gains one leaf and one body per record; writing a row for each
was most of its merge's time. A leaf run is its leaves' 40 bytes each (digest, end big-endian), keyed by
the index of its first; a body run is the msgpack list of its bodies as stored (signed bytes, and the
signature when there is one), keyed by its first and last body's ``(end, version)``. The owner's commit
still writes one small row (one leaf, one body): rows are never grown in place, so a commit stays one
insert. Used by :mod:`latticed.storage.core2_store` and by the migration from schema 5
(:mod:`latticed.storage.schema`), so it imports neither.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence
from typing import Final

from latticed.crdt.head2 import HEAD2_NAMESPACE, Leaf
from latticed.errors import MalformedError
from latticed.storage.codec import pack, unpack

__all__ = ["LEAF_BYTES", "RUN_MAX", "body_key", "body_runs", "leaf_runs", "read_bodies", "read_leaves"]

#: Leaves or bodies in one row at most (a chunk of a catch-up is at most 4,096 records).
RUN_MAX: Final = 4096
_LEAF: Final = struct.Struct(">32sQ")
LEAF_BYTES: Final = _LEAF.size
#: Where a stored body's version and end are (its signed layout, :mod:`latticed.crdt.head2`).
_VERSION_AT: Final = len(HEAD2_NAMESPACE) + 40
_END_AT: Final = len(HEAD2_NAMESPACE) + 88
_U64: Final = struct.Struct(">Q")


def leaf_runs(first: int, leaves: Sequence[Leaf]) -> list[tuple[int, bytes]]:
    """``leaves`` (index ``first`` on) as ``(index of the run's first, its bytes)`` rows."""
    pack_leaf = _LEAF.pack
    return [
        (first + i, b"".join(itertools.starmap(pack_leaf, leaves[i : i + RUN_MAX])))
        for i in range(0, len(leaves), RUN_MAX)
    ]


def read_leaves(rows: Iterable[tuple[int, bytes]]) -> tuple[Leaf, ...]:
    """The leaves of ``rows`` (ordered by index), checked to run on from index 0 without a gap."""
    out: list[Leaf] = []
    for idx, raw in rows:
        if idx != len(out) or len(raw) % LEAF_BYTES or not raw:
            raise MalformedError(f"stored leaves from index {idx} do not follow the {len(out)} before them")
        out += _LEAF.iter_unpack(raw)
    return tuple(out)


def body_key(stored: bytes) -> tuple[int, int]:
    """A stored body's ``(end, version)``, read from its bytes."""
    if len(stored) < _END_AT + 8:
        raise MalformedError("a stored v2 head body of the wrong size")
    return _U64.unpack_from(stored, _END_AT)[0], _U64.unpack_from(stored, _VERSION_AT)[0]


def body_runs(stored: Sequence[bytes]) -> list[tuple[int, int, int, int, bytes]]:
    """Stored bodies (ordered by ``(end, version)``) as ``(first end, first version, last end, last
    version, run)`` rows."""
    rows = []
    for i in range(0, len(stored), RUN_MAX):
        run = stored[i : i + RUN_MAX]
        rows.append((*body_key(run[0]), *body_key(run[-1]), pack(list(run))))
    return rows


def read_bodies(raw: bytes) -> list[bytes]:
    """The stored bodies of one run."""
    items = unpack(raw)
    if not isinstance(items, list) or not all(isinstance(item, bytes) for item in items):
        raise MalformedError("a stored run of v2 head bodies that is not a list of bytes")
    return items
