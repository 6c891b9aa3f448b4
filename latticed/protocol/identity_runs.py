"""Two daemons running one identity at once (a copied data directory, a cloned VM, a restored backup left
running): how a peer notices, what it tells both, and when the owner's daemon stops signing.

Sans-IO: times are arguments (a peer's trio clock, or Unix seconds where it says so).

* **On a peer** (:class:`DuplicateIdentities`): the same identity on a second link whose HELLO names another
  incarnation while the first link is live. The peer serves both links, so what each daemon holds still
  meets (a fork, if they signed two histories, is found and flagged everywhere), and tells both with a
  :class:`Notice` (request :data:`IDENTITY_OP` of the link's request/answer sub-protocol, sent only to
  peers that name :data:`IDENTITY_FEATURE`): the incarnation it saw first is the earlier run.
* **On the owner** (:func:`foreign_head`): one of its own queues comes back with a head this run did not
  sign: another head at a version it holds, or a version it has not reached signed after it started.
* **Refusing** (:class:`IdentityGuard`): a run told it is the later one, or one that saw a foreign head
  and was not told it is the earlier one, signs nothing until the operator claims the identity for it
  (``latticectl identity claim``). A claim holds for the rest of the run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from latticed.crdt.head import SignedHead
from latticed.errors import RemoteProtocolError

__all__ = [
    "IDENTITY_FEATURE",
    "IDENTITY_OP",
    "DuplicateIdentities",
    "ForeignHead",
    "IdentityGuard",
    "Notice",
    "OtherRun",
    "RunSeen",
    "Sighting",
    "foreign_head",
    "notices_for",
]

#: The request a peer sends each of two daemons it sees running one identity (answered with ``{}``).
IDENTITY_OP: Final = "identity.duplicate"
#: The protocol feature of daemons that understand :data:`IDENTITY_OP` (others are not sent it).
IDENTITY_FEATURE: Final = "identity-notice"
#: Identities with two runs a peer remembers, and incarnations whose first sighting it remembers.
MAX_SIGHTINGS: Final = 256
MAX_FIRST_SEEN: Final = 4096
#: Other runs and foreign heads an owner's daemon keeps to show (the newest).
MAX_SHOWN: Final = 16
_INCARNATION_BYTES: Final = 16
_MAX_ADDRESS: Final = 300
CLAIM_HINT: Final = (
    "stop one of them, or run `latticectl identity claim` on the one to keep "
    '(docs/operations.md, "Two daemons, one identity")'
)


@dataclass(frozen=True, slots=True)
class RunSeen:
    """One run of an identity as a peer sees it: its incarnation and the address its link comes from."""

    incarnation: bytes
    address: str

    def to_wire(self) -> dict[str, str]:
        return {"incarnation": self.incarnation.hex(), "address": self.address}


@dataclass(frozen=True, slots=True)
class Sighting:
    """Two runs of ``identity`` on two links of a peer at once (the last time, and how often)."""

    identity: bytes
    earlier: RunSeen
    later: RunSeen
    first_at: float
    last_at: float
    count: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "identity": self.identity.hex(),
            "earlier": self.earlier.to_wire(),
            "later": self.later.to_wire(),
            "count": self.count,
        }


class DuplicateIdentities:
    """What a peer saw of identities running twice: which incarnation it saw first (the earlier run),
    bounded, so a reconnect does not turn the earlier run into the later one."""

    def __init__(self, *, capacity: int = MAX_SIGHTINGS, memory: int = MAX_FIRST_SEEN) -> None:
        self.capacity = capacity
        self.memory = memory
        self.total = 0
        self._first_seen: OrderedDict[tuple[bytes, bytes], float] = OrderedDict()
        self._sightings: OrderedDict[bytes, Sighting] = OrderedDict()

    def _seen(self, identity: bytes, incarnation: bytes, at: float) -> float:
        key = (identity, incarnation)
        first = self._first_seen.setdefault(key, at)
        self._first_seen.move_to_end(key)
        while len(self._first_seen) > self.memory:
            self._first_seen.popitem(last=False)
        return first

    def observe(
        self, identity: bytes, live: RunSeen, live_since: float, newcomer: RunSeen, now: float
    ) -> Sighting:
        """The link of ``live`` (up since ``live_since``) and a new one of ``newcomer``, another
        incarnation of the same identity: record it and say which run came first."""
        live_first = self._seen(identity, live.incarnation, live_since)
        new_first = self._seen(identity, newcomer.incarnation, now)
        earlier, later = (live, newcomer) if live_first <= new_first else (newcomer, live)
        old = self._sightings.pop(identity, None)
        sighting = Sighting(
            identity,
            earlier,
            later,
            now if old is None else old.first_at,
            now,
            1 if old is None else old.count + 1,
        )
        self._sightings[identity] = sighting
        while len(self._sightings) > self.capacity:
            self._sightings.popitem(last=False)
        self.total += 1
        return sighting

    def recent(self) -> list[Sighting]:
        """The identities seen running twice, most recent last."""
        return list(self._sightings.values())


@dataclass(frozen=True, slots=True)
class Notice:
    """What a peer tells one of two daemons it sees running one identity: ``yours`` is the incarnation
    it is for (a notice meant for an earlier run of this daemon is ignored)."""

    yours: bytes
    other: bytes
    other_address: str
    later: bool

    def to_body(self) -> dict[str, Any]:
        return {
            "yours": self.yours.hex(),
            "other": self.other.hex(),
            "other_address": self.other_address,
            "you_are": "later" if self.later else "earlier",
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Notice:
        """Parse a peer's notice; anything malformed is the peer's protocol error."""
        try:
            yours = bytes.fromhex(body["yours"])
            other = bytes.fromhex(body["other"])
            address = body["other_address"]
            you_are = body["you_are"]
        except (KeyError, TypeError, ValueError):
            raise RemoteProtocolError(f"{IDENTITY_OP}: malformed notice") from None
        if (
            len(yours) != _INCARNATION_BYTES
            or len(other) != _INCARNATION_BYTES
            or type(address) is not str
            or len(address) > _MAX_ADDRESS
            or you_are not in ("later", "earlier")
        ):
            raise RemoteProtocolError(f"{IDENTITY_OP}: malformed notice")
        return cls(yours, other, address, you_are == "later")


def notices_for(sighting: Sighting) -> tuple[Notice, Notice]:
    """The notices for the earlier run and for the later one."""
    earlier, later = sighting.earlier, sighting.later
    return (
        Notice(earlier.incarnation, later.incarnation, later.address, later=False),
        Notice(later.incarnation, earlier.incarnation, earlier.address, later=True),
    )


def foreign_head(ours: SignedHead | None, theirs: SignedHead | None, started_ms: int) -> str | None:
    """Why ``theirs``, a head of one of our own queues a peer sent, was signed by another daemon holding
    our key (None: it may be ours). ``ours`` is the head we hold; ``started_ms`` when this run started
    (Unix ms). Another head at the version we hold is an equivocation whoever signed it; a version we have
    not reached is ours from an earlier run (a store restored from a copy catches up so) unless it was
    signed after this run started."""
    if theirs is None:
        return None
    held = ours.version if ours is not None else 0
    if ours is not None and theirs.version == held:
        if theirs.body() == ours.body():
            return None
        return f"another head at version {held}, which this daemon holds signed differently"
    if theirs.version > held and theirs.timestamp >= started_ms:
        after = (theirs.timestamp - started_ms) / 1000
        return (
            f"a head at version {theirs.version} (this daemon holds {held}) signed {after:.1f} s after "
            "this daemon started"
        )
    return None


@dataclass(frozen=True, slots=True)
class OtherRun:
    """Another run of our identity a peer (``via``) told us of; ``later``: we are the later run."""

    incarnation: bytes
    address: str
    via: bytes
    at: float
    later: bool

    def to_wire(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation.hex(),
            "address": self.address,
            "via": self.via.hex(),
            "at": self.at,
            "this_daemon_is": "later" if self.later else "earlier",
        }


@dataclass(frozen=True, slots=True)
class ForeignHead:
    """A head of one of our queues that another daemon signed with our key, as a peer sent it."""

    queue: str
    peer: bytes
    reason: str
    at: float

    def to_wire(self) -> dict[str, Any]:
        return {"queue": self.queue, "peer": self.peer.hex(), "reason": self.reason, "at": self.at}


class IdentityGuard:
    """Whether this run of the owner may sign (see the module docstring); :meth:`refusal` is asked
    before every write, so it is a cached value."""

    def __init__(self, incarnation: bytes) -> None:
        self.incarnation = incarnation
        self.others: OrderedDict[bytes, OtherRun] = OrderedDict()
        self.foreign: list[ForeignHead] = []
        self.claimed_at: float | None = None
        self._refusal: str | None = None

    def notice(self, notice: Notice, via: bytes, now: float) -> OtherRun | None:
        """A peer's notice (``now``: Unix seconds); None if it is not about this run."""
        if notice.yours != self.incarnation or notice.other == self.incarnation:
            return None
        run = OtherRun(notice.other, notice.other_address, via, now, notice.later)
        old = self.others.pop(notice.other, None)
        if old is not None and old.later and not run.later:
            run = OtherRun(run.incarnation, run.address, via, now, later=True)  # once later, later
        self.others[notice.other] = run
        while len(self.others) > MAX_SHOWN:
            self.others.popitem(last=False)
        self._decide()
        return run

    def foreign_head(self, head: ForeignHead) -> None:
        self.foreign.append(head)
        del self.foreign[:-MAX_SHOWN]
        self._decide()

    def claim(self, now: float) -> bool:
        """The operator says this run is the one to keep: it signs again. True if it was refusing."""
        was = self._refusal is not None
        self.claimed_at = now
        self._refusal = None
        return was

    def refusal(self) -> str | None:
        """Why this run must not sign (one line, naming the other daemon and what to do), or None."""
        return self._refusal

    def _decide(self) -> None:
        """From everything heard so far, whichever order it came in (a foreign head, then the notice
        that this is the earlier run: it signs again)."""
        if self.claimed_at is not None:
            return
        self._refusal = None
        later = [run for run in self.others.values() if run.later]
        if later:
            run = later[-1]
            self._refusal = (
                f"another daemon runs this identity (at {run.address}, as peer {run.via.hex()[:16]} sees "
                f"it) and started before this one: this daemon signs nothing until you {CLAIM_HINT}"
            )
        elif self.foreign and not self.others:
            head = self.foreign[-1]
            self._refusal = (
                f"another daemon signs with this identity's key: {head.queue} came back from peer "
                f"{head.peer.hex()[:16]} with {head.reason}; this daemon signs nothing until you {CLAIM_HINT}"
            )

    def status(self) -> dict[str, Any]:
        """What ``status`` and ``doctor`` show."""
        return {
            "refusing": self._refusal,
            "other_runs": [run.to_wire() for run in self.others.values()],
            "foreign_heads": [head.to_wire() for head in self.foreign],
            "claimed_at": self.claimed_at,
        }
