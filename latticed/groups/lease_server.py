"""The owner's side of remote consumers: answers other daemons' lease requests for the groups this
daemon runs (the worker's side, and what the whole exchange is for: :mod:`latticed.groups.remote`).

A remote consumer is known as ``<first 16 hex digits of its daemon's identity>/<its consumer id there>``;
a daemon may settle only leases granted to its own consumers: ack, nack, extend, fetch and give-back check
the holder, ``claim`` takes over only its consumers' leases, and ``ack_up_to`` settles only a range whose
every unsettled record they hold (never the DLQ: purging dead letters is the owner's). Calls waiting for
records hold no consumer slot and are bounded (:mod:`latticed.groups.waiting`). Who may consume
remotely is the group's allow-list (:func:`~latticed.groups.remote.remote_policy`), checked against the
link's authenticated identity. When a link ends, the consumers behind it are detached: their leases run
out as usual (visibility timeout), and an ack that arrives over a new link before that still counts. A
settlement sent again after a lost link (flagged ``retry``) gets the answer the first one got.

Every body comes from a peer: each field is checked here (a bad one is refused with MalformedError).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from latticed.crdt.attempts import MAX_CONSUMER_BYTES
from latticed.crdt.group import parse_source_id
from latticed.errors import (
    LatticedError,
    LeaseError,
    MalformedError,
    NotAllowedError,
    NotFoundError,
    NotReaderError,
)
from latticed.groups.committer import Flight
from latticed.groups.remote import MAX_TAKE, consumer_prefix, record_wire, remote_policy
from latticed.groups.runtime import GroupRuntime
from latticed.groups.service import GroupService
from latticed.groups.views import live_stats, settled_reply, task_wire
from latticed.groups.waiting import WaitingCalls
from latticed.leases.outcomes import Grant

#: Payload bytes the owner puts in one answer (leases past it are fetched one by one).
MAX_INLINE_BYTES: Final = 256 * 1024
#: Settlements remembered per peer to answer a retried one as it was first answered.
MAX_REMEMBERED_SETTLEMENTS: Final = 65_536
#: Longest wait a remote caller may ask for (as the local API's).
MAX_WAIT_S: Final = 86_400.0
#: A remote consumer id (the part after the daemon's prefix).
MAX_REMOTE_CONSUMER_BYTES: Final = MAX_CONSUMER_BYTES - 17


# ---------------------------------------------------------------------------------------- body checks


def _text(body: Mapping[str, Any], name: str, limit: int = 1024) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not 0 < len(value.encode()) <= limit:
        raise MalformedError(f"{name!r} is text of 1-{limit} bytes")
    return value


def _seconds(body: Mapping[str, Any], name: str, *, positive: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= MAX_WAIT_S:
        raise MalformedError(f"{name!r} is a number of seconds in [0, {MAX_WAIT_S:g}]")
    if positive and value == 0:
        raise MalformedError(f"{name!r} must be positive")
    return float(value)


def _count(body: Mapping[str, Any], name: str, limit: int) -> int:
    value = body.get(name)
    if type(value) is not int or not 0 <= value <= limit:
        raise MalformedError(f"{name!r} is an integer in [0, {limit}]")
    return value


def _tokens(body: Mapping[str, Any]) -> list[str]:
    value = body.get("leases")
    if type(value) is not list or len(value) > 100_000 or not all(isinstance(t, str) for t in value):
        raise MalformedError("'leases' is a list of lease tokens")
    return value


def _have(body: Mapping[str, Any]) -> dict[str, int]:
    value = body.get("have") or {}
    if type(value) is not dict or not all(isinstance(k, str) and type(v) is int for k, v in value.items()):
        raise MalformedError("'have' maps sources to the ends the caller holds")
    return value


# ------------------------------------------------------------------------------------------ owner side

Op = Callable[[bytes, GroupRuntime, dict[str, Any]], Awaitable[dict[str, Any]]]


class RemoteLeaseServer:
    """Answers lease requests of other daemons for the groups this daemon runs (see the module doc)."""

    def __init__(self, service: GroupService) -> None:
        self.service = service
        self.engine = service.engine
        self._settled: OrderedDict[tuple[bytes, str, str], dict[str, Any]] = OrderedDict()
        self._policies: dict[int, tuple[int, frozenset[bytes] | None]] = {}
        self._sealed: dict[str, tuple[int, bool]] = {}
        #: Calls waiting for records, bounded per peer and per group.
        self.waiting = WaitingCalls()
        self._ops: dict[str, Op] = {
            "dequeue": self._dequeue,
            "take": self._take,
            "ack": self._ack,
            "nack": self._nack,
            "extend": self._extend,
            "ack_up_to": self._ack_up_to,
            "release": self._release,
            "give_back": self._give_back,
            "fetch": self._fetch,
            "stats": self._stats,
            "inspect": self._inspect,
            "claim": self._claim,
        }

    def add_op(self, name: str, op: Op) -> None:
        """Answer ``name`` with ``op`` too (later features register theirs)."""
        self._ops[name] = op

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        handler = self._ops.get(op)
        if handler is None:
            raise MalformedError(f"unknown lease op {op[:64]!r}")
        rt = self.runtime(peer, body)
        return await handler(peer, rt, body)

    def peer_gone(self, peer: bytes) -> None:
        prefix = consumer_prefix(peer)
        for rt in self.service.running():
            for consumer in rt.dispatcher.consumers():
                if consumer.startswith(prefix):
                    self.service.detach(rt, consumer)

    def runtime(self, peer: bytes, body: Mapping[str, Any]) -> GroupRuntime:
        name = _text(body, "group", 256)
        rt = self.service.find_running(name) if "/" not in name else None
        if rt is None:
            raise NotFoundError(f"no group {name} runs on {self.engine.public_key.hex()}")
        policy = self.policy(rt)
        if policy is not None and peer not in policy:
            raise NotAllowedError(
                f"group {self.engine.public_key.hex()}/{rt.name} does not take remote consumers from "
                f"{peer.hex()} (not on its allow-list)"
            )
        return rt

    def policy(self, rt: GroupRuntime) -> frozenset[bytes] | None:
        state = self.engine.state(rt.q)
        version = state.head.meta_version if state.head is not None else -1
        cached = self._policies.get(rt.q)
        if cached is None or cached[0] != version:
            try:
                policy = remote_policy(state.meta_dict)
            except LatticedError:
                policy = frozenset()  # unreadable: nobody (never wider than meant)
            cached = self._policies[rt.q] = (version, policy)
        return cached[1]

    def _consumer(self, peer: bytes, body: Mapping[str, Any]) -> str:
        return consumer_prefix(peer) + _text(body, "consumer", MAX_REMOTE_CONSUMER_BYTES)

    def _check_holder(self, peer: bytes, rt: GroupRuntime, token: str) -> None:
        holder = rt.dispatcher.holder(token)
        if holder is not None and not holder.startswith(consumer_prefix(peer)):
            raise LeaseError(f"lease {token!r} was not granted to a consumer of {peer.hex()}")

    def _is_sealed(self, sid: str, rt: GroupRuntime) -> bool:
        q = rt.source_queue(sid)
        if q is None or self.engine.core2.holds(q):  # fork core 2 seals nothing
            return False
        state = self.engine.state(q)
        version = state.head.meta_version if state.head is not None else -1
        cached = self._sealed.get(sid)
        if cached is None or cached[0] != version:
            cached = self._sealed[sid] = (version, self.service.sealer.sealing(q) is not None)
        return cached[1]

    def _grants(self, rt: GroupRuntime, leases: list[Grant], have: Mapping[str, int]) -> list[dict[str, Any]]:
        out, budget = [], MAX_INLINE_BYTES
        sealed: dict[str, bool] = {}
        for lease in leases:
            wire: dict[str, Any] = {
                "queue": lease.queue,
                "offset": lease.offset,
                "lease": lease.token,
                "attempt": lease.attempt,
                "consumer": lease.consumer,
                "correlation_id": lease.correlation_id,
                "leased_at": lease.leased_at,
                "expires_at": lease.expires_at,
            }
            is_sealed = sealed.get(lease.queue)
            if is_sealed is None:
                is_sealed = sealed[lease.queue] = self._is_sealed(lease.queue, rt)
            if is_sealed:
                wire["sealed"] = True
            elif lease.offset >= have.get(lease.queue, 0):
                record = lease.record
                size = len(record.value) + len(record.key or b"")
                if size <= budget:
                    budget -= size
                    wire["record"] = record_wire(record.key, record.value, record.timestamp, record.headers)
            out.append(wire)
        return out

    # ------------------------------------------------------------------ ops
    async def _dequeue(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        consumer = self._consumer(peer, body)
        visibility = _seconds(body, "visibility", positive=True)
        wait = _seconds(body, "wait")
        with self.waiting.slot(rt.q, rt.name, peer, wait):
            try:
                lease = await self.service.dequeue(rt, consumer, visibility, wait, hold_slot=False)
            finally:
                self.service.detach(rt, consumer)
        return {"leases": self._grants(rt, [lease] if lease else [], _have(body))}

    async def _take(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        consumer = self._consumer(peer, body)
        visibility = _seconds(body, "visibility", positive=True)
        n = min(_count(body, "n", 10_000), MAX_TAKE)  # one answer stays well inside a message
        # A subscription's consumer stays registered while it holds leases: it ends with ``release``, or
        # is detached when its link goes (then unregistered once its leases have ended).
        wait = _seconds(body, "wait")
        with self.waiting.slot(rt.q, rt.name, peer, wait):
            leases = await self.service.take_waiting(rt, consumer, visibility, n, wait)
        return {"leases": self._grants(rt, leases, _have(body))}

    def _remembered(self, peer: bytes, op: str, token: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        if body.get("retry") is True:
            return self._settled.get((peer, op, token))
        return None

    def _remember(self, peer: bytes, op: str, token: str, reply: dict[str, Any]) -> None:
        self._settled[(peer, op, token)] = reply
        while len(self._settled) > MAX_REMEMBERED_SETTLEMENTS:
            self._settled.popitem(last=False)

    async def _ack(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        """Ack leases; per lease the reply (``results``), or with ``brief`` only the failures (``failed``:
        ``[index, code, message]``: a subscription's daemon knows the rest of each reply already)."""
        brief = body.get("brief") is True
        results: list[dict[str, Any] | None] = []
        flights = []
        for token in _tokens(body):
            try:
                self._check_holder(peer, rt, token)
                changes, flight = self.service.ack_submit(rt, token)
            except LeaseError as exc:
                again = self._remembered(peer, "ack", token, body)
                results.append({"ok": True, **again} if again is not None else _failed(exc))
                continue
            except LatticedError as exc:
                results.append(_failed(exc))
                continue
            results.append(None)
            flights.append((len(results) - 1, token, changes, flight))
        outcome: dict[Flight, LatticedError | None] = {}
        for index, token, changes, flight in flights:
            if flight not in outcome:  # the acks of one request mostly share a commit
                try:
                    await flight.wait()
                    outcome[flight] = None
                except LatticedError as exc:
                    outcome[flight] = exc
            failure = outcome[flight]
            if failure is not None:
                results[index] = _failed(failure)
                continue
            reply = {} if brief else settled_reply(changes)
            self._remember(peer, "ack", token, reply)
            results[index] = {"ok": True, **reply}
        if brief:
            return {
                "failed": [
                    [i, r["error"]["code"], r["error"]["message"]]
                    for i, r in enumerate(results)
                    if r is not None and not r["ok"]
                ]
            }
        return {"results": results}

    async def _nack(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        token = _text(body, "lease")
        reason = body.get("reason") or ""
        try:
            self._check_holder(peer, rt, token)
            changes = await self.service.nack(rt, token, _seconds(body, "delay"), reason)
        except LeaseError:
            again = self._remembered(peer, "nack", token, body)
            if again is None:
                raise
            return again
        reply = settled_reply(changes)
        self._remember(peer, "nack", token, reply)
        return reply

    async def _extend(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        token = _text(body, "lease")
        visibility = _seconds(body, "visibility", positive=True)
        if visibility is None:
            raise MalformedError("'visibility' (seconds) is required")
        self._check_holder(peer, rt, token)
        lease = self.service.extend(rt, token, visibility)
        return {"correlation_id": lease.correlation_id, "expires_at": lease.expires_at}

    async def _ack_up_to(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        offset = _count(body, "offset", 2**63 - 1)
        # Only over leases the caller's own workers hold, never on the DLQ (see Dispatcher.ack_up_to).
        changes = await self.service.ack_up_to(
            rt, _text(body, "queue"), offset, holders=consumer_prefix(peer)
        )
        return {"acked": len(changes.done)}

    async def _release(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        changes = await self.service.release(rt, self._consumer(peer, body))
        return {"released": len(changes.failed)}

    async def _give_back(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        count = 0
        for token in _tokens(body):
            holder = rt.dispatcher.holder(token)
            if holder is not None and holder.startswith(consumer_prefix(peer)):
                await self.service.nack(rt, token, 0.0, "the worker's daemon could not hand it over")
                count += 1
        return {"count": count}

    async def _fetch(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        token = _text(body, "lease")
        self._check_holder(peer, rt, token)
        view = rt.dispatcher.lease_record(token)
        if view is None:
            raise LeaseError(f"lease {token!r} has ended")
        queue, record = view
        if self._is_sealed(queue, rt):
            raise NotReaderError(
                f"records of the sealed queue {queue} are not sent over the link: this daemon must hold it "
                "and be a reader"
            )
        return {"record": record_wire(record.key, record.value, record.timestamp, record.headers)}

    async def _claim(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        consumer = self._consumer(peer, body)
        min_idle = _seconds(body, "min_idle")
        if min_idle is None:
            raise MalformedError("'min_idle' (seconds) is required")
        visibility = _seconds(body, "visibility", positive=True)
        try:
            count = min(_count(body, "count", 10_000), MAX_TAKE)
            # Only leases of the caller's own workers: another daemon's (or a local) worker's lease
            # is not the caller's to end; a stuck one expires.
            leases = await self.service.claim(
                rt, consumer, min_idle, count, visibility, holders=consumer_prefix(peer)
            )
        finally:
            self.service.detach(rt, consumer)
        return {"leases": self._grants(rt, leases, _have(body))}

    async def _stats(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        return {"stats": live_stats(self.engine, rt, self.service.now())}

    async def _inspect(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        owner, name = parse_source_id(_text(body, "queue"))
        view = await self.service.inspect(rt, f"{owner.hex()}/{name}", _count(body, "offset", 2**63 - 1))
        return {"task": task_wire(view)}


def _failed(exc: LatticedError) -> dict[str, Any]:
    return {"ok": False, "error": {"code": exc.code, "message": str(exc) or type(exc).__name__}}


__all__ = ["MAX_INLINE_BYTES", "RemoteLeaseServer"]
