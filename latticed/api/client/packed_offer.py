"""Records as ``offer_batch``'s ``packed`` layout (local API 2): each column one buffer, a length per
record, so the daemon takes them apart without a Python object per record in between (the fields:
:mod:`latticed.produce.offered_columns`). A client sends them to a daemon whose ``hello`` lists
:data:`~latticed.api.messages.PACKED_OFFERS_VERSION`, and the list form to any other."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from latticed.api.messages import PACKED_OFFERS_VERSION


def _pairs(headers: Any) -> list[list[Any]]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [[k, v] for k, v in items]


def packed_fields(records: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The request fields (``v`` included) carrying ``records``: ``(value, key, headers)`` or ``(value,
    key, headers, timestamp_ms)``, as :meth:`~latticed.api.client.blocking_client.Client.produce` takes
    them (a timestamp None: the owner's clock)."""
    n = len(records)
    values = [r[0] for r in records]
    keys = [r[1] for r in records]
    fields: dict[str, Any] = {
        "v": PACKED_OFFERS_VERSION,
        "layout": "packed",
        "count": n,
        "values": b"".join(values),
        "value_lengths": struct.pack(f"<{n}i", *map(len, values)),
        "keys": b"".join([k for k in keys if k is not None]),
        "key_lengths": None,
        "timestamps": None,
        "headers": None,
    }
    if keys.count(None) != n:
        fields["key_lengths"] = struct.pack(f"<{n}i", *[-1 if k is None else len(k) for k in keys])
    stamps = [r[3] if len(r) > 3 else None for r in records]
    if stamps.count(None) != n:
        fields["timestamps"] = struct.pack(f"<{n}q", *[-1 if ts is None else ts for ts in stamps])
    headers = {i: _pairs(r[2]) for i, r in enumerate(records) if r[2]}
    if headers:
        fields["headers"] = headers
    return fields


def batch_fields(records: Sequence[Sequence[Any]], versions: Sequence[int]) -> dict[str, Any]:
    """The request fields carrying ``records`` to a daemon answering API ``versions``: columns
    (:func:`packed_fields`) when it takes them and the records are of the types they hold (values bytes,
    keys bytes or None), else the list (the daemon says what is wrong with a record)."""
    if PACKED_OFFERS_VERSION in versions and records:
        values_ok = set(map(type, [r[0] for r in records])) == {bytes}
        if values_ok and set(map(type, [r[1] for r in records])) <= {bytes, type(None)}:
            return packed_fields(records)
    return {"records": records}


__all__ = ["batch_fields", "packed_fields"]
