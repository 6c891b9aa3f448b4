"""The compiled hot loop of :func:`latticed.crdt.leaf_bodies.decode_versions` (``versions`` in the
optional ``latticed.crdt._columns``) seen from Python.

A catch-up of single offers rebuilds one head body per version: build the ``HeadV2``, pack it, hash it
and fold its leaf into the log, ~5 us a version in Python, most of the replica's CPU. The C loop does the
same in one pass with libsodium's BLAKE2b (PyNaCl's, by address, as :mod:`.chain_compiled` does) and
hands back the same bodies and leaves (tests/crdt/test_leaf_compiled.py compares both, malformed steps
too). It decides nothing: on anything but plain well-formed steps whose chain values lie in the window
it was given, it answers None and the Python path reads the steps and says what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

from latticed.crdt import columns_compiled, fold_compiled
from latticed.crdt.head2 import HEAD2_NAMESPACE, HeadV2, Leaf

#: The body's and the log's BLAKE2b personalisations, as the loop takes them.
_PERSONS = fold_compiled.BODY_PERSON + fold_compiled.LOG_PERSON


class Compiled(NamedTuple):
    """The compiled loop, and the address of libsodium's personalised BLAKE2b it calls."""

    versions: Any
    blake2b: int


@cache
def load() -> Compiled | None:
    """The compiled loop, or None if ``_columns`` was not built (or is older than the loop), PyNaCl's
    libsodium is not at hand, or ``HeadV2``'s slots are not the ones the loop sets (``HEAD_SLOTS``)."""
    columns = columns_compiled.load()
    if columns is None or not hasattr(columns, "versions"):
        return None
    if not columns_compiled.knows_slots(HeadV2.__slots__):
        return None
    address = columns_compiled.sodium_address(columns_compiled.BLAKE2B)
    return None if address is None else Compiled(columns.versions, address)


@cache
def _packs() -> Any:
    """``_columns.packed_bodies``, or None (not built, or ``HeadV2``'s fields are not the ones it reads)."""
    columns = columns_compiled.load()
    if columns is None or not columns_compiled.knows_slots(HeadV2.__slots__):
        return None
    return getattr(columns, "packed_bodies", None)


def packed(heads: Sequence[HeadV2]) -> list[bytes]:
    """Each head's :meth:`~latticed.crdt.head2.HeadV2.to_bytes`, in one C pass where built (a replica
    stores a body per version: ~1 us each in Python)."""
    packs = _packs()
    found = (
        None if packs is None or type(heads) not in (list, tuple) else packs(HeadV2, HEAD2_NAMESPACE, heads)
    )
    return found if found is not None else [head.to_bytes() for head in heads]


def unvouched(
    bodies: Sequence[HeadV2],
    shared: Sequence[Leaf],
    queue_id: bytes,
    epoch: int,
    *,
    chain: Sequence[bytes],
    first: int,
) -> list[int] | None:
    """The indices of ``bodies`` one C pass does not confirm as on the log (``shared``: the log's shared
    leaves, of ``queue_id`` and ``epoch``) and hashing to the chain (``chain``: the chain values after
    ``first``); None where it is not built or the arguments are not of its shape. What it leaves out the
    caller checks in Python (:func:`latticed.crdt.epoch_delta.vouches`), which decides."""
    columns = columns_compiled.load()
    found = getattr(columns, "unvouched", None) if _packs() is not None else None
    if found is None or type(shared) is not tuple or type(chain) is not list or type(queue_id) is not bytes:
        return None
    if type(epoch) is not int or type(first) is not int or not 0 <= first < 2**64:
        return None
    left: list[int] | None = found(HeadV2, bodies, shared, queue_id, epoch, chain, first)
    return left


def _fields(prev: HeadV2) -> tuple[object, ...]:
    """``prev``'s fields in the order the compiled ``versions`` pass takes them (one place for both of
    its callers)."""
    return (
        prev.queue_id,
        prev.epoch,
        prev.version,
        prev.start,
        prev.end,
        prev.base_hash,
        prev.meta_version,
        prev.meta_hash,
        prev.timestamp,
    )


def decode(
    c: Compiled,
    prev: HeadV2,
    log: bytes,
    raw: bytes,
    window: tuple[int, bytes, Sequence[bytes]],
    *,
    out: tuple[list[Leaf], list[bytes]] | None = None,
) -> list[HeadV2 | Leaf] | None:
    """The versions after ``prev`` (whose next log is ``log``) in ``raw``, or None (the Python path then
    reads them). ``window``: ``(first, base, chain)``, the chain values of offsets ``first ..
    first + len(chain)`` (``base``, then ``chain``'s). ``out``: two empty lists the same pass fills with
    each version's leaf and the log before each version then the last (on None: cleared)."""
    first, base, chain = window
    if type(chain) is not list or not 0 <= first < 2**64:
        return None
    fields = _fields(prev)
    args = (HeadV2, c.blake2b, _PERSONS, HEAD2_NAMESPACE, fields, log, raw, base, first, chain)
    found: list[HeadV2 | Leaf] | None = c.versions(*args) if out is None else c.versions(*args, *out)
    if found is None and out is not None:
        out[0].clear()
        out[1].clear()
    return found


def decode_compact(
    c: Compiled,
    prev: HeadV2,
    log: bytes,
    raw: bytes,
    window: tuple[int, bytes, Sequence[bytes]],
    *,
    out: tuple[list[Leaf], list[bytes]],
) -> bytes | None:
    """:func:`decode` without building a body: each version's timestamp (native unsigned 64-bit, one a
    version), with ``out`` filled as there; None (``out`` cleared) where the steps are not all plain
    bodies over the window at ``prev``'s start and metadata (then :func:`decode` reads them)."""
    first, base, chain = window
    if type(chain) is not list or not 0 <= first < 2**64 or out[0] or out[1]:
        return None
    fields = _fields(prev)
    args = (None, c.blake2b, _PERSONS, HEAD2_NAMESPACE, fields, log, raw, base, first, chain, *out)
    found: bytes | None = c.versions(*args)
    if found is None:
        out[0].clear()
        out[1].clear()
    return found


__all__ = ["Compiled", "decode", "decode_compact", "load", "packed", "unvouched"]
