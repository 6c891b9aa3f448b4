"""The records' chain by its definition, one record at a time (``record_digest`` then ``chain_next``): the
reference the chain's faster paths (runs, the compiled hasher, the C pass over a run's columns) are
checked against, byte for byte."""

from __future__ import annotations

from collections.abc import Sequence

from latticed.crdt.records import Record, chain_next, record_digest


def by_definition(base: bytes, first: int, records: Sequence[Record]) -> list[bytes]:
    """The chain value after each of ``records``, the first at offset ``first``, chained on from ``base``."""
    out, current = [], base
    for offset, record in enumerate(records, first):
        current = chain_next(current, record_digest(record, offset))
        out.append(current)
    return out
