"""Work-queue calls of the blocking client: :class:`GroupOps` is mixed into
:class:`~latticed.api.client.blocking_client.Client`, :class:`Subscription` is what ``Client.subscribe``
returns.

A subscription holds its own connection: the daemon pushes leases on it (up to the window) and answers
acks sent on it, so a worker needs one socket. ``ack(..., wait=False)`` pipelines: the reply is checked
later (at :meth:`Subscription.flush`, or while reading the next frames), which is how a busy worker keeps
several acks in one group commit.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self, TypedDict, Unpack

from latticed.api.messages import API_VERSION, error_from_reply
from latticed.errors import LatticedError, RemoteProtocolError

HeaderPairs = tuple[tuple[str, bytes], ...]

#: Pipelined requests are held back at most this many, and only while the worker calls again this soon.
_MAX_BUFFERED = 128
_MAX_HOLD_S = 0.001


@dataclass(frozen=True, slots=True)
class Lease:
    """A leased record: ack, nack or extend it with ``lease`` before ``expires_at`` (epoch seconds).

    ``queue``/``offset`` name the record (for a redriven dead letter: its place in the DLQ);
    ``correlation_id`` is the same on every delivery of the record. ``payload_from`` (a group another
    daemon owns): "replica" (this daemon's copy, verified against its queue owner's signature) or
    "owner" (sent by the group's owner, which vouches for it); None for a local group."""

    group: str
    queue: str
    offset: int
    lease: str
    attempt: int
    value: bytes
    key: bytes | None
    headers: HeaderPairs
    correlation_id: str
    timestamp: int
    consumer: str
    expires_at: float
    payload_from: str | None = None


def lease_from_wire(raw: dict[str, Any]) -> Lease:
    headers = tuple((str(k), bytes(v)) for k, v in raw.get("headers") or ())
    return Lease(
        group=raw["group"],
        queue=raw["queue"],
        offset=int(raw["offset"]),
        lease=raw["lease"],
        attempt=int(raw["attempt"]),
        value=bytes(raw["value"]),
        key=None if raw.get("key") is None else bytes(raw["key"]),
        headers=headers,
        correlation_id=raw["correlation_id"],
        timestamp=int(raw["timestamp"]),
        consumer=raw["consumer"],
        expires_at=float(raw["expires_at"]),
        payload_from=str(raw["payload_from"]) if raw.get("payload_from") is not None else None,
    )


def _raise(reply: dict[str, Any]) -> LatticedError:
    return error_from_reply(reply.get("error"))


class FrameStream(Protocol):
    """What a subscription needs of a connection (the client's ``_Connection``)."""

    def send(self, message: dict[str, Any]) -> None: ...

    def send_many(self, messages: Sequence[dict[str, Any]]) -> None: ...

    def receive(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _token(lease: Lease | str) -> str:
    return lease.lease if isinstance(lease, Lease) else lease


class Subscription:
    """Leases pushed by the daemon, as an iterator; settle them here (or from any other client)."""

    def __init__(self, conn: FrameStream, group: str, max_in_flight: int, visibility: float | None) -> None:
        self._conn = conn
        self.group = group
        self._next_id = 2
        self._buffer: deque[Lease] = deque()
        self._unanswered: set[int] = set()
        self._errors: list[LatticedError] = []
        self._replies: dict[int, dict[str, Any]] = {}
        self._out: list[dict[str, Any]] = []
        self._flushed_at = 0.0
        self.released: int | None = None
        conn.send(
            {
                "v": API_VERSION,
                "id": 1,
                "op": "subscribe",
                "group": group,
                "max_in_flight": max_in_flight,
                "visibility": visibility,
            }
        )
        first = conn.receive()
        if not first.get("ok"):
            conn.close()
            raise _raise(first)
        self.consumer: str = first.get("consumer", "")
        self._take(first)

    def _take(self, frame: dict[str, Any]) -> None:
        self._buffer.extend(lease_from_wire(raw) for raw in frame.get("leases") or ())

    def _send_out(self) -> None:
        if self._out:
            out, self._out = self._out, []
            self._conn.send_many(out)
        self._flushed_at = time.monotonic()

    def _pump(self) -> None:
        """Read one frame and file it: pushed leases, a reply we wait for, or a pipelined reply."""
        self._send_out()  # never block with requests unsent
        frame = self._conn.receive()
        rid = frame.get("id")
        if rid == 1:
            if not frame.get("ok"):
                raise _raise(frame)
            self._take(frame)
        elif rid in self._unanswered:
            self._unanswered.discard(rid)
            if not frame.get("ok"):
                self._errors.append(_raise(frame))
        elif isinstance(rid, int):
            self._replies[rid] = frame
        else:
            raise _raise(frame) if not frame.get("ok") else RemoteProtocolError("unexpected frame")

    def __iter__(self) -> Iterator[Lease]:
        return self

    def __next__(self) -> Lease:
        while not self._buffer:
            self._pump()
        return self._buffer.popleft()

    def _request(self, op: str, wait: bool, **args: Any) -> dict[str, Any] | None:
        rid = self._next_id
        self._next_id += 1
        self._out.append({"v": API_VERSION, "id": rid, "op": op, "group": self.group, **args})
        if not wait:
            # A busy worker's pipelined requests go out together; a slow one's at once.
            if len(self._out) >= _MAX_BUFFERED or time.monotonic() - self._flushed_at > _MAX_HOLD_S:
                self._send_out()
            self._unanswered.add(rid)
            return None
        self._send_out()
        while rid not in self._replies:
            self._pump()
        reply = self._replies.pop(rid)
        if not reply.get("ok"):
            raise _raise(reply)
        return reply

    def ack(self, lease: Lease | str, *, wait: bool = True) -> str | None:
        """Settle as done; returns the correlation id (None with ``wait=False``: see :meth:`flush`)."""
        reply = self._request("ack", wait, lease=_token(lease))
        return None if reply is None else reply.get("correlation_id")

    def nack(
        self, lease: Lease | str, delay: float | None = None, *, reason: str | None = None, wait: bool = True
    ) -> None:
        self._request("nack", wait, lease=_token(lease), delay=delay, reason=reason)

    def extend(self, lease: Lease | str, visibility: float) -> float:
        reply = self._request("extend", True, lease=_token(lease), visibility=visibility)
        assert reply is not None
        return float(reply["expires_at"])

    def flush(self) -> None:
        """Wait for the replies of every ``wait=False`` call; raise the first error among them."""
        while self._unanswered:
            self._pump()
        if self._errors:
            first, self._errors = self._errors[0], []
            raise first

    def close(self) -> int:
        """Unsubscribe: leases still held are given back (counted as failed attempts). Returns how many."""
        if self.released is None:
            try:
                reply = self._request("unsubscribe", True)
                self.released = int(reply["released"]) if reply else 0
            except LatticedError:
                self.released = 0
            finally:
                self._conn.close()
        return self.released

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Settings(TypedDict, total=False):
    """A group's settings as the client names them (seconds as floats); left out: default or unchanged."""

    filter: str | None
    max_attempts: int | None
    visibility: float | None
    retry_backoff: float | None
    backoff_cap: float | None
    retention: float | None
    max_consumers: int | None
    max_in_flight: int | None
    description: str | None


class GroupSettings(_Settings, total=False):
    """``group_create``'s settings; ``remote_consumers`` [] means none, None any peer with the network key."""

    remote_consumers: Sequence[str] | None


class GroupEdit(_Settings, total=False):
    """``group_edit``'s settings; ``remote_consumers`` may also be "any" (lifts the allow-list)."""

    remote_consumers: Sequence[str] | str | None


#: Client name -> wire name of each setting, written once for create and edit (the wire says its units).
_WIRE_NAMES = {
    "filter": "filter",
    "max_attempts": "max_attempts",
    "visibility": "visibility_s",
    "retry_backoff": "retry_backoff_s",
    "backoff_cap": "backoff_cap_s",
    "retention": "retention_s",
    "max_consumers": "max_consumers",
    "max_in_flight": "max_in_flight",
    "description": "description",
}


def _settings_to_wire(settings: GroupSettings | GroupEdit) -> dict[str, Any]:
    """Every setting goes on the wire, None where not given, as the daemon reads "not given"."""
    given: dict[str, Any] = dict(settings)
    unknown = given.keys() - _WIRE_NAMES.keys() - {"remote_consumers"}
    if unknown:  # what a plain keyword signature would refuse (the TypedDict only checks typed callers)
        raise TypeError(f"unexpected group setting(s): {', '.join(sorted(unknown))}")
    wire = {wire_name: given.get(name) for name, wire_name in _WIRE_NAMES.items()}
    remote = given.get("remote_consumers")
    wire["remote_consumers"] = remote if remote is None or isinstance(remote, str) else list(remote)
    return wire


class GroupOps:
    """The work-queue methods of :class:`~latticed.api.client.blocking_client.Client`."""

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        raise NotImplementedError

    def call_waiting(self, op: str, wait: float, /, **args: Any) -> dict[str, Any]:
        raise NotImplementedError

    def open_stream(self, timeout: float | None) -> FrameStream:
        raise NotImplementedError

    def group_create(
        self, name: str, queues: Sequence[str], **settings: Unpack[GroupSettings]
    ) -> dict[str, Any]:
        """Define a consumer group over ``queues`` (NAME or OWNER/NAME each); returns its definition.
        ``remote_consumers``: the only daemon identities whose workers may consume it remotely ([]: none;
        None: any peer with the network key)."""
        group: dict[str, Any] = self.call(
            "group_create", name=name, queues=list(queues), **_settings_to_wire(settings)
        )["group"]
        return group

    def group_edit(self, name: str, **settings: Unpack[GroupEdit]) -> dict[str, Any]:
        """Change a group's settings (those given); ``remote_consumers`` "any" lifts the allow-list.
        Returns the new definition (what it does to leases in flight: docs/workqueues.md)."""
        group: dict[str, Any] = self.call("group_edit", group=name, **_settings_to_wire(settings))["group"]
        return group

    def group_delete(self, name: str) -> dict[str, Any]:
        """Delete a group: leases in flight become unknown, dead letters are dropped. Returns counts."""
        reply = self.call("group_delete", group=name)
        return {k: v for k, v in reply.items() if k not in ("id", "ok")}

    def claim(
        self, group: str, min_idle: float, count: int = 1, visibility: float | None = None
    ) -> list[Lease]:
        """Take over leases whose holders have been idle at least ``min_idle`` seconds (at most
        ``count``, the longest idle first); each costs its record an attempt."""
        reply = self.call("claim", group=group, min_idle=min_idle, count=count, visibility=visibility)
        return [lease_from_wire(raw) for raw in reply.get("leases") or ()]

    def group_list(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.call("group_list")["groups"]
        return groups

    def group_stats(self, name: str) -> dict[str, Any]:
        """Counts, ack floors and oldest age (a replica answers with what its copy of the log says)."""
        stats: dict[str, Any] = self.call("group_stats", group=name)["stats"]
        return stats

    def group_inspect(self, name: str, queue: str, offset: int) -> dict[str, Any]:
        task: dict[str, Any] = self.call("group_inspect", group=name, queue=queue, offset=offset)["task"]
        return task

    def dequeue(self, group: str, visibility: float | None = None, wait: float | None = None) -> Lease | None:
        """Lease the next record, or None if none is available (within ``wait`` seconds, if given)."""
        if wait:
            reply = self.call_waiting("dequeue", wait, group=group, visibility=visibility, wait=wait)
        else:
            reply = self.call("dequeue", group=group, visibility=visibility)
        raw = reply.get("lease")
        return None if raw is None else lease_from_wire(raw)

    def ack(self, group: str, lease: Lease | str) -> str:
        """Settle a leased record as done; returns its correlation id. LeaseError if the lease ended."""
        return str(self.call("ack", group=group, lease=_token(lease))["correlation_id"])

    def nack(
        self, group: str, lease: Lease | str, delay: float | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Give a record back: retried after ``delay`` (None: the group's backoff), or dead-lettered on
        its last attempt; ``reason`` (why it failed) is kept in its attempt history. Returns
        ``correlation_id``, ``attempts``, ``retry_at``, ``dead_lettered``."""
        reply = self.call("nack", group=group, lease=_token(lease), delay=delay, reason=reason)
        return {k: v for k, v in reply.items() if k not in ("id", "ok")}

    def extend(self, group: str, lease: Lease | str, visibility: float) -> float:
        """Keep the lease ``visibility`` seconds from now; returns the new expiry (epoch seconds)."""
        return float(
            self.call("extend", group=group, lease=_token(lease), visibility=visibility)["expires_at"]
        )

    def ack_up_to(self, group: str, queue: str, offset: int) -> int:
        """Settle every record of ``queue`` below ``offset``; returns how many were pending."""
        return int(self.call("ack_up_to", group=group, queue=queue, offset=offset)["acked"])

    def subscribe(self, group: str, max_in_flight: int = 1, visibility: float | None = None) -> Subscription:
        """Leases pushed as records become available, at most ``max_in_flight`` unsettled at a time, on a
        dedicated connection; close the subscription to give back what it still holds."""
        return Subscription(self.open_stream(None), group, max_in_flight, visibility)

    def dlq_list(self, group: str, limit: int | None = None) -> list[dict[str, Any]]:
        letters: list[dict[str, Any]] = self.call("dlq_list", group=group, limit=limit)["dead_letters"]
        return letters

    def dlq_show(self, group: str, offset: int) -> dict[str, Any]:
        letter: dict[str, Any] = self.call("dlq_show", group=group, offset=offset)["dead_letter"]
        return letter

    def dlq_redrive(self, group: str, offsets: Sequence[int] | None = None) -> int:
        """Make dead letters (all when None) available again with a fresh attempt budget."""
        return int(
            self.call("dlq_redrive", group=group, offsets=None if offsets is None else list(offsets))["count"]
        )

    def dlq_purge(self, group: str, offsets: Sequence[int] | None = None) -> int:
        return int(
            self.call("dlq_purge", group=group, offsets=None if offsets is None else list(offsets))["count"]
        )


__all__ = ["FrameStream", "GroupOps", "Lease", "Subscription", "lease_from_wire"]
