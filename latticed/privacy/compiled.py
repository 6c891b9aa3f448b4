"""The optional compiled batch sealer (built from :mod:`latticed.privacy._seal_build`) seen from Python:
whether it was built, and one C call per batch to seal or to open envelopes.

:mod:`latticed.privacy.crypto` checks the arguments, picks this or its pure-Python path, and raises the
errors; this only moves bytes in and out of the C calls (whose sizes the C code checks again). The C code
links no libsodium of its own: it is handed the addresses of PyNaCl's.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Any, Final, NamedTuple

#: What an envelope adds to its inner record: version 1, epoch 4, nonce 24, tag 16 (the C code's OVERHEAD).
OVERHEAD: Final = 45


class Compiled(NamedTuple):
    """The compiled module, and the addresses of the libsodium AEAD functions it calls."""

    ffi: Any
    lib: Any
    encrypt: int
    decrypt: int


def load(sodium_ffi: Any, sodium_lib: Any) -> Compiled | None:
    """The compiled sealer bound to PyNaCl's libsodium (its ``nacl._sodium`` ffi and lib), or None if it
    was not built (no C compiler at install) or does not load."""
    try:
        from latticed.privacy import _sealbatch  # noqa: PLC0415
    except ImportError:
        return None

    def address(name: str) -> int:
        return int(sodium_ffi.cast("uintptr_t", sodium_ffi.addressof(sodium_lib, name)))

    return Compiled(
        _sealbatch.ffi,
        _sealbatch.lib,
        address("crypto_aead_xchacha20poly1305_ietf_encrypt"),
        address("crypto_aead_xchacha20poly1305_ietf_decrypt"),
    )


def seal(
    c: Compiled, key: bytes, ad: bytes, head: bytes, parts: Sequence[bytes], *, nonces: bytes, prefix: bytes,
    max_inner: int,
) -> list[bytes] | None:  # fmt: skip
    """Envelope i = ``head`` | nonce i | AEAD(``prefix`` | part i), all in one call with the GIL released,
    written into one buffer, then cut apart. None if an inner record is over ``max_inner`` (none sealed)."""
    ffi = c.ffi
    n = len(parts)
    lengths = array("I", map(len, parts))  # OverflowError past 4 GiB: never, the parts were checked
    joined = b"".join(parts)
    out = bytearray(len(joined) + n * (OVERHEAD + len(prefix)))
    bounds = array("Q", bytes(8 * (n + 1)))
    status = c.lib.latticed_seal_batch(
        c.encrypt, key, ad, len(ad), head, prefix, len(prefix), joined, len(joined),
        ffi.from_buffer("uint32_t[]", lengths), n, max_inner, nonces, len(nonces),
        ffi.from_buffer(out), len(out), ffi.from_buffer("uint64_t[]", bounds),
    )  # fmt: skip
    if status == -3:
        return None
    if status:  # pragma: no cover - the sizes above agree, and libsodium encrypts any input of these sizes
        raise AssertionError(f"the compiled sealer refused a batch ({status})")
    data = bytes(out)
    return [data[start:end] for start, end in pairwise(bounds)]


def open_run(c: Compiled, key: bytes, ad: bytes, envelopes: Sequence[bytes]) -> list[bytes] | None:
    """The inner records of ``envelopes`` (each checked to be one, all of one epoch) in one call; None if
    one does not verify."""
    lengths = array("I", map(len, envelopes))
    joined = b"".join(envelopes)
    ends = list(accumulate(map((-OVERHEAD).__add__, lengths)))
    opened = bytearray(ends[-1] if ends else 0)
    status = c.lib.latticed_open_batch(
        c.decrypt, key, ad, len(ad), joined, len(joined), c.ffi.from_buffer("uint32_t[]", lengths),
        len(lengths), c.ffi.from_buffer(opened), len(opened),
    )  # fmt: skip
    if status > 0:
        return None
    if status:  # pragma: no cover - the sizes above agree
        raise AssertionError(f"the compiled sealer refused a batch to open ({status})")
    data = bytes(opened)
    return [data[start:end] for start, end in pairwise([0, *ends])]


__all__ = ["OVERHEAD", "Compiled", "load", "open_run", "seal"]
