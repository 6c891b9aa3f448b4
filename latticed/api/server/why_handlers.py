"""``queue_why``: why this daemon's copy of one queue is where it is.

What it holds, what the owner's newest head says exists (the newest head heard of, or what a peer holds
past it), each peer that holds it (connected or not, since when, what is in flight, the last error it
caused about this queue) and a one-line verdict (:func:`latticed.protocol.why_verdict.verdict`). Answered
on any daemon, owner or replica; without replication running, from the store alone.
"""

from __future__ import annotations

import dataclasses
import time

from latticed.api.server.context import Context, Handler, Reply, Request
from latticed.protocol.why_verdict import QueueFacts, verdict


def clock_text(wall: float) -> str:
    """A wall-clock time as this daemon's local ``HH:MM`` (with the date when it is not today)."""
    moment, today = time.localtime(wall), time.localtime()
    same_day = moment[:3] == today[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", moment)


async def queue_why(ctx: Context, request: Request) -> Reply:
    """``verdict``, ``holds``, ``exists_end``, ``behind``, ``peers`` (one row each), ``owned``."""
    q = ctx.queue(request)
    if ctx.engine.core2.holds(q):
        facts, cap = await _core2_facts(ctx, q), None  # no replica cap on core 2
    else:
        facts, cap = _facts(ctx, q)
    service = ctx.replication
    return {
        "queue": facts.address,
        "owned": facts.owned,
        "verdict": verdict(facts, clock_text),
        "holds": [facts.held_start, facts.held_end],
        "start": facts.start,
        "known_end": facts.known_end,
        "exists_end": facts.exists_end,
        "behind": facts.behind,
        "replica_cap": cap,
        "fork_proof": facts.fork_proof,
        "replicating": service is not None,
        "peers": [dataclasses.asdict(p) for p in facts.peers],
    }


async def _core2_facts(ctx: Context, q: int) -> QueueFacts:
    """A core-2 queue's facts: held from its owner's signed start (no replica cap on core 2), frozen at
    its fork point if forked (no proof: the branches' heads are the evidence)."""
    core2 = ctx.engine.core2
    row, state = core2.row(q), await core2.value(q)
    service = ctx.replication
    start, end = state.held
    tips = state.chains.tips
    return QueueFacts(
        address=core2.address(q),
        owned=core2.owned(q),
        start=start,
        held_start=start,
        held_end=end,
        known_end=max((t.head.end for t in tips), default=end),
        forked=state.forked,
        fork_at=state.chains.fork_point,
        fork_proof=None,
        capped=False,
        peers=service.queue_peers(row.owner, row.name, row.kind) if service is not None else [],
    )


def _facts(ctx: Context, q: int) -> tuple[QueueFacts, int | None]:
    """A core-1 queue's facts, and the replica cap this daemon enforces on it (None: none)."""
    state = ctx.engine.state(q)
    service = ctx.replication
    peers = service.queue_peers(state.owner, state.name, state.kind) if service is not None else []
    cap = ctx.retention.cap(q) if ctx.retention is not None else None
    fork = state.fork
    signed_start = state.head.start if state.head is not None else 0
    facts = QueueFacts(
        address=ctx.engine.address(q),
        owned=ctx.engine.owned(q),
        start=signed_start,
        held_start=state.start,
        held_end=state.held_end,
        known_end=state.known_end,
        forked=state.forked,
        fork_at=fork.offset if fork is not None else None,
        fork_proof=fork.digest().hex() if fork is not None else None,
        capped=cap is not None and state.start > signed_start,
        peers=peers,
    )
    return facts, cap


#: This module's ops, for the op table (:mod:`latticed.api.server.op_table`).
OPS: dict[str, Handler] = {
    "queue_why": queue_why,
}
