"""The replication protocol's messages: a frozen dataclass each, and one table that encodes and decodes them.

Each message travels as a msgpack array whose first item is its type code (version 1 of the protocol;
the layouts are those of every release so far):

* ``HELLO [0, version, subscription, incarnation]`` — once, first. ``subscription`` is None (everything)
  or a list of ``OWNER/NAME`` glob patterns the sender wants to receive. ``incarnation`` (16 random bytes
  per run of the sending daemon; may be absent) tells the peer whether what it remembers of us from an
  earlier connection still holds.
* ``DIGEST [1, entries]`` — per queue ``[owner, name, kind, summary]``: what the sender holds.
* ``DELTA [2, seq, delta]`` — a verifiable chunk of a queue (see :func:`latticed.crdt.queue.delta`).
* ``ACK [3, seq, owner, name, kind, summary]`` — the delta was verified and stored; here is what I hold now.
* ``HAVE [4, owner, name, kind, summary]`` — lazy notification on a pruned link (Plumtree).
* ``WANT [5, owner, name, kind, summary]`` — graft: make this link eager for the queue and send me the rest.
* ``PRUNE [6, owner, name, kind]`` — your delta brought nothing new; send me HAVEs instead of data.
* ``PING [7, nonce]`` / ``PONG [8, nonce]`` — liveness.

A link that agreed on the ``compact`` feature also carries DELTA, ACK and HAVE in the encodings of
:mod:`latticed.protocol.compact` (type codes 16-18, :data:`COMPACT_NAMES`), which decode with the link's
memory rather than from this table.

What each means to a session is in :mod:`latticed.protocol.replication`. Here is only the shape, in one
place (:data:`MESSAGES`), so a layout cannot drift between the code that builds a message and the code
that reads it. Decoding is strict: a message that is not exactly one of these layouts, with every field of
its type, is a :class:`~latticed.errors.RemoteProtocolError` (never an IndexError or TypeError), raised
before anything of it reaches the session.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, Generic, TypeVar

from latticed.crdt.core_errors import MalformedError
from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.wire import (
    delta_from_wire,
    delta_to_wire,
    pack,
    summary_from_wire,
    summary_to_wire,
    unpack,
)
from latticed.errors import LocalProtocolError, RemoteProtocolError
from latticed.protocol.versions import LinkVersions, incompatible, ours
from latticed.version import PROTOCOL_VERSIONS

__all__ = [
    "ACK",
    "COMPACT_ACK",
    "COMPACT_DELTA",
    "COMPACT_HAVES",
    "COMPACT_NAMES",
    "DELTA",
    "DIGEST",
    "HAVE",
    "HELLO",
    "MESSAGES",
    "PING",
    "PONG",
    "PROTOCOL_VERSION",
    "PRUNE",
    "WANT",
    "Ack",
    "Delta",
    "Digest",
    "Have",
    "Hello",
    "Message",
    "MessageCodec",
    "MessageType",
    "Ping",
    "Pong",
    "Prune",
    "QueueKey",
    "Want",
    "check_key",
    "decode_message",
    "decode_raw",
    "encode_message",
    "message_type_name",
    "unpack_message",
]

#: The version a HELLO is sent in: the lowest this build speaks, so every peer of the releases it promises
#: to sync with reads it (see :mod:`latticed.protocol.versions` for how a link settles on a version).
PROTOCOL_VERSION: Final = PROTOCOL_VERSIONS[0]

QueueKey = tuple[bytes, str, int]  # owner, name, kind


class MessageType(IntEnum):
    """The first item of every message."""

    HELLO = 0
    DIGEST = 1
    DELTA = 2
    ACK = 3
    HAVE = 4
    WANT = 5
    PRUNE = 6
    PING = 7
    PONG = 8


HELLO, DIGEST, DELTA, ACK, HAVE, WANT, PRUNE, PING, PONG = MessageType

#: Type codes of the ``compact`` feature's encodings (:mod:`latticed.protocol.compact`), which decode
#: with the link's memory, not from this table; the names traffic counters give them.
COMPACT_DELTA: Final = 16
COMPACT_ACK: Final = 17
COMPACT_HAVES: Final = 18
COMPACT_NAMES: Final = {COMPACT_DELTA: "delta", COMPACT_ACK: "ack", COMPACT_HAVES: "have"}


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    #: None: everything; otherwise ``OWNER/NAME`` glob patterns (empty: nothing).
    subscription: tuple[str, ...] | None
    #: 16 bytes, random per run of the sender; None from peers that send none.
    incarnation: bytes | None = None


@dataclass(frozen=True, slots=True)
class Digest:
    entries: tuple[tuple[QueueKey, Summary], ...]


@dataclass(frozen=True, slots=True)
class Delta:
    seq: int
    delta: QueueDelta


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int
    key: QueueKey
    summary: Summary


@dataclass(frozen=True, slots=True)
class Have:
    key: QueueKey
    summary: Summary


@dataclass(frozen=True, slots=True)
class Want:
    key: QueueKey
    summary: Summary


@dataclass(frozen=True, slots=True)
class Prune:
    key: QueueKey


@dataclass(frozen=True, slots=True)
class Ping:
    nonce: int


@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int


Message = Hello | Digest | Delta | Ack | Have | Want | Prune | Ping | Pong
M = TypeVar("M", Hello, Digest, Delta, Ack, Have, Want, Prune, Ping, Pong)


# ------------------------------------------------------------------------------------------ field decoders


def _int(raw: Any, what: str) -> int:
    if type(raw) is not int:  # not a bool either
        raise RemoteProtocolError(f"{what} must be an integer")
    return raw


def check_key(owner: Any, name: Any, kind: Any) -> QueueKey:
    """A queue key from its three wire fields, or a :class:`RemoteProtocolError`."""
    if type(owner) is not bytes or len(owner) != 32:
        raise RemoteProtocolError("owner must be a 32-byte key")
    if type(name) is not str or type(kind) is not int:
        raise RemoteProtocolError("queue name must be text and kind an integer")
    return (owner, name, kind)


def _key_to_wire(key: QueueKey) -> list[Any]:
    return [key[0], key[1], key[2]]


def _decode_hello(raw: list[Any]) -> Hello:
    # Another version's HELLO is refused before its other fields are read: their layout is that version's.
    # A peer sends its HELLO in the lowest version it speaks, so one we do not speak means no version in
    # common: say so with both sides' versions (an IncompatiblePeerError, not a generic protocol error).
    if type(raw[1]) is not int:
        raise RemoteProtocolError(f"unsupported protocol version {raw[1]!r}")
    if raw[1] not in PROTOCOL_VERSIONS:
        raise incompatible(ours(), LinkVersions(None, (raw[1],)))
    if len(raw) not in (3, 4):
        raise RemoteProtocolError(f"HELLO has 3 or 4 items, not {len(raw)}")
    sub = raw[2]
    if sub is not None and (type(sub) is not list or not all(type(p) is str for p in sub)):
        raise RemoteProtocolError("subscription must be a list of patterns")
    incarnation = raw[3] if len(raw) == 4 else None
    if incarnation is not None and (type(incarnation) is not bytes or len(incarnation) != 16):
        raise RemoteProtocolError("an incarnation is 16 bytes")
    return Hello(raw[1], None if sub is None else tuple(sub), incarnation)


def _encode_hello(m: Hello) -> list[Any]:
    sub = None if m.subscription is None else list(m.subscription)
    return [m.version, sub] if m.incarnation is None else [m.version, sub, m.incarnation]


def _decode_digest(raw: list[Any]) -> Digest:
    if type(raw[1]) is not list:
        raise RemoteProtocolError("DIGEST entries must be a list")
    entries = []
    for entry in raw[1]:
        if type(entry) is not list or len(entry) != 4:
            raise RemoteProtocolError("a DIGEST entry is [owner, name, kind, summary]")
        entries.append((check_key(entry[0], entry[1], entry[2]), summary_from_wire(entry[3])))
    return Digest(tuple(entries))


def _encode_digest(m: Digest) -> list[Any]:
    return [[[key[0], key[1], key[2], summary_to_wire(summary)] for key, summary in m.entries]]


# ------------------------------------------------------------------------------------------------ the table

_HELLO_LENGTHS: Final = range(2, 1 << 32)


@dataclass(frozen=True, slots=True)
class MessageCodec(Generic[M]):
    """One row of :data:`MESSAGES`: a type code, its class, how many items its array has (type code
    included), and the functions from a message to the items after the code and back from the array."""

    code: MessageType
    cls: type[M]
    lengths: Container[int]
    encode: Callable[[M], list[Any]]
    decode: Callable[[list[Any]], M]


MESSAGES: Final[tuple[MessageCodec[Any], ...]] = (
    # HELLO's length is checked after its version (see _decode_hello).
    MessageCodec(HELLO, Hello, _HELLO_LENGTHS, _encode_hello, _decode_hello),
    MessageCodec(DIGEST, Digest, (2,), _encode_digest, _decode_digest),
    MessageCodec(
        DELTA,
        Delta,
        (3,),
        lambda m: [m.seq, delta_to_wire(m.delta)],
        lambda raw: Delta(_int(raw[1], "DELTA seq"), delta_from_wire(raw[2])),
    ),
    MessageCodec(
        ACK,
        Ack,
        (6,),
        lambda m: [m.seq, *_key_to_wire(m.key), summary_to_wire(m.summary)],
        lambda raw: Ack(
            _int(raw[1], "ACK seq"), check_key(raw[2], raw[3], raw[4]), summary_from_wire(raw[5])
        ),
    ),
    MessageCodec(
        HAVE,
        Have,
        (5,),
        lambda m: [*_key_to_wire(m.key), summary_to_wire(m.summary)],
        lambda raw: Have(check_key(raw[1], raw[2], raw[3]), summary_from_wire(raw[4])),
    ),
    MessageCodec(
        WANT,
        Want,
        (5,),
        lambda m: [*_key_to_wire(m.key), summary_to_wire(m.summary)],
        lambda raw: Want(check_key(raw[1], raw[2], raw[3]), summary_from_wire(raw[4])),
    ),
    MessageCodec(PRUNE, Prune, (4,), lambda m: _key_to_wire(m.key), lambda raw: Prune(check_key(*raw[1:]))),
    MessageCodec(PING, Ping, (2,), lambda m: [m.nonce], lambda raw: Ping(_int(raw[1], "PING nonce"))),
    MessageCodec(PONG, Pong, (2,), lambda m: [m.nonce], lambda raw: Pong(_int(raw[1], "PONG nonce"))),
)

_BY_CODE: Final[dict[int, MessageCodec[Any]]] = {int(row.code): row for row in MESSAGES}
_BY_CLASS: Final[dict[type[Any], MessageCodec[Any]]] = {row.cls: row for row in MESSAGES}
assert len(_BY_CODE) == len(_BY_CLASS) == len(MessageType), "one row per message type"


def encode_message(message: Message) -> bytes:
    """The wire bytes of ``message``; only the types in :data:`MESSAGES` encode."""
    row = _BY_CLASS.get(type(message))
    if row is None:
        raise LocalProtocolError(f"not a replication message: {type(message).__name__}")
    return pack([int(row.code), *row.encode(message)])


def unpack_message(payload: bytes, max_bytes: int = 16 * 1024 * 1024) -> list[Any]:
    """The msgpack array of a message, its type code (an int) first, or :class:`RemoteProtocolError`."""
    try:
        raw = unpack(payload, max_bytes)
    except MalformedError as exc:
        raise RemoteProtocolError(f"bad message from peer: {exc}") from exc
    if type(raw) is not list or not raw or type(raw[0]) is not int:
        raise RemoteProtocolError("a message is a list starting with its type")
    return raw


def decode_message(payload: bytes, max_bytes: int = 16 * 1024 * 1024) -> Message:
    """The message in ``payload``; anything else (undecodable, unknown type, a field of the wrong type or
    an item too many or too few) raises :class:`RemoteProtocolError`."""
    return decode_raw(unpack_message(payload, max_bytes))


def decode_raw(raw: list[Any]) -> Message:
    """:func:`decode_message` of an array :func:`unpack_message` returned."""
    row = _BY_CODE.get(raw[0])
    if row is None:
        raise RemoteProtocolError(f"unknown message type {raw[0]}")
    if len(raw) not in row.lengths:
        raise RemoteProtocolError(f"{row.code.name} has another number of items than {len(raw)}")
    try:
        message: Message = row.decode(raw)
    except MalformedError as exc:  # from the queue's own wire decoders (summaries, deltas)
        raise RemoteProtocolError(f"bad {row.code.name} from peer: {exc}") from exc
    return message


def message_type_name(payload: bytes) -> str:
    """The type of a message on a replication link, read without decoding it (for traffic counters):
    ``delta``, ``ack``... for this protocol's, ``other`` for anything else (lease forwarding, garbage)."""
    if len(payload) >= 2 and 0x91 <= payload[0] <= 0x9F:
        return _TYPE_NAMES[payload[1]]
    return "other"


#: Each first byte's type name (a table: the counters read one per message on a busy link).
_TYPE_NAMES: Final = tuple(
    MessageType(code).name.lower() if code <= MessageType.PONG else COMPACT_NAMES.get(code, "other")
    for code in range(256)
)
