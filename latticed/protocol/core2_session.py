"""The part of a replication session that carries queues on the v2 fork core (feature ``heads-v2``).

A :class:`Core2Link` rides on a :class:`~latticed.protocol.replication.ReplicationSession` (attached with
:meth:`~latticed.protocol.replication.ReplicationSession.attach_core2`), sans-IO as the session is: its
messages (:mod:`latticed.protocol.core2_wire`) go out with the session's, its events come from the
session's :meth:`next_event`. Core-1 queues never pass through it, nor does anything of it reach a peer
before the link agreed on ``heads-v2``: a 0.2.0 peer, or one that has not answered yet, sees nothing of a
core-2 queue (they count as held back, :attr:`Core2Link.withheld`).

What it does is what the core-1 session does, on a value that is a lattice, so with fewer cases:

* On agreement each side sends ``DIGEST2`` (every core-2 queue it holds); once the peer's has come, what
  the peer may lack is pushed (a queue the digest does not name: the whole of it).
* A push is ``queue2.delta`` from the peer's last known summary, chunked by ``max_records``; one chunk of a
  queue is in flight at a time (``window`` bounds all queues together), and the ``ACK2`` says where the
  next one starts. A link that agreed on ``window2-32`` (:data:`~latticed.protocol.versions.WINDOW2`)
  keeps up to 32 in flight each way, of which at most ``window`` (8) over 64 KiB as sent: a fresh replica
  of many small queues merges more of them per group commit. Each ``DELTA2`` carries the sender's
  summary too, so the receiver answers with what the sender lacks (the other branch of a fork, say)
  without waiting for an announcement.
* Whether we may hold something the peer lacks is judged by summaries (:func:`has_news`); a delta that
  changed nothing for the peer is followed once by our whole value (``since`` None: a peer whose log
  parts from ours below what it knows cannot join a piece), then nothing until either side changes.
* Every local change is pushed on an eager link, and otherwise announced (``HAVE2``, the newest summary
  per queue, lingering as core 1's HAVEs do) unless the peer said it holds it already (its HAVE2, ACK2
  or DELTA2; of the two ends of a link, one waits a linger more for that word, ``waits``): a peer
  learns what we hold that it may lack, and one to which it is news grafts the
  link (``WANT2``), once the link's graft timer ran out without the eager copy (the session's, learned;
  0: at once; held while some link still delivers deltas of the queue, up to ``graft_hold``). A
  duplicate delta prunes the link for that queue (``PRUNE2``): from then on the link carries none of
  what follows the peer's records on our line, whichever path would send it (a backlog's next chunk
  after an ACK, an answer to a delta), only a ``HAVE2`` once nothing is in flight. A ``HAVE2`` of a peer
  that lacks something of ours is not a reason to push: our news went out as it came (a push there
  would cross the eager copy still on its way; a live stream on a mesh costs ~1 delta a record a
  replica).

What the peer holds, as far as we know, is the join of what it said (:func:`heard`): a word older than
one it gave since does not move it back. What it remembers of a peer is only about queues we hold (a
peer's summaries of others are not kept) and what is in flight; there is no memory across connections:
each link starts with whole digests. What a peer can make us hold in received deltas is bounded by the
window it agreed to, whichever way it behaves (more is its protocol error): ``window`` (8) deltas of at
most the link's message size (the daemon's ``max_frame_bytes``), so 8 x 16 MiB at the default; with
``window2-32``, 24 more of at most 64 KiB each, 1.5 MiB more.

Why one module: it is one class whose per-queue bookkeeping (what the peer holds, what is in flight, the
futile and whole offers, eager or pruned) is one set of invariants every handler touches; the wire forms
and the steps live apart.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from latticed.crdt import queue2
from latticed.errors import LocalProtocolError, RemoteProtocolError
from latticed.protocol.compact import COMPACT_FEATURE
from latticed.protocol.core2_compact import COMPACT2_CODES, REPEAT_HEADERS, Compact2Link
from latticed.protocol.core2_steps import Outgoing2
from latticed.protocol.core2_wire import (
    Ack2,
    AckHeld2,
    AckRun2,
    Delta2,
    Digest2,
    Have2,
    Message2,
    Prune2,
    Steps,
    Summary2,
    Want2,
    decode2,
    encode2,
)
from latticed.protocol.graft import Arrivals
from latticed.protocol.replication_messages import QueueKey
from latticed.protocol.versions import HEADS_V2, SMALL_DELTA2_BYTES, WIDE_WINDOW2, WINDOW2

__all__ = ["Core2Event", "Core2Link", "Delta2Received", "EagerCounts", "NeedDelta2", "has_news", "heard"]


def has_news(ours: Summary2 | None, theirs: Summary2 | None) -> bool:
    """Whether we may hold something a peer summarised by ``theirs`` lacks. False only when its summary
    covers ours along one history (as many leaves or more, the same fold at an equal count; records as
    far or further, the same chain value at an equal end) or we hold nothing; a peer on another branch
    that knows more leaves then has news for us, and its delta shows us the fork."""
    if ours is None or (not ours.core.log.known and not ours.core.held_end and not ours.heads):
        return False
    if theirs is None:
        return True
    if ours is theirs:
        return False
    # Equal summaries have equal epochs, and unforked equal ones are covered below: only forked ones need
    # the whole comparison (three dataclass __eq__ calls; a relayed push asks this ~12 times).
    a, b = ours.core, theirs.core
    if a.log.epoch != b.log.epoch:
        return a.log.epoch > b.log.epoch
    if ours.heads or theirs.heads:
        return ours != theirs  # forked: the branches held are settled by exchanging them
    covers_log = b.log.known > a.log.known or (b.log.known == a.log.known and b.log.fold == a.log.fold)
    covers_records = b.held_end > a.held_end or (b.held_end == a.held_end and b.held_hash == a.held_hash)
    return not (covers_log and covers_records)


def heard(view: Summary2 | None, word: Summary2 | None) -> Summary2 | None:
    """Our view of a peer once it said it holds ``word``: a join, not an overwrite. A word our view
    covers along one history is older than what the peer told us since (a lingered HAVE2, an ACK2 of
    what is durable there after a DELTA2 of what it verified ahead): taking it would move the view
    back, and the next delta would start below it, carrying records the peer holds. A word on another
    branch (a fork, a recovery) replaces the view, as does "nothing" (an ACK2 of a delta that did not
    fit: a delta from the old view would not fit again)."""
    return word if word is None or has_news(word, view) else view


@dataclass(frozen=True, slots=True)
class NeedDelta2:
    """Host: ``core2_steps.outgoing(state, since, max_records, max_bytes)`` of ``key``, then
    :meth:`Core2Link.provide_delta` (None: nothing to send)."""

    key: QueueKey
    since: queue2.Summary | None
    max_records: int


@dataclass(frozen=True, slots=True)
class Delta2Received:
    """Host: ``core2_steps.unpack_steps`` and ``queue2.verify_delta`` against what it holds,
    ``join_verified`` and store (keep the evidence aside), then :meth:`Core2Link.delta_applied` with what
    it holds now. A delta that does not fit what it holds any more (``GapError``) is applied as changing
    nothing; anything forged or malformed closes the link."""

    key: QueueKey
    seq: int
    delta: queue2.Delta
    steps: Steps | None = None
    #: How many of its records we held as it came (another link brought them first): a diagnostic.
    held: int = 0


Core2Event = NeedDelta2 | Delta2Received
_Pair = tuple[Summary2 | None, Summary2 | None]


@dataclass(slots=True)
class _Link2:
    peer: Summary2 | None = None  #: what the peer holds, as far as we know
    #: What the peer holds once it joined every delta in flight (None: unknown, or none in flight).
    sent: Summary2 | None = None
    eager: bool = True  #: False once the peer pruned us: our news goes out as HAVE2s (see _rest_lazily)
    pruned: bool = False  #: we pruned the peer, and have not grafted since
    asked: bool = False
    inflight: int = 0
    #: (ours, the peer's) when our last delta from the peer's summary changed nothing for it, and
    #: when our whole value went out after that: nothing more is sent while both hold exactly that.
    futile: _Pair | None = None
    whole: _Pair | None = None
    asked_for: _Pair | None = None


def _carried(ours: Summary2, implied: Summary2 | None) -> Summary2:
    """The summary a delta carries: ours, or what the peer holds once it joined the delta where that
    covers ours on one unforked history. The host builds a delta from what it holds as it answers, which
    may be past what it told the link (a commit whose change has not reached the link yet); carrying the
    older summary would have the peer, holding more than we said, send those records back to us."""
    if implied is None or implied.heads or ours.heads or has_news(ours, implied):
        return ours
    return implied


def _always(key: QueueKey) -> bool:
    return True


@dataclass(slots=True)
class EagerCounts:
    """Per queue, over the links that report here (:meth:`Core2Link.share`): how many carry it to us
    unpruned (eager in-links) and how many we pruned it on, and the queues pruned somewhere and eager
    nowhere (cut off). Kept as links open, prune, graft and close, so ``status`` reads the cut-off
    queues in O(cut), not queues x links each call (trees26)."""

    eager: dict[QueueKey, int] = field(default_factory=dict)
    pruned: dict[QueueKey, int] = field(default_factory=dict)
    cut: set[QueueKey] = field(default_factory=set)

    def move(self, key: QueueKey, eager: int, pruned: int) -> None:
        """A link's ``key`` counts ``eager`` / ``pruned`` more (or fewer, negative)."""
        e = self.eager.get(key, 0) + eager
        p = self.pruned.get(key, 0) + pruned
        if e:
            self.eager[key] = e
        else:
            self.eager.pop(key, None)
        if p:
            self.pruned[key] = p
        else:
            self.pruned.pop(key, None)
        if p and not e:
            self.cut.add(key)
        else:
            self.cut.discard(key)


@dataclass(slots=True)
class Core2Link:
    """The core-2 part of one peer link (see the module docstring)."""

    #: Deltas in flight each way, all queues; with ``window2-32`` agreed, how many of them may be over
    #: :data:`SMALL_DELTA2_BYTES` (the rest of ``window_out`` / ``window_in`` small).
    window: int = 8
    #: Deltas we keep in flight and those the peer may (0: ``window``): widened once the link agreed on
    #: :data:`WINDOW2` (ours once the peer answered; the peer's once its request said it speaks it).
    window_out: int = 0
    window_in: int = 0
    depth: int = 4  #: chunks of one queue in flight ahead of its ACKs
    max_records: int = 4096
    #: Whether the peer subscribed to a queue, and whether we did (set by ``attach_core2``).
    peer_wants: Callable[[QueueKey], bool] = _always
    we_want: Callable[[QueueKey], bool] = _always
    #: Whether the link's features express a core-2 queue of this key's kind (``versions.
    #: queue_expressible``, set by ``attach_core2``): the core needs ``heads-v2``, a kind may need more.
    expressible: Callable[[QueueKey], bool] = _always
    #: How long a HAVE2 with news waits for the eager copy before the WANT2 (0: at once), in the host's
    #: time units: the session's learned graft timer (set by ``attach_core2``; see :meth:`tick`).
    graft_delay: Callable[[], float] = lambda: 0.0
    #: How long a graft waits past its delay while deltas of its queue are still arriving on some link
    #: (the session's ``graft_timeout_max``, set by ``attach_core2``; 0: it does not wait).
    graft_hold: float = 0.0
    #: Deltas of each queue received on any of the host's links and not applied yet (the session's,
    #: shared by the host's links; set by ``attach_core2``): a HAVE2's graft waits while one arrives.
    arrivals: Arrivals = field(default_factory=Arrivals)
    #: How long HAVE2s wait to go out together (0: with the next send), in the host's time units: the
    #: session's ``have_linger`` (set by ``attach_core2``). A live stream then costs a pruned link one
    #: HAVE2 per queue per linger, the newest summary, not one per record.
    have_linger: float = 0.0
    #: Whether the peer announces first on this link (set by ``attach_core2``: the higher incarnation
    #: of the two waits). Both ends of a lazy link usually hold the same records, and would announce
    #: each to the other; so one end's HAVE2s wait a linger more, and go only if the peer's own word
    #: (HAVE2, ACK2, DELTA2) has not covered what they had to say by then. Either value is safe.
    waits: Callable[[], bool] = lambda: False
    _have_due: float | None = None
    _haves_due_now: bool = False
    #: Grafts waiting for the eager copy: when due, when the HAVE2 came, what it said the peer holds.
    _grafts: dict[QueueKey, tuple[float, float, Summary2]] = field(default_factory=dict)
    _now: float = 0.0
    #: None: the link has not agreed on its features yet; then whether it agreed on ``heads-v2``.
    agreed: bool | None = None
    #: The link's memory for the compact forms: read whenever the peer sends them; ours go out compact
    #: once the link agreed on ``compact`` too.
    _codec: Compact2Link = field(default_factory=Compact2Link)
    _compact_out: bool = False
    _started: bool = False
    _local: dict[QueueKey, Summary2] = field(default_factory=dict)
    _links: dict[QueueKey, _Link2] = field(default_factory=dict)
    _peer_digest: bool = False
    _outbox: list[bytes] = field(default_factory=list)
    _outbox_bytes: int = 0
    _events: deque[Core2Event] = field(default_factory=deque)
    _pending: OrderedDict[QueueKey, None] = field(default_factory=OrderedDict)
    _haves: dict[QueueKey, Summary2] = field(default_factory=dict)
    #: Per queue in ``_haves``, what we held as it first had something to announce (see ``waits``).
    _haves_first: dict[QueueKey, Summary2] = field(default_factory=dict)
    #: Deltas received and not acked yet: their queue, and the summary their sender said it holds.
    _received: dict[int, tuple[QueueKey, Summary2]] = field(default_factory=dict)
    #: Deltas sent and not acked yet: their queue, what they were asked from, the summary they carried.
    _brings: dict[int, tuple[QueueKey, _Pair, Summary2]] = field(default_factory=dict)
    _seq: int = 0
    #: ACK2s held back to go as one ``AckRun2`` (:meth:`_ack`): their seqs, in a row, of one queue, and
    #: the summary we hold, which a later delta of that queue carried. Flushed before anything else is
    #: sent and at every :meth:`messages_to_send`, so never held past the pass that made them.
    _ack_run: list[int] = field(default_factory=list)
    _ack_run_of: tuple[QueueKey, Summary2] | None = None
    _busy: int = 0  #: asks and deltas in flight, all queues
    #: Our deltas in flight of at most :data:`SMALL_DELTA2_BYTES`, and the peer's over it we have not
    #: acked (the wider window admits more of the first kind only).
    _small_out: set[int] = field(default_factory=set)
    _big_in: set[int] = field(default_factory=set)
    #: Queues whose link we pruned, and those the peer pruned (kept as the flags change: :meth:`tree`
    #: reads them for ``status``, never all queues); the count of ``_local``'s first ``[1]`` keys this
    #: link carries (``_local`` only grows, the features and subscriptions are fixed once agreed).
    _pruned: set[QueueKey] = field(default_factory=set)
    _lazy: set[QueueKey] = field(default_factory=set)
    _carried: tuple[dict[QueueKey, Summary2] | None, int, int] = (None, 0, 0)
    _lazy_held: int = 0  #: how many of ``_lazy`` we hold (in ``_local``), kept as both change
    #: Where this link counts its eager and pruned queues for the cut-off ones (:meth:`share`).
    ledger: EagerCounts | None = None
    #: Deltas sent, acked by the peer (an ACK2 or one of an AckRun2) and received; records received, and
    #: of those how many we held as they came (their copy from another link was first: what pruning and
    #: lazy links are there to avoid).
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "deltas_sent": 0,
            "deltas_acked": 0,
            "deltas_received": 0,
            "records_received": 0,
            "records_held": 0,
        }
    )

    # ------------------------------------------------------------------ host → link
    def start(self, local: Mapping[QueueKey, Summary2]) -> None:
        """What we hold of core-2 queues as the link starts (before or after the agreement)."""
        if self._started:
            raise LocalProtocolError("core-2 link already started")
        ledger = self.ledger
        if ledger is not None:
            self.unshare()
        self._local, self._started = dict(local), True
        self._lazy_held = sum(1 for key in self._lazy if key in self._local)
        if ledger is not None:
            self.share(ledger)
        if self.agreed:
            self._send_digest()
            self._start_pushing()

    def agree(self, features: frozenset[str]) -> None:
        """The link settled on ``features`` (the session passes them on)."""
        if self.agreed:
            return
        self.agreed = HEADS_V2 in features
        self._compact_out = self.agreed and COMPACT_FEATURE in features
        self._codec.repeat_headers = self._compact_out and REPEAT_HEADERS in features
        if self.agreed and WINDOW2 in features:
            self.window_out = self.window_in = max(WIDE_WINDOW2, self.window)
        if self.agreed and self.ledger is not None:
            for key in self._local:  # not counted before the agreement (``_count``)
                self._count(key, 1)
        if self.agreed and self._started:
            self._send_digest()
            self._start_pushing()

    def peer_speaks(self, features: frozenset[str]) -> None:
        """The peer's request said it speaks ``features`` (those we speak too): once it has our answer
        it may send as wide a window as they allow, so we admit that many from now on."""
        if HEADS_V2 in features and WINDOW2 in features:
            self.window_in = max(self.window_in, WIDE_WINDOW2, self.window)

    @property
    def withheld(self) -> int:
        """Core-2 queues we hold that this peer is sent nothing of (its features cannot express them)."""
        if not self.agreed:
            return len(self._local)
        return sum(1 for key in self._local if not self.expressible(key))

    def local_update(self, key: QueueKey, summary: Summary2) -> None:
        """We changed a core-2 queue (own write, recovery, or a merge from another link). On a relay this
        runs once a push and link, so ``_sending``, ``_for_peer``, ``_link`` and ``_schedule`` are
        written out here (the same checks, in the same order)."""
        if key not in self._local:
            self._new_key(key, summary)
        else:
            self._local[key] = summary
        if self._grafts:
            self._arrived(key, summary)
        if not (self.agreed and self._started and self._peer_digest):
            return
        if not (self.peer_wants(key) and self.expressible(key)):
            return
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = _Link2()
        if not has_news(summary, link.peer):
            return
        if link.eager:
            self._pending.setdefault(key)  # ``_schedule``: sending, checked above
            self._pump()
        else:
            self._announce(key, summary)

    def provide_delta(self, key: QueueKey, out: Outgoing2 | None) -> None:
        """The answer to a :class:`NeedDelta2` (``core2_steps.outgoing``; None: nothing to send).

        On a relay this and :meth:`local_update` run once a push and downstream link (the pass-on), so
        their helpers are written out (relay26). Invariants, each pinned by a test: the messages and
        their order are :meth:`_send`'s (held ACKs flushed first, then the DELTA2 as
        :meth:`Compact2Link.encode` or ``encode2`` packs it: tests/protocol/test_core2_pass_on_bytes.py
        pins the bytes per feature set against main's); the link state changed is the same (seq,
        ``_brings``, ``_busy``, ``inflight``, ``sent``, ``_small_out`` by the packed size); nothing
        here verifies or decides what is sent, which the caller's delta (verified before it is passed
        on) and ``has_news`` decide, as before."""
        link = self._links.get(key)
        if link is None or not link.asked:
            raise LocalProtocolError(f"no delta of {key[1]} was asked for")
        link.asked, pair = False, link.asked_for
        self._busy -= 1
        ours = self._local.get(key)
        if out is None or ours is None or pair is None:
            link.futile = link.whole = pair  # nothing to send from here: wait for a change
            self._pump()
            return
        self._seq += 1
        link.inflight += 1
        link.sent = out.implied
        self._busy += 1
        carried = _carried(ours, out.implied)
        self._brings[self._seq] = (key, pair, carried)
        self.stats["deltas_sent"] += 1
        # ``_send`` written out, the compact codec's DELTA2 encoder called directly (the same bytes)
        if self._ack_run:
            self._flush_acks()  # what was held back goes first: the peer reads them in order
        message = Delta2(self._seq, carried, out.delta, out.steps)
        packed = self._codec.encode_delta(message) if self._compact_out else encode2(message)
        self._outbox.append(packed)
        self._outbox_bytes += len(packed)
        if len(packed) <= SMALL_DELTA2_BYTES:
            self._small_out.add(self._seq)
        if out.implied is not None and has_news(ours, out.implied):
            self._schedule(key)  # the next chunk of a backlog, ahead of this one's ACK
        else:
            self._pump()

    def delta_applied(self, seq: int, summary: Summary2 | None, changed: bool) -> None:
        """The host verified, joined and stored the delta ``seq``; ``summary`` is what it holds now (None:
        nothing, as the delta did not fit: then the queue is not remembered here either)."""
        received = self._received.pop(seq, None)
        if received is None:
            raise LocalProtocolError(f"no core-2 delta {seq} is waiting")
        self._big_in.discard(seq)
        key, theirs = received
        self.arrivals.settled(key)
        if summary is None:
            self._send(Ack2(seq, key, None))
            if key not in self._local and all(k != key for k, _ in self._received.values()):
                self._links.pop(key, None)  # a peer's made-up queues cost nothing once answered
                self._lazy.discard(key)
            return
        if key not in self._local:
            self._new_key(key, summary)
        else:
            self._local[key] = summary
        if self._grafts:
            self._arrived(key, summary)
        link = self._link(key)
        self._ack(seq, key, theirs, summary)
        if not changed and not link.pruned:
            link.pruned = True
            self._count(key, -1)
            self._pruned.add(key)
            self._count(key, 1)
            self._send(Prune2(key))
        elif changed and link.pruned:
            # The first copy came on a link we pruned (its push crossed our PRUNE2): as Plumtree keeps
            # a first copy's sender eager, graft it back. Else the copies that follow on the links
            # still eager prune them too, and this node is left with no eager in-link until a HAVE2
            # and a graft timer mend it (the warm-up's empty delta did that to 11 of 26 bulks).
            self._graft(key)
        if self._for_peer(key) and has_news(summary, link.peer):
            self._schedule(key)  # the sender lacks something we hold (the other branch of a fork)

    def _ack(self, seq: int, key: QueueKey, theirs: Summary2, summary: Summary2) -> None:
        """The ACK2 of ``seq``: short when we hold what it carried. On a compact link, one whose summary a
        later delta of the same queue carried waits for that one's, and the run goes as one AckRun2 (a
        relay stores pushes that came together in one commit: each earlier ACK2 would carry the newer
        summary whole); a run that does not reach it goes as the ACK2s it held back."""
        run = self._ack_run
        if run and (self._ack_run_of != (key, summary) or seq != run[-1] + 1):
            self._flush_acks()
        if summary == theirs:
            if self._ack_run:
                first, count = self._ack_run[0], len(self._ack_run) + 1
                self._ack_run, self._ack_run_of = [], None
                self._send(AckRun2(first, count))
            else:
                self._send(AckHeld2(seq))
        elif self._compact_out and any(
            later > seq and k == key and carried == summary for later, (k, carried) in self._received.items()
        ):
            self._ack_run.append(seq)
            self._ack_run_of = (key, summary)
        else:
            self._send(Ack2(seq, key, summary))

    def _flush_acks(self) -> None:
        run, of = self._ack_run, self._ack_run_of
        self._ack_run, self._ack_run_of = [], None
        if of is not None:
            for seq in run:
                self._send(Ack2(seq, of[0], of[1]))

    def release(self) -> None:
        """The link is gone: the deltas it received and did not apply never will be (the host stops
        with the link), so they no longer hold other links' grafts."""
        for key, _ in self._received.values():
            self.arrivals.settled(key)
        self._received.clear()
        self._big_in.clear()

    # ------------------------------------------------------------------ peer → link
    def receive(self, raw: list[Any], now: float = 0.0, size: int = 0) -> None:
        """One core-2 message (its array, type code first, ``size`` bytes as it came; the session lets
        none in before the peer's HELLO); malformed or out of place: RemoteProtocolError."""
        self._now = now
        message: Message2 = self._codec.decode(raw) if raw[0] in COMPACT2_CODES else decode2(raw)
        match message:
            case Digest2():
                self._on_digest(message)
            case Delta2():
                self._on_delta(message, size)
            case Ack2():
                self._on_ack(message)
            case AckHeld2():
                self._on_ack(message)
            case AckRun2():
                self._on_ack_run(message)
            case Have2():
                self._on_have(message)
            case Want2():
                self._on_want(message)
            case Prune2():
                link = self._links.get(message.key)
                if link is not None:
                    link.eager = False
                    if message.key not in self._lazy:
                        self._lazy.add(message.key)
                        self._lazy_held += message.key in self._local

    def _on_digest(self, digest: Digest2) -> None:
        if self._peer_digest:
            raise RemoteProtocolError("DIGEST2 twice")
        self._peer_digest = True
        for key, summary in digest.entries:
            if key in self._local:
                self._link(key).peer = summary
        self._start_pushing()

    def _on_delta(self, message: Delta2, size: int = 0) -> None:
        seq, delta = message.seq, message.delta
        key = (delta.owner, delta.name, delta.kind)
        if seq in self._received:
            raise RemoteProtocolError("DELTA2 needs a fresh sequence number")
        window = self.window_in or self.window
        if len(self._received) >= window:
            raise RemoteProtocolError(
                f"peer exceeded the delta window: more than {window} core-2 deltas unacknowledged"
            )
        big = size > SMALL_DELTA2_BYTES
        if big and len(self._big_in) >= self.window:
            raise RemoteProtocolError(
                f"peer exceeded the delta window: more than {self.window} core-2 deltas over "
                f"{SMALL_DELTA2_BYTES} bytes unacknowledged"
            )
        if big:
            self._big_in.add(seq)
        if not self.we_want(key):
            raise RemoteProtocolError(f"peer sent {key[0].hex()}/{key[1]}, which we did not subscribe to")
        self._received[seq] = (key, message.summary)
        self.arrivals.received(key)
        link = self._link(key)  # tracked whatever we hold: the window bounds these
        link.peer = heard(link.peer, message.summary)
        ours, count = self._local.get(key), len(delta.records)
        held = 0 if ours is None or ours.heads else max(0, min(ours.core.held_end - delta.from_offset, count))
        self.stats["deltas_received"] += 1
        self.stats["records_received"] += count
        self.stats["records_held"] += held
        self._events.append(Delta2Received(key, seq, delta, message.steps, held))

    def _on_ack(self, ack: Ack2 | AckHeld2) -> None:
        brought = self._brings.pop(ack.seq, None)
        if brought is None or (isinstance(ack, Ack2) and brought[0] != ack.key):
            raise RemoteProtocolError("ACK2 for a delta we did not send")
        key, pair, carried = brought
        self._acked(ack.seq, key, pair, ack.summary if isinstance(ack, Ack2) else carried)

    def _on_ack_run(self, ack: AckRun2) -> None:
        """As that many ACK2s, each saying the peer holds what the run's last delta carried; every one
        must be a delta of the same queue in flight, or nothing of it is taken."""
        seqs = range(ack.seq, ack.seq + ack.count)
        if ack.count > len(self._brings):
            raise RemoteProtocolError("ACK2 run for deltas we did not send")
        brings = self._brings
        first = brings.get(ack.seq)
        if first is None or any((b := brings.get(seq)) is None or b[0] != first[0] for seq in seqs):
            raise RemoteProtocolError("ACK2 run for deltas we did not send, or of more than one queue")
        key, held = first[0], brings[seqs[-1]][2]
        for seq in seqs:
            _, pair, _ = self._brings.pop(seq)
            self._acked(seq, key, pair, held)

    def _acked(self, seq: int, key: QueueKey, pair: _Pair, held: Summary2 | None) -> None:
        ours, peer = pair
        self.stats["deltas_acked"] += 1
        link = self._link(key)
        link.inflight -= 1
        self._busy -= 1
        self._small_out.discard(seq)
        if not has_news(held, peer):  # it changed nothing there (or did not fit what the peer holds,
            link.futile = (ours, peer)  # below what it said before): the whole value once, then stop
        link.peer = heard(link.peer, held)
        if link.inflight == 0:
            link.sent = None  # from now on what the peer says it holds is the whole truth
        if self._for_peer(key) and has_news(self._local.get(key), self._since(link)):
            self._schedule(key)
        self._pump()

    def _on_have(self, have: Have2) -> None:
        key, summary = have.key, have.summary
        ours = self._local.get(key)
        if ours is not None:
            link = self._link(key)  # not a reason to push: our news went out as it came
            link.peer = heard(link.peer, summary)
        if self.we_want(key) and has_news(summary, ours):
            delay = self.graft_delay()
            if delay <= 0:
                self._graft(key)
            else:
                due, since, _ = self._grafts.get(key, (self._now + delay, self._now, summary))
                self._grafts[key] = (due, since, summary)

    def _graft(self, key: QueueKey) -> None:
        link = self._links.get(key)
        if link is not None:
            link.pruned = False
            if key in self._pruned:
                self._count(key, -1)
                self._pruned.discard(key)
                self._count(key, 1)
        self._send(Want2(key, self._local.get(key)))

    def tick(self, now: float) -> None:
        """The host's clock moved to ``now``: a HAVE2 whose news has not come within the graft delay
        grafts its link, unless some link is still delivering deltas of the queue (a backlog streams in
        more slowly than HAVE2s announce it), for at most ``graft_hold`` after the HAVE2."""
        self._now = now
        for key, (due, since, summary) in list(self._grafts.items()):
            if due > now:
                continue
            if not has_news(summary, self._local.get(key)):
                del self._grafts[key]
            elif self.arrivals.arriving(key) and now - since < self.graft_hold:
                self._grafts[key] = (min(now + self.graft_delay(), since + self.graft_hold), since, summary)
            else:
                del self._grafts[key]
                self._graft(key)
        if self._haves and self.have_linger > 0:
            if self._have_due is None:
                self._have_due = now + self.have_linger * (2 if self.waits() else 1)
            elif self._have_due <= now:
                self._haves_due_now = True

    def next_deadline(self) -> float | None:
        deadline = min(due for due, _, _ in self._grafts.values()) if self._grafts else None
        if self._haves and self.have_linger > 0 and not self._haves_due_now:
            due = self._have_due if self._have_due is not None else 0.0  # 0: tick now, to start it
            deadline = due if deadline is None else min(deadline, due)
        return deadline

    def _haves_ready(self) -> bool:
        return self.have_linger <= 0 or self._haves_due_now

    def _arrived(self, key: QueueKey, summary: Summary2) -> None:
        """We hold ``summary`` now: a graft waiting for news it covers is not needed."""
        waiting = self._grafts.get(key)
        if waiting is not None and not has_news(waiting[2], summary):
            del self._grafts[key]

    def _on_want(self, want: Want2) -> None:
        key = want.key
        if key not in self._local:
            return  # nothing to send
        link = self._link(key)
        link.eager = True
        if key in self._lazy:  # a queue we hold (checked above)
            self._lazy.discard(key)
            self._lazy_held -= 1
        link.peer = heard(link.peer, want.summary)
        if self._for_peer(key) and has_news(self._local[key], want.summary):
            self._schedule(key)

    # ------------------------------------------------------------------ link → host
    def next_event(self) -> Core2Event | None:
        return self._events.popleft() if self._events else None

    def has_work(self) -> bool:
        return bool(self._events or self._outbox or self._ack_run or (self._haves and self._haves_ready()))

    @property
    def outbox_bytes(self) -> int:
        return self._outbox_bytes

    @property
    def events(self) -> int:
        return len(self._events)

    def messages_to_send(self) -> list[bytes]:
        if self._ack_run:
            self._flush_acks()
        out, self._outbox, self._outbox_bytes = self._outbox, [], 0
        if self._haves and self._haves_ready():
            out.extend(self._encode(Have2(key, summary)) for key, summary in self._due_haves())
        return out

    def _due_haves(self) -> list[tuple[QueueKey, Summary2]]:
        """The HAVE2s to send now: none the peer is known to hold already. An end that waits sends none
        while the peer's word covers what it first had to say (the peer announces, so it is not
        cut off), and keeps what the peer has not said yet for its next turn."""
        haves, firsts = self._haves, self._haves_first
        self._haves, self._haves_first = {}, {}
        self._have_due, self._haves_due_now = None, False
        waits = self.have_linger > 0 and self.waits()
        due = []
        for key, summary in haves.items():
            link = self._links.get(key)
            peer = None if link is None else link.peer
            if not has_news(summary, peer):
                continue
            if waits and not has_news(firsts.get(key, summary), peer):
                self._announce(key, summary)
                continue
            due.append((key, summary))
        return due

    def _announce(self, key: QueueKey, summary: Summary2) -> None:
        """A HAVE2 of ``summary`` goes out with the next ones (see :meth:`_due_haves`)."""
        self._haves[key] = summary
        self._haves_first.setdefault(key, summary)

    def peer_summary(self, key: QueueKey) -> Summary2 | None:
        link = self._links.get(key)
        return None if link is None else link.peer

    def carries(self, key: QueueKey) -> bool:
        """Whether this link would bring us news of ``key``, a queue we hold."""
        return bool(self.agreed) and key in self._local and self.expressible(key) and self.we_want(key)

    def share(self, ledger: EagerCounts) -> None:
        """Count this link's eager and pruned queues in ``ledger`` from now on (until :meth:`unshare`):
        the links a :class:`~latticed.net.gossip.Gossip` lists share one, for its cut-off queues."""
        if self.ledger is not None:
            self.unshare()
        self.ledger = ledger
        for key in self._local:
            self._count(key, 1)

    def unshare(self) -> None:
        """Take this link's counts out of its ledger (it closed, or a newer link replaced it)."""
        for key in self._local:
            self._count(key, -1)
        self.ledger = None

    def _count(self, key: QueueKey, sign: int) -> None:
        """Add (1) or take out (-1) ``key``'s part in the ledger: eager, pruned or none, as now."""
        ledger = self.ledger
        if ledger is None or not self.agreed:
            return
        if key in self._pruned:
            ledger.move(key, 0, sign)
        elif self.expressible(key) and self.we_want(key):  # ``carries``: key in _local (callers)
            ledger.move(key, sign, 0)

    def _new_key(self, key: QueueKey, summary: Summary2) -> None:
        """A queue we did not hold: its lazy flag and ledger part start counting."""
        self._local[key] = summary
        self._lazy_held += key in self._lazy
        self._count(key, 1)

    def tree(self) -> tuple[int, int, int]:
        """Where this link stands in each queue's eager tree, for operators: how many queues we hold it
        carries, those of them we pruned (the peer announces them with HAVE2s, pushes nothing until we
        graft), and how many the peer pruned (we announce rather than push). A queue pruned on every
        link it comes in by is cut off from its eager tree until a HAVE2 and a graft timer mend it.
        Counted from the queues new since the last call and counts kept as the flags change (trees26:
        O(1) but for new queues, not every queue on every link each ``status``)."""
        if not self.agreed:
            return 0, 0, 0
        local = self._local
        counted_of, seen, carried = self._carried
        if counted_of is not local:
            seen = carried = 0
        if len(local) > seen:
            new = islice(local, seen, None)
            carried += sum(1 for key in new if self.expressible(key) and self.we_want(key))
            self._carried = (local, len(local), carried)
        return carried, len(self._pruned), self._lazy_held

    @property
    def inflight(self) -> int:
        return self._busy - sum(link.asked for link in self._links.values())

    # ------------------------------------------------------------------ internals
    def _sending(self) -> bool:
        """Whether pushes go out: the link agreed on ``heads-v2`` and the peer's digest came."""
        return bool(self.agreed) and self._started and self._peer_digest

    def _for_peer(self, key: QueueKey) -> bool:
        return self.peer_wants(key) and self.expressible(key)

    def _send_digest(self) -> None:
        self._send(Digest2(tuple((k, s) for k, s in self._local.items() if self.expressible(k))))

    def _start_pushing(self) -> None:
        if self._sending():
            for key, summary in self._local.items():
                if self._for_peer(key) and has_news(summary, self._link(key).peer):
                    self._pending.setdefault(key)
            self._pump()

    def _link(self, key: QueueKey) -> _Link2:
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = _Link2()
        return link

    def _schedule(self, key: QueueKey) -> None:
        if self._sending():
            self._pending.setdefault(key)
            self._pump()

    def _pump(self) -> None:
        """Ask the host for deltas while the window has room; one ask or delta in flight per queue. An
        ask may come back large, so asks and large deltas together stay within ``window``; only small
        ones fill the rest of a wider ``window_out``."""
        rounds, window, out = len(self._pending), self.window, self.window_out or self.window
        small = self._small_out
        while self._pending and rounds > 0 and self._busy < out and self._busy - len(small) < window:
            rounds -= 1
            key, _ = self._pending.popitem(last=False)
            link = self._links.get(key)  # ``_link`` and ``_since`` written out (once a relayed push)
            if link is None:
                link = self._links[key] = _Link2()
            if link.asked or link.inflight >= self.depth or (link.inflight and link.sent is None):
                self._pending[key] = None  # its ACK schedules it again
                continue
            sent, peer = link.sent, link.peer
            if link.inflight and sent is not None and (peer is None or has_news(sent, peer)):
                peer = sent
            ours = self._local.get(key)
            if not has_news(ours, peer):
                continue
            if not link.eager and not has_news(link.peer, ours):
                self._rest_lazily(key, link, ours)
                continue
            pair = (ours, peer)
            since = None if peer is None else peer.core
            if link.futile == pair:
                if link.whole == pair:
                    continue
                link.whole, since = pair, None
            link.asked, link.asked_for = True, pair
            self._busy += 1
            self._events.append(NeedDelta2(key, since, self.max_records))

    def _rest_lazily(self, key: QueueKey, link: _Link2, ours: Summary2 | None) -> None:
        """The peer pruned this link and lacks only what follows its records on our line (a backlog, a
        live record): its eager link brings that, so nothing goes out here, whichever path asked (an
        ACK's next chunk, a delta's answer). Once nothing is in flight, a HAVE2 of what we hold starts
        its graft timer: should that link fail, the peer asks us (WANT2)."""
        if ours is not None and link.inflight == 0 and has_news(ours, link.peer):
            self._announce(key, ours)

    @staticmethod
    def _since(link: _Link2) -> Summary2 | None:
        """Where the next chunk starts: past what is in flight, unless the peer said (an ACK2, its own
        delta or HAVE2) that it holds all that already: another link brought it, and chunks from ``sent``
        would carry it again."""
        sent, peer = link.sent, link.peer
        if not link.inflight or sent is None or (peer is not None and not has_news(sent, peer)):
            return peer
        return sent

    def _encode(self, message: Message2) -> bytes:
        return self._codec.encode(message) if self._compact_out else encode2(message)

    def _send(self, message: Message2) -> int:
        """Queue ``message``; its size as sent (as the peer will measure it)."""
        if self._ack_run:
            self._flush_acks()  # what was held back goes first: the peer reads them in order
        packed = self._encode(message)
        self._outbox.append(packed)
        self._outbox_bytes += len(packed)
        return len(packed)
