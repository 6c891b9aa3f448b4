"""The trio shell around :class:`~latticed.protocol.replication.ReplicationSession`: one task group per
peer that moves bytes between a :class:`SecureStream` and the session, answers the session's events from
the :class:`ReplicaHost` (the daemon's store), and owns the timeouts.

Errors stop at the per-peer boundary: a protocol or integrity failure closes that one peer, is logged with
its identity and counted; the daemon and every other peer carry on.

Every per-link queue is bounded: received deltas by the session's window (the verify and ack channels
hold at most that many; core-2 ones by the window the link agreed on, at most
:data:`~latticed.protocol.versions.WIDE_WINDOW2`, all but ``window`` of them small, see
protocol/core2_session.py), what waits to be sent by the session (the reader stops reading a peer while its
answers pile up, see :meth:`ReplicationSession.accepts_input`), and a peer that stops reading altogether
is dropped once a send makes no progress for :data:`SEND_TIMEOUT_S` (its messages alone would otherwise
keep it "alive").

What peers make us remember is bounded as well: per link and in total, queues a peer names that we do not
hold (:class:`KeyBudget`, forgotten when the link ends), and between connections a :class:`PeerMemory` of
our own queues for at most :data:`MAX_PEER_MEMORIES` peers, :data:`MAX_MEMORY_ENTRIES` queue entries and
:data:`MEMORY_TTL_S` seconds. :meth:`Gossip.stats` counts both.

Why one module: :class:`Gossip` is the one trio shell of a peer link: its tasks (reader, writer, the
session's events, keepalive and timeouts) share the session and the stream, and their cancellation rules
only make sense read together.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from latticed.crdt import queue2
from latticed.crdt.head import SignedHead
from latticed.crdt.queue import QueueDelta, Summary, VerifiedDelta
from latticed.errors import (
    ConnectionClosedError,
    IncompatiblePeerError,
    IntegrityError,
    LatticedError,
    LocalProtocolError,
    ProtocolError,
)
from latticed.net.core2_host import OWN_RACES, Core2Host, PendingMerge2
from latticed.net.queue_errors import QueueErrors
from latticed.net.transport import SecureStream
from latticed.net.twin_link import TwinRequests
from latticed.process.logs import get_logger, log_event
from latticed.process.ticks import TICK_S, sleep_until_tick
from latticed.protocol.core2_session import Core2Event, Core2Link, Delta2Received, EagerCounts, NeedDelta2
from latticed.protocol.core2_steps import Outgoing2
from latticed.protocol.core2_wire import CORE2_NAMES, Summary2
from latticed.protocol.graft import Arrivals
from latticed.protocol.handshake import Role
from latticed.protocol.identity_runs import (
    IDENTITY_OP,
    DuplicateIdentities,
    ForeignHead,
    IdentityGuard,
    Notice,
    RunSeen,
    foreign_head,
    notices_for,
)
from latticed.protocol.lease_forwarding import is_leasing_message
from latticed.protocol.link_gone import LINK_GONE_FEATURE, LostLinks, names
from latticed.protocol.replication import (
    DEFAULT_MAX_PEER_KEYS,
    DeltaReceived,
    Event,
    KeyBudget,
    LinkTree,
    NeedDelta,
    PeerMemory,
    QueueKey,
    ReplicationSession,
    SessionState,
    key_label,
)
from latticed.protocol.replication_messages import Hello, Pong, decode_message, message_type_name
from latticed.protocol.versions import WIDE_WINDOW2, Agreement

log = get_logger(__name__)

#: Keep-alive tick: every link of the daemon is looked at on the same tick (:mod:`latticed.process.ticks`),
#: so an idle daemon wakes once per tick for all its links. The side that dialled sends a PING unless the link
#: carried messages both ways within the last half tick; the side that accepted only answers. Either way
#: each end of a healthy link hears the other at least every 1.5 ticks (docs/operations.md, "Dead peers").
PING_INTERVAL_S = TICK_S
#: A link silent for longer is closed at the next tick: a dead peer is noticed 30-40 s after its last word.
PEER_TIMEOUT_S = 30.0
#: A peer that takes none of what we send for this long, or takes it slower than the receiving end's floor
#: (:data:`~latticed.net.transport.MIN_PROGRESS_RATE`) until :data:`PEER_TIMEOUT_S` behind it, is dropped
#: (see :class:`SecureStream`).
SEND_TIMEOUT_S = 20.0
#: The reader stops reading a peer while this much of our answers to it waits to be sent.
MAX_OUTBOX_BYTES = 1 << 20
#: What we remember of peers between their connections (digests then carry only changes): at most this
#: many peers, the most recent...
MAX_PEER_MEMORIES = 256
#: ... holding at most this many queue entries together (each lists at most twice the queues we hold)...
MAX_MEMORY_ENTRIES = 1 << 17
#: ... for at most this long: a peer away longer gets a full digest, as after a restart.
MEMORY_TTL_S = 3600.0
#: A HAVE waits this long for the eager copy before its WANT grafts the link (Plumtree's timer): long
#: enough for a relay's push on a busy host, short enough that a broken tree heals within a second.
GRAFT_TIMEOUT_S = 0.3
#: ... at first: each link learns how late announced news actually arrives on this host (a busy host
#: holds an eager copy back for up to a second) and waits that long, up to this cap, within which a
#: dead eager link is always repaired (ReplicationSession.graft_timeout_max).
GRAFT_TIMEOUT_MAX_S = 2.0
#: How long HAVEs wait to go out together (see ReplicationSession.have_linger): at a live stream's rate one
#: HAVE per lazy link covers many records; a tree whose eager copy went missing is repaired this much later.
HAVE_LINGER_S = 0.5
#: A received delta of at most this many records is stored after the previous one (see ``_verifier``).
SERIAL_MERGE_RECORDS = 64
#: A healthy link is never silent this long (see :data:`PING_INTERVAL_S`).
STALE_AFTER_S = 2 * PING_INTERVAL_S
#: A peer that claims records of one of our own queues, while we catch up nothing of them for this long,
#: stops holding back our writes to it (see :meth:`Gossip.behind_reason`).
OWN_CATCH_UP_S = 30.0
#: A second connection of an identity that has a live link says within this long which run it is (its
#: HELLO), or is closed.
HELLO_WAIT_S = 10.0
#: How long a link we would refuse is read past its HELLO for the redial's word (protocol/link_gone.py):
#: the word goes in the HELLO's own write, so it comes with it or right after it; a peer with nothing to
#: name may say nothing more until our HELLO, which we would then wait for in vain.
GONE_WAIT_S = 2.0
#: A link whose send has waited this long for the peer to take a piece of it is dead on that side when
#: the peer dials again meanwhile (it said hello on a new link: it is alive, and reads what it keeps).
WRITER_BLOCKED_S = PING_INTERVAL_S
#: Reads of a delta for a peer that lost their rows or queue to a commit of ours meanwhile, before that
#: delta is left for the commit's change to ask again (see :meth:`Gossip._read_again`).
READ_TRIES = 3
_Read = TypeVar("_Read")
_IGNORED = -1
#: The traffic counters' names by direction and message type (built once, not per message).
_COUNTER_NAMES: dict[tuple[str, str], tuple[str, str]] = {}
#: The same names by a message's direction and first two bytes, a short array's (at most 7,680 entries).
_NAMES_BY_BYTES: dict[tuple[str, bytes], tuple[str, str]] = {}


class PendingMerge(Protocol):
    """A verified delta on its way into the store."""

    async def result(self) -> tuple[Summary, bool]:
        """Wait until it is durably stored; returns (what we hold now, whether it changed anything)."""
        ...

    def settled(self) -> tuple[Summary, bool] | None:
        """:meth:`result` without waiting, if it is durably stored already (None: not yet, or failed)."""
        ...

    @property
    def ahead(self) -> Summary | None:
        """What we will hold once it is stored, if the host already serves its records to peers (a
        verified live push relayed before its commit); None otherwise."""
        ...

    # Optional: ``when_settled(callback) -> bool``, to have ``callback`` called on the event loop once
    # the merge is stored or failed, after every merge stored with it is (False: it cannot). Its ACK then
    # goes out from that call, with no task woken for it (see ``Gossip._settled``).


class ReplicaHost(Protocol):
    """What replication needs from the daemon: summaries, deltas, and verified merges."""

    def summaries(self) -> Mapping[QueueKey, Summary]: ...

    async def delta_for(
        self, key: QueueKey, since: Summary | None, max_records: int, max_bytes: int
    ) -> QueueDelta | None:
        """What ``since`` lacks (None: nothing to send). Rows or a queue a commit of ours took between the
        value's load and the read raise ``GapError`` or ``NotFoundError``: :meth:`Gossip._read_again`
        reads again, the host does not."""
        ...

    async def verify_delta(self, delta: QueueDelta) -> VerifiedDelta:
        """Check the owner's signatures and the hash chain (IntegrityError if forged); stores nothing."""
        ...

    def submit_merge(self, verified: VerifiedDelta, peer: bytes) -> PendingMerge:
        """Start joining and durably storing a verified delta, without waiting; merges submitted one
        after the other are applied in that order."""
        ...


class LinkExtension(Protocol):
    """Another sub-protocol multiplexed on the replication links (lease forwarding:
    :mod:`latticed.net.leasing`): the reader hands it the messages it ``accepts``, and the driver sends
    what it puts in :attr:`PeerLink.extra_out` (then it kicks the link)."""

    def accepts(self, message: bytes) -> bool: ...

    def link_up(self, link: PeerLink) -> None: ...

    def receive(self, link: PeerLink, message: bytes) -> None:
        """One of its messages; raising a ProtocolError closes the link."""
        ...

    def link_down(self, link: PeerLink) -> None: ...

    def notify(self, link: PeerLink, op: str, body: dict[str, Any]) -> None:
        """Send ``link`` a request it need not answer (the duplicate-identity notice), if it speaks it."""
        ...

    def hear_notices(self, handler: Callable[[PeerLink, dict[str, Any]], None]) -> None:
        """Hand the duplicate-identity notices peers send us to ``handler`` (raising a LatticedError
        refuses the notice)."""
        ...


@dataclass(slots=True)
class PeerLink:
    """A connected peer, as ``latticectl peers`` shows it."""

    public_key: bytes
    address: str
    via: str
    session: ReplicationSession
    wakeup: trio.Event = field(default_factory=trio.Event)
    #: Set when the driver took what waited to be sent: a reader paused by backpressure may go on.
    drained: trio.Event = field(default_factory=trio.Event)
    last_heard: float = 0.0
    #: When we last sent it something (trio time): traffic makes a keep-alive unnecessary.
    last_sent: float = 0.0
    connected_at: float = 0.0
    #: Messages of the :class:`LinkExtension`: sent by the driver before what the session queued once the
    #: session's opening went out (they are small answers a caller waits on; a delta can wait).
    extra_out: list[bytes] = field(default_factory=list)
    #: Whether the session's opening messages went out (until then, extension messages follow them).
    opened: bool = False
    #: The redial's word (protocol/link_gone.py): sent right after the HELLO, in the opening's write.
    after_hello: bytes | None = None
    #: The protocol version and features this link settled on (None: the peer has not answered yet).
    agreement: Agreement | None = None
    #: A second link of the identity, from another run of it (see :meth:`Gossip.run_peer`): its requests
    #: (the duplicate-identity notice) go through this instead of the extension.
    twin: TwinRequests | None = None
    #: On a first link whose identity connected again from another run: that link, the run, and the
    #: nonce of the PING whose PONG proves this link is still alive (then it is a duplicate identity).
    pending_twin: tuple[PeerLink, bytes, int] | None = None
    #: While its driver sleeps: when it wakes by itself (its session's next deadline, ``math.inf`` for
    #: none); ``-math.inf`` while it runs (it looks at the session again before it sleeps).
    sleeping_until: float = -math.inf
    #: The link's stream, for sends from other tasks while the driver sleeps (:meth:`Gossip._drive_now`).
    stream: SecureStream | None = None
    #: An event taken off the session that only the driver handles (it takes it first).
    held: Event | Core2Event | None = None
    #: Merges waiting for their ACK, in order, acknowledged from the storage's callback (Gossip._settled).
    acks: deque[tuple[DeltaReceived, PendingMerge]] = field(default_factory=deque)
    #: The acker's channel: a merge that failed goes there, and the acker ends the link with its error.
    to_acker: trio.MemorySendChannel[tuple[DeltaReceived, PendingMerge]] | None = None
    #: Core-2 merges submitted, for the core-2 acker (whichever task takes the delta submits it).
    to_ack2: trio.MemorySendChannel[tuple[Delta2Received, PendingMerge2]] | None = None
    #: Core-2 merges waiting for their ACK, in order, acknowledged from the storage's callback.
    acks2: deque[tuple[Delta2Received, PendingMerge2]] = field(default_factory=deque)
    #: Set once the link ended or failed (late storage callbacks then do nothing).
    ended: bool = False
    #: An error a callback met on this link's behalf: its driver raises it (ending the link).
    failure: Exception | None = None
    #: The last merge this link's deltas started (the next small one may wait for it).
    previous: PendingMerge | None = None
    #: Whether the verifier has deltas to check (the reader then leaves the next ones to it).
    verifier_busy: bool = False
    #: The scope of the link's tasks (None until they start): a link whose driver is stuck in a send
    #: cannot see that it was replaced, so the replacing link cancels it.
    scope: trio.CancelScope | None = None
    #: Whether a task is doing the sleeping driver's work now (:meth:`Gossip._drive_now`): what that
    #: work causes on this link (a store's hook telling every link) is left to the driver.
    relaying: bool = False

    def heard(self) -> float:
        """When the peer was last heard (trio time): its last whole message, or later bytes of one still
        arriving at the transport's floor rate (:attr:`SecureStream.progress_at`): a large message over a
        slow link takes longer than the silence bounds, and its peer is not silent meanwhile."""
        stream = self.stream
        return self.last_heard if stream is None else max(self.last_heard, stream.progress_at)

    def kick(self) -> None:
        """Wake the driver whatever the session holds (a replaced link, an extension's messages)."""
        self.wakeup.set()

    def nudge(self) -> None:
        """Wake the driver only if the session has something for it now, or sooner than it would wake:
        each pass of a driver with nothing to do costs a scheduler pass per record on a busy link."""
        session = self.session
        if session.has_work() or self.extra_out:
            self.wakeup.set()
            return
        deadline = session.next_deadline()
        if deadline is not None and deadline < self.sleeping_until:
            self.wakeup.set()


def _ahead(theirs: Summary, held_end: int) -> str:
    """What a peer holds of our queue past our end: the records it holds there (it may have dropped the
    older ones), else the offset its head reaches."""
    missing = theirs.held_end - max(held_end, theirs.held_start)
    if missing > 0:
        return f"holds {missing} more record(s) of it than this daemon (to offset {theirs.held_end})"
    return f"holds a head of it at offset {theirs.held_end}, past this daemon's {held_end}"


@dataclass
class Gossip:
    """All replication links of one daemon."""

    host: ReplicaHost
    local_public_key: bytes
    subscription: tuple[str, ...] | None = None
    window: int = 8
    max_records: int = 4096
    max_message_bytes: int = 1 << 20
    max_outbox_bytes: int = MAX_OUTBOX_BYTES
    send_timeout: float = SEND_TIMEOUT_S
    graft_timeout: float = GRAFT_TIMEOUT_S
    graft_timeout_max: float | None = GRAFT_TIMEOUT_MAX_S
    have_linger: float = HAVE_LINGER_S
    on_peer_change: Callable[[], None] | None = None
    #: Lease forwarding on the same links (None: replication only).
    extension: LinkExtension | None = None
    links: dict[bytes, PeerLink] = field(default_factory=dict)
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "rejected_deltas": 0,
            "protocol_errors": 0,
            "deltas_in": 0,
            "deltas_out": 0,
            "stalled_peers": 0,
            "incompatible_peers": 0,
        }
    )
    #: Peers whose last link ended for want of a common protocol version: the reason (both sides'
    #: versions) and the address, until a link with them works again.
    incompatible: dict[bytes, tuple[str, str]] = field(default_factory=dict)
    #: Messages and bytes (decrypted payloads) per direction and message type, since start: where the
    #: copies and bytes of replication come from (``received_delta``, ``received_delta_bytes``...).
    traffic: dict[str, int] = field(default_factory=dict)
    _nonces: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: Random per run: a peer that sees it change knows we may have forgotten, or lost, anything.
    incarnation: bytes = field(default_factory=lambda: os.urandom(16))
    #: Queues we do not hold that all links together track for their peers (see :class:`KeyBudget`).
    key_budget: KeyBudget = field(default_factory=KeyBudget)
    #: Deltas of each queue on their way into the store, received on any link (no link grafts meanwhile).
    arrivals: Arrivals = field(default_factory=Arrivals)
    max_peer_keys: int = DEFAULT_MAX_PEER_KEYS
    #: What we remember of each peer from its last connection, and since when (trio time), oldest first.
    memories: dict[bytes, tuple[float, PeerMemory]] = field(default_factory=dict)
    max_memories: int = MAX_PEER_MEMORIES
    max_memory_entries: int = MAX_MEMORY_ENTRIES
    _memory_entries: int = 0
    #: (peer, our queue) -> when the peer was first seen holding more of it than we do, and our end then.
    #: Kept across reconnects, so a peer cannot restart its :data:`OWN_CATCH_UP_S` by dialling again.
    _claims: dict[tuple[bytes, QueueKey], tuple[float, int]] = field(default_factory=dict)
    #: The last verification error each peer caused about each queue (``latticectl queue why``).
    queue_errors: QueueErrors = field(default_factory=QueueErrors)
    #: Second links: an identity connected again from another run while its first link is live (a copied
    #: data directory). Both are served, so what each run holds still meets.
    twins: dict[bytes, PeerLink] = field(default_factory=dict)
    #: Identities seen running twice on our links, and which run came first.
    duplicates: DuplicateIdentities = field(default_factory=DuplicateIdentities)
    #: Per peer, the last link to it that ended here: a redial names it (protocol/link_gone.py).
    lost_links: LostLinks = field(default_factory=LostLinks)
    #: Whether this run may sign (another run of our identity, told of by a peer or seen in a head).
    identity: IdentityGuard = field(init=False)
    #: When this run started (Unix ms): a head of ours signed later, that we did not sign, is foreign.
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    #: The head we hold of one of our own queues (None: the foreign-head check is off).
    own_head: Callable[[QueueKey], SignedHead | None] | None = None
    #: Called when a peer's first digest arrives (the start gate waits for them).
    on_summaries: Callable[[], object] | None = None
    #: Queues on the v2 fork core (None: links carry core 1 only, and a peer's core-2 messages close
    #: them). Each link's :class:`Core2Link` is sent nothing before both sides agreed on ``heads-v2``.
    host2: Core2Host | None = None
    _foreign_logged: set[QueueKey] = field(default_factory=set)
    #: The core-2 links in :attr:`links` count their eager and pruned queues here (cut-off queues).
    eager2: EagerCounts = field(default_factory=EagerCounts)
    _relayed: Callable[[QueueKey, Summary | None], QueueDelta | None] | None = field(init=False, default=None)
    _verify_now: Callable[[QueueDelta], VerifiedDelta | None] | None = field(init=False, default=None)
    _delta2_now: Callable[[QueueKey, queue2.Summary | None, int, int], Outgoing2 | None] | None = field(
        init=False, default=None
    )

    def __post_init__(self) -> None:
        self.identity = IdentityGuard(self.incarnation)
        # Optional on a host: ``relayed_delta(key, since)``, the push as it came that extends what a peer
        # summarised by ``since`` holds, if one is on its way to our store (None: ``delta_for`` decides).
        self._relayed = getattr(self.host, "relayed_delta", None)
        # Optional too: ``verify_now(delta)``, a small delta verified on the event loop (None: too big).
        self._verify_now = getattr(self.host, "verify_now", None)
        # And on a core-2 host: ``delta2_now(...)``, ``delta2_for``'s answer when it needs no read (None:
        # ask ``delta2_for``), so a relayed push goes on from the task that learnt of its commit.
        self._delta2_now = getattr(self.host2, "delta2_now", None)
        for name in ("duplicate_identities", "identity_notices", "foreign_heads", "delta_reads_raced"):
            self.counters.setdefault(name, 0)
        if self.extension is not None:
            self.extension.hear_notices(self.identity_notice)

    # ------------------------------------------------------------------ the daemon calls these
    def local_change(
        self,
        key: QueueKey,
        summary: Summary,
        source: bytes | None = None,
        source_link: PeerLink | None = None,
    ) -> None:
        """A queue changed here (own write, or merged from peer ``source`` or from ``source_link``): tell
        every other link, the other run's too when an identity runs twice."""
        now = trio.current_time()
        for public_key, link in self.links.items():
            if link is not source_link and public_key != source:
                link.session.local_update(key, summary, now)
                self._drive_now(link)
        for link in self.twins.values():
            if link is not source_link:
                link.session.local_update(key, summary, now)
                self._drive_now(link)

    def local_change2(self, key: QueueKey, summary: Summary2, source_link: PeerLink | None = None) -> None:
        """A core-2 queue changed here (own commit, recovery, truncation, or a merge from any link): every
        link hears of it (the link it came from judges by the summary whether it is news there), but
        ``source_link``, whose push verified here is relayed before its commit."""
        for link in (*self.links.values(), *self.twins.values()):
            core2 = link.session.core2
            if core2 is not None and link is not source_link:
                core2.local_update(key, summary)
                self._drive_now(link)

    def unheard_links(self) -> int:
        """Connected peers whose first digest has not come yet."""
        return sum(1 for link in self.links.values() if not link.session.digest_received)

    def identity_notice(self, link: PeerLink, body: dict[str, Any]) -> None:
        """A peer tells us it sees another run of our identity (malformed: RemoteProtocolError)."""
        notice = Notice.from_body(body)
        self.counters["identity_notices"] += 1
        run = self.identity.notice(notice, link.public_key, time.time())
        if run is None:
            return
        log_event(
            log,
            "identity.duplicate",
            level=logging.WARNING,
            incarnation=self.incarnation.hex(),
            other_incarnation=run.incarnation.hex(),
            other_address=run.address,
            via=link.public_key.hex(),
            this_daemon_is="later" if run.later else "earlier",
            refusing_writes=self.identity.refusal() is not None,
        )

    def behind_reason(self, key: QueueKey, held_end: int) -> str | None:
        """Why we must not write our own queue ``key`` yet (None: go ahead).

        A connected peer holding records of our own queue past ``held_end`` means our store is older than
        what we once signed: restored from a backup, or an old disk image. A write now would sign a second
        history at offsets that peer holds, a fork that can never be undone, while the catch-up from it
        (which runs on its own) would continue the one true history. So writes wait for it. A peer that
        claims more but sends none of it for :data:`OWN_CATCH_UP_S`, while our end does not move, is
        ignored from then on (and logged): a lying peer cannot hold our writes back for longer."""
        for public_key, link in self.links.items():
            theirs: Summary | None = link.session.peer_summary(key)
            if theirs is None and (core2 := link.session.core2) is not None:
                theirs2 = core2.peer_summary(key)  # a core-2 queue: the records it holds end there
                theirs = None if theirs2 is None else Summary(held_end=theirs2.core.held_end)
            claim = (public_key, key)
            if theirs is None or theirs.held_end <= held_end:  # every write passes here: keep it cheap
                if self._claims:
                    self._claims.pop(claim, None)
                continue
            now = trio.current_time()
            since, end_then = self._claims.setdefault(claim, (now, held_end))
            if end_then == _IGNORED:
                continue
            if held_end > end_then:  # records are arriving: the claim is being made good
                self._claims[claim] = since, end_then = now, held_end
            if now - since > OWN_CATCH_UP_S:
                log_event(
                    log,
                    "peer.claim_not_sent",
                    level=logging.WARNING,
                    peer=public_key.hex(),
                    queue=key_label(key),
                    claimed_end=theirs.held_end,
                    held_end=held_end,
                )
                self._claims[claim] = (since, _IGNORED)  # until the peer stops claiming it
                continue
            return (
                f"peer {public_key.hex()[:16]} {_ahead(theirs, held_end)} (a "
                "store restored from an older copy?), and this daemon is catching them up; a write now "
                "would sign a second history. Retry once `latticectl peers` shows that peer in sync"
            )
        return None

    def is_connected(self, public_key: bytes) -> bool:
        return public_key in self.links

    def stats(self) -> dict[str, int]:
        """The counters, and what peers make us remember now: ``peer_keys`` (queues we do not hold,
        tracked for connected peers), ``peer_keys_refused`` (not tracked: a bound was reached, since
        start), ``peer_memories`` and ``peer_memory_entries`` (kept between connections)."""
        return {
            **self.counters,
            **self.traffic,
            "peer_keys": self.key_budget.used,
            "peer_keys_refused": self.key_budget.refused,
            "peer_memories": len(self.memories),
            "peer_memory_entries": self._memory_entries,
        }

    def trees(self) -> tuple[dict[bytes, LinkTree], list[QueueKey]]:
        """Each connected link's place in the eager trees (:meth:`ReplicationSession.tree`), and the
        queues of other owners that every link carrying them pruned: no peer pushes them to us, so each
        record waits for a HAVE and a graft timer (a replica cut off from the eager tree)."""
        trees = {key: link.session.tree() for key, link in self.links.items()}
        # Cut off: pruned on some link, and no link carries it unpruned. Core 2: counted as the links
        # prune, graft, open and close (:class:`EagerCounts`, trees26: O(cut) here). Core 1 (few
        # queues): its pruned keys, and a ``carries`` call where a link did not prune one.
        own = self.local_public_key
        cut = {key for key in self.eager2.cut if key[0] != own}
        pruned1 = {key: set(link.session.pruned_in1()) for key, link in self.links.items()}
        cut1 = {key for keys in pruned1.values() for key in keys if key[0] != own}
        for public_key, link in self.links.items():
            if not cut1:
                break
            for key in cut1 - pruned1[public_key]:
                if link.session.carries(key):
                    cut1.discard(key)
        return trees, sorted(cut | cut1)

    def peer_lag(self) -> dict[str, dict[str, int]]:
        """Per peer, per queue: how many records the peer is behind us (negative: ahead)."""
        local = self.host.summaries()
        local2 = self.host2.summaries2() if self.host2 is not None else {}
        return {key.hex(): self.link_lag(link, local, local2) for key, link in self.links.items()}

    def link_lag(
        self,
        link: PeerLink,
        local: Mapping[QueueKey, Summary] | None = None,
        local2: Mapping[QueueKey, Summary2] | None = None,
    ) -> dict[str, int]:
        """Per queue we hold that the peer of ``link`` said it holds, on either core: how many records
        it is behind us (negative: ahead). ``local``/``local2``: our summaries, when already read."""
        if local is None:
            local = self.host.summaries()
        lags = {
            key_label(key): ours.held_end - theirs.held_end
            for key, theirs in link.session.peer_summaries().items()
            if (ours := local.get(key)) is not None
        }
        core2 = link.session.core2
        if core2 is None or self.host2 is None:
            return lags
        if local2 is None:
            local2 = self.host2.summaries2()
        for key, ours2 in local2.items():
            theirs2 = core2.peer_summary(key)
            if theirs2 is not None:
                lags[key_label(key)] = ours2.core.held_end - theirs2.core.held_end
        return lags

    # ------------------------------------------------------------------ one peer
    async def run_peer(self, stream: SecureStream, address: str, via: str) -> None:
        """Replicate with one authenticated peer until either side goes away or breaks the protocol."""
        peer = stream.remote_public_key
        peer_hex = peer.hex()
        if peer == self.local_public_key:
            log_event(log, "peer.self", address=address)
            await stream.aclose()
            return
        old = self.links.get(peer)
        first: bytes | None = None
        twin_of: PeerLink | None = None
        if old is not None and not self._is_stale(old) and old.session.peer_incarnation is not None:
            # Which run is this? The same one (both sides dialled, or a reconnect) or another daemon with a
            # copy of the identity: its HELLO says.
            first = await _first_message(stream)
            if first is None:
                await stream.aclose()
                return
            incarnation = _hello_incarnation(first)
            old = self.links.get(peer)
            if old is not None and incarnation is not None and incarnation != old.session.peer_incarnation:
                second = self.twins.get(peer)
                if second is not None and second.session.peer_incarnation == incarnation:
                    # The second run again (its old link half-open, or both sides dialled): a reconnect
                    # of that run, decided below as the first run's would be, against its old link.
                    twin_of, old = old, second
                elif second is not None:
                    log_event(
                        log,
                        "peer.duplicate_identity_third",
                        level=logging.WARNING,
                        peer=peer_hex,
                        address=address,
                        incarnation=incarnation.hex(),
                    )
                    await stream.aclose()
                    return
                else:
                    twin_of, old = old, None
        if old is not None:
            # Both sides dialled, or the old link died without either side noticing yet. A link that has
            # been silent for two ping intervals is stale (a fresh handshake just proved the path works, and
            # both ends see the same silence, so they agree). Two links the same run of the peer dialled are
            # its redial: it said hello on the new one, which it does only on a link it took (it closes a
            # dial that finds a live link), so it let the old one go; the later handshake is the newer
            # link. Otherwise (one link dialled by each side) keep the connection opened by the smaller
            # key, so both sides pick the same one, unless the peer's word names the old link as gone on
            # its side (protocol/link_gone.py).
            stale = self._is_stale(old)
            redial = not stale and _redial(old, via, first)
            gone = False
            if stale:
                keep_new = True
            elif redial:
                keep_new = stream.handshake.opening_ms > _opening_ms(old)
            else:
                keep_new = (self.local_public_key < peer) == (via != "incoming")
            if not keep_new and first is not None and _speaks_gone(old):
                # The peer may say, right after its HELLO, that the old link is gone on its side (it
                # names it by that link's secret session id, so only the peer can, and only of a link
                # it lost): then this is its redial, not a simultaneous dial, and the old link is dead.
                word = await _first_message(stream, GONE_WAIT_S)
                old_now = self.links.get(peer) if twin_of is None else self.twins.get(peer)
                gone = (
                    word is not None
                    and old_now is old
                    and old.stream is not None
                    and names(word, old.stream.handshake.session_id, stream.handshake.session_id)
                )
                # No word (the peer forgot the link, or never settled it), but the old link died while
                # we waited, or ended (no link of the peer's is left): refusing would leave the peer in
                # the dark until its next dial. (A second run's link that ended is not taken here: its
                # first run's link may have ended too.)
                ended = old_now is None and twin_of is None
                stale = not gone and (ended or (old_now is old and self._is_dead(old)))
                keep_new = gone or stale
            if not keep_new:
                log_event(log, "peer.duplicate", peer=peer_hex, address=address, redial=redial)
                await stream.aclose()
                return
            if stale:
                log_event(log, "peer.replaced_stale", peer=peer_hex, address=address)
            elif redial:
                log_event(log, "peer.replaced_redial", peer=peer_hex, address=address, old=old.address)
            elif gone:
                log_event(log, "peer.replaced_gone", peer=peer_hex, address=address, old=old.address)
        stream.send_timeout = self.send_timeout
        stream.slow_timeout = PEER_TIMEOUT_S  # behind the floor as long as our silence rule allows
        session = ReplicationSession(
            subscription=self.subscription,
            window=self.window,
            max_records=self.max_records,
            max_message_bytes=self.max_message_bytes,
            max_outbox_bytes=self.max_outbox_bytes,
            max_peer_keys=self.max_peer_keys,
            key_budget=self.key_budget,
            incarnation=self.incarnation,
            graft_timeout=self.graft_timeout,
            graft_timeout_max=self.graft_timeout_max,
            arrivals=self.arrivals,
            have_linger=self.have_linger,
            notices=False,  # the driver has no use for them
            received_apart=True,  # the reader hands them to the verifier
        )
        if self.host2 is not None:
            session.attach_core2(Core2Link())
        now = trio.current_time()
        link = PeerLink(peer, address, via, session, last_heard=now, connected_at=now, stream=stream)
        if twin_of is None:
            link.after_hello = self.lost_links.word_for(peer, stream.handshake.session_id, now=now)
            replaced = self.links.get(peer)
            if replaced is not None and replaced.session.core2 is not None:
                replaced.session.core2.unshare()  # it counts no more (it may run a while yet)
            self.links[peer] = link
            if session.core2 is not None:
                session.core2.share(self.eager2)
        else:
            self.twins[peer] = link
        if old is not None:
            old.kick()
            if old.scope is not None and _writer_blocked(old, now):
                old.scope.cancel()  # its driver waits in a send and would not see the kick
        self._changed()
        log_event(log, "peer.connected", peer=peer_hex, address=address, via=via)
        # A second run's link remembers nothing: the memory of the identity is its first run's.
        session.start(self.host.summaries(), memory=self._recall(peer) if twin_of is None else None)
        if session.core2 is not None and self.host2 is not None:
            session.core2.start(self.host2.summaries2())
        if twin_of is not None:
            self._twin_up(twin_of, link, first)
        else:
            if self.extension is not None:
                self.extension.link_up(link)
            if old is not None and old.pending_twin is not None:
                # The first run's link was replaced before it answered the PING that confirms a second
                # run: ask again on this one, or the duplicate would never be logged or told.
                second, incarnation, _ = old.pending_twin
                old.pending_twin = None
                if self.twins.get(peer) is second:
                    self._ask_live(link, second, incarnation)
        reason = "closed"
        # Whether the link died rather than being closed on purpose by either end (the peer's final frame;
        # our shutdown, replacement or answer to an error): only a lost link is named on a redial.
        lost = False
        # The session admits at most ``window`` unacknowledged deltas (a peer sending more breaks the
        # protocol), and each is in one of these channels or in the hands of the task between them.
        to_verify, verify_queue = trio.open_memory_channel[DeltaReceived](self.window)
        to_ack, ack_queue = trio.open_memory_channel[tuple[DeltaReceived, PendingMerge]](self.window)
        # Core-2 deltas: submitted by the driver as they come, acknowledged in order once durable (as many
        # as the widest window the link may agree on).
        to_ack2, ack2_queue = trio.open_memory_channel[tuple[Delta2Received, PendingMerge2]](
            max(self.window, WIDE_WINDOW2)
        )
        link.to_acker, link.to_ack2 = to_ack, to_ack2
        try:
            try:
                async with trio.open_nursery() as nursery:
                    link.scope = nursery.cancel_scope
                    nursery.start_soon(self._reader, stream, link, nursery.cancel_scope, to_verify, first)
                    nursery.start_soon(self._driver, stream, link, nursery.cancel_scope, to_verify, to_ack2)
                    nursery.start_soon(self._verifier, link, verify_queue, to_ack)
                    nursery.start_soon(self._acker, link, ack_queue)
                    nursery.start_soon(self._acker2, link, ack2_queue)
                    nursery.start_soon(self._pinger, link, stream.handshake.role is Role.INITIATOR)
            except BaseExceptionGroup as group:
                raise _first_error(group) from group
        except IntegrityError as exc:
            self.counters["rejected_deltas"] += 1
            reason = f"integrity: {exc}"
            log_event(log, "peer.rejected", level=logging.WARNING, peer=peer_hex, reason=str(exc))
        except IncompatiblePeerError as exc:
            # Both sides authenticated: not a key or clock problem, and said so (docs/operations.md).
            self.counters["incompatible_peers"] += 1
            self.incompatible[peer] = (str(exc), address)
            reason = f"incompatible: {exc}"
            log_event(log, "peer.incompatible", level=logging.WARNING, peer=peer_hex, reason=str(exc))
        except ProtocolError as exc:
            self.counters["protocol_errors"] += 1
            reason = f"protocol: {exc}"
            log_event(log, "peer.protocol_error", level=logging.WARNING, peer=peer_hex, reason=str(exc))
        except ConnectionClosedError as exc:
            reason = str(exc)
            # Lost, unless a send failed just as the peer's final frame came: its end may look alive.
            lost = not stream.peer_ended()
            if stream.send_stalled:
                self.counters["stalled_peers"] += 1
                log_event(log, "peer.stalled", level=logging.WARNING, peer=peer_hex, reason=reason)
        except LatticedError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log_event(log, "peer.error", level=logging.WARNING, peer=peer_hex, reason=str(exc))
        except Exception as exc:
            # A bug on our side must not take the daemon down with one peer: log it loudly, drop the peer.
            reason = f"internal error: {type(exc).__name__}"
            log_event(log, "peer.internal_error", level=logging.ERROR, exc_info=exc, peer=peer_hex)
        finally:
            link.ended = True
            link.acks.clear()
            link.acks2.clear()
            if self.extension is not None and twin_of is None:
                self.extension.link_down(link)
            remembered = session.memory()
            session.release()
            if remembered is not None and twin_of is None:
                self._remember(peer, remembered)
            first_run_gone = self.links.get(peer) is link
            if first_run_gone:
                self.lost_links.ended(
                    peer,
                    stream.handshake.session_id,
                    said_hello=session.peer_incarnation is not None,
                    agreed=_speaks_gone(link),
                    closed=not lost,
                    now=trio.current_time(),
                )
                del self.links[peer]
                if session.core2 is not None:
                    session.core2.unshare()
                self._changed()
            elif self.twins.get(peer) is link:
                del self.twins[peer]
                self._changed()
            if first_run_gone and (second := self.twins.pop(peer, None)) is not None:
                # The first run's link ended: the second one reconnects and becomes the first (its
                # link carries no lease forwarding), so it is closed now. Not when a newer link of the
                # first run replaced this one: that run is still connected, and so is the second.
                second.kick()
                self._changed()
            with trio.CancelScope(shield=True):
                await stream.aclose()
            log_event(log, "peer.disconnected", peer=peer_hex, address=address, reason=reason)

    async def _reader(
        self,
        stream: SecureStream,
        link: PeerLink,
        scope: trio.CancelScope,
        to_verify: trio.MemorySendChannel[DeltaReceived],
        first: bytes | None = None,
    ) -> None:
        """Feed the peer's messages to the session (``first``: one :meth:`run_peer` read already).
        Received deltas go straight to the verifier (the session admits at most ``window`` of them
        unacknowledged, which the channel holds): no pass of the driver per delta; or the reader verifies
        one itself when that needs no waiting (:meth:`_verify_here`)."""
        session = link.session
        while True:
            while not session.accepts_input():
                # Our answers pile up (the peer is not reading them, or we cannot keep up): read no more
                # until the driver took them, so the peer's own socket slows it down.
                link.drained = trio.Event()
                await link.drained.wait()
            if first is not None:
                message: bytes | None = first
                first = None
            else:
                message = await stream.receive()
            if message is None:
                scope.cancel()
                return
            link.last_heard = trio.current_time()
            self._count("received", message)
            # Hook: messages of the lease-forwarding sub-protocol go to the extension, not the session
            # (on a second run's link, to its own requests).
            if link.twin is not None and is_leasing_message(message):
                link.twin.receive(message)
                continue
            if self.extension is not None and self.extension.accepts(message):
                self.extension.receive(link, message)
                continue
            heard = session.digest_received
            session.receive_message(message, link.last_heard)
            while (received := session.next_received()) is not None:
                if not self._verify_here(link, received, to_verify):
                    link.verifier_busy = True
                    to_verify.send_nowait(received)
            if self.incompatible and session.state is SessionState.OPEN:
                self.incompatible.pop(link.public_key, None)  # a HELLO we speak: no longer news
            if not heard and session.digest_received and self.on_summaries is not None:
                self.on_summaries()
            self._drive_now(link)

    def _is_stale(self, link: PeerLink) -> bool:
        return trio.current_time() - link.heard() > STALE_AFTER_S

    def _is_dead(self, link: PeerLink) -> bool:
        """Whether ``link`` is stale, or its writer waits on a peer that takes nothing (the peer's new
        dial shows it alive: it would read a link it kept)."""
        return self._is_stale(link) or _writer_blocked(link, trio.current_time())

    def _current(self, link: PeerLink) -> bool:
        """Whether ``link`` is still the link (or the second run's link) of its peer."""
        return self.links.get(link.public_key) is link or self.twins.get(link.public_key) is link

    def _twin_up(self, live: PeerLink, link: PeerLink, hello: bytes | None) -> None:
        """``link`` names another run of ``live``'s identity. Both are served from now on; it is a
        duplicate identity once ``live`` answers a PING (a daemon restarted while its old link was
        half-open is not), see :meth:`_confirm_twin`."""
        incarnation = _hello_incarnation(hello) if hello is not None else None
        assert incarnation is not None
        link.twin = TwinRequests(
            link, None, lambda body: self.identity_notice(link, body), self.max_message_bytes
        )
        self._ask_live(live, link, incarnation)

    def _ask_live(self, live: PeerLink, second: PeerLink, incarnation: bytes) -> None:
        """PING ``live``, the first run's link: its PONG confirms ``second`` (run ``incarnation``) as a
        duplicate identity (a newer PING on it, or on a link that replaced it, supersedes this one)."""
        nonce = next(self._nonces)
        live.pending_twin = (second, incarnation, nonce)
        live.session.ping(nonce)
        live.kick()

    def _confirm_twin(self, live: PeerLink) -> None:
        """``live`` answered while another run of its identity is connected: log and count it, and tell
        both runs which one we saw first (the later one stops signing until its operator decides)."""
        assert live.pending_twin is not None
        link, incarnation, _ = live.pending_twin
        live.pending_twin = None
        theirs = live.session.peer_incarnation
        if (
            self.twins.get(link.public_key) is not link
            or link.twin is None
            or theirs is None
            or theirs == incarnation  # a stale first link replaced by the second run itself: one run
        ):
            return
        sighting = self.duplicates.observe(
            link.public_key,
            RunSeen(theirs, live.address),
            live.connected_at,
            RunSeen(incarnation, link.address),
            trio.current_time(),
        )
        self.counters["duplicate_identities"] += 1
        log_event(
            log,
            "peer.duplicate_identity",
            level=logging.WARNING,
            peer=link.public_key.hex(),
            earlier_incarnation=sighting.earlier.incarnation.hex(),
            earlier_address=sighting.earlier.address,
            later_incarnation=sighting.later.incarnation.hex(),
            later_address=sighting.later.address,
            hint="two daemons run this identity (a copied data directory?); both links are served so "
            "their histories meet, and both are told",
        )
        to_earlier, to_later = notices_for(sighting)
        live_first = sighting.earlier.incarnation == theirs
        to_live, to_new = (to_earlier, to_later) if live_first else (to_later, to_earlier)
        link.twin.tell(to_new)
        if self.extension is not None:
            self.extension.notify(live, IDENTITY_OP, to_live.to_body())

    async def _driver(
        self,
        stream: SecureStream,
        link: PeerLink,
        scope: trio.CancelScope,
        to_verify: trio.MemorySendChannel[DeltaReceived],
        to_ack2: trio.MemorySendChannel[tuple[Delta2Received, PendingMerge2]] | None = None,
    ) -> None:
        """Answer the session's events and send what it queued; sleeps until kicked (no polling).
        Received deltas go down the ingest pipeline (:meth:`_verifier`, :meth:`_acker`); core-2 ones
        go to the store as they come (verified there, against the value they join) and to
        :meth:`_acker2`."""
        session = link.session
        while True:
            if link.failure is not None:
                raise link.failure
            if not self._current(link):
                scope.cancel()  # a newer connection to the same peer replaced this one
                return
            if link.extra_out and link.opened:
                await self._send(stream, link, self._take_extra(link))
            yielded = False
            session.tick(trio.current_time())
            while (event := _take_event(link)) is not None:
                if isinstance(event, NeedDelta):
                    relayed = self._relayed
                    delta = None if relayed is None else relayed(event.key, event.since)
                    if delta is None:
                        if not yielded:
                            # Let the tasks woken with us run first: when a commit lands, an owner's
                            # answer to a remote offer is queued by then and goes out before the delta of
                            # the same commit is even built. (A push relayed as it came is no commit's:
                            # a relay takes no scheduler pass for it.)
                            yielded = True
                            await trio.lowlevel.checkpoint()
                            if link.extra_out and link.opened:
                                await self._send(stream, link, self._take_extra(link))
                        read = functools.partial(
                            self.host.delta_for,
                            event.key,
                            event.since,
                            event.max_records,
                            self.max_message_bytes // 2,
                        )
                        try:
                            delta = await read()
                        except OWN_RACES as exc:
                            delta = await self._read_again(link, event.key, read, exc)
                    session.provide_delta(event.key, delta)
                    if delta is not None:
                        self.counters["deltas_out"] += 1
                elif isinstance(event, DeltaReceived):
                    link.verifier_busy = True
                    to_verify.send_nowait(event)
                elif isinstance(event, NeedDelta2):
                    await self._provide2(link, _asks2(link, event), stream)
                elif isinstance(event, Delta2Received):
                    if self.host2 is None or to_ack2 is None:
                        raise LocalProtocolError("a core-2 delta on a link without a core-2 host")
                    self._submit2(link, event, self.host2, to_ack2)
                elif (
                    isinstance(event, Pong)
                    and link.pending_twin is not None
                    and event.nonce == link.pending_twin[2]
                ):
                    self._confirm_twin(link)
                await self._flush(stream, link)
            await self._flush(stream, link)
            if session.has_work() or link.extra_out or not self._current(link):
                continue
            # Nothing awaits between here and the wait, so nothing asked of us since the flush is lost:
            # kicks while we worked (each a pass for nothing) are dropped with the old event.
            deadline = session.next_deadline()  # a graft timer, lingering HAVEs
            link.wakeup = trio.Event()
            if deadline is None:
                link.sleeping_until = math.inf
                await link.wakeup.wait()
            else:
                link.sleeping_until = deadline
                with trio.move_on_at(deadline):
                    await link.wakeup.wait()
            link.sleeping_until = -math.inf

    async def _provide2(
        self, link: PeerLink, events: list[NeedDelta2], stream: SecureStream | None = None
    ) -> None:
        """Answer the link's asks ``events`` (the session's, in its order): with one read of the store
        for all of them when the host reads several at once (``delta2_many``), else one at a time. A
        read answers a prefix within its byte budget; the answers go out (``stream``) before the rest
        are read, so a window of big deltas is not all held in memory at once, as one at a time."""
        core2 = link.session.core2
        assert core2 is not None and self.host2 is not None
        max_bytes = self.max_message_bytes // 2
        many = getattr(self.host2, "delta2_many", None)
        while events:
            answers: list[Outgoing2 | Exception | None] | None = None
            if many is not None and len(events) > 1:
                with contextlib.suppress(*OWN_RACES):  # then one at a time, each read again as it races
                    answers = await many([(e.key, e.since, e.max_records) for e in events], max_bytes)
            answered = len(events) if not answers else len(answers)  # (none: one at a time)
            for i, event in enumerate(events[:answered]):
                read = functools.partial(
                    self.host2.delta2_for, event.key, event.since, event.max_records, max_bytes
                )
                try:
                    if not answers:
                        out = await read()
                    elif isinstance(answer := answers[i], Exception):
                        raise answer
                    else:
                        out = answer
                except OWN_RACES as exc:
                    out = await self._read_again(link, event.key, read, exc)
                core2.provide_delta(event.key, out)
                if out is not None:
                    self.counters["deltas_out"] += 1
            events = events[answered:]
            if events and stream is not None:
                # The outbox holds them encoded now: the decoded deltas must not outlive the send too.
                answers = answer = out = None
                await self._flush(stream, link)

    async def _read_again(
        self, link: PeerLink, key: QueueKey, read: Callable[[], Awaitable[_Read | None]], exc: Exception
    ) -> _Read | None:
        """``read``, a delta for ``link`` from our own store, lost its rows (``GapError``) or its queue
        (``NotFoundError``) to a commit of ours in between (``exc``): no fault of the peer's, so not a
        reason to end its link (a peer's faults, a forged or malformed delta or a broken protocol, and any
        other error of ours still end it). Read again from the newer value; after :data:`READ_TRIES`,
        send nothing now (the commit's change asks again). Each raced read is counted
        (``delta_reads_raced``): many mean our commits outrun our reads, not that a peer misbehaves."""
        self.counters["delta_reads_raced"] += 1
        for _ in range(READ_TRIES - 1):
            await trio.lowlevel.checkpoint()  # the commit that took them publishes its value
            try:
                return await read()
            except OWN_RACES as again:
                exc = again
                self.counters["delta_reads_raced"] += 1
        log_event(
            log,
            "peer.delta_read_raced",
            peer=link.public_key.hex(),
            queue=key_label(key),
            tries=READ_TRIES,
            reason=str(exc),
            hint="the rows or queue left our store during each read; it is sent on the queue's next change",
        )
        return None

    def _submit2(
        self,
        link: PeerLink,
        event: Delta2Received,
        host2: Core2Host,
        to_ack2: trio.MemorySendChannel[tuple[Delta2Received, PendingMerge2]],
    ) -> None:
        """Hand a core-2 delta to the store. A host whose merges call back once stored (the daemon's) has
        them acknowledged from that callback (:meth:`_settled2`), in order; else :meth:`_acker2` waits.
        A live push the host verified already (``ahead``: net/core2_ahead.py) goes on to the other links
        now; its ACK still waits until it is durable."""
        traffic = self.traffic  # records DELTA2s carried, and those held already (a copy came first)
        traffic["delta2_records_in"] = traffic.get("delta2_records_in", 0) + len(event.delta.records)
        traffic["delta2_records_held"] = traffic.get("delta2_records_held", 0) + event.held
        pending = host2.submit_merge2(event.delta, event.steps, link.public_key)
        when_settled = getattr(pending, "when_settled", None)
        if when_settled is None:
            to_ack2.send_nowait((event, pending))
        elif when_settled(functools.partial(self._settled2, link, pending)):
            link.acks2.append((event, pending))
        else:
            raise LocalProtocolError("a core-2 merge was submitted twice")
        ahead = getattr(pending, "ahead", None)
        if ahead is not None:
            self.local_change2(event.key, ahead, source_link=link)

    @staticmethod
    def _fail_link(link: PeerLink, acks: deque[Any], exc: Exception) -> None:
        """End ``link`` from a commit callback: its unsent ACKs go, and its driver raises ``exc``."""
        link.ended = True
        acks.clear()
        link.failure = exc
        link.kick()

    def _settled2(self, link: PeerLink, pending: PendingMerge2) -> None:
        """The storage's callback once ``pending`` is stored (or failed), on the event loop: as
        :meth:`_settled` for core 2 (a failed merge goes to :meth:`_acker2`, which notes its error and
        ends the link). Never raises."""
        if link.ended:
            return
        acks, core2 = link.acks2, link.session.core2
        try:
            assert core2 is not None
            acked = False
            while acks:
                event, first = acks[0]
                outcome = first.settled()  # type: ignore[attr-defined]
                if outcome is None:
                    if first is pending:  # stored with no outcome: it failed
                        acks.clear()
                        link.ended = True
                        if link.to_ack2 is None:
                            raise LatticedError("a merge of this peer's delta failed")
                        link.to_ack2.send_nowait((event, first))
                    break
                acks.popleft()
                self.counters["deltas_in"] += 1
                core2.delta_applied(event.seq, *outcome)
                acked = True
            if acked and not link.ended:
                self._drive_now(link)
        except Exception as exc:  # a bug must end this link, not the event loop: its driver raises it
            self._fail_link(link, acks, exc)

    async def _acker2(
        self, link: PeerLink, merges: trio.MemoryReceiveChannel[tuple[Delta2Received, PendingMerge2]]
    ) -> None:
        """Acknowledge each core-2 delta, in order, once it is durable (a forged or malformed one raises
        here and ends the link; the queue's error is kept for ``latticectl queue why``). Its change
        reaches the other links through the store's change hook (:meth:`local_change2`)."""
        async for event, pending in merges:
            try:
                summary, changed = await pending.result()
            except LatticedError as exc:
                self.queue_errors.note(link.public_key, event.key, str(exc))
                raise
            self.counters["deltas_in"] += 1
            core2 = link.session.core2
            assert core2 is not None
            core2.delta_applied(event.seq, summary, changed)
            self._drive_now(link)  # the ACK goes out from here when the driver sleeps

    def _count(self, direction: str, message: bytes) -> None:
        # The counters' names by the first two bytes (the array's and the type's, which name the kind):
        # one look-up a message on a busy link.
        first = message[:2]
        names = _NAMES_BY_BYTES.get((direction, first))
        if names is None:
            kind = message_type_name(message)
            if kind == "other" and len(message) >= 2 and message[1] in CORE2_NAMES:
                kind = CORE2_NAMES[message[1]]
            names = _COUNTER_NAMES.get((direction, kind))
            if names is None:
                names = _COUNTER_NAMES[direction, kind] = (f"{direction}_{kind}", f"{direction}_{kind}_bytes")
            if len(first) == 2 and 0x91 <= first[0] <= 0x9F:  # an array: at most 2 x 15 x 256 entries
                _NAMES_BY_BYTES[direction, first] = names
        traffic = self.traffic
        traffic[names[0]] = traffic.get(names[0], 0) + 1
        traffic[names[1]] = traffic.get(names[1], 0) + len(message)

    async def _flush(self, stream: SecureStream, link: PeerLink) -> None:
        """Send what the session and the extension queued; the reader may read on meanwhile (what it adds
        waits for the next flush, and stops it reading again once there is too much)."""
        messages = link.session.messages_to_send()
        if link.extra_out:
            extra = self._take_extra(link)
            messages = extra + messages if link.opened else messages + extra
        if link.after_hello is not None and messages and not link.opened:
            messages.insert(1, link.after_hello)  # the first write starts with the HELLO
            link.after_hello = None
        link.drained.set()
        await self._send(stream, link, messages)

    @staticmethod
    def _take_extra(link: PeerLink) -> list[bytes]:
        extra, link.extra_out = link.extra_out, []
        return extra

    async def _send(self, stream: SecureStream, link: PeerLink, messages: list[bytes]) -> None:
        for message in messages:
            self._count("sent", message)
        if messages:
            link.last_sent = trio.current_time()
            link.opened = True
            await stream.send_many(messages)  # one write for all of them (each its own frame)
        elif getattr(stream, "has_unsent", False):  # (stand-in streams of tests have none)
            await stream.send_many(messages)  # what a direct send (_drive_now) left: it goes first

    def _drive_now(self, link: PeerLink) -> None:
        """Do a sleeping driver's work right here, in the calling task, when it needs no waiting: deltas
        relayed as they came (``relayed_delta``) and the messages the session queued (an ACK, a PONG) go
        out by a direct write, with no wake-up and scheduler pass of the driver per relayed record.
        Anything else (a delta built from the store, an extension's message, a PONG to match, what the
        socket does not take at once) is left to the driver, woken as :meth:`PeerLink.nudge` would."""
        session = link.session
        stream = link.stream
        if (
            not session.has_work()
            or link.sleeping_until == -math.inf  # the driver runs: it looks at the session itself
            or stream is None
            or link.held is not None
            or link.extra_out
            or not link.opened
            or link.ended
            or link.relaying
            or not stream.can_send_now()
        ):
            link.nudge()
            return
        link.relaying = True
        try:
            self._relay_now(link, session, stream)
        except Exception as exc:  # the link's own error, not the calling task's: its driver raises it
            link.failure = exc
            link.kick()
        finally:
            link.relaying = False

    def _relay_now(self, link: PeerLink, session: ReplicationSession, stream: SecureStream) -> None:
        relayed, now2, host2, core2 = self._relayed, self._delta2_now, self.host2, session.core2
        while (event := session.next_event()) is not None:
            if type(event) is NeedDelta and relayed is not None:
                delta = relayed(event.key, event.since)
                if delta is not None:
                    session.provide_delta(event.key, delta)
                    self.counters["deltas_out"] += 1
                    continue
            elif type(event) is Delta2Received and host2 is not None and link.to_ack2 is not None:
                self._submit2(link, event, host2, link.to_ack2)
                continue
            elif type(event) is NeedDelta2 and now2 is not None and core2 is not None:
                out = now2(event.key, event.since, event.max_records, self.max_message_bytes // 2)
                if out is not None:  # a push just merged, built from its records
                    core2.provide_delta(event.key, out)
                    self.counters["deltas_out"] += 1
                    continue
            link.held = event  # the driver's (it takes it before the session's next ones)
            break
        messages = session.messages_to_send()
        if messages:
            for message in messages:
                self._count("sent", message)
            link.last_sent = trio.current_time()
            stream.send_now(messages)
            link.drained.set()
        if link.held is not None or stream.has_unsent:
            link.wakeup.set()
        else:
            link.nudge()

    def _settled(self, link: PeerLink, pending: PendingMerge) -> None:
        """The storage's callback once ``pending`` is stored (or failed), on the event loop: acknowledge
        the merges at the front of the link's queue that are durable, in order, and send the ACKs at once
        (:meth:`_drive_now`): no acker or driver task is woken for them. A failed merge goes to the acker,
        which ends the link with its error. Never raises (it runs in trio's callback task)."""
        if link.ended:
            return
        acks = link.acks
        try:
            acked = False
            while acks:
                event, first = acks[0]
                outcome = first.settled()
                if outcome is None:
                    if first is pending:  # stored with no outcome: it failed
                        acks.popleft()
                        self._to_acker(link, event, first)
                    break
                acks.popleft()
                self._acknowledge(link, event, *outcome)
                acked = True
            if acked and not link.ended:
                self._drive_now(link)
        except Exception as exc:  # a bug must end this link, not the event loop: its driver raises it
            self._fail_link(link, acks, exc)

    @staticmethod
    def _to_acker(link: PeerLink, event: DeltaReceived, pending: PendingMerge) -> None:
        link.ended = True  # nothing after a failure is acknowledged; the acker ends the link
        link.acks.clear()
        try:
            if link.to_acker is None:
                raise trio.ClosedResourceError
            link.to_acker.send_nowait((event, pending))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            link.failure = LatticedError("a merge of this peer's delta failed")  # the driver ends it
            link.kick()

    async def _verifier(
        self,
        link: PeerLink,
        deltas: trio.MemoryReceiveChannel[DeltaReceived],
        to_ack: trio.MemorySendChannel[tuple[DeltaReceived, PendingMerge]],
    ) -> None:
        """Verify received deltas in order and hand each to the store as soon as it passed, so the next
        one is checked while the store writes this one (a forged delta ends the link right here).

        A live push the host serves ahead of its commit (``ahead``: storage/ahead.py) is relayed to the
        other peers at once; its ACK still waits for durability in the acker.

        A small delta (a live push) waits until the previous one is stored: a burst of merges from one link
        looks like several writers to the storage thread's group commit, which would then linger for
        company on every later push for a while. Backlog chunks go in at once and share commits, and so do
        pushes served ahead (their commits linger for company anyway: storage/writer.py)."""
        async for event in deltas:
            try:
                verified = await self.host.verify_delta(event.delta)
            except LatticedError as exc:
                self.queue_errors.note(link.public_key, event.key, str(exc))
                raise
            previous = link.previous
            if previous is not None and _waits_for(previous, event):
                with contextlib.suppress(LatticedError):
                    await previous.result()  # a failure ends the link in the acker
            self._ingest(link, event, verified, to_ack)
            # Until the channel is empty, the reader hands the next deltas here too (their order).
            link.verifier_busy = deltas.statistics().current_buffer_used > 0

    def _verify_here(
        self,
        link: PeerLink,
        event: DeltaReceived,
        to_verify: trio.MemorySendChannel[DeltaReceived],
    ) -> bool:
        """The verifier's work for ``event`` done by the reader, when it needs no waiting: the verifier
        holds nothing (so the order stays), the host checks a delta this small on the event loop anyway,
        and the previous merge need not be stored first. Then a live push is verified, handed to the
        store and relayed in the task that read it: no verifier pass per record. False: the verifier's."""
        verify_now, previous, to_ack = self._verify_now, link.previous, link.to_acker
        if (
            verify_now is None
            or to_ack is None
            or link.verifier_busy
            or (previous is not None and _waits_for(previous, event) and previous.settled() is None)
        ):
            return False
        try:
            verified = verify_now(event.delta)
        except LatticedError as exc:
            self.queue_errors.note(link.public_key, event.key, str(exc))
            raise
        if verified is None:
            return False
        self._ingest(link, event, verified, to_ack)
        return True

    def _ingest(
        self,
        link: PeerLink,
        event: DeltaReceived,
        verified: VerifiedDelta,
        to_ack: trio.MemorySendChannel[tuple[DeltaReceived, PendingMerge]],
    ) -> None:
        """Hand a verified delta to the store; relay it if the host serves it ahead of its commit."""
        if event.key[0] == self.local_public_key and self.own_head is not None:
            self._check_own_head(link, event.key, event.delta)
        link.previous = merge = self.host.submit_merge(verified, link.public_key)
        when_settled = getattr(merge, "when_settled", None)
        if when_settled is not None and when_settled(functools.partial(self._settled, link, merge)):
            link.acks.append((event, merge))
        else:
            to_ack.send_nowait((event, merge))
        if merge.ahead is not None:
            # Relay it now (the host serves it before its commit); the ACK still waits for durability.
            self.local_change(event.key, merge.ahead, source_link=link)

    async def _acker(
        self, link: PeerLink, merges: trio.MemoryReceiveChannel[tuple[DeltaReceived, PendingMerge]]
    ) -> None:
        """Acknowledge each delta, in order, once it is durable (never before: an ACK says we hold it)."""
        async for first, first_pending in merges:
            event, outcome = first, await first_pending.result()
            while True:
                self._acknowledge(link, event, *outcome)
                # Merges stored by the same commit are durable too: acknowledged in this pass, their
                # ACKs leave in one write (one wake-up of the peer, not one per delta).
                try:
                    event, pending = merges.receive_nowait()
                except trio.WouldBlock:
                    break
                settled = pending.settled()
                if settled is None:  # a later commit's: what is acknowledged so far goes out first
                    link.kick()
                    settled = await pending.result()
                outcome = settled
            link.kick()

    def _acknowledge(self, link: PeerLink, event: DeltaReceived, summary: Summary, changed: bool) -> None:
        self.counters["deltas_in"] += 1
        link.session.delta_applied(event.seq, summary, changed, trio.current_time())
        if changed:
            self.local_change(event.key, summary, source_link=link)

    def _check_own_head(self, link: PeerLink, key: QueueKey, delta: QueueDelta) -> None:
        """A peer sent a head of one of our own queues: one this run did not sign means another daemon
        signs with our key (logged once per queue, counted each time; the guard decides on writes)."""
        assert self.own_head is not None
        why = foreign_head(self.own_head(key), delta.head, self.started_ms)
        if why is None:
            return
        self.counters["foreign_heads"] += 1
        self.identity.foreign_head(ForeignHead(key_label(key), link.public_key, why, time.time()))
        if key not in self._foreign_logged and len(self._foreign_logged) < MAX_PEER_MEMORIES:
            self._foreign_logged.add(key)
            log_event(
                log,
                "identity.foreign_head",
                level=logging.WARNING,
                queue=key_label(key),
                peer=link.public_key.hex(),
                address=link.address,
                reason=why,
                refusing_writes=self.identity.refusal() is not None,
            )

    async def _pinger(self, link: PeerLink, dialled: bool) -> None:
        """Keep-alive and dead-peer check of one link, on the daemon's shared tick (see
        :data:`PING_INTERVAL_S`). Only the dialling side pings: both doing so would double the messages
        and the wake-ups at each end for no better detection."""
        while True:
            await sleep_until_tick(PING_INTERVAL_S)
            now = trio.current_time()
            heard = link.heard()
            if now - heard > PEER_TIMEOUT_S:
                raise ConnectionClosedError(f"peer silent for over {PEER_TIMEOUT_S:.0f} s")
            quiet = PING_INTERVAL_S / 2
            # The accepting side pings too while the peer's message is still arriving: the peer's own PINGs
            # wait behind it, and it hears nothing else from us meanwhile.
            arriving = heard > link.last_heard and now - link.last_heard >= quiet
            if (dialled or arriving) and (now - link.last_sent >= quiet or now - link.last_heard >= quiet):
                link.session.ping(next(self._nonces))
                link.kick()

    def _recall(self, peer: bytes) -> PeerMemory | None:
        """What we remember of ``peer`` (taken: its session remembers anew when it ends)."""
        entry = self.memories.pop(peer, None)
        if entry is not None:
            self._memory_entries -= _entry_count(entry[1])
        self._forget_memories()
        return None if entry is None or trio.current_time() - entry[0] > MEMORY_TTL_S else entry[1]

    def _remember(self, peer: bytes, memory: PeerMemory) -> None:
        old = self.memories.pop(peer, None)
        if old is not None:
            self._memory_entries -= _entry_count(old[1])
        self.memories[peer] = (trio.current_time(), memory)
        self._memory_entries += _entry_count(memory)
        self._forget_memories()

    def _forget_memories(self) -> None:
        """Forget the oldest memories while there are too many, they hold too much, or are too old."""
        memories = self.memories
        now = trio.current_time()
        while memories:
            peer, (since, memory) = next(iter(memories.items()))
            if (
                len(memories) <= self.max_memories
                and self._memory_entries <= self.max_memory_entries
                and now - since <= MEMORY_TTL_S
            ):
                break
            del memories[peer]
            self._memory_entries -= _entry_count(memory)

    def _changed(self) -> None:
        if self.on_peer_change is not None:
            self.on_peer_change()


async def _first_message(stream: SecureStream, wait: float = HELLO_WAIT_S) -> bytes | None:
    """The peer's first message (its HELLO; or the next one), or None if it closes or says nothing within
    ``wait`` seconds."""
    with trio.move_on_after(wait):
        try:
            return await stream.receive()
        except LatticedError:  # closed, or a frame that does not open: the link is not worth keeping
            return None
    return None


def _redial(old: PeerLink, via: str, first: bytes | None) -> bool:
    """Whether a new link whose first message is ``first`` and ``old`` were both dialled by the same run
    of the peer (its HELLO names ``old``'s incarnation)."""
    if via != "incoming" or old.via != "incoming" or first is None:
        return False
    incarnation = _hello_incarnation(first)
    return incarnation is not None and incarnation == old.session.peer_incarnation


def _writer_blocked(link: PeerLink, now: float) -> bool:
    """Whether ``link``'s send has waited :data:`WRITER_BLOCKED_S` for the peer to take anything, or
    failed for it."""
    stream = link.stream
    if stream is None:
        return False
    since = stream.blocked_since
    return stream.send_stalled or (since is not None and now - since > WRITER_BLOCKED_S)


def _speaks_gone(link: PeerLink) -> bool:
    """Whether ``link`` agreed on the redial's word (its peer sends it, and only then do we wait for it)."""
    return link.agreement is not None and LINK_GONE_FEATURE in link.agreement.features


def _opening_ms(link: PeerLink) -> int:
    """When the peer opened ``link``'s handshake (its clock, ms); a link without a stream never loses."""
    return link.stream.handshake.opening_ms if link.stream is not None else 2**64


def _hello_incarnation(message: bytes) -> bytes | None:
    """The incarnation a HELLO names (None: not a HELLO, or it names none; the session judges it)."""
    try:
        decoded = decode_message(message)
    except LatticedError:
        return None
    return decoded.incarnation if isinstance(decoded, Hello) else None


def _waits_for(previous: PendingMerge, event: DeltaReceived) -> bool:
    """Whether ``event``'s merge goes in only once ``previous`` is stored (see :meth:`Gossip._verifier`)."""
    return previous.ahead is None and len(event.delta.records) <= SERIAL_MERGE_RECORDS


def _asks2(link: PeerLink, first: NeedDelta2) -> list[NeedDelta2]:
    """``first`` and the asks for deltas that follow it in the session's events, in order: answered
    together, with one read. At most as many as the link keeps in flight (``window_out``, or ``window``
    before the wide window is agreed), so a batch never outgrows what the peer agreed to take. The first
    other event is left for the driver's next turn (``link.held``), so the events are handled in the
    order they came."""
    core2 = link.session.core2
    most = 1 if core2 is None else max(1, core2.window_out or core2.window)
    asks = [first]
    while len(asks) < most and link.held is None:
        event = link.session.next_event()
        if event is None:
            break
        if type(event) is not NeedDelta2:
            link.held = event
            break
        asks.append(event)
    return asks


def _take_event(link: PeerLink) -> Event | Core2Event | None:
    """The driver's next event: the one another task left it (:meth:`Gossip._drive_now`), then the
    session's."""
    held = link.held
    if held is not None:
        link.held = None
        return held
    return link.session.next_event()


def _entry_count(memory: PeerMemory) -> int:
    return len(memory.announced) + len(memory.held)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error that ended a peer's task group (the others are usually its cancellations)."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return leaves[0]
