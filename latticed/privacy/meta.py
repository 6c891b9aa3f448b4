"""Where a sealed queue keeps its key epochs and wrapped content keys: reserved keys of the owner's signed
metadata (so they replicate, verify and fork-check like the rest of it). Metadata values are text, so
wrapped keys are base64 (standard alphabet, padded)::

    sealed.epoch                    current key epoch E (decimal)
    sealed.epoch.<e>                first offset sealed under epoch e, for every e in 0..E (decimal)
    sealed.key.<e>.<reader hex>     epoch e's content key wrapped to a reader (base64 of 80 bytes)

Epoch ``e`` covers offsets from its start to the next epoch's. Its readers are the identities it has a
wrap for; the current epoch's are the queue's readers, and the owner is always one of them. Every key
starting with ``sealed.`` is reserved: the API refuses to set or delete one by hand.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from latticed.crdt.core_errors import MalformedError
from latticed.privacy.crypto import KEY_SIZE, MAX_EPOCH, WRAP_SIZE, wrap_content_key

PREFIX = "sealed."
EPOCH_KEY = "sealed.epoch"
_START = "sealed.epoch."
_WRAP = "sealed.key."

#: ``rand(n)``: n random bytes (the daemon passes the OS's random source; tests pass fixed bytes).
Random = Callable[[int], bytes]


def is_reserved(key: str) -> bool:
    """Whether a metadata key belongs to sealing (set only through share/unshare)."""
    return key.startswith(PREFIX)


def is_sealed(meta: Mapping[str, str]) -> bool:
    """Whether metadata says its queue or namespace is sealed."""
    return EPOCH_KEY in meta


def start_key(epoch: int) -> str:
    return f"{_START}{epoch}"


def wrap_key(epoch: int, reader: bytes) -> str:
    return f"{_WRAP}{epoch}.{reader.hex()}"


@dataclass(frozen=True, slots=True)
class Epoch:
    """One content key's span: from offset ``start`` on (until the next epoch), and who may open it."""

    number: int
    start: int
    #: Reader (Ed25519 public key) -> the content key wrapped to it.
    wraps: Mapping[bytes, bytes]

    @property
    def readers(self) -> frozenset[bytes]:
        return frozenset(self.wraps)


@dataclass(frozen=True, slots=True)
class Sealing:
    """The sealing of one queue, as its metadata states it."""

    owner: bytes
    epochs: tuple[Epoch, ...]  # epochs[e].number == e

    @property
    def current(self) -> Epoch:
        return self.epochs[-1]

    @property
    def readers(self) -> frozenset[bytes]:
        """Who can read records sealed from now on (the owner included)."""
        return self.current.readers

    def epoch_at(self, offset: int) -> Epoch:
        """The epoch whose span holds ``offset``."""
        found = self.epochs[0]
        for epoch in self.epochs:
            if epoch.start > offset:
                break
            found = epoch
        return found

    def describe(self, me: bytes) -> dict[str, object]:
        """For ``queue info``: epochs, their first offsets and readers, and whether ``me`` reads now."""
        return {
            "epoch": self.current.number,
            "readers": sorted(r.hex() for r in self.readers),
            "epochs": [
                {"epoch": e.number, "start": e.start, "readers": sorted(r.hex() for r in e.readers)}
                for e in self.epochs
            ],
            "readable": me in self.readers,
            "readable_epochs": [e.number for e in self.epochs if me in e.wraps],
        }


def _decimal(text: str, what: str, limit: int) -> int:
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise MalformedError(f"sealed queue metadata: {what} is not a decimal number: {text!r}")
    number = int(text)
    if number > limit:
        raise MalformedError(f"sealed queue metadata: {what} is past {limit}")
    return number


def parse(meta: Mapping[str, str], owner: bytes) -> Sealing | None:
    """The sealing ``meta`` states (None: the queue is not sealed); MalformedError if its layout is broken.

    Keys under ``sealed.`` that are not part of this layout are ignored (a later version may add some)."""
    current = meta.get(EPOCH_KEY)
    if current is None:
        return None
    last = _decimal(current, EPOCH_KEY, MAX_EPOCH)
    if last >= len(meta):  # every epoch has a start key: bounds the loop below by the metadata's size
        raise MalformedError(f"sealed queue metadata: epoch {last} without the starts of the earlier ones")
    wraps: list[dict[bytes, bytes]] = [{} for _ in range(last + 1)]
    for key, value in meta.items():
        if not key.startswith(_WRAP):
            continue
        epoch_text, _, reader_hex = key[len(_WRAP) :].partition(".")
        epoch = _decimal(epoch_text, key, MAX_EPOCH)
        if epoch > last:
            raise MalformedError(f"sealed queue metadata: {key} is for an epoch after the current one")
        try:
            reader = bytes.fromhex(reader_hex)
            wrapped = base64.b64decode(value.encode("ascii"), validate=True)
        except (ValueError, binascii.Error) as exc:
            raise MalformedError(f"sealed queue metadata: {key} does not decode") from exc
        if len(reader) != 32 or reader_hex != reader.hex() or len(wrapped) != WRAP_SIZE:
            raise MalformedError(f"sealed queue metadata: {key} is not a wrapped key for a public key")
        wraps[epoch][reader] = wrapped
    epochs = []
    previous = 0
    for number in range(last + 1):
        text = meta.get(start_key(number))
        if text is None:
            raise MalformedError(f"sealed queue metadata: no start offset for epoch {number}")
        start = _decimal(text, start_key(number), 2**63 - 1)
        if start < previous:
            raise MalformedError(f"sealed queue metadata: epoch {number} starts before epoch {number - 1}")
        previous = start
        epochs.append(Epoch(number, start, wraps[number]))
    if owner not in epochs[-1].wraps:
        raise MalformedError("sealed queue metadata: the current epoch is not wrapped to its owner")
    return Sealing(owner, tuple(epochs))


def _wraps(epoch: int, content_key: bytes, readers: Iterable[bytes], rand: Random) -> dict[str, str]:
    return {
        wrap_key(epoch, reader): base64.b64encode(wrap_content_key(content_key, reader, rand(32))).decode()
        for reader in sorted(set(readers))
    }


def _check_new_key(content_key: bytes) -> None:
    if len(content_key) != KEY_SIZE:
        raise MalformedError(f"a content key is {KEY_SIZE} bytes")


def seal_new(owner: bytes, readers: Iterable[bytes], content_key: bytes, rand: Random) -> dict[str, str]:
    """The metadata of a new sealed queue: epoch 0 from offset 0, wrapped to the owner and ``readers``."""
    _check_new_key(content_key)
    return {
        EPOCH_KEY: "0",
        start_key(0): "0",
        **_wraps(0, content_key, {owner, *readers}, rand),
    }


def share(sealing: Sealing, reader: bytes, keys: Mapping[int, bytes], rand: Random) -> dict[str, str]:
    """Metadata updates that give ``reader`` the content keys in ``keys`` (epoch -> key, opened by the
    owner), skipping epochs it already holds."""
    updates: dict[str, str] = {}
    for number, content_key in sorted(keys.items()):
        if reader not in sealing.epochs[number].wraps:
            updates.update(_wraps(number, content_key, (reader,), rand))
    return updates


def rotate(
    sealing: Sealing, content_key: bytes, readers: Iterable[bytes], start: int, rand: Random
) -> dict[str, str]:
    """Metadata updates that start a new epoch at offset ``start`` under ``content_key``, wrapped to the
    owner and ``readers`` (earlier epochs keep their wraps: records sealed under them stay readable to
    whoever could read them)."""
    _check_new_key(content_key)
    number = sealing.current.number + 1
    if number > MAX_EPOCH:
        raise MalformedError(f"a sealed queue has at most {MAX_EPOCH} key epochs")
    if start < sealing.current.start:
        raise MalformedError("a new key epoch cannot start before the current one")
    return {
        EPOCH_KEY: str(number),
        start_key(number): str(start),
        **_wraps(number, content_key, {sealing.owner, *readers}, rand),
    }


__all__ = [
    "EPOCH_KEY",
    "PREFIX",
    "Epoch",
    "Random",
    "Sealing",
    "is_reserved",
    "is_sealed",
    "parse",
    "rotate",
    "seal_new",
    "share",
    "start_key",
    "wrap_key",
]
