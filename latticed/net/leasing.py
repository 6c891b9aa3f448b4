"""The trio shell of lease forwarding (:mod:`latticed.protocol.lease_forwarding`) on the replication links.

:class:`LeaseLinks` is the gossip layer's :class:`~latticed.net.gossip.LinkExtension`: every link that
comes up gets a :class:`~latticed.protocol.lease_forwarding.LeasingSession`, whose messages ride in the link's
``extra_out`` (the link's own driver sends them, so a caller that is cancelled never leaves half a frame
on the wire). Two roles:

* **requester** (a worker's daemon): :meth:`LeaseLinks.call` sends a request to a peer and waits for its
  answer, dialling the peer first when no link is up (through ``dial``, the peer book's known addresses);
  a cancelled caller sends CANCEL, and what the peer granted meanwhile goes to the caller's
  ``give_back``.
* **answerer** (a group's owner): each request runs as a task calling the :class:`LeaseServer`; a CANCEL
  cancels that task; when a link ends, the server hears :meth:`LeaseServer.peer_gone`.

One timer task turns request deadlines into the session's ``TimedOut`` events (no polling: it sleeps until
the earliest deadline, and is woken when an earlier one appears).

The same sub-protocol carries the version statement of each link and the duplicate-identity notice
(:mod:`latticed.protocol.identity_runs`), answered here whatever serves leases.

Why one module: :class:`LeaseLinks` is one link extension; its endpoints, their sessions, the requests
served and the timer share the per-link state and its teardown rules.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import trio

from latticed.errors import LatticedError, OwnerUnreachableError
from latticed.net.gossip import PeerLink
from latticed.process.logs import get_logger, log_event
from latticed.protocol.identity_runs import IDENTITY_FEATURE, IDENTITY_OP
from latticed.protocol.lease_forwarding import (
    Answer,
    Cancelled,
    LateAnswer,
    LeasingSession,
    LinkLost,
    Refusal,
    Request,
    TimedOut,
    is_leasing_message,
)
from latticed.protocol.versions import UNSTATED, VERSIONS_OP, LinkVersions, agree, ours, stated

log = get_logger(__name__)

#: While a caller waits for a link to a peer, the dial is hurried again this often (the peer book backs
#: off after failures; a caller that waits wants the next try soon).
REDIAL_S: Final = 1.0
#: How long a peer has to say which protocol versions it speaks before it is taken to speak protocol 1.
VERSIONS_TIMEOUT_S: Final = 30.0
#: Give-back callbacks remembered for requests given up on (a late answer finds its callback).
MAX_GIVE_BACKS: Final = 4096

GiveBack = Callable[[dict[str, Any]], None]


class LinkLostError(OwnerUnreachableError):
    """The link to the peer ended before it answered: it may or may not have acted on the request."""


class LeaseServer(Protocol):
    """What answers the requests of peers (the owner side: :mod:`latticed.groups.remote`)."""

    async def serve(self, peer: bytes, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request; raise a LatticedError to refuse it."""
        ...

    def peer_gone(self, peer: bytes) -> None:
        """The link to ``peer`` ended (its remote consumers are detached: their leases expire as usual)."""
        ...


class _Call:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: dict[str, Any] | None = None
        self.error: LatticedError | None = None


class _Endpoint:
    __slots__ = ("calls", "give_backs", "link", "notices", "serving", "session", "versions_rid")

    def __init__(self, link: PeerLink, session: LeasingSession) -> None:
        self.link = link
        self.session = session
        #: Our request asking the peer which protocol versions it speaks (latticed/protocol/versions.py).
        self.versions_rid: int | None = None
        self.calls: dict[int, _Call] = {}
        self.serving: dict[int, trio.CancelScope] = {}
        self.give_backs: OrderedDict[int, GiveBack] = OrderedDict()
        #: Notices to send once the peer said it understands them (:meth:`LeaseLinks.notify`).
        self.notices: list[tuple[str, dict[str, Any]]] = []


class LeaseLinks:
    """Lease forwarding on every replication link (see the module docstring). Run :meth:`run` in a
    nursery: it answers peers' requests (with ``server``) and times requests out."""

    def __init__(self, *, dial: Callable[[bytes], bool], max_message_bytes: int = 1 << 20) -> None:
        self._dial = dial
        self._max_message_bytes = max_message_bytes
        self._endpoints: dict[bytes, _Endpoint] = {}
        self._link_change = trio.Event()
        self._server: LeaseServer | None = None
        self._nursery: trio.Nursery | None = None
        self._timer_wake = trio.Event()
        self._timer_until = math.inf
        self.counters = {"requests_out": 0, "requests_in": 0, "timeouts": 0, "late_answers": 0}
        self._notices: Callable[[PeerLink, dict[str, Any]], None] | None = None

    async def run(
        self, server: LeaseServer, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._server, self._nursery = server, nursery
            try:
                task_status.started()
                await self._timer()
            finally:
                self._server = self._nursery = None

    # ------------------------------------------------------------------ LinkExtension (gossip calls these)
    def accepts(self, message: bytes) -> bool:
        return is_leasing_message(message)

    def link_up(self, link: PeerLink) -> None:
        old = self._endpoints.get(link.public_key)
        if old is not None:  # a new connection replaces the old one: what waited on that is lost with it
            self._close(old)
        endpoint = self._endpoints[link.public_key] = _Endpoint(
            link, LeasingSession(max_message_bytes=self._max_message_bytes)
        )
        # Ask which protocol versions and features the peer speaks; until it answers, the session sends
        # only what every version expresses (a peer of 0.2.0 refuses the op: protocol 1, no features).
        endpoint.versions_rid = endpoint.session.request(
            VERSIONS_OP, ours().to_body(), now=trio.current_time(), timeout=VERSIONS_TIMEOUT_S
        )
        self._flush(endpoint)
        self._deadline_moved(endpoint.session.next_deadline())
        self._link_changed()

    def receive(self, link: PeerLink, message: bytes) -> None:
        endpoint = self._endpoints.get(link.public_key)
        if endpoint is None or endpoint.link is not link:
            return  # a link being replaced: its requests were given up with it
        endpoint.session.receive(message)  # LeasingProtocolError ends the link (gossip's boundary)
        self._drain(endpoint)

    def notify(self, link: PeerLink, op: str, body: dict[str, Any]) -> None:
        """Send ``link`` a request whose answer nobody waits for, once the peer said it speaks
        :data:`IDENTITY_FEATURE` (a peer that does not is sent nothing)."""
        endpoint = self._endpoints.get(link.public_key)
        if endpoint is None or endpoint.link is not link:
            return
        if link.agreement is None:
            del endpoint.notices[:-4]
            endpoint.notices.append((op, body))
        elif IDENTITY_FEATURE in link.agreement.features:
            endpoint.session.request(op, body, now=trio.current_time(), timeout=VERSIONS_TIMEOUT_S)
            self._flush(endpoint)

    def hear_notices(self, handler: Callable[[PeerLink, dict[str, Any]], None]) -> None:
        self._notices = handler

    def link_down(self, link: PeerLink) -> None:
        endpoint = self._endpoints.get(link.public_key)
        if endpoint is None or endpoint.link is not link:
            return
        del self._endpoints[link.public_key]
        self._close(endpoint)
        if self._server is not None:
            self._server.peer_gone(link.public_key)
        self._link_changed()

    def connected(self, peer: bytes) -> bool:
        return peer in self._endpoints

    def features(self, peer: bytes) -> frozenset[str] | None:
        """The optional features the link to ``peer`` agreed on (None: no link, or not settled yet)."""
        endpoint = self._endpoints.get(peer)
        agreement = endpoint.link.agreement if endpoint is not None else None
        return agreement.features if agreement is not None else None

    # ------------------------------------------------------------------ requester
    async def call(
        self,
        peer: bytes,
        op: str,
        body: Mapping[str, Any],
        *,
        timeout: float,
        connect_within: float,
        give_back: GiveBack | None = None,
    ) -> dict[str, Any]:
        """Send ``op`` to ``peer`` and return its answer (or raise its typed refusal).

        No link: dial the peer and wait up to ``connect_within`` seconds for one (0: do not dial), else
        :class:`OwnerUnreachableError`. No answer within ``timeout``: :class:`OwnerUnreachableError`; the
        link ends first: :class:`LinkLostError`. Cancelled while waiting: the peer is told, and what it
        grants anyway is handed to ``give_back``."""
        endpoint = await self.wait_link(peer, connect_within)
        session = endpoint.session
        rid = session.request(op, body, now=trio.current_time(), timeout=timeout)
        self.counters["requests_out"] += 1
        call = endpoint.calls[rid] = _Call()
        self._flush(endpoint)
        self._deadline_moved(session.next_deadline())
        try:
            await call.done.wait()
        except BaseException:
            if call.result is not None and give_back is not None:
                give_back(call.result)  # answered, but the caller is gone before it could take it
            elif endpoint.calls.pop(rid, None) is not None and not session.closed:
                session.cancel(rid)
                if give_back is not None:
                    endpoint.give_backs[rid] = give_back
                    while len(endpoint.give_backs) > MAX_GIVE_BACKS:
                        endpoint.give_backs.popitem(last=False)
                self._flush(endpoint)
            raise
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    async def wait_link(self, peer: bytes, within: float) -> _Endpoint:
        """The link to ``peer``, dialling it and waiting up to ``within`` seconds if none is up."""
        endpoint = self._endpoints.get(peer)
        if endpoint is not None:
            return endpoint
        if within <= 0:
            raise OwnerUnreachableError(f"no link to {peer.hex()} is up")
        deadline = trio.current_time() + within
        while endpoint is None:
            # Without an address to dial, it may still dial us: wait all the same.
            dialling = self._dial(peer)
            if trio.current_time() >= deadline:
                if not dialling:
                    raise OwnerUnreachableError(
                        f"no link to {peer.hex()} came up within {within:g}s, and no address of it is known "
                        "to dial (add one with `latticectl peers add HOST:PORT`, or it is blocked)"
                    )
                raise OwnerUnreachableError(f"could not reach {peer.hex()} within {within:g}s")
            change = self._link_change
            with trio.move_on_at(min(deadline, trio.current_time() + REDIAL_S)):
                await change.wait()
            endpoint = self._endpoints.get(peer)
        return endpoint

    async def link_changed(self) -> None:
        """Return at the next link up or down (a caller waiting for a peer to come back)."""
        await self._link_change.wait()

    # ------------------------------------------------------------------ internals
    def _close(self, endpoint: _Endpoint) -> None:
        """End an endpoint: its callers get LinkLostError, the requests it was answering stop."""
        endpoint.session.close()
        for scope in endpoint.serving.values():
            scope.cancel()
        self._drain(endpoint)

    def _link_changed(self) -> None:
        self._link_change.set()
        self._link_change = trio.Event()

    def _flush(self, endpoint: _Endpoint) -> None:
        messages = endpoint.session.messages_to_send()
        if messages:
            endpoint.link.extra_out.extend(messages)
            endpoint.link.kick()

    def _drain(self, endpoint: _Endpoint) -> None:
        session = endpoint.session
        while (event := session.next_event()) is not None:
            if isinstance(event, Request):
                self._start_serving(endpoint, event)
            elif isinstance(event, Cancelled):
                scope = endpoint.serving.get(event.rid)
                if scope is not None:
                    scope.cancel()
            elif isinstance(event, LateAnswer):
                self.counters["late_answers"] += 1
                give_back = endpoint.give_backs.pop(event.rid, None)
                if give_back is not None:
                    give_back(event.body)
            elif event.rid == endpoint.versions_rid and not isinstance(event, LinkLost):
                endpoint.versions_rid = None
                self._settle_versions(endpoint, event.body if isinstance(event, Answer) else None)
            else:
                call = endpoint.calls.pop(event.rid, None)
                if call is None:
                    continue
                if isinstance(event, Answer):
                    call.result = event.body
                elif isinstance(event, Refusal):
                    call.error = event.error
                elif isinstance(event, TimedOut):
                    self.counters["timeouts"] += 1
                    call.error = OwnerUnreachableError(
                        f"{endpoint.link.public_key.hex()} did not answer {event.op} in time"
                    )
                elif isinstance(event, LinkLost):
                    call.error = LinkLostError(
                        f"the link to {endpoint.link.public_key.hex()} dropped before it answered {event.op}"
                    )
                call.done.set()
        self._flush(endpoint)

    def _settle_versions(self, endpoint: _Endpoint, body: dict[str, Any] | None) -> None:
        """The peer stated what it speaks (``body``), or refused or never answered (None: it does not
        negotiate, as 0.2.0): the link uses the highest common version and the shared features."""
        link = endpoint.link
        peer = UNSTATED
        if body is not None:
            try:
                peer = LinkVersions.from_body(body)
            except LatticedError as exc:
                log_event(
                    log,
                    "peer.versions_malformed",
                    level=logging.WARNING,
                    peer=link.public_key.hex(),
                    reason=str(exc),
                )
        try:
            agreement = agree(ours(), peer)
        except LatticedError as exc:  # its HELLO passed, so it speaks that version, whatever it says
            log_event(
                log,
                "peer.versions_inconsistent",
                level=logging.WARNING,
                peer=link.public_key.hex(),
                reason=str(exc),
            )
            agreement = agree(ours(), UNSTATED)
        link.agreement = agreement
        link.session.agree_features(agreement.features)
        notices, endpoint.notices = endpoint.notices, []
        for op, notice in notices:
            self.notify(link, op, notice)
        link.kick()
        log_event(
            log,
            "peer.versions",
            peer=link.public_key.hex(),
            protocol=agreement.protocol,
            features=sorted(agreement.features),
            speaks=peer.describe() if body is not None else "protocol 1 (it does not state its versions)",
        )

    def _start_serving(self, endpoint: _Endpoint, request: Request) -> None:
        if request.op == VERSIONS_OP:  # answered here, whatever serves leases (and before it runs)
            endpoint.link.session.peer_stated(stated(request.body))
            endpoint.session.answer(request.rid, ours().to_body())
            return
        if request.op == IDENTITY_OP and self._notices is not None:
            try:
                self._notices(endpoint.link, request.body)
            except LatticedError as exc:
                endpoint.session.refuse(request.rid, exc)
                return
            endpoint.session.answer(request.rid, {})
            return
        self.counters["requests_in"] += 1
        nursery, server = self._nursery, self._server
        if nursery is None or server is None:
            endpoint.session.refuse(request.rid, LatticedError("this daemon is not serving work queues yet"))
            return
        scope = endpoint.serving[request.rid] = trio.CancelScope()
        nursery.start_soon(self._serve, endpoint, server, request, scope)

    async def _serve(
        self, endpoint: _Endpoint, server: LeaseServer, request: Request, scope: trio.CancelScope
    ) -> None:
        peer = endpoint.link.public_key
        answer: dict[str, Any] | None = None
        failure: LatticedError | None = None
        with scope:
            try:
                answer = await server.serve(peer, request.op, request.body)
            except LatticedError as exc:
                failure = exc
            except Exception as exc:  # a bug: refuse this request, keep the link and the daemon
                log_event(log, "lease.serve_crashed", level=logging.ERROR, exc_info=exc, op=request.op)
                failure = LatticedError(f"internal error answering {request.op}: {type(exc).__name__}")
        endpoint.serving.pop(request.rid, None)
        session = endpoint.session
        if session.closed:
            return
        if scope.cancelled_caught:
            failure = LatticedError(f"{request.op} was cancelled")
        try:
            if failure is not None:
                session.refuse(request.rid, failure)
            else:
                assert answer is not None
                session.answer(request.rid, answer)
        except LatticedError as exc:  # an answer too large for a message
            session.refuse(request.rid, LatticedError(str(exc)))
        self._flush(endpoint)

    def _deadline_moved(self, deadline: float | None) -> None:
        if deadline is not None and deadline < self._timer_until:
            self._timer_until = deadline
            self._timer_wake.set()

    async def _timer(self) -> None:
        while True:
            now = trio.current_time()
            earliest = math.inf
            for endpoint in list(self._endpoints.values()):
                endpoint.session.expire(now)
                self._drain(endpoint)
                deadline = endpoint.session.next_deadline()
                if deadline is not None:
                    earliest = min(earliest, deadline)
            self._timer_until = earliest
            self._timer_wake = trio.Event()
            with trio.move_on_at(earliest):
                await self._timer_wake.wait()


__all__ = ["GiveBack", "LeaseLinks", "LeaseServer", "LinkLostError"]
