"""The request/answer sub-protocol on a *second* link of one identity (a second daemon running a copy of
it, see :class:`~latticed.net.gossip.Gossip`): lease forwarding runs on the first link only, so this one
only asks what the peer speaks (the link then sends it what its version expresses), sends it the
duplicate-identity notice once it names :data:`IDENTITY_FEATURE`, answers the peer's own versions request
and notices, and refuses every other request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import trio

from latticed.errors import LatticedError
from latticed.protocol.identity_runs import IDENTITY_FEATURE, IDENTITY_OP, Notice
from latticed.protocol.lease_forwarding import Answer, Cancelled, LeasingSession, Request
from latticed.protocol.replication import ReplicationSession
from latticed.protocol.versions import (
    UNSTATED,
    VERSIONS_OP,
    Agreement,
    LinkVersions,
    agree,
    ours,
    stated,
)

__all__ = ["TwinLink", "TwinRequests"]

#: The peer's answers are informational: requests are never timed out on this link.
_NO_TIMEOUT: Final = 1e9

NoticeHandler = Callable[[dict[str, Any]], None]


class TwinLink(Protocol):
    """What this needs of the gossip layer's link (:class:`~latticed.net.gossip.PeerLink`)."""

    agreement: Agreement | None
    extra_out: list[bytes]
    session: ReplicationSession

    def kick(self) -> None: ...


class TwinRequests:
    """One second link's requests (see the module docstring)."""

    def __init__(
        self, link: TwinLink, notice: Notice | None, on_notice: NoticeHandler, max_message_bytes: int
    ) -> None:
        self.link = link
        self.notice = notice
        self.on_notice = on_notice
        self.session = LeasingSession(max_message_bytes=max_message_bytes)
        self._versions_rid: int | None = self.session.request(
            VERSIONS_OP, ours().to_body(), now=trio.current_time(), timeout=_NO_TIMEOUT
        )
        self._flush()

    def receive(self, message: bytes) -> None:
        """One of the sub-protocol's messages from the peer (a malformed one: ProtocolError)."""
        session = self.session
        session.receive(message)
        while (event := session.next_event()) is not None:
            if isinstance(event, Request):
                self._serve(event)
            elif not isinstance(event, Cancelled) and event.rid == self._versions_rid:
                self._versions_rid = None
                self._settle(event.body if isinstance(event, Answer) else None)
        self._flush()

    def tell(self, notice: Notice) -> None:
        """Send the peer the duplicate-identity notice, once it said it understands it."""
        self.notice = notice
        if self._versions_rid is None and self.link.agreement is not None:
            self._send_notice()
            self._flush()

    def _send_notice(self) -> None:
        agreement = self.link.agreement
        if self.notice is not None and agreement is not None and IDENTITY_FEATURE in agreement.features:
            self.session.request(
                IDENTITY_OP, self.notice.to_body(), now=trio.current_time(), timeout=_NO_TIMEOUT
            )
        self.notice = None

    def _serve(self, request: Request) -> None:
        if request.op == VERSIONS_OP:
            self.link.session.peer_stated(stated(request.body))
            self.session.answer(request.rid, ours().to_body())
        elif request.op == IDENTITY_OP:
            try:
                self.on_notice(request.body)
            except LatticedError as exc:
                self.session.refuse(request.rid, exc)
                return
            self.session.answer(request.rid, {})
        else:
            self.session.refuse(
                request.rid,
                LatticedError(f"{request.op} is not served on a second link of one identity"),
            )

    def _settle(self, body: dict[str, Any] | None) -> None:
        peer = UNSTATED
        if body is not None:
            try:
                peer = LinkVersions.from_body(body)
            except LatticedError:
                peer = UNSTATED
        try:
            agreement = agree(ours(), peer)
        except LatticedError:  # its HELLO passed, so it speaks that version whatever it says
            agreement = agree(ours(), UNSTATED)
        self.link.agreement = agreement
        self.link.session.agree_features(agreement.features)
        self._send_notice()

    def _flush(self) -> None:
        messages = self.session.messages_to_send()
        if messages:
            self.link.extra_out.extend(messages)
            self.link.kick()
