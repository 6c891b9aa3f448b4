"""The optional compiled chain hasher (built from :mod:`latticed.crdt._chain_build`) seen from Python:
whether it was built, and one C call that extends the hash chain over a batch's columns.

:func:`latticed.crdt.records.chain_extend` picks this or its pure-Python path (the same chain values);
this only lays the columns out as the C call takes them (one buffer per column and its lengths) and cuts
the answer apart. The C code links no libsodium of its own: it is handed the address of PyNaCl's BLAKE2b.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from functools import cache
from typing import Any, NamedTuple

from latticed.crdt import columns_compiled

#: BLAKE2b's personalisation is 16 bytes; hashlib pads a shorter one with zeros, and so must the caller.
PERSON_BYTES = 16


class Compiled(NamedTuple):
    """The compiled module, and the address of libsodium's personalised BLAKE2b it calls."""

    ffi: Any
    lib: Any
    blake2b: int


@cache
def load() -> Compiled | None:
    """The compiled chain hasher bound to PyNaCl's libsodium, or None if it was not built (no C compiler
    at install) or does not load. Loaded once, on first use: importing records stays cheap."""
    try:
        from latticed.crdt import _chainhash  # noqa: PLC0415
    except ImportError:
        return None
    address = columns_compiled.sodium_address(columns_compiled.BLAKE2B)
    return None if address is None else Compiled(_chainhash.ffi, _chainhash.lib, address)


def extend(
    c: Compiled,
    persons: tuple[bytes, bytes],
    base: bytes,
    first_offset: int,
    *,
    values: Sequence[bytes],
    keys: Sequence[bytes | None],
    timestamps: Sequence[int],
    tails: bytes | Sequence[bytes],
) -> list[bytes] | None:
    """The chain values after each record (see ``latticed_chain_extend``), ``tails`` the encoded headers
    of every record (one bytes for all, or one each); None if a column does not fit the C types (a
    timestamp past 64 bits, a length past 32): the caller's Python path then says what is wrong."""
    ffi = c.ffi
    n = len(values)
    record_person, chain_person = persons
    if len(base) != 32 or not 0 <= first_offset <= 2**64 - n:
        return None
    columns = columns_compiled.load()
    try:
        laid_out = None
        if columns is not None and type(values) is tuple and type(keys) is tuple:
            laid_out = columns.packed(values, keys)
        if laid_out is not None:  # one C pass over both columns
            joined, value_lengths, joined_keys, key_lengths = laid_out
        else:
            joined = b"".join(values)
            value_lengths = array("I", map(len, values))
            absent = keys.count(None)
            if absent == n:
                key_lengths = array("i", [-1]) * n
                joined_keys = b""
            elif not absent:
                key_lengths = array("i", map(len, keys))  # type: ignore[arg-type]
                joined_keys = b"".join(keys)  # type: ignore[arg-type]
            else:
                key_lengths = array("i", [-1 if k is None else len(k) for k in keys])
                joined_keys = b"".join([k for k in keys if k])
        stamps = _stamps(columns, timestamps)
        if isinstance(tails, bytes):
            joined_tails, tail_lengths = tails, ffi.NULL
        else:
            joined_tails = b"".join(tails)
            tail_lengths = ffi.from_buffer("uint32_t[]", array("I", map(len, tails)))
    except (OverflowError, TypeError):
        return None
    out = bytearray(32 * n)
    status = c.lib.latticed_chain_extend(
        c.blake2b, record_person, chain_person, base, first_offset, joined, len(joined),
        ffi.from_buffer("uint32_t[]", value_lengths), joined_keys, len(joined_keys),
        ffi.from_buffer("int32_t[]", key_lengths), ffi.from_buffer("int64_t[]", stamps), joined_tails,
        len(joined_tails), tail_lengths, n, ffi.from_buffer(out), len(out),
    )  # fmt: skip
    if status == -1:  # the lengths disagree with the bytes (a memoryview of wider items): not bytes
        return None
    if status:  # pragma: no cover - out of memory, or libsodium refused a size it takes
        raise AssertionError(f"the compiled chain hasher refused a batch ({status})")
    if columns is not None:
        return columns.pieces(out, 32)  # type: ignore[no-any-return]
    return list(struct.unpack("32s" * n, out))  # one C call, not a slice per record


def _stamps(columns: Any, timestamps: Sequence[int]) -> array[int]:
    """The timestamps as int64s. A batch's column is mostly one reading of the owner's clock: that is
    repeated, not converted an item at a time (~35 ns an item, 7 % of a bulk append's hashing)."""
    if columns is not None and columns.same_int(timestamps):
        return array("q", timestamps[:1]) * len(timestamps)
    return array("q", timestamps)


__all__ = ["PERSON_BYTES", "Compiled", "extend", "load"]
