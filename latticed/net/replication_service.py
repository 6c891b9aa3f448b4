"""Replication as a daemon service: the TCP listener, the dialer, mDNS discovery and the gossip links,
wired to the engine.

Discovery only yields addresses (mDNS sightings, static and remembered peers go into the
:class:`PeerBook`); the dialer turns due addresses into authenticated streams; every stream, dialled or
accepted, becomes a :class:`Gossip` link. The engine is the :class:`ReplicaHost`: summaries come from its
in-memory heads, deltas are read on reader threads, and merges are verified off the event loop before the
storage thread joins and stores them.

Why one module: the service's parts (listener, dialer, the discovery feed and the set of live links) share
the peer book and that set, and the daemon starts, restarts (on ``join``) and stops them as one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import trio

from latticed.crdt.head import QueueKind, SignedHead
from latticed.crdt.queue import QueueDelta, QueueState, Summary, VerifiedDelta
from latticed.crdt.queue2 import QueueState2
from latticed.crdt.signing import Identity, parse_public_key
from latticed.errors import ConnectionClosedError, LatticedError, NotFoundError
from latticed.host.config import DaemonConfig
from latticed.host.listen_probe import listen_error
from latticed.host.netkey import DEFAULT_NETWORK_KEY, load_network_key, network_key_fingerprint
from latticed.net.accept import serve_listeners
from latticed.net.admission import Admission, FailureLog, Ticket, source_of
from latticed.net.core2_engine_host import EngineCore2Host
from latticed.net.discovery import DiscoveredPeer, OtherNetworks, run_discovery
from latticed.net.gossip import (
    PEER_TIMEOUT_S,
    STALE_AFTER_S,
    Gossip,
    LinkExtension,
    PeerLink,
    PendingMerge,
)
from latticed.net.peer_faults import PeerFaults
from latticed.net.ports import ReplicaStore
from latticed.net.transport import connect_failure, secure_accept, secure_connect
from latticed.net.why_facts import peer_facts
from latticed.process.logs import get_logger, log_event
from latticed.protocol.addresses import HostPort
from latticed.protocol.core2_wire import link_summary
from latticed.protocol.handshake import ReplayCache
from latticed.protocol.peerbook import Backoff, PeerBook, Source
from latticed.protocol.peerstate import format_host_port, peer_status
from latticed.protocol.replication import QueueKey, ReplicationSession, key_label
from latticed.protocol.start_gate import GATE_GRACE_S, StartGate
from latticed.protocol.why_verdict import PeerFacts
from latticed.storage.jobs import Merge
from latticed.storage.wiring import ChangeFanout, OwnerFence

if TYPE_CHECKING:
    from latticed.net.reports import PeerMetrics

log = get_logger(__name__)

PEERS_FILE = "peers.json"
DIAL_TIMEOUT_S = 10.0
MAX_DIALS_AT_ONCE = 8
#: While links exceed the active view, the dialer checks again this often (a drop is then certain to land).
VIEW_RECHECK_S = 1.0
#: On a LAN a peer is usually back within seconds: retry at least this often.
MAX_BACKOFF_S = 30.0
#: Let the kernel give up on a stalled TCP link about when the gossip layer would (ms).
TCP_USER_TIMEOUT_MS = int(PEER_TIMEOUT_S * 1000)


def _tune_socket(stream: trio.abc.Stream) -> None:
    """Bound how long a stalled link lingers in retransmit backoff after a partition."""
    if isinstance(stream, trio.SocketStream) and hasattr(socket, "TCP_USER_TIMEOUT"):
        with contextlib.suppress(OSError):
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)


def queue_key(state: QueueState) -> QueueKey:
    return (state.owner, state.name, state.kind)


class EngineHost:
    """The engine seen as a replica host (which queues we take is the session's subscription)."""

    def __init__(self, engine: ReplicaStore) -> None:
        self.engine = engine

    def summaries(self) -> Mapping[QueueKey, Summary]:
        out: dict[QueueKey, Summary] = {}
        for kind in QueueKind:
            for q in self.engine.queues(kind):
                state = self.engine.state(q)
                if state.head is not None:
                    out[queue_key(state)] = state.summary()
        return out

    def relayed_delta(self, key: QueueKey, since: Summary | None) -> QueueDelta | None:
        """A verified push on its way to our store that extends what ``since`` holds, relayed as it came
        (None: :meth:`delta_for` decides). Gossip asks this first: no commit of ours is behind it."""
        if since is None:
            return None
        owner, name, kind = key
        ahead = self.engine.ahead_for(owner, name, kind, since)
        return None if ahead is None else ahead.delta_from(since)

    async def delta_for(
        self, key: QueueKey, since: Summary | None, max_records: int, max_bytes: int
    ) -> QueueDelta | None:
        owner, name, kind = key
        ahead = self.engine.ahead_for(owner, name, kind, since)
        if ahead is not None and since is not None:
            # Relayed as it came, before our own commit; None: wait for the commit (it pushes again).
            return ahead.delta_from(since)
        # A truncation of ours between the value's load and the read raises GapError: the caller's to
        # handle (gossip reads again, from the newer value, or leaves it to that commit's change).
        try:
            return await self.engine.delta_for(owner, name, since, max_records, kind, max_bytes=max_bytes)
        except NotFoundError:
            return None

    async def verify_delta(self, delta: QueueDelta) -> VerifiedDelta:
        return await self.engine.verify_delta(delta)

    def verify_now(self, delta: QueueDelta) -> VerifiedDelta | None:
        """A small delta verified right here (IntegrityError if forged); None: :meth:`verify_delta`."""
        return self.engine.verify_now(delta)

    def submit_merge(self, verified: VerifiedDelta, peer: bytes) -> PendingMerge:
        return _EngineMerge(self.engine, self.engine.submit_merge(verified, origin=peer))


class _EngineMerge:
    """A merge job on the storage thread, awaited once its transaction committed."""

    __slots__ = ("engine", "job")

    def __init__(self, engine: ReplicaStore, job: Merge) -> None:
        self.engine = engine
        self.job = job

    @property
    def ahead(self) -> Summary | None:
        return self.job.ahead

    async def result(self) -> tuple[Summary, bool]:
        job = await self.engine.merged(self.job)
        assert job.summary is not None
        return job.summary, job.changed

    def when_settled(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` on the event loop once the job committed or failed (see Gossip's ACKs)."""
        job = self.job
        if job.notify is not None:
            return False
        job.notify = callback
        return True

    def settled(self) -> tuple[Summary, bool] | None:
        job = self.job
        if job.done is None or not job.done.is_set() or job.error is not None or job.summary is None:
            return None
        return job.summary, job.changed


@dataclass
class Replication:
    """The running replication service, for status, ``latticectl peers`` and tests."""

    engine: ReplicaStore
    identity: Identity
    config: DaemonConfig
    network_key: bytes
    gossip: Gossip
    book: PeerBook
    #: Why peers fail, whom we refused, clock skew, and the operator's added and blocked peers.
    faults: PeerFaults
    listen_address: HostPort | None = None
    wake_dialer: trio.Event = field(default_factory=trio.Event)
    allowed: frozenset[bytes] | None = None
    #: Handshake openings answered recently: a recorded one replayed to us gets no answer.
    replay_cache: ReplayCache = field(default_factory=ReplayCache)
    #: Caps on incoming connections before and after their handshake (latticed/net/admission.py).
    admission: Admission = field(default_factory=Admission)
    #: ``peer.handshake_failed`` and ``peer.connection_refused``: one line per source per interval.
    failure_log: FailureLog = field(default_factory=FailureLog)
    metrics: PeerMetrics | None = None
    #: Identities removed with ``latticectl peers remove`` in this run: their mDNS sightings are ignored.
    removed: set[bytes] = field(default_factory=set)
    #: mDNS instances on the LAN announcing under another network key (None: discovery is off).
    others_on_lan: OtherNetworks | None = None
    #: No signing after a start until the peers known then were heard from (latticed/protocol/start_gate.py).
    start_gate: StartGate = field(default_factory=lambda: StartGate(trio.current_time(), None))
    #: Set once the start gate opens: writes it refused wait for it (:meth:`wait_start_gate`).
    gate_opened: trio.Event = field(default_factory=trio.Event)
    #: Writes waiting for the start gate now (``identity_runs``' ``writes_waiting``).
    writes_waiting: int = 0
    #: The gossip of each link, by identity: cancelled when the active view drops that link.
    #: Several while both sides dial at once (gossip keeps one link and closes the other): all of them.
    link_scopes: dict[bytes, list[trio.CancelScope]] = field(default_factory=dict)

    def write_refusal(self) -> str | None:
        """Why this daemon must not sign anything now (None: the per-queue checks decide): another run of
        its identity, or the catch-up after a start. Asked before every write: cheap once the gate is open."""
        refusal = self.gossip.identity.refusal()
        if refusal is not None or self.start_gate.opened_at is not None:
            return refusal
        return self.update_gate()

    def update_gate(self) -> str | None:
        """Look at the start gate again (a dial ended, a peer's first digest came, the time is up); logs
        once when it opens."""
        gate = self.start_gate
        if gate.opened_at is not None:
            return None
        reason = gate.reason(trio.current_time(), self.gossip.unheard_links())
        if reason is None:
            self.gate_opened.set()
        if reason is None and (gate.expected or gate.timed_out):
            log_event(
                log,
                "replication.caught_up",
                level=logging.WARNING if gate.timed_out else logging.INFO,
                waited_s=round(gate.opened_at - gate.started, 3) if gate.opened_at is not None else None,
                timed_out=gate.timed_out,
                unreached=gate.waits_for,
            )
        return reason

    async def wait_start_gate(self) -> bool:
        """Wait (at most until its deadline) for the start gate to open: True if it was closed and is open
        now, so a write it refused may go ahead; False if it was open already (the refusal had another
        cause, which waiting would not lift). A write right after ``latticed run`` thus takes a moment
        instead of failing."""
        if self.update_gate() is None:
            return False
        self.writes_waiting += 1
        try:
            with trio.move_on_at(self.start_gate.deadline + GATE_GRACE_S):
                await self.gate_opened.wait()
        finally:
            self.writes_waiting -= 1
        return self.start_gate.opened_at is not None

    def identity_status(self) -> dict[str, Any]:
        """Another run of our identity (told of, or seen in a head), identities seen running twice on our
        links, and whether writes wait for the catch-up after the start (why, and how many wait now)."""
        return {
            **self.gossip.identity.status(),
            "incarnation": self.gossip.incarnation.hex(),
            "seen_twice": [s.to_wire() for s in self.gossip.duplicates.recent()],
            "catching_up": self.write_refusal() if self.gossip.identity.refusal() is None else None,
            "writes_waiting": self.writes_waiting,
        }

    def claim_identity(self) -> dict[str, Any]:
        """The operator says this daemon is the one to keep: it signs again (for the rest of its run)."""
        was = self.gossip.identity.claim(time.time())
        log_event(log, "identity.claimed", level=logging.WARNING, was_refusing=was)
        return {"was_refusing": was, **self.identity_status()}

    @property
    def listen(self) -> str | None:
        return _fmt(self.listen_address)

    def other_networks(self) -> int | None:
        """How many daemons of other networks mDNS hears on this LAN now (None: mDNS is off)."""
        return self.others_on_lan.count if self.others_on_lan is not None else None

    def counters(self) -> dict[str, int]:
        """Since start, and gauges of now: ``connected`` links, and the eager trees' (``queues_cut_off``:
        queues no link pushes to us, :meth:`cut_off_queues`; ``queue_links_pruned_in`` / ``_lazy_out``:
        (link, queue) pairs we pruned / the peer pruned)."""
        trees, cut = self.gossip.trees()
        return {
            **self.gossip.stats(),
            "queues_cut_off": len(cut),
            "queue_links_pruned_in": sum(t.pruned_in for t in trees.values()),
            "queue_links_lazy_out": sum(t.lazy_out for t in trees.values()),
            "connected": len(self.gossip.links),
            "second_runs_connected": len(self.gossip.twins),
            "identity_refusing_writes": int(self.gossip.identity.refusal() is not None),
        }

    def cut_off_queues(self, limit: int = 20) -> list[str]:
        """Queues of other owners that every link carrying them pruned (each record then waits for a
        HAVE and a graft timer: the replica is off the eager tree), the first ``limit``."""
        return [key_label(key) for key in self.gossip.trees()[1][:limit]]

    def peers(self) -> list[dict[str, Any]]:
        """Every known peer: identity, address, how found, its state (connected, dialling, refused,
        blocked, self) with the reason, and lag per queue (only a connected peer can be in sync); then
        blocked identities not in the book and hosts whose handshakes we refused lately."""
        lags = self.gossip.peer_lag()
        now = time.time()
        blocked = self.faults.rules.blocked
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for status in self.book.by_identity():
            row = dataclasses.asdict(status)
            key = status.public_key
            key_bytes = bytes.fromhex(key) if key else None
            row["address"] = f"{status.host}:{status.port}"
            link = self.gossip.links.get(key_bytes) if key_bytes is not None else None
            row["connected"] = link is not None
            failure = self.faults.failures.get((status.host, status.port))
            state, reason = peer_status(
                book_state=status.state, public_key=key_bytes, blocked=blocked, failure=failure
            )
            if link is not None and state != "blocked":
                # One identity, several addresses (multi-homed, or it dialled us): one of them is the link.
                reason = None if status.state == "connected" else f"through {link.address}"
                state, failure = "connected", None
            elif state == "connected":
                state, reason = "dialling", "connected a moment ago; the link is closing"
            kind: str | None = failure.kind if failure is not None else None
            twin = self.gossip.twins.get(key_bytes) if key_bytes is not None else None
            lag = lags.get(key or "", {})
            if link is not None and twin is not None:
                # The identity runs twice: this address is one run's link, the other is named.
                second = row["address"] == twin.address
                reason = _twice(link.address if second else twin.address)
                if second:
                    row["duplicate_identity"], lag = True, _lags(self.gossip, twin)
            if link is None and key_bytes in self.gossip.incompatible and state != "blocked":
                state, reason, kind = "incompatible", self.gossip.incompatible[key_bytes][0], "incompatible"
            rows.append(self._row(row, state, reason, lag, now, kind))
            if key:
                seen.add(key)
        for public_key, link in self.gossip.links.items():
            if public_key.hex() not in seen:
                seen.add(public_key.hex())
                row = {
                    "public_key": public_key.hex(),
                    "address": link.address,
                    "sources": [link.via],
                    "state": "connected",
                    "connected": True,
                }
                rows.append(self._row(row, "connected", None, lags.get(public_key.hex(), {}), now))
        shown = {row.get("address") for row in rows}
        for public_key, twin in self.gossip.twins.items():
            # The second run of an identity: a row of its own, so both runs show.
            primary = self.gossip.links.get(public_key)
            if twin.address in shown:
                continue
            row = {
                "public_key": public_key.hex(),
                "address": twin.address,
                "sources": [twin.via],
                "state": "connected",
                "connected": True,
                "duplicate_identity": True,
            }
            reason = _twice(primary.address if primary is not None else "?")
            rows.append(self._row(row, "connected", reason, _lags(self.gossip, twin), now))
        for key_bytes, (why, address) in self.gossip.incompatible.items():
            if key_bytes.hex() not in seen and key_bytes not in self.gossip.links:
                seen.add(key_bytes.hex())
                row = {"public_key": key_bytes.hex(), "address": address, "sources": ["incoming"]}
                rows.append(self._row(row, "incompatible", why, {}, now, "incompatible"))
        for key_bytes in sorted(blocked):
            if key_bytes.hex() not in seen:
                seen.add(key_bytes.hex())
                row = {"public_key": key_bytes.hex(), "address": None, "sources": [], "state": "blocked"}
                rows.append(self._row(row, "blocked", "on our block list", {}, now))
        for refusal in self.faults.incoming.recent(now):
            if refusal.public_key is not None and refusal.public_key.hex() in seen:
                continue
            row = {
                "public_key": refusal.public_key.hex() if refusal.public_key else None,
                "address": refusal.host,
                "sources": ["incoming"],
                "state": "refused",
                "refused_count": refusal.count,
                "last_refused": refusal.at,
            }
            rows.append(self._row(row, "refused", refusal.reason, {}, now, "incoming"))
        return rows

    def _row(  # noqa: PLR0917 - one row's facts, private
        self,
        row: dict[str, Any],
        state: str,
        reason: str | None,
        lag: dict[str, int],
        now: float,
        failure: str | None = None,
    ) -> dict[str, Any]:
        """``status``/``reason``: what ``latticectl peers`` shows; ``failure``: the kind of the last
        failure (latticed/protocol/peerstate.py's FailureKind, or "incoming" for a handshake we refused);
        ``next_try_s``: when a dialling or refused peer is tried again; ``in_sync``: connected and no
        records apart in any queue."""
        row.setdefault("connected", False)
        row.setdefault("failures", 0)
        next_attempt = row.get("next_attempt")
        connected = bool(row["connected"]) and state == "connected"
        key = row.get("public_key")
        reading = self.faults.skew.reading(key, now) if key else None
        row.update(
            lag=lag if connected else {},
            status=state,
            reason=reason,
            failure=failure,
            next_try_s=(
                round(max(0.0, next_attempt - now), 1)
                if isinstance(next_attempt, float) and state in ("dialling", "refused")
                else None
            ),
            in_sync=connected and all(v == 0 for v in lag.values()),
            blocked=state == "blocked",
            clock_offset_ms=reading.offset_ms if reading is not None else None,
        )
        link = self.gossip.links.get(bytes.fromhex(key)) if key and connected else None
        agreement = link.agreement if link is not None else None
        # The protocol version and optional features the link settled on, what the peer said it runs
        # (None: it did not say, as 0.2.0), and how many of our queues its version cannot express.
        row.update(
            protocol=agreement.protocol if agreement is not None else None,
            features=sorted(agreement.features) if agreement is not None else None,
            peer_release=agreement.peer.release if agreement is not None else None,
            withheld=link.session.withheld if link is not None else 0,
            **_delta_counts(link.session if link is not None else None),
        )
        # The link's place in the eager trees: queues it pushes to us, those we pruned (it announces
        # them), those it pruned (we announce them to it). None when not connected.
        tree = link.session.tree() if link is not None else None
        row.update(
            queues_eager_in=tree.eager_in if tree is not None else None,
            queues_pruned_in=tree.pruned_in if tree is not None else None,
            queues_lazy_out=tree.lazy_out if tree is not None else None,
        )
        return row

    def incompatible_peers(self) -> list[dict[str, Any]]:
        """Peers whose last link ended for want of a common protocol version, with both sides' versions."""
        return [
            {"peer": key.hex(), "address": address, "reason": reason}
            for key, (reason, address) in self.gossip.incompatible.items()
        ]

    def clock_skew(self) -> list[dict[str, Any]]:
        """Peers whose clocks are off ours by more than the threshold (latticed/protocol/peerstate.py)."""
        return [
            {"peer": r.public_key, "address": r.address, "offset_ms": r.offset_ms, "measured_at": r.at}
            for r in self.faults.clock_skew()
        ]

    def lag(self) -> dict[str, int]:
        """Per queue we hold: how far behind the owner's signed end we are (records)."""
        out = {}
        for kind in QueueKind:
            for q in self.engine.queues(kind):
                state = self.engine.state(q)
                behind = state.known_end - state.held_end
                if behind > 0:
                    out[f"{state.owner.hex()}/{state.name}"] = behind
        return out

    def queue_peers(self, owner: bytes, name: str, kind: int) -> list[PeerFacts]:
        """What each peer holds of one queue, connected or not (``latticectl queue why``)."""
        return peer_facts(self.gossip, self.book, self.faults.rules.blocked, (owner, name, kind))

    def remember(self, address: HostPort, public_key: bytes) -> None:
        """Keep a peer vouched for out of band (an invite), save the book, and dial it now."""
        self.removed.discard(public_key)
        self.book.remember(address, public_key, now=time.time())
        self._save_book()
        self.wake_dialer.set()

    def dial_now(self, public_key: bytes) -> bool:
        """Dial ``public_key`` now if no link to it is up (lease forwarding needs its group's owner);
        False if the peer book knows no address of it to dial."""
        if public_key in self.gossip.links:
            return True
        if not self.book.hurry(public_key, time.time()):
            return False
        self.wake_dialer.set()
        return True

    def restart_core2_links(self, reason: str) -> int:
        """Close every link that agreed on ``heads-v2`` and dial its peer again at once; returns how many
        closed. A link remembers what its peer holds of ours and we of its, for this connection only: a new
        one starts with whole digests, so the peer sends again a core-2 queue we no longer hold (one
        ``queue repair`` dropped: the old link took it as held). No wire change, any peer release."""
        closed = 0
        for key, link in list(self.gossip.links.items()):
            core2 = link.session.core2
            if core2 is None or not core2.agreed:
                continue
            self._close_link(key)
            self.book.hurry(key, time.time())  # a peer that dialled us (no address known) dials again
            closed += 1
        if closed:
            log_event(log, "replication.links_restarted", links=closed, reason=reason)
            self.wake_dialer.set()
        return closed

    # ------------------------------------------------------------------ the operator's peer management
    def add_peer(self, address: HostPort) -> dict[str, Any]:
        """Dial ``address`` now and for ever (kept in the rules file across restarts)."""
        self.faults.update_rules(self.faults.rules.with_added(address))
        new = self.book.add(address, "added", now=time.time())
        self.wake_dialer.set()
        return {"address": format_host_port(address), "new": new}

    def remove_peer(self, target: bytes | HostPort) -> dict[str, Any]:
        """Forget an identity (all its addresses) or one address: not redialled, its link closed. Returns
        what went; ``static`` lists addresses from the config, which come back at the next start."""
        if isinstance(target, bytes):
            addresses = self.book.addresses_of(target)
            key: bytes | None = target
        else:
            addresses = [target] if target in self.book else []
            key = None
            if addresses:
                found = self.book.status(target).public_key
                key = bytes.fromhex(found) if found else None
        added = [a for a in self.faults.rules.added if a in addresses or a == target]
        link = self.gossip.links.get(key) if key is not None else None
        if not addresses and not added and link is None:
            raise NotFoundError(f"no peer {_label(target)} in the peer book")
        static = [a for a in addresses if "static" in self.book.status(a).sources]
        self.faults.update_rules(self.faults.rules.without_added(added))
        for address in addresses:
            self.book.forget(address)
        self.faults.forget(addresses)
        if key is not None:
            self.faults.incoming.forget(key)
        if key is not None and not self.book.addresses_of(key):
            # Its last address is gone: close the link, and ignore its mDNS sightings from now on.
            self.removed.add(key)
            self._close_link(key)
        self._save_book()
        log_event(
            log, "peer.removed", target=_label(target), addresses=[format_host_port(a) for a in addresses]
        )
        return {
            "removed": [format_host_port(a) for a in addresses],
            "public_key": key.hex() if key is not None else None,
            "static": [format_host_port(a) for a in static],
        }

    def set_blocked(self, public_key: bytes, blocked: bool) -> bool:
        """Block (refused at the handshake, never dialled, its link closed) or unblock an identity; the
        block list is saved before this returns. Returns whether anything changed."""
        rules = self.faults.rules
        new = rules.with_blocked(public_key) if blocked else rules.without_blocked(public_key)
        self.faults.update_rules(new)
        self.book.blocked = new.blocked
        if blocked:
            self._close_link(public_key)
        else:
            self.faults.unblocked(public_key)
            self.wake_dialer.set()
        changed = new != rules
        if changed:
            log_event(log, "peer.blocked" if blocked else "peer.unblocked", peer=public_key.hex())
        return changed

    def _close_link(self, public_key: bytes) -> None:
        link = self.gossip.links.pop(public_key, None)
        if link is not None:
            link.kick()  # its driver sees it is no longer the link and ends it

    def _save_book(self) -> None:
        path = self.config.data_dir / PEERS_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(self.book.to_json())
            tmp.replace(path)
        except OSError as exc:
            log_event(log, "peers.save_failed", level=logging.WARNING, error=str(exc))


def load_peer_book(data_dir: Path, own: bytes) -> PeerBook:
    """The peers saved by an earlier run (an unreadable file is logged and ignored: they come back)."""
    path = data_dir / PEERS_FILE
    with contextlib.suppress(FileNotFoundError):
        try:
            return PeerBook.from_json(
                path.read_text(), now=time.time(), own_public_key=own, backoff=Backoff(cap=MAX_BACKOFF_S)
            )
        except LatticedError as exc:
            log_event(log, "peers.unreadable", level=logging.WARNING, path=str(path), error=str(exc))
    return PeerBook(own_public_key=own, backoff=Backoff(cap=MAX_BACKOFF_S))


async def run_replication(
    engine: ReplicaStore,
    identity: Identity,
    config: DaemonConfig,
    *,
    changes: ChangeFanout,
    fence: OwnerFence,
    network_key: bytes | None = None,
    metrics: PeerMetrics | None = None,
    extension: LinkExtension | None = None,
    background: trio.Nursery | None = None,
    task_status: trio.TaskStatus[Replication] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen, dial, discover and gossip until cancelled; under ``network_key`` (default: the config's).
    ``metrics`` (off when None) hears of connections and failed handshakes; ``extension`` (lease
    forwarding) shares the links. mDNS runs in ``background`` if given (a longer-lived nursery): it is
    cancelled with the rest, but its goodbyes (~0.25 s) go out there while a successor starts (``join``).

    While it runs it pushes every commit it hears of from ``changes`` and holds the owner ``fence``."""
    if network_key is None:
        network_key = load_network_key(config)
    if network_key == DEFAULT_NETWORK_KEY:
        log_event(
            log,
            "replication.insecure_network_key",
            level=logging.WARNING,
            hint="using the documented default network key: anyone can join; use --network-key-file",
        )
    allowed = frozenset(parse_public_key(p) for p in config.allowed_peers) or None
    faults = PeerFaults.load(config.data_dir, allowed)
    patterns = config.replicate or None
    host = EngineHost(engine)
    host2 = EngineCore2Host(engine)
    await host2.load()  # every core-2 queue in the first digests
    gossip = Gossip(
        host,
        identity.public_key,
        subscription=patterns,
        max_message_bytes=config.max_frame_bytes,
        extension=extension,
        host2=host2,
    )
    book = load_peer_book(config.data_dir, identity.public_key)
    book.add_static(config.peers, now=time.time())
    for address in faults.rules.added:
        book.add(address, "added", now=time.time())
    book.blocked = faults.rules.blocked
    service = Replication(
        engine, identity, config, network_key, gossip, book, faults, allowed=allowed, metrics=metrics
    )

    def on_change(state: QueueState) -> None:
        if state.head is not None or state.forked:
            gossip.local_change(queue_key(state), state.summary())

    def on_change2(q: int, state: QueueState2 | None) -> None:
        if state is not None:  # a dropped queue is simply no longer offered
            gossip.local_change2((state.owner, state.name, state.kind), link_summary(state))

    def behind(state: QueueState) -> str | None:
        refusal = service.write_refusal()
        if refusal is not None:
            return refusal
        return gossip.behind_reason(queue_key(state), state.held_end)

    def own_head(key: QueueKey) -> SignedHead | None:
        q = engine.find(*key)
        return engine.state(q).head if q is not None else None

    gossip.own_head = own_head
    gossip.on_summaries = service.update_gate

    wiring = contextlib.ExitStack()
    mdns_scope = trio.CancelScope()
    try:
        wiring.enter_context(changes.subscribed(on_change))
        wiring.enter_context(_core2_changes(engine, on_change2))
        wiring.enter_context(fence.held_by(behind))
        async with trio.open_nursery() as nursery:
            if config.listen is not None:
                service.listen_address = await nursery.start(_listen, service)
            nursery.start_soon(_dial_loop, service)
            nursery.start_soon(_gate_deadline, service)
            if config.mdns and service.listen_address is not None:
                send, receive = trio.open_memory_channel[DiscoveredPeer](64)
                others = service.others_on_lan = OtherNetworks()
                port = service.listen_address[1]

                async def discover(task_status: trio.TaskStatus[None]) -> None:
                    with mdns_scope:
                        await run_discovery(
                            network_key=network_key,
                            identity_public_key=identity.public_key,
                            port=port,
                            interfaces=config.mdns_interfaces,
                            found=send,
                            task_status=task_status,
                            others=others,
                        )

                await (background or nursery).start(discover)
                nursery.start_soon(_discovered, service, receive)
            log_event(
                log,
                "replication.ready",
                listen=_fmt(service.listen_address),
                peers=len(service.book.snapshot()),  # configured, added and remembered: what it dials
                mdns=bool(config.mdns and service.listen_address),
                network=network_key_fingerprint(network_key),
            )
            task_status.started(service)
    finally:
        mdns_scope.cancel()
        wiring.close()
        service._save_book()


@contextlib.contextmanager
def _core2_changes(
    engine: ReplicaStore, listener: Callable[[int, QueueState2 | None], None]
) -> Iterator[None]:
    """``listener`` hears of every core-2 commit while the block runs (the engine has one such slot)."""
    view = engine.core2
    assert view.on_change is None, "core-2 changes already have a listener"
    view.on_change = listener
    try:
        yield
    finally:
        view.on_change = None


def _twice(other: str) -> str:
    return (
        f"this identity also runs at {other}: two daemons, one identity (a copied data directory?); both "
        "links are served and both daemons told"
    )


def _lags(gossip: Gossip, link: PeerLink) -> dict[str, int]:
    """Per queue, how many records the peer of ``link`` is behind us (negative: ahead)."""
    return gossip.link_lag(link)


def _is_stale(service: Replication, peer: bytes) -> bool:
    link = service.gossip.links.get(peer)
    return link is None or trio.current_time() - link.heard() > STALE_AFTER_S


def _delta_counts(session: ReplicationSession | None) -> dict[str, int | None]:
    """A link's deltas sent and those the peer acknowledged (merged, or refused: every delta is answered),
    on both cores, since the link came up (None: not connected): equal once every push was answered."""
    if session is None:
        return {"deltas_sent": None, "deltas_acked": None}
    sent, acked = session.stats["deltas_sent"], session.stats["deltas_acked"]
    if (core2 := session.core2) is not None:
        sent, acked = sent + core2.stats["deltas_sent"], acked + core2.stats["deltas_acked"]
    return {"deltas_sent": sent, "deltas_acked": acked}


def _fmt(address: HostPort | None) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


def _label(target: bytes | HostPort) -> str:
    return target.hex() if isinstance(target, bytes) else format_host_port(target)


async def _listen(service: Replication, *, task_status: trio.TaskStatus[HostPort]) -> None:
    assert service.config.listen is not None
    host, port = service.config.listen
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:  # taken since `latticed run` probed it, or an embedding caller's config
        raise listen_error((host, port), exc) from exc
    bound = listeners[0].socket.getsockname()
    address: HostPort = (host, int(bound[1]))

    async def handler(stream: trio.SocketStream) -> None:
        peer_address = "?"
        remote: HostPort | None = None
        with contextlib.suppress(OSError):
            name = stream.socket.getpeername()
            remote = (str(name[0]), int(name[1]))
            peer_address = f"{name[0]}:{name[1]}"
        remote_host = remote[0] if remote is not None else "?"
        source = source_of(remote_host)
        ticket = service.admission.admit(source)
        if isinstance(ticket, str):
            _log_failure(service, source, "peer.connection_refused", address=peer_address, reason=ticket)
            await trio.aclose_forcefully(stream)
            return
        try:
            await _serve_incoming(service, stream, ticket, remote, peer_address)
        finally:
            ticket.close()

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_listeners, handler, listeners, name="peer"))
        task_status.started(address)


def _log_failure(service: Replication, source: str, event: str, **fields: Any) -> None:
    """One line per source per interval, saying how many failures it stands for."""
    count = service.failure_log.note(source, trio.current_time())
    if count is not None:
        log_event(log, event, level=logging.INFO, failures=count, **fields)


async def _serve_incoming(
    service: Replication,
    stream: trio.SocketStream,
    ticket: Ticket,
    remote: HostPort | None,
    peer_address: str,
) -> None:
    """Handshake (cut if the admission needs its slot for a newer one), then gossip until either ends."""
    remote_host = remote[0] if remote is not None else "?"
    _tune_socket(stream)
    refused: list[bytes] = []
    secure = None
    with ticket.scope:
        try:
            secure = await secure_accept(
                stream,
                seed=service.identity.seed,
                network_key=service.network_key,
                allowed=_admits(service, refused),
                max_message_size=service.gossip.max_message_bytes,
                replay_cache=service.replay_cache,
                source=ticket.source,
            )
        except LatticedError as exc:
            reason = service.faults.incoming_failed(remote_host, exc, refused[0] if refused else None)
            _log_failure(
                service,
                ticket.source,
                "peer.handshake_failed",
                address=peer_address,
                error=str(exc),
                reason=reason,
            )
            if service.metrics is not None:
                service.metrics.handshake_failed("incoming", exc)
            await trio.aclose_forcefully(stream)
            return
    if secure is None:  # cut to make room for a newer handshake
        await trio.aclose_forcefully(stream)
        return
    ticket.authenticate()
    if service.metrics is not None:
        service.metrics.connected("incoming")
    peer = secure.remote_public_key
    service.faults.incoming_succeeded(remote_host, peer, secure.handshake.peer_clock_offset_ms, peer_address)
    if not service.faults.admits(peer):  # blocked while its handshake ran
        await secure.aclose()
        return
    # Recorded in the book (never dialled) so the dialer does not redial an identity that is connected.
    if remote is not None:
        service.book.connected(remote, peer, time.time(), incoming=True)
        if service.book.over_view(peer):
            room = service.book.make_room(peer)
            if room is None:
                # Links enough already (the active view): the peer backs off and dials another it knows.
                log_event(log, "peer.over_view", peer=peer.hex(), address=peer_address)
                service.book.disconnected(remote, time.time())
                await secure.aclose()
                return
            _drop_links(service, room, f"room for {peer.hex()}")
    try:
        with _link_scope(service, peer):
            await service.gossip.run_peer(secure, peer_address, "incoming")
    finally:
        if remote is not None:
            with contextlib.suppress(NotFoundError):  # removed meanwhile (latticectl peers remove)
                service.book.disconnected(remote, time.time())
            service.wake_dialer.set()


def _drop_links(service: Replication, peers: list[bytes], reason: str) -> None:
    """Close the links to ``peers`` (the active view is over its bound); each ends as a disconnect."""
    for key in peers:
        scopes = [scope for scope in service.link_scopes.get(key, ()) if not scope.cancel_called]
        if scopes:
            log_event(log, "peer.over_view", peer=key.hex(), reason=reason)
        for scope in scopes:
            scope.cancel()


def _hold_view(service: Replication) -> bool:
    """Drop links beyond the active view now, unless drops already chosen are still closing (they count
    until they have: choosing again would drop more than the excess). True while over the bound."""
    if any(scope.cancel_called for scopes in service.link_scopes.values() for scope in scopes):
        return True
    over = service.book.over_view_links()
    _drop_links(service, over, "beyond the active view")
    return bool(over)


@contextlib.contextmanager
def _link_scope(service: Replication, peer: bytes) -> Iterator[None]:
    """Run a link's gossip in a scope the active view can cancel (:meth:`PeerBook.over_view_links`).
    Each link of the identity has its own: a second link that gossip closes at once (both sides dialled)
    must not take the scope of the link that stays with it."""
    scope = trio.CancelScope()
    service.link_scopes.setdefault(peer, []).append(scope)
    try:
        with scope:
            yield
    finally:
        scopes = service.link_scopes.get(peer, [])
        if scope in scopes:
            scopes.remove(scope)
        if not scopes:
            service.link_scopes.pop(peer, None)


async def _discovered(service: Replication, receive: trio.MemoryReceiveChannel[DiscoveredPeer]) -> None:
    async for peer in receive:
        if peer.public_key in service.removed:
            continue  # the operator removed it in this run (a block keeps it out for good)
        if service.book.add(peer.address, "mdns", now=time.time(), public_key=peer.public_key):
            log_event(log, "peer.discovered", peer=peer.public_key.hex(), address=f"{peer.host}:{peer.port}")
        # A peer that dialled us before its announcement got here was let in beyond the view: now it is not.
        _drop_links(service, service.book.over_view_links(), "announced beyond the active view")
        service.wake_dialer.set()


async def _gate_deadline(service: Replication) -> None:
    """Open the start gate when its time is up, if nothing opened it before."""
    await trio.sleep_until(service.start_gate.deadline)
    service.update_gate()


def _dial_ended(service: Replication, address: HostPort) -> None:
    service.start_gate.dial_ended(address)
    service.update_gate()


async def _dial_loop(service: Replication) -> None:
    """Dial whatever the peer book says is due; sleep until the next due time or a new sighting. The
    first round is what the start gate waits for."""
    first = True
    async with trio.open_nursery() as nursery:
        while True:
            service.wake_dialer = trio.Event()
            now = time.time()
            due = service.book.due(now, limit=MAX_DIALS_AT_ONCE)
            if first:
                first = False
                service.start_gate.expect(due)
                if due:
                    log_event(
                        log,
                        "replication.catching_up",
                        peers=len(due),
                        at_most_s=service.start_gate.timeout,
                        hint="no signing until these peers said what they hold, or cannot be reached",
                    )
                service.update_gate()
            for address in due:
                nursery.start_soon(_dial, service, address)
            # Level-triggered as well: a drop chosen while a link was still starting (or a dial that failed
            # after being counted) must not leave the view over its bound until the next sighting.
            over = _hold_view(service)
            next_due = service.book.next_due(time.time())
            wait = 60.0 if next_due is None else max(0.05, next_due - time.time())
            if over:
                wait = min(wait, VIEW_RECHECK_S)
            with trio.move_on_after(wait):
                await service.wake_dialer.wait()


def _admits(service: Replication, refused: list[bytes]) -> Callable[[bytes], bool]:
    """The handshake's allow check for one connection, noting the identity it refused (if any)."""

    def admits(public_key: bytes) -> bool:
        if service.faults.admits(public_key):
            return True
        refused.append(public_key)
        return False

    return admits


async def _dial(service: Replication, address: HostPort) -> None:
    host, port = address
    refused: list[bytes] = []
    reached = False
    try:
        # TCP first, then the handshake, each with its own timeout: a failure to connect (nothing listens,
        # no route) and a failed handshake (another network key...) are different faults for the operator.
        with trio.fail_after(DIAL_TIMEOUT_S):
            try:
                tcp = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                raise ConnectionClosedError(
                    f"cannot connect to {host}:{port}: {connect_failure(exc)}"
                ) from exc
        reached = True
        _tune_socket(tcp)
        stream = await secure_connect(
            tcp,
            seed=service.identity.seed,
            network_key=service.network_key,
            allowed=_admits(service, refused),
            timeout=DIAL_TIMEOUT_S,
            max_message_size=service.gossip.max_message_bytes,
        )
    except (LatticedError, trio.TooSlowError) as exc:
        error = (
            exc
            if isinstance(exc, LatticedError)
            else ConnectionClosedError(f"cannot connect to {host}:{port}: timed out after {DIAL_TIMEOUT_S} s")
        )
        if address in service.book:
            we_refused = refused[0] if refused else None
            if we_refused is not None and we_refused in service.faults.rules.blocked:
                # Now we know whose address it is: the book dials a blocked identity no more.
                source = cast(Source, service.book.status(address).sources[0])
                service.book.add(address, source, now=time.time(), public_key=we_refused)
            service.book.failed(address, time.time())
            service.faults.dial_failed(address, error, reached=reached, we_refused=we_refused)
        log_event(log, "peer.dial_failed", level=logging.DEBUG, address=f"{host}:{port}", error=str(error))
        if service.metrics is not None:
            service.metrics.handshake_failed("outgoing", error)
        service.wake_dialer.set()
        _dial_ended(service, address)
        return
    if service.metrics is not None:
        service.metrics.connected("outgoing")
    peer = stream.remote_public_key
    if address not in service.book or not service.faults.admits(peer):
        # Removed or blocked while we dialled it.
        await stream.aclose()
        with contextlib.suppress(NotFoundError):
            service.book.failed(address, time.time())
        _dial_ended(service, address)
        return
    service.faults.dial_succeeded(address)
    if peer in service.gossip.links and not _is_stale(service, peer):
        # Already connected to this identity (it dialled us): this dial only proves the address works.
        service.book.connected(address, peer, time.time())
        await stream.aclose()
        service.book.disconnected(address, time.time())
        _dial_ended(service, address)
        return
    service.book.connected(address, peer, time.time())
    service._save_book()
    # Peers that dialled us while this dial was out may have filled the view: one of the others makes room.
    _drop_links(service, service.book.over_view_links(spare=peer), "dialled beyond the active view")
    # The link is up once run_peer registers it (before its first await): the gate then waits for the
    # peer's first digest on it.
    service.start_gate.dial_ended(address)
    try:
        sources = service.book.status(address).sources
        via = "static" if "static" in sources else (sources[0] if sources else "static")
        with _link_scope(service, peer):
            await service.gossip.run_peer(stream, f"{host}:{port}", via)
    finally:
        with contextlib.suppress(NotFoundError):  # removed meanwhile (latticectl peers remove)
            service.book.disconnected(address, time.time())
        service.wake_dialer.set()
        service.update_gate()  # a link that closed before its digest is awaited no more
