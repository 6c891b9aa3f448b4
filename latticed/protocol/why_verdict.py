"""Why a replica of one queue is where it is: the facts a daemon has about it, and a one-line verdict.

Pure: the daemon gathers the facts (what it holds; per peer, what that peer holds as last heard, whether
it is connected, blocked, since when; what is in flight; the last error it caused about the queue) and
:func:`verdict` names the reason, first match wins:

1. ``frozen: forked at ...``: the owner signed two histories; nothing more is merged (the proof's hash).
2. ``behind by N records: ...``: someone holds (or the owner's newest head says there exist) records past
   ours. Then: catching up from a connected peer that holds them; else ``blocked peer`` when every peer
   that holds them is blocked here; else ``the only peer that holds them, X, has been offline since
   HH:MM`` (or ``the peers that hold them ... are offline``); else ``owner offline`` (no peer we know of
   holds them: only the owner can send them).
3. ``blocked peer``: the owner is blocked here, so nothing new can come from it.
4. ``capped here by replica_max_bytes``: we hold its newest records but dropped older ones by our cap.
5. ``owner offline``: we hold all that any peer reported, but the owner is not connected, so more may exist.
6. ``up to date``.

Times are wall-clock seconds; the verdict prints them as local ``HH:MM`` via ``clock_text``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PeerFacts:
    """One peer as this daemon knows it, for one queue."""

    peer: str  #: hex identity
    connected: bool
    blocked: bool
    #: Connected: since when; offline: since when (its last link ended, or last seen); None: never seen.
    since: float | None
    #: What it holds of the queue, as last heard (None: it never said).
    held_start: int | None = None
    held_end: int | None = None
    forked: bool = False
    in_flight: int = 0  #: our deltas of this queue on their way to it, unacknowledged
    asked: bool = False  #: we asked it for a delta of this queue and wait for it
    last_error: str | None = None
    is_owner: bool = False


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """The queue as this daemon holds it, and its peers."""

    address: str
    owned: bool  #: this daemon is the owner
    start: int  #: the owner's signed start
    held_start: int  #: where our records begin (our own floor, when a cap dropped older ones)
    held_end: int
    known_end: int  #: the end the owner's newest head that we hold signs
    forked: bool
    fork_at: int | None
    fork_proof: str | None
    capped: bool  #: a replica cap applies here and dropped records
    peers: Sequence[PeerFacts]

    @property
    def exists_end(self) -> int:
        """The furthest end anyone says exists: our newest head's, or what a peer holds."""
        return max(
            [self.known_end, self.held_end] + [p.held_end for p in self.peers if p.held_end is not None]
        )

    @property
    def behind(self) -> int:
        return self.exists_end - self.held_end


def _short(peer: str) -> str:
    return peer[:16]


def _records(n: int) -> str:
    return f"{n:,} record{'' if n == 1 else 's'}"


def verdict(facts: QueueFacts, clock_text: Callable[[float], str]) -> str:
    """The one-line reason (see the module docstring for the order)."""
    if facts.forked:
        where = f"offset {facts.fork_at}" if facts.fork_at is not None and facts.fork_at >= 0 else "its heads"
        proof = f" (proof {facts.fork_proof[:16]})" if facts.fork_proof else ""
        return f"frozen: forked at {where}{proof}: the owner signed two histories; nothing more is merged"
    owner = next((p for p in facts.peers if p.is_owner), None)
    behind = facts.behind
    if behind > 0:
        lead = f"behind by {_records(behind)}"
        holders = [
            p
            for p in facts.peers
            if p.held_end is not None
            and p.held_end > facts.held_end
            and (p.held_start is None or p.held_start <= facts.held_end)
        ]
        live = [p for p in holders if p.connected and not p.blocked]
        if live:
            return f"{lead}: catching up from {', '.join(_short(p.peer) for p in live)} (connected)"
        if holders and all(p.blocked for p in holders):
            names = ", ".join(_short(p.peer) for p in holders)
            return f"blocked peer: {lead}: the peers that hold them ({names}) are blocked here"
        offline = [p for p in holders if not p.blocked]
        if len(offline) == 1:
            p = offline[0]
            since = f" since {clock_text(p.since)}" if p.since is not None else ""
            return f"{lead}: the only peer that holds them, {_short(p.peer)}, has been offline{since}"
        if offline:
            return (
                f"{lead}: the peers that hold them ({', '.join(_short(p.peer) for p in offline)}) are offline"
            )
        if owner is not None and owner.blocked:
            who = _short(owner.peer)
            return f"blocked peer: {lead}: only the owner, {who}, holds them and it is blocked here"
        return f"owner offline: {lead}: no peer that holds them is connected; only the owner can send them"
    if owner is not None and owner.blocked:
        return f"blocked peer: the owner, {_short(owner.peer)}, is blocked here: nothing new can come from it"
    if facts.capped and facts.held_start > facts.start:
        return (
            f"capped here by replica_max_bytes: holds {facts.held_start}..{facts.held_end - 1}, the owner "
            f"keeps from {facts.start} (up to date at the end)"
        )
    if not facts.owned and (owner is None or not owner.connected):
        since = f" since {clock_text(owner.since)}" if owner is not None and owner.since is not None else ""
        return f"owner offline{since}: holds all that connected peers report (to offset {facts.held_end})"
    return "up to date"


__all__ = ["PeerFacts", "QueueFacts", "verdict"]
