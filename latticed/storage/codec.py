"""Column encodings: msgpack for the structured columns (headers, metadata, fork proofs, KV entries).

Nothing here is signed: signatures cover the fixed layouts of :mod:`latticed.crdt.head` and
:mod:`latticed.crdt.records`, and stored data is re-verified against those, so the storage encoding can
change with a migration without touching any signature.
"""

from __future__ import annotations

from typing import Any

import msgpack

from latticed.crdt import kv
from latticed.crdt.forks import ForkProof
from latticed.crdt.queue import Meta
from latticed.crdt.records import Headers
from latticed.crdt.wire import proof_from_wire, proof_to_wire
from latticed.errors import MalformedError


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, use_list=True)


def encode_headers(headers: Headers) -> bytes | None:
    """NULL for the common no-header case keeps rows small."""
    return pack(headers) if headers else None


def decode_headers(raw: bytes | None) -> Headers:
    if raw is None:
        return ()
    return tuple((str(name), bytes(value)) for name, value in unpack(raw))


def encode_meta(meta: Meta) -> bytes:
    return pack(meta)


def decode_meta(raw: bytes | None) -> Meta:
    if raw is None:
        return ()
    return tuple((str(k), str(v)) for k, v in unpack(raw))


def encode_proof(proof: ForkProof | None) -> bytes | None:
    return None if proof is None else pack(proof_to_wire(proof))


def decode_proof(raw: bytes | None) -> ForkProof | None:
    return None if raw is None else proof_from_wire(unpack(raw))


def encode_kv_entry(entry: kv.Entry) -> bytes:
    hlc, tiebreak = entry.reset
    members = [[m, s[0], s[1], v] for m, (s, v) in entry.members.items()]
    return pack([entry.kind, hlc, tiebreak, entry.value, entry.expires_ms, members])


def decode_kv_entry(raw: bytes) -> kv.Entry:
    try:
        kind, hlc, tiebreak, value, expires, members = unpack(raw)
        return kv.Entry(
            kind,
            (hlc, tiebreak),
            value,
            expires,
            {m: ((mh, mt), v) for m, mh, mt, v in members},
        )
    except (ValueError, TypeError) as exc:
        raise MalformedError("undecodable KV entry in the store") from exc


__all__ = [
    "decode_headers",
    "decode_kv_entry",
    "decode_meta",
    "decode_proof",
    "encode_headers",
    "encode_kv_entry",
    "encode_meta",
    "encode_proof",
    "pack",
    "unpack",
]
