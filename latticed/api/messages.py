"""The local API's messages: msgpack maps in length-prefixed frames (:mod:`latticed.protocol.framing`).

Request:  ``{"v": 1, "id": n, "op": "...", ...args}``
Reply:    ``{"id": n, "ok": true, ...}`` or ``{"id": n, "ok": false, "error": {"code": c, "message": m}}``

``code`` is a :class:`~latticed.errors.LatticedError` ``code``, so the client re-raises the same class.
Every request names the protocol version it speaks (``v``), so a server can refuse a client from the
future with a clear error instead of misreading it; ``hello`` tells a client which versions exist.

Records travel as columns (parallel lists of offsets, keys, values, timestamps, headers): one msgpack
array per field is cheaper to encode and decode than a map per record, and turns into Arrow arrays
directly. This module is shared by server and client and does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import msgpack

from latticed import errors
from latticed.errors import LatticedError, MalformedError, ProtocolError, RemoteProtocolError, VersionGapError
from latticed.version import API_VERSIONS, PROTOCOL_FEATURES, PROTOCOL_VERSIONS, RELEASE, STORE_SCHEMA, span

#: The versions a daemon answers (latticed/version.py); a client sends the lowest, which every daemon of
#: the releases docs/operations.md promises to sync with answers, and names a version gap when an op is
#: unknown to the daemon (:func:`version_gap`).
SUPPORTED_VERSIONS: Final = API_VERSIONS
API_VERSION: Final = API_VERSIONS[0]
#: The local API version that added ``offer_batch``'s ``packed`` layout (the records as columns); a
#: client sends such a request with this ``v``, to a daemon whose ``hello`` lists it.
PACKED_OFFERS_VERSION: Final = 2

#: Default bounds of one pushed tail batch: a slow reader holds at most this much in the server.
TAIL_BATCH_RECORDS: Final = 1000
TAIL_BATCH_BYTES: Final = 1 << 20
#: Room left in a frame for the reply envelope around the records.
FRAME_OVERHEAD: Final = 64 * 1024

COLUMNS: Final = ("offsets", "keys", "values", "timestamps", "headers")


class Packed(bytes):
    """A value encoded already (msgpack): :func:`pack` splices it into a reply map as the value it
    encodes, so a reply built from many cached parts is not encoded again (``queue list``)."""

    __slots__ = ()

    @classmethod
    def of(cls, obj: Any) -> Packed:
        return cls(pack(obj))


class PackedArray:
    """A msgpack array of values each encoded already, kept as its parts: :func:`pack_parts` splices them
    into a reply map, and the connection joins map and frame once. A ``queue list`` of 30,000 queues is
    ~3.5 MB; joined at each step (array, map, frame) it was copied four times a call."""

    __slots__ = ("header", "items")

    def __init__(self, items: list[bytes]) -> None:
        n = len(items)
        if n < 16:
            self.header = bytes((0x90 | n,))
        elif n < 1 << 16:
            self.header = b"\xdc" + n.to_bytes(2, "big")
        else:
            self.header = b"\xdd" + n.to_bytes(4, "big")
        self.items = list(items)  # its own: a listing goes on changing its list in place

    def __bytes__(self) -> bytes:
        return b"".join([self.header, *self.items])


def pack_array(items: list[bytes]) -> PackedArray:
    """A msgpack array of values each encoded already (their bytes are not copied until sent)."""
    return PackedArray(items)


def holds_packed(obj: Any) -> bool:
    """Whether :func:`pack` splices pre-packed values into ``obj`` (else its bytes are ``packb``'s).

    A set's ``isdisjoint`` over the values' types runs in C: ~0.2 us a request or reply less than a
    generator of ``in`` tests (every request a client sends and every reply the daemon packs asks)."""
    return type(obj) is dict and not _SPLICED.isdisjoint(map(type, obj.values()))


def pack(obj: Any) -> bytes:
    if holds_packed(obj):
        return b"".join(_map_parts(obj))
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def pack_parts(obj: Any) -> list[bytes]:
    """:func:`pack`'s bytes as parts to join (with a frame header, say) in one copy."""
    if holds_packed(obj):
        return _map_parts(obj)
    return [msgpack.packb(obj, use_bin_type=True)]


def _map_parts(obj: dict[Any, Any]) -> list[bytes]:
    """A map with :class:`Packed` and :class:`PackedArray` values, which go in as they are."""
    n = len(obj)
    if n < 16:
        parts = [bytes((0x80 | n,))]
    elif n < 1 << 16:
        parts = [b"\xde" + n.to_bytes(2, "big")]
    else:
        parts = [b"\xdf" + n.to_bytes(4, "big")]
    for key, value in obj.items():
        parts.append(msgpack.packb(key, use_bin_type=True))
        if type(value) is PackedArray:
            parts.append(value.header)
            parts += value.items
        else:
            parts.append(value if type(value) is Packed else msgpack.packb(value, use_bin_type=True))
    return parts


#: Values :func:`pack` splices into a map as they are.
_SPLICED: Final[frozenset[type]] = frozenset((Packed, PackedArray))


def unpack(data: bytes) -> Any:
    """Decode one message; anything that is not msgpack is a MalformedError."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises many unrelated types for bad input
        raise MalformedError(f"not a msgpack message ({type(exc).__name__})") from exc


#: A request frame at least this big is decoded field by field, keeping the encoded bytes of its
#: ``records`` (:class:`Decoded`); a smaller one in one call, which costs less per field.
FIELDS_FROM_BYTES: Final = 1 << 16
#: First bytes of a msgpack map (fixmap, map 16, map 32).
MAP_FIRST_BYTES: Final = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])


class Decoded(dict[Any, Any]):
    """A request map as :func:`unpack` decodes it, which also keeps ``packed_records``: the bytes its
    ``records`` field was sent as (None if it has none). An owner digests a producer's records for its
    retries (:func:`latticed.produce.dedup.offered_digest`) from them instead of packing the decoded
    records again, once it has checked they are the very bytes msgpack packs those records as."""

    __slots__ = ("packed_records",)

    def __init__(self) -> None:
        super().__init__()
        self.packed_records: memoryview | None = None


def unpack_request(data: bytes) -> Any:
    """:func:`unpack`, but a large map comes back as a :class:`Decoded` (the same items)."""
    if len(data) < FIELDS_FROM_BYTES or data[0] not in MAP_FIRST_BYTES:
        return unpack(data)
    view = memoryview(data)
    out = Decoded()
    try:
        unpacker = msgpack.Unpacker(
            None, raw=False, strict_map_key=False, use_list=True, max_buffer_size=len(data)
        )
        unpacker.feed(data)
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            start = unpacker.tell()
            out[key] = unpacker.unpack()
            if type(key) is str and key == "records":  # the last of equal keys wins, as in a dict
                out.packed_records = view[start : unpacker.tell()]
        if unpacker.tell() != len(data):
            raise msgpack.ExtraData(out, data[unpacker.tell() :])
    except Exception as exc:  # msgpack raises many unrelated types for bad input
        raise MalformedError(f"not a msgpack message ({type(exc).__name__})") from exc
    return out


def error_body(exc: LatticedError) -> dict[str, str]:
    return {"code": exc.code, "message": str(exc) or type(exc).__name__}


def _error_classes() -> dict[str, type[LatticedError]]:
    out: dict[str, type[LatticedError]] = {}
    pending: list[type[LatticedError]] = [LatticedError]
    while pending:
        cls = pending.pop()
        out.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, LatticedError):
            out[cls.code] = cls
    return out


def error_from_reply(body: Any) -> LatticedError:
    """The exception a daemon error reply stands for (the inverse of :func:`error_body`)."""
    if not isinstance(body, dict):
        return RemoteProtocolError(f"malformed error reply from latticed: {body!r}")
    code, message = body.get("code"), body.get("message")
    cls = _error_classes().get(code) if isinstance(code, str) else None
    if cls is None:
        exc = LatticedError(str(message))
        exc.code = str(code)
        return exc
    return cls(str(message))


def version_gap(op: str, error: LatticedError, hello: Mapping[str, Any]) -> LatticedError:
    """What a client raises when the daemon answered ``op`` with "unknown op": a VersionGapError naming
    both sides when the daemon is of another release (``hello`` is its answer), else ``error`` itself.
    A daemon states its release in ``hello`` from 0.3 on; 0.2.0 and earlier do not (their ``server``
    string names whatever package is installed, so it cannot tell them apart)."""
    release = hello.get("release")
    if release == RELEASE:
        return error
    if not isinstance(release, str) or not release:
        release = "0.2.0 or earlier"
    versions = hello.get("versions")
    theirs = span(tuple(versions)) if isinstance(versions, list) and versions else "?"
    return VersionGapError(
        f"the daemon runs latticed {release} (local API {theirs}), which does not know {op!r}: this client "
        f"is latticed {RELEASE} (local API {span(API_VERSIONS)}); upgrade the daemon, or use the client of "
        "its release"
    )


def is_unknown_op(error: LatticedError) -> bool:
    """Whether a daemon refused a request because it does not know its op (another release)."""
    return type(error) is ProtocolError and str(error).startswith("unknown op")


def versions_reply() -> dict[str, Any]:
    """The ``versions`` op's answer: everything this build speaks (latticed/version.py)."""
    return {
        "release": RELEASE,
        "wire_protocol": list(PROTOCOL_VERSIONS),
        "features": sorted(PROTOCOL_FEATURES),
        "store_schema": STORE_SCHEMA,
        "local_api": list(API_VERSIONS),
    }


def error_reply(request_id: Any, exc: LatticedError) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": error_body(exc)}


# ------------------------------------------------------------------ argument checks (server side)


def _bad(request: Mapping[str, Any], name: str, expected: str) -> MalformedError:
    value = request.get(name)
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return MalformedError(f"argument {name!r} must be {expected}, got {type(value).__name__} {shown}")


def arg_str(request: Mapping[str, Any], name: str, *, optional: bool = False) -> Any:
    value = request.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _bad(request, name, "a string")
    return value


def arg_bytes(request: Mapping[str, Any], name: str, *, optional: bool = False) -> Any:
    value = request.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, bytes):
        raise _bad(request, name, "bytes")
    return value


def arg_int(
    request: Mapping[str, Any], name: str, *, optional: bool = False, default: int | None = None
) -> Any:
    value = request.get(name)
    if value is None and (optional or default is not None):
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**64:
        raise _bad(request, name, "an integer")
    return value


def arg_bool(request: Mapping[str, Any], name: str, default: bool) -> bool:
    value = request.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(request, name, "true or false")
    return value


def arg_number(request: Mapping[str, Any], name: str) -> float | None:
    value = request.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise _bad(request, name, "a number")
    return float(value)


def parse_headers(value: Any, name: str = "headers") -> tuple[tuple[str, bytes], ...]:
    """Headers as a list of ``[name, value]`` pairs or a map; names are text, values bytes."""
    if value is None:
        return ()
    if isinstance(value, dict):
        value = list(value.items())
    if not isinstance(value, list):
        raise MalformedError(f"{name} must be a list of [name, value] pairs or a map")
    out: list[tuple[str, bytes]] = []
    item: Any
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise MalformedError(f"{name}: each header is [name, value]")
        key, val = item
        if not isinstance(key, str) or not isinstance(val, bytes):
            raise MalformedError(f"{name}: header names are text and values bytes")
        out.append((key, val))
    return tuple(out)


__all__ = [
    "API_VERSION",
    "PACKED_OFFERS_VERSION",
    "is_unknown_op",
    "version_gap",
    "versions_reply",
    "COLUMNS",
    "FIELDS_FROM_BYTES",
    "FRAME_OVERHEAD",
    "MAP_FIRST_BYTES",
    "Decoded",
    "SUPPORTED_VERSIONS",
    "TAIL_BATCH_BYTES",
    "TAIL_BATCH_RECORDS",
    "arg_bool",
    "arg_bytes",
    "arg_int",
    "arg_number",
    "arg_str",
    "error_body",
    "error_reply",
    "holds_packed",
    "Packed",
    "PackedArray",
    "pack",
    "pack_array",
    "pack_parts",
    "parse_headers",
    "unpack",
    "unpack_request",
]
