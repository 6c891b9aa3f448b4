"""The records of an ``offer_batch`` request in either layout: ``records``, a list of ``[value, key,
headers]`` (local API 1), or ``layout: "packed"``, the records as columns (local API 2: the request says
``v: 2``; :mod:`latticed.produce.offered_columns` has the fields and why)."""

from __future__ import annotations

from typing import Any, Final

from latticed.api.messages import PACKED_OFFERS_VERSION
from latticed.api.server.context import Request
from latticed.errors import MalformedError, ProtocolError
from latticed.produce.offered_columns import PACKED_LAYOUT, OfferedColumns, offered_columns

#: Records one plain packed request may hold (a list is bounded by the frame alone; so, in effect,
#: is this: every record takes at least four bytes of ``value_lengths``).
PLAIN_MAX_RECORDS: Final = 1 << 31


def offer_records(request: Request, max_records: int = PLAIN_MAX_RECORDS) -> list[Any] | OfferedColumns:
    """The request's records: its ``records`` list, or its columns (at most ``max_records``)."""
    layout = request.get("layout")
    if layout is None:
        raw = request.get("records")
        if not isinstance(raw, list) or not raw:
            raise MalformedError("argument 'records' must be a non-empty list of [value, key, headers]")
        return raw
    if layout != PACKED_LAYOUT:
        raise MalformedError(
            f"argument 'layout' of offer_batch is {PACKED_LAYOUT!r} or absent, got {layout!r}"
        )
    version = request.get("v")
    if type(version) is not int or version < PACKED_OFFERS_VERSION:
        raise ProtocolError(
            f"offer_batch's {PACKED_LAYOUT!r} layout is local API {PACKED_OFFERS_VERSION}: the request says "
            f"v {version!r}"
        )
    if "records" in request:
        raise MalformedError(f"a {PACKED_LAYOUT!r} offer_batch sends its records as columns, not 'records'")
    return offered_columns(request, max_records)


__all__ = ["PLAIN_MAX_RECORDS", "offer_records"]
