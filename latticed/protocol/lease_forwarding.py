"""Lease forwarding between daemons: a sans-IO request/answer sub-protocol on the replication link.

A worker on daemon B consumes a group that daemon A owns: B forwards each lease operation (take leases,
ack, nack, extend, ...) to A, and A, the only daemon that grants leases of its groups, answers. This module
is the wire format and the bookkeeping of that exchange for one link, without sockets or clocks: the host
(:mod:`latticed.net.leasing`) feeds it messages and the time, and takes messages to send and events.

The messages share the authenticated, encrypted replication link with the replication protocol
(:mod:`latticed.protocol.replication`, types 0-8); the link's reader hands over every message for which
:func:`is_leasing_message` holds. Each is a msgpack array of at most 15 items whose first item is its type:

* ``REQUEST [64, rid, op, body]``: ``rid`` a positive integer, strictly increasing per link and
  direction; ``op`` text; ``body`` a map with text keys (the host defines the ops and their bodies).
* ``ANSWER [65, rid, body]``: the request's result.
* ``REFUSAL [66, rid, code, message]``: it failed with the :class:`~latticed.errors.LatticedError` whose
  ``code`` this is, so the requester raises the same typed error (:func:`error_for`).
* ``CANCEL [67, rid]``: the requester no longer waits (its client hung up, or it gave up): the answerer
  stops working on it. An answer already on its way still arrives, as a :class:`LateAnswer`, so that what
  it granted can be given back.

Timeouts are events: :meth:`LeasingSession.expire` turns each request whose deadline passed into
:class:`TimedOut` (and tells the peer with a CANCEL); :meth:`LeasingSession.close` turns every request
still pending when the link ends into :class:`LinkLost`. Whether to retry is the host's call.

Everything is bounded: requests pending per link (``max_outgoing``), requests being answered
(``max_incoming``: more are refused at once with a :class:`~latticed.errors.CapacityError`), and
requests given up whose late answers are still expected (``max_late``). Malformed input raises
:class:`LeasingProtocolError`, a :class:`~latticed.errors.RemoteProtocolError`: the host closes that link.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from latticed import errors
from latticed.crdt.wire import pack, unpack
from latticed.errors import CapacityError, LatticedError, LocalProtocolError, RemoteProtocolError

REQUEST: Final = 64
ANSWER: Final = 65
REFUSAL: Final = 66
CANCEL: Final = 67
#: Message types of this sub-protocol (the replication protocol uses 0-8; 64-79 are reserved for this one).
LEASING_TYPES: Final = range(64, 80)

MAX_OP_CHARS: Final = 64
MAX_CODE_CHARS: Final = 64
MAX_REFUSAL_CHARS: Final = 4096
DEFAULT_MAX_OUTGOING: Final = 4096
DEFAULT_MAX_INCOMING: Final = 4096
DEFAULT_MAX_LATE: Final = 4096


class LeasingProtocolError(RemoteProtocolError):
    """The peer broke the lease-forwarding protocol (a malformed message, an answer to no request)."""

    code = "leasing_protocol"


def is_leasing_message(payload: bytes) -> bool:
    """Whether a message on a replication link belongs to this sub-protocol (checked without decoding:
    a msgpack fixarray whose first item, the type, is a positive fixint in :data:`LEASING_TYPES`)."""
    return len(payload) >= 2 and 0x91 <= payload[0] <= 0x9F and payload[1] in LEASING_TYPES


def error_for(code: str, message: str) -> LatticedError:
    """The typed error a REFUSAL stands for (a code this build does not know: a plain LatticedError)."""
    cls = _error_classes().get(code)
    if cls is None:
        exc = LatticedError(message)
        exc.code = code
        return exc
    return cls(message)


def _error_classes() -> dict[str, type[LatticedError]]:
    out: dict[str, type[LatticedError]] = {}
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, LatticedError):
            out[cls.code] = cls
    return out


# ------------------------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class Request:
    """The peer asks: answer with :meth:`LeasingSession.answer` or :meth:`LeasingSession.refuse`."""

    rid: int
    op: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The peer no longer waits for its request ``rid`` (stop working on it; answering is harmless)."""

    rid: int


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to our request ``rid``."""

    rid: int
    op: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Our request ``rid`` failed at the peer with ``error``."""

    rid: int
    op: str
    error: LatticedError


@dataclass(frozen=True, slots=True)
class TimedOut:
    """No answer to our request ``rid`` by its deadline (the peer was told to stop with a CANCEL)."""

    rid: int
    op: str


@dataclass(frozen=True, slots=True)
class LinkLost:
    """The link ended with our request ``rid`` unanswered: the peer may or may not have acted on it."""

    rid: int
    op: str


@dataclass(frozen=True, slots=True)
class LateAnswer:
    """An answer to a request we gave up on (timed out or cancelled): give back what it granted."""

    rid: int
    op: str
    body: dict[str, Any]


Event = Request | Cancelled | Answer | Refusal | TimedOut | LinkLost | LateAnswer


# ----------------------------------------------------------------------------------------------- session


class LeasingSession:
    """Both directions of the sub-protocol on one link (see the module docstring)."""

    def __init__(
        self,
        *,
        max_message_bytes: int = 1 << 20,
        max_outgoing: int = DEFAULT_MAX_OUTGOING,
        max_incoming: int = DEFAULT_MAX_INCOMING,
        max_late: int = DEFAULT_MAX_LATE,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.max_outgoing = max_outgoing
        self.max_incoming = max_incoming
        self.max_late = max_late
        self._next_rid = 1
        self._pending: dict[int, tuple[str, float]] = {}  # rid -> (op, deadline)
        self._deadlines: list[tuple[float, int]] = []  # heap; entries of answered rids are dropped lazily
        self._given_up: OrderedDict[int, str] = OrderedDict()
        self._incoming: set[int] = set()
        self._last_incoming = 0
        self._outbox: list[bytes] = []
        self._events: deque[Event] = deque()
        self._closed = False
        #: Answers to rids we had forgotten (given up on longer ago than ``max_late`` allows).
        self.stray_answers = 0

    # ------------------------------------------------------------------ our requests
    def request(self, op: str, body: Mapping[str, Any], *, now: float, timeout: float) -> int:
        """Send a request; its answer (or :class:`TimedOut` after ``timeout`` seconds) comes as an event."""
        if self._closed:
            raise LocalProtocolError("the link is closed")
        if not isinstance(op, str) or not 0 < len(op) <= MAX_OP_CHARS:
            raise LocalProtocolError(f"an op is text of 1-{MAX_OP_CHARS} characters")
        if len(self._pending) >= self.max_outgoing:
            raise CapacityError(f"{self.max_outgoing} forwarded requests already wait for this peer")
        rid = self._next_rid
        self._next_rid += 1
        message = pack([REQUEST, rid, op, dict(body)])
        if len(message) > self.max_message_bytes:
            raise LocalProtocolError(f"request {op} is larger than a message may be")
        deadline = now + timeout
        self._pending[rid] = (op, deadline)
        heapq.heappush(self._deadlines, (deadline, rid))
        self._outbox.append(message)
        return rid

    def cancel(self, rid: int) -> None:
        """Stop waiting for ``rid``: the peer is told, and a late answer becomes a :class:`LateAnswer`."""
        entry = self._pending.pop(rid, None)
        if entry is None:
            return
        self._give_up(rid, entry[0])
        if not self._closed:
            self._outbox.append(pack([CANCEL, rid]))

    def expire(self, now: float) -> None:
        """Turn every request whose deadline has come into :class:`TimedOut` (and a CANCEL to the peer)."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, rid = heapq.heappop(heap)
            entry = self._pending.get(rid)
            if entry is not None and entry[1] <= now:
                self.cancel(rid)
                self._events.append(TimedOut(rid, entry[0]))

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (None: no request is waiting)."""
        heap, pending = self._deadlines, self._pending
        while heap and (heap[0][1] not in pending or pending[heap[0][1]][1] != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    @property
    def pending(self) -> int:
        """Our requests waiting for an answer."""
        return len(self._pending)

    # ------------------------------------------------------------------ the peer's requests
    def answer(self, rid: int, body: Mapping[str, Any]) -> None:
        """Answer the peer's request ``rid`` (once; a cancelled one may still be answered)."""
        self._finish(rid)
        message = pack([ANSWER, rid, dict(body)])
        if len(message) > self.max_message_bytes:
            raise LocalProtocolError(f"the answer to request {rid} is larger than a message may be")
        self._outbox.append(message)

    def refuse(self, rid: int, error: LatticedError) -> None:
        """Answer the peer's request ``rid`` with a typed error."""
        self._finish(rid)
        text = (str(error) or type(error).__name__)[:MAX_REFUSAL_CHARS]
        self._outbox.append(pack([REFUSAL, rid, error.code[:MAX_CODE_CHARS], text]))

    def _finish(self, rid: int) -> None:
        if rid not in self._incoming:
            raise LocalProtocolError(f"no request {rid} of the peer is waiting for an answer")
        self._incoming.discard(rid)

    @property
    def incoming(self) -> int:
        """The peer's requests not answered yet."""
        return len(self._incoming)

    # ------------------------------------------------------------------ the link
    def receive(self, payload: bytes) -> None:
        """Feed one message from the peer; a malformed one raises :class:`LeasingProtocolError`."""
        try:
            message = unpack(payload, self.max_message_bytes)
        except LatticedError as exc:
            raise LeasingProtocolError(f"bad lease-forwarding message: {exc}") from exc
        if type(message) is not list or not message or message[0] not in (REQUEST, ANSWER, REFUSAL, CANCEL):
            raise LeasingProtocolError("a lease-forwarding message is a list starting with its type")
        kind = message[0]
        if kind == REQUEST:
            self._on_request(message)
        elif kind == ANSWER:
            _expect(message, 3)
            self._on_answer(_rid(message[1]), _body(message[2]))
        elif kind == REFUSAL:
            _expect(message, 4)
            code, text = message[2], message[3]
            if not isinstance(code, str) or not 0 < len(code) <= MAX_CODE_CHARS:
                raise LeasingProtocolError("a refusal's code is short text")
            if not isinstance(text, str) or len(text) > MAX_REFUSAL_CHARS:
                raise LeasingProtocolError(f"a refusal's message is text of at most {MAX_REFUSAL_CHARS}")
            self._on_refusal(_rid(message[1]), error_for(code, text))
        else:
            _expect(message, 2)
            rid = _rid(message[1])
            if rid > self._last_incoming:
                raise LeasingProtocolError(f"CANCEL of request {rid}, which was never sent")
            if rid in self._incoming:
                self._events.append(Cancelled(rid))

    def _on_request(self, message: list[Any]) -> None:
        _expect(message, 4)
        rid, op, body = _rid(message[1]), message[2], _body(message[3])
        if not isinstance(op, str) or not 0 < len(op) <= MAX_OP_CHARS:
            raise LeasingProtocolError(f"an op is text of 1-{MAX_OP_CHARS} characters")
        if rid <= self._last_incoming:
            raise LeasingProtocolError(f"request ids must increase (got {rid} after {self._last_incoming})")
        self._last_incoming = rid
        self._incoming.add(rid)
        if len(self._incoming) > self.max_incoming:
            self.refuse(
                rid, CapacityError(f"this daemon answers at most {self.max_incoming} requests at once")
            )
            return
        self._events.append(Request(rid, op, body))

    def _on_answer(self, rid: int, body: dict[str, Any]) -> None:
        self._check_ours(rid)
        entry = self._pending.pop(rid, None)
        if entry is not None:
            self._events.append(Answer(rid, entry[0], body))
            return
        op = self._given_up.pop(rid, None)
        if op is not None:
            self._events.append(LateAnswer(rid, op, body))
        else:
            self.stray_answers += 1

    def _on_refusal(self, rid: int, error: LatticedError) -> None:
        self._check_ours(rid)
        entry = self._pending.pop(rid, None)
        if entry is not None:
            self._events.append(Refusal(rid, entry[0], error))
        else:  # nothing was granted: a given-up request needs nothing given back
            self._given_up.pop(rid, None)

    def _check_ours(self, rid: int) -> None:
        if rid >= self._next_rid:
            raise LeasingProtocolError(f"an answer to request {rid}, which was never sent")

    def _give_up(self, rid: int, op: str) -> None:
        self._given_up[rid] = op
        while len(self._given_up) > self.max_late:
            self._given_up.popitem(last=False)

    def close(self) -> None:
        """The link ended: every pending request becomes :class:`LinkLost`; nothing more is sent."""
        if self._closed:
            return
        self._closed = True
        for rid, (op, _) in sorted(self._pending.items()):
            self._events.append(LinkLost(rid, op))
        self._pending.clear()
        self._deadlines.clear()
        self._given_up.clear()
        self._incoming.clear()
        self._outbox.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def messages_to_send(self) -> list[bytes]:
        out, self._outbox = self._outbox, []
        return out

    def has_output(self) -> bool:
        return bool(self._outbox)


def _expect(message: list[Any], length: int) -> None:
    if len(message) != length:
        raise LeasingProtocolError(f"message type {message[0]} has {length} fields, not {len(message)}")


def _rid(value: Any) -> int:
    if type(value) is not int or not 0 < value < 2**63:
        raise LeasingProtocolError("a request id is a positive integer")
    return value


def _body(value: Any) -> dict[str, Any]:
    if type(value) is not dict or not all(isinstance(k, str) for k in value):
        raise LeasingProtocolError("a body is a map with text keys")
    return value


__all__ = [
    "ANSWER",
    "CANCEL",
    "LEASING_TYPES",
    "REFUSAL",
    "REQUEST",
    "Answer",
    "Cancelled",
    "Event",
    "LateAnswer",
    "LeasingProtocolError",
    "LeasingSession",
    "LinkLost",
    "Refusal",
    "Request",
    "TimedOut",
    "error_for",
    "is_leasing_message",
]
