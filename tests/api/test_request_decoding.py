"""A large request is decoded field by field to keep the bytes its ``records`` were sent as: it must
decode to what the one-call decoder gives, and refuse what it refuses."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from latticed.api import messages
from latticed.api.messages import Decoded, unpack, unpack_request
from latticed.errors import MalformedError

leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.binary(max_size=20)
    | st.text(max_size=8)
)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
requests = st.dictionaries(
    st.sampled_from(["v", "id", "op", "records", "queue"]) | st.text(max_size=4), values
)


@pytest.fixture(autouse=True)
def every_frame_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "FIELDS_FROM_BYTES", 0)


@given(requests)
def test_decodes_as_the_one_call_decoder_and_keeps_the_records_bytes(request: dict[str, object]) -> None:
    frame = msgpack.packb(request, use_bin_type=True)
    decoded = unpack_request(frame)
    assert type(decoded) is Decoded
    assert decoded == unpack(frame) == request
    if "records" in request:
        assert decoded.packed_records is not None
        assert bytes(decoded.packed_records) == msgpack.packb(request["records"], use_bin_type=True)
    else:
        assert decoded.packed_records is None


def test_the_last_of_equal_keys_wins_with_its_bytes() -> None:
    frame = (
        b"\x82"
        + msgpack.packb("records")
        + msgpack.packb([1])
        + msgpack.packb("records")
        + msgpack.packb([2])
    )
    decoded = unpack_request(frame)
    assert decoded == unpack(frame) == {"records": [2]}
    assert bytes(decoded.packed_records) == msgpack.packb([2])


@pytest.mark.parametrize(
    "frame",
    [
        msgpack.packb({"op": "x"}) + b"\x01",  # trailing bytes
        msgpack.packb({"op": "x", "records": [b"abc"]})[:-2],  # cut short
        b"\x81" + msgpack.packb([1]) + b"\x01",  # a key that cannot be a dict key
        b"\x81\xa1a\xc1",  # a byte msgpack never uses
    ],
)
def test_refuses_what_the_one_call_decoder_refuses(frame: bytes) -> None:
    with pytest.raises(MalformedError):
        unpack(frame)
    with pytest.raises(MalformedError):
        unpack_request(frame)


def test_small_frames_are_decoded_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "FIELDS_FROM_BYTES", 1 << 16)
    assert type(unpack_request(msgpack.packb({"records": [[b"v", None, []]]}))) is dict
