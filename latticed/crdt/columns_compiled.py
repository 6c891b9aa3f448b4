"""The optional column passes in C (``latticed.crdt._columns``, built from :mod:`._columns_build`) seen
from Python: whether they were built, and the module.

Each of its functions does in one C pass what a pure-Python path here does with several, with the same
result (tests/crdt/test_columns_compiled.py): ``offered`` splits an offer's decoded records into columns
(:func:`latticed.produce.owner.produced_run`), ``packed`` and ``pieces`` lay columns out for the compiled
chain hasher and cut its answer (:mod:`.chain_compiled`), ``cuts`` finds the owner's signed slices
(:func:`latticed.crdt.queue.commit.checkpoint_cuts`); ``versions``, ``packed_bodies`` and ``unvouched``
are :mod:`.leaf_compiled`'s, ``fold`` and ``are_leaves`` :mod:`.fold_compiled`'s, ``appended_head``
:mod:`.append_compiled`'s. None of
them decides a verdict: given anything but the plain shape they handle they return None, and the Python
path checks the input.

The compiled passes link no libsodium of their own: :func:`sodium_address` hands them PyNaCl's functions
by address, the ones the Python path calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import Any


@cache
def load() -> ModuleType | None:
    """The compiled module, or None if it was not built (no C compiler at install) or does not load."""
    try:
        from latticed.crdt import _columns  # noqa: PLC0415
    except ImportError:
        return None
    return _columns


#: libsodium's personalised BLAKE2b, which every compiled pass that hashes calls.
BLAKE2B = "crypto_generichash_blake2b_salt_personal"


def sodium_address(name: str) -> int | None:
    """The address of libsodium's function ``name`` in PyNaCl's build, for a compiled pass to call (so
    it hashes and verifies with the same code as the Python path), or None if PyNaCl's libsodium is not
    at hand. Imported on first use: importing the callers stays cheap."""
    try:
        from nacl._sodium import ffi, lib  # noqa: PLC0415
    except ImportError:
        return None
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


def knows_slots(slots: tuple[str, ...]) -> bool:
    """Whether the compiled passes' table of ``HeadV2``'s slots (``HEAD_SLOTS``) is ``slots``: those that
    build or read heads slot by slot are used only then, since a slot the table lacks would be left
    empty in every head they build from a peer's push."""
    columns = load()
    return columns is not None and getattr(columns, "HEAD_SLOTS", None) == slots


def widest(values: Sequence[bytes], keys: Sequence[bytes | None]) -> tuple[int, int]:
    """The longest value's and the longest key's lengths (0 where there are none): the segment cut's
    bound (:func:`latticed.storage.segments.split`)."""
    columns = load()
    found = None if columns is None else columns.widest(values, keys)
    if found is not None:  # both maxima in one C pass
        return found  # type: ignore[no-any-return]
    return max(map(len, values), default=0), max(map(len, filter(None, keys)), default=0)


def same_int(column: Sequence[Any]) -> bool:
    """Whether every item of a non-empty column is an int (not a bool) equal to the first: the owner's
    clock on every record, packed once (:func:`latticed.storage.segments._pack_same`)."""
    columns = load()
    if columns is not None:
        return bool(columns.same_int(column))
    first = column[0] if column else None
    return type(first) is int and column.count(first) == len(column) and set(map(type, column)) == {int}


__all__ = ["BLAKE2B", "load", "same_int", "sodium_address", "widest"]
