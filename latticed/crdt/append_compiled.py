"""A live push's head check in one C pass (``appended_head`` in the optional ``latticed.crdt._columns``)
seen from Python.

A relay checks each live push on its event loop (:func:`latticed.crdt.epoch_delta.merge`'s append
path): the head's layout, queue and epoch, its signature, the leaves it carries folded into its log, its
version and ends. In Python that is ~15 calls and two packings of the head's 232 bytes, each paid with
cold caches at a live stream's pace (bench_relay_turn ``--pause``); the C pass reads the head's slots
once, packs them once, folds with libsodium's BLAKE2b and verifies with the very ``crypto_sign_open``
that :func:`latticed.crdt.signing.verify` calls (both PyNaCl's, by address). It only ever confirms: any
input it does not accept whole (forged, malformed or merely not plain) answers False and the caller's
Python path checks it again and raises what it raises (tests/crdt/test_append_compiled.py pins the two
equal on valid and on altered input).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

from latticed.crdt import columns_compiled, fold_compiled
from latticed.crdt.head2 import HEAD2_NAMESPACE, HeadV2, Leaf

__all__ = ["checked", "load"]

#: The body's and the log's BLAKE2b personalisations, as the pass takes them.
_PERSONS = fold_compiled.BODY_PERSON + fold_compiled.LOG_PERSON


class Compiled(NamedTuple):
    """The compiled module, and the addresses of libsodium's personalised BLAKE2b and signature check."""

    columns: Any
    blake2b: int
    sign_open: int


@cache
def load() -> Compiled | None:
    """The compiled pass, or None if ``_columns`` was not built (or is older than it) or PyNaCl's
    libsodium is not at hand."""
    folding = fold_compiled.load()
    if folding is None or not hasattr(folding.columns, "appended_head"):
        return None
    address = columns_compiled.sodium_address("crypto_sign_open")
    return None if address is None else Compiled(folding.columns, folding.blake2b, address)


def checked(
    head: HeadV2,
    *,
    owner: bytes,
    queue_id: bytes,
    epoch: int,
    base: int,
    base_fold: bytes,
    leaves: Sequence[Leaf],
    ours_end: int,
) -> bool:
    """Whether the C pass confirms what ``_append`` checks of a piece whose one head is also its start
    head: ``head`` well formed, of ``queue_id`` and ``epoch``, signed by ``owner``, its log the fold of
    ``leaves`` from ``base_fold``, its version ``base + len(leaves) + 1``, the ends from ``ours_end`` on
    never going back (then the head's leaf is set too). False: not built, or not confirmed (the caller
    checks in Python, which decides)."""
    c = load()
    if c is None:
        return False
    found = c.columns.appended_head(
        HeadV2,
        c.blake2b,
        c.sign_open,
        _PERSONS,
        HEAD2_NAMESPACE,
        head,
        owner,
        queue_id,
        epoch,
        base,
        base_fold,
        leaves,
        ours_end,
    )
    return found is not None
