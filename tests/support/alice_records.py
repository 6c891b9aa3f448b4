"""One owner's records and queue keys for the core-2 read tests (the batched delta reads and their review)."""

from __future__ import annotations

from latticed.crdt.records import Record, make_record
from latticed.crdt.signing import Identity

ALICE = Identity.from_seed(b"a" * 32)
NOW = 1_700_000_000_000


def rec(tag: str, i: int) -> Record:
    return make_record(f"{tag}{i}".encode(), timestamp=NOW + i)


def key(name: str) -> tuple[bytes, str, int]:
    return (ALICE.public_key, name, 0)
