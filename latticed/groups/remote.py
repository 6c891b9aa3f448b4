"""Work queues across the mesh: a worker's daemon forwards lease operations to the group's owner.

The daemon that owns a group stays the only one that grants its leases. A worker on another daemon uses
the same calls as a local one (``dequeue``, ``subscribe``, ``ack``, ...); its daemon sends them to the
owner over the authenticated replication link (:mod:`latticed.net.leasing`, dialling the owner when no
link is up) and hands the owner's answers back.

* **Owner side**: :class:`RemoteLeaseServer` answers those requests for the groups this daemon runs. A
  remote consumer is known as ``<first 16 hex digits of its daemon's identity>/<its consumer id there>``;
  a daemon may settle only leases granted to its own consumers. Who may consume remotely is the group's
  allow-list (metadata ``remote_consumers`` of its signed log: absent, any peer with the network key; a
  JSON list of identities, only those), checked against the link's authenticated identity. When a link
  ends, the consumers behind it are detached: their leases run out as usual (visibility timeout), and an
  ack that arrives over a new link before that still counts.
* **Worker side**: :class:`RemoteGroups` forwards. A lease names queue and offset; the worker's daemon
  reads the record from its own replica (verified against the queue owner's signature) and the owner
  sends the payload only for records the worker's daemon said it does not hold yet (its held ends per
  source travel with each request). The owner never sends records of sealed queues: the worker's daemon
  must hold them and be a reader (it waits briefly for them to replicate).

Faults: no link and none can be dialled within the call's time: :class:`OwnerUnreachableError` (a
blocking ``dequeue`` waits its ``wait`` for the owner first). A link that drops while an ack or nack is
on its way: the call is sent again over the next link, flagged as a retry, and the owner answers a
retried settlement it already made with the answer it gave (so an ack is not reported stale because its
first answer was lost); a lease the owner no longer holds fails as stale (:class:`LeaseError`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import trio

from latticed.crdt.group import MAX_CONSUMER_BYTES, dlq_name, parse_source_id, source_id, spec_from_meta
from latticed.crdt.head import KIND_GROUP, KIND_QUEUE
from latticed.crdt.signing import parse_public_key
from latticed.errors import (
    LatticedError,
    LeaseError,
    MalformedError,
    NotAllowedError,
    NotFoundError,
    NotReaderError,
)
from latticed.groups.committer import Flight
from latticed.groups.runtime import GroupRuntime
from latticed.groups.service import GroupService
from latticed.groups.views import live_stats, settled_reply, task_wire
from latticed.leases.dispatch import Grant
from latticed.logs import get_logger, log_event
from latticed.net.leasing import LeaseLinks, LinkLostError
from latticed.storage.engine import Engine
from latticed.storage.reader import Columns
from latticed.storage.sealer import sealer_of

log = get_logger(__name__)

#: Metadata key of a group log holding its remote-consumer allow-list (JSON list of identities).
REMOTE_META_KEY: Final = "remote_consumers"
#: How long a call that does not wait for records waits for a link to the owner.
CONNECT_WITHIN_S: Final = 5.0
#: How long the owner may take to answer, on top of the time a call waits for records there.
ANSWER_WITHIN_S: Final = 5.0
#: An ack or nack whose link dropped is sent again until this long after it was first sent.
SETTLE_WITHIN_S: Final = 8.0
#: How long ``group stats``/``group list`` wait for the owner's live counts before showing the replica's.
STATS_WITHIN_S: Final = 2.0
#: A sealed record the worker's daemon does not hold yet: how long it waits for it to replicate.
REPLICA_WAIT_S: Final = 5.0
#: Payload bytes the owner puts in one answer (leases past it are fetched one by one).
MAX_INLINE_BYTES: Final = 256 * 1024
#: Leases one answer carries at most (a caller wanting more asks again).
MAX_TAKE: Final = 1000
#: Records read at once when a lease's record is read here (the next leases' usually follow it).
READ_AHEAD_RECORDS: Final = 1024
READ_AHEAD_BYTES: Final = 4 << 20
#: Settlements remembered per owner to answer a retried one as it was first answered.
MAX_REMEMBERED_SETTLEMENTS: Final = 65_536
#: Longest wait a remote caller may ask for (as the local API's).
MAX_WAIT_S: Final = 86_400.0
#: A remote consumer id (the part after the daemon's prefix).
MAX_REMOTE_CONSUMER_BYTES: Final = MAX_CONSUMER_BYTES - 17


# ------------------------------------------------------------------------------------- the allow-list


def remote_policy(meta: Mapping[str, str]) -> frozenset[bytes] | None:
    """The identities a group takes remote consumers from (None: any peer with the network key)."""
    text = meta.get(REMOTE_META_KEY)
    if text is None:
        return None
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise MalformedError(f"{REMOTE_META_KEY} is not JSON") from exc
    if type(items) is not list:
        raise MalformedError(f"{REMOTE_META_KEY} is a list of identities")
    return frozenset(parse_public_key(item) for item in items)


def policy_meta(allowed: Iterable[str] | None) -> dict[str, str | None]:
    """The metadata update that stores an allow-list (None: any peer, the key removed)."""
    if allowed is None:
        return {REMOTE_META_KEY: None}
    keys = sorted({parse_public_key(a).hex() for a in allowed})
    return {REMOTE_META_KEY: json.dumps(keys, separators=(",", ":"))}


def describe_policy(policy: frozenset[bytes] | None) -> str | list[str]:
    return "any" if policy is None else sorted(k.hex() for k in policy)


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


def consumer_prefix(peer: bytes) -> str:
    return peer.hex()[:16] + "/"


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
        if q is None:
            return False
        state = self.engine.state(q)
        version = state.head.meta_version if state.head is not None else -1
        cached = self._sealed.get(sid)
        if cached is None or cached[0] != version:
            cached = self._sealed[sid] = (version, sealer_of(self.engine).sealing(q) is not None)
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
        try:
            lease = await self.service.dequeue(rt, consumer, visibility, _seconds(body, "wait"))
        finally:
            self.service.detach(rt, consumer)
        return {"leases": self._grants(rt, [lease] if lease else [], _have(body))}

    async def _take(self, peer: bytes, rt: GroupRuntime, body: dict[str, Any]) -> dict[str, Any]:
        consumer = self._consumer(peer, body)
        visibility = _seconds(body, "visibility", positive=True)
        n = min(_count(body, "n", 10_000), MAX_TAKE)  # one answer stays well inside a message
        # A subscription's consumer stays registered between its takes: it ends with ``release``, or is
        # detached when its link goes (then unregistered once its leases have ended).
        leases = await self.service.take_waiting(rt, consumer, visibility, n, _seconds(body, "wait"))
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
        changes = await self.service.ack_up_to(rt, _text(body, "queue"), offset)
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
            leases = await self.service.claim(rt, consumer, min_idle, count, visibility)
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


def record_wire(
    key: bytes | None,
    value: bytes,
    timestamp: int,
    headers: Iterable[tuple[str, bytes]] | Iterable[list[Any]],
) -> list[Any]:
    return [key, value, timestamp, [[k, v] for k, v in headers] or None]


# ----------------------------------------------------------------------------------------- worker side


@dataclass(frozen=True, slots=True)
class RemoteGroup:
    """A group another daemon owns, as a worker names it."""

    owner: bytes
    name: str

    @property
    def address(self) -> str:
        return f"{self.owner.hex()}/{self.name}"


class RemoteGroups:
    """Forwards lease operations on other daemons' groups to their owners (see the module docstring).
    Run :meth:`run` in a nursery: leases granted to callers that left are given back from there."""

    def __init__(self, engine: Engine, links: LeaseLinks) -> None:
        self.engine = engine
        self.links = links
        self._sources: dict[str, set[str]] = {}
        self._spec_versions: dict[str, int] = {}
        #: Per source, the last records read ahead: (first offset, records; None where unreadable).
        self._ahead: dict[str, tuple[int, list[list[Any] | None]]] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the background, beyond the caller's lifetime."""
        if self._nursery is None:
            raise LatticedError("lease forwarding is not running")
        self._nursery.start_soon(fn, *args)

    def target(self, address: str) -> RemoteGroup | None:
        """The group named ``address`` if another daemon owns it (None: ours)."""
        owner, name = self.engine.parse_address(address)
        return None if owner == self.engine.public_key else RemoteGroup(owner, name)

    def connected(self, group: RemoteGroup) -> bool:
        return self.links.connected(group.owner)

    async def call(
        self,
        group: RemoteGroup,
        op: str,
        body: Mapping[str, Any],
        *,
        wait: float = 0.0,
        connect_within: float = CONNECT_WITHIN_S,
        give_back: bool = False,
    ) -> dict[str, Any]:
        """One forwarded op (``wait``: how long the owner may hold it for records)."""
        return await self.links.call(
            group.owner,
            op,
            {**body, "group": group.name},
            timeout=wait + ANSWER_WITHIN_S,
            connect_within=connect_within,
            give_back=self._giver(group) if give_back else None,
        )

    # ------------------------------------------------------------------ leases
    async def take(
        self,
        group: RemoteGroup,
        consumer: str,
        n: int,
        visibility: float | None,
        wait: float | None,
        *,
        op: str = "take",
    ) -> list[dict[str, Any]]:
        """Lease up to ``n`` records (``op`` "dequeue": one, with the local dequeue's cap errors), waiting
        up to ``wait`` seconds for the owner and then for records; leases as the local API sends them."""
        deadline = trio.current_time() + (wait or 0.0)
        while True:
            remaining = max(0.0, deadline - trio.current_time())
            await self.links.wait_link(group.owner, remaining if wait else CONNECT_WITHIN_S)
            remaining = max(0.0, deadline - trio.current_time())
            body: dict[str, Any] = {
                "consumer": consumer,
                "visibility": visibility,
                "wait": remaining,
                "have": self._have(group),
            }
            if op == "take":
                body["n"] = n
            try:
                answer = await self.call(group, op, body, wait=remaining, connect_within=0, give_back=True)
            except LinkLostError:
                if trio.current_time() < deadline:
                    continue  # what the owner granted over the lost link expires there
                raise
            leases, failures = await self.materialize(group, answer.get("leases") or [])
            if failures and not leases and op == "dequeue":
                raise failures[0]
            return leases

    async def claim(
        self, group: RemoteGroup, consumer: str, min_idle: float, count: int, visibility: float | None
    ) -> list[dict[str, Any]]:
        """Take over idle leases of the group at its owner (see ``claim`` there)."""
        body = {
            "consumer": consumer,
            "min_idle": min_idle,
            "count": count,
            "visibility": visibility,
            "have": self._have(group),
        }
        answer = await self.call(group, "claim", body, give_back=True)
        leases, _ = await self.materialize(group, answer.get("leases") or [])
        return leases

    async def settle(self, group: RemoteGroup, op: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """An ack or nack (or any op safe to repeat): sent again over the next link when the link drops
        before the answer, for up to :data:`SETTLE_WITHIN_S`."""
        deadline = trio.current_time() + SETTLE_WITHIN_S
        retry = False
        while True:
            within = max(deadline - trio.current_time(), 0.001)
            try:
                return await self.call(group, op, {**body, "retry": retry}, connect_within=within)
            except LinkLostError:
                if trio.current_time() >= deadline:
                    raise
                retry = True

    async def ack_many(
        self, group: RemoteGroup, tokens: list[str], *, brief: bool = False
    ) -> list[dict[str, Any]]:
        """Ack several leases in one request; per lease ``{"ok": True, ...}`` or ``{"ok": False,
        "error": {...}}`` (``brief``: successes are only ``{"ok": True}``, the caller knows the rest)."""
        answer = await self.settle(group, "ack", {"leases": tokens, "brief": brief})
        if brief:
            out: list[dict[str, Any]] = [{"ok": True} for _ in tokens]
            failed = answer.get("failed")
            if type(failed) is not list:
                raise MalformedError("the owner's answer to ack is malformed")
            for item in failed:
                if type(item) is not list or len(item) != 3 or type(item[0]) is not int:
                    raise MalformedError("the owner's answer to ack is malformed")
                if 0 <= item[0] < len(tokens):
                    out[item[0]] = {"ok": False, "error": {"code": str(item[1]), "message": str(item[2])}}
            return out
        results = answer.get("results")
        if type(results) is not list or len(results) != len(tokens):
            raise MalformedError("the owner's answer to ack does not match the request")
        return results

    def give_back(self, group: RemoteGroup, tokens: list[str]) -> None:
        """Hand leases back to the owner in the background (their callers are gone)."""
        if tokens and self._nursery is not None:
            self._nursery.start_soon(self._give_back, group, tokens)

    async def _give_back(self, group: RemoteGroup, tokens: list[str]) -> None:
        try:
            await self.call(group, "give_back", {"leases": tokens}, connect_within=0)
        except LatticedError as exc:  # they expire at the owner instead
            log_event(log, "group.give_back_failed", level=logging.INFO, group=group.address, error=str(exc))

    def _giver(self, group: RemoteGroup) -> Callable[[dict[str, Any]], None]:
        def give(answer: dict[str, Any]) -> None:
            leases = answer.get("leases")
            if type(leases) is list:
                self.give_back(group, [g["lease"] for g in leases if isinstance(g, dict) and "lease" in g])

        return give

    # ------------------------------------------------------------------ payloads
    def _known_sources(self, group: RemoteGroup) -> set[str]:
        """The group's sources as far as this daemon knows: its replica of the group log's definition,
        and the queues of leases seen."""
        known = self._sources.setdefault(group.address, set())
        q = self.engine.find(group.owner, group.name, KIND_GROUP)
        if q is not None:
            state = self.engine.state(q)
            version = state.head.meta_version if state.head is not None else -1
            if self._spec_versions.get(group.address) != version:
                self._spec_versions[group.address] = version
                with contextlib.suppress(LatticedError):
                    known.update(spec_from_meta(state.meta_dict).sources)
                    known.add(source_id(group.owner, dlq_name(group.name)))
        return known

    def _have(self, group: RemoteGroup) -> dict[str, int]:
        """How far this daemon holds the group's sources (the owner sends the records past that)."""
        have = {}
        for sid in self._known_sources(group):
            owner, name = parse_source_id(sid)
            q = self.engine.find(owner, name, KIND_QUEUE)
            if q is not None:
                have[sid] = self.engine.state(q).held_end
        return have

    async def materialize(
        self, group: RemoteGroup, grants: list[Any]
    ) -> tuple[list[dict[str, Any]], list[LatticedError]]:
        """The owner's grants as client leases, payloads read here when the owner did not send them. A
        lease whose record cannot be had is given back; its error is returned."""
        out: list[dict[str, Any] | None] = []
        needed: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for grant in grants:
            _check_grant(grant)
            sid = grant["queue"]
            self._sources.setdefault(group.address, set()).add(sid)
            record = grant.get("record")
            if record is not None:
                out.append(_client_lease(group, grant, record, "owner"))
            else:
                out.append(None)
                needed.setdefault(sid, []).append((len(out) - 1, grant))
        failures: list[LatticedError] = []
        for sid, items in needed.items():
            found = await self._read_local(sid, [g["offset"] for _, g in items])
            for index, grant in items:
                record = found.get(grant["offset"])
                source = "replica"
                try:
                    if record is None:
                        record, source = await self._missing(group, sid, grant)
                except LatticedError as exc:
                    failures.append(exc)
                    self.give_back(group, [grant["lease"]])
                    log_event(
                        log,
                        "group.remote_record_missing",
                        level=logging.WARNING,
                        group=group.address,
                        queue=sid,
                        offset=grant["offset"],
                        error=str(exc),
                    )
                    continue
                out[index] = _client_lease(group, grant, record, source)
        return [lease for lease in out if lease is not None], failures

    async def _read_local(self, sid: str, offsets: list[int]) -> dict[int, list[Any]]:
        """The records at ``offsets`` of ``sid`` this daemon holds (and can open), by offset.

        Reads run ahead (:data:`READ_AHEAD_RECORDS`) and the last run per source is kept: leases come in
        offset order a few at a time, and the store decodes a whole segment for each read."""
        owner, name = parse_source_id(sid)
        q = self.engine.find(owner, name, KIND_QUEUE)
        if q is None or not all(type(o) is int and o >= 0 for o in offsets):
            return {}
        found: dict[int, list[Any]] = {}
        for offset in sorted(set(offsets)):
            ahead = self._ahead.get(sid)
            if ahead is None or not ahead[0] <= offset < ahead[0] + len(ahead[1]):
                ahead = await self._read_ahead(q, sid, offset)
            record = ahead[1][offset - ahead[0]] if ahead[0] <= offset < ahead[0] + len(ahead[1]) else None
            if record is not None:
                found[offset] = record
        return found

    async def _read_ahead(self, q: int, sid: str, lo: int) -> tuple[int, list[list[Any] | None]]:
        columns: Columns = await self.engine.read(
            q, lo, lo + READ_AHEAD_RECORDS, READ_AHEAD_RECORDS, READ_AHEAD_BYTES
        )
        try:  # a sealed queue: what this identity can open, up to the first record it cannot
            columns = sealer_of(self.engine).open_columns(q, columns, partial=True)
        except NotReaderError:
            columns = Columns()
        records: list[list[Any] | None] = [
            [key, value, ts, hdr or None]
            for key, value, ts, hdr in zip(
                columns.keys, columns.values, columns.timestamps, columns.headers, strict=True
            )
        ]
        first = columns.offsets[0] if columns.offsets else lo
        if columns.offsets and columns.offsets[-1] - first + 1 != len(records):  # not contiguous: by offset
            by_offset = dict(zip(columns.offsets, records, strict=True))
            records = [by_offset.get(o) for o in range(first, columns.offsets[-1] + 1)]
        ahead = self._ahead[sid] = (first, records)
        return ahead

    async def _missing(self, group: RemoteGroup, sid: str, grant: dict[str, Any]) -> tuple[list[Any], str]:
        """A record this daemon lacks: the owner sends it, or (sealed) it must replicate here first."""
        offset = grant["offset"]
        if not grant.get("sealed"):
            answer = await self.call(group, "fetch", {"lease": grant["lease"]})
            record = answer.get("record")
            if type(record) is not list or len(record) != 4:
                raise MalformedError("the owner's record is [key, value, timestamp, headers]")
            return record, "owner"
        owner, name = parse_source_id(sid)
        q = self.engine.find(owner, name, KIND_QUEUE)
        if q is not None:
            with trio.move_on_after(REPLICA_WAIT_S):
                await self.engine.wait_past(q, offset)
        found = await self._read_local(sid, [offset])
        if offset not in found:
            raise NotReaderError(
                f"record {offset} of the sealed queue {sid} is not here or this daemon is not a reader of it"
            )
        return found[offset], "replica"


_GRANT_FIELDS: Final = {
    "queue": str,
    "offset": int,
    "lease": str,
    "attempt": int,
    "consumer": str,
    "correlation_id": str,
    "leased_at": float,
    "expires_at": float,
}


#: Source ids already checked (grants name the same few over and over).
_CHECKED_SOURCES: set[str] = set()


def _check_grant(grant: Any) -> None:
    """An owner's grant has the fields a client lease needs, with the right types."""
    if not isinstance(grant, dict):
        raise MalformedError("a grant from the owner is a map")
    for name, kind in _GRANT_FIELDS.items():
        value = grant.get(name)
        ok = (
            isinstance(value, int | float) and not isinstance(value, bool)
            if kind is float
            else type(value) is kind
        )
        if not ok:
            raise MalformedError(f"a grant from the owner lacks a proper {name!r}")
    queue = grant["queue"]
    if queue not in _CHECKED_SOURCES:
        parse_source_id(queue)
        if len(_CHECKED_SOURCES) < 4096:
            _CHECKED_SOURCES.add(queue)


def _client_lease(group: RemoteGroup, grant: dict[str, Any], record: Any, source: str) -> dict[str, Any]:
    """A lease as the local API sends it; ``payload_from`` says where its record came from: "replica"
    (this daemon's copy, verified against its queue owner's signature) or "owner" (sent by the group's
    owner, which vouches for it)."""
    if type(record) is not list or len(record) != 4:
        raise MalformedError("a record is [key, value, timestamp, headers]")
    key, value, timestamp, headers = record
    if (
        not isinstance(value, bytes)
        or not (key is None or isinstance(key, bytes))
        or type(timestamp) is not int
    ):
        raise MalformedError("a record's key, value and timestamp have the wrong types")
    return {
        "group": group.address,
        "queue": grant["queue"],
        "offset": grant["offset"],
        "lease": grant["lease"],
        "attempt": grant["attempt"],
        "consumer": grant["consumer"],
        "correlation_id": grant["correlation_id"],
        "key": key,
        "value": value,
        "timestamp": timestamp,
        "headers": headers or None,
        "leased_at": grant["leased_at"],
        "expires_at": grant["expires_at"],
        "payload_from": source,
    }


__all__ = [
    "ANSWER_WITHIN_S",
    "CONNECT_WITHIN_S",
    "REMOTE_META_KEY",
    "RemoteGroup",
    "RemoteGroups",
    "RemoteLeaseServer",
    "describe_policy",
    "policy_meta",
    "remote_policy",
]
