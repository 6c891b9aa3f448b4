"""Which peers to dial and when: a sans-IO address book with exponential backoff.

Addresses come from five places: ``static`` (``--peer`` / config), ``added`` (``latticectl peers add``),
``mdns`` (LAN discovery), ``remembered`` (persisted from earlier runs) and ``incoming`` (a peer that connected
to us; its source port is not a listen port, so such an entry is shown but never dialled). Static and added
addresses are the operator's: they are retried for ever, never forgotten for failing. Identities in
:attr:`PeerBook.blocked` are never dialled. The daemon's dial loop is::

    for address in book.due(now):          # claims them: they are "dialing" until reported back
        start dialing address → book.connected(address, public_key, now) or book.failed(address, now)
    when a connection ends                  → book.disconnected(address, now)
    sleep until book.next_due() or until something changes

Discovery does not decide how many links a daemon keeps (HyParView's active view): peers found by
mDNS or remembered from earlier runs are dialled only while fewer than ``active_view`` identities are
connected or being dialled, in both directions; the others stay known (passive) and one of them is dialled
when an active link drops, chosen at random so that daemons that all see the same LAN do not all pick the
same few peers. Static and added addresses count within the view but are always dialled. Links and
dials in flight both count against two bounds on the peers that dial us (:meth:`PeerBook.over_view`),
the operator's excepted: beyond ``discovered_links`` (the view plus one), a peer we know from mDNS gets
in at the cost of one of our other links, chosen at random (:meth:`PeerBook.make_room`, HyParView's join,
so a daemon joining a LAN where every view is full is not shut out), and one let in before its
announcement reached us is held to the same bound once it does (:meth:`PeerBook.over_view_links`); beyond
``max_links``, anyone is turned away (a hub that daemons elsewhere were configured to dial takes more
than the view, not without bound).

Liveness is the gossip layer's business (pings), never mDNS's: python-zeroconf keeps a vanished peer's
records for ~19 minutes. So an mDNS sighting only adds an address (and, if it was backing off, makes it due
now); it neither marks anything connected nor keeps anything alive, and an mDNS entry is retried like any
other until it keeps failing.

Times are seconds on the caller's clock. Use Unix time (``time.time()``) so ``last_seen`` means something
after a restart; a clock that jumps backwards cannot stall dialing, because no attempt is ever scheduled
further than ``Backoff.cap`` ahead.

Why one module: :class:`PeerBook` is one state machine over one table of entries: the address sources,
backoff, identities and what is persisted all read and update the same entries.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, get_args

from latticed.errors import MalformedError, NotFoundError
from latticed.protocol.addresses import HostPort

__all__ = [
    "DEFAULT_ACTIVE_VIEW",
    "DEFAULT_FORGET_AFTER",
    "DEFAULT_FORGET_FAILURES",
    "DEFAULT_MAX_REMEMBERED",
    "DEFAULT_STABLE_AFTER",
    "DEFAULT_VIEW_SLACK",
    "Backoff",
    "PeerBook",
    "PeerState",
    "PeerStatus",
    "Source",
]

Source = Literal["static", "added", "mdns", "remembered", "incoming"]
_SOURCES: Final[tuple[str, ...]] = get_args(Source)

#: A connection that ends sooner than this (seconds) does not reset the backoff: a peer that accepts and
#: drops at once must not be redialled in a tight loop.
DEFAULT_STABLE_AFTER: Final = 30.0
#: Consecutive failures after which a non-static address may be forgotten (~15-20 minutes of trying).
DEFAULT_FORGET_FAILURES: Final = 12
#: ... if it never connected, or its last connection is older than this (seconds).
DEFAULT_FORGET_AFTER: Final = 30 * 24 * 3600.0
#: Identities this daemon links to in both directions before it stops dialling peers it found itself
#: (mDNS, remembered): enough for a connected overlay that heals (HyParView's c + 1 with c = 4), few
#: enough that a LAN of many daemons is not a full mesh (each link carries every record's copy or HAVE).
DEFAULT_ACTIVE_VIEW: Final = 5
#: Links at most, dials in flight included, before a peer found by mDNS that dials us costs us another
#: link: one more than the view, so that a daemon that is one short does not churn the others' links.
DEFAULT_VIEW_SLACK: Final = 1
#: At most this many peers are persisted, most recently seen first.
DEFAULT_MAX_REMEMBERED: Final = 256
_JSON_VERSION: Final = 1
_KEY_SIZE: Final = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Exponential backoff with jitter: pure policy, the random source is passed in.

    The ``n``-th consecutive failure waits ``min(cap, initial * factor**(n-1))`` scaled by a random factor
    in ``[1 - jitter, 1]``: never more than the cap, and spread out so that peers that lost each other at
    the same moment do not all redial in lockstep. Success resets ``n`` (the caller keeps the count).
    """

    initial: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.cap and math.isfinite(self.cap)):
            raise MalformedError(f"backoff needs 0 < initial <= cap < inf, got {self.initial}, {self.cap}")
        if not (1.0 <= self.factor < math.inf):
            raise MalformedError(f"backoff factor must be >= 1, got {self.factor}")
        if not 0.0 <= self.jitter <= 1.0:
            raise MalformedError(f"backoff jitter must be in [0, 1], got {self.jitter}")

    def ceiling(self, failures: int) -> float:
        """The delay after ``failures`` consecutive failures before jitter; 0 for none."""
        if failures <= 0:
            return 0.0
        if self.factor == 1.0 or failures == 1:
            return self.initial
        # Compare exponents instead of computing factor**n, which overflows for long outages.
        if failures - 1 >= math.log(self.cap / self.initial, self.factor):
            return self.cap
        return min(self.cap, self.initial * self.factor ** (failures - 1))

    def delay(self, failures: int, rng: Callable[[], float]) -> float:
        """The jittered delay; ``rng()`` must return a float in ``[0, 1)`` like :func:`random.random`."""
        u = rng()
        if not 0.0 <= u < 1.0:
            raise MalformedError(f"random source returned {u!r}, expected [0, 1)")
        return self.ceiling(failures) * (1.0 - self.jitter * u)


class PeerState(enum.Enum):
    """Where an address is: ``idle`` waits for its next attempt; ``self`` turned out to be our own."""

    IDLE = "idle"
    DIALING = "dialing"
    CONNECTED = "connected"
    SELF = "self"


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerStatus:
    """One row of ``latticectl peers``; plain values only, so ``dataclasses.asdict`` is JSON-ready."""

    #: Lower-case hex identity, None until the peer is authenticated or announced.
    public_key: str | None
    host: str
    port: int
    #: How it was found, sorted: any of static, added, mdns, remembered, incoming.
    sources: tuple[str, ...]
    state: str
    connected: bool
    failures: int
    last_seen: float | None
    #: When it will be dialled again (idle entries only).
    next_attempt: float | None


@dataclass(slots=True)
class _Entry:
    address: HostPort
    sources: set[Source]
    public_key: bytes | None = None
    state: PeerState = PeerState.IDLE
    failures: int = 0
    failures_before_connect: int = 0
    next_attempt: float = 0.0
    connected_since: float | None = None
    last_seen: float | None = None
    #: Random, drawn once: the order among passive peers due at the same time.
    rank: float = 0.0
    #: A caller needs a link to this peer now (:meth:`PeerBook.hurry`): dialled whatever the view holds.
    hurried: bool = False

    @property
    def dialable(self) -> bool:
        return bool(self.sources - {"incoming"})

    @property
    def operator(self) -> bool:
        """Configured by the operator (static or added): always dialled, whatever the view holds."""
        return bool(self.sources & {"static", "added"})

    @property
    def kept(self) -> bool:
        """Dialled whatever the active view holds: the operator's, or one a caller is waiting for."""
        return self.hurried or self.operator


def _check_address(address: HostPort) -> HostPort:
    if not (isinstance(address, tuple) and len(address) == 2):
        raise MalformedError(f"peer address must be (host, port), got {address!r}")
    host, port = address
    if not isinstance(host, str) or not host or host.startswith("["):
        raise MalformedError(f"peer host must be a non-empty, unbracketed string, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise MalformedError(f"peer port must be in 1..65535, got {port!r}")
    return host, port


def _check_public_key(public_key: bytes) -> bytes:
    if not isinstance(public_key, bytes) or len(public_key) != _KEY_SIZE:
        raise MalformedError(f"public key must be {_KEY_SIZE} bytes")
    return public_key


class PeerBook:
    """Known peer addresses, their connection state and retry schedule (sans-IO, not thread-safe).

    At most one dial per identity is in flight, and an identity that is connected through any address is
    not dialled through its others: multi-homed peers announce several addresses.
    """

    def __init__(
        self,
        *,
        backoff: Backoff | None = None,
        rng: Callable[[], float] | None = None,
        own_public_key: bytes | None = None,
        stable_after: float = DEFAULT_STABLE_AFTER,
        forget_failures: int = DEFAULT_FORGET_FAILURES,
        forget_after: float = DEFAULT_FORGET_AFTER,
        max_remembered: int = DEFAULT_MAX_REMEMBERED,
        active_view: int = DEFAULT_ACTIVE_VIEW,
        max_links: int | None = None,
    ) -> None:
        if active_view < 1:
            raise MalformedError(f"the active view holds at least one peer, got {active_view}")
        #: Links kept to peers found by discovery (see the module docstring)...
        self.active_view = active_view
        #: ... links at most (dials in flight included) before a peer found by mDNS that dials us costs
        #: another link ...
        self.discovered_links = active_view + DEFAULT_VIEW_SLACK
        #: ... and before any peer that dials us is (one the operator configured never is).
        self.max_links = max(self.discovered_links, max_links if max_links is not None else 2 * active_view)
        self.backoff = backoff if backoff is not None else Backoff()
        self._rng = rng if rng is not None else random.SystemRandom().random
        self._own = _check_public_key(own_public_key) if own_public_key is not None else None
        self._stable_after = stable_after
        self._forget_failures = forget_failures
        self._forget_after = forget_after
        self._max_remembered = max_remembered
        self._entries: dict[HostPort, _Entry] = {}
        #: Identities never dialled (``latticectl peers block``); their entries stay, shown as blocked.
        self.blocked: frozenset[bytes] = frozenset()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, address: object) -> bool:
        return address in self._entries

    # --- learning addresses -----------------------------------------------------------------------

    def add(self, address: HostPort, source: Source, *, now: float, public_key: bytes | None = None) -> bool:
        """Record that ``address`` is a peer (found via ``source``); True if the address is new.

        A fresh mDNS sighting of an address that is backing off makes it due now (the peer probably came
        back), without resetting its failure count.
        """
        address = _check_address(address)
        if source not in _SOURCES:
            raise MalformedError(f"unknown peer source {source!r}")
        if public_key is not None:
            _check_public_key(public_key)
        entry = self._entries.get(address)
        if entry is None:
            self._entries[address] = _Entry(
                address=address, sources={source}, public_key=public_key, next_attempt=now, rank=self._rng()
            )
            return True
        entry.sources.add(source)
        if public_key is not None and entry.state is not PeerState.CONNECTED:
            entry.public_key = public_key
        if source == "mdns" and entry.state is PeerState.IDLE:
            entry.next_attempt = min(entry.next_attempt, now)
        return False

    def add_static(self, addresses: Iterable[HostPort], *, now: float) -> None:
        """Add the configured ``--peer`` addresses."""
        for address in addresses:
            self.add(address, "static", now=now)

    def remember(self, address: HostPort, public_key: bytes, *, now: float) -> None:
        """Add a peer vouched for out of band (an invite) as if we had just seen it: it is persisted at once
        and, like a peer we were connected to, retried for ``forget_after`` before it may be forgotten."""
        self.add(address, "remembered", now=now, public_key=public_key)
        entry = self._entries[address]
        entry.last_seen = now if entry.last_seen is None else max(entry.last_seen, now)
        if entry.state is PeerState.IDLE:
            entry.next_attempt = min(entry.next_attempt, now)

    def forget(self, address: HostPort) -> None:
        """Drop an address (an operator's decision); unknown addresses are ignored."""
        self._entries.pop(address, None)

    def addresses_of(self, public_key: bytes) -> list[HostPort]:
        """Every address known to belong to ``public_key``, sorted."""
        return sorted(a for a, e in self._entries.items() if e.public_key == public_key)

    def hurry(self, public_key: bytes, now: float) -> bool:
        """Make the idle addresses of ``public_key`` due now (a caller needs a link to it: lease forwarding
        to a group's owner), keeping their failure counts; False if no dialable address of it is known."""
        if public_key in self.blocked:
            return False
        found = False
        for entry in self._entries.values():
            if entry.public_key == public_key and entry.dialable:
                found = True
                entry.hurried = True
                if entry.state is PeerState.IDLE:
                    entry.next_attempt = min(entry.next_attempt, now)
        return found

    # --- dialing ------------------------------------------------------------------------------------

    def _busy_identities(self) -> set[bytes]:
        return {
            e.public_key
            for e in self._entries.values()
            if e.public_key is not None and e.state in (PeerState.DIALING, PeerState.CONNECTED)
        }

    def _active(self) -> int:
        """Identities connected or being dialled (an address dialled before its identity is known
        counts once)."""
        unknown = sum(
            1 for e in self._entries.values() if e.state is PeerState.DIALING and e.public_key is None
        )
        return len(self._busy_identities()) + unknown

    def _operator_identities(self) -> set[bytes]:
        return {e.public_key for e in self._entries.values() if e.operator and e.public_key is not None}

    def over_view(self, public_key: bytes) -> bool:
        """Whether the link just made with ``public_key`` (it dialled us; already :meth:`connected`) is one
        too many. Links and dials in flight both count, or a burst of accepts while our own dials are out
        overshoots: more than :attr:`discovered_links` if we know the peer from mDNS, more than
        :attr:`max_links` otherwise; never for a peer the operator configured. The caller then asks
        :meth:`make_room`, or closes it: the peer backs off and dials another of the peers it knows."""
        if public_key in self._operator_identities():
            return False
        active = self._active()
        if active > self.max_links:
            return True
        discovered = any(e.public_key == public_key and "mdns" in e.sources for e in self._entries.values())
        return discovered and active > self.discovered_links

    def over_view_links(self, spare: bytes | None = None) -> list[bytes]:
        """Identities whose links to drop now, chosen at random: as many as our links and dials exceed
        :attr:`discovered_links`, among the linked peers we know from mDNS that the operator did not
        configure (and no caller hurried), whichever side dialled. A daemon browses before its own
        announcement is out, so it dials peers that do not know it yet and :meth:`over_view` lets it in
        under :attr:`max_links`; once its announcement arrives (the caller asks after each sighting) one
        of our links makes room, at random as HyParView does on a join: dropping the newest would shut a
        daemon joining a LAN whose views are full out of all of them. ``spare``: never that one (a peer
        let in at the cost of another, see :meth:`make_room`)."""
        excess = self._active() - self.discovered_links
        if excess <= 0:
            return []
        entries = self._entries.values()
        keep = self._operator_identities() | {e.public_key for e in entries if e.hurried} | {spare}
        found = {e.public_key for e in entries if "mdns" in e.sources}
        linked = {
            e.public_key
            for e in entries
            if e.state is PeerState.CONNECTED and e.public_key is not None and e.public_key in found
        }
        candidates = sorted(k for k in linked - keep if k is not None)
        out: list[bytes] = []
        while candidates and len(out) < excess:
            out.append(candidates.pop(int(self._rng() * len(candidates))))
        return out

    def make_room(self, public_key: bytes) -> list[bytes] | None:
        """For a peer :meth:`over_view` turns away that we know from mDNS: the links to drop so it can stay
        (random ones, HyParView's answer to a join into a full view), or None if it cannot (over
        :attr:`max_links`, or none of our links may go). Turning it away instead would leave a daemon
        that joins a LAN where every view is full with no link at all."""
        if self._active() > self.max_links:
            return None
        drop = self.over_view_links(spare=public_key)
        return drop if drop else None

    def _eligible(self, now: float) -> list[_Entry]:
        horizon = now + self.backoff.cap
        for entry in self._entries.values():
            # A schedule further ahead than the cap can only come from a clock that went backwards.
            entry.next_attempt = min(entry.next_attempt, horizon)
        busy = self._busy_identities()
        return sorted(
            (
                e
                for e in self._entries.values()
                if e.state is PeerState.IDLE
                and e.dialable
                and (e.public_key is None or (e.public_key not in busy and e.public_key not in self.blocked))
            ),
            key=lambda e: (not e.kept, e.next_attempt, e.rank, e.address),
        )

    def due(self, now: float, *, limit: int | None = None) -> list[HostPort]:
        """Addresses to dial now: the operator's first, then passive peers while the active view has
        room (earliest due first, ties at random); they become ``dialing`` until reported back."""
        out: list[HostPort] = []
        claimed: set[bytes] = set()
        room = self.active_view - self._active()
        for entry in self._eligible(now):
            if limit is not None and len(out) >= limit:
                break
            if entry.next_attempt > now:
                if entry.kept:
                    continue  # passive peers due now come after the operator's
                break
            if not entry.kept and room <= 0:
                break
            if entry.public_key is not None:
                if entry.public_key in claimed:
                    continue
                claimed.add(entry.public_key)
            room -= 1
            entry.state = PeerState.DIALING
            out.append(entry.address)
        return out

    def next_due(self, now: float) -> float | None:
        """When :meth:`due` will next return something, if nothing else changes (a link that ends is a
        change: it may make room for a passive peer); None if never."""
        eligible = self._eligible(now)
        if self._active() < self.active_view:
            return min((e.next_attempt for e in eligible), default=None)
        return min((e.next_attempt for e in eligible if e.kept), default=None)

    # --- outcomes -------------------------------------------------------------------------------------

    def _entry(self, address: HostPort) -> _Entry:
        entry = self._entries.get(address)
        if entry is None:
            raise NotFoundError(f"peer address {address!r} is not in the peer book")
        return entry

    def connected(self, address: HostPort, public_key: bytes, now: float, *, incoming: bool = False) -> None:
        """A handshake with ``public_key`` completed at ``address``; resets the failure count.

        ``incoming`` connections may come from an address the book does not know (an ephemeral port): it is
        recorded for the snapshot and never dialled. If the identity is our own, the address is marked
        ``self`` and never dialled again.
        """
        address = _check_address(address)
        _check_public_key(public_key)
        entry = self._entries.get(address)
        if entry is None:
            if not incoming:
                raise NotFoundError(f"peer address {address!r} is not in the peer book")
            entry = _Entry(address=address, sources={"incoming"})
            self._entries[address] = entry
        if public_key == self._own:
            if entry.dialable:
                entry.state = PeerState.SELF
                entry.public_key = public_key
            else:
                del self._entries[address]
            return
        entry.public_key = public_key
        entry.hurried = False
        entry.state = PeerState.CONNECTED
        entry.failures_before_connect = entry.failures
        entry.failures = 0
        entry.connected_since = now
        entry.last_seen = now

    def failed(self, address: HostPort, now: float) -> None:
        """A dial failed (refused, timed out, handshake failed); back off, or forget a hopeless address.

        A non-static address that failed ``forget_failures`` times in a row is forgotten if it never
        connected or last connected more than ``forget_after`` ago: mDNS caches and old remembered entries
        must not be dialled forever.
        """
        entry = self._entry(address)
        entry.state = PeerState.IDLE
        entry.hurried = False
        entry.failures += 1
        entry.next_attempt = now + self.backoff.delay(entry.failures, self._rng)
        if not entry.dialable or (
            not (entry.sources & {"static", "added"})
            and entry.failures >= self._forget_failures
            and (entry.last_seen is None or now - entry.last_seen > self._forget_after)
        ):
            del self._entries[entry.address]

    def disconnected(self, address: HostPort, now: float) -> None:
        """An established connection ended (closed, or the gossip layer's pings timed out).

        The peer is redialled after one backoff step; a connection shorter than ``stable_after`` continues
        the previous backoff instead of resetting it, so a peer that accepts and drops is not hammered. A
        dial that ends before connecting counts as :meth:`failed`.
        """
        entry = self._entry(address)
        if entry.state is PeerState.DIALING:
            self.failed(address, now)
            return
        if entry.state is not PeerState.CONNECTED:
            return
        entry.last_seen = now
        if not entry.dialable:
            del self._entries[entry.address]
            return
        since = entry.connected_since if entry.connected_since is not None else now
        entry.failures = 1 if now - since >= self._stable_after else entry.failures_before_connect + 1
        entry.state = PeerState.IDLE
        entry.connected_since = None
        entry.next_attempt = now + self.backoff.delay(entry.failures, self._rng)

    # --- views and persistence ------------------------------------------------------------------------

    def connected_identities(self) -> set[bytes]:
        """Public keys with a connection up."""
        return {
            e.public_key
            for e in self._entries.values()
            if e.state is PeerState.CONNECTED and e.public_key is not None
        }

    def status(self, address: HostPort) -> PeerStatus:
        """The snapshot row of one address."""
        return self._status(self._entry(address))

    @staticmethod
    def _status(entry: _Entry) -> PeerStatus:
        return PeerStatus(
            public_key=entry.public_key.hex() if entry.public_key is not None else None,
            host=entry.address[0],
            port=entry.address[1],
            sources=tuple(sorted(entry.sources)),
            state=entry.state.value,
            connected=entry.state is PeerState.CONNECTED,
            failures=entry.failures,
            last_seen=entry.last_seen,
            next_attempt=entry.next_attempt if entry.state is PeerState.IDLE and entry.dialable else None,
        )

    def snapshot(self) -> list[PeerStatus]:
        """Every known address, sorted by address, for ``latticectl peers``."""
        return [self._status(self._entries[a]) for a in sorted(self._entries)]

    def by_identity(self) -> list[PeerStatus]:
        """:meth:`snapshot` with each peer once where it matters: the ephemeral address a peer dialled us
        from is folded into that identity's dialable address(es) (their sources gain ``incoming``, and a
        link up through it is the identity's link, shown there), so a peer is not listed at both."""
        rows = self.snapshot()
        dialable = {r.public_key for r in rows if r.public_key is not None and set(r.sources) - {"incoming"}}
        folded = {r.public_key for r in rows if r.public_key in dialable and set(r.sources) == {"incoming"}}
        out = []
        for r in rows:
            key = r.public_key
            if key is None or key not in folded:
                out.append(r)
            elif set(r.sources) != {"incoming"}:
                out.append(dataclasses.replace(r, sources=tuple(sorted({*r.sources, "incoming"}))))
        return out

    def to_json(self) -> str:
        """Peers worth dialling after a restart: authenticated ones we were connected to, most recent first.

        Failure counts and schedules are not kept: a restarted daemon tries everyone once right away.
        """
        rows = sorted(
            (
                e
                for e in self._entries.values()
                if e.dialable
                and e.public_key is not None
                and e.last_seen is not None
                and e.state is not PeerState.SELF
            ),
            key=lambda e: (-(e.last_seen or 0.0), e.address),
        )[: self._max_remembered]
        peers = [
            {
                "host": e.address[0],
                "port": e.address[1],
                "public_key": e.public_key.hex(),
                "last_seen": e.last_seen,
            }
            for e in rows
            if e.public_key is not None
        ]
        return json.dumps({"version": _JSON_VERSION, "peers": peers}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        now: float,
        backoff: Backoff | None = None,
        rng: Callable[[], float] | None = None,
        own_public_key: bytes | None = None,
        stable_after: float = DEFAULT_STABLE_AFTER,
        forget_failures: int = DEFAULT_FORGET_FAILURES,
        forget_after: float = DEFAULT_FORGET_AFTER,
        max_remembered: int = DEFAULT_MAX_REMEMBERED,
    ) -> PeerBook:
        """A book holding the ``remembered`` peers of :meth:`to_json`, all due at ``now``.

        Peers last seen more than ``forget_after`` ago, and our own identity, are dropped. Anything that
        is not exactly what :meth:`to_json` writes raises :class:`MalformedError`.
        """
        book = cls(
            backoff=backoff,
            rng=rng,
            own_public_key=own_public_key,
            stable_after=stable_after,
            forget_failures=forget_failures,
            forget_after=forget_after,
            max_remembered=max_remembered,
        )
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as error:
            raise MalformedError(f"peer book is not JSON: {error}") from None
        if (
            not isinstance(doc, dict)
            or doc.get("version") != _JSON_VERSION
            or not isinstance(doc.get("peers"), list)
        ):
            raise MalformedError(f"peer book must be {{'version': {_JSON_VERSION}, 'peers': [...]}}")
        for i, row in enumerate(doc["peers"]):
            if not isinstance(row, dict) or set(row) != {"host", "port", "public_key", "last_seen"}:
                raise MalformedError(f"peer book entry {i}: expected host, port, public_key, last_seen")
            try:
                public_key = bytes.fromhex(row["public_key"])
            except (TypeError, ValueError):
                raise MalformedError(f"peer book entry {i}: public_key is not hex") from None
            last_seen = row["last_seen"]
            if (
                isinstance(last_seen, bool)
                or not isinstance(last_seen, int | float)
                or not math.isfinite(last_seen)
            ):
                raise MalformedError(f"peer book entry {i}: last_seen must be a number")
            try:
                address = _check_address((row["host"], row["port"]))
                _check_public_key(public_key)
            except MalformedError as error:
                raise MalformedError(f"peer book entry {i}: {error}") from None
            if public_key == book._own or now - last_seen > forget_after or len(book) >= max_remembered:
                continue
            book.add(address, "remembered", now=now, public_key=public_key)
            book._entries[address].last_seen = float(last_seen)
        return book
