"""The log's fold over many leaves in C (``fold`` and ``are_leaves`` in the optional
``latticed.crdt._columns``) seen from Python.

A fresh replica's catch-up checks and folds one leaf per version of the queue (a queue of single offers:
one per record), ~1.5 us a leaf in Python (:func:`~latticed.crdt.head2.is_leaf`, then
:func:`~latticed.crdt.head2.fold_one`); the C pass does both with libsodium's BLAKE2b (PyNaCl's, by
address, as :mod:`.chain_compiled` does) and gives the same log (tests/crdt/test_fold_compiled.py). It
decides nothing: for anything but a list or tuple of leaves it answers None and the Python path checks
and folds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, NamedTuple

from latticed.crdt import columns_compiled

__all__ = ["BODY_PERSON", "LOG_PERSON", "Compiled", "all_leaves", "fold", "load"]

#: A head body's and the log's BLAKE2b personalisations (:mod:`.head2`'s), padded to 16 bytes as hashlib
#: does: what every compiled pass over heads hashes with.
BODY_PERSON = b"latticed.hd2.v1".ljust(16, b"\0")
LOG_PERSON = b"latticed.log.v1".ljust(16, b"\0")


class Compiled(NamedTuple):
    """The compiled module, and the address of libsodium's personalised BLAKE2b it calls."""

    columns: Any
    blake2b: int


@cache
def load() -> Compiled | None:
    """The compiled passes, or None if ``_columns`` was not built (or is older than them) or PyNaCl's
    libsodium is not at hand."""
    columns = columns_compiled.load()
    if columns is None or not hasattr(columns, "fold"):
        return None
    address = columns_compiled.sodium_address(columns_compiled.BLAKE2B)
    return None if address is None else Compiled(columns, address)


def fold(log: bytes, leaves: Iterable[Any], stride: int = 0) -> tuple[bytes, list[bytes]] | None:
    """``head2.fold(log, leaves)`` and the log after every ``stride``-th leaf (none for 0), or None: not
    built, ``leaves`` not a list or tuple, or an item not a leaf (the caller folds in Python)."""
    c = load()
    if c is None or type(leaves) not in (list, tuple) or type(log) is not bytes or len(log) != 32:
        return None
    found: tuple[bytes, list[bytes]] | None = c.columns.fold(c.blake2b, LOG_PERSON, log, leaves, stride)
    return found


def all_leaves(items: Sequence[Any]) -> bool | None:
    """Whether every item is a leaf (``head2.is_leaf``), or None: not built or not a list or tuple."""
    c = load()
    if c is None or type(items) not in (list, tuple):
        return None
    found: bool | None = c.columns.are_leaves(items)
    return found
