"""Which layout an ``offer_batch`` request's records come in, decided before any record is checked: a
request that mixes them, or sends columns under API 1, is refused as a whole."""

from __future__ import annotations

import pytest

from latticed.api.client.packed_offer import packed_fields
from latticed.api.server.offer_layouts import offer_records
from latticed.errors import MalformedError, ProtocolError
from latticed.produce.offered_columns import OfferedColumns

RECORDS = [(b"a", None, []), (b"bc", b"k", [])]


def test_a_list_request_gives_its_list_back() -> None:
    raw = [[b"a", None, []]]
    assert offer_records({"records": raw}) is raw


@pytest.mark.parametrize("records", [None, [], "x", {"a": 1}])
def test_a_list_request_without_records_is_malformed(records: object) -> None:
    with pytest.raises(MalformedError, match="records"):
        offer_records({"records": records})


def test_a_packed_request_gives_its_columns() -> None:
    columns = offer_records(packed_fields(RECORDS))
    assert isinstance(columns, OfferedColumns)
    assert columns.values == (b"a", b"bc")
    assert columns.keys == (None, b"k")


def test_columns_under_api_1_are_a_protocol_error() -> None:
    request = packed_fields(RECORDS) | {"v": 1}
    with pytest.raises(ProtocolError, match="local API 2"):
        offer_records(request)


def test_an_unknown_layout_or_a_mixed_request_is_malformed() -> None:
    with pytest.raises(MalformedError, match="layout"):
        offer_records(packed_fields(RECORDS) | {"layout": "arrow"})
    with pytest.raises(MalformedError, match="not 'records'"):
        offer_records(packed_fields(RECORDS) | {"records": [[b"a", None, []]]})


def test_the_record_limit_bounds_a_packed_request() -> None:
    with pytest.raises(MalformedError):
        offer_records(packed_fields(RECORDS), max_records=1)
