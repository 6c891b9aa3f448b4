"""The replication protocol between two daemons, as a sans-IO state machine.

A :class:`ReplicationSession` takes decrypted messages in (:meth:`receive_message`) and commands from its
host (local updates, deltas it asked for, results of merges), and gives back messages to send
(:meth:`messages_to_send`) and events for the host (:meth:`next_event`). It never touches storage, sockets
or clocks: the host (the trio layer) owns those, so every path here runs in tests without either.

What travels is in :mod:`latticed.protocol.replication_messages` (one frozen dataclass per message, one
table that encodes and decodes them strictly), and where a session is in its life in
:mod:`latticed.protocol.replication_state` (a state enum and the table of what may happen in each).
What the messages mean here:

* ``HELLO`` — once, first (see :class:`~latticed.protocol.replication_messages.Hello`).
* ``DIGEST`` — what the sender holds. A host that remembers the peer from an earlier connection *in the
  same runs of both daemons* (the peer's incarnation is the one it remembers) sends, after the peer's
  HELLO, only the queues that changed since it last told the peer about them, and takes what the peer held
  then as the starting point; otherwise the first digest lists everything. Later digests list only what
  changed.
* ``DELTA`` — a verifiable chunk of a queue; ``ACK`` — it was verified and stored, here is what I hold now.
  At most ``window`` deltas are unacknowledged per session: a slow peer slows its sender, never fills RAM.
  A queue's backlog streams up to ``depth`` chunks ahead of the ACKs (each chunk starts where the previous
  one ended), so sender and receiver work at the same time; once nothing is in flight, the peer's ACKed
  summary is again where the next chunk starts (a chunk that did not apply is simply sent again).
* ``HAVE`` — lazy notification on a pruned link (Plumtree); ``WANT`` — graft: make this link eager for the
  queue and send me the rest; ``PRUNE`` — your delta brought nothing new, send me HAVEs instead of data.
  A WANT waits for the eager copy (Plumtree's timer; the host passes its clock in, see
  :meth:`ReplicationSession.tick`), and again while some of the news keeps arriving from another link or
  is still on its way into the host's store; the timer is learned per link from how late the news
  actually came (:mod:`latticed.protocol.graft`), between a floor and a cap. The first duplicate on a
  link prunes it, whatever the rate.
* ``PING`` / ``PONG`` — liveness, which the host times.

Eager push with pruning on duplicates means a record crosses each link about once in steady state, while
HAVE/WANT repairs the tree when an eager parent goes away.

Memory per link is bounded whatever the peer does: DELTAs by ``window``; what waits to be sent by
:meth:`ReplicationSession.accepts_input` (the host stops reading a peer while ``max_outbox_bytes`` of
answers or ``max_events`` events wait, so a peer that sends PINGs and never reads the PONGs is throttled
by its own socket, and the host drops it when a send makes no progress); HAVEs, which we originate, are
coalesced to the latest summary per queue (with ``have_linger`` they wait to go out together). What a peer
can make us *remember* is bounded too: a queue it names that we do not hold takes one of ``max_peer_keys``
places per session and one of a :class:`KeyBudget` shared by all sessions; beyond those it is not tracked
(and counted), which costs only efficiency (the peer pushes what we lack anyway).
:meth:`ReplicationSession.release` gives the places back when the link ends, and
:meth:`ReplicationSession.memory` keeps only queues we hold.

Why one module: it is one class, and its per-link bookkeeping
(window and depth, eager and lazy links, key budgets, the memory of a peer) is one set of invariants that
every handler touches; the wire format and the session's life cycle already live apart.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from latticed.crdt.queue import QueueDelta, Summary
from latticed.crdt.wire import pack
from latticed.errors import LocalProtocolError, RemoteProtocolError
from latticed.protocol.compact import COMPACT_FEATURE, CompactLink
from latticed.protocol.core2_session import Core2Event, Core2Link
from latticed.protocol.core2_wire import CORE2_CODES
from latticed.protocol.graft import Arrivals, GraftClock
from latticed.protocol.link_gone import GONE, is_gone
from latticed.protocol.replication_messages import (
    ACK,
    COMPACT_NAMES,
    DELTA,
    DIGEST,
    HAVE,
    HELLO,
    PING,
    PONG,
    PROTOCOL_VERSION,
    PRUNE,
    WANT,
    Ack,
    Delta,
    Digest,
    Have,
    Hello,
    Message,
    Ping,
    Pong,
    Prune,
    QueueKey,
    Want,
    decode_raw,
    encode_message,
    unpack_message,
)
from latticed.protocol.replication_state import Command, SessionState, transition
from latticed.protocol.versions import FEATURE_OF_KIND, expressible, queue_expressible

__all__ = [
    "ACK",
    "DEFAULT_MAX_PEER_KEYS",
    "DEFAULT_MAX_PEER_KEYS_TOTAL",
    "DELTA",
    "DIGEST",
    "HAVE",
    "HELLO",
    "PING",
    "PONG",
    "PROTOCOL_VERSION",
    "PRUNE",
    "WANT",
    "DeltaReceived",
    "Event",
    "KeyBudget",
    "LinkTree",
    "NeedDelta",
    "PeerHello",
    "PeerMemory",
    "PeerSummary",
    "Pong",
    "QueueKey",
    "ReplicationSession",
    "SessionState",
    "has_news",
    "held_after",
    "is_ahead",
    "key_label",
]

#: Queues we do not hold that one peer may make us remember (its summaries of them).
DEFAULT_MAX_PEER_KEYS = 16_384
#: ... and all peers together (see :class:`KeyBudget`).
DEFAULT_MAX_PEER_KEYS_TOTAL = 65_536
#: Queue kinds whose core-2 expressibility a session keeps (kinds come from peers too: bounded).
_KINDS_KEPT = 16


def key_label(key: QueueKey) -> str:
    return f"{key[0].hex()}/{key[1]}"


def is_ahead(ours: Summary | None, theirs: Summary | None) -> bool:
    """Whether we hold something the peer does not, along one history (newer, longer, later start, or
    flagged forked): the order in which a session tracks what the peer holds."""
    if ours is None or ours.version == 0:
        return False
    if theirs is None:
        return True
    return (
        ours.version > theirs.version
        # Records past theirs, which we can send only if we hold where theirs end (a replica that dropped
        # its oldest records has nothing for a peer below its floor: it would be asked again and again).
        or (ours.held_end > theirs.held_end and theirs.held_end >= ours.held_start)
        or (ours.forked and not theirs.forked)
        or ours.start > theirs.start
    )


def _other_history(ours: Summary, theirs: Summary) -> bool:
    """Records up to the same end with another chain value there: the owner signed two histories, each
    side holds records the other lacks, and the join keeps one of them everywhere."""
    return ours.held_end == theirs.held_end and ours.held_hash != theirs.held_hash


def has_news(ours: Summary | None, theirs: Summary | None) -> bool:
    """Whether we may hold something the peer lacks, so a delta is worth asking the store for: what
    :func:`is_ahead` says, and also another history (which the peer's join finds to be a fork). A forked
    queue stops where each replica stands: only its proof travels, to a peer that does not flag it. A
    delta that changes nothing for the peer is not sent again while both summaries stay the same."""
    if ours is not None and ours.forked:
        return theirs is None or not theirs.forked
    if theirs is not None and theirs.forked:
        return False  # a forked replica merges nothing but a proof, and flags the fork already
    if is_ahead(ours, theirs):
        return True
    if ours is None or theirs is None or ours.version == 0:
        return False
    return _other_history(ours, theirs)


# ------------------------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class NeedDelta:
    """Host: compute ``delta(state, since, max_records)`` and call :meth:`provide_delta`."""

    key: QueueKey
    since: Summary | None
    max_records: int


@dataclass(frozen=True, slots=True)
class DeltaReceived:
    """Host: verify and merge, persist, then call :meth:`delta_applied` (or close on an IntegrityError)."""

    key: QueueKey
    seq: int
    delta: QueueDelta


@dataclass(frozen=True, slots=True)
class PeerSummary:
    """What the peer holds of a queue now (for lag reporting and discovering queues)."""

    key: QueueKey
    summary: Summary


@dataclass(frozen=True, slots=True)
class PeerMemory:
    """What a host keeps of a peer between connections (in memory: it is only good for one run of each)."""

    incarnation: bytes  # the peer's, when we last talked
    announced: Mapping[QueueKey, Summary]  # what we last told it we hold
    held: Mapping[QueueKey, Summary]  # what it held, as far as we knew


@dataclass(frozen=True, slots=True)
class PeerHello:
    version: int
    subscription: tuple[str, ...] | None


Event = NeedDelta | DeltaReceived | PeerSummary | PeerHello | Pong


@dataclass(slots=True)
class KeyBudget:
    """How many queues we do not hold all sessions together may track for their peers (a made-up queue a
    peer names costs a few hundred bytes; a fresh identity per connection must not add up to more).

    ``used`` may exceed ``limit`` by at most the delta window per session: a DELTA for a queue we lack is
    always tracked until it is stored (then it is ours and its place is given back)."""

    limit: int = DEFAULT_MAX_PEER_KEYS_TOTAL
    used: int = 0
    #: Queues not tracked because a per-session or the total bound was reached, since start.
    refused: int = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def release(self, count: int = 1) -> None:
        self.used = max(0, self.used - count)


# ------------------------------------------------------------------------------------------------ session


@dataclass(slots=True)
class _Waiting:
    """A HAVE announced news of a queue at ``since`` (or the last part of it arrived then): the WANT is
    due at ``due`` unless the rest (up to ``summary``) arrives; ``held`` is what we held at ``since``."""

    due: float
    summary: Summary
    held: Summary | None
    since: float


@dataclass(frozen=True, slots=True)
class LinkTree:
    """One link's place in the eager (Plumtree) trees of the queues we hold: ``carried`` queues, of
    which we pruned ``pruned_in`` (the peer sends HAVEs of them, no deltas, until we graft) and the peer
    pruned ``lazy_out`` of (we announce them). What an operator reads to see a replica cut off."""

    carried: int
    pruned_in: int
    lazy_out: int

    @property
    def eager_in(self) -> int:
        return self.carried - self.pruned_in


@dataclass(slots=True)
class _Link:
    """Per-queue state of this link."""

    peer: Summary | None = None  # what the peer holds, as far as we know
    #: What the peer will hold once it applied every DELTA in flight (None: nothing in flight); the
    #: next chunk starts there, so a backlog streams without waiting for each ACK.
    sent: Summary | None = None
    eager: bool = True
    asked: bool = False  # a NeedDelta is outstanding
    asked_since: Summary | None = None  # the ``since`` of that NeedDelta
    inflight: int = 0  # DELTAs sent, not yet acknowledged
    #: We sent the peer a PRUNE (it sends us HAVEs for this queue) and no WANT since.
    pruned: bool = False
    #: (ours, the peer's) summaries when the peer acknowledged a DELTA of ours that changed nothing for
    #: it: no more are sent while both still hold exactly that (see :meth:`ReplicationSession._pump`).
    futile: tuple[Summary | None, Summary] | None = None
    #: Our proof of the fork went to the peer, and ours has not changed since: a frozen queue changes
    #: only when its proof does, which no summary tells (see :meth:`ReplicationSession._pump`).
    proof_sent: bool = False


@dataclass(slots=True)
class ReplicationSession:
    """One peer link. ``window`` bounds unacknowledged deltas, ``depth`` those of one queue (a backlog
    streams up to ``depth`` chunks ahead of the peer's ACKs); ``max_records`` bounds each chunk."""

    subscription: tuple[str, ...] | None = None
    window: int = 8
    depth: int = 4
    max_records: int = 4096
    max_message_bytes: int = 16 * 1024 * 1024
    #: The host reads no more from the peer while this many bytes of messages wait to be sent...
    max_outbox_bytes: int = 1 << 20
    #: ... or this many events wait to be handled (see :meth:`accepts_input`).
    max_events: int = 4096
    #: Queues we do not hold whose peer summaries this session tracks at most; shared bound in ``key_budget``.
    max_peer_keys: int = DEFAULT_MAX_PEER_KEYS
    key_budget: KeyBudget | None = None
    _foreign: set[QueueKey] = field(default_factory=set)  # keys of _links we do not hold
    _local: dict[QueueKey, Summary] = field(default_factory=dict)
    _links: dict[QueueKey, _Link] = field(default_factory=dict)
    _outbox: list[bytes] = field(default_factory=list)
    _outbox_bytes: int = 0
    #: How long a HAVE waits for the eager copy before we send a WANT (0: at once), in the host's time
    #: units (:meth:`receive_message`'s ``now``, :meth:`tick`). Plumtree's graft timer: without it every
    #: HAVE that overtakes the eager copy grafts a second eager link, and the links never settle. With
    #: ``graft_timeout_max`` it is the floor of a timer learned from this link's host (:class:`GraftClock`):
    #: how late announced news actually arrives, up to that cap (None: fixed).
    graft_timeout: float = 0.0
    graft_timeout_max: float | None = None
    #: Deltas on their way into the host's store, by queue: share one among a host's sessions, so no link
    #: grafts while another still delivers the queue (see :meth:`tick`).
    arrivals: Arrivals = field(default_factory=Arrivals)
    #: Queues a HAVE announced news of (see :class:`_Waiting`).
    _grafts: dict[QueueKey, _Waiting] = field(default_factory=dict)
    _graft_clock: GraftClock | None = None
    #: Queues we sent a WANT for whose first delta from the peer is not applied yet: it tells whether
    #: the graft was needed. Until the news arrives from another link, how late it is still counts.
    _grafted: dict[QueueKey, _Waiting] = field(default_factory=dict)
    #: The host's clock as last passed in (for calls that do not pass it).
    _now: float = 0.0
    #: HAVEs not sent yet, latest summary per queue: a stalled link does not pile up one per change.
    _haves: dict[QueueKey, Summary] = field(default_factory=dict)
    #: How long HAVEs wait to go out together (0: with the next send), in the host's time units: a HAVE
    #: only repairs a tree whose eager copy is late, and one per flush covers every change meanwhile.
    have_linger: float = 0.0
    _have_due: float | None = None
    _haves_due_now: bool = False
    _events: deque[Event] = field(default_factory=deque)
    #: Whether the events that only report (:class:`PeerSummary`, :class:`PeerHello`) are queued, for
    #: observers such as the simulator; a host that ignores them sets False, so that an ACK or a HAVE
    #: that asks nothing of it does not wake it. PONGs are always queued (one per keep-alive: the host
    #: matches them to its PINGs, the duplicate-identity check among them).
    notices: bool = True
    #: Whether received deltas wait apart from the other events, for :meth:`next_received` (the host's
    #: reader hands them to its verifier itself: no pass of its driver per delta) instead of in
    #: :meth:`next_event`'s order.
    received_apart: bool = False
    _deltas_in: deque[DeltaReceived] = field(default_factory=deque)
    _seq: int = 0
    _inflight_total: int = 0
    _asked_total: int = 0
    #: Queues waiting for a delta, in order; an ordered set, so scheduling one is O(1) (a link start
    #: schedules every queue we hold).
    _pending: OrderedDict[QueueKey, None] = field(default_factory=OrderedDict)
    _received: dict[int, QueueKey] = field(default_factory=dict)
    #: Sent deltas (by seq) not yet acknowledged: what each brings the peer (see :meth:`_on_ack`).
    _brings: dict[int, Summary] = field(default_factory=dict)
    _peer_subscription: tuple[str, ...] | None = None
    #: Where the session is in its life; changes only through :func:`transition` (replication_state.py).
    _state: SessionState = SessionState.IDLE
    #: Our incarnation (sent in HELLO), the peer's, and what we remember of the peer (see PeerMemory).
    incarnation: bytes | None = None
    _peer_incarnation: bytes | None = None
    #: The peer's first DIGEST came: we know what it holds (the start gate waits for it).
    digest_received: bool = False
    _memory: PeerMemory | None = None
    _announced: dict[QueueKey, Summary] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "deltas_sent": 0,
            "deltas_acked": 0,
            "deltas_received": 0,
            "peer_keys_refused": 0,
        }
    )
    #: The optional protocol features the peer shares with us (None: not agreed yet, so only what needs
    #: none is sent), and the queue kinds that need one (see :mod:`latticed.protocol.versions`).
    peer_features: frozenset[str] | None = None
    kind_features: Mapping[int, str] = field(default_factory=lambda: FEATURE_OF_KIND)
    #: :meth:`_core2_expressible`'s answers per kind, for these features and kinds' table.
    _expressible_kinds: dict[int, bool] = field(default_factory=dict)
    _expressible_for: tuple[frozenset[str] | None, Mapping[int, str] | None] = (None, None)
    #: Queues we hold that the peer's version cannot express: not sent to it.
    _withheld: set[QueueKey] = field(default_factory=set)
    #: The link's memory for the ``compact`` encodings (read whenever the peer sends them; ours go out
    #: compact once the link agreed on the feature: :meth:`agree_features`).
    _compact: CompactLink = field(default_factory=CompactLink)
    _compact_out: bool = False
    #: The part that carries queues on the v2 fork core (None: this host holds none and reads none of
    #: their messages; see :meth:`attach_core2`).
    core2: Core2Link | None = None

    # ------------------------------------------------------------------ host → session
    def start(
        self,
        local: Mapping[QueueKey, Summary],
        digest_keys: Iterable[QueueKey] | None = None,
        known_peer: Mapping[QueueKey, Summary] | None = None,
        memory: PeerMemory | None = None,
    ) -> None:
        """Say hello and send the first digest.

        ``local`` is what we hold; ``digest_keys`` limits the first digest to what changed since the last
        exchange with this peer (None: everything); ``known_peer`` is what the peer held then. With
        ``memory`` (from :meth:`memory` of an earlier session with this peer) the first digest waits for
        the peer's HELLO: it is cut down only if the peer's incarnation is still the remembered one.
        """
        command = Command.START if memory is None else Command.START_REMEMBERING
        self._state = transition(self._state, command)
        self._local = dict(local)
        for key, summary in (known_peer or {}).items():
            link = self._peer_link(key)
            if link is not None:
                link.peer = summary
        self._send(Hello(PROTOCOL_VERSION, self.subscription or None, self.incarnation))
        if memory is not None:
            self._memory = memory  # the first digest goes out on the peer's HELLO (DIGEST_DEFERRED)
            return
        self._send_digest(list(self._local) if digest_keys is None else list(digest_keys))

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def peer_incarnation(self) -> bytes | None:
        """The incarnation the peer's HELLO named (None: no HELLO yet, or it names none)."""
        return self._peer_incarnation

    def memory(self) -> PeerMemory | None:
        """What to remember of this peer for the next connection (None: it gave no incarnation).

        Only queues we hold: what the peer said of others is its to repeat, and would let it make us keep
        anything it names after it left."""
        if self._peer_incarnation is None:
            return None
        local = self._local
        held = {key: link.peer for key, link in self._links.items() if link.peer is not None and key in local}
        return PeerMemory(self._peer_incarnation, dict(self._announced), held)

    def release(self) -> None:
        """The link is gone: forget what the peer told us of queues we do not hold, and give their places
        back to the :class:`KeyBudget` (call once, after :meth:`memory`)."""
        for key in self._received.values():
            self.arrivals.settled(key)  # never to be applied: the host stops with the link
        self._received.clear()
        if self.core2 is not None:
            self.core2.release()
        for key in self._foreign:
            self._links.pop(key, None)
        if self.key_budget is not None:
            self.key_budget.release(len(self._foreign))
        self._foreign.clear()

    @property
    def peer_keys(self) -> int:
        """How many queues we do not hold this session tracks for its peer."""
        return len(self._foreign)

    def _send_digest(self, keys: Iterable[QueueKey]) -> None:
        entries = []
        for key in keys:
            summary = self._local.get(key)
            if summary is not None:
                entries.append((key, summary))
                self._announced[key] = summary
        self._send(Digest(tuple(entries)))

    def local_update(self, key: QueueKey, summary: Summary, now: float | None = None) -> None:
        """We changed a queue (own write or a merge from another peer) at ``now`` (the host's clock; None:
        the last one passed in): push it or announce it."""
        self._state = state = transition(self._state, Command.LOCAL_UPDATE)
        self._set_local(key, summary, now)
        if self._grafted:
            grafted = self._grafted.get(key)
            if grafted is not None and grafted.due >= 0 and not has_news(grafted.summary, summary):
                # What we grafted for came by another link after all: that is how late it was.
                self._clock().sample((self._now if now is None else now) - grafted.since)
                grafted.due = -1.0  # counted once
        if state is not SessionState.OPEN or not self._peer_wants(key):
            return
        link = self._link(key)
        if summary.forked:
            link.proof_sent = False  # a frozen queue changed: its proof did
        if link.eager or summary.forked:  # a proof goes over pruned links too: it is no stream
            self._schedule(key)
        elif has_news(summary, link.peer) and self._announced.get(key) != summary:
            # Once per summary: a relay reports a push both when it serves it ahead of its commit and
            # when the commit is done, with the same summary. Only the latest waiting one goes out.
            self._haves[key] = summary
            self._announced[key] = summary

    def provide_delta(self, key: QueueKey, delta: QueueDelta | None) -> None:
        """The answer to a :class:`NeedDelta`; None when there is nothing to send after all."""
        self._state = transition(self._state, Command.PROVIDE_DELTA)
        link = self._link(key)
        since = link.asked_since
        if link.asked:
            link.asked = False
            link.asked_since = None
            self._asked_total -= 1
        if delta is None or (delta.head is None and delta.fork is None) or _no_news(delta, since):
            self._pump()
            return
        self._seq += 1
        implied = held_after(delta, since)
        ours = self._local.get(key)
        if link.sent is None or is_ahead(implied, link.sent):
            link.sent = implied
        link.inflight += 1
        self._inflight_total += 1
        self.stats["deltas_sent"] += 1
        self._brings[self._seq] = implied
        self._send(Delta(self._seq, delta))
        if has_news(ours, self._since(link)) and self._streams(link, ours):
            self._schedule(key)  # the next chunk goes out before this one is acknowledged
        else:
            self._pump()

    def delta_applied(self, seq: int, summary: Summary, changed: bool, now: float | None = None) -> None:
        """The host verified, merged and stored the delta ``seq`` (at ``now``, its clock; None: the last
        one passed in); ``changed`` says if it brought news."""
        self._state = transition(self._state, Command.DELTA_APPLIED)
        key = self._received.pop(seq, None)
        if key is None:
            raise LocalProtocolError(f"no delta {seq} is waiting")
        self.arrivals.settled(key)
        if self._grafted and self._grafted.pop(key, None) is not None:
            clock = self._clock()
            if changed:
                clock.needed()
            else:
                clock.premature()
        self._set_local(key, summary, now)
        link = self._link(key)
        self._send(Ack(seq, key, summary))
        if not changed and not link.pruned and not summary.forked:
            # The first duplicate on this link, whatever the rate: another link brought it first (a
            # frozen queue's proofs are not a stream to thin out).
            link.pruned = True
            self._send(Prune(key))
        news = (changed or summary.forked) and has_news(summary, link.peer)
        if self._peer_wants(key) and (news or (summary.forked and not link.proof_sent)):
            # The join holds more than the sender sent, or found that its delta and what we held are two
            # histories of a forked owner (the queue stops here): tell the sender too, also when it
            # flags the fork by now (its proof may be another).
            self._schedule(key)

    def ping(self, nonce: int) -> None:
        self._state = transition(self._state, Command.PING)
        self._send(Ping(nonce))

    # ------------------------------------------------------------------ peer → session
    def receive_message(self, payload: bytes, now: float = 0.0) -> None:
        """Feed one decrypted message, received at ``now`` (the host's clock, for the graft timer); a
        malformed one, or one the session's state does not allow, raises :class:`RemoteProtocolError`
        (and a message fed before :meth:`start` a LocalProtocolError)."""
        self._now = now
        raw = unpack_message(payload, self.max_message_bytes)
        if self.core2 is not None and raw[0] in CORE2_CODES:
            self._core2_receive(raw, len(payload))
            return
        message: Message
        if raw[0] in COMPACT_NAMES:
            decoded = self._compact.decode(raw)
            if isinstance(decoded, tuple):  # every HAVE of one flush
                for have in decoded:
                    self._state = transition(self._state, Have)
                    self._on_have(have, now)
                return
            message = decoded
        else:
            if raw[0] == GONE and is_gone(raw):
                return  # a redial's word on a link taken anyway: it names nothing to replace here
            message = decode_raw(raw)
            if type(message) is Ack:
                self._compact.acked(message.seq)
        self._state = transition(self._state, type(message))
        match message:
            case Delta():
                self._on_delta(message)
            case Ack():
                self._on_ack(message)
            case Have():
                self._on_have(message, now)
            case Want():
                self._on_want(message)
            case Digest():
                self._on_digest(message)
            case Prune():
                pruned = self._peer_link(message.key)
                if pruned is not None:
                    pruned.eager = False
                    self._rest_lazily(message.key, pruned)
            case Ping():
                self._send(Pong(message.nonce))
            case Pong():
                self._events.append(message)  # the host times liveness, and matches a PONG to its PING
            case Hello():
                self._on_hello(message)

    def _on_hello(self, hello: Hello) -> None:
        incarnation = hello.incarnation
        self._peer_subscription = hello.subscription
        self._peer_incarnation = incarnation
        self._notice(PeerHello(hello.version, hello.subscription))
        memory = self._memory
        if memory is not None:  # the session started remembering the peer: its first digest goes out now
            self._memory = None
            if incarnation is not None and memory.incarnation == incarnation:
                # Same runs of both daemons as last time: the peer still knows what we told it, and holds
                # at least what it held then.
                for key, summary in memory.held.items():
                    link = self._peer_link(key)
                    if link is not None and (link.peer is None or is_ahead(summary, link.peer)):
                        link.peer = summary
                self._send_digest(k for k, s in self._local.items() if memory.announced.get(k) != s)
            else:
                self._send_digest(list(self._local))
        # Everything we hold that the peer may lack goes out once its digest arrives or, if it never
        # mentions a queue, straight away (the peer's silence means it has nothing of it).
        for key in self._local:
            if self._peer_wants(key):
                self._schedule(key)

    def _on_digest(self, digest: Digest) -> None:
        self.digest_received = True
        for key, summary in digest.entries:
            link = self._peer_link(key)
            if link is None:
                continue
            link.peer = summary
            self._notice(PeerSummary(key, summary))
            if self._peer_wants(key) and has_news(self._local.get(key), summary):
                self._schedule(key)

    def _on_delta(self, message: Delta) -> None:
        seq = message.seq
        if seq in self._received:
            raise RemoteProtocolError("DELTA needs a fresh integer sequence number")
        if len(self._received) >= self.window:
            raise RemoteProtocolError("peer exceeded the delta window")
        delta = message.delta
        key = (delta.owner, delta.name, delta.kind)
        if self.subscription is not None and not _matches(self.subscription, key):
            raise RemoteProtocolError(f"peer sent {key_label(key)}, which we did not subscribe to")
        self._received[seq] = key
        self.arrivals.received(key)
        link = self._links.get(key)
        if link is None:
            # Tracked whatever the bounds (the window limits these): once stored, the queue is ours.
            link = self._link(key)
            if key not in self._local:
                self._foreign.add(key)
                if self.key_budget is not None:
                    self.key_budget.used += 1
        implied = held_after(delta, link.peer)
        if is_ahead(implied, link.peer):
            link.peer = implied  # the sender holds at least what it sent: never echo it back
        self.stats["deltas_received"] += 1
        (self._deltas_in if self.received_apart else self._events).append(DeltaReceived(key, seq, delta))

    def _on_ack(self, ack: Ack) -> None:
        key, summary = ack.key, ack.summary
        link = self._links.get(key)
        if link is None or link.inflight <= 0:
            raise RemoteProtocolError("ACK for a delta we did not send")
        self.stats["deltas_acked"] += 1
        link.inflight -= 1
        self._inflight_total -= 1
        brings = self._brings.pop(ack.seq, None)
        if summary == link.peer and not _duplicate(brings, summary):
            # Our delta brought the peer nothing, and not because it held those records already (from
            # another link). Judged by what this delta brings, not by all we have in flight to the peer:
            # in a backlog that is always past its ACK of an earlier chunk, and every chunk that came
            # second from here would stop the stream.
            link.futile = (self._local.get(key), summary)
        link.peer = summary
        if link.inflight == 0:
            link.sent = None  # from now on, what the peer says it holds is the whole truth
        self._notice(PeerSummary(key, summary))
        ours = self._local.get(key)
        if has_news(ours, self._since(link)):
            if self._streams(link, ours):
                self._schedule(key)  # the next chunk of a backlog
            else:
                self._rest_lazily(key, link)
        self._pump()

    def _rest_lazily(self, key: QueueKey, link: _Link) -> None:
        """The peer pruned this link while a backlog streamed to it: it takes the rest from its eager
        link, so no chunk waits to go out here. Once none is in flight either, a HAVE of what we hold
        starts the peer's graft timer: should that link not deliver, the peer asks us (a WANT)."""
        ours = self._local.get(key)
        if ours is None or not has_news(ours, self._since(link)) or self._streams(link, ours):
            return
        self._pending.pop(key, None)
        if link.inflight == 0:
            self._haves[key] = self._announced[key] = ours

    def _streams(self, link: _Link, ours: Summary | None) -> bool:
        """Whether a backlog's next chunk goes to the peer unasked: on an eager link; on a pruned one
        only to settle another history or a fork, never a plain backlog the peer gets from its eager
        link too (every chunk would cross both, PRUNEs arriving chunks late)."""
        return link.eager or not is_ahead(ours, self._since(link))

    def _heard_of(self, key: QueueKey, summary: Summary) -> _Link | None:
        """A HAVE or WANT told us what the peer holds of ``key``."""
        link = self._peer_link(key)
        if link is not None:
            link.peer = summary
            self._notice(PeerSummary(key, summary))
        return link

    def _on_have(self, have: Have, now: float) -> None:
        key, summary = have.key, have.summary
        self._heard_of(key, summary)
        if not self._wants_key(key) or not has_news(summary, self._local.get(key)):
            return
        if self.graft_timeout <= 0:
            self._graft(key)
            return
        waiting = self._grafts.get(key)
        if waiting is None:
            self._grafts[key] = _Waiting(now + self.graft_delay, summary, self._local.get(key), now)
        else:
            waiting.summary = summary

    def _graft(self, key: QueueKey) -> None:
        link = self._links.get(key)
        if link is not None:
            link.pruned = False  # it pushes to us again: its next duplicate prunes it again
        self._send(Want(key, self._local.get(key) or Summary()))

    def _clock(self) -> GraftClock:
        clock = self._graft_clock
        if clock is None:
            clock = self._graft_clock = GraftClock(self.graft_timeout, self.graft_timeout_max)
        return clock

    @property
    def graft_delay(self) -> float:
        """How long a HAVE's news may take now before a WANT grafts the link (see :class:`GraftClock`)."""
        return self._clock().timeout()

    def tick(self, now: float) -> None:
        """The host's clock moved to ``now``: a HAVE whose news has not arrived within
        :attr:`graft_delay` of the HAVE, or of the last part of it that did arrive (news that streams in
        more slowly than the HAVEs announce it: a backlog, a busy host), grafts its link (a WANT). Not
        while the host is still taking in deltas of the queue (:attr:`arrivals`: some link is delivering
        it), unless nothing arrived for ``graft_timeout_max``. Lingering HAVEs fall due."""
        self._now = now
        if self.core2 is not None:
            self.core2.tick(now)
        if self._haves and self.have_linger > 0:
            if self._have_due is None:
                self._have_due = now + self.have_linger
            elif self._have_due <= now:
                self._haves_due_now = True
        if not self._grafts:
            return
        for key, waiting in list(self._grafts.items()):
            if waiting.due > now:
                continue
            if not has_news(waiting.summary, self._local.get(key)):
                del self._grafts[key]
                continue
            hold = self.graft_timeout_max or self.graft_timeout
            if self.arrivals.arriving(key) and now - waiting.since < hold:
                waiting.due = min(now + self.graft_delay, waiting.since + hold)
                continue
            del self._grafts[key]
            self._grafted[key] = waiting
            self._graft(key)

    def next_deadline(self) -> float | None:
        """When :meth:`tick` has something to do (None: nothing waits for the clock)."""
        deadline = min(waiting.due for waiting in self._grafts.values()) if self._grafts else None
        if self._haves and self.have_linger > 0 and not self._haves_due_now:
            due = self._have_due if self._have_due is not None else 0.0  # 0: tick now, to start it
            deadline = due if deadline is None else min(deadline, due)
        core2 = None if self.core2 is None else self.core2.next_deadline()
        if core2 is not None:
            deadline = core2 if deadline is None else min(deadline, core2)
        return deadline

    def _on_want(self, want: Want) -> None:
        key, summary = want.key, want.summary
        link = self._heard_of(key, summary)
        if link is None:
            return  # a WANT for a queue we do not hold: nothing to send
        link.eager = True
        if has_news(self._local.get(key), summary):
            self._schedule(key)

    # ------------------------------------------------------------------ session → host
    def _notice(self, event: Event) -> None:
        if self.notices:
            self._events.append(event)

    def next_event(self) -> Event | Core2Event | None:
        if self._events:
            return self._events.popleft()
        return None if self.core2 is None else self.core2.next_event()

    def next_received(self) -> DeltaReceived | None:
        """The next received delta, with :attr:`received_apart` (else they come from :meth:`next_event`)."""
        return self._deltas_in.popleft() if self._deltas_in else None

    def has_work(self) -> bool:
        """Whether events or messages are waiting (the host's driver sleeps only when this is False)."""
        core2 = self.core2 is not None and self.core2.has_work()
        return bool(self._events or self._outbox or (self._haves and self._haves_ready()) or core2)

    def _haves_ready(self) -> bool:
        return self.have_linger <= 0 or self._haves_due_now

    def accepts_input(self) -> bool:
        """Whether the host should read the peer's next message now.

        False while ``max_outbox_bytes`` of messages wait to be sent or ``max_events`` events to be
        handled: the host then waits for its driver to catch up (:meth:`messages_to_send`,
        :meth:`next_event`) before reading on. Everything the peer can make us queue comes from its
        messages, so this bounds it; a peer that does not read what we send stops being read too."""
        core2 = self.core2
        outbox, events = (0, 0) if core2 is None else (core2.outbox_bytes, core2.events)
        return (
            self._outbox_bytes + outbox < self.max_outbox_bytes
            and len(self._events) + events < self.max_events
        )

    @property
    def outbox_bytes(self) -> int:
        """Bytes of messages waiting for :meth:`messages_to_send` (HAVEs not counted: one per queue)."""
        return self._outbox_bytes

    def messages_to_send(self) -> list[bytes]:
        out, self._outbox = self._outbox, []
        self._outbox_bytes = 0
        if self._haves and self._haves_ready():
            haves, self._haves = self._haves, {}
            self._have_due, self._haves_due_now = None, False
            if self._compact_out:
                out.append(pack(self._compact.encode_haves([Have(k, s) for k, s in haves.items()])))
            else:
                out.extend(encode_message(Have(k, s)) for k, s in haves.items())
        if self.core2 is not None:
            out.extend(self.core2.messages_to_send())
        return out

    def peer_summaries(self) -> dict[QueueKey, Summary]:
        return {k: link.peer for k, link in self._links.items() if link.peer is not None}

    def peer_summary(self, key: QueueKey) -> Summary | None:
        """What the peer last told us it holds of ``key`` (None: nothing yet)."""
        link = self._links.get(key)
        return None if link is None else link.peer

    def tree(self) -> LinkTree:
        """This link's place in the eager trees of the queues we hold, both cores (see :class:`LinkTree`)."""
        local, links = self._local, self._links
        carried = sum(1 for key in local if key not in self._withheld and self._wants_key(key))
        pruned = len(self.pruned_in1())
        lazy = sum(1 for key, link in links.items() if not link.eager and key in local)
        if self.core2 is not None:
            carried2, pruned2, lazy2 = self.core2.tree()
            carried, pruned, lazy = carried + carried2, pruned + pruned2, lazy + lazy2
        return LinkTree(carried, pruned, lazy)

    def pruned_in1(self) -> list[QueueKey]:
        """The core-1 queues we hold whose link we pruned (core-2's are counted in the links' shared
        :class:`~latticed.protocol.core2_session.EagerCounts`)."""
        local = self._local
        return [key for key, link in self._links.items() if link.pruned and key in local]

    def carries(self, key: QueueKey) -> bool:
        """Whether this link would bring us news of ``key``, a queue we hold (on either core)."""
        if key in self._local:
            return key not in self._withheld and self._wants_key(key)
        return self.core2 is not None and self.core2.carries(key)

    def key_traffic(self, key: QueueKey) -> tuple[int, bool]:
        """For ``key``: our DELTAs in flight to the peer (unacknowledged), and whether we asked it for one."""
        link = self._links.get(key)
        return (0, False) if link is None else (link.inflight, link.asked)

    @property
    def inflight(self) -> int:
        return self._inflight_total

    # ------------------------------------------------------------------ internals
    def _link(self, key: QueueKey) -> _Link:
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = _Link()
        return link

    def _peer_link(self, key: QueueKey) -> _Link | None:
        """The link state of a queue the peer named: always for a queue we hold; for one we do not, only
        if we want it and the per-session and total bounds allow (None otherwise)."""
        link = self._links.get(key)
        if link is not None or key in self._local:
            return link if link is not None else self._link(key)
        if not self._wants_key(key):
            return None  # nothing we would ever do with it
        budget = self.key_budget
        if len(self._foreign) >= self.max_peer_keys or (budget is not None and not budget.take()):
            self.stats["peer_keys_refused"] += 1
            if budget is not None:
                budget.refused += 1
            return None
        self._foreign.add(key)
        return self._link(key)

    def _set_local(self, key: QueueKey, summary: Summary, now: float | None = None) -> None:
        self._local[key] = summary
        if self._grafts:
            waiting = self._grafts.get(key)
            if waiting is not None:
                at = self._now if now is None else now
                if not has_news(waiting.summary, summary):
                    del self._grafts[key]  # the news arrived (by the eager link, or any other): no WANT
                    self._clock().sample(at - waiting.since)
                elif is_ahead(summary, waiting.held):  # part of it: the timer starts again from here
                    self._clock().sample(at - waiting.since)
                    waiting.held, waiting.since = summary, at
                    waiting.due = at + self.graft_delay
        if self._foreign and key in self._foreign:
            self._foreign.discard(key)  # ours now: no longer counted against the peer
            if self.key_budget is not None:
                self.key_budget.release()

    def _peer_wants(self, key: QueueKey) -> bool:
        if self.kind_features and not expressible(key[2], self.peer_features, self.kind_features):
            if key in self._local:
                self._withheld.add(key)
            return False
        return self._peer_subscription is None or _matches(self._peer_subscription, key)

    def agree_features(self, features: frozenset[str]) -> None:
        """The link settled on ``features`` (both sides speak them): what they make expressible and was
        held back goes out now."""
        self.peer_features = features
        self._compact_out = COMPACT_FEATURE in features
        if self.core2 is not None:
            self.core2.agree(features)
        now_expressible = {k for k in self._withheld if expressible(k[2], features, self.kind_features)}
        self._withheld -= now_expressible
        if self._state is SessionState.OPEN:
            for key in now_expressible:
                if self._peer_wants(key):
                    self._schedule(key)

    def peer_stated(self, features: frozenset[str]) -> None:
        """The peer's own request said it speaks ``features`` (those we speak too): what it may send us
        once it has our answer is admitted from now on (the core-2 part's window), though what we send
        waits for :meth:`agree_features`."""
        if self.core2 is not None:
            self.core2.peer_speaks(features)

    @property
    def withheld(self) -> int:
        """Queues we hold that are not sent to this peer: its protocol version cannot express them."""
        return len(self._withheld) + (0 if self.core2 is None else self.core2.withheld)

    def attach_core2(self, core2: Core2Link) -> None:
        """Carry queues on the v2 fork core on this link too (before :meth:`start`; then
        ``core2.start`` with what we hold of them): ``core2`` follows this session's subscriptions,
        window and chunk size, and the features it agrees on."""
        core2.peer_wants = lambda key: (
            self._peer_subscription is None or _matches(self._peer_subscription, key)
        )
        core2.we_want = self._wants_key
        core2.expressible = self._core2_expressible
        core2.window, core2.depth, core2.max_records = self.window, self.depth, self.max_records
        core2.graft_delay = lambda: self.graft_delay
        core2.graft_hold = self.graft_timeout_max or self.graft_timeout
        core2.arrivals = self.arrivals
        core2.have_linger = self.have_linger
        core2.waits = lambda: (
            self.incarnation is not None
            and self._peer_incarnation is not None
            and self.incarnation > self._peer_incarnation
        )
        if self.peer_features is not None:
            core2.agree(self.peer_features)
        self.core2 = core2

    def _core2_expressible(self, key: QueueKey) -> bool:
        """``queue_expressible`` of a core-2 queue to this peer, kept per kind while the agreed features
        and the kinds' table are the same objects (a relay asks on every push and link; a peer's odd
        kinds are answered, not kept, past :data:`_KINDS_KEPT`)."""
        features, kinds, known = self.peer_features, self.kind_features, self._expressible_kinds
        if features is not self._expressible_for[0] or kinds is not self._expressible_for[1]:
            known.clear()
            self._expressible_for = (features, kinds)
        answer = known.get(key[2])
        if answer is None:
            answer = queue_expressible(key[2], 2, features, kinds)
            if len(known) < _KINDS_KEPT:
                known[key[2]] = answer
        return answer

    def _core2_receive(self, raw: list[Any], size: int) -> None:
        if self._state is not SessionState.OPEN:
            if self._state is SessionState.IDLE:
                raise LocalProtocolError("a core-2 message was fed to a session not started yet")
            raise RemoteProtocolError("the first message must be HELLO")
        assert self.core2 is not None
        self.core2.receive(raw, self._now, size)

    def _wants_key(self, key: QueueKey) -> bool:
        return self.subscription is None or _matches(self.subscription, key)

    def _schedule(self, key: QueueKey) -> None:
        self._pending.setdefault(key)
        self._pump()

    def _pump(self) -> None:
        """Ask the host for deltas while the window has room; at most one outstanding ask per queue."""
        rounds = len(self._pending)
        while self._pending and rounds > 0 and self._inflight_total + self._asked_total < self.window:
            rounds -= 1
            key, _ = self._pending.popitem(last=False)
            link = self._link(key)
            if link.asked or link.inflight >= self.depth:
                self._pending[key] = None  # wait for its ACK, keep order fair
                continue
            since = self._since(link)
            ours = self._local.get(key)
            if ours is not None and ours.forked:
                # Only our proof goes, once per link, so every replica ends with the one of lowest fork
                # point (the join keeps it), and once again whenever ours changes.
                if link.proof_sent:
                    continue
                link.proof_sent = True
            elif ours is None or not has_news(ours, since):
                continue
            elif link.futile == (ours, link.peer):
                # What we sent from here changed nothing at the peer: nothing more until either side
                # changes, rather than send the same chunks for ever.
                continue
            link.asked = True
            link.asked_since = since
            self._asked_total += 1
            self._events.append(NeedDelta(key, since, self.max_records))

    @staticmethod
    def _since(link: _Link) -> Summary | None:
        """Where the next delta for the peer starts: past what is in flight, unless the peer has told us
        (by digest, HAVE or its own deltas) that it holds more than that already."""
        sent = link.sent
        if sent is None or (link.peer is not None and is_ahead(link.peer, sent)):
            return link.peer
        return sent

    def _send(self, message: Message) -> None:
        packed: bytes | None = None
        if type(message) is Ack:
            compact = self._compact.encode_ack(message)  # also forgets the DELTA it acknowledges
            if compact is not None and self._compact_out:
                packed = pack(compact)
        elif type(message) is Delta and self._compact_out:
            packed = pack(self._compact.encode_delta(message))
        if packed is None:
            packed = encode_message(message)
        self._outbox.append(packed)
        self._outbox_bytes += len(packed)


def _no_news(delta: QueueDelta, since: Summary | None) -> bool:
    """A delta with nothing the peer lacks: no records, metadata or fork proof, and a head no newer than
    what the peer holds (a relay asked while its commit was behind the peer: it sends nothing and pushes
    again once the commit is done)."""
    return (
        since is not None
        and not delta.records
        and delta.meta is None
        and delta.fork is None
        and not is_ahead(held_after(delta, since), since)
    )


def _duplicate(sent: Summary | None, acked: Summary) -> bool:
    """Whether an ACK that changed nothing only says the peer had what we sent already (from another
    link, the normal case in a mesh), not that our records lost a join to another history: it holds at
    least all we sent, and no fork. Only the latter stops further deltas from here (see _pump)."""
    return (
        sent is not None
        and not acked.forked
        and not is_ahead(sent, acked)
        and not (sent.held_end == acked.held_end and sent.held_hash != acked.held_hash)
    )


def held_after(delta: QueueDelta, known: Summary | None) -> Summary:
    """What a side summarised by ``known`` holds after joining ``delta`` along one history (where the next
    chunk starts): the session's view of a peer it sent ``delta``, and a bundle's of its reader."""
    head = delta.head
    if head is None:  # a forked queue's proof, or nothing
        held = known or Summary()
        return dataclasses.replace(held, forked=True) if delta.fork is not None else held
    if delta.tip is not None:
        held_end, held_hash = delta.tip.end, delta.tip.head_hash
    elif known is not None:
        held_end, held_hash = known.held_end, known.held_hash
    else:
        held_end, held_hash = head.start, head.base_hash
    return Summary(
        version=head.version,
        start=head.start,
        held_end=max(held_end, head.start),
        held_hash=held_hash,
        meta_version=head.meta_version,
        forked=delta.fork is not None,
    )


def _matches(patterns: Iterable[str], key: QueueKey) -> bool:
    label = key_label(key)
    return any(fnmatch.fnmatchcase(label, pattern) for pattern in patterns)
