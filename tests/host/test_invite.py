"""Invite tokens: round trip, typos and truncation caught by the checksum, versions refused by name, and
the secret never shown in a repr or an error."""

from __future__ import annotations

import base64

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from latticed.errors import MalformedError
from latticed.host.invite import MAX_ADDRESSES, PREFIX, Invite, _checksum, decode_invite, encode_invite

KEY = bytes(range(32))
IDENTITY = bytes(range(100, 132))
ADDRESSES = (("192.0.2.10", 7464), ("2001:db8::1", 7464), ("office.example.org", 1))
INVITE = Invite(KEY, IDENTITY, ADDRESSES)


def test_round_trip() -> None:
    token = encode_invite(INVITE)
    assert token.startswith(PREFIX)
    assert token == token.strip() and "\n" not in token
    assert decode_invite(token) == INVITE


def test_one_line_of_unambiguous_characters() -> None:
    body = encode_invite(INVITE).removeprefix(PREFIX)
    assert set(body) <= set("abcdefghijklmnopqrstuvwxyz234567")
    assert len(encode_invite(Invite(KEY, IDENTITY, (("192.0.2.10", 7464),)))) < 200


def test_case_and_whitespace_do_not_matter() -> None:
    token = encode_invite(INVITE)
    wrapped = "  " + "\n".join(token[i : i + 40] for i in range(0, len(token), 40)) + "\r\n"
    assert decode_invite(wrapped) == INVITE
    assert decode_invite(token.upper()) == INVITE


@given(data=st.data())
def test_every_single_character_typo_is_caught(data: st.DataObject) -> None:
    token = encode_invite(INVITE)
    position = data.draw(st.integers(len(PREFIX), len(token) - 1))
    replacement = data.draw(
        st.sampled_from("abcdefghijklmnopqrstuvwxyz234567").filter(lambda c: c != token[position])
    )
    typo = token[:position] + replacement + token[position + 1 :]
    with pytest.raises(MalformedError, match="damaged"):
        decode_invite(typo)


@given(cut=st.integers(1, 40))
def test_a_truncated_copy_is_caught(cut: int) -> None:
    token = encode_invite(INVITE)
    with pytest.raises(MalformedError, match="damaged"):
        decode_invite(token[:-cut])


def test_swapped_neighbours_are_caught() -> None:
    token = encode_invite(INVITE)
    for i in range(len(PREFIX), len(token) - 1):
        if token[i] != token[i + 1]:
            swapped = token[:i] + token[i + 1] + token[i] + token[i + 2 :]
            with pytest.raises(MalformedError, match="damaged"):
                decode_invite(swapped)


def test_another_version_is_refused_by_name() -> None:
    token = encode_invite(INVITE)
    with pytest.raises(MalformedError, match=r"version 2 is not supported.*upgrade latticed"):
        decode_invite("latticed2:" + token.removeprefix(PREFIX))


@pytest.mark.parametrize("text", ["", "hello", "latticed:abc", "https://example.org/latticed1:x", "x" * 5000])
def test_not_a_token(text: str) -> None:
    with pytest.raises(MalformedError):
        decode_invite(text)


def test_errors_and_repr_never_show_the_secret() -> None:
    token = encode_invite(INVITE)
    body = token.removeprefix(PREFIX)
    assert KEY.hex() not in repr(INVITE) and repr(KEY) not in repr(INVITE)
    damaged = token[:-3] + ("a" if token[-3] != "a" else "b") + token[-2:]
    for bad in (damaged, token[:-5], "latticed2:" + body):
        with pytest.raises(MalformedError) as raised:
            decode_invite(bad)
        assert body[:12] not in str(raised.value)


def _forge(payload: object) -> str:
    """A well-checksummed token around any payload: what a buggy or hostile encoder could produce."""
    raw = msgpack.packb(payload, use_bin_type=True)
    return PREFIX + base64.b32encode(raw + _checksum(raw)).decode().rstrip("=").lower()


@pytest.mark.parametrize(
    "payload",
    [
        [1, 2, 3],
        {"k": KEY, "i": IDENTITY},  # no addresses
        {"k": KEY[:16], "i": IDENTITY, "a": [["h", 1]]},
        {"k": KEY, "i": "not bytes", "a": [["h", 1]]},
        {"k": KEY, "i": IDENTITY, "a": []},
        {"k": KEY, "i": IDENTITY, "a": [["h", 0]]},
        {"k": KEY, "i": IDENTITY, "a": [["h", 70000]]},
        {"k": KEY, "i": IDENTITY, "a": [["h", True]]},
        {"k": KEY, "i": IDENTITY, "a": [["", 1]]},
        {"k": KEY, "i": IDENTITY, "a": [["[::1]", 1]]},
        {"k": KEY, "i": IDENTITY, "a": [["not:ipv6", 1]]},
        {"k": KEY, "i": IDENTITY, "a": [["two words", 1]]},
        {"k": KEY, "i": IDENTITY, "a": [["h", 1, 2]]},
        {"k": KEY, "i": IDENTITY, "a": [["h", 1]] * (MAX_ADDRESSES + 1)},
    ],
)
def test_well_checksummed_nonsense_is_refused(payload: object) -> None:
    with pytest.raises(MalformedError):
        decode_invite(_forge(payload))
    assert _forge(payload).startswith(PREFIX)


def test_unknown_fields_are_ignored() -> None:
    token = _forge({"k": KEY, "i": IDENTITY, "a": [["192.0.2.1", 7464]], "future": 1})
    assert decode_invite(token) == Invite(KEY, IDENTITY, (("192.0.2.1", 7464),))


def test_an_invite_needs_an_address() -> None:
    with pytest.raises(MalformedError, match="at least one address"):
        Invite(KEY, IDENTITY, ())
