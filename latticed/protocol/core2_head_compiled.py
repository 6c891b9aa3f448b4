"""A compact DELTA2's head read in one C pass (``compact_head`` in the optional ``latticed.crdt._columns``)
seen from Python.

A relay reads each live push's head from the ten-item list msgpack decoded
(:func:`latticed.protocol.core2_compact._head_in`): five counters added to the ref's, four hashes sent or
rebuilt by their rules, the head built and checked. In Python that is ~20 calls and a frozen dataclass's
twelve ``object.__setattr__``, paid with cold caches at a live stream's pace (bench_relay_turn
``--pause``); the C pass reads the list's items once and builds the head's slots directly. It handles only
the live case of each rule (the ref's base and meta hashes, the log folded from the shared fold over the
tip's tail, the head hash from the records' chain the caller hashed from the ref's end); anything else,
hostile or merely not plain, answers None and the Python path reads the head and raises what it raises
(tests/protocol/test_core2_head_compiled.py pins the two equal on valid and on altered input). It parses
no bytes and decides no refusal.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from latticed.crdt import columns_compiled, fold_compiled
from latticed.crdt.head2 import HeadV2, Leaf

__all__ = ["compact_head"]


@cache
def _slots_known() -> bool:
    """Whether the pass sets every slot of ``HeadV2`` (else a head it built would lack one: sec22)."""
    return columns_compiled.knows_slots(HeadV2.__slots__)


def compact_head(
    raw: Any,
    ref: HeadV2 | None,
    *,
    queue_id: bytes,
    epoch: int,
    shared_fold: bytes | None,
    tail: Sequence[Leaf],
    chained: bytes | None,
    records_end: int,
    empty_meta: bytes | None,
) -> HeadV2 | None:
    """The head ``raw`` (a compact head's list) names against ``ref``, or None: not built, or not the
    live case this pass reads (the caller reads it in Python, which decides). ``chained``: the chain
    value after the delta's records, hashed from ``ref``'s head hash at ``ref``'s end (None: not that
    case), ``records_end`` where they end; ``empty_meta``: the empty metadata's hash when the delta
    carries no metadata (else None)."""
    c = fold_compiled.load()
    if c is None or not hasattr(c.columns, "compact_head") or not _slots_known():
        return None
    head: HeadV2 | None = c.columns.compact_head(
        HeadV2,
        c.blake2b,
        fold_compiled.LOG_PERSON,
        raw,
        ref,
        queue_id,
        epoch,
        shared_fold,
        tail,
        chained,
        records_end,
        empty_meta,
    )
    return head
