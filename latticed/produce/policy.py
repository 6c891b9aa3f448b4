"""Who may offer into a queue its owner signs, and how a record says who offered it.

The allow-list is the queue's signed metadata key ``producers``: absent, only the owner writes (its own
clients); ``*``, any daemon of the network (any peer holding the network key); else a JSON list of
identities. Since it is signed metadata, every replica sees the same list the owner enforces.

Every record the owner commits for a producer carries the header :data:`PRODUCER_HEADER` whose value is
the hex identity of the daemon it came from, as the owner authenticated it on the link (or the owner's
own identity for its local producers). The owner refuses a record that already carries that header, so a
reader can trust it as far as it trusts the owner's signature.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from latticed.crdt.signing import parse_public_key
from latticed.errors import MalformedError

#: Metadata key of a queue holding its producer allow-list.
PRODUCERS_META_KEY: Final = "producers"
#: The allow-list value for "any daemon of the network".
EVERYONE: Final = "*"
#: Header the owner sets on each record a producer offered: the producer's hex identity.
PRODUCER_HEADER: Final = "lattice.producer"


@dataclass(frozen=True, slots=True)
class Producers:
    """A queue's producer allow-list (``everyone``: any peer of the network; else ``ids``)."""

    everyone: bool
    ids: frozenset[bytes]

    def allows(self, peer: bytes) -> bool:
        return self.everyone or peer in self.ids

    def describe(self) -> str | list[str]:
        return EVERYONE if self.everyone else sorted(i.hex() for i in self.ids)


NOBODY: Final = Producers(False, frozenset())


def producers_of(meta: Mapping[str, str]) -> Producers:
    """The allow-list a queue's metadata states (absent: nobody but the owner)."""
    text = meta.get(PRODUCERS_META_KEY)
    if text is None:
        return NOBODY
    if text.strip() == EVERYONE:
        return Producers(True, frozenset())
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise MalformedError(f"metadata {PRODUCERS_META_KEY!r} is '*' or a JSON list of identities") from exc
    if type(items) is not list or not all(isinstance(i, str) for i in items):
        raise MalformedError(f"metadata {PRODUCERS_META_KEY!r} is '*' or a JSON list of identities")
    return Producers(False, frozenset(parse_public_key(i) for i in items))


def producers_meta(allowed: Iterable[str] | None) -> dict[str, str | None]:
    """The metadata update storing an allow-list: ``["*"]`` everyone, None or empty nobody (key removed)."""
    items = [a.strip() for a in allowed or () if a.strip()]
    if not items:
        return {PRODUCERS_META_KEY: None}
    if EVERYONE in items:
        if len(items) > 1:
            raise MalformedError("producers are '*' (every daemon of the network) or a list of identities")
        return {PRODUCERS_META_KEY: EVERYONE}
    keys = sorted({parse_public_key(a).hex() for a in items})
    return {PRODUCERS_META_KEY: json.dumps(keys, separators=(",", ":"))}


__all__ = [
    "EVERYONE",
    "NOBODY",
    "PRODUCERS_META_KEY",
    "PRODUCER_HEADER",
    "Producers",
    "producers_meta",
    "producers_of",
]
